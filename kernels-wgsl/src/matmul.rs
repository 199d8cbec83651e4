//! Batched matmul with bias, activation and residual epilogues: one register-blocked tiled
//! kernel reading every operand in place through its strides. Each operand's tile loader walks
//! the operand's dimension with the smaller stride (k, or rows / columns), chosen here per
//! launch, so global reads coalesce for plain and transposed layouts alike; f32 operands in
//! whole 16-byte vectors are read as such. f16 and bf16 matmuls run on cooperative matrices
//! (tensor cores) where the device offers them for the dtype; matmuls of at most
//! [`MAX_FEW_ROWS`] rows run one of two few-rows kernels whose threads split K instead (`rows`
//! for a `b` contiguous in k, `columns` for one contiguous in its columns: a `[1, 36] x
//! [36, 1M]` convolution product took 24 s on lavapipe in 128 x 128 tiles). The tiled and
//! tensor-core kernels split a long K over workgroups into partial sums that a second kernel
//! adds in order, so results stay deterministic: the tiled kernel wherever that fills its last
//! wave of workgroups better ([`split_k_by_waves`]), the tensor-core kernels where few output
//! tiles meet a long K (weight gradients, [`split_k`]). A normalized product (`NormMatmul`,
//! decoding's projections after their layer norm) runs as one `rows_normed` kernel that
//! normalizes the row itself (`normed_rows.rs`), saving the norm's launch; shapes that kernel
//! does not take run as the norm, then the product.

use std::sync::Arc;

use tessera_core::ops::NormKind;
use tessera_core::{merge_dims, Buffer, DType, Error, Layout, Op, Result, TensorRef};

use crate::elementwise;
use crate::epilogue::Epilogue;
#[cfg(test)]
use crate::gpu::INDICES_IN_RANGE;
use crate::gpu::{Band, Gpu, Planner, Source, TensorMatmul, F16_IS_BF16};
use crate::normed_rows::{normed_rows_code, NormedRows};
use crate::params::{param_block, ParamBlock};
use crate::source::{
    groups_for, key, run, run_grid, run_native, unsupported, wide_along, wide_helpers,
};
use tessera_core::exec::split;
use tessera_core::exec::unfused::{norm_then_matmul, LaunchOp};

const SRC: &str = include_str!("../kernels/matmul.wgsl");

/// Batch dimensions the kernels index, after merging those every operand steps through alike.
pub const MAX_BATCH_DIMS: usize = 6;

param_block! {
    /// A matmul's parameters: `[batch..., m, n] += [batch..., m, k] x [batch..., k, n]`, each
    /// operand's element offset and strides (batch strides per merged batch dimension), the
    /// bias's and residual's where the epilogue has them, the split-K count and k per split,
    /// the epilogue's activation ([`Epilogue::activation`]), and a normalized product's norm
    /// parameters' offsets and eps.
    MatmulParams {
        m: u32,
        n: u32,
        k: u32,
        batch: u32,
        batch_rank: u32,
        a_offset: u32,
        a_row_stride: u32,
        a_k_stride: u32,
        b_offset: u32,
        b_k_stride: u32,
        b_col_stride: u32,
        bias_offset: u32,
        bias_stride: u32,
        res_offset: u32,
        res_row_stride: u32,
        res_col_stride: u32,
        out_offset: u32,
        splits: u32,
        k_per_split: u32,
        activation: u32,
        norm_offset: u32,
        shift_offset: u32,
        eps: f32,
        batch_shape: [u32; MAX_BATCH_DIMS],
        a_batch_strides: [u32; MAX_BATCH_DIMS],
        b_batch_strides: [u32; MAX_BATCH_DIMS],
        res_batch_strides: [u32; MAX_BATCH_DIMS],
    }
}

/// The index of the matmul parameter word named `field` (`m`, `a_row_stride`,
/// `batch_shape`: the first of an array's words), as [`TensorMatmul`] kernels read it.
pub fn matmul_param_word(field: &str) -> Option<usize> {
    MatmulParams::word_of(field)
}

/// How many words the matmul parameters take.
pub fn matmul_param_words() -> usize {
    MatmulParams::WORDS
}

/// Matmuls with at most this many rows run a few-rows kernel instead of the 128 x 128 tiles:
/// `rows` where `b` is contiguous in k (a `linear` weight: decoding's matrix-vector products),
/// `columns` where it is contiguous in its columns (a convolution's im2col columns).
const MAX_FEW_ROWS: usize = 8;

/// Threads per output column of the few-rows kernel: more for narrower matrices, so that a
/// matrix-vector product still spreads over enough workgroups to keep memory busy.
fn few_rows_lanes(n: usize) -> usize {
    match n {
        0..1024 => 128,
        1024..2048 => 64,
        _ => 32,
    }
}

/// Threads per output column of the `columns` kernel: enough columns per workgroup for
/// coalesced reads of wide matrices, more threads splitting K for narrow ones, and never more
/// threads than k.
fn columns_lanes(n: usize, k: usize) -> usize {
    let by_width = match n {
        0..2048 => 64,
        2048..16384 => 16,
        _ => 4,
    };
    by_width.min(k.next_power_of_two())
}

/// The per-row code of the `columns` kernel for `m` rows and `lanes` threads per column.
fn columns_code(m: usize, lanes: usize) -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..m)
            .map(|r| t.replace('#', &r.to_string()))
            .collect::<String>()
    };
    vec![
        ("KLANES_U", format!("{lanes}u")),
        ("PARTS", (m.max(1) * 256).to_string()),
        ("ZERO", each("var acc# = 0.0;\n")),
        (
            "MAC1",
            "let w = ld2(bn + kk * sbk);\n".to_string()
                + &each("acc# += ld1(a_base + #u * sam + kk * sak) * w;\n"),
        ),
        ("SAVE", each("part[#u * 256u + lid] = acc#;\n")),
    ]
}

/// The per-row code of the few-rows kernel for `m` rows and `lanes` threads per column.
fn few_rows_code(m: usize, lanes: usize) -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..m)
            .map(|r| t.replace('#', &r.to_string()))
            .collect::<String>()
    };
    let a = |k: &str| format!("ld1(a_base + #u * sam + ({k}) * sak)");
    let mac4 = "let w0 = ld2(bn + kk * sbk);\nlet w1 = ld2(bn + (kk + LANES) * sbk);\n\
                let w2 = ld2(bn + (kk + 2u * LANES) * sbk);\nlet w3 = ld2(bn + (kk + 3u * LANES) * sbk);\n"
        .to_string()
        + &each(&format!(
            "acc# += {} * w0 + {} * w1 + {} * w2 + {} * w3;\n",
            a("kk"),
            a("kk + LANES"),
            a("kk + 2u * LANES"),
            a("kk + 3u * LANES")
        ));
    vec![
        ("LANES_U", format!("{lanes}u")),
        ("PARTS", (m.max(1) * 256).to_string()),
        ("ZERO", each("var acc# = 0.0;\n")),
        ("MAC4", mac4),
        (
            "MAC1",
            "let w0 = ld2(bn + kk * sbk);\n".to_string()
                + &each(&format!("acc# += {} * w0;\n", a("kk"))),
        ),
        ("SAVE", each("part[#u * 256u + lid] = acc#;\n")),
    ]
}

/// Whether the `rows_wide` kernel can run a few-rows product: the device has subgroups, and
/// `a` and `b` share a dtype and read as 16-byte vectors along k.
fn wide_rows(gpu: &dyn Gpu, a: &TensorRef<'_>, b: &TensorRef<'_>) -> bool {
    let r = a.layout.rank();
    gpu.caps().subgroups
        && a.dtype == b.dtype
        && wide_along(gpu, a, r - 1).is_some()
        && wide_along(gpu, b, r - 2).is_some()
}

/// The most vectors of k each lane of the `rows_wide` kernel loads at once: every load of a
/// step is issued before any sum waits on one, so a product over a short k (decoding's 768)
/// waits on memory once, not once per vector. (Unrolling a longer k, 3,072, into one step of
/// 12 made decoding's down projections slower on the H100: 9.8 against about 9.2 us.)
const WIDE_ROWS_UNROLL: usize = 4;

/// The most subgroups of a `rows_wide` workgroup that split one column's k between them.
const WIDE_ROWS_PARTS: usize = 4;

/// The most subgroups a `rows_wide` workgroup may have (of 256 threads, subgroups of 4 or
/// more lanes): the rows of its workgroup memory for split sums.
const WIDE_ROWS_MAX_SUBGROUPS: usize = 64;

