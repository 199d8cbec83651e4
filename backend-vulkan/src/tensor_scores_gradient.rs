//! The score gradients of attention's backward on tensor cores, written as SPIR-V
//! ([`tessera_wgsl::AttentionPass::ScoresGradient`]), with the forward's builder and setup
//! (`tensor_attention.rs`). The backward as products (`tessera-wgsl`'s
//! `attention_products.rs`) needs, per score, `P = exp(scale S - lse)` (0 where the key is
//! hidden) and `dS = scale P (dP - delta)`, with `S = q k^T`, `dP = dout v^T` and
//! `delta = sum_j P dP` per row, each as two values of the dtype (rounded, and what rounding
//! left out); it otherwise forms them with two products storing `S` and `dP` in f32 and a row
//! pass reading them back, 16 bytes of memory traffic a score more than these 8 stored ones.
//!
//! Each workgroup takes [`TensorAttention::ROWS`] query rows of one (batch, head), as the
//! forward does, loads their q and dout once and walks the keys they see in blocks of `head`
//! twice, with every sum in f32:
//!
//! 1. `S` and `dP` on tensor cores, `P` per element (reading the rows' log-sum-exp), and the
//!    running element-wise sum of `P dP`; after the keys, its row sums are `delta`;
//! 2. `S`, `dP` and `P` again, `dS`, and both split and stored;
//!
//! then stores zeros for the blocks past the rows' last visible key, which the gradients'
//! products (whose tiles are larger) may read.
//!
//! On the H200, GPT-2's bf16 training step (12 layers, 8 x 1,024 tokens, head size 64): 7.0
//! ms, where the two products and the row pass it replaces took 3.0 and 6.9; the step went
//! from 61.0 to 58.5-59.3 ms. A first version stored the zeros as tensor stores of a zero
//! matrix: 6.6 of its 12.9 ms; they are now 16-byte vectors, 0.7 ms, where the parts start on
//! whole vectors ([`Part::store_zero_vectors`]). The first pass (`delta`) costs 0.5 to 1.6 ms.
//! Tried and not kept: staging each stored block through workgroup memory, so that each
//! thread splits eight sums and stores each part as one 16-byte vector (9.5 ms: the four
//! barriers a block cost more than the tensor stores they replace).

use rspirv::binary::Assemble;
use rspirv::spirv::{Capability, Op, StorageClass, Word};
use tessera_wgsl::{attention_param_word, TensorAttention};

use crate::tensor_attention::{
    begin, clamp_mode, counted_loop, declare, emit_split, emit_sum, end, key_seen, per_element,
    prepare, reduce_rows, HeadRows, Mats, Rows, EXP,
};
use crate::tensor_matmul::{build, Scalar, Writer};

/// The kernel's SPIR-V words, reading its parameter block or compiled for the block `fixed`
/// alone; or what stops it (a dtype or head size it does not take).
pub(crate) fn spirv(kernel: &TensorAttention, fixed: Option<&[u32]>) -> Result<Vec<u32>, String> {
    let (s, block, exact) = prepare(kernel, fixed)?;
    let mut w = Writer::new(s, s, block);
    w.fixed = fixed.map(<[u32]>::to_vec);
    w.declare_module(&[
        Capability::CooperativeMatrixReductionsNV,
        Capability::CooperativeMatrixPerElementOperationsNV,
    ]);
    // Bindings 1 to 9: q, k, v, the log-sum-exp, dout, then P's parts and dS's; the operands
    // as 16-byte vectors where the blocks cover them, so that their loads are known aligned,
    // and the parts where they also start on whole vectors, so that zeros are stored as such.
    let vector_parts = exact && fixed.is_some_and(parts_start_on_vectors);
    let lse = w.buffer(Scalar::F32, 4, false, false);
    let buffers = [
        w.buffer(s, 1, false, exact),
        w.buffer(s, 2, false, exact),
        w.buffer(s, 3, false, exact),
        lse,
        w.buffer(s, 5, false, exact),
        w.buffer(s, 6, true, vector_parts),
        w.buffer(s, 7, true, vector_parts),
        w.buffer(s, 8, true, vector_parts),
        w.buffer(s, 9, true, vector_parts),
    ];
    let fns = Functions::declare(&mut w, lse);
    main(&mut w, s, kernel.head, &fns, buffers, [exact, vector_parts])?;
    fns.emit(&mut w, s)?;
    Ok(w.b.module().assemble())
}

