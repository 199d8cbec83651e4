//! Attention's forward on tensor cores, written as SPIR-V ([`TensorAttention`]): flash
//! attention on workgroup-scope cooperative matrices (`VK_NV_cooperative_matrix2`), with the
//! builder of the tensor-core matmul (`tensor_matmul.rs`). It stands in for the WGSL forward
//! kernel (`kernels/attention.wgsl`), which computes every score a thread per row; it reads
//! the same parameter block and binds the same tensors (q, k, v, out, lse).
//!
//! Each workgroup takes [`TensorAttention::ROWS`] query rows of one (batch, head) and walks
//! the keys they see in blocks of `head` (the head size, so that a block's scores and the
//! output are matrices of one type). Per block, with every sum in f32:
//!
//! 1. `S = scale * q k^T` on tensor cores; scores of keys a row does not see (past the keys,
//!    or after it where causal) become `HIDDEN`;
//! 2. the online softmax: the rows' running maximum `m`, `P = exp(S - m)`, the running sum
//!    `l` rescaled by `exp(m_old - m)` plus `P`'s row sums (reductions over rows);
//! 3. `O = O exp(m_old - m) + P v`, with `P` as the sum of two matrices of the operands'
//!    dtype (`hi`, rounded, and `lo`, what rounding left out), since tensor cores take only
//!    that dtype: one rounding of `P` to bf16 (8 significant bits) would cost the output
//!    more than its own rounding does.
//!
//! At the end each row's `O / l` is stored (bf16 rounded to nearest even first, as the WGSL
//! kernels round), and `m + ln l`, the log-sum-exp the backward pass reads.
//!
//! **Compiled per launch** where the rows and keys fill whole blocks
//! ([`TensorAttention::covers`]): its parameters become constants and its loads do not clamp,
//! as in the matmul. On the H200 (causal, head size 64, 1,024 tokens, FlashAttention's FLOP
//! count): f16 35.8 TFLOP/s reading the sizes, 58.8 compiled so; bf16 33.4 and 50.4; the
//! WGSL kernel about 13.6. Tried and not kept (each about 5% or noise): the row sums as a
//! product with a matrix of ones, masking only the blocks that hide scores. Dropping `lo`
//! gained about 30% but misses the f16 tolerance. The rounding of `hi` is done with integer
//! operations: formed by a conversion to 16 bits and back, NVIDIA's compiler may fold the
//! pair away and leave `lo` zero (an f16 output then missed its tolerance).
//!
//! The backward pass runs as products (`tessera-wgsl`'s `attention_products.rs`); the scores'
//! probabilities and gradients between them come from a second kernel written with the same
//! setup ([`HeadRows`]), `tensor_scores_gradient.rs`. A whole flash backward on these matrices
//! would take two deterministic kernels recomputing `S` and `P` (key blocks for `dk` and `dv`,
//! query blocks for `dq`; FlashAttention adds `dq` with atomics), with 12 products of
//! `64 x 64 x 64` per pair of blocks against the forward's 3, since every 16-bit operand of
//! a gradient's product is split in two (`attention_products.rs`). `delta` as
//! `rowsum(dout * out)`, FlashAttention's shortcut, inherits `out`'s rounding, which the
//! catalog's reference avoids (it forms `delta` from `P` and `dP`), and misses the catalog's
//! tolerance: computed in f64 on the conformance suite's problems (random inputs as its
//! samples draw them), with only `out` rounded, bf16's `dq` missed by up to 6.4 times
//! (causal, 17 rows), 2.0-3.4 (33 rows, head size 128) and 1.2 (600 rows); f16's by 1.1
//! (17 rows). ggml-vulkan's `flash_attn_cm2.comp` (forward only) sums rows as a
//! product with a matrix of ones and splits keys over workgroups when there are few.

use rspirv::binary::Assemble;
use rspirv::spirv::{
    Capability, CooperativeMatrixReduce, FunctionControl, LoopControl, Op, SelectionControl,
    StorageClass, TensorClampMode, Word,
};
use tessera_wgsl::{attention_param_word, attention_param_words, TensorAttention};

use crate::tensor_matmul::{
    build, scalar, ParamBlock, Scalar, Writer, USE_A, USE_ACCUMULATOR, USE_B,
};

/// The score of a key a row does not see: -f32::MAX / 2, finite so that the difference of two
/// such scores stays finite (no NaN from `inf - inf`) and its exponential is zero.
const HIDDEN: u32 = 0xfeff_ffff;

/// GLSL.std.450 instructions.
pub(crate) const EXP: u32 = 27;
const LOG: u32 = 28;

