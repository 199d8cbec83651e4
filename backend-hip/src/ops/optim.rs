//! Optimizer updates (Adam/AdamW, SGD) and the squared norm of many tensors
//! (`kernels/optim.hip`). Updates run a thread per element in place, Adam a group's
//! parameters 16 to a launch; the norm sums chunks of
//! each tensor into partials, which one block then adds up, so the result has the same bits
//! every run.

use tessera_core::ops::updated_params;
use tessera_core::{DType, Op, Result, TensorRef};

use super::{cxx_type, unsupported};
use crate::gpu::{grid_for, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/optim.hip");

/// Tensors one launch of the squares kernel reads, and parameters one Adam launch updates.
const MAX_TENSORS: usize = 16;
/// Elements each block of the squares kernel sums into one partial, and each block of the
/// Adam kernel updates.
const CHUNK: usize = 4096;
/// Threads of the update and reduction blocks.
const THREADS: u32 = 256;

hip_params! {
    /// Adam's parameters; what changes from step to step is read from `step_values` (grad
    /// scale, step size, decay, sqrt of bias correction 2).
    AdamParams {
        param: [u64; MAX_TENSORS],
        grad: [u64; MAX_TENSORS],
        m: [u64; MAX_TENSORS],
        v: [u64; MAX_TENSORS],
        param_out: [u64; MAX_TENSORS],
        m_out: [u64; MAX_TENSORS],
        v_out: [u64; MAX_TENSORS],
        elements: [u64; MAX_TENSORS],
        chunk0: [u64; MAX_TENSORS],
        step_values: u64,
        chunks: u64,
        chunk: u64,
        count: u32,
        beta1: f32,
        beta2: f32,
        /// 1 - beta1 and 1 - beta2.
        c1: f32,
        c2: f32,
        eps: f32,
        weight_decay: f32,
    }
}

hip_params! {
    /// SGD's parameters (`buf`, `buf_out` unused without momentum).
    SgdParams {
        param: u64,
        grad: u64,
        buf: u64,
        grad_scale: u64,
        param_out: u64,
        buf_out: u64,
        elements: u64,
        lr: f32,
        momentum: f32,
        grad_coef: f32,
        weight_decay: f32,
    }
}

hip_params! {
    /// The norm's first pass over `count` tensors: `chunks` chunks of `chunk` elements in all,
    /// tensor t's from `chunk0[t]`, their sums written from partial `first`.
    SquaresParams {
        ptrs: [u64; MAX_TENSORS],
        elements: [u64; MAX_TENSORS],
        chunk0: [u64; MAX_TENSORS],
        partials: u64,
        first: u64,
        chunks: u64,
        chunk: u64,
        count: u32,
    }
}

hip_params! {
    /// The sum of `count` partials into `out`.
    SumParams {
        partials: u64,
        out: u64,
        count: u64,
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: every optimizer op on f32,
/// f16 and bf16 data.
pub(crate) fn supports(_op: &Op, dtypes: &[DType]) -> bool {
    matches!(dtypes.first(), Some(DType::F32 | DType::F16 | DType::BF16))
}

fn adam_source(dtype: DType, decoupled: bool) -> Source {
    Source::new::<AdamParams>(SRC, "adam")
        .define("ADAM", "1")
        .define("T", cxx_type(dtype))
        .define("DECOUPLED", if decoupled { "1" } else { "0" })
}

fn sgd_source(dtype: DType, momentum: bool, nesterov: bool) -> Source {
    Source::new::<SgdParams>(SRC, "sgd")
        .define("SGD", "1")
        .define("T", cxx_type(dtype))
        .define("MOMENTUM", if momentum { "1" } else { "0" })
        .define("NESTEROV", if nesterov { "1" } else { "0" })
}

fn squares_source(dtype: DType) -> Source {
    Source::new::<SquaresParams>(SRC, "squares")
        .define("SQUARES", "1")
        .define("T", cxx_type(dtype))
}

fn sum_source() -> Source {
    Source::new::<SumParams>(SRC, "sum_partials").define("SUM_PARTIALS", "1")
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let dtype = dtypes[0];
    match op {
        Op::AdamUpdate {
            decoupled_weight_decay,
        } => vec![adam_source(dtype, *decoupled_weight_decay)],
        Op::SgdUpdate { momentum, nesterov } => vec![
            sgd_source(dtype, *momentum, *nesterov),
            sgd_source(dtype, *momentum, !*nesterov),
            sgd_source(dtype, false, false),
        ],
        Op::SquaredNorm => vec![squares_source(dtype), sum_source()],
        _ => Vec::new(),
    }
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let dtype = inputs[0].dtype;
    match op {
        Op::AdamUpdate {
            decoupled_weight_decay: decoupled,
        } => adam(gpu, *decoupled, inputs, outputs, s),
        Op::SgdUpdate { momentum, nesterov } => {
            let n = inputs[0].layout.numel();
            if n == 0 {
                return Ok(());
            }
            let nesterov = *momentum && *nesterov;
            let (buf, buf_out) = if *momentum {
                (gpu.ptr(&inputs[2])?, gpu.ptr(&outputs[1])?)
            } else {
                (0, 0)
            };
            let params = SgdParams {
                param: gpu.ptr(&inputs[0])?,
                grad: gpu.ptr(&inputs[1])?,
                buf,
                grad_scale: gpu.ptr(&inputs[inputs.len() - 1])?,
                param_out: gpu.ptr(&outputs[0])?,
                buf_out,
                elements: n as u64,
                lr: s[0] as f32,
                momentum: s[1] as f32,
                grad_coef: s[2] as f32,
                weight_decay: s[3] as f32,
            };
            let key = format!("sgd:{dtype}:{momentum}:{nesterov}");
            let source = || Ok(sgd_source(dtype, *momentum, nesterov));
            gpu.run(&key, source, grid_for(n, THREADS), &params)
        }
        Op::SquaredNorm => squared_norm(gpu, inputs, &outputs[0]),
        _ => Err(unsupported(gpu, op)),
    }
}

/// A group's Adam update: its parameters [`MAX_TENSORS`] at a time, each launch's blocks
/// over chunks of all of them.
fn adam(
    gpu: &Gpu,
    decoupled: bool,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let dtype = inputs[0].dtype;
    let params = updated_params(
        &Op::AdamUpdate {
            decoupled_weight_decay: decoupled,
        },
        inputs.len(),
    );
    let [beta1, beta2, eps, wd] = [s[0], s[1], s[2], s[3]];
    let live: Vec<usize> = (0..params)
        .filter(|&p| inputs[p].layout.numel() > 0)
        .collect();
    let key = format!("adam:{dtype}:{decoupled}");
    for group in live.chunks(MAX_TENSORS) {
        let mut launch = AdamParams {
            step_values: gpu.ptr(&inputs[inputs.len() - 1])?,
            chunk: CHUNK as u64,
            count: group.len() as u32,
            beta1: beta1 as f32,
            beta2: beta2 as f32,
            c1: (1.0 - beta1) as f32,
            c2: (1.0 - beta2) as f32,
            eps: eps as f32,
            weight_decay: wd as f32,
            ..AdamParams::default()
        };
        let mut chunks = 0;
        for (t, &p) in group.iter().enumerate() {
            let n = inputs[p].layout.numel();
            launch.param[t] = gpu.ptr(&inputs[p])?;
            launch.grad[t] = gpu.ptr(&inputs[params + p])?;
            launch.m[t] = gpu.ptr(&inputs[2 * params + p])?;
            launch.v[t] = gpu.ptr(&inputs[3 * params + p])?;
            launch.param_out[t] = gpu.ptr(&outputs[p])?;
            launch.m_out[t] = gpu.ptr(&outputs[params + p])?;
            launch.v_out[t] = gpu.ptr(&outputs[2 * params + p])?;
            launch.elements[t] = n as u64;
            launch.chunk0[t] = chunks as u64;
            chunks += n.div_ceil(CHUNK);
        }
        launch.chunks = chunks as u64;
        let grid = grid_for(chunks * THREADS as usize, THREADS);
        gpu.run(&key, || Ok(adam_source(dtype, decoupled)), grid, &launch)?;
    }
    Ok(())
}

/// Sums of squares of each tensor's chunks into partials (in tensor order, then chunk
/// order), then their sum in one block.
fn squared_norm(gpu: &Gpu, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let dtype = inputs[0].dtype;
    let out_ptr = gpu.ptr(out)?;
    let tensors: Vec<&TensorRef<'_>> = inputs.iter().filter(|t| t.layout.numel() > 0).collect();
    let total: usize = tensors
        .iter()
        .map(|t| t.layout.numel().div_ceil(CHUNK))
        .sum();
    if total == 0 {
        return gpu.driver.zero(out_ptr, 4);
    }
    let scratch = gpu.alloc(total * 4)?;
    let partials = buffer_address(gpu.backend(), &scratch)?;
    let key = format!("squares:{dtype}");
    let mut first = 0;
    for group in tensors.chunks(MAX_TENSORS) {
        let mut params = SquaresParams {
            partials,
            first: first as u64,
            chunk: CHUNK as u64,
            count: group.len() as u32,
            ..SquaresParams::default()
        };
        let mut chunks = 0;
        for (t, tensor) in group.iter().enumerate() {
            let n = tensor.layout.numel();
            params.ptrs[t] = gpu.ptr(tensor)?;
            params.elements[t] = n as u64;
            params.chunk0[t] = chunks as u64;
            chunks += n.div_ceil(CHUNK);
        }
        params.chunks = chunks as u64;
        let grid = grid_for(chunks * THREADS as usize, THREADS);
        gpu.run(&key, || Ok(squares_source(dtype)), grid, &params)?;
        first += chunks;
    }
    let params = SumParams {
        partials,
        out: out_ptr,
        count: total as u64,
    };
    let grid = grid_for(1, 1024);
    gpu.run("sum_partials", || Ok(sum_source()), grid, &params)
}
