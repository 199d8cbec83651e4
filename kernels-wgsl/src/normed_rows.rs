//! The few-rows normalized product (`NormMatmul` in decoding: a projection after its layer or
//! RMS norm) as one kernel, `rows_normed` (matmul.wgsl). Each subgroup takes a few output
//! columns: it loads its first step of `x`, the norm's weight and shift and its columns of `b`
//! at once, takes the row's mean and variance (two passes: from those registers where k fits
//! one step, as decoding's 768 does, else over `x` again), and then multiplies the normalized
//! row, computed once, by each of its columns. A subgroup a column took the norm's sums again
//! for every column, at about four times a plain product's arithmetic per weight.

use tessera_core::ops::NormKind;
use tessera_core::DType;

use crate::epilogue::Epilogue;
use crate::source::wide_helpers;

/// The most vectors of k each lane loads at once (as `rows_wide`'s steps).
const UNROLL: usize = 4;

/// How a `rows_normed` kernel walks its product: `columns` output columns a subgroup, `unroll`
/// vectors of k a lane per step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NormedRows {
    pub columns: usize,
    pub unroll: usize,
}

impl NormedRows {
    /// The walk for `m` rows, `n` columns and a k of `vectors` 16-byte vectors, chosen for
    /// subgroups of 32: steps no longer than k needs, and several columns a subgroup where
    /// there are columns enough to keep every multiprocessor busy and rows few enough that
    /// the normalized rows stay in registers.
    pub(crate) fn new(m: usize, n: usize, vectors: usize) -> NormedRows {
        let columns = match n {
            _ if m > 2 => 1,
            0..512 => 1,
            512..2048 => 2,
            _ => 4,
        };
        let unroll = vectors.div_ceil(32).clamp(1, UNROLL);
        NormedRows { columns, unroll }
    }
}

/// The helpers of the normalized row: its vector `x` normalized by the row's `mean` and `rstd`
/// and the norm's weight `g` and shift `h` (zero for an RMS norm), as two quads of f32
/// (the second zero for f32 vectors), and its dot product with a vector of `b`.
const NORMED_MATH: &str = "\
struct Normed { lo: vec4<f32>, hi: vec4<f32> }
fn normed(x: vec4<u32>, g: vec4<u32>, h: vec4<u32>, mean: f32, rstd: f32) -> Normed {
    var u = Normed((quad(x, 0u) - mean) * rstd * quad(g, 0u) + quad(h, 0u), vec4<f32>(0.0));
    if (QUADS == 2u) { u.hi = (quad(x, 1u) - mean) * rstd * quad(g, 1u) + quad(h, 1u); }
    return u;
}
fn udot(u: Normed, w: vec4<u32>) -> f32 {
    var s = dot(u.lo, quad(w, 0u));
    if (QUADS == 2u) { s += dot(u.hi, quad(w, 1u)); }
    return s;
}
fn vsum(x: vec4<u32>) -> f32 {
    var s = dot(quad(x, 0u), vec4<f32>(1.0));
    if (QUADS == 2u) { s += dot(quad(x, 1u), vec4<f32>(1.0)); }
    return s;
}
fn sqdev(x: vec4<u32>, mean: f32) -> f32 {
    let d = quad(x, 0u) - mean;
    var s = dot(d, d);
    if (QUADS == 2u) { let e = quad(x, 1u) - mean; s += dot(e, e); }
    return s;
}
";

