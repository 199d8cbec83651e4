//! Elementwise ops: casts, copies, unary and binary math, comparisons, select, SwiGLU. One
//! kernel shape for all: every operand read in place through its strides.
//!
//! Copies, float casts, unary and binary math whose operands are all floats that step through
//! their innermost dimension in whole 16-byte vectors ([`wide_operands`]) run a thread per
//! [`GROUP`] elements instead (`map_wide`): vector loads and stores, and no atomics for bf16
//! outputs, whose one-element stores must update half a 32-bit word atomically. The heads'
//! copies into and out of attention's layout are such copies.

use tessera_core::{
    merge_dims, BinaryOp, CompareOp, DType, Error, Layout, Op, Result, TensorRef, UnaryOp,
};

use crate::gpu::Gpu;
use crate::params::{offsets, param_block};
use crate::source::{groups_for, key, run, unsupported, wide_along, wide_elements};

const SRC: &str = include_str!("../kernels/elementwise.wgsl");

/// Dimensions the map kernel indexes, after merging those every operand steps through alike
/// (most launches have one).
const MAX_DIMS: usize = 8;
/// Operands of an elementwise op, inputs and outputs (SwiGLU's backward has five). With
/// [`MAX_DIMS`] they keep [`MapParams`] within 64 words, which immediates hold.
const MAX_OPERANDS: usize = 5;
/// Elements a thread of `map_wide` takes: one 16-byte vector of a 16-bit dtype, two of f32.
const GROUP: usize = 8;

param_block! {
    /// The map kernel's parameters: the output's `elements` in a (merged) `shape`, every
    /// operand's offset and strides (inputs, then outputs), and the op's `scalars`.
    MapParams {
        elements: u32,
        scalars: [f32; 4],
        shape: [u32; MAX_DIMS],
        offsets: [u32; MAX_OPERANDS],
        strides: [[u32; MAX_DIMS]; MAX_OPERANDS],
    }
}

/// `op(x)` in WGSL, with scalars `s0()`, `s1()`.
fn unary(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-x",
        UnaryOp::Abs => "abs(x)",
        UnaryOp::Exp => "exp(x)",
        UnaryOp::Log => "select(select(log(x), -inf(), x == 0.0), nan(), x < 0.0)",
        UnaryOp::Sqrt => "select(sqrt(x), nan(), x < 0.0)",
        UnaryOp::Rsqrt => "select(1.0 / sqrt(x), nan(), x < 0.0)",
        UnaryOp::Recip => "1.0 / x",
        UnaryOp::Square => "x * x",
        UnaryOp::Tanh => "tanh_s(x)",
        UnaryOp::Sigmoid => "sigmoid(x)",
        UnaryOp::Relu => "relu(x)",
        UnaryOp::Gelu => "gelu(x)",
        UnaryOp::Silu => "silu(x)",
        UnaryOp::Sin => "sin(x)",
        UnaryOp::Cos => "cos(x)",
        UnaryOp::Affine => "x * s0() + s1()",
        UnaryOp::PowScalar => "powf(x, s0())",
    }
}

