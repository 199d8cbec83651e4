//! WGSL assembly and launch parameters.
//!
//! A kernel's source is its typed parameter block, `params` (`params.rs`; immediates, or
//! group 0),
//! `common.wgsl`, the workgroup reductions of `group_reduce.wgsl` (by subgroups or by a tree),
//! then generated declarations for each data binding, then the shared part of its family file
//! and one of the file's `// @kernel NAME` sections, with placeholders (upper-case words such
//! as `BODY`) replaced. Binding `K` of group 1 (from 1) gets `ldK(e) -> f32` and
//! `stK(e, v: f32)` (converting as `Cast` does), `ldnK`/`stnK` in its native type (`f32`,
//! `f16`, `i32`, `u32`; bool as a `u32` 0 or 1; bf16 as its 16 bits in a `u32`), and for
//! index dtypes `ldiK(e) -> i32` (a u32 past `i32::MAX` reads as -1, i.e. out of range).
//! A binding whose kernel calls `ldvK(i)` or `stvK(i, x)` is declared as 16-byte vectors
//! instead (`array<vec4<u32>>`; f32, f16 and bf16): `ldvK(i)` returns vector `i`, `stvK`
//! writes it, and `ldK(e)` reads element `e`, for kernels that load and store wide.
//!
//! A kernel calling `wg_sum` or `wg_max` ends its entry point's parameters with
//! `@builtin(local_invocation_index) lid: u32` followed by the placeholder `SUBGROUP_ARGS`,
//! and starts its body with `SUBGROUP_ENTER`: with subgroups they become the subgroup builtins
//! and the call that records them for the reductions, without they vanish.
//!
//! 16-bit floats are stored as 16 bits and computed in f32: f16 as WGSL's `f16` (the adapter's
//! `SHADER_F16`), bf16 packed two to a `u32`. Stores round to nearest even. Outputs of bool and
//! bf16 are written through atomics on their 32-bit word, so threads writing different parts
//! of one word never race.

use tessera_core::{DType, Error, Result, TensorRef};

use crate::gpu::{Build, Dispatch, Gpu, Source};
use crate::params::ParamBlock;

const COMMON: &str = include_str!("../kernels/common.wgsl");
const GROUP_REDUCE: &str = include_str!("../kernels/group_reduce.wgsl");

/// Where the data bindings' declarations go, once the kernel's code says which are wide.
const BINDINGS: &str = "// @bindings\n";

/// Elements of `dtype` in a 16-byte vector, for the dtypes kernels read wide.
pub(crate) fn wide_elements(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F32 => Some(4),
        DType::F16 | DType::BF16 => Some(8),
        _ => None,
    }
}

/// Elements per 16-byte vector where `t` can be read as vectors along dimension `dim`: a dtype
/// read wide, `dim` contiguous and a whole number of vectors long, and every offset and
/// stride that reaches a vector's start a whole number of vectors, in bindings that start
/// 16-byte aligned.
pub(crate) fn wide_along(gpu: &dyn Gpu, t: &TensorRef<'_>, dim: usize) -> Option<usize> {
    let per_vector = wide_elements(t.dtype)?;
    let l = t.layout;
    let whole = gpu.align() % 16 == 0
        && l.strides[dim] == 1
        && l.shape[dim].is_multiple_of(per_vector)
        && l.offset.is_multiple_of(per_vector)
        && (0..l.rank())
            .all(|d| d == dim || l.shape[d] == 1 || l.strides[d].is_multiple_of(per_vector));
    whole.then_some(per_vector)
}