/// The forward kernel's SPIR-V words, reading its parameter block or compiled for the block
/// `fixed` alone; or what stops it (a dtype or head size it does not take).
pub(crate) fn spirv(kernel: &TensorAttention, fixed: Option<&[u32]>) -> Result<Vec<u32>, String> {
    let (s, block, exact) = prepare(kernel, fixed)?;
    let mut w = Writer::new(s, s, block);
    w.fixed = fixed.map(<[u32]>::to_vec);
    w.declare_module(&[
        Capability::CooperativeMatrixReductionsNV,
        Capability::CooperativeMatrixConversionsNV,
        Capability::CooperativeMatrixPerElementOperationsNV,
    ]);
    // Bindings 1 to 5: q, k, v, the output, the log-sum-exp; the operands as 16-byte vectors
    // where the blocks cover them, so that their loads are known aligned.
    let buffers = [
        w.buffer(s, 1, false, exact),
        w.buffer(s, 2, false, exact),
        w.buffer(s, 3, false, exact),
        w.buffer(s, 4, true, false),
        w.buffer(Scalar::F32, 5, true, false),
    ];
    let fns = Functions::declare(&mut w, buffers[4]);
    main(&mut w, s, kernel.head, &fns, buffers, exact)?;
    fns.emit(&mut w, s)?;
    Ok(w.b.module().assemble())
}

/// What a kernel of either pass is built from: its operands' dtype (16 bits), the parameter
/// block it reads, and whether `fixed` (where given) lets its blocks cover the rows and keys
/// exactly, so that its loads and stores need no clamping; or what stops it (a dtype or head
/// size it does not take).
pub(crate) fn prepare(
    kernel: &TensorAttention,
    fixed: Option<&[u32]>,
) -> Result<(Scalar, ParamBlock, bool), String> {
    let s = scalar(kernel.dtype)?;
    if s == Scalar::F32 {
        return Err("a tensor-core attention of f32 operands".into());
    }
    if !TensorAttention::HEADS.contains(&kernel.head) {
        return Err(format!(
            "a tensor-core attention of head size {}",
            kernel.head
        ));
    }
    let block = ParamBlock {
        words: attention_param_words(),
        word_of: attention_param_word,
    };
    let exact = fixed.is_some_and(|words| blocks_cover(kernel, words));
    Ok((s, block, exact))
}

/// Whether the blocks of `kernel` cover the rows of parameter block `words` exactly
/// ([`TensorAttention::covers`]).
fn blocks_cover(kernel: &TensorAttention, words: &[u32]) -> bool {
    let word = |field| attention_param_word(field).and_then(|at| words.get(at).copied());
    match [word("q_len"), word("k_len")] {
        [Some(q_len), Some(k_len)] => kernel.covers(q_len as usize, k_len as usize),
        _ => false,
    }
}

