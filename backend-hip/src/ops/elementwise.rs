//! Elementwise ops: casts, copies, unary and binary math, comparisons, select, SwiGLU. One
//! kernel for all (`kernels/elementwise.hip`): every operand read in place through its
//! strides, the op's code generated per op and dtypes.

use tessera_core::{merge_dims, BinaryOp, CompareOp, DType, Error, Op, Result, TensorRef, UnaryOp};

use super::{cxx_type, index_type, unsupported};
use crate::driver::DevicePtr;
use crate::gpu::{grid_for, Gpu, Source};
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/elementwise.hip");

/// Dimensions the map kernel indexes, after merging those every operand steps through alike.
const MAX_DIMS: usize = 8;
/// Operands of an elementwise op, inputs and outputs (SwiGLU's backward has five).
const MAX_OPERANDS: usize = 5;

hip_params! {
    /// The map kernel's parameters: each operand's address (inputs, then outputs), the
    /// output's `elements` in a (merged) `shape`, every operand's strides, and the op's
    /// `scalars`.
    MapParams {
        ptrs: [u64; MAX_OPERANDS],
        elements: u64,
        shape: [u64; MAX_DIMS],
        strides: [[u64; MAX_DIMS]; MAX_OPERANDS],
        scalars: [f32; 4],
    }
}

/// Elements per thread of the map kernel (its `MAP_UNROLL`).
const MAP_UNROLL: usize = 4;

/// `op(x)` in C++, with scalars `S0`, `S1`.
fn unary(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-x",
        UnaryOp::Abs => "fabsf(x)",
        UnaryOp::Exp => "expf(x)",
        UnaryOp::Log => "(x < 0.0f ? nan_f() : (x == 0.0f ? -inf_f() : logf(x)))",
        UnaryOp::Sqrt => "(x < 0.0f ? nan_f() : sqrtf(x))",
        UnaryOp::Rsqrt => "(x < 0.0f ? nan_f() : 1.0f / sqrtf(x))",
        UnaryOp::Recip => "1.0f / x",
        UnaryOp::Square => "x * x",
        UnaryOp::Tanh => "tanhf(x)",
        UnaryOp::Sigmoid => "sigmoid(x)",
        UnaryOp::Relu => "relu(x)",
        UnaryOp::Gelu => "gelu(x)",
        UnaryOp::Silu => "silu(x)",
        UnaryOp::Sin => "sinf(x)",
        UnaryOp::Cos => "cosf(x)",
        UnaryOp::Affine => "fmaf(x, S0, S1)",
        UnaryOp::PowScalar => "powf_r(x, S0)",
    }
}

