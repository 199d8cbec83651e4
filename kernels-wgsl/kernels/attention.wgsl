// Fused attention, forward and backward, in the flash style: a thread per query row (or key
// row), ROWS rows per workgroup, the other side streamed through workgroup memory tile() rows
// at a time; nothing T x T is stored. Head rows live in registers as vec4s: the upper-case
// placeholders are generated (attention.rs) either per head size with every vec4 named, so
// loops over the head dimension are unrolled and nothing is indexed dynamically, or as loops
// over arrays for any head size (large heads, CPU drivers). The first of them defines kdim(),
// vdim() (head sizes), kvec(), vvec() (their vec4s) and tile(): constants of an unrolled
// kernel, parameters of a looped one. Rows meet the streamed side four at a time.
// Parameters: `AttentionParams` (attention.rs). Rows of k and v are contiguous; their heads
// may lie further apart (a view of a KV cache).
// The forward kernels also run CachedAttention: its positions take lse's binding 5 (it has no
// log-sum-exp), and the generated visible(i), keys_seen(i0, i1) and store_lse(row, v) read
// them there and store nothing.
// Backward bindings: 1 q, 2 k, 3 v, 4 out, 5 lse, 6 dout, 7 dq, 8 dk, 9 dv, 10 delta (scratch,
// one per query row: sum(dout * out)).

SIZES

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// The streamed tiles: keys and values (forward, dq) or queries and output gradients (dk, dv).
var<workgroup> ta: array<vec4<f32>, AWORDS>;
var<workgroup> tb: array<vec4<f32>, BWORDS>;

// The number of keys query `i` sees in attention (causal: key j is visible when
// j + Tq <= i + Tk).
fn causal_visible(i: u32) -> u32 {
    if (params.causal == 0u) { return params.k_len; }
    if (i + params.k_len + 1u <= params.q_len) { return 0u; }
    return min(params.k_len, i + params.k_len + 1u - params.q_len);
}

VISIBILITY

// Element offsets of the first key and value rows of batch `b`, key/value head `g`, and of
// the (batch, query head) pair `bh`.
fn k_at(b: u32, g: u32) -> u32 { return o(2u) + b * params.k_batch_stride + g * params.k_head_stride; }
fn v_at(b: u32, g: u32) -> u32 { return o(3u) + b * params.v_batch_stride + g * params.v_head_stride; }
fn k_base(bh: u32) -> u32 { return k_at(bh / params.heads, (bh % params.heads) / (params.heads / params.kv_heads)); }
fn v_base(bh: u32) -> u32 { return v_at(bh / params.heads, (bh % params.heads) / (params.heads / params.kv_heads)); }

HELPERS

// @kernel forward
// Bindings: 1 q, 2 k, 3 v, 4 out, 5 lse. Online softmax: the running maximum `m`, the sum `l`
// of exp(s - m) and the weighted sum of values are rescaled only when the maximum grows.
@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tq = params.q_len;
    let blocks = (tq + ROWS - 1u) / ROWS;
    let scale = params.scale;
    for (var t = group_index(wid, nwg); t < params.batch * params.heads * blocks; t += group_count(nwg)) {
        let bh = t / blocks;
        let i0 = (t % blocks) * ROWS;
        let i = i0 + lid;
        let live = i < tq;
        let row = bh * tq + min(i, tq - 1u);
        var lim = 0u;
        if (live) { lim = visible(i); }
        let span = keys_seen(i0, min(i0 + ROWS, tq));
        let kb = k_base(bh);
        let vb = v_base(bh);
        let qb = o(1u) + row * kdim();
        LOAD_REGS
        ZERO_ACC
        var m = -inf();
        var l = 0.0;
        for (var j0 = 0u; j0 < span; j0 += tile()) {
            let cnt = min(tile(), span - j0);
            workgroupBarrier();
            fill_a(kb + j0 * kdim(), cnt, lid);
            fill_b(vb + j0 * vdim(), cnt, lid);
            workgroupBarrier();
            for (var jj = 0u; jj < cnt && j0 + jj < lim; jj += 4u) {
                let a0 = jj * kvec();
                let b0 = jj * vvec();
                SCORES
                let m_new = max(m, max(max(s0, s1), max(s2, s3)));
                if (m_new > m) {
                    let alpha = exp(m - m_new);
                    l *= alpha;
                    RESCALE
                    m = m_new;
                }
                let p0 = exp(s0 - m);
                let p1 = exp(s1 - m);
                let p2 = exp(s2 - m);
                let p3 = exp(s3 - m);
                l += (p0 + p1) + (p2 + p3);
                UPDATE
            }
        }
        if (live) {
            let inv = select(0.0, 1.0 / l, l > 0.0);
            STORE
            store_lse(row, select(-inf(), m + log(l), l > 0.0));
        }
    }
}

