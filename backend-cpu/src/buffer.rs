//! CPU buffers, and moving tensor data between buffers and host vectors.
//!
//! A buffer is a `Vec<u64>`, so its bytes are 8-byte aligned and can be viewed as any element
//! type. Kernels read their inputs into owned vectors (gathering strided layouts into
//! row-major order) and write their outputs from owned vectors, locking one buffer at a time:
//! an optimizer update whose output is its input buffer therefore never holds a read and a
//! write lock on the same buffer.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bytemuck::Pod;
use half::{bf16, f16};
use tessera_core::memory::Pool;
use tessera_core::{Buffer, DType, Element, Error, Layout, Result, TensorRef};

use crate::float::Float;

/// The device's caching pool, shared with its buffers so that dropping one returns its block.
pub(crate) type SharedPool = Arc<Mutex<Pool<Vec<u64>>>>;

/// Host memory handed out by a [`crate::CpuDevice`].
pub struct CpuBuffer {
    data: RwLock<Vec<u64>>,
    len: usize,
    class: usize,
    pool: SharedPool,
}

impl CpuBuffer {
    pub(crate) fn new(data: Vec<u64>, len: usize, class: usize, pool: SharedPool) -> Self {
        CpuBuffer {
            data: RwLock::new(data),
            len,
            class,
            pool,
        }
    }

    /// Runs `f` on the buffer's words under a read lock. A lock poisoned by a panic elsewhere
    /// still holds plain numbers, so it is used as is rather than propagating the panic.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&[u64]) -> R) -> R {
        let guard = self.data.read().unwrap_or_else(PoisonError::into_inner);
        f(&guard)
    }

    /// Runs `f` on the buffer's words under a write lock.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut [u64]) -> R) -> R {
        let mut guard = self.data.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("len", &self.len)
            .field("class", &self.class)
            .finish()
    }
}

impl Buffer for CpuBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let block = std::mem::take(self.data.get_mut().unwrap_or_else(PoisonError::into_inner));
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release(block, self.class);
    }
}

/// The CPU buffer behind a buffer handle, or an error for another backend's buffer.
pub(crate) fn cpu_buffer(buffer: &Arc<dyn Buffer>) -> Result<&CpuBuffer> {
    buffer
        .as_any()
        .downcast_ref::<CpuBuffer>()
        .ok_or_else(|| Error::Backend {
            backend: "cpu".into(),
            detail: format!("{buffer:?} is not a cpu buffer; move the tensor to the cpu first"),
        })
}

fn internal(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        detail: detail.into(),
    }
}

pub(crate) fn bytes(words: &[u64]) -> &[u8] {
    bytemuck::cast_slice(words)
}

pub(crate) fn bytes_mut(words: &mut [u64]) -> &mut [u8] {
    bytemuck::cast_slice_mut(words)
}

/// The words viewed as elements of `T` (always possible: every element type is at most 8
/// bytes wide and 8-byte aligned).
fn typed<T: Pod>(words: &[u64]) -> Result<&[T]> {
    bytemuck::try_cast_slice(words).map_err(|e| internal(format!("buffer view: {e}")))
}

fn typed_mut<T: Pod>(words: &mut [u64]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(words).map_err(|e| internal(format!("buffer view: {e}")))
}

fn check_fits(layout: &Layout, len: usize) -> Result<()> {
    if layout.numel() > 0 && layout.extent() > len {
        return Err(internal(format!(
            "layout {layout:?} reaches past a buffer of {len} elements"
        )));
    }
    Ok(())
}

/// The elements of `layout` in row-major order, converted by `conv`.
fn gather<T: Pod, R>(words: &[u64], layout: &Layout, conv: impl Fn(T) -> R) -> Result<Vec<R>> {
    let s = typed::<T>(words)?;
    check_fits(layout, s.len())?;
    let n = layout.numel();
    if n == 0 {
        return Ok(Vec::new());
    }
    if layout.is_contiguous() {
        Ok(s[layout.offset..layout.offset + n]
            .iter()
            .map(|&x| conv(x))
            .collect())
    } else {
        Ok(layout.indices().map(|i| conv(s[i])).collect())
    }
}

/// Reads `layout` of a buffer holding `dtype` into compute type `F` (integers and bool convert
/// exactly through f64).
pub(crate) fn read_layout<F: Float>(
    buffer: &Arc<dyn Buffer>,
    dtype: DType,
    layout: &Layout,
) -> Result<Vec<F>> {
    cpu_buffer(buffer)?.read(|w| match dtype {
        DType::F32 => gather(w, layout, F::of_f32),
        DType::F64 => gather(w, layout, F::of_f64),
        DType::F16 => gather(w, layout, |x: f16| F::of_f32(x.to_f32())),
        DType::BF16 => gather(w, layout, |x: bf16| F::of_f32(x.to_f32())),
        DType::I32 => gather(w, layout, |x: i32| F::of_f64(f64::from(x))),
        DType::U32 => gather(w, layout, |x: u32| F::of_f64(f64::from(x))),
        DType::Bool => gather(w, layout, |x: u8| if x != 0 { F::one() } else { F::zero() }),
    })
}

