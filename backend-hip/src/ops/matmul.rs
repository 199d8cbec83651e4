//! Matrix multiplication through the vendor's BLAS (cuBLASLt on NVIDIA), with the bias,
//! activation and residual epilogues.
//!
//! The product runs as one strided-batched GEMM per run of batch dimensions that merge (one,
//! for every layout the models make), in the row-major output's terms: `out^T = b^T a^T` in
//! BLAS's column-major view, so a row-major operand is passed as it lies and a transposed one
//! with BLAS's transpose flag. An operand with neither unit stride is copied row-major first.
//! f32 stays exact f32 (no TF32); f16 and bf16 accumulate in f32 and round once: straight
//! into the output where the only epilogue is a row-major residual (BLAS's `beta = 1`), else
//! into an f32 accumulator that `kernels/matmul.hip` finishes.

use std::sync::Arc;

use tessera_core::{merge_dims, Buffer, DType, Layout, Op, Result, TensorRef, UnaryOp};

use super::{cxx_type, elementwise, index_type};
use crate::driver::{DevicePtr, Gemm};
use crate::gpu::{grid_for, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/matmul.hip");

hip_params! {
    /// The epilogue's operands (absent ones 0) and the output's `elements` in rows of `cols`.
    EpilogueParams {
        acc: u64,
        bias: u64,
        residual: u64,
        out: u64,
        elements: u64,
        cols: u64,
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
        .collect()
}

/// How BLAS sees one operand's matrices: the address, leading dimension, batch stride and
/// whether it is transposed (in the row-major terms of the op).
struct Operand {
    ptr: DevicePtr,
    ld: usize,
    transposed: bool,
    /// Scratch holding a row-major copy, kept alive until the GEMM is queued.
    _copy: Option<Arc<dyn Buffer>>,
}

/// `t` ([..., rows, cols]) as a BLAS operand: row-major (unit column stride) or transposed
/// (unit row stride) in place, else copied row-major into scratch. Returns the operand and
/// the strides of its batch dimensions.
fn operand(gpu: &Gpu, t: &TensorRef<'_>) -> Result<(Operand, Vec<usize>)> {
    let r = t.layout.rank();
    let (rows, cols) = (t.layout.shape[r - 2], t.layout.shape[r - 1]);
    let (rs, cs) = (t.layout.strides[r - 2], t.layout.strides[r - 1]);
    let batch = t.layout.strides[..r - 2].to_vec();
    if (cs == 1 || cols == 1) && (rows == 1 || rs >= cols.max(1)) {
        let ld = if rows == 1 { cols.max(1) } else { rs };
        let op = Operand {
            ptr: gpu.ptr(t)?,
            ld,
            transposed: false,
            _copy: None,
        };
        return Ok((op, batch));
    }
    if (rs == 1 || rows == 1) && (cols == 1 || cs >= rows.max(1)) {
        let ld = if cols == 1 { rows.max(1) } else { cs };
        let op = Operand {
            ptr: gpu.ptr(t)?,
            ld,
            transposed: true,
            _copy: None,
        };
        return Ok((op, batch));
    }
    let layout = Layout::contiguous(&t.layout.shape);
    let copy = contiguous_copy(gpu, t, &layout)?;
    let op = Operand {
        ptr: buffer_address(gpu.backend(), &copy)?,
        ld: cols.max(1),
        transposed: false,
        _copy: Some(copy),
    };
    Ok((op, layout.strides[..r - 2].to_vec()))
}

/// A row-major copy of `t` with `layout`, in scratch.
fn contiguous_copy(gpu: &Gpu, t: &TensorRef<'_>, layout: &Layout) -> Result<Arc<dyn Buffer>> {
    let copy = gpu.alloc(layout.numel().max(1) * t.dtype.size())?;
    let out = TensorRef {
        buffer: &copy,
        layout,
        dtype: t.dtype,
    };
    elementwise::launch(gpu, &Op::Copy, std::slice::from_ref(t), &[out], &[])?;
    Ok(copy)
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    _scalars: &[f64],
) -> Result<()> {
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
    let residual_input = residual.then(|| &inputs[inputs.len() - 1]);
    // A row-major residual of the output's type is BLAS's `c`; any other epilogue runs after.
    let residual_in_blas = !bias
        && activation.is_none()
        && residual_input.is_some_and(|t| t.layout.is_contiguous())
        && k > 0;
    let epilogue = bias || activation.is_some() || (residual && !residual_in_blas);
    let acc_dtype = if epilogue { DType::F32 } else { dtype };
    let out_ptr = gpu.ptr(out)?;
    // The accumulator: the output itself, unless an epilogue must read f32 sums of 16-bit data.
    let scratch = if acc_dtype != dtype {
        Some(gpu.alloc(elements * 4)?)
    } else {
        None
    };
    let acc_ptr = match &scratch {
        Some(s) => buffer_address(gpu.backend(), s)?,
        None => out_ptr,
    };
    if k == 0 {
        gpu.driver.zero(acc_ptr, elements * acc_dtype.size())?;
    } else {
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
        let residual_ptr = match residual_input {
            Some(t) if residual_in_blas => Some(gpu.ptr(t)?),
            _ => None,
        };
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
            let gemm = Gemm {
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
                c: residual_ptr.map(|p| shift(p, offsets[2], dtype)),
                d: shift(acc_ptr, offsets[2], acc_dtype),
                ldd: n,
                stride_d: inner_stride(2),
            };
            gpu.driver.gemm(&gemm)?;
        }
    }
    if !epilogue {
        return Ok(());
    }
    // The residual as the epilogue reads it: row-major.
    let residual_copy = match residual_input {
        Some(t) if !t.layout.is_contiguous() => Some(contiguous_copy(
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
        bias: if bias { gpu.ptr(&inputs[2])? } else { 0 },
        residual: residual_ptr,
        out: out_ptr,
        elements: elements as u64,
        cols: n as u64,
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