/// The entry point: one workgroup's rows of one (batch, head), over `buffers` (q, k, v, out,
/// lse); `exact` where the blocks cover the rows (loads and stores need no clamping).
fn main(
    w: &mut Writer,
    s: Scalar,
    head: u32,
    fns: &Functions,
    buffers: [Word; 5],
    exact: bool,
) -> Result<(), String> {
    let [q_var, k_var, v_var, o_var, lse_var] = buffers;
    let (rows, d) = (TensorAttention::ROWS, head);
    let u = w.u32;
    let mats = Mats::declare(w, s, d);
    let (a_mat, b_mat, sums, sums16) = (mats.a, mats.b, mats.sums, mats.sums16);
    let (zero_b, zero_sums) = (mats.zero_b, mats.zero_sums);
    let hidden = w.constant(f32::from_bits(HIDDEN));
    let hidden_sums = w.b.constant_composite(sums, [hidden]);

    let params = w.declare_params();
    let (wid_var, uvec3) = w.workgroup_id();
    let zero = w.uint(0);
    let view_t = w.transpose_view_type();
    let sums_ptr = w.b.type_pointer(None, StorageClass::Function, sums);
    let u32_ptr = w.b.type_pointer(None, StorageClass::Function, u);
    let entry = w.begin_entry()?;
    let o_sum_var = w.b.variable(sums_ptr, None, StorageClass::Function, None);
    let l_var = w.b.variable(sums_ptr, None, StorageClass::Function, None);
    let m_var = w.b.variable(sums_ptr, None, StorageClass::Function, None);
    let j_var = w.b.variable(u32_ptr, None, StorageClass::Function, None);

    let at = HeadRows::read(w, wid_var, uvec3, d)?;
    let (i0, q_len, k_len, scale) = (at.i0, at.q_len, at.k_len, at.scale);
    let c_d = w.uint(d);
    let q_base = at.base(w, 0, at.head_start)?;
    let o_base = at.base(w, 3, at.head_start)?;
    let lse_base = at.base(w, 4, at.rows_before)?;

    let [q_rows, k_rows, v_rows, o_rows] = Rows::declare(
        w,
        s,
        clamp_mode(exact),
        [
            (q_var, q_base, [q_len, c_d], exact),
            (k_var, at.k_base, [k_len, c_d], exact),
            (v_var, at.v_base, [k_len, c_d], exact),
            (o_var, o_base, [q_len, c_d], false),
        ],
    )?;
    let transpose = w.b.create_tensor_view_nv(view_t, None).map_err(build)?;
    let q = q_rows.load(w, [mats.a, mats.zero_a], i0, [rows, d], None)?;
    let keys_end = at.keys_end;

    w.b.store(o_sum_var, zero_sums, None, []).map_err(build)?;
    w.b.store(l_var, zero_sums, None, []).map_err(build)?;
    w.b.store(m_var, hidden_sums, None, []).map_err(build)?;
    counted_loop(w, j_var, zero, keys_end, c_d, &mut |w, j0| {
        let k_t = k_rows.load(w, [b_mat, zero_b], j0, [d, d], Some(transpose))?;
        let scores =
            w.b.cooperative_matrix_mul_add_khr(sums, None, q, k_t, zero_sums, None)
                .map_err(build)?;
        let scores = w.inst(Op::MatrixTimesScalar, sums, &[scores, scale])?;
        let scores = per_element(w, sums, scores, fns.mask, &[i0, j0])?;
        let row_max = reduce_rows(w, sums, scores, fns.max_of)?;
        let m_old = w.b.load(sums, None, m_var, None, []).map_err(build)?;
        let m_new = per_element(w, sums, row_max, fns.larger, &[m_old])?;
        let p = per_element(w, sums, scores, fns.exp_diff, &[m_new])?;
        let rescale = per_element(w, sums, m_old, fns.exp_diff, &[m_new])?;
        let row_sum = reduce_rows(w, sums, p, fns.sum_of)?;
        let l = w.b.load(sums, None, l_var, None, []).map_err(build)?;
        let l = w.inst(Op::FMul, sums, &[l, rescale])?;
        let l = w.inst(Op::FAdd, sums, &[l, row_sum])?;
        w.b.store(l_var, l, None, []).map_err(build)?;
        w.b.store(m_var, m_new, None, []).map_err(build)?;
        // P as hi + lo in the operands' dtype. `hi` is rounded with integer operations: a
        // conversion to 16 bits and back may be folded away by the driver's compiler (then `lo`
        // is zero: measured, f16 outputs off by the rounding of P).
        let hi = per_element(w, sums, p, fns.split, &[])?;
        let lo = w.inst(Op::FSub, sums, &[p, hi])?;
        let hi16 = w.b.f_convert(sums16, None, hi).map_err(build)?;
        let lo16 = w.b.f_convert(sums16, None, lo).map_err(build)?;
        let p_hi =
            w.b.cooperative_matrix_convert_nv(a_mat, None, hi16)
                .map_err(build)?;
        let p_lo =
            w.b.cooperative_matrix_convert_nv(a_mat, None, lo16)
                .map_err(build)?;
        let v = v_rows.load(w, [b_mat, zero_b], j0, [d, d], None)?;
        let o = w.b.load(sums, None, o_sum_var, None, []).map_err(build)?;
        let o = w.inst(Op::FMul, sums, &[o, rescale])?;
        let o =
            w.b.cooperative_matrix_mul_add_khr(sums, None, p_hi, v, o, None)
                .map_err(build)?;
        let o =
            w.b.cooperative_matrix_mul_add_khr(sums, None, p_lo, v, o, None)
                .map_err(build)?;
        w.b.store(o_sum_var, o, None, []).map_err(build)?;
        Ok(())
    })?;
    let o = w.b.load(sums, None, o_sum_var, None, []).map_err(build)?;
    let l = w.b.load(sums, None, l_var, None, []).map_err(build)?;
    let m = w.b.load(sums, None, m_var, None, []).map_err(build)?;
    // Storing the log-sum-exp returns `l` unchanged; dividing by what it returned keeps the
    // store's call alive.
    let l = per_element(w, sums, l, fns.store_lse, &[m, lse_base, i0])?;
    let out = per_element(w, sums, o, fns.finish, &[l])?;
    let out = w.b.f_convert(sums16, None, out).map_err(build)?;
    o_rows.store(w, out, i0, None, [rows, d])?;
    let interface = vec![q_var, k_var, v_var, o_var, lse_var, params, wid_var];
    w.end_entry(entry, interface, TensorAttention::THREADS)?;
    Ok(())
}