/// `op'(x)` in WGSL. A zero derivative is `zero_times(x)` so that NaN and infinite inputs give NaN, as `0 * x`.
fn derivative(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-1.0",
        UnaryOp::Abs => "select(select(zero_times(x), -1.0, x < 0.0), 1.0, x > 0.0)",
        UnaryOp::Exp => "exp(x)",
        UnaryOp::Log => "1.0 / x",
        UnaryOp::Sqrt => "0.5 / sqrt(x)",
        UnaryOp::Rsqrt => "-0.5 / (x * sqrt(x))",
        UnaryOp::Recip => "-1.0 / (x * x)",
        UnaryOp::Square => "2.0 * x",
        UnaryOp::Tanh => "(1.0 - tanh_s(x) * tanh_s(x))",
        UnaryOp::Sigmoid => "(sigmoid(x) * (1.0 - sigmoid(x)))",
        UnaryOp::Relu => "select(zero_times(x), 1.0, x > 0.0)",
        UnaryOp::Gelu => {
            "(0.5 * (1.0 + tanh_s(GELU_K * (x + 0.044715 * x * x * x))) + 0.5 * x * (1.0 - tanh_s(GELU_K * (x + 0.044715 * x * x * x)) * tanh_s(GELU_K * (x + 0.044715 * x * x * x))) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x))"
        }
        UnaryOp::Silu => "(sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))))",
        UnaryOp::Sin => "cos(x)",
        UnaryOp::Cos => "-sin(x)",
        UnaryOp::Affine => "s0()",
        UnaryOp::PowScalar => "select(s0() * powf(x, s0() - 1.0), 0.0, s0() == 0.0)",
    }
}

fn binary(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "a + b",
        BinaryOp::Sub => "a - b",
        BinaryOp::Mul => "a * b",
        BinaryOp::Div => "a / b",
        BinaryOp::Maximum => "max_nan(a, b)",
        BinaryOp::Minimum => "min_nan(a, b)",
        BinaryOp::Pow => "powf(a, b)",
    }
}

fn compare(c: CompareOp) -> &'static str {
    match c {
        CompareOp::Eq => "a == b",
        CompareOp::Ne => "!(a == b)",
        CompareOp::Lt => "a < b",
        CompareOp::Le => "a <= b",
        CompareOp::Gt => "a > b",
        CompareOp::Ge => "a >= b",
    }
}

/// The WGSL conversion of a native value `v` of `from` into the native type of `to`, as
/// `Cast` defines it.
fn cast(from: DType, to: DType) -> String {
    use DType::*;
    let s = match (from, to) {
        (a, b) if a == b => "v",
        (F32, I32) => "f2i(v)",
        (F32, U32) => "f2u(v)",
        (F32, Bool) => "select(1u, 0u, v == 0.0)",
        (I32, F32) | (U32, F32) => "f32(v)",
        (I32, U32) => "select(u32(v), 0u, v < 0)",
        (U32, I32) => "select(i32(v), 2147483647, v > 2147483647u)",
        (I32, Bool) => "select(0u, 1u, v != 0)",
        (U32, Bool) => "select(0u, 1u, v != 0u)",
        (Bool, F32) => "select(0.0, 1.0, v != 0u)",
        (Bool, I32) => "select(0, 1, v != 0u)",
        (Bool, U32) => "select(0u, 1u, v != 0u)",
        _ => "v",
    };
    s.to_string()
}

/// Whether `dtype` is stored as a 16-bit float.
fn sixteen_bit(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let tensors: Vec<&TensorRef<'_>> = inputs.iter().chain(outputs).collect();
    let strides: Vec<&[usize]> = tensors.iter().map(|t| &t.layout.strides[..]).collect();
    let (shape, strides) = merge_dims(&outputs[0].layout.shape, &strides);
    let n = outputs[0].layout.numel();
    let rank = shape.len();
    if tensors.len() > MAX_OPERANDS {
        return Err(unsupported(gpu, op));
    }
    if rank > MAX_DIMS {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "{} over {rank} dimensions that do not merge (the kernel indexes {MAX_DIMS})",
                op.name()
            ),
        ));
    }
    let wide = wide_operands(gpu, &tensors, &shape, &strides)
        .then(|| {
            let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
            wide_body(op, &dtypes, outputs[0].dtype)
        })
        .flatten();
    let (variant, kernel, threads) = match wide {
        Some(_) => (format!("wide{rank}"), "map_wide", n / GROUP),
        None => (format!("map{rank}"), "map", n),
    };
    run(
        gpu,
        &key(op, inputs, outputs, &variant),
        SRC,
        kernel,
        || {
            let body = match &wide {
                Some(body) => body.clone(),
                None => map_body(op, inputs).ok_or_else(|| unsupported(gpu, op))?,
            };
            Ok(vec![
                (
                    "OFFSETS",
                    operand_offsets(rank, inputs.len() + outputs.len()),
                ),
                ("BODY", body),
            ])
        },
        inputs,
        outputs,
        groups_for(threads),
        |offs| {
            let mut params = MapParams {
                elements: n as u32,
                offsets: offsets(offs),
                ..MapParams::default()
            };
            for (k, scalar) in s.iter().take(4).enumerate() {
                params.scalars[k] = *scalar as f32;
            }
            for (d, &size) in shape.iter().enumerate() {
                params.shape[d] = size as u32;
            }
            for (t, st) in strides.iter().enumerate() {
                for (d, &stride) in st.iter().enumerate() {
                    params.strides[t][d] = stride as u32;
                }
            }
            params
        },
    )
}