/// How a `rows_wide` kernel walks k: `parts` subgroups to a column, each taking its share of k
/// in steps of `unroll` vectors a lane.
#[derive(Clone, Copy, Debug, PartialEq)]
struct WideRows {
    parts: usize,
    unroll: usize,
}

impl WideRows {
    /// The walk for a k of `vectors` 16-byte vectors, chosen for subgroups of 32: a k that
    /// takes one step of at most [`WIDE_ROWS_UNROLL`] vectors a lane runs on one subgroup a
    /// column, its step no longer than k needs (loads past k are clamped and count for
    /// nothing, but they cost as much as any: decoding's 768-long products took one step of
    /// 4 for 3 vectors a lane, and decoded 1,760 tokens/s on the H100 against 1,858 with steps
    /// of 3). A longer k is split between up to [`WIDE_ROWS_PARTS`] subgroups, whose sums
    /// meet in workgroup memory: each waits on memory once where one subgroup would wait
    /// once a step.
    fn for_k(vectors: usize) -> WideRows {
        let steps = vectors.div_ceil(32 * WIDE_ROWS_UNROLL).max(1);
        let parts = steps.next_power_of_two().min(WIDE_ROWS_PARTS);
        let unroll = vectors.div_ceil(32 * parts).clamp(1, WIDE_ROWS_UNROLL);
        WideRows { parts, unroll }
    }

    /// Threads a workgroup: two columns of subgroups of 32.
    fn threads(self) -> usize {
        64 * self.parts
    }
}

/// The per-row code of the `rows_wide` kernel for `m` rows of `dtype` finished by `epilogue`,
/// walking k as `walk` says. A step's loads past k read the last vector again (clamped, so
/// every load is in bounds and none waits on a branch) and count for nothing. The epilogue's
/// operands are read before the products, so their loads wait alongside the first step's.
fn wide_rows_code(
    m: usize,
    walk: WideRows,
    dtype: DType,
    epilogue: &Epilogue,
) -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..m)
            .map(|r| t.replace('#', &r.to_string()))
            .collect::<String>()
    };
    let steps = |f: &dyn Fn(usize) -> String| (0..walk.unroll).map(f).collect::<Vec<_>>();
    let loads = steps(&|j| {
        format!("let i{j} = kk + {j}u * width;\nlet w{j} = ldv2(bn + min(i{j}, kend - 1u));\n")
    })
    .concat();
    let a_at = |j: usize| format!("ldv1(a_base + #u * sam + min(i{j}, kend - 1u))");
    let terms = steps(&|j| format!("select(0.0, dotv({}, w{j}), i{j} < kend)", a_at(j)));
    let zero = each("var acc# = 0.0;\n");
    let macs = each(&format!("acc# += {};\n", terms.join(" + ")));
    let sums = each("let s# = subgroupAdd(acc#);\n");
    let (early, early_row, late) = epilogue.early_late();
    let store = &epilogue.store;
    let put =
        |sum: &str| format!("{{\nvar v = {sum};\n{late}{store}(o_base + #u * n + gn, v);\n}}\n");
    // One subgroup's sums are the column's; split subgroups' meet in workgroup memory, where
    // the column's first subgroup adds them in order (so results are deterministic).
    let (partial_decl, finish) = if walk.parts == 1 {
        (
            String::new(),
            format!("if (lane == 0u && live) {{\n{}}}\n", each(&put("s#"))),
        )
    } else {
        let words = m * WIDE_ROWS_MAX_SUBGROUPS;
        // The parts a column has where the kernel runs (fewer than PARTS_U where a workgroup
        // has fewer subgroups), added in order.
        let row = format!("#u * {WIDE_ROWS_MAX_SUBGROUPS}u + sg");
        let sum = format!(
            "var t# = partial[{row}];\nfor (var p = 1u; p < parts; p++) {{ t# += partial[{row} + p]; }}\n"
        );
        (
            format!("var<workgroup> partial: array<f32, {words}>;\n"),
            format!(
                "if (lane == 0u) {{\n{}}}\nworkgroupBarrier();\n\
                 if (lane == 0u && part == 0u && live) {{\n{}}}\nworkgroupBarrier();\n",
                each(&format!(
                    "partial[#u * {WIDE_ROWS_MAX_SUBGROUPS}u + sg] = s#;\n"
                )),
                each(&(sum + &put("t#"))),
            ),
        )
    };
    vec![
        ("VECTOR_MATH", wide_helpers(dtype)),
        ("UNROLL_U", format!("{}u", walk.unroll)),
        ("PARTS_U", format!("{}u", walk.parts)),
        ("THREADS", walk.threads().to_string()),
        ("EARLY", early + &each(&early_row)),
        ("ZERO", zero),
        ("MACS", loads + &macs),
        ("PARTIAL_DECL", partial_decl),
        ("FINISH", sums + &finish),
    ]
}

/// The tensor-core kernel's staging code where both operands (of `dtype`, f16 or bf16) read as
/// 16-byte vectors of eight halves along their contiguous dimension (`a_at`, `b_at`: `coop_k` or `coop_mn`):
/// each thread's two vectors of each operand per step, and the functions that fetch them
/// (zeros past the matrix: the contiguous extent is a whole number of vectors) and spread
/// their halves over the staged tiles.
fn coop_wide_staging_code(a_at: &str, b_at: &str, dtype: DType) -> Vec<(&'static str, String)> {
    // Along k (`coop_k`), a row of the tile is `COOP_STEP / 8` vectors: vector `v`'s row and k.
    let row = format!("(v / {}u)", COOP_STEP / 8);
    let k_of = format!("(v % {}u) * 8u", COOP_STEP / 8);
    // Half `e` of a vector as f32, then as a tile element (f16, or bf16 under F16_IS_BF16:
    // the conversion then rounds to bf16, exact for values that were bf16).
    let value = |word: &str, e: usize| match (dtype, e % 2) {
        (DType::BF16, 0) => format!("bitcast<f32>(x.{word} << 16u)"),
        (DType::BF16, _) => format!("bitcast<f32>(x.{word} & 0xffff0000u)"),
        (_, half) => format!("unpack2x16float(x.{word}).{}", ["x", "y"][half]),
    };
    let halves = |store: &dyn Fn(usize) -> String| {
        (0..8)
            .map(|e| {
                let word = ["x", "y", "z", "w"][e / 2];
                format!("{} = f16({});\n", store(e), value(word, e))
            })
            .collect::<String>()
    };
    // (row or column, k) of vector `v`'s first element, its clamped element index, and
    // whether it lies inside the matrix.
    let fetch = |name: &str,
                 binding: usize,
                 at: &str,
                 rows: &str,
                 row0: &str,
                 stride: &str,
                 k_stride: &str| {
        let (r, kk, clamp_r, clamp_k) = match at {
            "coop_k" => (row.as_str(), k_of.as_str(), "1u", "8u"),
            _ => ("(v % 16u) * 8u", "v / 16u", "8u", "1u"),
        };
        format!(
            "fn {name}(v: u32, {rows}: u32, k: u32, {row0}: u32, k0: u32, base: u32) -> vec4<u32> {{\n\
             \x20   let g = {row0} + {r};\n\
             \x20   let gk = k0 + {kk};\n\
             \x20   let e = base + min(g, {rows} - {clamp_r}) * params.{stride} + min(gk, k - {clamp_k}) * params.{k_stride};\n\
             \x20   return select(vec4<u32>(0u), ldv{binding}(e / 8u), g < {rows} && gk < k);\n}}\n"
        )
    };
    let stash_a = match a_at {
        "coop_k" => halves(&|e| format!("ca[{row} * LDA + {k_of} + {e}u]")),
        _ => halves(&|e| format!("ca[((v % 16u) * 8u + {e}u) * LDA + v / 16u]")),
    };
    let stash_b = match b_at {
        "coop_k" => halves(&|e| format!("cb[({k_of} + {e}u) * LDB + {row}]")),
        _ => halves(&|e| format!("cb[(v / 16u) * LDB + (v % 16u) * 8u + {e}u]")),
    };
    let each = |t: &str| {
        (0..COOP_STEP / 16)
            .map(|j| t.replace('#', &j.to_string()))
            .collect::<String>()
    };
    let staging = fetch("vec_a", 1, a_at, "m", "m0", "a_row_stride", "a_k_stride")
        + &fetch("vec_b", 2, b_at, "n", "n0", "b_col_stride", "b_k_stride")
        + &format!("fn stage_a(v: u32, x: vec4<u32>) {{\n{stash_a}}}\n")
        + &format!("fn stage_b(v: u32, x: vec4<u32>) {{\n{stash_b}}}\n");
    vec![
        ("STAGING", staging),
        (
            "DECLARE",
            each("var va#: vec4<u32>;\nvar vb#: vec4<u32>;\n"),
        ),
        (
            "FETCH",
            each(
                "va# = vec_a(lid + 256u * #u, m, k, m0, k0, a_base);\n\
                 vb# = vec_b(lid + 256u * #u, n, k, n0, k0, b_base);\n",
            ),
        ),
        (
            "STASH",
            each("stage_a(lid + 256u * #u, va#);\nstage_b(lid + 256u * #u, vb#);\n"),
        ),
    ]
}

