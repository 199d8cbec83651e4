//! Matrix multiplication through the vendor's BLAS (cuBLASLt on NVIDIA), with the bias,
//! activation and residual epilogues.
//!
//! The product runs as one strided-batched GEMM per run of batch dimensions that merge (one,
//! for every layout the models make), in the row-major output's terms: `out^T = b^T a^T` in
//! BLAS's column-major view, so a row-major operand is passed as it lies and a transposed one
//! with BLAS's transpose flag. An operand with neither unit stride is copied row-major first.
//! Large products with sizes that are not multiples of 8, or misaligned operands, run on
//! zero-padded copies (see [`PAD_WORTH`]).
//! f32 stays exact f32 (no TF32); f16 and bf16 accumulate in f32 and round once: BLAS adds
//! the bias (its epilogue) or a row-major residual (`beta = 1`) before rounding into the
//! output; an activation, both, or a residual BLAS cannot read send f32 sums to the epilogue
//! kernel of `kernels/matmul.hip`.
//! Products of at most [`FEW_ROWS`] rows with `b` contiguous along k (a linear layer's
//! weight while decoding) skip BLAS: its kernels for them read the weight at a fraction of
//! the memory's speed (cuBLASLt took 6-7 us for each of GPT-2's 768 x 3,072 products of one
//! row on an H100), and need a second launch for a bias with a residual. `few_rows` reads
//! the weight once at full width and applies the whole epilogue.
//! A normalized product (`NormMatmul`) runs as its norm into scratch, then its product
//! (`exec::unfused`): decoding here replays as a CUDA graph, where one more launch costs
//! little.

use std::sync::Arc;

use tessera_core::exec::unfused::norm_then_matmul;
use tessera_core::{merge_dims, Buffer, DType, Layout, Op, Result, TensorRef, UnaryOp};

use super::{cxx_type, elementwise, index_type, raw_type};
use crate::driver::{DevicePtr, Gemm, Grid};
use crate::gpu::{grid_for, rows_grid, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/matmul.hip");

hip_params! {
    /// The epilogue's operands (absent ones 0), the output's `elements` in rows of `cols`,
    /// and the accumulator's rows `acc_ld` elements apart.
    EpilogueParams {
        acc: u64,
        bias: u64,
        residual: u64,
        out: u64,
        elements: u64,
        cols: u64,
        acc_ld: u64,
    }
}

hip_params! {
    /// [`few_rows`]'s operands (absent ones 0): `a`'s rows `lda` elements apart, `b^T`'s rows
    /// (one per output column) `ldb` apart, both `k` long; the output and residual row-major
    /// with `cols` columns.
    FewRowsParams {
        a: u64,
        b: u64,
        bias: u64,
        residual: u64,
        out: u64,
        k: u64,
        lda: u64,
        ldb: u64,
        cols: u64,
    }
}

hip_params! {
    /// [`repack`]'s matrices: `lines` lines of `inner` elements, `ld` apart.
    RepackParams {
        src: u64,
        dst: u64,
        src_lines: u64,
        src_inner: u64,
        src_ld: u64,
        dst_lines: u64,
        dst_inner: u64,
        dst_ld: u64,
    }
}

/// Every matmul in f32, f16 and bf16.
pub(crate) fn supports(_op: &Op, dtypes: &[DType]) -> bool {
    dtypes
        .iter()
        .all(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
}

/// The epilogue's activation in C++.
fn activation(act: Option<UnaryOp>) -> &'static str {
    match act {
        Some(UnaryOp::Relu) => "relu(v)",
        Some(UnaryOp::Gelu) => "gelu(v)",
        Some(UnaryOp::Silu) => "silu(v)",
        _ => "(v)",
    }
}

fn epilogue_source(
    dtype: DType,
    acc: DType,
    bias: bool,
    act: Option<UnaryOp>,
    residual: bool,
    index: &str,
) -> Source {
    Source::new::<EpilogueParams>(SRC, "epilogue")
        .define("IDX", index)
        .define("T", cxx_type(dtype))
        .define("ACC", cxx_type(acc))
        .define("HAS_BIAS", if bias { "1" } else { "0" })
        .define("HAS_RESIDUAL", if residual { "1" } else { "0" })
        .define("ACT(v)", activation(act))
}

#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = op
    else {
        return Vec::new();
    };
    [DType::F32, dtypes[0]]
        .into_iter()
        .map(|acc| epilogue_source(dtypes[0], acc, *bias, *activation, *residual, "u32"))
        .chain([repack_source(dtypes[0])])
        .chain([1, FEW_ROWS].into_iter().flat_map(|rows| {
            [1, 16 / dtypes[0].size()]
                .map(|vec| few_rows_source(dtypes[0], rows, vec, *bias, *activation, *residual))
        }))
        .collect()
}