/// The workgroup's rows of one (batch, head) and the keys they see, from the parameters and
/// the workgroup's id (x: the block of rows, y: batch x heads): what both kernels begin with.
pub(crate) struct HeadRows {
    /// The first of the workgroup's query rows, in its head.
    pub(crate) i0: Word,
    /// Rows of the (batch, head) pairs before this one: `bh * q_len`.
    pub(crate) rows_before: Word,
    /// Elements of a head size before this (batch, head)'s first row: `bh * q_len * head`.
    pub(crate) head_start: Word,
    pub(crate) q_len: Word,
    pub(crate) k_len: Word,
    /// The scores' scale, f32.
    pub(crate) scale: Word,
    /// Where the rows' keys end: `k_len`, or (causal) after the last row's own key.
    pub(crate) keys_end: Word,
    /// Where this (batch, head)'s key and value rows start (elements).
    pub(crate) k_base: Word,
    pub(crate) v_base: Word,
}

impl HeadRows {
    pub(crate) fn read(w: &mut Writer, wid_var: Word, uvec3: Word, d: u32) -> Result<Self, String> {
        let (f, u) = (w.float(Scalar::F32), w.u32);
        let wid = w.b.load(uvec3, None, wid_var, None, []).map_err(build)?;
        let block = w.b.composite_extract(u, None, wid, [0]).map_err(build)?;
        let bh = w.b.composite_extract(u, None, wid, [1]).map_err(build)?;
        let heads = w.param("heads", 0)?;
        let kv_heads = w.param("kv_heads", 0)?;
        let q_len = w.param("q_len", 0)?;
        let k_len = w.param("k_len", 0)?;
        let causal = w.param("causal", 0)?;
        let scale = w.param("scale", 0)?;
        let scale = w.b.bitcast(f, None, scale).map_err(build)?;
        let batch = w.op(Op::UDiv, bh, heads)?;
        let h = w.op(Op::UMod, bh, heads)?;
        let group = w.op(Op::UDiv, heads, kv_heads)?;
        let kv_h = w.op(Op::UDiv, h, group)?;
        let c_rows = w.uint(TensorAttention::ROWS);
        let i0 = w.mul(block, c_rows)?;
        let c_d = w.uint(d);
        let rows_before = w.mul(bh, q_len)?;
        let head_start = w.mul(rows_before, c_d)?;
        // k and v step by their strides.
        let kv_base = |w: &mut Writer, which: u32, name: &str| -> Result<Word, String> {
            let offset = w.param("offsets", which)?;
            let batch_stride = w.param(&format!("{name}_batch_stride"), 0)?;
            let head_stride = w.param(&format!("{name}_head_stride"), 0)?;
            let along_batch = w.mul(batch, batch_stride)?;
            let along_heads = w.mul(kv_h, head_stride)?;
            let at = w.add(offset, along_batch)?;
            w.add(at, along_heads)
        };
        let k_base = kv_base(w, 1, "k")?;
        let v_base = kv_base(w, 2, "v")?;
        let diagonal = w.op(Op::ISub, k_len, q_len)?;
        let past_rows = w.add(i0, c_rows)?;
        let reach = w.add(past_rows, diagonal)?;
        let causal_end = w.min(k_len, reach)?;
        let zero = w.uint(0);
        let is_causal = w.b.i_not_equal(w.bool, None, causal, zero).map_err(build)?;
        let keys_end =
            w.b.select(u, None, is_causal, causal_end, k_len)
                .map_err(build)?;
        Ok(HeadRows {
            i0,
            rows_before,
            head_start,
            q_len,
            k_len,
            scale,
            keys_end,
            k_base,
            v_base,
        })
    }

    /// Binding `binding`'s offset (0-based) plus `start`: where a contiguous tensor's part for
    /// this (batch, head) starts.
    pub(crate) fn base(&self, w: &mut Writer, binding: u32, start: Word) -> Result<Word, String> {
        let offset = w.param("offsets", binding)?;
        w.add(offset, start)
    }
}

