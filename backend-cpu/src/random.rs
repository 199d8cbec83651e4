//! Creation and random ops: fill, arange, uniform and normal from the counter-based generator.

use rayon::prelude::*;
use tessera_core::rng::{element_words, join_u64, unit_uniform};
use tessera_core::{encode_f64, Op, Result, TensorRef};

use crate::buffer::{write, write_raw};
use crate::float::{computes_in_f64, Float, GRAIN};
use crate::wrong_family;

pub(crate) fn launch(op: &Op, outputs: &[TensorRef<'_>], s: &[f64]) -> Result<()> {
    let out = &outputs[0];
    let n = out.layout.numel();
    match op {
        Op::Fill { dtype } => {
            let one = encode_f64(&[s[0]], *dtype);
            write_raw(out, &one.repeat(n))
        }
        Op::Arange { .. } => {
            let values: Vec<f64> = (0..n).map(|i| s[0] + i as f64 * s[1]).collect();
            write(out, &values)
        }
        Op::RandUniform { dtype } | Op::RandNormal { dtype } => {
            let normal = matches!(op, Op::RandNormal { .. });
            if computes_in_f64(*dtype) {
                write(out, &random::<f64>(n, s, normal))
            } else {
                write(out, &random::<f32>(n, s, normal))
            }
        }
        _ => Err(wrong_family(op)),
    }
}

/// Element `i` of a uniform or normal launch, per the catalog (random.rs), computed in `F`.
fn random<F: Float>(n: usize, s: &[f64], normal: bool) -> Vec<F> {
    let key = join_u64(s[0], s[1]);
    let counter = join_u64(s[2], s[3]);
    let (a, b) = (F::of_f64(s[4]), F::of_f64(s[5]));
    let two_pi = F::of_f64(2.0 * std::f64::consts::PI);
    let unit = |w: u32| F::of_f64(unit_uniform(w));
    (0..n)
        .into_par_iter()
        .with_min_len(GRAIN)
        .map(|i| {
            let w = element_words(key, counter, i as u64);
            if normal {
                let u1 = F::of_f64(f64::from((w[0] >> 8) + 1) * (1.0 / 16_777_216.0));
                let u2 = unit(w[1]);
                let minus_log_u1 = -(-(F::one() - u1)).ln_1p();
                let half = F::of_f64(0.5);
                a + b * (F::of_f64(2.0) * minus_log_u1).sqrt() * -(two_pi * (u2 - half)).cos()
            } else {
                a + (b - a) * unit(w[0])
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_is_finite_and_uniform_in_range() {
        let s = [7.0, 0.0, 3.0, 0.0, -1.0, 2.0];
        let u = random::<f32>(1000, &s, false);
        assert!(u.iter().all(|&x| (-1.0..2.0).contains(&x)));
        let z = random::<f64>(1000, &s, true);
        assert!(z.iter().all(|x| x.is_finite()));
    }
}
