//! Rotary embeddings and flash-style attention. The forward pass runs a thread per query row
//! with an online softmax (for a few rows, as in decoding, workgroups over key splits joined
//! in order afterwards); attention over a KV cache at device positions (`CachedAttention`)
//! runs the same forward kernels with its positions in place of the log-sum-exp output, each
//! query reading only the keys up to its position. The backward pass computes
//! `delta = rowsum(dout * out)`, then `dq` per query row and `dk`, `dv` per key row (summing
//! grouped query heads in order), so nothing races and nothing is T x T. The head-size loops
//! of these kernels are generated here, fully unrolled over named vec4 registers up to head
//! size 128, loops over arrays past it and on CPU drivers, where the head sizes come from the
//! parameters (see [`Head`] and `kernels/attention.wgsl`).

use std::sync::Arc;

use tessera_core::exec::unfused::{index_copy_then_attention, LaunchOp};
use tessera_core::{DType, Error, Layout, Op, Result, TensorRef};

use crate::attention_products;
use crate::gpu::{AttentionPass, Gpu, Source, TensorAttention};
use crate::params::{offsets, param_block, ParamBlock, MAX_BINDINGS};
use crate::source::{
    groups_for, key, no_subst, run, run_native, unsupported, wide_along, wide_helpers,
};

const SRC: &str = include_str!("../kernels/attention.wgsl");
const ROTARY: &str = include_str!("../kernels/rotary.wgsl");

/// Bindings of attention's backward: q, k, v, out, lse, dout, dq, dk, dv and a scratch row.
const ATTENTION_BINDINGS: usize = 10;

param_block! {
    /// Attention's parameters: `batch` x `heads` query heads of `q_len` rows, `kv_heads` key
    /// and value heads of `k_len` rows, head sizes `k_dim` and `v_dim`, the strides of k's and
    /// v's heads and batches, forward_rows' key `splits` of `keys_per_split`, and the `tile`
    /// of streamed rows.
    AttentionParams {
        batch: u32,
        heads: u32,
        kv_heads: u32,
        q_len: u32,
        k_len: u32,
        k_dim: u32,
        v_dim: u32,
        /// 1 where key j is visible to query i only when j + q_len <= i + k_len.
        causal: u32,
        scale: f32,
        k_head_stride: u32,
        k_batch_stride: u32,
        v_head_stride: u32,
        v_batch_stride: u32,
        splits: u32,
        keys_per_split: u32,
        tile: u32,
        offsets: [u32; ATTENTION_BINDINGS],
    }
}

/// The index of the attention parameter word named `field` (`q_len`, `offsets`: the first of
/// an array's words), as [`TensorAttention`] kernels read it.
pub fn attention_param_word(field: &str) -> Option<usize> {
    AttentionParams::word_of(field)
}

/// How many words the attention parameters take.
pub fn attention_param_words() -> usize {
    AttentionParams::WORDS
}