/// A block's matrix types and zero matrices: a block of scores (`rows` queries over `head`
/// keys, the keys a step) and of the output are `rows x head` sums.
pub(crate) struct Mats {
    pub(crate) a: Word,
    pub(crate) b: Word,
    pub(crate) sums: Word,
    pub(crate) sums16: Word,
    pub(crate) zero_a: Word,
    pub(crate) zero_b: Word,
    pub(crate) zero_sums: Word,
}

impl Mats {
    pub(crate) fn declare(w: &mut Writer, s: Scalar, head: u32) -> Mats {
        let rows = TensorAttention::ROWS;
        let a = w.matrix(s, rows, head, USE_A);
        let b = w.matrix(s, head, head, USE_B);
        let sums = w.matrix(Scalar::F32, rows, head, USE_ACCUMULATOR);
        let sums16 = w.matrix(s, rows, head, USE_ACCUMULATOR);
        let zero_a = w.zeros(s, a);
        let zero_b = w.zeros(s, b);
        let zero_sums = w.zeros(Scalar::F32, sums);
        Mats {
            a,
            b,
            sums,
            sums16,
            zero_a,
            zero_b,
            zero_sums,
        }
    }
}

/// Rows of one tensor's (batch, head), each of contiguous elements: a 16-byte aligned pointer
/// `rem` elements before the first, and their layout (clamping or not).
pub(crate) struct Rows {
    ptr: Word,
    rem: Word,
    layout: Word,
    clamp: TensorClampMode,
}

impl Rows {
    /// The rows of each `(buffer, first element, [rows, row length], bound as 16-byte
    /// vectors)` of `tensors`, of dtype `s`.
    pub(crate) fn declare<const N: usize>(
        w: &mut Writer,
        s: Scalar,
        clamp: TensorClampMode,
        tensors: [(Word, Word, [Word; 2], bool); N],
    ) -> Result<[Rows; N], String> {
        let mut aligned = Vec::new();
        for (var, first, _, vectors) in tensors {
            aligned.push(w.aligned(s, var, first, vectors)?);
        }
        let mut rows = Vec::new();
        for ((ptr, rem), (_, _, dims, _)) in aligned.into_iter().zip(tensors) {
            let layout = rows_layout(w, clamp, dims, rem)?;
            rows.push(Rows {
                ptr,
                rem,
                layout,
                clamp,
            });
        }
        rows.try_into()
            .map_err(|_| "building a tensor-core kernel: rows of tensors".to_string())
    }

    /// `size` of the rows from row `first` (from their first element) as a matrix of type
    /// `of[0]` (elements outside the layout keeping `of[1]`'s), through `transpose` where
    /// given.
    pub(crate) fn load(
        &self,
        w: &mut Writer,
        of: [Word; 2],
        first: Word,
        size: [u32; 2],
        transpose: Option<Word>,
    ) -> Result<Word, String> {
        let slice = w.slice(self.layout, self.clamp, [first, self.rem], size)?;
        // The view is read only where the load transposes.
        let view = transpose.unwrap_or(0);
        w.load_tensor(of[0], self.ptr, of[1], slice, transpose.is_some(), view)
    }

    /// Stores `matrix` over `size` of the rows from row `row`, from element `column` of each
    /// (their first where `None`).
    pub(crate) fn store(
        &self,
        w: &mut Writer,
        matrix: Word,
        row: Word,
        column: Option<Word>,
        size: [u32; 2],
    ) -> Result<(), String> {
        let column = match column {
            Some(column) => w.add(column, self.rem)?,
            None => self.rem,
        };
        let slice = w.slice(self.layout, self.clamp, [row, column], size)?;
        w.store_tensor(self.ptr, matrix, slice)
    }
}

/// A loop of `body` over `var` from `start` while below `end`, stepping by `step`; `var` holds
/// the first value not below `end` after it.
pub(crate) fn counted_loop(
    w: &mut Writer,
    var: Word,
    start: Word,
    end: Word,
    step: Word,
    body: &mut dyn FnMut(&mut Writer, Word) -> Result<(), String>,
) -> Result<(), String> {
    let u = w.u32;
    w.b.store(var, start, None, []).map_err(build)?;
    let (header, block, next, merge) = (w.b.id(), w.b.id(), w.b.id(), w.b.id());
    w.b.branch(header).map_err(build)?;
    w.b.begin_block(Some(header)).map_err(build)?;
    let at = w.b.load(u, None, var, None, []).map_err(build)?;
    let more = w.b.u_less_than(w.bool, None, at, end).map_err(build)?;
    w.b.loop_merge(merge, next, LoopControl::NONE, [])
        .map_err(build)?;
    w.b.branch_conditional(more, block, merge, [])
        .map_err(build)?;
    w.b.begin_block(Some(block)).map_err(build)?;
    body(w, at)?;
    w.b.branch(next).map_err(build)?;
    w.b.begin_block(Some(next)).map_err(build)?;
    let after = w.add(at, step)?;
    w.b.store(var, after, None, []).map_err(build)?;
    w.b.branch(header).map_err(build)?;
    w.b.begin_block(Some(merge)).map_err(build)?;
    Ok(())
}