/// `op'(x)` in C++. A zero derivative is `zero_times(x)` so that NaN and infinite inputs
/// give NaN, as `0 * x`.
fn derivative(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-1.0f",
        UnaryOp::Abs => "(x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : zero_times(x)))",
        UnaryOp::Exp => "expf(x)",
        UnaryOp::Log => "1.0f / x",
        UnaryOp::Sqrt => "0.5f / sqrtf(x)",
        UnaryOp::Rsqrt => "-0.5f / (x * sqrtf(x))",
        UnaryOp::Recip => "-1.0f / (x * x)",
        UnaryOp::Square => "2.0f * x",
        UnaryOp::Tanh => "(1.0f - tanhf(x) * tanhf(x))",
        UnaryOp::Sigmoid => "(sigmoid(x) * (1.0f - sigmoid(x)))",
        UnaryOp::Relu => "(x > 0.0f ? 1.0f : zero_times(x))",
        UnaryOp::Gelu => "gelu_grad(x)",
        UnaryOp::Silu => "(sigmoid(x) * (1.0f + x * (1.0f - sigmoid(x))))",
        UnaryOp::Sin => "cosf(x)",
        UnaryOp::Cos => "-sinf(x)",
        UnaryOp::Affine => "S0",
        UnaryOp::PowScalar => "(S0 == 0.0f ? 0.0f : S0 * powf_r(x, S0 - 1.0f))",
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
        BinaryOp::Pow => "powf_r(a, b)",
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

/// Whether `dtype` is stored as a 16-bit float.
fn sixteen_bit(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// The C++ conversion of a value `v` of `from` (16-bit floats already widened to f32) into
/// the type of `to` (f32 for 16-bit floats), as `Cast` defines it.
fn cast(from: DType, to: DType) -> &'static str {
    use DType::*;
    let wide = |d: DType| if sixteen_bit(d) { F32 } else { d };
    match (wide(from), wide(to)) {
        (a, b) if a == b => "v",
        (F32, I32) => "f2i(v)",
        (F32, U32) => "f2u(v)",
        (F32, Bool) => "(u8)(v == 0.0f ? 0 : 1)",
        (I32, F32) | (U32, F32) => "(float)v",
        (I32, U32) => "(v < 0 ? 0u : (u32)v)",
        (U32, I32) => "(v > 2147483647u ? 2147483647 : (i32)v)",
        (I32, Bool) | (U32, Bool) => "(u8)(v != 0 ? 1 : 0)",
        (Bool, F32) => "(v != 0 ? 1.0f : 0.0f)",
        (Bool, I32) => "(i32)(v != 0 ? 1 : 0)",
        (Bool, U32) => "(u32)(v != 0 ? 1u : 0u)",
        _ => "v",
    }
}

/// The code one thread runs on its element (offsets `o0`, `o1`, ... of the operands), for
/// inputs of `dtypes`.
fn map_body(op: &Op, dtypes: &[DType]) -> Option<String> {
    let out = dtypes.len();
    Some(match op {
        Op::Cast { to } => {
            let from = dtypes[0];
            let load = if sixteen_bit(from) {
                "ld(P0, o0)"
            } else {
                "P0[o0]"
            };
            let value = cast(from, *to);
            if sixteen_bit(*to) {
                format!("auto v = {load}; st(P1, o1, {value});")
            } else {
                format!("auto v = {load}; P1[o1] = {value};")
            }
        }
        Op::Copy => "P1[o1] = P0[o0];".into(),
        Op::Unary(u) => format!("const float x = ld(P0, o0); st(P1, o1, {});", unary(*u)),
        Op::UnaryBackward(u) => format!(
            "const float x = ld(P0, o0); const float dy = ld(P1, o1); st(P2, o2, dy * {});",
            derivative(*u)
        ),
        Op::Binary(b) => format!(
            "const float a = ld(P0, o0); const float b = ld(P1, o1); st(P2, o2, {});",
            binary(*b)
        ),
        Op::Compare(c) => {
            let load = |k: usize| {
                if dtypes[0].is_float() {
                    format!("ld(P{k}, o{k})")
                } else {
                    format!("P{k}[o{k}]")
                }
            };
            format!(
                "const auto a = {}; const auto b = {}; P{out}[o{out}] = ({}) ? 1 : 0;",
                load(0),
                load(1),
                compare(*c)
            )
        }
        Op::Where => "P3[o3] = P0[o0] != 0 ? P1[o1] : P2[o2];".into(),
        Op::SwiGlu => {
            "const float g = ld(P0, o0); const float u = ld(P1, o1); st(P2, o2, silu(g) * u);"
                .into()
        }
        Op::SwiGluBackward => "const float g = ld(P0, o0); const float u = ld(P1, o1); \
             const float dy = ld(P2, o2); const float sg = sigmoid(g); \
             st(P3, o3, dy * u * sg * (1.0f + g * (1.0f - sg))); st(P4, o4, dy * silu(g));"
            .into(),
        _ => return None,
    })
}

/// Whether the map kernel runs `op`: every elementwise op, on any dtypes the catalog allows.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

/// How the map kernel walks its operands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// An element at a time, through strides.
    Strided,
    /// A copy in 16-byte groups of elements (see [`wide_copy`]).
    Wide,
    /// Rows of whole groups of this many elements (see [`vector_width`]).
    Vector(usize),
}