// @kernel forward_rows
// For few query rows (decoding): a workgroup per (query row, key split) takes the split's keys
// KEYS at a time with an online softmax, four threads per key for the scores (each over every
// fourth element of the head, their partial sums met in order), thread d keeping output
// element d. With
// one split the row is finished here; with more, each split leaves its unnormalized sums and
// its (maximum, total) pair in binding 6 for forward_combine: the sums of (row, split) t at
// t * Dv, the pairs after all the sums.
// Bindings: 1 q, 2 k, 3 v, 4 out, 5 lse, 6 partials.
const KEYS: u32 = WG / 4u;
var<workgroup> qs: array<f32, 256>;
var<workgroup> pb: array<f32, 256>;
var<workgroup> parts: array<f32, 1024>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.batch * params.heads * params.q_len;
    let splits = params.splits;
    let dk = params.k_dim;
    let dv = params.v_dim;
    for (var t = group_index(wid, nwg); t < rows * splits; t += group_count(nwg)) {
        let row = t / splits;
        // Splits take at least keys_per_split keys each, more where the row sees more keys than
        // the splits hold at that (a cached attention's keys are known only here). A split past
        // the row's keys (a cache filled less than its capacity) reads nothing.
        let seen = visible(row % params.q_len);
        let chunk = max(params.keys_per_split, (seen + splits - 1u) / splits);
        let first = (t % splits) * chunk;
        let end = min(first + chunk, seen);
        let kb = k_base(row / params.q_len);
        let vb = v_base(row / params.q_len);
        workgroupBarrier();
        if (lid < dk && first < end) { qs[lid] = params.scale * ld1(o(1u) + row * dk + lid); }
        workgroupBarrier();
        var acc = 0.0;
        var m = -inf();
        var l = 0.0;
        for (var j0 = first; j0 < end; j0 += KEYS) {
            let j = j0 + lid / 4u;
            var part = 0.0;
            if (j < end) {
                // Eight loads issued together per step: a thread's loads would otherwise wait
                // on each other, one memory latency per element.
                let kr = kb + j * dk;
                var d = lid % 4u;
                for (; d + 28u < dk; d += 32u) {
                    let x0 = ld2(kr + d);
                    let x1 = ld2(kr + d + 4u);
                    let x2 = ld2(kr + d + 8u);
                    let x3 = ld2(kr + d + 12u);
                    let x4 = ld2(kr + d + 16u);
                    let x5 = ld2(kr + d + 20u);
                    let x6 = ld2(kr + d + 24u);
                    let x7 = ld2(kr + d + 28u);
                    part += ((qs[d] * x0 + qs[d + 4u] * x1) + (qs[d + 8u] * x2 + qs[d + 12u] * x3))
                        + ((qs[d + 16u] * x4 + qs[d + 20u] * x5) + (qs[d + 24u] * x6 + qs[d + 28u] * x7));
                }
                for (; d < dk; d += 4u) { part += qs[d] * ld2(kr + d); }
            }
            pb[lid] = part;
            workgroupBarrier();
            var s = -inf();
            if (lid < KEYS && j0 + lid < end) {
                s = (pb[4u * lid] + pb[4u * lid + 1u]) + (pb[4u * lid + 2u] + pb[4u * lid + 3u]);
            }
            let m_new = max(m, wg_max(s, lid));
            let alpha = select(exp(m - m_new), 1.0, m_new == -inf());
            let pj = select(exp(s - m_new), 0.0, s == -inf());
            l = l * alpha + wg_sum(pj, lid);
            m = m_new;
            pb[lid] = pj;
            workgroupBarrier();
            // Four quarters of the workgroup each sum every fourth key; the quarters then add
            // up in order.
            let cnt = min(KEYS, end - j0);
            let quarter = lid / 64u;
            for (var d = lid % 64u; d < dv; d += 64u) {
                let vd = vb + j0 * dv + d;
                var part = 0.0;
                var jj = quarter;
                for (; jj + 12u < cnt; jj += 16u) {
                    let x0 = ld3(vd + jj * dv);
                    let x1 = ld3(vd + (jj + 4u) * dv);
                    let x2 = ld3(vd + (jj + 8u) * dv);
                    let x3 = ld3(vd + (jj + 12u) * dv);
                    part += (pb[jj] * x0 + pb[jj + 4u] * x1) + (pb[jj + 8u] * x2 + pb[jj + 12u] * x3);
                }
                for (; jj < cnt; jj += 4u) { part += pb[jj] * ld3(vd + jj * dv); }
                parts[quarter * 256u + d] = part;
            }
            workgroupBarrier();
            if (lid < dv) {
                acc = acc * alpha + ((parts[lid] + parts[256u + lid]) + (parts[512u + lid] + parts[768u + lid]));
            }
            workgroupBarrier();
        }
        if (splits == 1u) {
            if (lid < dv) { st4(o(4u) + row * dv + lid, select(0.0, acc / l, l > 0.0)); }
            if (lid == 0u) { store_lse(row, select(-inf(), m + log(l), l > 0.0)); }
        } else {
            // forward_combine reads the sums only of splits that saw a key.
            if (lid < dv && m != -inf()) { st6(o(6u) + t * dv + lid, acc); }
            let pair = o(6u) + rows * splits * dv + 2u * t;
            if (lid == 0u) { st6(pair, m); st6(pair + 1u, l); }
        }
    }
}