/// The code one thread runs on its element (offsets `o0`, `o1`, ... of the operands).
fn map_body(op: &Op, inputs: &[TensorRef<'_>]) -> Option<String> {
    let ni = inputs.len();
    let o = |k: usize| format!("o{k}");
    let out = ni + 1;
    Some(match op {
        // Casts from or to a 16-bit float pass through f32, which holds both exactly.
        Op::Cast { to } if sixteen_bit(inputs[0].dtype) || sixteen_bit(*to) => {
            format!("st{out}({}, ld1({}));", o(1), o(0))
        }
        Op::Cast { to } => format!("let v = ldn1({}); stn{out}({}, {});", o(0), o(1), cast(inputs[0].dtype, *to)),
        Op::Copy => format!("stn2({}, ldn1({}));", o(1), o(0)),
        Op::Unary(u) => format!("let x = ld1({}); st2({}, {});", o(0), o(1), unary(*u)),
        Op::UnaryBackward(u) => {
            format!("let x = ld1({}); let dy = ld2({}); st3({}, dy * {});", o(0), o(1), o(2), derivative(*u))
        }
        Op::Binary(b) => format!("let a = ld1({}); let b = ld2({}); st3({}, {});", o(0), o(1), o(2), binary(*b)),
        Op::Compare(c) => {
            let ld = if sixteen_bit(inputs[0].dtype) { "ld" } else { "ldn" };
            format!("let a = {ld}1({}); let b = {ld}2({}); stn3({}, select(0u, 1u, {}));", o(0), o(1), o(2), compare(*c))
        }
        Op::Where => format!(
            "let c = ldn1({}); let a = ldn2({}); let b = ldn3({}); stn4({}, select(b, a, c != 0u));",
            o(0),
            o(1),
            o(2),
            o(3)
        ),
        Op::SwiGlu => format!("let g = ld1({}); let u = ld2({}); st3({}, silu(g) * u);", o(0), o(1), o(2)),
        Op::SwiGluBackward => format!(
            "let g = ld1({}); let u = ld2({}); let dy = ld3({}); let sg = sigmoid(g); \
             st4({}, dy * u * sg * (1.0 + g * (1.0 - sg))); st5({}, dy * silu(g));",
            o(0),
            o(1),
            o(2),
            o(3),
            o(4)
        ),
        _ => return None,
    })
}

/// Whether every operand, through the merged `shape` and its `strides`, can be read and
/// written as 16-byte vectors along the innermost dimension ([`wide_along`]), that dimension
/// a whole number of [`GROUP`]s long.
fn wide_operands(
    gpu: &dyn Gpu,
    tensors: &[&TensorRef<'_>],
    shape: &[usize],
    strides: &[Vec<usize>],
) -> bool {
    let Some(last) = shape.len().checked_sub(1) else {
        return false;
    };
    shape[last].is_multiple_of(GROUP)
        && tensors.iter().zip(strides).all(|(t, st)| {
            let merged = Layout {
                shape: shape.to_vec(),
                strides: st.clone(),
                offset: t.layout.offset,
            };
            wide_along(gpu, &t.with_layout(&merged), last).is_some()
        })
}

/// The code of a `map_wide` thread on its [`GROUP`] elements (operand offsets `o0`, `o1`,
/// ... of the first): the inputs loaded as vectors, the op per element in f32 (a copy moves
/// the vectors themselves, bit for bit), the output stored as vectors. `None` for ops it
/// does not take.
fn wide_body(op: &Op, inputs: &[DType], out_dtype: DType) -> Option<String> {
    let ni = inputs.len();
    let out = ni + 1;
    let vectors = |dtype: DType| GROUP / wide_elements(dtype).unwrap_or(GROUP);
    if matches!(op, Op::Copy) {
        let per = GROUP / vectors(out_dtype);
        return Some(
            (0..vectors(out_dtype))
                .map(|h| format!("stv{out}(o{ni} / {per}u + {h}u, ldv1(o0 / {per}u + {h}u));\n"))
                .collect(),
        );
    }
    let expr = match op {
        Op::Cast { .. } => "x".to_string(),
        Op::Unary(u) => unary(*u).to_string(),
        Op::UnaryBackward(u) => format!("dy * {}", derivative(*u)),
        Op::Binary(b) => binary(*b).to_string(),
        _ => return None,
    };
    let names: &[&str] = match op {
        Op::UnaryBackward(_) => &["x", "dy"],
        Op::Binary(_) => &["a", "b"],
        _ => &["x"],
    };
    let mut code = String::from("var r: array<f32, 8>;\n");
    for (k, &dtype) in inputs.iter().enumerate() {
        let per = GROUP / vectors(dtype);
        for h in 0..vectors(dtype) {
            code += &format!("let v{k}_{h} = ldv{}(o{k} / {per}u + {h}u);\n", k + 1);
        }
    }
    for j in 0..GROUP {
        let lets: String = inputs
            .iter()
            .zip(names)
            .enumerate()
            .map(|(k, (&dtype, name))| format!("let {name} = {}; ", unpack(dtype, k, j)))
            .collect();
        code += &format!("{{ {lets}r[{j}] = {expr}; }}\n");
    }
    for h in 0..vectors(out_dtype) {
        let per = GROUP / vectors(out_dtype);
        code += &format!("stv{out}(o{ni} / {per}u + {h}u, {});\n", pack(out_dtype, h));
    }
    Some(code)
}

/// Element `j` of input `k`'s group (vectors `vK_H`) as f32.
fn unpack(dtype: DType, k: usize, j: usize) -> String {
    match dtype {
        DType::F32 => format!("bitcast<f32>(v{k}_{}[{}])", j / 4, j % 4),
        DType::F16 => format!("unpack2x16float(v{k}_0[{}])[{}]", j / 2, j % 2),
        _ if j.is_multiple_of(2) => format!("bitcast<f32>(v{k}_0[{}] << 16u)", j / 2),
        _ => format!("bitcast<f32>(v{k}_0[{}] & 0xffff0000u)", j / 2),
    }
}

/// Vector `h` of the group's results `r` in `dtype`, rounded as the one-element stores round.
fn pack(dtype: DType, h: usize) -> String {
    let word = |w: usize| match dtype {
        // Values already rounded to f16 pack exactly, whatever rounding the packing does.
        DType::F16 => format!(
            "pack2x16float(vec2<f32>(f32(to_f16(r[{}])), f32(to_f16(r[{}]))))",
            2 * w,
            2 * w + 1
        ),
        _ => format!(
            "(bf16_bits(r[{}]) | (bf16_bits(r[{}]) << 16u))",
            2 * w,
            2 * w + 1
        ),
    };
    match dtype {
        DType::F32 => {
            let i = 4 * h;
            format!(
                "bitcast<vec4<u32>>(vec4<f32>(r[{}], r[{}], r[{}], r[{}]))",
                i,
                i + 1,
                i + 2,
                i + 3
            )
        }
        _ => format!(
            "vec4<u32>({}, {}, {}, {})",
            word(0),
            word(1),
            word(2),
            word(3)
        ),
    }
}

/// WGSL that sets `o0`, `o1`, ... to each of `tensors` operands' offset of element `i`, for
/// a shape of `rank` dimensions ([`MapParams`]).
fn operand_offsets(rank: usize, tensors: usize) -> String {
    let mut code = String::from("var rem = i;\n");
    for d in (1..rank).rev() {
        code += &format!("let c{d} = rem % params.shape[{d}];\nrem = rem / params.shape[{d}];\n");
    }
    if rank > 0 {
        code += "let c0 = rem;\n";
    }
    for t in 0..tensors {
        let terms: String = (0..rank)
            .map(|d| format!(" + c{d} * params.strides[{t}][{d}]"))
            .collect();
        code += &format!("let o{t} = params.offsets[{t}]{terms};\n");
    }
    code
}

#[cfg(test)]
mod tests {
    use super::{operand_offsets, wide_body, MapParams, SRC};
    use crate::gpu::Build;
    use crate::params::ParamBlock;
    use crate::source::source;
    use tessera_core::{BinaryOp, DType, Op, UnaryOp};

    /// The wide map kernel's WGSL validates for every op it takes, between every pair of
    /// float dtypes.
    #[test]
    fn the_wide_map_kernel_is_valid_wgsl() {
        let floats = [DType::F32, DType::F16, DType::BF16];
        let ops = [
            (Op::Copy, 1),
            (Op::Cast { to: DType::F32 }, 1),
            (Op::Unary(UnaryOp::Gelu), 1),
            (Op::Unary(UnaryOp::Affine), 1),
            (Op::UnaryBackward(UnaryOp::Gelu), 2),
            (Op::Binary(BinaryOp::Maximum), 2),
        ];
        for (op, arity) in ops {
            for (&from, &to) in floats
                .iter()
                .flat_map(|a| floats.iter().map(move |b| (a, b)))
            {
                if matches!(op, Op::Copy) && from != to {
                    continue;
                }
                let inputs = vec![from; arity];
                let body = wide_body(&op, &inputs, to).expect("a wide op");
                let mut bindings: Vec<(DType, bool)> = inputs.iter().map(|&d| (d, false)).collect();
                bindings.push((to, true));
                let subst = [("OFFSETS", operand_offsets(2, arity + 1)), ("BODY", body)];
                let build = Build {
                    immediate_words: None,
                    subgroups: false,
                };
                let src = source(
                    SRC,
                    "map_wide",
                    &bindings,
                    &subst,
                    build,
                    &MapParams::wgsl(),
                );
                crate::source::assert_valid(&src, &format!("{op:?} {from} to {to}"));
            }
        }
    }

    /// The map kernel's WGSL for each rank parses and validates as the device would see it.
    #[test]
    fn the_map_kernel_is_valid_wgsl_for_every_rank() {
        let f32 = |output| (DType::F32, output);
        let body = "let a = ld1(o0); let b = ld2(o1); st3(o2, a + b);".to_string();
        let builds = [
            Build {
                immediate_words: None,
                subgroups: false,
            },
            Build {
                immediate_words: Some(64),
                subgroups: true,
            },
        ];
        for (rank, build) in (0..5).flat_map(|r| builds.map(|b| (r, b))) {
            let subst = [
                ("OFFSETS", operand_offsets(rank, 3)),
                ("BODY", body.clone()),
            ];
            let src = source(
                SRC,
                "map",
                &[f32(false), f32(false), f32(true)],
                &subst,
                build,
                &MapParams::wgsl(),
            );
            crate::source::assert_valid(&src, &format!("rank {rank}"));
        }
    }
}
