//! The compute types: every kernel is written once, generic over [`Float`], and runs in f64 for
//! f64 data and in f32 for f32, f16 and bf16 data (the catalog's rule).

use std::fmt::Debug;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

use half::{bf16, f16};
use tessera_core::{DType, Element};

/// A compute type: `f32` or `f64`. The conversions are named so they do not clash with
/// `num_traits`' fallible `to_f32`/`to_f64`.
pub trait Float:
    num_traits::Float
    + Default
    + Send
    + Sync
    + Debug
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + 'static
{
    fn of_f64(x: f64) -> Self;
    fn of_f32(x: f32) -> Self;
    fn as_f64(self) -> f64;
    fn as_f32(self) -> f32;
    /// Rounds to nearest-even f16.
    fn to_f16(self) -> f16;
    /// Rounds to nearest-even bf16.
    fn to_bf16(self) -> bf16;
}

impl Float for f32 {
    fn of_f64(x: f64) -> Self {
        x as f32
    }
    fn of_f32(x: f32) -> Self {
        x
    }
    fn as_f64(self) -> f64 {
        f64::from(self)
    }
    fn as_f32(self) -> f32 {
        self
    }
    fn to_f16(self) -> f16 {
        f16::from_f32(self)
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self)
    }
}

impl Float for f64 {
    fn of_f64(x: f64) -> Self {
        x
    }
    fn of_f32(x: f32) -> Self {
        f64::from(x)
    }
    fn as_f64(self) -> f64 {
        self
    }
    fn as_f32(self) -> f32 {
        self as f32
    }
    /// Through [`Element::from_f64`], which rounds correctly where `half::f16::from_f64`
    /// can miss a value just past a tie.
    fn to_f16(self) -> f16 {
        <f16 as Element>::from_f64(self)
    }
    fn to_bf16(self) -> bf16 {
        <bf16 as Element>::from_f64(self)
    }
}

/// Whether data of `dtype` computes in f64 (otherwise f32).
pub fn computes_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// Converts launch scalars to the compute type.
pub fn scalars<F: Float>(s: &[f64]) -> Vec<F> {
    s.iter().map(|&x| F::of_f64(x)).collect()
}

/// Elements below which a parallel loop is not worth splitting further.
pub const GRAIN: usize = 1 << 14;

/// Rows of `width` elements per rayon task so that each task has about [`GRAIN`] elements.
pub fn rows_per_task(width: usize) -> usize {
    (GRAIN / width.max(1)).max(1)
}

/// Sums `n` terms `term(i)` in a fixed order that does not depend on the thread count: blocks
/// of 1024 summed left to right, then the block sums left to right. More accurate than one
/// running sum over long inputs, and the same bits every run.
pub fn fixed_sum<F: Float>(n: usize, term: impl Fn(usize) -> F + Sync) -> F {
    use rayon::prelude::*;
    const BLOCK: usize = 1024;
    let block = |b: usize| {
        let end = ((b + 1) * BLOCK).min(n);
        (b * BLOCK..end).fold(F::zero(), |acc, i| acc + term(i))
    };
    let blocks = n.div_ceil(BLOCK);
    if blocks <= 1 {
        return block(0);
    }
    let partial: Vec<F> = (0..blocks)
        .into_par_iter()
        .with_min_len(16)
        .map(block)
        .collect();
    partial.into_iter().fold(F::zero(), |acc, x| acc + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_to_bf16_and_f16_round_correctly_past_ties() {
        // 2^30 + 2^22 + 1 lies just above the tie between two bf16 values; half's from_f64
        // sees only the tie and rounds to even (down).
        let x = f64::from((1u32 << 30) + (1 << 22) + 1);
        assert_eq!(x.to_bf16().to_f64(), f64::from((1u32 << 30) + (1 << 23)));
        assert_eq!(
            f64::from((1u32 << 30) + (1 << 22)).to_bf16().to_f64(),
            f64::from(1u32 << 30)
        );
        let y = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(y.to_f16().to_f64(), 1.0 + 2f64.powi(-10));
        for v in [
            0.0,
            -0.0,
            1e-300,
            -1e-300,
            1e300,
            f64::INFINITY,
            -1.5,
            65504.0,
            65520.0,
        ] {
            assert_eq!(v.to_f16().to_bits(), f16::from_f64(v).to_bits(), "{v}");
            assert_eq!(v.to_bf16().to_bits(), bf16::from_f64(v).to_bits(), "{v}");
        }
        assert!(f64::NAN.to_bf16().is_nan());
    }
}
