//! Creation and random ops: fill, arange, and Philox uniform and normal values.

use tessera_core::{DType, Element, Error, Op, Result, TensorRef};

use crate::gpu::Gpu;
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, native, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/random.wgsl");

param_block! {
    /// Fill's parameters: the value as the bits of its native WGSL type.
    FillParams {
        elements: u32,
        value: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

param_block! {
    /// Arange's parameters: start and step as (hi, lo) f32 pairs, and the index of the
    /// output's first element in the whole tensor.
    ArangeParams {
        elements: u32,
        start_hi: f32,
        start_lo: f32,
        step_hi: f32,
        step_lo: f32,
        first: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

param_block! {
    /// Uniform and normal values: Philox `key` and `stream` words, the range (`a`, `b`) or
    /// mean and standard deviation, and the index of the output's first element in the whole
    /// tensor (its counter).
    RandomParams {
        elements: u32,
        key: [u32; 2],
        stream: [u32; 2],
        a: f32,
        b: f32,
        first: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

/// `value` converted to `dtype` as `Cast` converts, as the bits of its native WGSL type.
fn native_bits(value: f64, dtype: DType) -> u32 {
    match dtype {
        DType::F32 => (value as f32).to_bits(),
        DType::F16 => (rounded(value, DType::F16) as f32).to_bits(),
        DType::BF16 => {
            let bits = (rounded(value, DType::BF16) as f32).to_bits();
            bits >> 16
        }
        DType::I32 => i32::from_f64(value) as u32,
        DType::U32 => u32::from_f64(value),
        _ => u32::from(value != 0.0),
    }
}

/// `value` rounded once to the 16-bit float `dtype` (exact in f32).
fn rounded(value: f64, dtype: DType) -> f64 {
    let bytes = tessera_core::encode_f64(&[value], dtype);
    tessera_core::decode_f64(&bytes, dtype)[0]
}

/// An f64 as two f32s whose sum is within f32 rounding of it twice over.
fn split(v: f64) -> (f64, f64) {
    let hi = v as f32;
    (f64::from(hi), f64::from((v - f64::from(hi)) as f32))
}

/// Runs `op` into `outputs[0]`, whose first element is element `first` of the whole output
/// (windows of a tensor larger than one binding give the values a single launch would).
pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    outputs: &[TensorRef<'_>],
    s: &[f64],
    first: usize,
) -> Result<()> {
    let out = &outputs[0];
    let n = out.layout.numel();
    let groups = groups_for(n);
    let k = |variant: &str| key(op, &[], outputs, variant);
    match op {
        Op::Fill { dtype } => {
            let bits = native_bits(s[0], *dtype);
            // An f16 comes as the f32 that holds it exactly; a bf16 as its 16 bits.
            let value = match dtype {
                DType::F16 => "to_f16(bitcast<f32>(params.value))".to_string(),
                other => format!("bitcast<{}>(params.value)", native(*other)),
            };
            let subst = [("FILL_VALUE", value)];
            // bf16 in whole words where the output starts on one and fills its last.
            let words =
                *dtype == DType::BF16 && out.layout.offset.is_multiple_of(2) && n.is_multiple_of(2);
            let (section, groups) = match words {
                true => ("fill_words", groups_for(n / 2)),
                false => ("fill", groups),
            };
            run(
                gpu,
                &k(section),
                SRC,
                section,
                || Ok(subst.to_vec()),
                &[],
                outputs,
                groups,
                |o| FillParams {
                    elements: n as u32,
                    value: bits,
                    offsets: offsets(o),
                },
            )
        }
        Op::Arange { dtype } => {
            let (a_hi, a_lo) = split(s[0]);
            let (d_hi, d_lo) = split(s[1]);
            let store = match dtype {
                DType::F32 | DType::F16 | DType::BF16 => "st1(out_at(i), s + lo);",
                DType::Bool => {
                    "let v = s + lo; let r = lo - (v - s); st1(out_at(i), select(r, v, v != 0.0));"
                }
                _ => {
                    let last = s[0] + s[1] * (first + n).saturating_sub(1) as f64;
                    if s[0].abs().max(last.abs()) >= 16_777_216.0 {
                        return Err(Error::unsupported(
                            gpu.backend(),
                            format!("arange into {dtype} past 2^24"),
                        ));
                    }
                    "let v = s + lo; let r = lo - (v - s); var t = trunc(v); \
                     if (t == v) { if (v > 0.0 && r < 0.0) { t -= 1.0; } else if (v < 0.0 && r > 0.0) { t += 1.0; } } \
                     st1(out_at(i), t);"
                }
            };
            run(
                gpu,
                &k("arange"),
                SRC,
                "arange_float",
                || Ok(vec![("STORE", store.into())]),
                &[],
                outputs,
                groups,
                |o| ArangeParams {
                    elements: n as u32,
                    start_hi: a_hi as f32,
                    start_lo: a_lo as f32,
                    step_hi: d_hi as f32,
                    step_lo: d_lo as f32,
                    first: first as u32,
                    offsets: offsets(o),
                },
            )
        }
        Op::RandUniform { .. } | Op::RandNormal { .. } => {
            let section = if matches!(op, Op::RandNormal { .. }) {
                "normal"
            } else {
                "uniform"
            };
            run(
                gpu,
                &k(section),
                SRC,
                section,
                no_subst,
                &[],
                outputs,
                groups,
                |o| RandomParams {
                    elements: n as u32,
                    key: [s[0] as u32, s[1] as u32],
                    stream: [s[2] as u32, s[3] as u32],
                    a: s[4] as f32,
                    b: s[5] as f32,
                    first: first as u32,
                    offsets: offsets(o),
                },
            )
        }
        _ => Err(unsupported(gpu, op)),
    }
}