/// WGSL for kernels reading 16-byte vectors of `dtype` (held as `vec4<u32>`): `VEC`, the
/// elements in one, `QUADS`, its groups of four, `quad(x, h)`, elements `4h..4h + 4` as f32,
/// and `dotv(x, y)`, the dot product of two vectors in f32.
pub(crate) fn wide_helpers(dtype: DType) -> String {
    let pairs = |unpack: &str| {
        format!(
            "fn quad(x: vec4<u32>, h: u32) -> vec4<f32> {{\n\
             \x20   let w = select(x.xy, x.zw, h == 1u);\n\
             \x20   return vec4<f32>({unpack}(w.x), {unpack}(w.y));\n}}\n\
             fn dotv(x: vec4<u32>, y: vec4<u32>) -> f32 {{\n\
             \x20   let lo = dot(vec4<f32>({unpack}(x.x), {unpack}(x.y)), vec4<f32>({unpack}(y.x), {unpack}(y.y)));\n\
             \x20   let hi = dot(vec4<f32>({unpack}(x.z), {unpack}(x.w)), vec4<f32>({unpack}(y.z), {unpack}(y.w)));\n\
             \x20   return lo + hi;\n}}\n"
        )
    };
    match dtype {
        DType::F32 => "const VEC: u32 = 4u;\nconst QUADS: u32 = 1u;\n\
                       fn quad(x: vec4<u32>, h: u32) -> vec4<f32> { return bitcast<vec4<f32>>(x); }\n\
                       fn dotv(x: vec4<u32>, y: vec4<u32>) -> f32 { \
                       return dot(bitcast<vec4<f32>>(x), bitcast<vec4<f32>>(y)); }\n"
            .to_string(),
        DType::F16 => "const VEC: u32 = 8u;\nconst QUADS: u32 = 2u;\n".to_string() + &pairs("unpack2x16float"),
        _ => "const VEC: u32 = 8u;\nconst QUADS: u32 = 2u;\n\
              fn bf16x2(w: u32) -> vec2<f32> { \
              return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u)); }\n"
            .to_string()
            + &pairs("bf16x2"),
    }
}

/// The declarations and accessors of data binding `k` read as 16-byte vectors: `ldvK(i)`
/// returns vector `i` as a `vec4<u32>`, `stvK(i, x)` writes it, and `ldK(e)` still reads
/// element `e` as f32.
fn wide_binding(k: usize, dtype: DType) -> String {
    let ld = match dtype {
        DType::F32 => "bitcast<f32>(bK[e >> 2u][e & 3u])",
        DType::F16 => "unpack2x16float(bK[e >> 3u][(e >> 1u) & 3u])[e & 1u]",
        _ => "bitcast<f32>(((bK[e >> 3u][(e >> 1u) & 3u] >> ((e & 1u) * 16u)) & 0xffffu) << 16u)",
    };
    format!(
        "@group(1) @binding(K) var<storage, read_write> bK: array<vec4<u32>>;\n\
         fn ldvK(i: u32) -> vec4<u32> {{ return bK[i]; }}\n\
         fn stvK(i: u32, x: vec4<u32>) {{ bK[i] = x; }}\n\
         fn ldK(e: u32) -> f32 {{ return {ld}; }}\n"
    )
    .replace('K', &k.to_string())
}