// @kernel forward_keys
// A cached attention's few query rows (decoding) over keys and values read as 16-byte vectors
// (VEC elements; source.rs): a workgroup per query row takes the keys it sees WG at a time, a
// thread per key for the scores, then the values' weighted sum with each thread on one vector
// of the value row for a slice of the keys, the slices added in order through workgroup
// memory. One pass over the keys: nothing to combine. A pass is a chain of waits (the loads,
// the softmax's reductions, the weighted sum), so each thread issues every load of its pass
// first: the first KEY_LOADS vectors of its key and VALUE_LOADS vectors of its slice's values,
// which cover a pass of GPT-2's heads in 16 bits; longer rows load the rest four at a time.
// Bindings: 1 q, 2 k, 3 v, 4 out, 5 positions; appending to the cache (AppendAttention, one
// query per head), 6 and 7 the new key and value rows, which each workgroup reads in place of
// its head's cache row and stores there once it has read the cache (attention.rs:
// `append_code` generates `appended_row`, `store_appended`, `key_vec` and `value_vec`).
VECTOR_MATH
var<workgroup> qk: array<f32, 256>;
var<workgroup> pk: array<f32, 256>;
var<workgroup> vparts: array<f32, 2048>;
const KEY_LOADS: u32 = 8u;
const VALUE_LOADS: u32 = 8u;

// Elements 4h.. of the query's vector c times the elements of key vector x.
fn qdot(x: vec4<u32>, c: u32) -> vec4<f32> {
    let q = c * VEC;
    var r = quad(x, 0u) * vec4<f32>(qk[q], qk[q + 1u], qk[q + 2u], qk[q + 3u]);
    if (QUADS == 2u) { r += quad(x, 1u) * vec4<f32>(qk[q + 4u], qk[q + 5u], qk[q + 6u], qk[q + 7u]); }
    return r;
}