/// Layouts clamp unless the blocks cover the rows: loads past them then read zeros, stores
/// are dropped.
pub(crate) fn clamp_mode(exact: bool) -> TensorClampMode {
    if exact {
        TensorClampMode::Undefined
    } else {
        TensorClampMode::Constant
    }
}

/// A layout of `dims[0]` rows of `dims[1]` contiguous elements from an aligned pointer `rem`
/// elements before the first.
fn rows_layout(
    w: &mut Writer,
    clamp: TensorClampMode,
    dims: [Word; 2],
    rem: Word,
) -> Result<Word, String> {
    let one = w.uint(1);
    let width = w.add(dims[1], rem)?;
    w.layout(clamp, [dims[0], width], [dims[1], one])
}

/// `function` applied to each element of `matrix` (of type `t`), with `extra` operands
/// (matrices of type `t` pass their element at the same place).
pub(crate) fn per_element(
    w: &mut Writer,
    t: Word,
    matrix: Word,
    function: (Word, Word),
    extra: &[Word],
) -> Result<Word, String> {
    let mut operands = vec![matrix, function.0];
    operands.extend(extra);
    w.inst(Op::CooperativeMatrixPerElementOpNV, t, &operands)
}

/// Each row of `matrix` (of type `t`) combined by `function`, the result in every column.
pub(crate) fn reduce_rows(
    w: &mut Writer,
    t: Word,
    matrix: Word,
    function: (Word, Word),
) -> Result<Word, String> {
    w.b.cooperative_matrix_reduce_nv(t, None, matrix, CooperativeMatrixReduce::ROW, function.0)
        .map_err(build)
}

/// The kernel's functions (id, type), called per element or to combine two elements.
struct Functions {
    /// `(row, column, score, first row, first key) -> score, or HIDDEN where not seen`.
    mask: (Word, Word),
    /// `(x, y) -> max` and `(x, y) -> x + y`: the row reductions' combiners.
    max_of: (Word, Word),
    sum_of: (Word, Word),
    /// `(row, column, x, y) -> max(x, y)` and `-> exp(x - y)`.
    larger: (Word, Word),
    exp_diff: (Word, Word),
    /// `(row, column, p) -> p` rounded to the significand of the operands' dtype.
    split: (Word, Word),
    /// `(row, column, l, m, lse base, first row) -> l`, storing `m + ln l` for column 0 at
    /// the base plus the row's index in its head.
    store_lse: (Word, Word),
    /// `(row, column, o, l) -> o / l`, rounded to bf16 for bf16 outputs.
    finish: (Word, Word),
    /// The log-sum-exp's buffer.
    lse_var: Word,
}

impl Functions {
    fn declare(w: &mut Writer, lse_var: Word) -> Functions {
        let (f, u) = (w.float(Scalar::F32), w.u32);
        Functions {
            mask: declare(w, &[u, u, f, u, u]),
            max_of: declare(w, &[f, f]),
            sum_of: declare(w, &[f, f]),
            larger: declare(w, &[u, u, f, f]),
            exp_diff: declare(w, &[u, u, f, f]),
            split: declare(w, &[u, u, f]),
            store_lse: declare(w, &[u, u, f, f, u, u]),
            finish: declare(w, &[u, u, f, f]),
            lse_var,
        }
    }