/// Reads a tensor into compute type `F`, row-major.
pub(crate) fn read<F: Float>(t: &TensorRef<'_>) -> Result<Vec<F>> {
    read_layout(t.buffer, t.dtype, t.layout)
}

/// Reads an i32 or u32 index tensor, row-major.
pub(crate) fn read_index(t: &TensorRef<'_>) -> Result<Vec<i64>> {
    cpu_buffer(t.buffer)?.read(|w| match t.dtype {
        DType::I32 => gather(w, t.layout, |x: i32| i64::from(x)),
        DType::U32 => gather(w, t.layout, |x: u32| i64::from(x)),
        other => Err(Error::dtype(
            "cpu",
            format!("indices must be i32 or u32; got {other}"),
        )),
    })
}

/// Reads a tensor's elements as raw bytes (`dtype.size()` per element), row-major.
pub(crate) fn read_raw(t: &TensorRef<'_>) -> Result<Vec<u8>> {
    let size = t.dtype.size();
    cpu_buffer(t.buffer)?.read(|w| {
        let b = bytes(w);
        check_fits(t.layout, b.len() / size)?;
        let n = t.layout.numel();
        if n == 0 {
            return Ok(Vec::new());
        }
        if t.layout.is_contiguous() {
            let start = t.layout.offset * size;
            return Ok(b[start..start + n * size].to_vec());
        }
        let mut out = Vec::with_capacity(n * size);
        for i in t.layout.indices() {
            out.extend_from_slice(&b[i * size..(i + 1) * size]);
        }
        Ok(out)
    })
}

/// Runs `f` on the bytes of a buffer under a read lock, for kernels that pick a few rows out of
/// a large input (embedding, gather) instead of copying all of it.
pub(crate) fn with_bytes<R>(t: &TensorRef<'_>, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
    let size = t.dtype.size();
    cpu_buffer(t.buffer)?.read(|w| {
        let b = bytes(w);
        check_fits(t.layout, b.len() / size)?;
        f(b)
    })
}

fn scatter<T: Pod, R: Copy>(
    words: &mut [u64],
    layout: &Layout,
    data: &[R],
    conv: impl Fn(R) -> T,
) -> Result<()> {
    let s = typed_mut::<T>(words)?;
    check_fits(layout, s.len())?;
    let n = layout.numel();
    if data.len() != n {
        return Err(internal(format!(
            "{} values for an output of {n} elements",
            data.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    if layout.is_contiguous() {
        for (dst, &x) in s[layout.offset..layout.offset + n].iter_mut().zip(data) {
            *dst = conv(x);
        }
    } else {
        for (i, &x) in layout.indices().zip(data) {
            s[i] = conv(x);
        }
    }
    Ok(())
}

/// Writes row-major compute values into an output, converting to its dtype: floats round to
/// nearest-even; integers and bool follow [`Element::from_f64`] (as `Cast` does).
pub(crate) fn write<F: Float>(t: &TensorRef<'_>, data: &[F]) -> Result<()> {
    let layout = t.layout;
    cpu_buffer(t.buffer)?.write(|w| match t.dtype {
        DType::F32 => scatter(w, layout, data, F::as_f32),
        DType::F64 => scatter(w, layout, data, F::as_f64),
        DType::F16 => scatter(w, layout, data, F::to_f16),
        DType::BF16 => scatter(w, layout, data, F::to_bf16),
        DType::I32 => scatter(w, layout, data, |x: F| i32::from_f64(x.as_f64())),
        DType::U32 => scatter(w, layout, data, |x: F| u32::from_f64(x.as_f64())),
        DType::Bool => scatter(w, layout, data, |x: F| u8::from(x != F::zero())),
    })
}

/// Writes raw element bytes (`dtype.size()` per element) into an output of any layout.
pub(crate) fn write_raw(t: &TensorRef<'_>, data: &[u8]) -> Result<()> {
    let size = t.dtype.size();
    let layout = t.layout;
    cpu_buffer(t.buffer)?.write(|w| {
        let b = bytes_mut(w);
        check_fits(layout, b.len() / size)?;
        let n = layout.numel();
        if data.len() != n * size {
            return Err(internal(format!(
                "{} bytes for an output of {n} {} elements",
                data.len(),
                t.dtype
            )));
        }
        if n == 0 {
            return Ok(());
        }
        if layout.is_contiguous() {
            let start = layout.offset * size;
            b[start..start + n * size].copy_from_slice(data);
        } else {
            for (i, src) in layout.indices().zip(data.chunks_exact(size)) {
                b[i * size..(i + 1) * size].copy_from_slice(src);
            }
        }
        Ok(())
    })
}