/// Whether every part's offset in parameter block `words` is a whole number of 16-byte
/// vectors (of 16-bit elements).
fn parts_start_on_vectors(words: &[u32]) -> bool {
    let Some(offsets) = attention_param_word("offsets") else {
        return false;
    };
    (5..9).all(|i| words.get(offsets + i).is_some_and(|o| o % 8 == 0))
}

/// The entry point: one workgroup's rows of one (batch, head) over `buffers`; `exact` where
/// the blocks cover the rows and keys, `vector_parts` where the parts are bound as 16-byte
/// vectors and start on one (zeros are then stored a vector a thread).
fn main(
    w: &mut Writer,
    s: Scalar,
    head: u32,
    fns: &Functions,
    buffers: [Word; 9],
    [exact, vector_parts]: [bool; 2],
) -> Result<(), String> {
    let [q_var, k_var, v_var, lse_var, dout_var, p_hi_var, p_lo_var, ds_hi_var, ds_lo_var] =
        buffers;
    let (rows, d) = (TensorAttention::ROWS, head);
    let u = w.u32;
    let mats = Mats::declare(w, s, d);
    let (a_mat, b_mat, sums, sums16) = (mats.a, mats.b, mats.sums, mats.sums16);
    let (zero_a, zero_b, zero_sums) = (mats.zero_a, mats.zero_b, mats.zero_sums);
    let zero16 = w.zeros(s, sums16);

    let params = w.declare_params();
    let (wid_var, uvec3) = w.workgroup_id();
    let lid_var = w.local_index();
    let zero = w.uint(0);
    let view_t = w.transpose_view_type();
    let sums_ptr = w.b.type_pointer(None, StorageClass::Function, sums);
    let u32_ptr = w.b.type_pointer(None, StorageClass::Function, u);
    let entry = w.begin_entry()?;
    let acc_var = w.b.variable(sums_ptr, None, StorageClass::Function, None);
    let j_var = w.b.variable(u32_ptr, None, StorageClass::Function, None);

    let at = HeadRows::read(w, wid_var, uvec3, d)?;
    let (i0, q_len, k_len, scale) = (at.i0, at.q_len, at.k_len, at.scale);
    let c_d = w.uint(d);
    let q_base = at.base(w, 0, at.head_start)?;
    let lse_base = at.base(w, 3, at.rows_before)?;
    let dout_base = at.base(w, 4, at.head_start)?;
    // Scores are `[q_len, k_len]` a (batch, head), after `rows_before * k_len` of the others.
    let scores_start = w.mul(at.rows_before, k_len)?;

    let clamp = clamp_mode(exact);
    let [q_rows, k_rows, v_rows, dout_rows] = Rows::declare(
        w,
        s,
        clamp,
        [
            (q_var, q_base, [q_len, c_d], exact),
            (k_var, at.k_base, [k_len, c_d], exact),
            (v_var, at.v_base, [k_len, c_d], exact),
            (dout_var, dout_base, [q_len, c_d], exact),
        ],
    )?;
    let mut parts = Vec::new();
    for (binding, var) in [(5, p_hi_var), (6, p_lo_var), (7, ds_hi_var), (8, ds_lo_var)] {
        let base = at.base(w, binding, scores_start)?;
        let [rows] = Rows::declare(w, s, clamp, [(var, base, [q_len, k_len], vector_parts)])?;
        parts.push(Part { var, base, rows });
    }
    let transpose = w.b.create_tensor_view_nv(view_t, None).map_err(build)?;
    let q = q_rows.load(w, [a_mat, zero_a], i0, [rows, d], None)?;
    let dout = dout_rows.load(w, [a_mat, zero_a], i0, [rows, d], None)?;

    // The rows' log-sum-exp in every column, read once.
    let lse = per_element(w, sums, zero_sums, fns.row_lse, &[lse_base, i0])?;
    // P and dP of the block of keys from `j0`.
    let probabilities = |w: &mut Writer, j0: Word| -> Result<[Word; 2], String> {
        let k_t = k_rows.load(w, [b_mat, zero_b], j0, [d, d], Some(transpose))?;
        let scores =
            w.b.cooperative_matrix_mul_add_khr(sums, None, q, k_t, zero_sums, None)
                .map_err(build)?;
        let v_t = v_rows.load(w, [b_mat, zero_b], j0, [d, d], Some(transpose))?;
        let dp =
            w.b.cooperative_matrix_mul_add_khr(sums, None, dout, v_t, zero_sums, None)
                .map_err(build)?;
        let p = per_element(w, sums, scores, fns.prob, &[lse, i0, j0])?;
        Ok([p, dp])
    };
    let lid = w.b.load(u, None, lid_var, None, []).map_err(build)?;
    // Stores `x` (f32 sums) as its two parts, into the parts at `hi` and `hi + 1`.
    let store_split = |w: &mut Writer, x: Word, hi: usize, j0: Word| -> Result<(), String> {
        let high = per_element(w, sums, x, fns.split, &[])?;
        let low = w.inst(Op::FSub, sums, &[x, high])?;
        for (value, part) in [(high, &parts[hi]), (low, &parts[hi + 1])] {
            let value = w.b.f_convert(sums16, None, value).map_err(build)?;
            part.rows.store(w, value, i0, Some(j0), [rows, d])?;
        }
        Ok(())
    };

    w.b.store(acc_var, zero_sums, None, []).map_err(build)?;
    counted_loop(w, j_var, zero, at.keys_end, c_d, &mut |w, j0| {
        let [p, dp] = probabilities(w, j0)?;
        let terms = w.inst(Op::FMul, sums, &[p, dp])?;
        let acc = w.b.load(sums, None, acc_var, None, []).map_err(build)?;
        let acc = w.inst(Op::FAdd, sums, &[acc, terms])?;
        w.b.store(acc_var, acc, None, []).map_err(build)?;
        Ok(())
    })?;
    let acc = w.b.load(sums, None, acc_var, None, []).map_err(build)?;
    let delta = reduce_rows(w, sums, acc, fns.sum_of)?;
    counted_loop(w, j_var, zero, at.keys_end, c_d, &mut |w, j0| {
        let [p, dp] = probabilities(w, j0)?;
        let centered = w.inst(Op::FSub, sums, &[dp, delta])?;
        let ds = w.inst(Op::FMul, sums, &[p, centered])?;
        let ds = w.inst(Op::MatrixTimesScalar, sums, &[ds, scale])?;
        store_split(w, p, 0, j0)?;
        store_split(w, ds, 2, j0)
    })?;
    // The blocks past the last one the rows see, from where the loop stopped.
    let past = w.b.load(u, None, j_var, None, []).map_err(build)?;
    counted_loop(w, j_var, past, k_len, c_d, &mut |w, j0| {
        for part in &parts {
            if vector_parts {
                part.store_zero_vectors(w, lid, [i0, j0], k_len, d)?;
            } else {
                part.rows.store(w, zero16, i0, Some(j0), [rows, d])?;
            }
        }
        Ok(())
    })?;
    let mut interface = vec![q_var, k_var, v_var, lse_var, dout_var];
    interface.extend([
        p_hi_var, p_lo_var, ds_hi_var, ds_lo_var, params, wid_var, lid_var,
    ]);
    w.end_entry(entry, interface, TensorAttention::THREADS)?;
    Ok(())
}

