//! Fused cross-entropy, forward (a workgroup per row) and backward (a thread per pair of
//! logits, or per 16-byte vector of them where rows are whole vectors).

use tessera_core::{DType, Op, Result, TensorRef};

use crate::gpu::Gpu;
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, run, unsupported, wide_along, wide_helpers};

const SRC: &str = include_str!("../kernels/loss.wgsl");

param_block! {
    /// Cross-entropy's parameters: `rows` rows of `vocab` logits.
    LossParams {
        rows: u32,
        vocab: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (rows, vocab) = (inputs[0].layout.shape[0], inputs[0].layout.shape[1]);
    let dtype = inputs[0].dtype;
    // Rows of whole 16-byte vectors are read (and gradients written) a vector at a time: a
    // padded vocabulary's logits are (GPT-2's 50,432 columns).
    let per_vector = wide_along(gpu, &inputs[0], 1);
    let (section, groups) = match (op, per_vector) {
        (Op::CrossEntropy, Some(_)) => ("cross_entropy_wide", rows as u64),
        (Op::CrossEntropy, None) => ("cross_entropy", rows as u64),
        (Op::CrossEntropyBackward, Some(per)) if wide_along(gpu, &outputs[0], 1).is_some() => (
            "cross_entropy_backward_wide",
            groups_for(rows * vocab / per),
        ),
        // A thread per pair of elements, and one for the elements left alone.
        (Op::CrossEntropyBackward, _) => {
            ("cross_entropy_backward", groups_for(rows * vocab / 2 + 1))
        }
        _ => return Err(unsupported(gpu, op)),
    };
    run(
        gpu,
        &key(op, inputs, outputs, section),
        SRC,
        section,
        || {
            Ok(match section.ends_with("_wide") {
                true => vec![
                    ("VECTOR_MATH", wide_helpers(dtype)),
                    ("PACKING", packing(dtype).into()),
                ],
                false => Vec::new(),
            })
        },
        inputs,
        outputs,
        groups,
        |o| LossParams {
            rows: rows as u32,
            vocab: vocab as u32,
            offsets: offsets(o),
        },
    )
}

/// `pack_vector(a, b)`: the results `a` then `b` as one 16-byte vector of `dtype` (f32: `a`
/// alone), rounded as the kernels' one-element stores round.
fn packing(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            "fn pack_vector(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> { return bitcast<vec4<u32>>(a); }\n"
        }
        // Values already rounded to f16 pack exactly, whatever rounding the packing does.
        DType::F16 => {
            "fn half2(x: f32, y: f32) -> u32 { return pack2x16float(vec2<f32>(f32(to_f16(x)), f32(to_f16(y)))); }\n\
             fn pack_vector(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {\n\
             \x20   return vec4<u32>(half2(a.x, a.y), half2(a.z, a.w), half2(b.x, b.y), half2(b.z, b.w));\n}\n"
        }
        _ => {
            "fn bf2(x: f32, y: f32) -> u32 { return bf16_bits(x) | (bf16_bits(y) << 16u); }\n\
             fn pack_vector(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {\n\
             \x20   return vec4<u32>(bf2(a.x, a.y), bf2(a.z, a.w), bf2(b.x, b.y), bf2(b.z, b.w));\n}\n"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{packing, LossParams, SRC};
    use crate::gpu::Build;
    use crate::params::ParamBlock;
    use crate::source::{source, wide_helpers};
    use tessera_core::DType;

    /// The vector kernels validate for every float dtype, with logits and dlogits declared
    /// as 16-byte vectors and the row statistics as elements.
    #[test]
    fn the_vector_kernels_are_valid_wgsl() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (logits, index, stat) = ((dtype, false), (DType::I32, false), (DType::F32, false));
            let kernels = [
                (
                    "cross_entropy_wide",
                    vec![logits, index, (DType::F32, true), (DType::F32, true)],
                ),
                (
                    "cross_entropy_backward_wide",
                    vec![logits, index, stat, stat, (dtype, true)],
                ),
            ];
            for (section, bindings) in kernels {
                let subst = vec![
                    ("VECTOR_MATH", wide_helpers(dtype)),
                    ("PACKING", packing(dtype).to_string()),
                ];
                let build = Build {
                    immediate_words: None,
                    subgroups: true,
                };
                let src = source(SRC, section, &bindings, &subst, build, &LossParams::wgsl());
                assert!(src.contains("b1: array<vec4<u32>>"), "{section} {dtype:?}");
                assert!(!src.contains("b3: array<vec4<u32>>"), "{section} {dtype:?}");
                crate::source::assert_valid(&src, &format!("{section} {dtype:?}"));
            }
        }
    }
}