/// Products of at most this many rows may run `few_rows`: its sums live in registers, eight
/// per thread and chunk of b.
const FEW_ROWS: usize = 8;

/// `few_rows` takes a column per warp, in blocks of this many threads: four warps of 32
/// (NVIDIA, RDNA) or two of 64 (CDNA).
const FEW_ROWS_THREADS: u32 = 128;
/// The columns a block takes in one pass where warps have 32 lanes; with 64 the kernel loops
/// over the rest.
const FEW_ROWS_WARPS: usize = 4;

fn few_rows_source(
    dtype: DType,
    rows: usize,
    vec: usize,
    bias: bool,
    act: Option<UnaryOp>,
    residual: bool,
) -> Source {
    Source::new::<FewRowsParams>(SRC, "few_rows")
        .define("T", cxx_type(dtype))
        .define("ROWS", rows.to_string())
        .define("VEC", vec.to_string())
        .define("HAS_BIAS", if bias { "1" } else { "0" })
        .define("HAS_RESIDUAL", if residual { "1" } else { "0" })
        .define("ACT(v)", activation(act))
}

/// The whole product, epilogue included, through `few_rows` where it fits: no batches (or
/// batches of one), at most [`FEW_ROWS`] rows of a row-major `a`, `b` contiguous along k, a
/// row-major output and residual. Returns whether it ran.
fn few_rows(gpu: &Gpu, op: &Op, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<bool> {
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = *op
    else {
        return Ok(false);
    };
    let r = out.layout.rank();
    let (m, n) = (out.layout.shape[r - 2], out.layout.shape[r - 1]);
    let k = inputs[0].layout.shape[r - 1];
    let batches: usize = out.layout.shape[..r - 2].iter().product();
    let residual_input = residual.then(|| &inputs[inputs.len() - 1]);
    if batches != 1
        || m > FEW_ROWS
        || k == 0
        || !out.layout.is_contiguous()
        || residual_input.is_some_and(|t| !t.layout.is_contiguous())
    {
        return Ok(false);
    }
    let (Some((lda, false)), Some((ldb, true))) = (storage(&inputs[0]), storage(&inputs[1])) else {
        return Ok(false);
    };
    let dtype = out.dtype;
    let (a, b) = (gpu.ptr(&inputs[0])?, gpu.ptr(&inputs[1])?);
    let wide = 16 / dtype.size();
    let vec =
        if k.is_multiple_of(wide) && blas_aligned(a, lda, dtype) && blas_aligned(b, ldb, dtype) {
            wide
        } else {
            1
        };
    let params = FewRowsParams {
        a,
        b,
        bias: if bias { gpu.ptr(&inputs[2])? } else { 0 },
        residual: residual_input.map_or(Ok(0), |t| gpu.ptr(t))?,
        out: gpu.ptr(out)?,
        k: k as u64,
        lda: lda as u64,
        ldb: ldb as u64,
        cols: n as u64,
    };
    let key = format!("matmul_few_rows:{dtype}:{m}:{vec}:{bias}:{activation:?}:{residual}");
    let source = || Ok(few_rows_source(dtype, m, vec, bias, activation, residual));
    let blocks = n.div_ceil(FEW_ROWS_WARPS);
    gpu.run(
        &key,
        source,
        rows_grid(blocks, FEW_ROWS_THREADS, 0),
        &params,
    )?;
    Ok(true)
}

/// 16-bit products of at least this many multiply-adds run as one GEMM (no batches) with
/// every size a multiple of 8 and every operand 16-byte aligned, where they are not already,
/// by copying operands into zero-padded scratch and the output back out: cuBLASLt picks slow
/// unaligned kernels for anything less (GPT-2's logits, 50,257 columns: about 7 ms for each
/// product in bf16 on an H100, under 1 once padded). f32 products are not padded: their
/// kernels lose little to odd sizes, and the copies cost more than they win (the f32
/// training step was 10 ms slower padded).
const PAD_WORTH: usize = 1 << 28;
/// ... and no size under this: thinner products are bound by memory, which the copies would
/// only add to.
const PAD_MIN_SIZE: usize = 64;

/// `len` rounded up to a multiple of 8, which keeps rows of 16-bit and f32 data on 16-byte
/// boundaries.
fn padded(len: usize) -> usize {
    len.next_multiple_of(8)
}

/// Whether matrices at `ptr` with lines `ld` elements of `dtype` apart start on 16-byte
/// boundaries, as BLAS's fast kernels want.
fn blas_aligned(ptr: DevicePtr, ld: usize, dtype: DType) -> bool {
    ptr.is_multiple_of(16) && (ld * dtype.size()).is_multiple_of(16)
}

/// How BLAS sees one operand's matrices: the address, leading dimension, batch stride and
/// whether it is transposed (in the row-major terms of the op).
struct Operand {
    ptr: DevicePtr,
    ld: usize,
    transposed: bool,
    /// Scratch holding a copy, kept alive until the GEMM is queued.
    _copy: Option<Arc<dyn Buffer>>,
}

/// `t`'s matrices in storage terms: lines of contiguous elements and the distance between
/// lines, with whether a line is a column (transposed), if it has such a layout.
fn storage(t: &TensorRef<'_>) -> Option<(usize, bool)> {
    let r = t.layout.rank();
    let (rows, cols) = (t.layout.shape[r - 2], t.layout.shape[r - 1]);
    let (rs, cs) = (t.layout.strides[r - 2], t.layout.strides[r - 1]);
    if (cs == 1 || cols == 1) && (rows == 1 || rs >= cols.max(1)) {
        Some((if rows == 1 { cols.max(1) } else { rs }, false))
    } else if (rs == 1 || rows == 1) && (cols == 1 || cs >= rows.max(1)) {
        Some((if cols == 1 { rows.max(1) } else { cs }, true))
    } else {
        None
    }
}

/// `t` ([..., rows, cols]) as a BLAS operand: row-major (unit column stride) or transposed
/// (unit row stride) in place, else copied row-major into scratch. Returns the operand and
/// the strides of its batch dimensions.
fn operand(gpu: &Gpu, t: &TensorRef<'_>) -> Result<(Operand, Vec<usize>)> {
    let r = t.layout.rank();
    if let Some((ld, transposed)) = storage(t) {
        let op = Operand {
            ptr: gpu.ptr(t)?,
            ld,
            transposed,
            _copy: None,
        };
        return Ok((op, t.layout.strides[..r - 2].to_vec()));
    }
    let layout = Layout::contiguous(&t.layout.shape);
    let copy = copy_to_scratch(gpu, t, &layout)?;
    let op = Operand {
        ptr: buffer_address(gpu.backend(), &copy)?,
        ld: t.layout.shape[r - 1].max(1),
        transposed: false,
        _copy: Some(copy),
    };
    Ok((op, layout.strides[..r - 2].to_vec()))
}

/// A row-major copy of `t` with `layout`, in scratch.
fn copy_to_scratch(gpu: &Gpu, t: &TensorRef<'_>, layout: &Layout) -> Result<Arc<dyn Buffer>> {
    let copy = gpu.alloc(layout.numel().max(1) * t.dtype.size())?;
    let out = TensorRef {
        buffer: &copy,
        layout,
        dtype: t.dtype,
    };
    elementwise::launch(gpu, &Op::Copy, std::slice::from_ref(t), &[out], &[])?;
    Ok(copy)
}

/// One matrix's storage for [`repack`]: `lines` lines of `inner` elements, `ld` apart.
#[derive(Clone, Copy)]
struct Lines {
    ptr: DevicePtr,
    lines: usize,
    inner: usize,
    ld: usize,
}

/// Copies `src`'s elements into `dst` (which may be larger, its extra elements zeros, or
/// smaller, a window of `src`), both of `dtype`.
fn repack(gpu: &Gpu, dtype: DType, src: Lines, dst: Lines) -> Result<()> {
    let params = RepackParams {
        src: src.ptr,
        dst: dst.ptr,
        src_lines: src.lines as u64,
        src_inner: src.inner as u64,
        src_ld: src.ld as u64,
        dst_lines: dst.lines as u64,
        dst_inner: dst.inner as u64,
        dst_ld: dst.ld as u64,
    };
    let key = format!("matmul_repack:{}", dtype.size());
    let source = || Ok(repack_source(dtype));
    // Lines along y, chunks of the kernel's REPACK_UNROLL x 256 elements along x (both
    // loop past the grid).
    let grid = Grid {
        blocks: [
            dst.inner.div_ceil(8 * 256).clamp(1, 65_535) as u32,
            dst.lines.clamp(1, 65_535) as u32,
            1,
        ],
        threads: 256,
        shared_bytes: 0,
    };
    gpu.run(&key, source, grid, &params)
}

fn repack_source(dtype: DType) -> Source {
    Source::new::<RepackParams>(SRC, "repack").define("R", raw_type(dtype))
}

/// `t` (a [rows, cols] matrix with a BLAS layout) as an operand of `rows` x `cols` padded to
/// multiples of 8 and 16-byte aligned: in place where it already is, else copied into zeroed
/// scratch keeping its orientation.
fn padded_operand(gpu: &Gpu, t: &TensorRef<'_>, ld: usize, transposed: bool) -> Result<Operand> {
    let r = t.layout.rank();
    let (rows, cols) = (t.layout.shape[r - 2], t.layout.shape[r - 1]);
    let (lines, inner) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let ptr = gpu.ptr(t)?;
    if blas_aligned(ptr, ld, t.dtype) && padded(lines) == lines && padded(inner) == inner {
        return Ok(Operand {
            ptr,
            ld,
            transposed,
            _copy: None,
        });
    }
    let (lines_p, inner_p) = (padded(lines), padded(inner));
    let copy = gpu.alloc(lines_p * inner_p * t.dtype.size())?;
    let copy_ptr = buffer_address(gpu.backend(), &copy)?;
    let src = Lines {
        ptr,
        lines,
        inner,
        ld,
    };
    let dst = Lines {
        ptr: copy_ptr,
        lines: lines_p,
        inner: inner_p,
        ld: inner_p,
    };
    repack(gpu, t.dtype, src, dst)?;
    Ok(Operand {
        ptr: copy_ptr,
        ld: inner_p,
        transposed,
        _copy: Some(copy),
    })
}

/// The sizes and operands of a padded product (see [`PAD_WORTH`]), or `None` where the
/// product is small, batched, or its operands have no BLAS layout.
fn padded_gemm(
    gpu: &Gpu,
    inputs: &[TensorRef<'_>],
    out: &TensorRef<'_>,
) -> Result<Option<([usize; 3], Operand, Operand)>> {
    let r = out.layout.rank();
    let (m, n) = (out.layout.shape[r - 2], out.layout.shape[r - 1]);
    let k = inputs[0].layout.shape[r - 1];
    let batches: usize = out.layout.shape[..r - 2].iter().product();
    let compute_bound = [m, n, k].iter().all(|&x| x >= PAD_MIN_SIZE);
    let large = m.saturating_mul(n).saturating_mul(k) >= PAD_WORTH;
    if out.dtype.size() != 2 || batches != 1 || !compute_bound || !large {
        return Ok(None);
    }
    let (Some((lda, ta)), Some((ldb, tb))) = (storage(&inputs[0]), storage(&inputs[1])) else {
        return Ok(None);
    };
    let dtype = out.dtype;
    let aligned = blas_aligned(gpu.ptr(out)?, n, dtype)
        && blas_aligned(gpu.ptr(&inputs[0])?, lda, dtype)
        && blas_aligned(gpu.ptr(&inputs[1])?, ldb, dtype);
    if [m, n, k].iter().all(|&x| padded(x) == x) && aligned {
        return Ok(None);
    }
    let a = padded_operand(gpu, &inputs[0], lda, ta)?;
    let b = padded_operand(gpu, &inputs[1], ldb, tb)?;
    Ok(Some(([padded(m), padded(n), padded(k)], a, b)))
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    if let Op::NormMatmul { .. } = op {
        let scratch = |bytes| gpu.alloc(bytes);
        let launch = |op: &Op, i: &[TensorRef<'_>], o: &[TensorRef<'_>], s: &[f64]| {
            super::launch_family(gpu, op, i, o, s)
        };
        return norm_then_matmul(op, inputs, outputs, scalars, &scratch, &launch);
    }
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = *op
    else {
        return Err(super::unsupported(gpu, op));
    };
    let out = &outputs[0];
    let dtype = out.dtype;
    let r = out.layout.rank();
    let (m, n) = (out.layout.shape[r - 2], out.layout.shape[r - 1]);
    let k = inputs[0].layout.shape[r - 1];
    let elements = out.layout.numel();
    if elements == 0 {
        return Ok(());
    }
    if few_rows(gpu, op, inputs, out)? {
        return Ok(());
    }
    let out_ptr = gpu.ptr(out)?;
    let padding = if k > 0 {
        padded_gemm(gpu, inputs, out)?
    } else {
        None
    };
    let residual_input = residual.then(|| &inputs[inputs.len() - 1]);
    let bias_ptr = if bias { gpu.ptr(&inputs[2])? } else { 0 };
    // BLAS adds a row-major residual of the output's type as its `c` (with the output's
    // layout), or else the bias in its epilogue, before its one rounding. Not both: with
    // both, cuBLASLt rounds f16 sums between them (9 ulps off the CPU on a cancelling sum,
    // caught by the conformance suite). An activation, or what BLAS cannot add, goes to the
    // epilogue kernel over f32 sums.
    let blas_residual = !bias
        && activation.is_none()
        && k > 0
        && padding.is_none()
        && residual_input.is_some_and(|t| t.layout.is_contiguous());
    let blas_bias = bias
        && !residual
        && activation.is_none()
        && k > 0
        && padding.is_none()
        && bias_ptr.is_multiple_of(16);
    let epilogue = activation.is_some() || (bias && !blas_bias) || (residual && !blas_residual);
    let acc_dtype = if epilogue { DType::F32 } else { dtype };
    // The sums: in the output, or in scratch rows `acc_ld` apart (padded products).
    let acc_ld = padding.as_ref().map_or(n, |(sizes, ..)| sizes[1]);
    let acc_rows = padding
        .as_ref()
        .map_or(elements / n, |(sizes, ..)| sizes[0]);
    let scratch = if epilogue || padding.is_some() {
        Some(gpu.alloc(acc_rows * acc_ld * acc_dtype.size())?)
    } else {
        None
    };
    let acc_ptr = match &scratch {
        Some(s) => buffer_address(gpu.backend(), s)?,
        None => out_ptr,
    };
    if k == 0 {
        gpu.driver.zero(acc_ptr, elements * acc_dtype.size())?;
    } else if let Some(([mp, np, kp], a, b)) = &padding {
        gpu.driver.gemm(&Gemm {
            dtype,
            out_dtype: acc_dtype,
            m: *np,
            n: *mp,
            k: *kp,
            batch: 1,
            a: b.ptr,
            lda: b.ld,
            stride_a: 0,
            transpose_a: b.transposed,
            b: a.ptr,
            ldb: a.ld,
            stride_b: 0,
            transpose_b: a.transposed,
            c: None,
            bias: None,
            d: acc_ptr,
            ldd: *np,
            stride_d: 0,
        })?;
    } else {
        let residual_ptr = match residual_input {
            Some(t) if blas_residual => Some(gpu.ptr(t)?),
            _ => None,
        };
        let bias = blas_bias.then_some(bias_ptr);
        batched_gemm(gpu, inputs, out, acc_dtype, acc_ptr, residual_ptr, bias)?;
    }
    let Some(scratch) = scratch else {
        return Ok(());
    };
    if !epilogue {
        let src = Lines {
            ptr: buffer_address(gpu.backend(), &scratch)?,
            lines: acc_rows,
            inner: acc_ld,
            ld: acc_ld,
        };
        let dst = Lines {
            ptr: out_ptr,
            lines: m,
            inner: n,
            ld: n,
        };
        return repack(gpu, dtype, src, dst);
    }
    // The residual as the epilogue reads it: row-major.
    let residual_copy = match residual_input {
        Some(t) if !t.layout.is_contiguous() => Some(copy_to_scratch(
            gpu,
            t,
            &Layout::contiguous(&t.layout.shape),
        )?),
        _ => None,
    };
    let residual_ptr = match (residual_input, &residual_copy) {
        (_, Some(copy)) => buffer_address(gpu.backend(), copy)?,
        (Some(t), None) => gpu.ptr(t)?,
        (None, None) => 0,
    };
    let params = EpilogueParams {
        acc: acc_ptr,
        bias: bias_ptr,
        residual: residual_ptr,
        out: out_ptr,
        elements: elements as u64,
        cols: n as u64,
        acc_ld: acc_ld as u64,
    };
    let index = index_type(&[out]);
    let key =
        format!("matmul_epilogue:{dtype}:{acc_dtype}:{bias}:{activation:?}:{residual}:{index}");
    let source = || {
        Ok(epilogue_source(
            dtype, acc_dtype, bias, activation, residual, index,
        ))
    };
    gpu.run(&key, source, grid_for(elements, 256), &params)
}

/// The product of `inputs[0]` and `inputs[1]` into sums of `acc_dtype` at `acc` (laid out
/// as `out`), plus `residual` (BLAS's `c`) and `bias` where given: one strided-batched GEMM
/// per run of batch dimensions that merge.
fn batched_gemm(
    gpu: &Gpu,
    inputs: &[TensorRef<'_>],
    out: &TensorRef<'_>,
    acc_dtype: DType,
    acc: DevicePtr,
    residual: Option<DevicePtr>,
    bias: Option<DevicePtr>,
) -> Result<()> {
    let dtype = out.dtype;
    let r = out.layout.rank();
    let (m, n) = (out.layout.shape[r - 2], out.layout.shape[r - 1]);
    let k = inputs[0].layout.shape[r - 1];
    let (a, a_batch) = operand(gpu, &inputs[0])?;
    let (b, b_batch) = operand(gpu, &inputs[1])?;
    let out_batch = &out.layout.strides[..r - 2];
    let (batch_shape, batch_strides) =
        merge_dims(&out.layout.shape[..r - 2], &[&a_batch, &b_batch, out_batch]);
    // BLAS batches the innermost merged batch dimension; the host loops over the rest.
    let (inner, outer_shape) = match batch_shape.split_last() {
        Some((&inner, outer)) => (inner, outer.to_vec()),
        None => (1, Vec::new()),
    };
    let inner_stride = |t: usize| batch_strides[t].last().copied().unwrap_or(0);
    let size = |d: DType| d.size() as u64;
    let outer_count: usize = outer_shape.iter().product();
    for index in 0..outer_count {
        let mut rem = index;
        let mut offsets = [0usize; 3];
        for d in (0..outer_shape.len()).rev() {
            let c = rem % outer_shape[d];
            rem /= outer_shape[d];
            for (t, offset) in offsets.iter_mut().enumerate() {
                *offset += c * batch_strides[t][d];
            }
        }
        let shift = |ptr: DevicePtr, elements: usize, d: DType| ptr + elements as u64 * size(d);
        gpu.driver.gemm(&Gemm {
            dtype,
            out_dtype: acc_dtype,
            m: n,
            n: m,
            k,
            batch: inner,
            a: shift(b.ptr, offsets[1], dtype),
            lda: b.ld,
            stride_a: inner_stride(1),
            transpose_a: b.transposed,
            b: shift(a.ptr, offsets[0], dtype),
            ldb: a.ld,
            stride_b: inner_stride(0),
            transpose_b: a.transposed,
            c: residual.map(|p| shift(p, offsets[2], dtype)),
            bias,
            d: shift(acc, offsets[2], acc_dtype),
            ldd: n,
            stride_d: inner_stride(2),
        })?;
    }
    Ok(())
}