/// The tiled kernel's loads of one step, into registers (`FETCH`) and from there into
/// workgroup buffer 0 or 1 (`STASH0`, `STASH1`): four elements of each operand per thread
/// through the strided feeds (`FEED`), or, for each f32 operand in whole 16-byte vectors
/// along its contiguous dimension (`wide`: a, b), one vector, through the generated `STAGING`
/// functions. The vectors took 4096^3 on the H100 from 30 to 37 TFLOP/s; staged for one
/// operand alone, they serve the LM head's gradients, whose rows of 50,257 logits are not.
fn tiled_staging_code(a_at: &str, b_at: &str, wide: [bool; 2]) -> Vec<(&'static str, String)> {
    // Vector `lid`'s (row or column, k) in a 128 x 8 tile: two vectors of four k per row
    // (`along_k`), or 32 vectors of four rows per k (`along_mn`); the clamps that keep its
    // address inside the matrix; and its store into buffer `buf`: four k-rows, or one
    // vec4 of one k-row.
    let operand = |name: &str, tile: &str, binding: usize, at: &str, p: [&str; 4]| {
        let [rows, row0, stride, k_stride] = p;
        let (r, kk, clamp_r, clamp_k, store) = match at {
            "along_k" => (
                "lid / 2u",
                "(lid % 2u) * 4u",
                "1u",
                "4u",
                (0..4)
                    .map(|i| {
                        format!("{tile}[buf][(lid % 2u) * 4u + {i}u][lid / 8u][(lid / 2u) % 4u] = x[{i}];\n")
                    })
                    .collect::<String>(),
            ),
            _ => (
                "(lid % 32u) * 4u",
                "lid / 32u",
                "4u",
                "1u",
                format!("{tile}[buf][lid / 32u][lid % 32u] = x;\n"),
            ),
        };
        format!(
            "fn wide_{name}(lid: u32, {rows}: u32, k: u32, {row0}: u32, k0: u32, base: u32) -> vec4<f32> {{\n\
             \x20   let g = {row0} + {r};\n\
             \x20   let gk = k0 + {kk};\n\
             \x20   let e = base + min(g, {rows} - {clamp_r}) * params.{stride} + min(gk, k - {clamp_k}) * params.{k_stride};\n\
             \x20   return select(vec4<f32>(0.0), bitcast<vec4<f32>>(ldv{binding}(e / 4u)), g < {rows} && gk < k);\n}}\n\
             fn wide_stash_{name}(buf: u32, lid: u32, x: vec4<f32>) {{\n{store}}}\n"
        )
    };
    let at = |f: &str| {
        let loads: Vec<String> = (0..4).map(|j| format!("{f}(lid, {j}u)")).collect();
        format!("array<vec2<u32>, 4>({})", loads.join(", "))
    };
    let (mut staging, mut feed, mut fetch) = (String::new(), String::new(), String::new());
    let mut stash = [String::new(), String::new()];
    let operands = [
        (
            "a",
            "sa",
            1,
            a_at,
            ["m", "m0", "a_row_stride", "a_k_stride"],
            "sam",
            "sak",
        ),
        (
            "b",
            "sb",
            2,
            b_at,
            ["n", "n0", "b_col_stride", "b_k_stride"],
            "sbn",
            "sbk",
        ),
    ];
    for ((x, tile, binding, x_at, p, stride, k_stride), wide) in operands.into_iter().zip(wide) {
        let [rows, row0, ..] = p;
        if wide {
            staging += &operand(x, tile, binding, x_at, p);
            fetch += &format!("let x{x} = wide_{x}(lid, {rows}, k, {row0}, k0, {x}_base);\n");
            for (buf, code) in stash.iter_mut().enumerate() {
                *code += &format!("wide_stash_{x}({buf}u, lid, x{x});\n");
            }
        } else {
            feed += &format!(
                "let f{x} = feed({}, {row0}, {rows}, {x}_base, {stride});\n",
                at(x_at)
            );
            fetch += &format!("let x{x} = fetch_{x}(f{x}, k0, k, {k_stride});\n");
            for (buf, code) in stash.iter_mut().enumerate() {
                *code += &format!("stash_{x}(f{x}, {buf}u, x{x});\n");
            }
        }
    }
    let [stash0, stash1] = stash;
    vec![
        ("STAGING", staging),
        ("FEED", feed),
        ("FETCH", fetch),
        ("STASH0", stash0),
        ("STASH1", stash1),
    ]
}

/// Whether `a` and `b`, laid out `a_at` and `b_at` (`along_k` or `along_mn`), each read as
/// 16-byte vectors along their contiguous dimension.
fn operands_wide(
    gpu: &dyn Gpu,
    a: &TensorRef<'_>,
    b: &TensorRef<'_>,
    a_at: &str,
    b_at: &str,
) -> [bool; 2] {
    let r = a.layout.rank();
    let (a_dim, b_dim) = (
        if a_at == "along_k" { r - 1 } else { r - 2 },
        if b_at == "along_k" { r - 2 } else { r - 1 },
    );
    [
        wide_along(gpu, a, a_dim).is_some(),
        wide_along(gpu, b, b_dim).is_some(),
    ]
}

/// The tensor-core kernel's k per step: 64 hides the next step's loads behind twice the
/// products of 32 (f16 and bf16 4096^3 on the H100: 93 and 91 TFLOP/s against 75 and 73);
/// its staged tiles then take 44 of the 48 KiB of workgroup memory Vulkan devices offer.
const COOP_STEP: usize = 64;

/// The tensor-core kernel's k per step, and its marker on bf16 operands ([`F16_IS_BF16`]).
fn coop_constants(dtype: DType) -> [(&'static str, String); 2] {
    let marker = if dtype == DType::BF16 {
        F16_IS_BF16
    } else {
        ""
    };
    [
        ("ENCODING", marker.to_string()),
        ("COOP_STEP", format!("{COOP_STEP}u")),
    ]
}

/// The tensor-core kernel's staging code: each thread's sixteen elements of each operand per
/// step, held in named variables between the fetch and the store to workgroup memory.
fn coop_staging_code() -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..COOP_STEP / 2)
            .map(|j| t.replace('#', &j.to_string()))
            .collect::<String>()
    };
    vec![
        ("STAGING", String::new()),
        ("DECLARE", each("var xa#: f16;\nvar xb#: f16;\n")),
        (
            "FETCH",
            each(
                "xa# = elem_a(lid + 256u * #u, m, k, m0, k0, a_base);\n\
                 xb# = elem_b(lid + 256u * #u, n, k, n0, k0, b_base);\n",
            ),
        ),
        (
            "STASH",
            each("put_a(lid + 256u * #u, xa#);\nput_b(lid + 256u * #u, xb#);\n"),
        ),
    ]
}

/// A matmul without epilogue: what partial products over parts of K compute.
pub(crate) const PLAIN: Op = Op::Matmul {
    bias: false,
    activation: None,
    residual: false,
};

/// The pipeline key of a matmul kernel: which activation an op applies is a parameter, so the
/// key names only whether it applies one.
fn kernel_key(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    variant: &str,
) -> String {
    let mut kernel_op = op.clone();
    let activated = match &mut kernel_op {
        Op::Matmul { activation, .. } | Op::NormMatmul { activation, .. } => {
            activation.take().is_some()
        }
        _ => false,
    };
    let activated = if activated { "/activated" } else { "" };
    key(
        &kernel_op,
        inputs,
        outputs,
        &format!("{variant}{activated}"),
    )
}

