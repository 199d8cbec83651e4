//! Creation and random ops: fill, arange, and Philox uniform and normal values.

use tessera_core::{DType, Element, Error, Op, Result, TensorRef};

use crate::gpu::Gpu;
use crate::source::{groups_for, key, native, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/random.wgsl");

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
                DType::F16 => "to_f16(bitcast<f32>(p[2]))".to_string(),
                other => format!("bitcast<{}>(p[2])", native(*other)),
            };
            let subst = [("FILL_VALUE", value)];
            run(
                gpu,
                &k("fill"),
                SRC,
                "fill",
                || Ok(subst.to_vec()),
                &[],
                outputs,
                groups,
                |o, p| {
                    p.u(n).u(o[0]).w(bits);
                },
            )
        }
        Op::Arange { dtype } => {
            let (a_hi, a_lo) = split(s[0]);
            let (d_hi, d_lo) = split(s[1]);
            let store = match dtype {
                DType::F32 | DType::F16 | DType::BF16 => "st1(p[1] + i, s + lo);",
                DType::Bool => {
                    "let v = s + lo; let r = lo - (v - s); st1(p[1] + i, select(r, v, v != 0.0));"
                }
                _ => {
                    let last = s[0] + s[1] * (first + n).saturating_sub(1) as f64;
                    if s[0].abs().max(last.abs()) >= 16_777_216.0 {
                        return Err(Error::unsupported(
                            "wgpu",
                            format!("arange into {dtype} past 2^24"),
                        ));
                    }
                    "let v = s + lo; let r = lo - (v - s); var t = trunc(v); \
                     if (t == v) { if (v > 0.0 && r < 0.0) { t -= 1.0; } else if (v < 0.0 && r > 0.0) { t += 1.0; } } \
                     st1(p[1] + i, t);"
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
                |o, p| {
                    p.u(n).u(o[0]).f(a_hi).f(a_lo).f(d_hi).f(d_lo).u(first);
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
                |o, p| {
                    p.u(n)
                        .u(o[0])
                        .w(s[0] as u32)
                        .w(s[1] as u32)
                        .w(s[2] as u32)
                        .w(s[3] as u32)
                        .f(s[4])
                        .f(s[5])
                        .u(first);
                },
            )
        }
        _ => Err(unsupported(gpu, op)),
    }
}
