// Rotary embeddings and fused attention, forward and backward, without materializing the
// score matrix: scores are formed 256 keys (or queries) at a time in workgroup memory and
// folded into running results with an online softmax.
// Attention parameters: p[0] B, p[1] Hq, p[2] Hkv, p[3] Tq, p[4] Tk, p[5] D, p[6] Dv,
// p[7] causal, p[8] scale, then binding offsets from p[9].

fn o(k: u32) -> u32 { return p[8u + k]; }

var<workgroup> pb: array<f32, 256>;
var<workgroup> sb: array<f32, 256>;

// The number of keys query `i` sees.
fn visible(i: u32) -> u32 {
    if (p[7] == 0u) { return p[4]; }
    return min(p[4], i + p[4] - p[3] + 1u);
}

// Key/value row base (in rows of keys) for query row `row` = ((b * Hq) + h) * Tq + i.
fn kv_rows(row: u32) -> u32 {
    let bh = row / p[3];
    let b = bh / p[1];
    let h = bh % p[1];
    let g = h / (p[1] / p[2]);
    return (b * p[2] + g) * p[4];
}

fn dot_qk(qb: u32, kb: u32) -> f32 {
    var s = 0.0;
    for (var d = 0u; d < p[5]; d++) { s += ld1(qb + d) * ld2(kb + d); }
    return s;
}

// @kernel rotary
// Bindings: 1 x, 2 cos, 3 sin, 4 y. p[0] elements, p[1] T, p[2] D, offsets from p[3].
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let dd = p[2];
    let half = dd / 2u;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let d = e % dd;
        let t = (e / dd) % p[1];
        let x = ld1(p[3] + e);
        var y: f32;
        if (d < half) {
            let cs = t * half + d;
            y = x * ld2(p[4] + cs) - ld1(p[3] + e + half) * ld3(p[5] + cs);
        } else {
            let cs = t * half + d - half;
            y = x * ld2(p[4] + cs) + ld1(p[3] + e - half) * ld3(p[5] + cs);
        }
        st4(p[6] + e, y);
    }
}

// @kernel forward
// Bindings: 1 q, 2 k, 3 v, 4 out (also the running accumulator), 5 lse. A workgroup per
// query row.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = p[0] * p[1] * p[3];
    let dk = p[5];
    let dv = p[6];
    let scale = pf(8u);
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let i = row % p[3];
        let lim = visible(i);
        let qb = o(1u) + row * dk;
        let kr = kv_rows(row);
        let ob = o(4u) + row * dv;
        for (var d = lid; d < dv; d += WG) { st4(ob + d, 0.0); }
        var m = -inf();
        var l = 0.0;
        for (var j0 = 0u; j0 < lim; j0 += WG) {
            let j = j0 + lid;
            var s = -inf();
            if (j < lim) { s = scale * dot_qk(qb, o(2u) + (kr + j) * dk); }
            let m_new = max(m, wg_max(s, lid));
            let alpha = select(exp(m - m_new), 1.0, m_new == -inf());
            let pj = select(exp(s - m_new), 0.0, s == -inf());
            l = l * alpha + wg_sum(pj, lid);
            m = m_new;
            pb[lid] = pj;
            workgroupBarrier();
            let cnt = min(WG, lim - j0);
            for (var d = lid; d < dv; d += WG) {
                var acc = ld4(ob + d) * alpha;
                for (var jj = 0u; jj < cnt; jj++) { acc += pb[jj] * ld3(o(3u) + (kr + j0 + jj) * dv + d); }
                st4(ob + d, acc);
            }
            workgroupBarrier();
        }
        for (var d = lid; d < dv; d += WG) {
            st4(ob + d, select(0.0, ld4(ob + d) / l, l > 0.0));
        }
        if (lid == 0u) { st5(o(5u) + row, select(-inf(), m + log(l), l > 0.0)); }
        workgroupBarrier();
    }
}

// Backward bindings: 1 q, 2 k, 3 v, 4 out, 5 lse, 6 dout, 7 dq, 8 dk, 9 dv, 10 delta (scratch,
// one per query row: sum(dout * out)).

// @kernel delta
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = p[0] * p[1] * p[3];
    let dv = p[6];
    let step = group_count(nwg) * WG;
    for (var row = group_index(wid, nwg) * WG + lid; row < rows; row += step) {
        var s = 0.0;
        for (var d = 0u; d < dv; d++) { s += ld6(o(6u) + row * dv + d) * ld4(o(4u) + row * dv + d); }
        st10(o(10u) + row, s);
    }
}