    /// The functions' bodies, after the entry point.
    fn emit(&self, w: &mut Writer, s: Scalar) -> Result<(), String> {
        let (f, u, b) = (w.float(Scalar::F32), w.u32, w.bool);
        let hidden = w.constant(f32::from_bits(HIDDEN));
        let zero = w.uint(0);

        let [row, col, score, i0, j0] = begin(w, self.mask, [u, u, f, u, u])?;
        let seen = key_seen(w, [i0, j0], [row, col])?;
        let v = w.inst(Op::Select, f, &[seen, score, hidden])?;
        end(w, v)?;

        let [x, y] = begin(w, self.max_of, [f, f])?;
        let v = larger(w, x, y)?;
        end(w, v)?;

        emit_sum(w, self.sum_of)?;

        let [_, _, x, y] = begin(w, self.larger, [u, u, f, f])?;
        let v = larger(w, x, y)?;
        end(w, v)?;

        let [_, _, x, y] = begin(w, self.exp_diff, [u, u, f, f])?;
        let d = w.inst(Op::FSub, f, &[x, y])?;
        let v = w.glsl(EXP, d)?;
        end(w, v)?;

        emit_split(w, self.split, s)?;

        let [row, col, l, m, base, i0] = begin(w, self.store_lse, [u, u, f, f, u, u])?;
        let q_len = w.param("q_len", 0)?;
        let query = w.add(i0, row)?;
        let in_rows = w.inst(Op::ULessThan, b, &[query, q_len])?;
        let first = w.inst(Op::IEqual, b, &[col, zero])?;
        let stores = w.inst(Op::LogicalAnd, b, &[in_rows, first])?;
        let (then, merge) = (w.b.id(), w.b.id());
        w.b.selection_merge(merge, SelectionControl::NONE)
            .map_err(build)?;
        w.b.branch_conditional(stores, then, merge, [])
            .map_err(build)?;
        w.b.begin_block(Some(then)).map_err(build)?;
        let ln = w.glsl(LOG, l)?;
        let lse = w.inst(Op::FAdd, f, &[m, ln])?;
        let at = w.add(base, query)?;
        let ptr = w.element_ptr(Scalar::F32, self.lse_var, at)?;
        w.b.store(ptr, lse, None, []).map_err(build)?;
        w.b.branch(merge).map_err(build)?;
        w.b.begin_block(Some(merge)).map_err(build)?;
        end(w, l)?;

        let [_, _, o, l] = begin(w, self.finish, [u, u, f, f])?;
        let mut v = w.inst(Op::FDiv, f, &[o, l])?;
        if s == Scalar::BF16 {
            v = w.round_to_bf16(v)?;
        }
        end(w, v)
    }
}

/// Whether the key at column `at[1]` of a block from key `first[1]` is seen by the query at
/// row `at[0]` of rows from `first[0]` (a boolean): inside the keys and, where causal, not
/// after the query's own (key j is seen by query i when j + q_len <= i + k_len).
pub(crate) fn key_seen(w: &mut Writer, first: [Word; 2], at: [Word; 2]) -> Result<Word, String> {
    let (b, zero) = (w.bool, w.uint(0));
    let q_len = w.param("q_len", 0)?;
    let k_len = w.param("k_len", 0)?;
    let causal = w.param("causal", 0)?;
    let query = w.add(first[0], at[0])?;
    let key = w.add(first[1], at[1])?;
    let in_keys = w.inst(Op::ULessThan, b, &[key, k_len])?;
    let key_end = w.add(key, q_len)?;
    let query_end = w.add(query, k_len)?;
    let before = w.inst(Op::ULessThanEqual, b, &[key_end, query_end])?;
    let unmasked = w.inst(Op::IEqual, b, &[causal, zero])?;
    let allowed = w.inst(Op::LogicalOr, b, &[unmasked, before])?;
    w.inst(Op::LogicalAnd, b, &[in_keys, allowed])
}

/// A per-element or combining function returning f32 with parameters of types `params`: its
/// id and type, its body emitted later.
pub(crate) fn declare(w: &mut Writer, params: &[Word]) -> (Word, Word) {
    let f = w.float(Scalar::F32);
    let t = w.b.type_function(f, params.iter().copied());
    (w.b.id(), t)
}

/// The body of `(x, y) -> x + y`, the row sums' combiner.
pub(crate) fn emit_sum(w: &mut Writer, function: (Word, Word)) -> Result<(), String> {
    let f = w.float(Scalar::F32);
    let [x, y] = begin(w, function, [f, f])?;
    let v = w.inst(Op::FAdd, f, &[x, y])?;
    end(w, v)
}

/// The body of `(row, column, x) -> x` rounded to the significand of 16-bit dtype `s`.
pub(crate) fn emit_split(w: &mut Writer, function: (Word, Word), s: Scalar) -> Result<(), String> {
    let (f, u) = (w.float(Scalar::F32), w.u32);
    let [_, _, x] = begin(w, function, [u, u, f])?;
    // Significand bits of f32 that the 16-bit dtype lacks.
    let dropped = if s == Scalar::BF16 { 16 } else { 13 };
    let v = round_significand(w, x, dropped)?;
    end(w, v)
}