/// The declarations and accessors of data binding `k`.
fn binding(k: usize, dtype: DType, output: bool) -> String {
    let (arr, native, ld, st, ldi) = match dtype {
        DType::F32 => ("f32", "f32", "b{k}[e]", "b{k}[e] = v;", None),
        DType::F16 => ("f16", "f16", "f32(b{k}[e])", "b{k}[e] = to_f16(v);", None),
        DType::I32 => (
            "i32",
            "i32",
            "f32(b{k}[e])",
            "b{k}[e] = f2i(v);",
            Some("b{k}[e]"),
        ),
        DType::U32 => (
            "u32",
            "u32",
            "f32(b{k}[e])",
            "b{k}[e] = f2u(v);",
            Some("select(i32(b{k}[e]), -1, b{k}[e] > 0x7fffffffu)"),
        ),
        _ => ("", "u32", "", "", None),
    };
    let mut s = String::new();
    if matches!(dtype, DType::Bool | DType::BF16) {
        // Sub-word elements: the word of element `e`, its shift inside the word, the mask.
        let (word, shift, mask) = if dtype == DType::Bool {
            ("e >> 2u", "(e & 3u) * 8u", "0xffu")
        } else {
            ("e >> 1u", "(e & 1u) * 16u", "0xffffu")
        };
        if output {
            s += "@group(1) @binding(K) var<storage, read_write> bK: array<atomic<u32>>;\n";
            s += &format!(
                "fn ldnK(e: u32) -> u32 {{ return (atomicLoad(&bK[{word}]) >> ({shift})) & {mask}; }}\n"
            );
            s += &format!(
                "fn stnK(e: u32, v: u32) {{ let sh = {shift}; atomicAnd(&bK[{word}], ~({mask} << sh)); \
                 atomicOr(&bK[{word}], (v & {mask}) << sh); }}\n"
            );
            // A whole word `w` of packed elements, for kernels whose threads own words.
            s += "fn stwK(w: u32, v: u32) { atomicStore(&bK[w], v); }\n";
            if dtype == DType::BF16 {
                // Elements `e` and `e + 1`: one word where they share one (its thread owns
                // both halves), else one by one.
                s += "fn stK_two(e: u32, x: f32, y: f32) {\n\
                      \x20   if ((e & 1u) == 0u) { stwK(e >> 1u, bf16_bits(x) | (bf16_bits(y) << 16u)); }\n\
                      \x20   else { stK(e, x); stK(e + 1u, y); }\n}\n";
            }
        } else {
            s += "@group(1) @binding(K) var<storage, read_write> bK: array<u32>;\n";
            s += &format!(
                "fn ldnK(e: u32) -> u32 {{ return (bK[{word}] >> ({shift})) & {mask}; }}\n"
            );
            s += "fn stnK(e: u32, v: u32) { bK[e] = v; }\n";
        }
        if dtype == DType::Bool {
            s += "fn ldK(e: u32) -> f32 { return select(0.0, 1.0, ldnK(e) != 0u); }\n";
            s += "fn stK(e: u32, v: f32) { stnK(e, select(1u, 0u, v == 0.0)); }\n";
        } else {
            s += "fn ldK(e: u32) -> f32 { return bitcast<f32>(ldnK(e) << 16u); }\n";
            s += "fn stK(e: u32, v: f32) { stnK(e, bf16_bits(v)); }\n";
        }
    } else {
        s += &format!("@group(1) @binding(K) var<storage, read_write> bK: array<{arr}>;\n");
        s += &format!("fn ldK(e: u32) -> f32 {{ return {ld}; }}\n");
        s += &format!("fn stK(e: u32, v: f32) {{ {st} }}\n");
        s += &format!("fn ldnK(e: u32) -> {native} {{ return bK[e]; }}\n");
        s += &format!("fn stnK(e: u32, v: {native}) {{ bK[e] = v; }}\n");
        if let Some(ldi) = ldi {
            s += &format!("fn ldiK(e: u32) -> i32 {{ return {ldi}; }}\n");
        }
    }
    if output && dtype != DType::BF16 {
        s += "fn stK_two(e: u32, x: f32, y: f32) { stK(e, x); stK(e + 1u, y); }\n";
    }
    s.replace("{k}", &k.to_string())
        .replace('K', &k.to_string())
}

/// f32 to f16, rounding to nearest even. WGSL leaves out-of-range conversions undefined, so
/// overflow is made infinite here (65520 and above round to infinity), by an f16 product that
/// overflows at run time.
const TO_F16: &str = "
fn to_f16(v: f32) -> f16 {
    if (abs(v) >= 65520.0 && !is_nan(v)) { return f16(sign(v)) * f16(65504.0) * f16(2.0); }
    return f16(v);
}
";

/// f32 to bf16 bits, rounding to nearest even (overflow carries into infinity); NaN stays a
/// quiet NaN.
const BF16_BITS: &str = "
fn bf16_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if (is_nan(v)) { return (b >> 16u) | 0x40u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
";

/// The WGSL type a dtype loads as natively.
pub(crate) fn native(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::I32 => "i32",
        _ => "u32",
    }
}