// The query's product with key vector x, the vector c of its key: nothing past the key's
// kvecs vectors (whose loads were clamped to its last).
fn qdot_in(x: vec4<u32>, c: u32, kvecs: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), qdot(x, c), c < kvecs);
}

// The p-weighted elements of value vector x, where key j of the pass's cnt counts.
fn weighted(x: vec4<u32>, h: u32, j: u32, cnt: u32) -> vec4<f32> {
    return select(0.0, pk[min(j, WG - 1u)], j < cnt) * quad(x, h);
}

APPEND

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.batch * params.heads * params.q_len;
    let dk = params.k_dim;
    let dv = params.v_dim;
    let kvecs = dk / VEC;
    let vvecs = dv / VEC;
    let last_k = kvecs - 1u;
    // The keys of a pass are split into `slices` for the values' sums, one per thread of a
    // value vector.
    let slices = WG / vvecs;
    let slot = lid % vvecs;
    let slice = lid / vvecs;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let seen = visible(row % params.q_len);
        let bh = row / params.q_len;
        let kb = k_base(bh) / VEC;
        let vb = v_base(bh) / VEC;
        let at = appended_row(row);
        // The last row's reads of the query are done.
        workgroupBarrier();
        if (lid < dk) { qk[lid] = params.scale * ld1(o(1u) + row * dk + lid); }
        var acc = 0.0;
        var m = -inf();
        var l = 0.0;
        for (var j0 = 0u; j0 < seen; j0 += WG) {
            let j = j0 + lid;
            let cnt = min(WG, seen - j0);
            // Rows past the keys seen load row 0 and count for nothing.
            let jk = select(0u, j, j < seen);
            let x0 = key_vec(kb, jk, at, bh, 0u);
            let x1 = key_vec(kb, jk, at, bh, min(1u, last_k));
            let x2 = key_vec(kb, jk, at, bh, min(2u, last_k));
            let x3 = key_vec(kb, jk, at, bh, min(3u, last_k));
            let x4 = key_vec(kb, jk, at, bh, min(4u, last_k));
            let x5 = key_vec(kb, jk, at, bh, min(5u, last_k));
            let x6 = key_vec(kb, jk, at, bh, min(6u, last_k));
            let x7 = key_vec(kb, jk, at, bh, min(7u, last_k));
            let vj = j0 + slice;
            let y0 = value_vec(vb, select(0u, vj, slice < cnt), at, bh, slot);
            let y1 = value_vec(vb, select(0u, vj + slices, slice + slices < cnt), at, bh, slot);
            let y2 = value_vec(vb, select(0u, vj + 2u * slices, slice + 2u * slices < cnt), at, bh, slot);
            let y3 = value_vec(vb, select(0u, vj + 3u * slices, slice + 3u * slices < cnt), at, bh, slot);
            let y4 = value_vec(vb, select(0u, vj + 4u * slices, slice + 4u * slices < cnt), at, bh, slot);
            let y5 = value_vec(vb, select(0u, vj + 5u * slices, slice + 5u * slices < cnt), at, bh, slot);
            let y6 = value_vec(vb, select(0u, vj + 6u * slices, slice + 6u * slices < cnt), at, bh, slot);
            let y7 = value_vec(vb, select(0u, vj + 7u * slices, slice + 7u * slices < cnt), at, bh, slot);
            // The query is in workgroup memory (first pass), and the last pass's sums are read.
            workgroupBarrier();
            var s = -inf();
            if (j < seen) {
                var d4 = ((qdot(x0, 0u) + qdot_in(x1, 1u, kvecs)) + (qdot_in(x2, 2u, kvecs) + qdot_in(x3, 3u, kvecs)))
                    + ((qdot_in(x4, 4u, kvecs) + qdot_in(x5, 5u, kvecs)) + (qdot_in(x6, 6u, kvecs) + qdot_in(x7, 7u, kvecs)));
                var c = KEY_LOADS;
                for (; c + 3u < kvecs; c += 4u) {
                    let z0 = key_vec(kb, j, at, bh, c);
                    let z1 = key_vec(kb, j, at, bh, c + 1u);
                    let z2 = key_vec(kb, j, at, bh, c + 2u);
                    let z3 = key_vec(kb, j, at, bh, c + 3u);
                    d4 += (qdot(z0, c) + qdot(z1, c + 1u)) + (qdot(z2, c + 2u) + qdot(z3, c + 3u));
                }
                for (; c < kvecs; c++) { d4 += qdot(key_vec(kb, j, at, bh, c), c); }
                s = (d4.x + d4.y) + (d4.z + d4.w);
            }
            let m_new = max(m, wg_max(s, lid));
            let alpha = select(exp(m - m_new), 1.0, m_new == -inf());
            let p = select(exp(s - m_new), 0.0, s == -inf());
            l = l * alpha + wg_sum(p, lid);
            m = m_new;
            pk[lid] = p;
            workgroupBarrier();
            if (slice < slices) {
                var lo = (weighted(y0, 0u, slice, cnt) + weighted(y1, 0u, slice + slices, cnt))
                    + (weighted(y2, 0u, slice + 2u * slices, cnt) + weighted(y3, 0u, slice + 3u * slices, cnt))
                    + ((weighted(y4, 0u, slice + 4u * slices, cnt) + weighted(y5, 0u, slice + 5u * slices, cnt))
                    + (weighted(y6, 0u, slice + 6u * slices, cnt) + weighted(y7, 0u, slice + 7u * slices, cnt)));
                var hi = vec4<f32>(0.0);
                if (QUADS == 2u) {
                    hi = (weighted(y0, 1u, slice, cnt) + weighted(y1, 1u, slice + slices, cnt))
                        + (weighted(y2, 1u, slice + 2u * slices, cnt) + weighted(y3, 1u, slice + 3u * slices, cnt))
                        + ((weighted(y4, 1u, slice + 4u * slices, cnt) + weighted(y5, 1u, slice + 5u * slices, cnt))
                        + (weighted(y6, 1u, slice + 6u * slices, cnt) + weighted(y7, 1u, slice + 7u * slices, cnt)));
                }
                var jj = slice + VALUE_LOADS * slices;
                for (; jj + 3u * slices < cnt; jj += 4u * slices) {
                    let z0 = value_vec(vb, j0 + jj, at, bh, slot);
                    let z1 = value_vec(vb, j0 + jj + slices, at, bh, slot);
                    let z2 = value_vec(vb, j0 + jj + 2u * slices, at, bh, slot);
                    let z3 = value_vec(vb, j0 + jj + 3u * slices, at, bh, slot);
                    let p0 = pk[jj];
                    let p1 = pk[jj + slices];
                    let p2 = pk[jj + 2u * slices];
                    let p3 = pk[jj + 3u * slices];
                    lo += (p0 * quad(z0, 0u) + p1 * quad(z1, 0u)) + (p2 * quad(z2, 0u) + p3 * quad(z3, 0u));
                    if (QUADS == 2u) {
                        hi += (p0 * quad(z0, 1u) + p1 * quad(z1, 1u)) + (p2 * quad(z2, 1u) + p3 * quad(z3, 1u));
                    }
                }
                for (; jj < cnt; jj += slices) {
                    let z = value_vec(vb, j0 + jj, at, bh, slot);
                    lo += pk[jj] * quad(z, 0u);
                    if (QUADS == 2u) { hi += pk[jj] * quad(z, 1u); }
                }
                let e = slice * dv + slot * VEC;
                vparts[e] = lo.x;
                vparts[e + 1u] = lo.y;
                vparts[e + 2u] = lo.z;
                vparts[e + 3u] = lo.w;
                if (QUADS == 2u) {
                    vparts[e + 4u] = hi.x;
                    vparts[e + 5u] = hi.y;
                    vparts[e + 6u] = hi.z;
                    vparts[e + 7u] = hi.w;
                }
            }
            workgroupBarrier();
            if (lid < dv) {
                var sum = 0.0;
                for (var t = 0u; t < slices; t++) { sum += vparts[t * dv + lid]; }
                acc = acc * alpha + sum;
            }
        }
        // Every thread has read what it reads of the cache (the last pass ends in a barrier).
        store_appended(bh, kb, vb, lid, at);
        if (lid < dv) { st4(o(4u) + row * dv + lid, select(0.0, acc / l, l > 0.0)); }
        if (lid == 0u) { store_lse(row, select(-inf(), m + log(l), l > 0.0)); }
    }
}