/// The most output columns a normalized product runs as one kernel with. Each of that
/// kernel's subgroups takes the row's statistics again: GPT-2's 2,304- and 3,072-column
/// projections gain over the norm's own launch and the plain product, but an LM head's 50,257
/// columns took 37.5 us against 31.3 + 7.1 (H100, f16, decoding, `rows_normed` with four
/// columns a subgroup), and decoding did not move (2,039-2,047 tokens/s either way).
const MAX_NORMED_COLUMNS: usize = 8192;

/// Whether a normalized product runs as one `rows_wide` kernel: few rows, at most
/// [`MAX_NORMED_COLUMNS`] columns, `b` a linear's weight (contiguous in k), `x`, `b` and the
/// norm's parameters read as 16-byte vectors, and every operand in one binding (decoding's
/// projections); otherwise it runs as its norm, then its product ([`norm_then_matmul`]).
fn normed_in_one(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> bool {
    let Op::NormMatmul { norm, .. } = op else {
        return false;
    };
    let (x, b) = (&inputs[0], &inputs[1]);
    let params_wide = inputs[2..2 + norm.params()]
        .iter()
        .all(|p| wide_along(gpu, p, 0).is_some());
    x.layout.shape[0] <= MAX_FEW_ROWS
        && x.layout.shape[1] > 0
        && b.layout.shape[1] <= MAX_NORMED_COLUMNS
        && b.layout.strides[0] <= b.layout.strides[1]
        && wide_rows(gpu, x, b)
        && params_wide
        && gpu.fits(inputs)
        && gpu.fits(outputs)
}

/// A normalized product (`NormMatmul`): one kernel where [`normed_in_one`] allows, else its
/// norm, then its product, each launched by `whole` (which splits it over windows).
pub(crate) fn launch_normed(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
    whole: &LaunchOp<'_>,
) -> Result<()> {
    if normed_in_one(gpu, op, inputs, outputs) {
        return launch_product(gpu, op, inputs, outputs, scalars[0] as f32, None);
    }
    let scratch = |bytes| gpu.scratch(bytes);
    norm_then_matmul(op, inputs, outputs, scalars, &scratch, whole)
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    launch_product(gpu, op, inputs, outputs, 0.0, None)
}

/// A product of causal attention's backward, whose tiles the tensor-core kernel narrows to
/// `band` ([`Band`]); other kernels run it whole.
pub(crate) fn launch_banded(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    band: Band,
) -> Result<()> {
    launch_product(gpu, op, inputs, outputs, 0.0, Some(band))
}

/// A matmul, or a normalized product that [`normed_in_one`] allows, whose norm adds `eps`;
/// on the tensor-core kernel, narrowed to `band` where given.
fn launch_product(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    eps: f32,
    band: Option<Band>,
) -> Result<()> {
    check_batch_dims(gpu, op, inputs)?;
    let (a, b) = (&inputs[0], &inputs[1]);
    let r = a.layout.rank();
    let (m, k, n) = (
        a.layout.shape[r - 2],
        a.layout.shape[r - 1],
        b.layout.shape[r - 1],
    );
    let batch: usize = a.layout.shape[..r - 2].iter().product();
    let epilogue = Epilogue::of(op).ok_or_else(|| unsupported(gpu, op))?;
    let (bias_at, res_at, activation) = (epilogue.bias_at, epilogue.res_at, epilogue.activation);
    let norm = match *op {
        Op::NormMatmul { norm, .. } => Some(norm),
        _ => None,
    };

    let a_dtype = a.dtype;
    let (sa, sb) = (&a.layout.strides, &b.layout.strides);
    let along = |k_fast: bool| if k_fast { "along_k" } else { "along_mn" };
    let (a_at, b_at) = (along(sa[r - 1] <= sa[r - 2]), along(sb[r - 2] <= sb[r - 1]));
    let mut subst = vec![
        ("EPILOGUE", epilogue.code.clone()),
        ("STORE", epilogue.store.clone()),
        ("A_AT", a_at.to_string()),
        ("B_AT", b_at.to_string()),
    ];
    let few_rows = m <= MAX_FEW_ROWS;
    let tensor_cores = a.dtype == b.dtype
        && match a.dtype {
            DType::F16 => gpu.coop_f16(),
            DType::BF16 => gpu.coop_bf16(),
            _ => false,
        };
    let tile_grid = [
        gpu.dim(n.div_ceil(128)),
        gpu.dim(m.div_ceil(128)),
        gpu.dim(batch),
    ];
    let mut problem = Problem {
        inputs,
        m,
        n,
        k,
        batch,
        bias_at,
        res_at,
        activation,
        splits: 1,
        k_per_split: k,
        norm: norm.map(|kind| (kind, eps)),
        band,
    };
    let lanes = if b_at == "along_k" {
        few_rows_lanes(n)
    } else {
        columns_lanes(n, k)
    };
    // The kernel over output tiles, if it runs (its code is generated only when the kernel
    // is compiled, as every variant's).
    let mut tiles = None;
    let vectors = k / (16 / a_dtype.size());
    let walk = WideRows::for_k(vectors);
    let normed_walk = NormedRows::new(m, n, vectors);
    let wide = few_rows && b_at == "along_k" && wide_rows(gpu, a, b);
    let (section, variant, grid) = if let (Some(kind), true) = (norm, wide) {
        let grid = [
            gpu.dim(n.div_ceil(2 * normed_walk.columns)),
            1,
            gpu.dim(batch),
        ];
        let variant = format!(
            "rows_normed{m}/{}x{}/{kind:?}",
            normed_walk.columns, normed_walk.unroll
        );
        ("rows_normed", variant, grid)
    } else if wide {
        // Two columns to a workgroup where subgroups have 32 lanes; the kernel loops where they
        // are narrower.
        let grid = [gpu.dim(n.div_ceil(2)), 1, gpu.dim(batch)];
        let variant = format!("rows_wide{m}/{}x{}", walk.parts, walk.unroll);
        ("rows_wide", variant, grid)
    } else if norm.is_some() {
        // `launch_normed` sends only what `rows_wide` runs here.
        return Err(unsupported(gpu, op));
    } else if few_rows {
        let grid = [gpu.dim(n.div_ceil(256 / lanes)), 1, gpu.dim(batch)];
        let section = if b_at == "along_k" { "rows" } else { "columns" };
        (section, format!("{section}{m}x{lanes}"), grid)
    } else {
        if tensor_cores {
            subst[2].1 = a_at.replace("along", "coop");
            subst[3].1 = b_at.replace("along", "coop");
        }
        let f32_operands = a.dtype == DType::F32 && b.dtype == DType::F32;
        let kernel = Tiles {
            grid: tile_grid,
            coop: tensor_cores,
            wide: match operands_wide(gpu, a, b, a_at, b_at) {
                wide if f32_operands => wide,
                [true, true] if tensor_cores => [true, true],
                _ => [false, false],
            },
            dtype: a_dtype,
        };
        let tile_count = m.div_ceil(128) * n.div_ceil(128) * batch;
        let (splits, k_per_split) = if tensor_cores {
            split_k(tile_count, k)
        } else {
            split_k_by_waves(tile_count, k)
        };
        let partial_bytes = 4 * batch * splits * m * n;
        if tensor_cores && gpu.caps().tensor_matmul {
            let split = Problem {
                splits,
                k_per_split,
                ..problem
            };
            let layout = (a_at == "along_k", b_at == "along_k");
            if let Some(done) = launch_tensor(gpu, op, outputs, &subst, &split, layout) {
                return done;
            }
        }
        if splits > 1 && partial_bytes as u64 <= gpu.max_binding() {
            problem.splits = splits;
            problem.k_per_split = k_per_split;
            return launch_split(gpu, op, outputs, subst, &problem, kernel, partial_bytes);
        }
        tiles = Some(kernel);
        let variant = format!("{}/{a_at}/{b_at}", kernel.name());
        (kernel.section(), variant, tile_grid)
    };
    let grid = if m * n * batch == 0 { [0, 0, 0] } else { grid };
    run_grid(
        gpu,
        &kernel_key(op, inputs, outputs, &variant),
        SRC,
        section,
        move || {
            match section {
                "rows" => subst.extend(few_rows_code(m, lanes)),
                "rows_wide" => subst.extend(wide_rows_code(m, walk, a_dtype, &epilogue)),
                "rows_normed" => {
                    if let Some(kind) = norm {
                        subst.extend(normed_rows_code(m, normed_walk, a_dtype, &epilogue, kind));
                    }
                }
                "columns" => subst.extend(columns_code(m, lanes)),
                _ => {}
            }
            if let Some(kernel) = tiles {
                kernel.code(&mut subst);
            }
            Ok(subst)
        },
        inputs,
        outputs,
        grid,
        |o| problem.params(o),
    )
}

/// A kernel over 128x128 output tiles: the tensor-core kernel (`coop`) or the tiled one, each
/// staging 16-byte vectors where both operands allow (`wide`), over its grid of tiles.
#[derive(Clone, Copy)]
struct Tiles {
    grid: [u32; 3],
    coop: bool,
    /// Whether a and b are staged as 16-byte vectors (both or neither on tensor cores).
    wide: [bool; 2],
    /// The operands' dtype (the tensor-core kernel's tiles hold it).
    dtype: DType,
}

impl Tiles {
    fn section(self) -> &'static str {
        if self.coop {
            "coop"
        } else {
            "matmul"
        }
    }

    fn name(self) -> &'static str {
        match (self.coop, self.wide) {
            (true, [true, true]) => "coop_wide",
            (true, _) => "coop",
            (false, [true, true]) => "tiled_wide",
            (false, [true, false]) => "tiled_wide_a",
            (false, [false, true]) => "tiled_wide_b",
            (false, [false, false]) => "tiled128",
        }
    }

    /// Adds the kernel's generated code to `subst`, whose third and fourth entries say how
    /// the operands are laid out (`A_AT`, `B_AT`).
    fn code(self, subst: &mut Vec<(&'static str, String)>) {
        let (a_at, b_at) = (subst[2].1.clone(), subst[3].1.clone());
        match (self.coop, self.wide) {
            (true, [true, true]) => subst.extend(coop_wide_staging_code(&a_at, &b_at, self.dtype)),
            (true, _) => subst.extend(coop_staging_code()),
            (false, wide) => subst.extend(tiled_staging_code(&a_at, &b_at, wide)),
        }
        if self.coop {
            subst.extend(coop_constants(self.dtype));
        }
    }
}