/// Assembles a kernel: common helpers, bindings, the family's shared part and `section`.
pub(crate) fn source(
    family: &str,
    section: &str,
    bindings: &[(DType, bool)],
    subst: &[(&str, String)],
    build: Build,
    block: &str,
) -> String {
    let marker = "// @kernel ";
    let shared = family.split(marker).next().unwrap_or("");
    let body = section_of(family, section);
    let has = |dtype: DType| bindings.iter().any(|&(d, _)| d == dtype);
    let mut src = String::new();
    // The tensor-core kernel's tiles are f16 whatever its bindings hold.
    if has(DType::F16) || body.contains("coop_mat") {
        src += "enable f16;\n";
    }
    if body.contains("coop_mat") {
        src += "enable wgpu_cooperative_matrix;\n";
    }
    src += &param_declaration(build.immediate_words.is_some(), block);
    src += COMMON;
    src += "// ";
    src += section_of(
        GROUP_REDUCE,
        if build.subgroups { "subgroup" } else { "tree" },
    );
    if has(DType::F16) {
        src += TO_F16;
    }
    if has(DType::BF16) {
        src += BF16_BITS;
    }
    src += BINDINGS;
    src += shared;
    src += "// kernel ";
    src += body;
    for (from, to) in subst {
        src = src.replace(from, to);
    }
    let declarations: String = bindings
        .iter()
        .enumerate()
        .map(|(i, &(dtype, output))| {
            let k = i + 1;
            match src.contains(&format!("ldv{k}(")) || src.contains(&format!("stv{k}(")) {
                true => wide_binding(k, dtype),
                false => binding(k, dtype, output),
            }
        })
        .collect();
    src = src.replacen(BINDINGS, &declarations, 1);
    if build.subgroups {
        src = src
            .replace(
                "SUBGROUP_ARGS",
                ", @builtin(subgroup_id) sg_in: u32, @builtin(num_subgroups) sgs_in: u32, \
                 @builtin(subgroup_invocation_id) lane_in: u32",
            )
            .replace("SUBGROUP_ENTER", "sg_enter(sg_in, sgs_in, lane_in);");
    } else {
        src = src
            .replace("SUBGROUP_ARGS", "")
            .replace("SUBGROUP_ENTER", "");
    }
    src
}

/// The text of `family`'s section `section` (after its `// @kernel NAME` line).
fn section_of<'a>(family: &'a str, section: &str) -> &'a str {
    family
        .split("// @kernel ")
        .skip(1)
        .find(|s| s.lines().next().map(str::trim) == Some(section))
        .unwrap_or("")
}

/// The kernel's parameter block `block` (a `struct Params`) and its declaration as `params`:
/// immediates, or the launch's window of the submission's parameter buffer.
fn param_declaration(immediate: bool, block: &str) -> String {
    match immediate {
        true => format!("{block}var<immediate> params: Params;\n"),
        false => format!("{block}@group(0) @binding(0) var<storage, read> params: Params;\n"),
    }
}

/// Binding kinds for inputs followed by outputs.
pub(crate) fn kinds(inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Vec<(DType, bool)> {
    inputs
        .iter()
        .map(|t| (t.dtype, false))
        .chain(outputs.iter().map(|t| (t.dtype, true)))
        .collect()
}

/// A kernel's placeholders and the code replacing them.
pub(crate) type Subst = Vec<(&'static str, String)>;

/// The substitutions of a kernel without placeholders.
pub(crate) fn no_subst() -> Result<Subst> {
    Ok(Vec::new())
}

/// Everything in one place for the common case: views of `inputs` then `outputs`, the
/// pipeline `key` built from `family`'s `section` with the placeholders `subst` gives (called
/// only when the pipeline is not cached yet: generating code costs more host time than the
/// rest of a launch), and a dispatch of `groups` workgroups (spread over a 2-D grid) with the
/// parameter block `params` makes from the bindings' element offsets.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<P: ParamBlock>(
    gpu: &dyn Gpu,
    key: &str,
    family: &str,
    section: &str,
    subst: impl FnOnce() -> Result<Subst>,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    groups: u64,
    params: impl FnOnce(&[usize]) -> P,
) -> Result<()> {
    let grid = if groups == 0 {
        [0, 0, 0]
    } else {
        gpu.grid(groups)
    };
    run_grid(
        gpu, key, family, section, subst, inputs, outputs, grid, params,
    )
}

/// As [`run`], with an explicit 3-D grid (a zero anywhere dispatches nothing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_grid<P: ParamBlock>(
    gpu: &dyn Gpu,
    key: &str,
    family: &str,
    section: &str,
    subst: impl FnOnce() -> Result<Subst>,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    grid: [u32; 3],
    params: impl FnOnce(&[usize]) -> P,
) -> Result<()> {
    let make = |build, block: fn() -> String| {
        Ok(Source::Wgsl(source(
            family,
            section,
            &kinds(inputs, outputs),
            &subst()?,
            build,
            &block(),
        )))
    };
    dispatch(gpu, key, make, inputs, outputs, grid, false, |offsets| {
        (params(offsets).words(), P::wgsl as fn() -> String)
    })
}