// @kernel forward_combine
// Joins the splits of forward_rows in order, each rescaled to the row's largest maximum: a
// thread per split reads the split's pair, so the pairs load at once, and each output element
// reads the splits' sums four at a time. Splits number at most 256 (`key_splits`).
// Bindings as forward_rows.
var<workgroup> scales: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.batch * params.heads * params.q_len;
    let splits = params.splits;
    let dv = params.v_dim;
    let pairs = o(6u) + rows * splits * dv;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let t0 = row * splits;
        var ms = -inf();
        var ls = 0.0;
        if (lid < splits) {
            ms = ld6(pairs + 2u * (t0 + lid));
            ls = ld6(pairs + 2u * (t0 + lid) + 1u);
        }
        let m = wg_max(ms, lid);
        // A split that saw no key has no sums: its scale is zero and its sums are not read.
        let e = select(exp(ms - m), 0.0, ms == -inf());
        let l = wg_sum(ls * e, lid);
        scales[lid] = e;
        workgroupBarrier();
        for (var d = lid; d < dv; d += WG) {
            let at = o(6u) + t0 * dv + d;
            var acc = 0.0;
            var s = 0u;
            for (; s + 3u < splits; s += 4u) {
                let x0 = select(0.0, ld6(at + s * dv), scales[s] != 0.0);
                let x1 = select(0.0, ld6(at + (s + 1u) * dv), scales[s + 1u] != 0.0);
                let x2 = select(0.0, ld6(at + (s + 2u) * dv), scales[s + 2u] != 0.0);
                let x3 = select(0.0, ld6(at + (s + 3u) * dv), scales[s + 3u] != 0.0);
                acc += (x0 * scales[s] + x1 * scales[s + 1u]) + (x2 * scales[s + 2u] + x3 * scales[s + 3u]);
            }
            for (; s < splits; s++) {
                acc += select(0.0, ld6(at + s * dv), scales[s] != 0.0) * scales[s];
            }
            st4(o(4u) + row * dv + d, select(0.0, acc / l, l > 0.0));
        }
        if (lid == 0u) { store_lse(row, select(-inf(), m + log(l), l > 0.0)); }
        workgroupBarrier();
    }
}