/// The generated parts of a `rows_normed` kernel for `m` rows of `dtype`, walked as `walk`
/// says, normalized by a `kind` norm and finished by `epilogue`. Loads past k read the last
/// vector again (clamped) and count for nothing: their terms are selected away, not multiplied
/// by zero, so an infinity in the last vector does not turn the sum into NaN.
pub(crate) fn normed_rows_code(
    m: usize,
    walk: NormedRows,
    dtype: DType,
    epilogue: &Epilogue,
    kind: NormKind,
) -> Vec<(&'static str, String)> {
    let rows = |t: &str| {
        (0..m)
            .map(|r| t.replace('#', &r.to_string()))
            .collect::<String>()
    };
    let columns = |f: &dyn Fn(usize) -> String| (0..walk.columns).map(f).collect::<String>();
    let steps = |f: &dyn Fn(usize) -> String| (0..walk.unroll).map(f).collect::<Vec<_>>();
    let layer = kind == NormKind::Layer;
    // One step's loads at `kk`, their names prefixed by `p`.
    let loads = |p: &str, kk: &str| {
        steps(&|j| {
            let shift = if layer {
                format!("let {p}h{j} = ldv4(ns + {p}c{j});\n")
            } else {
                format!("let {p}h{j} = vec4<u32>(0u);\n")
            };
            format!(
                "let {p}i{j} = {kk} + {j}u * width;\nlet {p}on{j} = {p}i{j} < kv;\n\
                 let {p}c{j} = min({p}i{j}, kv - 1u);\nlet {p}g{j} = ldv3(nw + {p}c{j});\n{shift}"
            ) + &columns(&|c| format!("let {p}w{j}_{c} = ldv2(bn{c} + {p}c{j});\n"))
                + &rows(&format!(
                    "let {p}x{j}_# = ldv1(a_base + #u * sam + {p}c{j});\n"
                ))
        })
        .concat()
    };
    // One step's products, from its loads prefixed `p`.
    let products = |p: &str| {
        steps(&|j| {
            rows(&format!(
                "let {p}u{j}_# = normed({p}x{j}_#, {p}g{j}, {p}h{j}, mean#, rstd#);\n"
            ))
        })
        .concat()
            + &columns(&|c| {
                let terms =
                    steps(&|j| format!("select(0.0, udot({p}u{j}_#, {p}w{j}_{c}), {p}on{j})"));
                rows(&format!("acc#_{c} += {};\n", terms.join(" + ")))
            })
    };
    let first_terms = |f: &str| {
        steps(&|j| format!("select(0.0, {}, on{j})", f.replace('J', &j.to_string()))).join(" + ")
    };
    let mean = if layer {
        rows(&format!(
            "var sx# = {};\n\
             for (var kk = lane + step; kk < kv; kk += width) {{ sx# += vsum(ldv1(a_base + #u * sam + kk)); }}\n\
             let mean# = subgroupAdd(sx#) / f32(params.k);\n",
            first_terms("vsum(xJ_#)")
        ))
    } else {
        rows("let mean# = 0.0;\n")
    };
    let stats = mean
        + &rows(&format!(
            "var sq# = {};\n\
             for (var kk = lane + step; kk < kv; kk += width) {{ sq# += sqdev(ldv1(a_base + #u * sam + kk), mean#); }}\n\
             let rstd# = 1.0 / sqrt(subgroupAdd(sq#) / f32(params.k) + params.eps);\n",
            first_terms("sqdev(xJ_#, mean#)")
        ));
    // The epilogue's names for column `c`: its index, bias and residuals.
    let (early, early_row, late) = epilogue.early_late();
    let for_column = |code: &str, c: usize| {
        code.replace("gn *", &format!("gn{c} *"))
            .replace("eb", &format!("eb{c}"))
            .replace("er#", &format!("er#_{c}"))
    };
    let store = &epilogue.store;
    let finish = columns(&|c| rows(&format!("let s#_{c} = subgroupAdd(acc#_{c});\n")))
        + "if (lane == 0u) {\n"
        + &columns(&|c| {
            format!("if (gc * {}u + {c}u < n) {{\n", walk.columns)
                + &rows(&format!(
                    "{{\nvar v = s#_{c};\n{}{store}(o_base + #u * n + gn{c}, v);\n}}\n",
                    for_column(&late, c)
                ))
                + "}\n"
        })
        + "}\n";
    vec![
        ("VECTOR_MATH", wide_helpers(dtype) + NORMED_MATH),
        ("UNROLL_U", format!("{}u", walk.unroll)),
        ("COLUMNS_U", format!("{}u", walk.columns)),
        (
            "COLUMN_SETUP",
            columns(&|c| {
                format!(
                    "let gn{c} = min(gc * {}u + {c}u, n - 1u);\nlet bn{c} = b_base + gn{c} * sbn;\n",
                    walk.columns
                )
            }),
        ),
        (
            "EARLY",
            columns(&|c| for_column(&early, c) + &rows(&for_column(&early_row, c))),
        ),
        ("FIRST_LOADS", loads("", "lane")),
        ("STATS", stats),
        (
            "ZERO",
            columns(&|c| rows(&format!("var acc#_{c} = 0.0;\n"))) + &products(""),
        ),
        ("MACS", loads("n", "kk") + &products("n")),
        ("FINISH", finish),
    ]
}