// @kernel dq
// A workgroup per query row: dq = scale * sum_j P_ij (dP_ij - delta_i) k_j.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = p[0] * p[1] * p[3];
    let dk = p[5];
    let dv = p[6];
    let scale = pf(8u);
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let i = row % p[3];
        let lim = visible(i);
        let qb = o(1u) + row * dk;
        let kr = kv_rows(row);
        let lse = ld5(o(5u) + row);
        let delta = ld10(o(10u) + row);
        let gb = o(7u) + row * dk;
        for (var d = lid; d < dk; d += WG) { st7(gb + d, 0.0); }
        for (var j0 = 0u; j0 < lim; j0 += WG) {
            let j = j0 + lid;
            var ds = 0.0;
            if (j < lim && lse != -inf()) {
                let pij = exp(scale * dot_qk(qb, o(2u) + (kr + j) * dk) - lse);
                var dp = 0.0;
                for (var d = 0u; d < dv; d++) { dp += ld6(o(6u) + row * dv + d) * ld3(o(3u) + (kr + j) * dv + d); }
                ds = pij * (dp - delta);
            }
            pb[lid] = ds;
            workgroupBarrier();
            let cnt = min(WG, lim - j0);
            for (var d = lid; d < dk; d += WG) {
                var acc = ld7(gb + d);
                for (var jj = 0u; jj < cnt; jj++) { acc += scale * pb[jj] * ld2(o(2u) + (kr + j0 + jj) * dk + d); }
                st7(gb + d, acc);
            }
            workgroupBarrier();
        }
    }
}

// @kernel dkv
// A workgroup per key row (b, g, j): sums over the query heads of its group, in order, and
// over their queries: dv_j = sum P_ij dout_i, dk_j = scale * sum dS_ij q_i.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let krows = p[0] * p[2] * p[4];
    let dk = p[5];
    let dv = p[6];
    let tq = p[3];
    let tk = p[4];
    let scale = pf(8u);
    let group = p[1] / p[2];
    for (var kr = group_index(wid, nwg); kr < krows; kr += group_count(nwg)) {
        let j = kr % tk;
        let bg = kr / tk;
        let b = bg / p[2];
        let g = bg % p[2];
        let kb = o(2u) + kr * dk;
        let vb = o(3u) + kr * dv;
        let gk = o(8u) + kr * dk;
        let gv = o(9u) + kr * dv;
        for (var d = lid; d < dk; d += WG) { st8(gk + d, 0.0); }
        for (var d = lid; d < dv; d += WG) { st9(gv + d, 0.0); }
        // Causal: query i sees key j when j <= i + tk - tq, i.e. i >= j + tq - tk.
        var i_start = 0u;
        if (p[7] != 0u && j + tq > tk) { i_start = j + tq - tk; }
        for (var hh = 0u; hh < group; hh++) {
            let h = g * group + hh;
            let qrow0 = (b * p[1] + h) * tq;
            for (var i0 = i_start; i0 < tq; i0 += WG) {
                let i = i0 + lid;
                var pij = 0.0;
                var ds = 0.0;
                if (i < tq) {
                    let row = qrow0 + i;
                    let lse = ld5(o(5u) + row);
                    if (lse != -inf()) {
                        pij = exp(scale * dot_qk(o(1u) + row * dk, kb) - lse);
                        var dp = 0.0;
                        for (var d = 0u; d < dv; d++) { dp += ld6(o(6u) + row * dv + d) * ld3(vb + d); }
                        ds = pij * (dp - ld10(o(10u) + row));
                    }
                }
                pb[lid] = pij;
                sb[lid] = ds;
                workgroupBarrier();
                let cnt = min(WG, tq - i0);
                for (var d = lid; d < dv; d += WG) {
                    var acc = ld9(gv + d);
                    for (var ii = 0u; ii < cnt; ii++) { acc += pb[ii] * ld6(o(6u) + (qrow0 + i0 + ii) * dv + d); }
                    st9(gv + d, acc);
                }
                for (var d = lid; d < dk; d += WG) {
                    var acc = ld8(gk + d);
                    for (var ii = 0u; ii < cnt; ii++) { acc += scale * sb[ii] * ld1(o(1u) + (qrow0 + i0 + ii) * dk + d); }
                    st8(gk + d, acc);
                }
                workgroupBarrier();
            }
        }
    }
}