// @kernel delta
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = params.batch * params.heads * params.q_len;
    let dv = params.v_dim;
    let step = group_count(nwg) * WG;
    for (var row = group_index(wid, nwg) * WG + lid; row < rows; row += step) {
        var s = 0.0;
        for (var d = 0u; d < dv; d++) { s += ld6(o(6u) + row * dv + d) * ld4(o(4u) + row * dv + d); }
        st10(o(10u) + row, s);
    }
}

// @kernel dq
// A thread per query row: dq = scale * sum_j P_ij (dP_ij - delta_i) k_j, with
// P_ij = exp(s_ij - lse_i) and dP_ij = dout_i . v_j.
@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tq = params.q_len;
    let blocks = (tq + ROWS - 1u) / ROWS;
    let scale = params.scale;
    for (var t = group_index(wid, nwg); t < params.batch * params.heads * blocks; t += group_count(nwg)) {
        let bh = t / blocks;
        let i0 = (t % blocks) * ROWS;
        let i = i0 + lid;
        let row = bh * tq + min(i, tq - 1u);
        let lse = ld5(o(5u) + row);
        let delta = ld10(o(10u) + row);
        let live = i < tq;
        let lim = select(0u, visible(i), live && lse != -inf());
        let span = keys_seen(i0, min(i0 + ROWS, tq));
        let kb = k_base(bh);
        let vb = v_base(bh);
        let qb = o(1u) + row * kdim();
        let gb = o(6u) + row * vdim();
        LOAD_REGS
        ZERO_ACC
        for (var j0 = 0u; j0 < span; j0 += tile()) {
            let cnt = min(tile(), span - j0);
            workgroupBarrier();
            fill_a(kb + j0 * kdim(), cnt, lid);
            fill_b(vb + j0 * vdim(), cnt, lid);
            workgroupBarrier();
            for (var jj = 0u; jj < cnt && j0 + jj < lim; jj += 4u) {
                let a0 = jj * kvec();
                let b0 = jj * vvec();
                SCORES
                UPDATE
            }
        }
        if (live) {
            STORE
        }
    }
}