/// Output tiles fewer than this leave SMs idle on large GPUs: the tensor-core kernels then
/// split K.
const SPLIT_K_TILES: usize = 264;
/// The least k a split takes.
const MIN_K_PER_SPLIT: usize = 512;

/// How the tensor-core kernels split K for `tiles` output tiles of 128 x 128: (splits, k per
/// split, a multiple of the kernels' k steps: of [`TensorMatmul::tile`]'s, so that its tiles
/// cover each part exactly where they cover k).
fn split_k(tiles: usize, k: usize) -> (usize, usize) {
    if tiles >= SPLIT_K_TILES || k < 2 * MIN_K_PER_SPLIT {
        return (1, k);
    }
    let splits = SPLIT_K_TILES.div_ceil(tiles).min(k / MIN_K_PER_SPLIT);
    let step = TensorMatmul::TILE[2].max(TensorMatmul::NARROW_TILE[2]) as usize;
    let k_per_split = k.div_ceil(splits).next_multiple_of(step);
    (k.div_ceil(k_per_split), k_per_split)
}

/// Workgroups of the tiled kernel that run at once on the GPUs it was tuned on (an H100 or
/// H200: 132 multiprocessors, one workgroup each as measured: 8192 x 768 outputs, 384 tiles in
/// 2.9 waves, gained nothing from two parts, as they would have with two workgroups resident).
const TILED_WAVE: usize = 132;
/// The most parts the tiled kernel splits K into.
const MAX_SPLITS: usize = 16;

/// How the tiled kernel (without tensor cores) splits K for `tiles` output tiles: into the
/// count whose workgroups fill their last wave best, up to one part per [`MIN_K_PER_SPLIT`]
/// of k. A weight gradient of 768 x 2304 (108 tiles, k = 8192) took three parts under
/// [`split_k`], 324 workgroups in 2.45 waves; six fill 4.9 (GPT-2's f32 weight gradients went
/// from 43.9 to 33.3 ms a step on an H200). Each part costs its f32 sums' traffic and a
/// little more: a count's filled share is weighed down by 1% per part past the first.
fn split_k_by_waves(tiles: usize, k: usize) -> (usize, usize) {
    let most = (k / MIN_K_PER_SPLIT).clamp(1, MAX_SPLITS);
    let filled = |s: usize| {
        let groups = tiles * s;
        groups as f64 / (groups.div_ceil(TILED_WAVE) * TILED_WAVE) as f64
    };
    let score = |s: usize| filled(s) * (1.0 - 0.01 * (s - 1) as f64);
    let best = (1..=most).fold(1, |best, s| if score(s) > score(best) { s } else { best });
    if best == 1 {
        return (1, k);
    }
    let k_per_split = k.div_ceil(best).next_multiple_of(8);
    (k.div_ceil(k_per_split), k_per_split)
}