/// One of the stored parts: its buffer, where its (batch, head)'s scores start, and their
/// rows.
struct Part {
    var: Word,
    base: Word,
    rows: Rows,
}

impl Part {
    /// Stores zeros over the `rows x head` block at row `at[0]` and key `at[1]` (rows of
    /// `k_len`) a 16-byte vector a thread at a time, thread `lid` taking every
    /// `THREADS`th: each warp's stores then cover whole rows. (Tensor stores of a matrix of
    /// zeros took half of the kernel's time on GPT-2's scores.)
    fn store_zero_vectors(
        &self,
        w: &mut Writer,
        lid: Word,
        at: [Word; 2],
        k_len: Word,
        head: u32,
    ) -> Result<(), String> {
        let u = w.u32;
        let uvec4 = w.b.type_vector(u, 4);
        let zero = w.uint(0);
        let zeros = w.b.constant_composite(uvec4, [zero, zero, zero, zero]);
        let ptr_t = w.b.type_pointer(None, StorageClass::StorageBuffer, uvec4);
        let per_row = head / 8;
        let (shift, mask) = (w.uint(per_row.trailing_zeros()), w.uint(per_row - 1));
        let (eight, three) = (w.uint(8), w.uint(3));
        let start = w.add(self.base, at[1])?;
        for n in 0..TensorAttention::ROWS * per_row / TensorAttention::THREADS {
            let step = w.uint(n * TensorAttention::THREADS);
            let v = w.add(lid, step)?;
            let r = w.op(Op::ShiftRightLogical, v, shift)?;
            let c = w.op(Op::BitwiseAnd, v, mask)?;
            let row = w.add(at[0], r)?;
            let row_start = w.mul(row, k_len)?;
            let element = w.add(start, row_start)?;
            let column = w.mul(c, eight)?;
            let element = w.add(element, column)?;
            let vector = w.op(Op::ShiftRightLogical, element, three)?;
            let ptr =
                w.b.access_chain(ptr_t, None, self.var, [zero, vector])
                    .map_err(build)?;
            w.b.store(ptr, zeros, None, []).map_err(build)?;
        }
        Ok(())
    }
}