// @kernel dkv
// A thread per key row j of one key/value head; the queries of every head in its group pass
// through workgroup memory in order, so each gradient sums its terms in a fixed order:
// dk_j = scale * sum_i P_ij (dP_ij - delta_i) q_i and dv_j = sum_i P_ij dout_i (two variants).
var<workgroup> trow: array<vec2<f32>, TROWS>;

// lse and delta of query rows `row0..row0 + cnt`; rows past `cnt` see nothing (lse -inf).
fn fill_rows(row0: u32, cnt: u32, lid: u32) {
    for (var e = lid; e < tile(); e += ROWS) {
        var x = vec2<f32>(-inf(), 0.0);
        if (e < cnt) { x = vec2<f32>(ld5(o(5u) + row0 + e), ld10(o(10u) + row0 + e)); }
        trow[e] = x;
    }
}

@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tq = params.q_len;
    let tk = params.k_len;
    let causal = params.causal != 0u;
    let blocks = (tk + ROWS - 1u) / ROWS;
    let group = params.heads / params.kv_heads;
    let scale = params.scale;
    for (var t = group_index(wid, nwg); t < params.batch * params.kv_heads * blocks; t += group_count(nwg)) {
        let bg = t / blocks;
        let j0 = (t % blocks) * ROWS;
        let j = j0 + lid;
        let live = j < tk;
        let kr = bg * tk + min(j, tk - 1u);
        let b = bg / params.kv_heads;
        let g = bg % params.kv_heads;
        // Query i sees key j when i + Tk >= j + Tq: the block's first query, and this row's.
        var first = 0u;
        if (causal && j0 + tq > tk) { first = j0 + tq - tk; }
        var mine = 0u;
        if (causal && j + tq > tk) { mine = j + tq - tk; }
        let kb = k_at(b, g) + min(j, tk - 1u) * kdim();
        let vb = v_at(b, g) + min(j, tk - 1u) * vdim();
        LOAD_REGS
        ZERO_ACC
        for (var hh = 0u; hh < group; hh++) {
            let qrow0 = (b * params.heads + g * group + hh) * tq;
            for (var i0 = first; i0 < tq; i0 += tile()) {
                let cnt = min(tile(), tq - i0);
                workgroupBarrier();
                fill_a(o(1u) + (qrow0 + i0) * kdim(), cnt, lid);
                fill_b(o(6u) + (qrow0 + i0) * vdim(), cnt, lid);
                fill_rows(qrow0 + i0, cnt, lid);
                workgroupBarrier();
                if (live) {
                    for (var ii = (max(mine, i0) - i0) & ~3u; ii < cnt; ii += 4u) {
                        let a0 = ii * kvec();
                        let b0 = ii * vvec();
                        SCORES
                        UPDATE
                    }
                }
            }
        }
        if (live) {
            STORE
        }
    }
}