param_block! {
    /// Rotary embedding's parameters: `x` of `elements` in rows of `head_size`, `positions`
    /// rows per sequence (the tables' rows).
    RotaryParams {
        elements: u32,
        positions: u32,
        head_size: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

/// Query (or key) rows per workgroup: one thread each.
const ROWS: usize = 128;
/// Most rows streamed through workgroup memory per tile. Small tiles leave workgroup memory
/// for more workgroups per SM: on the H100, GPT-2's attention forward and backward took half
/// the time with 128 rows and tiles of 32 as with 64 and 64 (tiles of 16 and 8, and 256 rows,
/// were no faster).
const MAX_TILE: usize = 32;
/// A cached attention over at most this many cache rows, with keys and values that read as
/// 16-byte vectors, runs `forward_keys`: one workgroup per query row in one pass, with no
/// combining kernel after it (decoding's launches each cost a few microseconds however
/// little they do). Longer caches split their keys over workgroups (`forward_rows`).
const MAX_ONE_PASS_KEYS: usize = 4096;
/// Fewer query rows than this (decoding) run `forward_rows`, a workgroup per row and key split.
const FEW_ROWS: usize = 64;
/// Up to this many queries per head (decoding, also batched, or a few tokens at a time) run
/// `forward_rows` however many rows there are: the row kernel keeps only that many of a
/// workgroup's threads busy, each walking every key alone. On the H100 (wgpu), one query per
/// head of 4 x 32 heads over 2,048 keys (head size 128, f16) took 2.07 ms there and 0.26 ms in
/// `forward_rows`; eight queries 2.08 and 1.12 ms; sixteen queries of 16 x 12 heads over
/// 1,024 keys (head size 64) 0.37 and 0.67 ms.
const FEW_QUERIES: usize = 8;

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    match op {
        Op::Rotary => {
            let x = &inputs[0].layout.shape;
            let r = x.len();
            let n = inputs[0].layout.numel();
            run(
                gpu,
                &key(op, inputs, outputs, "rotary"),
                ROTARY,
                "rotary",
                no_subst,
                inputs,
                outputs,
                groups_for(n),
                |o| RotaryParams {
                    elements: n as u32,
                    positions: x[r - 2] as u32,
                    head_size: x[r - 1] as u32,
                    offsets: offsets(o),
                },
            )
        }
        Op::Attention { .. } | Op::AttentionBackward { .. } | Op::CachedAttention => {
            let (q, kk, v) = (
                &inputs[0].layout.shape,
                &inputs[1].layout.shape,
                &inputs[2].layout.shape,
            );
            let backward = matches!(op, Op::AttentionBackward { .. });
            let positions = (*op == Op::CachedAttention).then(|| inputs[3].dtype);
            // An appending attention's new key and value rows (`launch_append`), bound after
            // the positions.
            let new_rows = (inputs.len() == 6).then(|| [inputs[4], inputs[5]]);
            let head = Head::new(gpu, op, q[3], v[3], backward, positions)?;
            // Causal masking is a parameter: both kinds share their kernels.
            let (shared_op, causal) = match *op {
                Op::AttentionBackward { causal } => {
                    (Op::AttentionBackward { causal: false }, causal)
                }
                Op::Attention { causal } => (Op::Attention { causal: false }, causal),
                _ => (Op::CachedAttention, true),
            };
            // The kernels' bindings: q, k, v, then outputs as attention has them, a cached
            // attention's positions taking the log-sum-exp's slot after its output (index
            // dtypes bind alike as inputs and outputs).
            let cached_outputs;
            let (inputs, outputs) = match positions {
                Some(_) => {
                    cached_outputs = [outputs[0], inputs[3]];
                    (&inputs[..3], &cached_outputs[..])
                }
                None => (inputs, outputs),
            };
            let (ks, vs) = (&inputs[1].layout.strides, &inputs[2].layout.strides);
            let rows = q[0] * q[1] * q[2];
            // A cached attention's rows see keys known only on the device: its splits take the
            // fewest keys each, and the kernel spreads the keys a row sees over them.
            let (splits, chunk) = match positions {
                Some(_) => (key_splits(rows, kk[2]).0, MIN_KEYS_PER_SPLIT),
                None => key_splits(rows, kk[2]),
            };
            let u = |v: usize| v as u32;
            let params = |o: &[usize]| AttentionParams {
                batch: u(q[0]),
                heads: u(q[1]),
                kv_heads: u(kk[1]),
                q_len: u(q[2]),
                k_len: u(kk[2]),
                k_dim: u(q[3]),
                v_dim: u(v[3]),
                causal: u32::from(causal),
                scale: s[0] as f32,
                k_head_stride: u(ks[1]),
                k_batch_stride: u(ks[0]),
                v_head_stride: u(vs[1]),
                v_batch_stride: u(vs[0]),
                splits: u(splits),
                keys_per_split: u(chunk),
                tile: u(head.tile),
                offsets: offsets(o),
            };
            let query_blocks = (q[0] * q[1] * q[2].div_ceil(ROWS)) as u64;
            let launch = |section: &str, outs: &[TensorRef<'_>], groups: u64| {
                run(
                    gpu,
                    &key(&shared_op, inputs, outs, &head.variant(section)),
                    SRC,
                    section_of(section),
                    || Ok(head.subst(section)),
                    inputs,
                    outs,
                    groups,
                    params,
                )
            };
            if !backward {
                // Fewer query rows than one workgroup of the row kernel has threads, or a few
                // per head (decoding): workgroups over (row, key split) spread the keys over
                // threads instead, for head sizes up to 256 (a thread per output element).
                if few_queries(q, v) {
                    if positions.is_some() && one_pass(gpu, inputs) {
                        let section = "forward_keys";
                        // An appending kernel writes the cache: its k and v bind as outputs
                        // (at the same bindings), so later reads of the cache wait for it.
                        let (read, written, key_op) = match new_rows {
                            Some(rows) => {
                                let mut written = inputs[1..3].to_vec();
                                written.extend(outputs);
                                written.extend(rows);
                                (&inputs[..1], written, Op::AppendAttention)
                            }
                            None => (inputs, outputs.to_vec(), shared_op),
                        };
                        return run(
                            gpu,
                            &key(&key_op, read, &written, section),
                            SRC,
                            section,
                            || {
                                let mut subst = vec![append_code(new_rows.is_some())];
                                subst.extend(head.subst(section));
                                subst.push(("VECTOR_MATH", wide_helpers(inputs[1].dtype)));
                                Ok(subst)
                            },
                            read,
                            &written,
                            rows as u64,
                            params,
                        );
                    }
                    if new_rows.is_some() {
                        // `launch_append` sends only what `forward_keys` runs.
                        return Err(unsupported(gpu, op));
                    }
                    // One split finishes its rows itself: then the partials are not read, and
                    // their binding holds a word.
                    let words = if splits > 1 {
                        rows * splits * (v[3] + 2)
                    } else {
                        1
                    };
                    let partials = gpu.scratch(4 * words)?;
                    let layout = Layout::contiguous(&[words]);
                    let mut outs = outputs.to_vec();
                    outs.push(TensorRef {
                        buffer: &partials,
                        layout: &layout,
                        dtype: DType::F32,
                    });
                    launch("forward_rows", &outs, (rows * splits) as u64)?;
                    if splits > 1 {
                        launch("forward_combine", &outs, rows as u64)?;
                    }
                    return Ok(());
                }
                let forward = tensor_kernel(gpu, inputs, outputs, causal, AttentionPass::Forward);
                if let Some(kernel) = forward {
                    let groups = q[2].div_ceil(TensorAttention::ROWS as usize);
                    let grid = [groups as u32, (q[0] * q[1]) as u32, 1];
                    let variant = format!("tensor/{}", kernel.head);
                    return run_native(
                        gpu,
                        &key(&shared_op, inputs, outputs, &variant),
                        Source::TensorAttention(kernel),
                        inputs,
                        outputs,
                        grid,
                        kernel.covers(q[2], kk[2]),
                        params,
                    );
                }
                return launch("forward", outputs, query_blocks);
            }
            let out_and_lse = [inputs[3], inputs[4]];
            let pass = AttentionPass::ScoresGradient;
            let scores_kernel = tensor_kernel(gpu, inputs, &out_and_lse, causal, pass);
            let products = (s[0], causal, scores_kernel);
            if attention_products::backward(gpu, inputs, outputs, products, params)? {
                return Ok(());
            }
            let scratch = gpu.scratch(rows * 4)?;
            let layout = Layout::contiguous(&[rows]);
            let delta = TensorRef {
                buffer: &scratch,
                layout: &layout,
                dtype: DType::F32,
            };
            let mut outs = outputs.to_vec();
            outs.push(delta);
            let key_blocks = (kk[0] * kk[1] * kk[2].div_ceil(ROWS)) as u64;
            // delta = rowsum(dout * out) in f32; a 16-bit `out` is rounded, so then delta is
            // formed as sum_j P_ij dP_ij, as the catalog defines it.
            if inputs[3].dtype == DType::F32 {
                launch("delta", &outs, groups_for(rows))?;
            } else {
                launch("delta_sum", &outs, query_blocks)?;
            }
            launch("dq", &outs, query_blocks)?;
            launch("dk", &outs, key_blocks)?;
            launch("dv", &outs, key_blocks)
        }
        _ => Err(unsupported(gpu, op)),
    }
}

/// The backend's tensor-core attention kernel of `pass` over q, k, v (`inputs`' first three)
/// and the forward's out and lse (`outputs`), where the device has one for these tensors:
/// 16-bit operands of one dtype the device multiplies on cooperative matrices, a head size it
/// is built for, contiguous q, out and lse, contiguous key and value rows, whole groups of
/// query heads per key head, a grid the device allows, and for causal attention no fewer keys
/// than queries (so that every row sees a key).
fn tensor_kernel(
    gpu: &dyn Gpu,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    causal: bool,
    pass: AttentionPass,
) -> Option<TensorAttention> {
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let (out, lse) = (outputs.first()?, outputs.get(1)?);
    let dtype = q.dtype;
    let multiplies = match dtype {
        DType::F16 => gpu.coop_f16(),
        DType::BF16 => gpu.coop_bf16(),
        _ => false,
    };
    let [b, hq, tq, d] = q.layout.shape[..] else {
        return None;
    };
    let [_, hkv, tk, dk] = k.layout.shape[..] else {
        return None;
    };
    let rows_contiguous =
        |t: &TensorRef<'_>| t.layout.strides[3] == 1 && t.layout.strides[2] == t.layout.shape[3];
    let head = TensorAttention::HEADS
        .into_iter()
        .find(|&h| h as usize == d)?;
    let max_groups = gpu.caps().limits.max_workgroups_per_dim;
    let blocks = tq.div_ceil(TensorAttention::ROWS as usize);
    let grid_fits = b * hq <= max_groups && blocks <= max_groups;
    (gpu.caps().tensor_attention
        && multiplies
        && [k.dtype, v.dtype, out.dtype] == [dtype; 3]
        && lse.dtype == DType::F32
        && dk == d
        && v.layout.shape[3] == d
        && [q, out, lse].iter().all(|t| t.layout.is_contiguous())
        && rows_contiguous(k)
        && rows_contiguous(v)
        && hkv > 0
        && hq.is_multiple_of(hkv)
        && grid_fits
        && (!causal || tk >= tq))
        .then_some(TensorAttention { dtype, head, pass })
}

/// The fewest keys a split of forward_rows takes.
const MIN_KEYS_PER_SPLIT: usize = 64;

/// How forward_rows splits `keys` keys for `rows` query rows: (splits, keys per split), at
/// least [`MIN_KEYS_PER_SPLIT`] keys per split and about 256 workgroups in all, so that a
/// decoding step with a few heads still fills the GPU.
fn key_splits(rows: usize, keys: usize) -> (usize, usize) {
    let per_row = (256 / rows.max(1)).max(1);
    let chunk = keys.div_ceil(per_row).max(MIN_KEYS_PER_SPLIT);
    (keys.div_ceil(chunk).max(1), chunk)
}

/// The WGSL section a generated kernel comes from (dk and dv share one; delta_sum runs the dq
/// section with its own generated parts).
fn section_of(kernel: &str) -> &str {
    match kernel {
        "dk" | "dv" => "dkv",
        "delta_sum" => "dq",
        other => other,
    }
}

/// Head sizes and the tile that fits the adapter's workgroup memory.
struct Head {
    kdim: usize,
    vdim: usize,
    kvec: usize,
    vvec: usize,
    tile: usize,
    /// Whether the head-size loops stay loops over arrays instead of being unrolled over
    /// named registers: head sizes above [`MAX_UNROLLED`], and every head size on CPU drivers,
    /// which gain nothing from registers and compile unrolled code slowly. Looped kernels read
    /// the head sizes and the tile from their parameters, so one kernel serves every head size
    /// up to `4 * cap`: CPU drivers compile each kernel with LLVM when it first runs (seconds
    /// each), and then compile once per dtype, not once per head-size pair.
    looped: bool,
    /// Vec4s a looped kernel's row arrays hold (at least [`LOOPED_CAP`]).
    cap: usize,
    /// Vec4s each streamed tile of a looped kernel holds: as many as the adapter's workgroup
    /// memory has room for beside the other tile and the rows' statistics, whatever the head.
    tile_words: usize,
    /// The dtype of a cached attention's positions, which decide the keys each query sees.
    positions: Option<DType>,
}

/// The largest head size whose rows are unrolled over named vec4 registers. Past it a
/// thread's rows (up to three of them) no longer fit in registers anyway, and unrolled code
/// that large takes minutes to compile on CPU drivers (LLVM, in lavapipe).
const MAX_UNROLLED: usize = 128;

/// The fewest vec4s a looped kernel's row arrays hold: head sizes up to 64 share a kernel, and
/// larger ones one per power of two of their vec4s (up to 128, up to 256, ...).
const LOOPED_CAP: usize = 16;

/// Which head row a loop runs over: a query's or key's (`kvec()` chunks) or a value's.
#[derive(Clone, Copy)]
enum Side {
    K,
    V,
}

/// Code over the vec4 chunks of a head row: unrolled with `#` as the chunk's index (`#u` a
/// literal, `name#` a register), or a loop over `c` up to `kvec()` or `vvec()` with `name#`
/// as `name[c]` of an array of `cap` vec4s.
#[derive(Clone, Copy)]
struct Chunks {
    kvec: usize,
    vvec: usize,
    looped: bool,
    cap: usize,
}

impl Chunks {
    /// The chunks of `side`'s row: their number when unrolled, and the kernel's expression.
    fn count(self, side: Side) -> (usize, &'static str) {
        match side {
            Side::K => (self.kvec, "kvec()"),
            Side::V => (self.vvec, "vvec()"),
        }
    }

    /// `template` for every chunk of `side`'s row.
    fn each(self, side: Side, template: &str) -> String {
        let (n, bound) = self.count(side);
        if self.looped {
            let body = template.replace("#u", "c").replace('#', "[c]");
            format!("for (var c = 0u; c < {bound}; c++) {{\n{body}}}\n")
        } else {
            each(n, template)
        }
    }

    /// Registers `name#` set to `value` (which may use `#u`).
    fn regs(self, side: Side, name: &str, value: &str) -> String {
        if self.looped {
            format!("var {name}: array<vec4<f32>, {}>;\n", self.cap)
                + &self.each(side, &format!("{name}# = {value};\n"))
        } else {
            each(self.count(side).0, &format!("let {name}# = {value};\n"))
        }
    }

    /// Zeroed accumulators `acc#`.
    fn zeros(self, side: Side) -> String {
        if self.looped {
            format!("var acc: array<vec4<f32>, {}>;\n", self.cap)
        } else {
            each(self.count(side).0, "var acc# = vec4<f32>(0.0);\n")
        }
    }

    /// The dot product of registers `reg#` with `tile[base + #]`: statements to run first and
    /// the expression (looped: a sum named `sum`).
    fn dot(self, reg: &str, tile: &str, base: &str, side: Side, sum: &str) -> (String, String) {
        if self.looped {
            let stmts = format!("var {sum} = 0.0;\n")
                + &self.each(
                    side,
                    &format!("{sum} += dot({reg}#, {tile}[{base} + #u]);\n"),
                );
            (stmts, sum.to_string())
        } else {
            (
                String::new(),
                dot_chain(reg, tile, base, self.count(side).0),
            )
        }
    }
}

/// Kernels whose code does not depend on the head sizes (they read them from parameters).
fn any_head(kernel: &str) -> bool {
    matches!(
        kernel,
        "forward_rows" | "forward_keys" | "forward_combine" | "delta"
    )
}

impl Head {
    fn new(
        gpu: &dyn Gpu,
        op: &Op,
        kdim: usize,
        vdim: usize,
        backward: bool,
        positions: Option<DType>,
    ) -> Result<Head> {
        let (kvec, vvec) = (kdim.div_ceil(4).max(1), vdim.div_ceil(4).max(1));
        let looped = gpu.is_cpu() || kdim.max(vdim) > MAX_UNROLLED;
        let cap = kvec.max(vvec).next_power_of_two().max(LOOPED_CAP);
        let tile_words =
            (gpu.workgroup_memory().saturating_sub(8 * MAX_TILE) / 32).min(MAX_TILE * cap);
        let (fit, row_bytes) = if looped {
            (tile_words / kvec.max(vvec), kvec.max(vvec) * 32 + 8)
        } else {
            let row_bytes = (kvec + vvec) * 16 + if backward { 8 } else { 0 };
            (gpu.workgroup_memory() / row_bytes, row_bytes)
        };
        let tile = (fit.min(MAX_TILE) / 4) * 4;
        if tile == 0 {
            return Err(Error::unsupported(
                "wgpu",
                format!(
                    "{} with head sizes {kdim} and {vdim} (a tile of four rows needs {} bytes of \
                     workgroup memory; the adapter has {})",
                    op.name(),
                    row_bytes * 4,
                    gpu.workgroup_memory()
                ),
            ));
        }
        Ok(Head {
            kdim,
            vdim,
            kvec,
            vvec,
            tile,
            looped,
            cap,
            tile_words,
            positions,
        })
    }

    /// The pipeline variant of `kernel`: what its generated code depends on.
    fn variant(&self, kernel: &str) -> String {
        if any_head(kernel) {
            kernel.to_string()
        } else if self.looped {
            format!("{kernel}/looped{}", self.cap)
        } else {
            format!("{kernel}/{}/{}/{}", self.kdim, self.vdim, self.tile)
        }
    }

    /// The head sizes and tile as the kernel sees them: constants of unrolled kernels, or
    /// read from the parameters (`k_dim`, `v_dim`, `tile`) by looped ones and by the kernels
    /// whose code serves any head.
    fn sizes(&self, kernel: &str) -> String {
        let (kdim, vdim, kvec, vvec, tile, awords, bwords, trows);
        if self.looped || any_head(kernel) {
            (kdim, vdim, tile) = (
                "params.k_dim".into(),
                "params.v_dim".into(),
                "params.tile".into(),
            );
            kvec = "max((params.k_dim + 3u) / 4u, 1u)".to_string();
            vvec = "max((params.v_dim + 3u) / 4u, 1u)".to_string();
            (awords, bwords, trows) = (self.tile_words, self.tile_words, MAX_TILE);
        } else {
            (kdim, vdim) = (format!("{}u", self.kdim), format!("{}u", self.vdim));
            (kvec, vvec) = (format!("{}u", self.kvec), format!("{}u", self.vvec));
            tile = format!("{}u", self.tile);
            awords = self.tile * self.kvec;
            bwords = self.tile * self.vvec;
            trows = self.tile;
        }
        format!(
            "fn kdim() -> u32 {{ return {kdim}; }}\nfn vdim() -> u32 {{ return {vdim}; }}\n\
             fn kvec() -> u32 {{ return {kvec}; }}\nfn vvec() -> u32 {{ return {vvec}; }}\n\
             fn tile() -> u32 {{ return {tile}; }}\nconst ROWS: u32 = {ROWS}u;\n\
             const AWORDS: u32 = {awords}u;\nconst BWORDS: u32 = {bwords}u;\n\
             const TROWS: u32 = {trows}u;\n"
        )
    }

    /// The generated parts of `kernel`.
    fn subst(&self, kernel: &str) -> Vec<(&'static str, String)> {
        use Side::{K, V};
        let mut helpers = row_loader("q_row", "ld1", "kdim()")
            + &row_loader("k_row", "ld2", "kdim()")
            + &row_loader("v_row", "ld3", "vdim()");
        let four = |f: &dyn Fn(usize) -> String| (0..4).map(f).collect::<String>();
        let ch = Chunks {
            kvec: self.kvec,
            vvec: self.vvec,
            looped: self.looped,
            cap: self.cap,
        };
        // Where the tiles' rows met together start: row `g` of the four.
        let k_at = |base: &str, g: usize| format!("{base} + {g}u * kvec()");
        let v_at = |base: &str, g: usize| format!("{base} + {g}u * vvec()");
        let (load, zero, scores, rescale, update, store);
        match kernel {
            "forward" => {
                helpers += &row_storer("out_row", "st4", "vdim()");
                helpers += &tile_filler("fill_a", "ta", "k_row", "kvec()", "kdim()");
                helpers += &tile_filler("fill_b", "tb", "v_row", "vvec()", "vdim()");
                load = ch.regs(K, "q", "scale * q_row(qb, #u)");
                zero = ch.zeros(V);
                scores = four(&|g| {
                    let (pre, qk) = ch.dot("q", "ta", &k_at("a0", g), K, &format!("qk{g}"));
                    format!("{pre}let s{g} = select(-inf(), {qk}, j0 + jj + {g}u < lim);\n")
                });
                rescale = ch.each(V, "acc# *= alpha;\n");
                update = accumulate(ch, V, "p", "tb", "b0", "vvec()");
                store = ch.each(V, "out_row(o(4u) + row * vdim(), #u, acc# * inv);\n");
            }
            "dq" | "delta_sum" => {
                helpers += &row_loader("do_row", "ld6", "vdim()");
                helpers += &row_storer("dq_row", "st7", "kdim()");
                helpers += &tile_filler("fill_a", "ta", "k_row", "kvec()", "kdim()");
                helpers += &tile_filler("fill_b", "tb", "v_row", "vvec()", "vdim()");
                load =
                    ch.regs(K, "q", "scale * q_row(qb, #u)") + &ch.regs(V, "g", "do_row(gb, #u)");
                // dq weighs k_j by P_ij (dP_ij - delta_i); delta_sum adds up P_ij dP_ij.
                let weight = if kernel == "dq" {
                    "* ({} - delta)"
                } else {
                    "* {}"
                };
                scores = four(&|g| {
                    let (pre_s, qk) = ch.dot("q", "ta", &k_at("a0", g), K, &format!("qk{g}"));
                    let (pre_p, dp) = ch.dot("g", "tb", &v_at("b0", g), V, &format!("dp{g}"));
                    format!(
                        "{pre_s}{pre_p}let d{g} = select(0.0, exp({qk} - lse) {}, j0 + jj + {g}u < lim);\n",
                        weight.replace("{}", &dp)
                    )
                });
                rescale = String::new();
                if kernel == "dq" {
                    zero = ch.zeros(K);
                    update = accumulate(ch, K, "d", "ta", "a0", "kvec()");
                    store = ch.each(K, "dq_row(o(7u) + row * kdim(), #u, acc# * scale);\n");
                } else {
                    zero = "var total = 0.0;\n".to_string();
                    update = "total += (d0 + d1) + (d2 + d3);\n".to_string();
                    store = "st10(o(10u) + row, total);\n".to_string();
                }
            }
            "dk" | "dv" => {
                helpers += &row_loader("do_row", "ld6", "vdim()");
                helpers += &tile_filler("fill_a", "ta", "q_row", "kvec()", "kdim()");
                helpers += &tile_filler("fill_b", "tb", "do_row", "vvec()", "vdim()");
                load = ch.regs(K, "k", "scale * k_row(kb, #u)")
                    + &if kernel == "dk" {
                        ch.regs(V, "v", "v_row(vb, #u)")
                    } else {
                        String::new()
                    };
                let visible = |g: usize| {
                    format!("ii + {g}u < cnt && i0 + ii + {g}u >= mine && r{g}.x != -inf()")
                };
                let score = |g: usize| ch.dot("k", "ta", &k_at("a0", g), K, &format!("qk{g}"));
                rescale = String::new();
                if kernel == "dk" {
                    helpers += &row_storer("dk_row", "st8", "kdim()");
                    zero = ch.zeros(K);
                    scores = four(&|g| {
                        let (pre_s, qk) = score(g);
                        let (pre_p, dp) = ch.dot("v", "tb", &v_at("b0", g), V, &format!("dp{g}"));
                        format!(
                            "let r{g} = trow[ii + {g}u];\n{pre_s}{pre_p}let d{g} = select(0.0, exp({qk} - r{g}.x) * ({dp} - r{g}.y), {});\n",
                            visible(g)
                        )
                    });
                    update = accumulate(ch, K, "d", "ta", "a0", "kvec()");
                    store = ch.each(K, "dk_row(o(8u) + kr * kdim(), #u, acc# * scale);\n");
                } else {
                    helpers += &row_storer("dv_row", "st9", "vdim()");
                    zero = ch.zeros(V);
                    scores = four(&|g| {
                        let (pre_s, qk) = score(g);
                        format!(
                            "let r{g} = trow[ii + {g}u];\n{pre_s}let d{g} = select(0.0, exp({qk} - r{g}.x), {});\n",
                            visible(g)
                        )
                    });
                    update = accumulate(ch, V, "d", "tb", "b0", "vvec()");
                    store = ch.each(V, "dv_row(o(9u) + kr * vdim(), #u, acc#);\n");
                }
            }
            _ => {
                load = String::new();
                zero = String::new();
                scores = String::new();
                rescale = String::new();
                update = String::new();
                store = String::new();
            }
        }
        vec![
            ("SIZES", self.sizes(kernel)),
            ("VISIBILITY", visibility(self.positions)),
            ("HELPERS", helpers),
            ("LOAD_REGS", load),
            ("ZERO_ACC", zero),
            ("SCORES", scores),
            ("RESCALE", rescale),
            ("UPDATE", update),
            ("STORE", store),
        ]
    }
}

/// Whether a forward pass of queries `q` (values of head size `v[3]`) has few rows or few per
/// head, and heads of at most 256: the kernels of a workgroup per row.
fn few_queries(q: &[usize], v: &[usize]) -> bool {
    let rows = q[0] * q[1] * q[2];
    (rows < FEW_ROWS || q[2] <= FEW_QUERIES) && q[3] <= 256 && v[3] <= 256
}

/// Whether a cached attention over `inputs` (q, k, v, positions) runs `forward_keys`: a cache
/// of at most [`MAX_ONE_PASS_KEYS`] rows, keys and values read as the same 16-byte vectors,
/// and heads of at least one vector (the kernel loads a key's first vector unguarded).
fn one_pass(gpu: &dyn Gpu, inputs: &[TensorRef<'_>]) -> bool {
    let k_wide = wide_along(gpu, &inputs[1], 3);
    inputs[1].layout.shape[2] <= MAX_ONE_PASS_KEYS
        && inputs[1].layout.shape[3] > 0
        && inputs[2].layout.shape[3] > 0
        && k_wide.is_some()
        && k_wide == wide_along(gpu, &inputs[2], 3)
}

/// `AppendAttention` (q, kv, positions, kv_new; outputs out and the cache, kv in place): one
/// `forward_keys` kernel that writes each head's new row before it reads the cache, where one
/// query per head meets a head of its own (no grouped heads, whose workgroups would share a
/// row), every operand fits a binding and the cache is written in place; otherwise the cache
/// write, then the cached attention ([`index_copy_then_attention`]), each launched by `whole`.
pub(crate) fn launch_append(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
    whole: &LaunchOp<'_>,
) -> Result<()> {
    let (q, positions, new, cache) = (inputs[0], inputs[2], inputs[3], outputs[1]);
    // Keys and values of the cache and of the new rows.
    let halves = [
        cache.layout.select_first(0),
        cache.layout.select_first(1),
        new.layout.select_first(0),
        new.layout.select_first(1),
    ];
    let cached = [
        q,
        cache.with_layout(&halves[0]),
        cache.with_layout(&halves[1]),
        positions,
        new.with_layout(&halves[2]),
        new.with_layout(&halves[3]),
    ];
    let (qs, kvs) = (&q.layout.shape, &cache.layout.shape);
    let fused = qs[2] == 1
        && qs[1] == kvs[2]
        && few_queries(qs, qs)
        && one_pass(gpu, &cached)
        && cached[4..]
            .iter()
            .all(|t| wide_along(gpu, t, 3) == wide_along(gpu, &cached[1], 3))
        && gpu.fits(&cached)
        && gpu.fits(outputs)
        && Arc::ptr_eq(cache.buffer, inputs[1].buffer)
        && cache.layout == inputs[1].layout;
    if fused {
        return launch(gpu, &Op::CachedAttention, &cached, &outputs[..1], s);
    }
    index_copy_then_attention(op, inputs, outputs, s, whole)
}

/// `visible(i)` (the keys query `i` sees), `keys_seen(i0, i1)` (the most that queries
/// `i0..i1` see) and `store_lse(row, v)`: attention's causal rule and its log-sum-exp output,
/// or a cached attention's keys up to each query's position (`positions` is their dtype, at
/// binding 5: negative ones see nothing, those past the cache all of it), `position_of(i)`
/// and no log-sum-exp.
fn visibility(positions: Option<DType>) -> String {
    let Some(dtype) = positions else {
        return "fn visible(i: u32) -> u32 { return causal_visible(i); }\n\
                fn keys_seen(i0: u32, i1: u32) -> u32 { return visible(i1 - 1u); }\n\
                fn store_lse(row: u32, v: f32) { st5(o(5u) + row, v); }\n"
            .to_string();
    };
    // The position as a u32 (`position_of`: u32::MAX where negative, so never a cache row).
    let raw = match dtype {
        DType::U32 => "return ldn5(o(5u) + i);",
        _ => "let s = ldn5(o(5u) + i);\n    return select(u32(s), 0xffffffffu, s < 0);",
    };
    // The position as a u32 `p`, where it is not negative.
    let position = match dtype {
        DType::U32 => "let p = ldn5(o(5u) + i);",
        _ => "let s = ldn5(o(5u) + i);\n    if (s < 0) { return 0u; }\n    let p = u32(s);",
    };
    format!(
        "fn position_of(i: u32) -> u32 {{\n    {raw}\n}}\n\
         fn visible(i: u32) -> u32 {{\n    {position}\n    \
         return select(p + 1u, params.k_len, p >= params.k_len);\n}}\n\
         fn keys_seen(i0: u32, i1: u32) -> u32 {{\n    var n = 0u;\n    \
         for (var i = i0; i < i1; i++) {{ n = max(n, visible(i)); }}\n    return n;\n}}\n\
         fn store_lse(row: u32, v: f32) {{}}\n"
    )
}

/// The `forward_keys` functions around the cache: `key_vec(kb, j, at, bh, c)` and
/// `value_vec(vb, j, at, bh, c)`, vector `c` of key or value row `j`; `appended_row(row)`, the
/// cache row `at` that the row's new key and value go to; and `store_appended(bh, kb, vb, lid,
/// at)`. Where `append` (an `AppendAttention` of one query per head), the kernel reads row
/// `at` from the new rows (bindings 6 and 7), not from the cache, and the workgroup's first
/// threads store them into the cache once every thread has read what it reads of the cache
/// (positions past the cache store nothing): nothing waits on the store, and nothing races
/// it. Both rows are loaded and one selected, without a branch: a load in a branch is waited
/// for where the branches meet. Otherwise `at` is `u32::MAX`, no row.
fn append_code(append: bool) -> (&'static str, String) {
    let code = if append {
        "fn appended_row(row: u32) -> u32 {\n\
         \x20   let at = position_of(row % params.q_len);\n\
         \x20   return select(0xffffffffu, at, at < params.k_len);\n\
         }\n\
         fn store_appended(bh: u32, kb: u32, vb: u32, lid: u32, at: u32) {\n\
         \x20   if (at >= params.k_len) { return; }\n\
         \x20   let kvecs = params.k_dim / VEC;\n\
         \x20   let vvecs = params.v_dim / VEC;\n\
         \x20   if (lid < kvecs) { stv2(kb + at * kvecs + lid, ldv6(o(6u) / VEC + bh * kvecs + lid)); }\n\
         \x20   if (lid < vvecs) { stv3(vb + at * vvecs + lid, ldv7(o(7u) / VEC + bh * vvecs + lid)); }\n\
         }\n\
         fn key_vec(kb: u32, j: u32, at: u32, bh: u32, c: u32) -> vec4<u32> {\n\
         \x20   let kvecs = params.k_dim / VEC;\n\
         \x20   let cached = ldv2(kb + j * kvecs + c);\n\
         \x20   return select(cached, ldv6(o(6u) / VEC + bh * kvecs + c), j == at);\n\
         }\n\
         fn value_vec(vb: u32, j: u32, at: u32, bh: u32, c: u32) -> vec4<u32> {\n\
         \x20   let vvecs = params.v_dim / VEC;\n\
         \x20   let cached = ldv3(vb + j * vvecs + c);\n\
         \x20   return select(cached, ldv7(o(7u) / VEC + bh * vvecs + c), j == at);\n\
         }\n"
    } else {
        "fn appended_row(row: u32) -> u32 {\n\
         \x20   return 0xffffffffu;\n\
         }\n\
         fn store_appended(bh: u32, kb: u32, vb: u32, lid: u32, at: u32) {}\n\
         fn key_vec(kb: u32, j: u32, at: u32, bh: u32, c: u32) -> vec4<u32> {\n\
         \x20   return ldv2(kb + j * (params.k_dim / VEC) + c);\n\
         }\n\
         fn value_vec(vb: u32, j: u32, at: u32, bh: u32, c: u32) -> vec4<u32> {\n\
         \x20   return ldv3(vb + j * (params.v_dim / VEC) + c);\n\
         }\n"
    };
    ("APPEND", code.to_string())
}

/// `template` once per vec4 index `0..n`, with `#` replaced by the index.
fn each(n: usize, template: &str) -> String {
    (0..n)
        .map(|c| template.replace('#', &c.to_string()))
        .collect()
}

/// The dot product of registers `reg0..` with `tile[base + 0..]`, as two interleaved partial
/// sums so that the additions do not form one dependent chain.
fn dot_chain(reg: &str, tile: &str, base: &str, n: usize) -> String {
    let term = |c: usize| format!("dot({reg}{c}, {tile}[{base} + {c}u])");
    let half = |start: usize| {
        let terms: Vec<String> = (start..n).step_by(2).map(term).collect();
        if terms.is_empty() {
            "0.0".to_string()
        } else {
            terms.join(" + ")
        }
    };
    format!("(({}) + ({}))", half(0), half(1))
}

/// `acc# += w0 * tile[...] + ... + w3 * tile[...]` over the four rows met at once.
fn accumulate(ch: Chunks, side: Side, weight: &str, tile: &str, base: &str, width: &str) -> String {
    let rows: Vec<String> = (0..4)
        .map(|g| {
            let at = if g == 0 {
                "0u".to_string()
            } else {
                format!("{g}u * {width}")
            };
            format!("{weight}{g} * {tile}[{base} + {at} + #u]")
        })
        .collect();
    ch.each(side, &format!("acc# += {};\n", rows.join(" + ")))
}

/// `fn name(base, c) -> vec4<f32>`: elements `4c..4c + 3` of a row at `base`, zeros past `dim`.
fn row_loader(name: &str, ld: &str, dim: &str) -> String {
    let lanes: String = ["x", "y", "z", "w"]
        .iter()
        .enumerate()
        .map(|(t, lane)| {
            format!("    if (i + {t}u < {dim}) {{ x.{lane} = {ld}(base + i + {t}u); }}\n")
        })
        .collect();
    format!(
        "fn {name}(base: u32, c: u32) -> vec4<f32> {{\n    var x = vec4<f32>(0.0);\n    let i = 4u * c;\n{lanes}    return x;\n}}\n"
    )
}

/// `fn name(base, c, x)`: stores the lanes of `x` that fall inside a row of `dim`.
fn row_storer(name: &str, st: &str, dim: &str) -> String {
    let lanes: String = ["x", "y", "z", "w"]
        .iter()
        .enumerate()
        .map(|(t, lane)| {
            format!("    if (i + {t}u < {dim}) {{ {st}(base + i + {t}u, x.{lane}); }}\n")
        })
        .collect();
    format!("fn {name}(base: u32, c: u32, x: vec4<f32>) {{\n    let i = 4u * c;\n{lanes}}}\n")
}

/// `fn name(base, cnt, lid)`: the workgroup copies rows `0..cnt` at `base` into `tile` (rows
/// past `cnt` as zeros, so that masked products stay finite).
fn tile_filler(name: &str, tile: &str, loader: &str, vecs: &str, dim: &str) -> String {
    format!(
        "fn {name}(base: u32, cnt: u32, lid: u32) {{\n    for (var e = lid; e < tile() * {vecs}; e += ROWS) {{\n        \
         let r = e / {vecs};\n        var x = vec4<f32>(0.0);\n        \
         if (r < cnt) {{ x = {loader}(base + r * {dim}, e % {vecs}); }}\n        {tile}[e] = x;\n    }}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_core::{Buffer, DType, Error, Limits, Op, Result};

    use super::{append_code, section_of, wide_helpers, AttentionParams, Head, SRC};
    use crate::gpu::{Build, Caps, Dispatch, Gpu, Source};
    use crate::params::ParamBlock;
    use crate::source::source;

    /// A device that only describes itself: enough to generate kernels, never to run them.
    struct Described(Caps);

    impl Gpu for Described {
        fn caps(&self) -> &Caps {
            &self.0
        }
        fn backend(&self) -> &str {
            "described"
        }
        fn scratch(&self, _: usize) -> Result<Arc<dyn Buffer>> {
            Err(Error::unsupported("described", "scratch"))
        }
        fn capacity(&self, _: &Arc<dyn Buffer>) -> Result<u64> {
            Err(Error::unsupported("described", "buffers"))
        }
        fn dispatch(&self, _: &Dispatch<'_>, _: &mut dyn FnMut() -> Result<Source>) -> Result<()> {
            Err(Error::unsupported("described", "dispatch"))
        }
    }

    fn device(cpu: bool) -> Described {
        Described(Caps {
            limits: Limits {
                max_buffer_bytes: 1 << 30,
                max_binding_bytes: 1 << 27,
                binding_align: 256,
                max_workgroup_size: 256,
                max_workgroups_per_dim: 65535,
                memory_bytes: None,
            },
            workgroup_memory: 32 << 10,
            coop_f16: false,
            coop_bf16: false,
            tensor_matmul: false,
            tensor_attention: false,
            cpu,
            immediate_words: 64,
            subgroups: true,
        })
    }

    /// The one-pass cached attention is valid WGSL for every dtype it reads wide, with i32
    /// and u32 positions, appending to its cache or not.
    #[test]
    fn the_one_pass_cached_attention_is_valid_wgsl() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for positions in [DType::I32, DType::U32] {
                let head = Head::new(
                    &device(false),
                    &Op::CachedAttention,
                    64,
                    64,
                    false,
                    Some(positions),
                )
                .unwrap();
                // Appending, the cache's keys and values bind as outputs, and the new rows
                // after the positions.
                for append in [false, true] {
                    let mut subst = vec![append_code(append)];
                    subst.extend(head.subst("forward_keys"));
                    subst.push(("VECTOR_MATH", wide_helpers(dtype)));
                    let mut bindings = vec![
                        (dtype, false),
                        (dtype, append),
                        (dtype, append),
                        (dtype, true),
                        (positions, true),
                    ];
                    if append {
                        bindings.extend([(dtype, true), (dtype, true)]);
                    }
                    let build = Build {
                        immediate_words: Some(64),
                        subgroups: true,
                    };
                    let params = AttentionParams::wgsl();
                    let src = source(SRC, "forward_keys", &bindings, &subst, build, &params);
                    assert!(src.contains("var<storage, read_write> b3: array<vec4<u32>>"));
                    let what = format!("forward_keys {dtype:?} {positions:?} append {append}");
                    crate::source::assert_valid(&src, &what);
                }
            }
        }
    }

    /// Every attention kernel, and the forward kernels of a cached attention with i32 and u32
    /// positions, parse and validate as generated for GPUs (unrolled) and CPU drivers
    /// (looped): lavapipe, which runs the conformance suite here, compiles only the latter.
    #[test]
    fn attention_kernels_are_valid_wgsl_unrolled_and_looped() {
        let forward = ["forward", "forward_rows", "forward_combine"];
        let backward = ["delta", "delta_sum", "dq", "dk", "dv"];
        let f32 = |output| (DType::F32, output);
        let cases = [None, Some(DType::I32), Some(DType::U32)];
        for (cpu, positions, (kdim, vdim)) in [false, true].into_iter().flat_map(|cpu| {
            cases
                .into_iter()
                .flat_map(move |p| [(64, 64), (128, 80)].map(|dims| (cpu, p, dims)))
        }) {
            let op = match positions {
                Some(_) => Op::CachedAttention,
                None => Op::Attention { causal: true },
            };
            let gpu = device(cpu);
            let kernels = forward.iter().map(|k| (k, false)).chain(
                backward
                    .iter()
                    .filter(|_| positions.is_none())
                    .map(|k| (k, true)),
            );
            for (kernel, is_backward) in kernels {
                let head = Head::new(&gpu, &op, kdim, vdim, is_backward, positions).unwrap();
                let bindings = if is_backward {
                    [[f32(false); 6].as_slice(), &[f32(true); 4]].concat()
                } else {
                    let fifth = positions.map_or(f32(true), |d| (d, true));
                    vec![
                        f32(false),
                        f32(false),
                        f32(false),
                        f32(true),
                        fifth,
                        f32(true),
                    ]
                };
                let build = Build {
                    immediate_words: Some(64),
                    subgroups: !cpu,
                };
                let src = source(
                    SRC,
                    section_of(kernel),
                    &bindings,
                    &head.subst(kernel),
                    build,
                    &AttentionParams::wgsl(),
                );
                let what = format!("{op:?} {kernel} cpu {cpu} heads {kdim}/{vdim}");
                crate::source::assert_valid(&src, &what);
            }
        }
    }
}