/// The kernel's functions (id, type), called per element or to combine two elements.
struct Functions {
    /// `(row, column, x, lse base, first row) -> the row's log-sum-exp`, -inf past the rows.
    row_lse: (Word, Word),
    /// `(row, column, score, lse, first row, first key) -> P`: `exp(scale score - lse)` where
    /// the key is seen and the row's log-sum-exp finite, else 0.
    prob: (Word, Word),
    /// `(x, y) -> x + y`: the row sums' combiner.
    sum_of: (Word, Word),
    /// `(row, column, x) -> x` rounded to the significand of the operands' dtype.
    split: (Word, Word),
    /// The log-sum-exp's buffer.
    lse_var: Word,
}

impl Functions {
    fn declare(w: &mut Writer, lse_var: Word) -> Functions {
        let (f, u) = (w.float(Scalar::F32), w.u32);
        Functions {
            row_lse: declare(w, &[u, u, f, u, u]),
            prob: declare(w, &[u, u, f, f, u, u]),
            sum_of: declare(w, &[f, f]),
            split: declare(w, &[u, u, f]),
            lse_var,
        }
    }

    /// The functions' bodies, after the entry point.
    fn emit(&self, w: &mut Writer, s: Scalar) -> Result<(), String> {
        let (f, u, b) = (w.float(Scalar::F32), w.u32, w.bool);
        let minus_inf = w.constant(f32::NEG_INFINITY);

        let [row, _, _, lse_base, i0] = begin(w, self.row_lse, [u, u, f, u, u])?;
        let q_len = w.param("q_len", 0)?;
        let query = w.add(i0, row)?;
        let in_rows = w.inst(Op::ULessThan, b, &[query, q_len])?;
        // Rows outside read the first row's entry, which exists, and are dropped.
        let own = w.add(lse_base, query)?;
        let at = w.inst(Op::Select, u, &[in_rows, own, lse_base])?;
        let ptr = w.element_ptr(Scalar::F32, self.lse_var, at)?;
        let lse = w.b.load(f, None, ptr, None, []).map_err(build)?;
        let v = w.inst(Op::Select, f, &[in_rows, lse, minus_inf])?;
        end(w, v)?;

        let [row, col, score, lse, i0, j0] = begin(w, self.prob, [u, u, f, f, u, u])?;
        let seen = key_seen(w, [i0, j0], [row, col])?;
        let scale = w.param("scale", 0)?;
        let scale = w.b.bitcast(f, None, scale).map_err(build)?;
        // A row that saw no key (or is past the rows) has lse = -inf: its probabilities are
        // 0, as the row pass has them.
        let finite = w.inst(Op::FOrdGreaterThan, b, &[lse, minus_inf])?;
        let seen = w.inst(Op::LogicalAnd, b, &[seen, finite])?;
        let scaled = w.inst(Op::FMul, f, &[scale, score])?;
        let x = w.inst(Op::FSub, f, &[scaled, lse])?;
        let p = w.glsl(EXP, x)?;
        let zero_f = w.constant(0.0);
        let v = w.inst(Op::Select, f, &[seen, p, zero_f])?;
        end(w, v)?;

        emit_sum(w, self.sum_of)?;
        emit_split(w, self.split, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::DType;
    use tessera_wgsl::{attention_param_words, AttentionPass};

    #[test]
    fn every_variant_is_a_module_reading_or_fixed() {
        let at = |field| attention_param_word(field).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            for head in TensorAttention::HEADS {
                let kernel = TensorAttention {
                    dtype,
                    head,
                    pass: AttentionPass::ScoresGradient,
                };
                let mut words = vec![0; attention_param_words()];
                for (field, value) in [
                    ("batch", 2),
                    ("heads", 4),
                    ("kv_heads", 2),
                    ("q_len", 128),
                    ("k_len", 256),
                    ("causal", 1),
                ] {
                    words[at(field)] = value;
                }
                for fixed in [None, Some(&words[..])] {
                    let spirv = spirv(&kernel, fixed).unwrap();
                    let mut loader = rspirv::dr::Loader::new();
                    rspirv::binary::parse_words(&spirv, &mut loader).unwrap();
                    let module = loader.module();
                    assert_eq!(module.entry_points.len(), 1, "{dtype:?} head {head}");
                    // The entry point and the four per-element or combining functions.
                    assert_eq!(module.functions.len(), 5, "{dtype:?} head {head}");
                }
            }
        }
    }
}
