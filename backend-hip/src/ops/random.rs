//! Creation and random ops: fill, arange, uniform and normal random numbers (core's
//! counter-based Philox generator, the same bits on every backend). One thread per element
//! (`kernels/random.hip`); fill's value is converted on the host, arange computes in f64 on
//! the device, and the random formulas round exactly as the CPU's.

use tessera_core::{encode_f64, DType, Op, Result, TensorRef};

use super::{cxx_type, raw_type, unsupported};
use crate::gpu::{grid_for, Gpu, Source};
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/random.hip");

hip_params! {
    /// Every creation kernel's parameters: the output and its element count; fill's `value`
    /// as the bits of the stored type; arange's `start` and `step` as f64 bits; the random
    /// ops' Philox `key` and `counter` words and their range or mean and deviation (`a`, `b`).
    RandomParams {
        out: u64,
        elements: u64,
        start: u64,
        step: u64,
        key: [u32; 2],
        counter: [u32; 2],
        a: f32,
        b: f32,
        value: u32,
    }
}

/// Whether this family's kernels run `op`: every creation op on every dtype the device stores.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

/// The kernel entry point of `op`.
fn entry(op: &Op) -> Option<&'static str> {
    Some(match op {
        Op::Fill { .. } => "fill",
        Op::Arange { .. } => "arange",
        Op::RandUniform { .. } => "uniform",
        Op::RandNormal { .. } => "normal",
        _ => return None,
    })
}

/// The kernel for `op` writing `dtype`.
fn random_source(op: &Op, dtype: DType) -> Option<Source> {
    let entry = entry(op)?;
    let source = Source::new::<RandomParams>(SRC, entry).define("T", cxx_type(dtype));
    Some(match op {
        Op::Fill { .. } => source.define("FILL_T", raw_type(dtype)),
        _ => source,
    })
}

/// The output dtype of a creation op.
#[cfg(test)]
fn dtype_of(op: &Op) -> Option<DType> {
    match op {
        Op::Fill { dtype }
        | Op::Arange { dtype }
        | Op::RandUniform { dtype }
        | Op::RandNormal { dtype } => Some(*dtype),
        _ => None,
    }
}

/// The kernels `launch` compiles for `op`: its own output dtype, and for fill and arange the
/// integer and bool outputs too.
#[cfg(test)]
pub(crate) fn samples(op: &Op, _dtypes: &[DType]) -> Vec<Source> {
    let Some(own) = dtype_of(op) else {
        return Vec::new();
    };
    let mut dtypes = vec![own, DType::F16, DType::BF16];
    if matches!(op, Op::Fill { .. } | Op::Arange { .. }) {
        dtypes.extend([DType::I32, DType::U32, DType::Bool]);
    }
    dtypes
        .into_iter()
        .filter_map(|d| random_source(op, d))
        .collect()
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    _inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let out = &outputs[0];
    let n = out.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let dtype = out.dtype;
    let mut params = RandomParams {
        out: gpu.ptr(out)?,
        elements: n as u64,
        ..RandomParams::default()
    };
    match op {
        Op::Fill { .. } => {
            let bytes = encode_f64(&[s[0]], dtype);
            // Zeros (gradients' first value) go through the driver's memset, which writes
            // at full bandwidth where the kernel stores an element per thread.
            if bytes.iter().all(|&b| b == 0) {
                return gpu.driver.zero(params.out, n * dtype.size());
            }
            params.value = bytes
                .iter()
                .rev()
                .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
        }
        Op::Arange { .. } => {
            params.start = s[0].to_bits();
            params.step = s[1].to_bits();
        }
        Op::RandUniform { .. } | Op::RandNormal { .. } => {
            params.key = [s[0] as u32, s[1] as u32];
            params.counter = [s[2] as u32, s[3] as u32];
            params.a = s[4] as f32;
            params.b = s[5] as f32;
        }
        _ => return Err(unsupported(gpu, op)),
    }
    let key = format!("{}:{dtype}", op.name());
    let source = || random_source(op, dtype).ok_or_else(|| unsupported(gpu, op));
    gpu.run(&key, source, grid_for(n, 256), &params)
}