/// The tiled or tensor-core kernel (`tiles`) over K in `problem.splits` parts into f32
/// partial sums, then `sum_splits` adding them in order and applying the epilogue.
fn launch_split(
    gpu: &dyn Gpu,
    op: &Op,
    outputs: &[TensorRef<'_>],
    subst: Vec<(&'static str, String)>,
    problem: &Problem<'_>,
    tiles: Tiles,
    partial_bytes: usize,
) -> Result<()> {
    let inputs = problem.inputs;
    let (partials, layout) = partial_sums(gpu, partial_bytes)?;
    let sums = TensorRef {
        buffer: &partials,
        layout: &layout,
        dtype: DType::F32,
    };
    let raw = [("EPILOGUE", String::new()), ("STORE", "st3".to_string())];
    let mut split_subst = subst.clone();
    split_subst[..2].clone_from_slice(&raw);
    let variant = format!("{}/{}/{}/split", tiles.name(), subst[2].1, subst[3].1);
    let tile_grid = tiles.grid;
    let parts = Problem {
        inputs: &inputs[..2],
        bias_at: None,
        res_at: None,
        ..*problem
    };
    run_grid(
        gpu,
        &key(&PLAIN, &inputs[..2], &[sums], &variant),
        SRC,
        tiles.section(),
        move || {
            tiles.code(&mut split_subst);
            Ok(split_subst)
        },
        &inputs[..2],
        &[sums],
        [
            tile_grid[0],
            tile_grid[1],
            gpu.dim(problem.batch * problem.splits),
        ],
        |o| parts.params(o),
    )?;
    sum_splits(gpu, op, &subst[..2], problem, sums, outputs)
}

/// Multiply-adds from which a product whose rows or columns its tiles do not cover exactly
/// (but whose k they do) is compiled for its sizes too
/// ([`Dispatch::specialize`](crate::Dispatch::specialize)): each new size then waits for a
/// compile (0.1 to 1.3 s), worth it only for products this large, such as GPT-2's LM head in
/// training (batch 8 x 1,024 tokens: 3.2e11 multiply-adds). On the H200 in bf16 its logits
/// went from 5.8 to 4.8 ms and its weight gradient from 4.3 to 3.2; its input gradient, whose
/// k is the odd vocabulary, went from 5.4 to about 9 ms compiled so, and keeps reading its
/// sizes. A prompt's LM head reaches this only past about 5,200 tokens at GPT-2's sizes, and
/// then waits once per prompt length.
const SPECIALIZED_RAGGED_WORK: usize = 200_000_000_000;

/// The backend's own tensor-core kernel ([`TensorMatmul`]) where it serves `problem` (both
/// operands contiguous along their faster dimension, `(a, b)` along k or not in `k_fast`, and
/// a grid within the device's limits): straight into the output, epilogue included, for a
/// product in one part; split over K, into f32 sums that `sum_splits` adds and finishes with
/// the epilogue. `None` where it does not serve, for the WGSL kernels to run.
fn launch_tensor(
    gpu: &dyn Gpu,
    op: &Op,
    outputs: &[TensorRef<'_>],
    subst: &[(&'static str, String)],
    problem: &Problem<'_>,
    k_fast: (bool, bool),
) -> Option<Result<()>> {
    let inputs = problem.inputs;
    let (a, b) = (&inputs[0], &inputs[1]);
    let r = a.layout.rank();
    let unit = |t: &TensorRef<'_>, dim: usize| t.layout.strides[dim] == 1;
    let a_unit = unit(a, if k_fast.0 { r - 1 } else { r - 2 });
    let b_unit = unit(b, if k_fast.1 { r - 2 } else { r - 1 });
    let (m, n) = (problem.m, problem.n);
    let narrow = n <= TensorMatmul::NARROW_TILE[1] as usize;
    let plain = TensorMatmul {
        input: a.dtype,
        output: DType::F32,
        a_k_contiguous: k_fast.0,
        b_k_contiguous: k_fast.1,
        narrow,
        bias: None,
        activation: None,
        residual: None,
        band: problem.band,
    };
    let [tm, tn, _] = plain.tile().map(|t| t as usize);
    let grid = [
        n.div_ceil(tn),
        m.div_ceil(tm),
        problem.batch * problem.splits,
    ];
    let fits_grid = grid
        .iter()
        .all(|&g| u32::try_from(g).is_ok_and(|g| g == gpu.dim(g as usize)));
    // The kernel reads its parameters as immediates and its operands through 16-byte aligned
    // pointers, so bindings must start on 16 bytes.
    let immediate = gpu.build(matmul_param_words()).immediate_words.is_some();
    let aligned = gpu.align() % 16 == 0;
    if !a_unit || !b_unit || !fits_grid || !immediate || !aligned || m * n * problem.batch == 0 {
        return None;
    }
    let grid = grid.map(|g| g as u32);
    let shape = if narrow { "/narrow" } else { "" };
    let band = problem
        .band
        .map_or(String::new(), |b| format!("/{:?}{}", b.kind, b.offset));
    let variant = format!("tensor/{}/{}{shape}{band}", subst[2].1, subst[3].1);
    let operands = Problem {
        inputs: &inputs[..2],
        bias_at: None,
        res_at: None,
        ..*problem
    };
    let partial_bytes = 4 * problem.batch * problem.splits * m * n;
    // Split sums past one binding: the product runs in one part instead.
    let unsplit = Problem {
        splits: 1,
        k_per_split: problem.k,
        ..*problem
    };
    let problem = if partial_bytes as u64 > gpu.max_binding() {
        &unsplit
    } else {
        problem
    };
    let exact = plain.covers(m, n, problem.k, problem.k_per_split);
    let tk = plain.tile()[2] as usize;
    let k_whole = problem.k.is_multiple_of(tk) && problem.k_per_split.is_multiple_of(tk);
    let work = [m, n, problem.k]
        .iter()
        .fold(problem.batch, |w, &d| w.saturating_mul(d));
    let specialize = exact || (k_whole && work >= SPECIALIZED_RAGGED_WORK);
    if problem.splits == 1 {
        let grid = [grid[0], grid[1], gpu.dim(problem.batch)];
        let Op::Matmul { activation, .. } = *op else {
            return None;
        };
        let kernel = TensorMatmul {
            output: outputs[0].dtype,
            bias: problem.bias_at.map(|i| inputs[i - 1].dtype),
            activation,
            residual: problem.res_at.map(|i| inputs[i - 1].dtype),
            ..plain
        };
        let key = key(op, inputs, outputs, &variant);
        let kernel = Source::TensorMatmul(kernel);
        return Some(run_native(
            gpu,
            &key,
            kernel,
            inputs,
            outputs,
            grid,
            specialize,
            |o| problem.params(o),
        ));
    }
    Some((|| {
        let (partials, layout) = partial_sums(gpu, partial_bytes)?;
        let sums = TensorRef {
            buffer: &partials,
            layout: &layout,
            dtype: DType::F32,
        };
        let key = key(&PLAIN, &inputs[..2], &[sums], &variant);
        run_native(
            gpu,
            &key,
            Source::TensorMatmul(plain),
            &inputs[..2],
            &[sums],
            grid,
            specialize,
            |o| operands.params(o),
        )?;
        sum_splits(gpu, op, &subst[..2], problem, sums, outputs)
    })())
}

/// A scratch buffer for `bytes` of f32 partial sums, and their layout.
fn partial_sums(gpu: &dyn Gpu, bytes: usize) -> Result<(Arc<dyn Buffer>, Layout)> {
    Ok((gpu.scratch(bytes)?, Layout::contiguous(&[bytes / 4])))
}

/// The `sum_splits` kernel: adds each output's `problem.splits` partial sums from `sums`
/// (f32, laid out `[batch, splits, M, N]`) in order and finishes them with the epilogue in
/// `finish` (its `EPILOGUE` and `STORE`).
fn sum_splits(
    gpu: &dyn Gpu,
    op: &Op,
    finish: &[(&'static str, String)],
    problem: &Problem<'_>,
    sums: TensorRef<'_>,
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let inputs = problem.inputs;
    // `b` is bound but not read: one element of it, so that a `b` past one binding binds.
    let b = &inputs[1];
    let corner = Layout {
        shape: vec![1; b.layout.rank()],
        strides: b.layout.strides.clone(),
        offset: b.layout.offset,
    };
    let mut bound = inputs.to_vec();
    bound[0] = sums;
    bound[1] = b.with_layout(&corner);
    run(
        gpu,
        &kernel_key(op, &bound, outputs, "sum_splits"),
        SRC,
        "sum_splits",
        || Ok(finish.to_vec()),
        &bound,
        outputs,
        groups_for(problem.batch * problem.m * problem.n),
        |o| problem.params(o),
    )
}

/// A dimension of a matmul problem `[..., M, N] += [..., M, K] x [..., K, N]`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dim {
    Batch(usize),
    M,
    N,
    K,
}

/// The part an operand plays in a matmul launch.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    A,
    B,
    Bias,
    Residual,
    Out,
}

impl Role {
    /// The role of operand `i` of inputs followed by the output.
    fn of(i: usize, epilogue: &Epilogue, operands: usize) -> Role {
        match i {
            0 => Role::A,
            1 => Role::B,
            _ if i + 1 == operands => Role::Out,
            _ if epilogue.bias_at == Some(i + 1) => Role::Bias,
            _ => Role::Residual,
        }
    }

    /// The axis of an operand of this role (of rank `r`, the bias of rank 1) along `dim`.
    fn axis(self, dim: Dim, r: usize) -> Option<usize> {
        match (self, dim) {
            (Role::Bias, Dim::N) => Some(0),
            (Role::Bias, _) => None,
            (_, Dim::Batch(j)) => Some(j),
            (Role::A | Role::Residual | Role::Out, Dim::M) => Some(r - 2),
            (Role::B | Role::Residual | Role::Out, Dim::N) => Some(r - 1),
            (Role::A, Dim::K) => Some(r - 1),
            (Role::B, Dim::K) => Some(r - 2),
            _ => None,
        }
    }
}

/// A matmul with an operand larger than one binding. The operand with the widest binding is
/// narrowed along the dimension it reaches furthest in: batch, rows or columns are halved
/// and each half runs the same way; along K the problem splits into parts whose partial sums
/// (f32) `sum_splits` adds in order with the epilogue, as the split-K launch does. A part
/// whose output is no longer row-major (columns of a wider output) is computed into scratch
/// and copied into place.
pub(crate) fn launch_windows(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    check_batch_dims(gpu, op, inputs)?;
    let all: Vec<TensorRef<'_>> = inputs.iter().chain(outputs).cloned().collect();
    if gpu.fits(&all) {
        return launch_part(gpu, op, inputs, outputs);
    }
    let epilogue = Epilogue::of(op).ok_or_else(|| unsupported(gpu, op))?;
    let out = &outputs[0].layout;
    let r = out.rank();
    let widest = (0..all.len())
        .max_by_key(|&i| gpu.binding_bytes(&all[i]))
        .unwrap_or(0);
    let role = Role::of(widest, &epilogue, all.len());
    let layout = all[widest].layout;
    let reach = |dim: Dim| {
        role.axis(dim, r).map_or(0, |ax| {
            layout.strides[ax] * layout.shape[ax].saturating_sub(1)
        })
    };
    let dims = (0..r - 2).map(Dim::Batch).chain([Dim::M, Dim::N, Dim::K]);
    let Some(dim) = dims.filter(|&d| reach(d) > 0).max_by_key(|&d| reach(d)) else {
        return Err(split::too_large(&Planner(gpu), op, inputs, outputs));
    };
    let first_batch = out.shape[..r - 2].iter().position(|&b| b > 1);
    let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
    let dim = match (dim, first_batch) {
        // K parts are summed per output, so the batch is split first, and the rows or
        // columns while the parts' partial sums would not fit one binding (or K would not
        // shrink).
        (Dim::K, Some(j)) => Dim::Batch(j),
        (Dim::K, None) => {
            let kc = k_part(gpu, inputs);
            let k = inputs[0].layout.shape[r - 1];
            let partial_bytes = 4 * k.div_ceil(kc) as u64 * (m * n) as u64;
            let splits = kc < k && partial_bytes <= gpu.max_binding();
            match (splits, m > 1, n > 1) {
                (true, _, _) => {
                    return split_k_windows(gpu, op, &epilogue, inputs, outputs, kc);
                }
                (false, true, _) => Dim::M,
                (false, false, true) => Dim::N,
                _ => return Err(split::too_large(&Planner(gpu), op, inputs, outputs)),
            }
        }
        (other, _) => other,
    };
    let size = match dim {
        Dim::Batch(j) => out.shape[j],
        Dim::M => out.shape[r - 2],
        _ => out.shape[r - 1],
    };
    let half = size / 2;
    for (start, len) in [(0, half), (half, size - half)] {
        let layouts: Vec<Layout> = all
            .iter()
            .enumerate()
            .map(
                |(i, t)| match Role::of(i, &epilogue, all.len()).axis(dim, r) {
                    Some(ax) => t.layout.narrow(ax, start, len),
                    None => t.layout.clone(),
                },
            )
            .collect();
        let parts = TensorRef::with_layouts(&all, &layouts);
        let (i, o) = parts.split_at(inputs.len());
        launch_windows(gpu, op, i, o)?;
    }
    Ok(())
}

/// One part that fits: launched directly, or into scratch and copied where its output is
/// not row-major.
fn launch_part(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let out = &outputs[0];
    if out.layout.is_contiguous() {
        return launch(gpu, op, inputs, outputs);
    }
    let bytes = (out.layout.numel() * out.dtype.size()).div_ceil(4) * 4;
    let scratch = gpu.scratch(bytes)?;
    let layout = Layout::contiguous(&out.layout.shape);
    let dense = TensorRef {
        buffer: &scratch,
        layout: &layout,
        dtype: out.dtype,
    };
    launch(gpu, op, inputs, std::slice::from_ref(&dense))?;
    elementwise::launch(gpu, &Op::Copy, &[dense], outputs, &[])
}

/// The K of each part when a matmul of batch 1 splits along K: halved until both operands
/// fit, or until what is left to shrink lies along other dimensions (which the parts split
/// themselves).
fn k_part(gpu: &dyn Gpu, inputs: &[TensorRef<'_>]) -> usize {
    let (a, b) = (&inputs[0].layout, &inputs[1].layout);
    let r = a.rank();
    let k = a.shape[r - 1];
    let step_bytes = (a.strides[r - 1].max(b.strides[r - 2]) * inputs[0].dtype.size()) as u64;
    let mut kc = k;
    while kc > 1 && step_bytes * (kc as u64 - 1) > gpu.max_binding() / 4 {
        let parts = [a.narrow(r - 1, 0, kc), b.narrow(r - 2, 0, kc)];
        if gpu.fits(&TensorRef::with_layouts(&inputs[..2], &parts)) {
            break;
        }
        kc = kc.div_ceil(2);
    }
    kc
}

/// A matmul of batch 1 in parts of `kc` along K, their f32 partial sums added in order by
/// `sum_splits`, which applies the epilogue.
fn split_k_windows(
    gpu: &dyn Gpu,
    op: &Op,
    epilogue: &Epilogue,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    kc: usize,
) -> Result<()> {
    let (a, b, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let r = a.layout.rank();
    let (m, k, n) = (
        a.layout.shape[r - 2],
        a.layout.shape[r - 1],
        out.layout.shape[r - 1],
    );
    let parts = |first: usize| {
        let len = kc.min(k - first);
        (
            a.layout.narrow(r - 1, first, len),
            b.layout.narrow(r - 2, first, len),
        )
    };
    let splits = k.div_ceil(kc);
    let partials = gpu.scratch(4 * splits * m * n)?;
    for s in 0..splits {
        let (la, lb) = parts(s * kc);
        let narrowed = [la, lb];
        let mut slot = Layout::contiguous(&out.layout.shape);
        slot.offset = s * m * n;
        let sums = TensorRef {
            buffer: &partials,
            layout: &slot,
            dtype: DType::F32,
        };
        let ab = TensorRef::with_layouts(&inputs[..2], &narrowed);
        launch_windows(gpu, &PLAIN, &ab, std::slice::from_ref(&sums))?;
    }
    let all_sums = Layout::contiguous(&[splits * m * n]);
    let sums = TensorRef {
        buffer: &partials,
        layout: &all_sums,
        dtype: DType::F32,
    };
    let finish = [
        ("EPILOGUE", epilogue.code.clone()),
        ("STORE", epilogue.store.clone()),
    ];
    let problem = Problem {
        inputs,
        m,
        n,
        k,
        batch: 1,
        bias_at: epilogue.bias_at,
        res_at: epilogue.res_at,
        activation: epilogue.activation,
        splits,
        k_per_split: kc,
        norm: None,
        band: None,
    };
    sum_splits(gpu, op, &finish, &problem, sums, outputs)
}

/// One matmul launch's sizes and operands, which its parameters are made from.
#[derive(Clone, Copy)]
struct Problem<'a> {
    inputs: &'a [TensorRef<'a>],
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// Bindings (from 1) of the bias and the residual.
    bias_at: Option<usize>,
    res_at: Option<usize>,
    /// The epilogue's activation ([`Epilogue::activation`]).
    activation: usize,
    splits: usize,
    k_per_split: usize,
    /// A normalized product's norm and eps.
    norm: Option<(NormKind, f32)>,
    /// Where the tensor-core kernel may leave out work ([`Band`]).
    band: Option<Band>,
}

impl Problem<'_> {
    /// The parameters the kernels read (`kernels/matmul.wgsl`), given the bindings' offsets.
    fn params(&self, o: &[usize]) -> MatmulParams {
        let inputs = self.inputs;
        let (a, b) = (&inputs[0].layout, &inputs[1].layout);
        let r = a.rank();
        let u = |v: usize| v as u32;
        let mut params = MatmulParams {
            m: u(self.m),
            n: u(self.n),
            k: u(self.k),
            batch: u(self.batch),
            a_offset: u(o[0]),
            a_row_stride: u(a.strides[r - 2]),
            a_k_stride: u(a.strides[r - 1]),
            b_offset: u(o[1]),
            b_k_stride: u(b.strides[r - 2]),
            b_col_stride: u(b.strides[r - 1]),
            out_offset: u(o[inputs.len()]),
            splits: u(self.splits),
            k_per_split: u(self.k_per_split),
            activation: u(self.activation),
            ..MatmulParams::default()
        };
        if let Some((kind, eps)) = self.norm {
            params.norm_offset = u(o[2]);
            if kind == NormKind::Layer {
                params.shift_offset = u(o[3]);
            }
            params.eps = eps;
        }
        if let Some(i) = self.bias_at {
            params.bias_offset = u(o[i - 1]);
            params.bias_stride = u(inputs[i - 1].layout.strides[0]);
        }
        let res = self.res_at.map(|i| (o[i - 1], &inputs[i - 1].layout));
        if let Some((offset, t)) = res {
            params.res_offset = u(offset);
            params.res_row_stride = u(t.strides[r - 2]);
            params.res_col_stride = u(t.strides[r - 1]);
        }
        let no_residual = vec![0; r - 2];
        let res_strides = res.map_or(&no_residual[..], |(_, t)| &t.strides[..r - 2]);
        let (shape, strides) = batch_dims(inputs, res_strides);
        params.batch_rank = u(shape.len());
        // `check_batch_dims` saw to it that they fit.
        for (d, &size) in shape.iter().enumerate().take(MAX_BATCH_DIMS) {
            params.batch_shape[d] = u(size);
            params.a_batch_strides[d] = u(strides[0][d]);
            params.b_batch_strides[d] = u(strides[1][d]);
            params.res_batch_strides[d] = u(strides[2][d]);
        }
        params
    }
}

/// The batch dimensions of a matmul over `inputs` (a, b) with residual batch strides
/// `res_strides` (zeros without one): the shape and the strides of a, b and the residual,
/// merged where all three step alike (the output is row-major over them).
fn batch_dims(inputs: &[TensorRef<'_>], res_strides: &[usize]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let (a, b) = (&inputs[0].layout, &inputs[1].layout);
    let r = a.rank();
    let strides = [&a.strides[..r - 2], &b.strides[..r - 2], res_strides];
    merge_dims(&a.shape[..r - 2], &strides)
}

/// `Unsupported` where a matmul's batch dimensions (of a, b and a residual: the inputs of the
/// output's rank) do not merge into the kernels' [`MAX_BATCH_DIMS`].
fn check_batch_dims(gpu: &dyn Gpu, op: &Op, inputs: &[TensorRef<'_>]) -> Result<()> {
    let r = inputs[0].layout.rank();
    let residual = inputs[2..].iter().find(|t| t.layout.rank() == r);
    let no_residual = vec![0; r - 2];
    let res_strides = residual.map_or(&no_residual[..], |t| &t.layout.strides[..r - 2]);
    let (shape, _) = batch_dims(inputs, res_strides);
    if shape.len() > MAX_BATCH_DIMS {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "{} with batch dimensions {:?} that do not merge into {MAX_BATCH_DIMS}",
                op.name(),
                &inputs[0].layout.shape[..r - 2]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Build;
    use crate::params::ParamBlock;
    use crate::source::source;
    use tessera_core::UnaryOp;

    /// The tensor-core kernel runs only on adapters with cooperative matrices (not lavapipe),
    /// so its WGSL is at least checked everywhere: parsed and validated as the device would.
    #[test]
    fn the_tensor_core_kernel_is_valid_wgsl() {
        let every = Op::Matmul {
            bias: true,
            activation: Some(UnaryOp::Gelu),
            residual: true,
        };
        let every = Epilogue::of(&every).expect("a matmul epilogue");
        for dtype in [DType::F16, DType::BF16] {
            let io = |output| (dtype, output);
            let plain = vec![io(false), io(false), io(true)];
            let f32_out = vec![io(false), io(false), (DType::F32, true)];
            let fused = vec![io(false), io(false), io(false), io(false), io(true)];
            for (a_at, b_at, epilogue, bindings) in [
                ("coop_k", "coop_mn", "", plain),
                ("coop_k", "coop_k", "", f32_out),
                ("coop_mn", "coop_k", every.code.as_str(), fused),
            ] {
                check_tensor_core_kernel(dtype, a_at, b_at, epilogue, &bindings);
            }
        }
    }

    /// Validates the tensor-core kernel on operands of `dtype` with both staging codes.
    fn check_tensor_core_kernel(
        dtype: DType,
        a_at: &str,
        b_at: &str,
        epilogue: &str,
        bindings: &[(DType, bool)],
    ) {
        let store = format!("st{}", bindings.len());
        let subst = [
            ("EPILOGUE", epilogue.to_string()),
            ("STORE", store),
            ("A_AT", a_at.to_string()),
            ("B_AT", b_at.to_string()),
        ];
        let build = Build {
            immediate_words: Some(64),
            subgroups: true,
        };
        for wide in [false, true] {
            let mut subst = subst.to_vec();
            let kernel = Tiles {
                grid: [1, 1, 1],
                coop: true,
                wide: [wide; 2],
                dtype,
            };
            kernel.code(&mut subst);
            let src = source(SRC, "coop", bindings, &subst, build, &MatmulParams::wgsl());
            assert_eq!(src.contains("array<vec4<u32>>"), wide);
            assert_eq!(src.contains(F16_IS_BF16), dtype == DType::BF16);
            assert!(src.contains(INDICES_IN_RANGE));
            let what = format!("coop {dtype:?} wide {wide} {a_at} {b_at} {epilogue:?}");
            crate::source::assert_valid(&src, &what);
        }
    }

    /// The tiled kernel is valid WGSL with either staging, for every layout of its operands,
    /// and reads vectors exactly where it stages them.
    #[test]
    fn the_tiled_kernel_is_valid_wgsl() {
        let bindings = [(DType::F32, false), (DType::F32, false), (DType::F32, true)];
        for a_at in ["along_k", "along_mn"] {
            for b_at in ["along_k", "along_mn"] {
                for wide in [[false, false], [true, false], [false, true], [true, true]] {
                    let mut subst = vec![
                        ("EPILOGUE", String::new()),
                        ("STORE", "st3".to_string()),
                        ("A_AT", a_at.to_string()),
                        ("B_AT", b_at.to_string()),
                    ];
                    subst.extend(tiled_staging_code(a_at, b_at, wide));
                    let build = Build {
                        immediate_words: Some(64),
                        subgroups: true,
                    };
                    let params = MatmulParams::wgsl();
                    let src = source(SRC, "matmul", &bindings, &subst, build, &params);
                    for (binding, wide) in [1, 2].into_iter().zip(wide) {
                        let vectors = format!("b{binding}: array<vec4<u32>>");
                        assert_eq!(src.contains(&vectors), wide, "{wide:?} {a_at} {b_at}");
                    }
                    assert!(src.contains(INDICES_IN_RANGE));
                    crate::source::assert_valid(&src, &format!("tiled {wide:?} {a_at} {b_at}"));
                }
            }
        }
    }

    /// K splits by whole waves: GPT-2's weight gradients (k = 8192) fill their last wave,
    /// products that already fill theirs and short k stay in one part, and every part has
    /// work.
    #[test]
    fn the_tiled_kernel_splits_k_into_full_waves() {
        for (tiles, k, splits) in [
            (108, 8192, 6),
            (36, 8192, 11),
            (144, 8192, 9),
            (384, 3072, 1),
        ] {
            let (s, per) = split_k_by_waves(tiles, k);
            assert_eq!(s, splits, "{tiles} tiles, k {k}");
            assert!(
                per % 8 == 0 && (s - 1) * per < k,
                "{tiles} tiles, k {k}: {s} x {per}"
            );
        }
        assert_eq!(split_k_by_waves(10, 1000), (1, 1000));
        assert_eq!(split_k_by_waves(1, 100_000).0, MAX_SPLITS);
    }

    /// The wide few-rows kernel is valid WGSL for each dtype it reads, with and without the
    /// bias and residual epilogue, and reads its operands wide.
    #[test]
    fn the_wide_few_rows_kernel_is_valid_wgsl() {
        let every = Op::Matmul {
            bias: true,
            activation: Some(UnaryOp::Gelu),
            residual: true,
        };
        let every = Epilogue::of(&every).expect("a matmul epilogue");
        let plain = Epilogue::of(&PLAIN).expect("a matmul epilogue");
        let normed = |norm: NormKind| Op::NormMatmul {
            norm,
            bias: true,
            activation: Some(UnaryOp::Gelu),
            residual: true,
        };
        let layer = Epilogue::of(&normed(NormKind::Layer)).expect("an epilogue");
        let rms = Epilogue::of(&normed(NormKind::Rms)).expect("an epilogue");
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let kernels = [
                (&plain, 3, None),
                (&every, 5, None),
                (&layer, 7, Some(NormKind::Layer)),
                (&rms, 6, Some(NormKind::Rms)),
            ];
            // One row, and every row a few-rows product may have (whose names must not meet
            // the bindings' accessors); every walk over k, and every number of columns a
            // normalized product's subgroup may take.
            for ((epilogue, count, norm), rows, (k, n)) in kernels.into_iter().flat_map(|kernel| {
                [1, MAX_FEW_ROWS].into_iter().flat_map(move |rows| {
                    [(768, 3072), (3072, 1024), (16384, 96)].map(|shape| (kernel, rows, shape))
                })
            }) {
                let bindings: Vec<_> = (0..count).map(|i| (dtype, i + 1 == count)).collect();
                let mut subst = vec![
                    ("EPILOGUE", epilogue.code.clone()),
                    ("STORE", epilogue.store.clone()),
                ];
                let vectors = k / (16 / dtype.size());
                let (section, walk) = match norm {
                    None => {
                        let walk = WideRows::for_k(vectors);
                        subst.extend(wide_rows_code(rows, walk, dtype, epilogue));
                        ("rows_wide", format!("{walk:?}"))
                    }
                    Some(kind) => {
                        let walk = NormedRows::new(rows, n, vectors);
                        subst.extend(normed_rows_code(rows, walk, dtype, epilogue, kind));
                        ("rows_normed", format!("{walk:?}"))
                    }
                };
                let build = Build {
                    immediate_words: Some(64),
                    subgroups: true,
                };
                let params = MatmulParams::wgsl();
                let src = source(SRC, section, &bindings, &subst, build, &params);
                assert!(src.contains("var<storage, read_write> b2: array<vec4<u32>>"));
                if norm.is_some() {
                    assert!(src.contains("var<storage, read_write> b3: array<vec4<u32>>"));
                }
                let code = &epilogue.code;
                let what = format!("{section}{rows} {walk} {dtype:?} {code:?} {norm:?}");
                crate::source::assert_valid(&src, &what);
            }
        }
    }
}