/// The map kernel for `op` on operands of `dtypes` (inputs, then outputs) over `rank`
/// dimensions, indexed with `index`, walking them as `walk` says.
fn map_source(
    op: &Op,
    dtypes: &[DType],
    inputs: usize,
    rank: usize,
    index: &str,
    walk: Walk,
) -> Option<Source> {
    let mut source = Source::new::<MapParams>(SRC, "map")
        .define("IDX", index)
        .define(
            "OFFSETS",
            operand_offsets(rank, dtypes.len()).replace('\n', " "),
        )
        .define("BODY", map_body(op, &dtypes[..inputs])?)
        .define("INPUTS", inputs.to_string());
    if let Walk::Vector(width) = walk {
        source = source.define("VEC", width.to_string());
    }
    for (k, &dtype) in dtypes.iter().enumerate() {
        let stored = if walk == Walk::Wide {
            "u128"
        } else {
            cxx_type(dtype)
        };
        source = source.define(&format!("T{k}"), stored);
    }
    Some(source)
}

/// The group width of a vector walk: as many elements as keep the widest operand's group at
/// 16 bytes, where every operand's innermost merged dimension is contiguous and made of whole
/// groups, every other stride is a whole number of groups (rows of a strided view: the
/// slices of a fused QKV gradient), and every operand starts on its group's boundary. Each
/// thread then moves a group per operand with one load or store.
fn vector_width(
    shape: &[usize],
    strides: &[Vec<usize>],
    tensors: &[&TensorRef<'_>],
    ptrs: &[DevicePtr],
) -> Option<usize> {
    let widest = tensors.iter().map(|t| t.dtype.size()).max()?;
    let width = 16 / widest;
    let last = shape.len().checked_sub(1)?;
    let rows_of_groups = shape[last].is_multiple_of(width)
        && strides
            .iter()
            .all(|st| st[last] == 1 && st[..last].iter().all(|s| s.is_multiple_of(width)));
    let aligned = tensors
        .iter()
        .zip(ptrs)
        .all(|(t, p)| p.is_multiple_of((t.dtype.size() * width) as u64));
    (width > 1 && rows_of_groups && aligned).then_some(width)
}

/// `shape` and `strides` counted in groups of `group` elements along the innermost
/// dimension (which every operand has contiguous, in whole groups).
fn in_groups(
    shape: &[usize],
    strides: &[Vec<usize>],
    group: usize,
) -> (Vec<usize>, Vec<Vec<usize>>) {
    let last = shape.len() - 1;
    let mut grouped = shape.to_vec();
    grouped[last] /= group;
    let strides = strides
        .iter()
        .map(|st| {
            let mut w: Vec<usize> = st[..last].iter().map(|s| s / group).collect();
            w.push(1);
            w
        })
        .collect();
    (grouped, strides)
}

/// Bytes a wide copy moves per element (the prelude's `u128`).
const WIDE: usize = 16;

/// Whether a copy over merged `shape` and `strides` (source, destination) at `ptrs` moves
/// whole 16-byte groups: both innermost dimensions contiguous, 16-byte aligned, and every
/// other stride a whole number of groups. Then the copy runs over groups, moving 16 bytes per
/// load where elements would move 2 or 4 (transposes of attention heads, 64 elements long).
fn wide_copy(
    elem: usize,
    shape: &[usize],
    strides: &[Vec<usize>],
    ptrs: &[DevicePtr],
) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
    let group = WIDE / elem;
    let last = shape.len().checked_sub(1)?;
    let fits = shape[last].is_multiple_of(group)
        && ptrs.iter().all(|p| p.is_multiple_of(WIDE as u64))
        && strides
            .iter()
            .all(|st| st[last] == 1 && st[..last].iter().all(|s| s.is_multiple_of(group)));
    fits.then(|| in_groups(shape, strides, group))
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`: ranks 1 and 3, both index
/// types.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let outputs: Vec<DType> = match op {
        Op::Cast { to } => vec![*to],
        Op::Compare(_) => vec![DType::Bool],
        Op::Where => vec![dtypes[1]],
        Op::SwiGluBackward => vec![dtypes[0]; 2],
        _ => vec![dtypes[0]],
    };
    let all: Vec<DType> = dtypes.iter().chain(&outputs).copied().collect();
    let widest = all.iter().map(|d| d.size()).max().unwrap_or(1);
    let mut sources = Vec::new();
    for (rank, index) in [(1, "u32"), (3, "u64")] {
        let mut walks = vec![Walk::Strided];
        if widest < 16 {
            walks.push(Walk::Vector(16 / widest));
        }
        if matches!(op, Op::Copy) {
            walks.push(Walk::Wide);
        }
        for walk in walks {
            sources.extend(map_source(op, &all, dtypes.len(), rank, index, walk));
        }
    }
    sources
}

/// C++ that sets `o0`, `o1`, ... to each of `operands` operands' offset of element `i`, for
/// a shape of `rank` dimensions ([`MapParams`]).
fn operand_offsets(rank: usize, operands: usize) -> String {
    let mut code = String::from("IDX rem = i;\n");
    for d in (1..rank).rev() {
        code += &format!("const IDX c{d} = rem % (IDX)p.shape[{d}]; rem /= (IDX)p.shape[{d}];\n");
    }
    if rank > 0 {
        code += "const IDX c0 = rem;\n";
    }
    for t in 0..operands {
        let terms: String = (0..rank)
            .map(|d| format!(" + c{d} * (IDX)p.strides[{t}][{d}]"))
            .collect();
        code += &format!("const IDX o{t} = 0{terms};\n");
    }
    code += "(void)rem;\n";
    code
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let tensors: Vec<&TensorRef<'_>> = inputs.iter().chain(outputs).collect();
    let n = outputs[0].layout.numel();
    if n == 0 {
        return Ok(());
    }
    let strides: Vec<&[usize]> = tensors.iter().map(|t| &t.layout.strides[..]).collect();
    let (shape, strides) = merge_dims(&outputs[0].layout.shape, &strides);
    let ptrs = tensors
        .iter()
        .map(|t| gpu.ptr(t))
        .collect::<Result<Vec<DevicePtr>>>()?;
    let elem = outputs[0].dtype.size();
    let widened = match op {
        Op::Copy if elem < WIDE => wide_copy(elem, &shape, &strides, &ptrs),
        _ => None,
    };
    let walk = if widened.is_some() {
        Walk::Wide
    } else {
        vector_width(&shape, &strides, &tensors, &ptrs).map_or(Walk::Strided, Walk::Vector)
    };
    let (shape, strides) = match (widened, walk) {
        (Some(wide), _) => wide,
        (None, Walk::Vector(width)) => in_groups(&shape, &strides, width),
        _ => (shape, strides),
    };
    let n = if walk == Walk::Wide {
        n / (WIDE / elem)
    } else {
        n
    };
    // Threads: one per group of a vector walk, else one per MAP_UNROLL elements.
    let threads = match walk {
        Walk::Vector(width) => n / width,
        _ => n.div_ceil(MAP_UNROLL),
    };
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
    let index = index_type(&tensors);
    let names: Vec<&str> = tensors.iter().map(|t| t.dtype.name()).collect();
    let key = format!("map{rank}:{}:{}:{index}", op.name(), names.join(","))
        + &match op {
            Op::Cast { to } => format!("->{to}"),
            _ => String::new(),
        }
        + &match walk {
            Walk::Strided => String::new(),
            Walk::Wide => ":wide".into(),
            Walk::Vector(width) => format!(":vec{width}"),
        };
    let dtypes: Vec<DType> = tensors.iter().map(|t| t.dtype).collect();
    let mut params = MapParams {
        elements: n as u64,
        ..MapParams::default()
    };
    params.ptrs[..ptrs.len()].copy_from_slice(&ptrs);
    for (k, scalar) in s.iter().take(4).enumerate() {
        params.scalars[k] = *scalar as f32;
    }
    for (d, &size) in shape.iter().enumerate() {
        params.shape[d] = size as u64;
    }
    for (t, st) in strides.iter().enumerate() {
        for (d, &stride) in st.iter().enumerate() {
            params.strides[t][d] = stride as u64;
        }
    }
    let source = || {
        map_source(op, &dtypes, inputs.len(), rank, index, walk).ok_or_else(|| unsupported(gpu, op))
    };
    gpu.run(&key, source, grid_for(threads, 256), &params)
}