/// As [`run_grid`], for a kernel the backend writes itself ([`Source::TensorMatmul`]), which
/// it may compile for this launch's parameters where `specialize` ([`Dispatch::specialize`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_native<P: ParamBlock>(
    gpu: &dyn Gpu,
    key: &str,
    kernel: Source,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    grid: [u32; 3],
    specialize: bool,
    params: impl FnOnce(&[usize]) -> P,
) -> Result<()> {
    dispatch(
        gpu,
        key,
        move |_, _| Ok(kernel),
        inputs,
        outputs,
        grid,
        specialize,
        |offsets| (params(offsets).words(), P::wgsl as fn() -> String),
    )
}

/// Views of `inputs` then `outputs`, the parameter words and the maker of their WGSL
/// declaration (called only to compile) that `params` gives for their element offsets, and
/// the dispatch of the kernel cached under `key`, made by `make` on a miss (for these words,
/// where `specialize` lets the backend: [`Dispatch::specialize`]).
#[allow(clippy::too_many_arguments)]
fn dispatch(
    gpu: &dyn Gpu,
    key: &str,
    make: impl FnOnce(Build, fn() -> String) -> Result<Source>,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    grid: [u32; 3],
    specialize: bool,
    params: impl FnOnce(&[usize]) -> (Vec<u32>, fn() -> String),
) -> Result<()> {
    let mut binds = Vec::with_capacity(inputs.len() + outputs.len());
    let mut offs = Vec::with_capacity(inputs.len() + outputs.len());
    for t in inputs.iter().chain(outputs) {
        let (b, o) = gpu.view(t)?;
        binds.push(b);
        offs.push(o as usize);
    }
    let (words, block) = params(&offs);
    let build = gpu.build(words.len());
    let dispatch = Dispatch {
        key,
        bindings: &binds,
        params: &words,
        immediate: build.immediate_words.is_some(),
        grid,
        specialize,
    };
    let mut make = Some(make);
    gpu.dispatch(&dispatch, &mut || match make.take() {
        Some(make) => make(build, block),
        None => Err(Error::Compile {
            backend: gpu.backend().into(),
            op: key.into(),
            log: "the kernel's source was asked for twice".into(),
        }),
    })
}

/// The cache key of a kernel: op, dtypes of its bindings and a variant name.
pub(crate) fn key(
    op: &tessera_core::Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    variant: &str,
) -> String {
    let mut key = format!("{op:?}/");
    for (i, t) in inputs.iter().chain(outputs).enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(t.dtype.name());
    }
    key.push('/');
    key.push_str(variant);
    key
}

/// An op this backend does not run (yet), as the catalog error.
pub(crate) fn unsupported(gpu: &dyn Gpu, op: &tessera_core::Op) -> Error {
    Error::unsupported(gpu.backend(), op.name())
}

/// Workgroups needed to cover `n` items with one thread each.
pub(crate) fn groups_for(n: usize) -> u64 {
    (n as u64).div_ceil(crate::gpu::WG)
}

/// Panics, naming `what` and the error in the source, unless `src` parses as WGSL and passes
/// naga's validation with every capability a device may offer (subgroups included).
#[cfg(test)]
pub(crate) fn assert_valid(src: &str, what: &str) {
    use naga::back::spv;
    use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
    .subgroup_operations(naga::valid::SubgroupOperationSet::all())
    .validate(&module)
    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    // naga's SPIR-V writer (Vulkan's path, and wgpu's) under both bounds policies the
    // backends use: it has panicked on modules that validate.
    for policy in [BoundsCheckPolicy::Restrict, BoundsCheckPolicy::Unchecked] {
        let options = spv::Options {
            lang_version: (1, 5),
            bounds_check_policies: BoundsCheckPolicies {
                index: policy,
                buffer: policy,
                ..BoundsCheckPolicies::default()
            },
            ..spv::Options::default()
        };
        let pipeline = spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        };
        spv::write_vec(&module, &info, &options, Some(&pipeline))
            .unwrap_or_else(|e| panic!("{what}: SPIR-V output: {e}"));
    }
}