/// Begins `function` (returning f32) with parameters of types `params`, and its first block.
pub(crate) fn begin<const N: usize>(
    w: &mut Writer,
    function: (Word, Word),
    params: [Word; N],
) -> Result<[Word; N], String> {
    let f = w.float(Scalar::F32);
    w.b.begin_function(f, Some(function.0), FunctionControl::NONE, function.1)
        .map_err(build)?;
    let mut ids = [0; N];
    for (id, t) in ids.iter_mut().zip(params) {
        *id = w.b.function_parameter(t).map_err(build)?;
    }
    w.b.begin_block(None).map_err(build)?;
    Ok(ids)
}

/// Returns `v` and ends the function.
pub(crate) fn end(w: &mut Writer, v: Word) -> Result<(), String> {
    w.b.ret_value(v).map_err(build)?;
    w.b.end_function().map_err(build)
}

/// f32 `x` rounded to nearest even at its significand's bit `dropped` (its `dropped` lowest
/// bits cleared), still as f32: a value of the 16-bit dtype wherever that has the exponent.
fn round_significand(w: &mut Writer, x: Word, dropped: u32) -> Result<Word, String> {
    let (f, u) = (w.float(Scalar::F32), w.u32);
    let bits = w.b.bitcast(u, None, x).map_err(build)?;
    let shift = w.uint(dropped);
    let one = w.uint(1);
    let odd = w.op(Op::ShiftRightLogical, bits, shift)?;
    let odd = w.op(Op::BitwiseAnd, odd, one)?;
    let half = w.uint((1 << (dropped - 1)) - 1);
    let biased = w.add(bits, half)?;
    let biased = w.add(biased, odd)?;
    let kept = w.uint(!((1u32 << dropped) - 1));
    let rounded = w.op(Op::BitwiseAnd, biased, kept)?;
    w.b.bitcast(f, None, rounded).map_err(build)
}

/// The larger of f32 `x` and `y`.
fn larger(w: &mut Writer, x: Word, y: Word) -> Result<Word, String> {
    let (f, b) = (w.float(Scalar::F32), w.bool);
    let above = w.inst(Op::FOrdGreaterThan, b, &[x, y])?;
    w.inst(Op::Select, f, &[above, x, y])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::DType;
    use tessera_wgsl::AttentionPass;

    #[test]
    fn every_variant_is_a_module() {
        for dtype in [DType::F16, DType::BF16] {
            for head in TensorAttention::HEADS {
                let kernel = TensorAttention {
                    dtype,
                    head,
                    pass: AttentionPass::Forward,
                };
                let words = spirv(&kernel, None).unwrap();
                let mut loader = rspirv::dr::Loader::new();
                rspirv::binary::parse_words(&words, &mut loader).unwrap();
                let module = loader.module();
                assert_eq!(module.entry_points.len(), 1, "{dtype:?} head {head}");
                // The entry point and the eight per-element or combining functions.
                assert_eq!(module.functions.len(), 9, "{dtype:?} head {head}");
            }
        }
    }

    #[test]
    fn every_variant_compiles_for_a_fixed_block() {
        let at = |field| attention_param_word(field).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            for head in TensorAttention::HEADS {
                let kernel = TensorAttention {
                    dtype,
                    head,
                    pass: AttentionPass::Forward,
                };
                // Rows in whole blocks (unclamped) and ragged (clamped).
                for (q_len, k_len) in [(128, 256), (70, 100)] {
                    let mut words = vec![0; attention_param_words()];
                    for (field, value) in [
                        ("batch", 2),
                        ("heads", 4),
                        ("kv_heads", 2),
                        ("q_len", q_len),
                        ("k_len", k_len),
                        ("causal", 1),
                    ] {
                        words[at(field)] = value;
                    }
                    assert_eq!(
                        blocks_cover(&kernel, &words),
                        q_len % 64 == 0 && k_len % head == 0
                    );
                    let spirv = spirv(&kernel, Some(&words)).unwrap();
                    let mut loader = rspirv::dr::Loader::new();
                    rspirv::binary::parse_words(&spirv, &mut loader).unwrap();
                    assert_eq!(loader.module().entry_points.len(), 1);
                }
            }
        }
    }

    #[test]
    fn f32_and_other_head_sizes_are_refused() {
        let f32_kernel = TensorAttention {
            dtype: DType::F32,
            head: 64,
            pass: AttentionPass::Forward,
        };
        assert!(spirv(&f32_kernel, None).unwrap_err().contains("f32"));
        let odd_head = TensorAttention {
            dtype: DType::F16,
            head: 96,
            pass: AttentionPass::Forward,
        };
        assert!(spirv(&odd_head, None).unwrap_err().contains("head size 96"));
    }
}
