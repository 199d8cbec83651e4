// Fused cross-entropy over rows of any length: a workgroup per row, max-subtracted
// log-sum-exp. Parameters: `LossParams` (loss.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// @kernel cross_entropy
// Bindings: 1 logits, 2 targets, 3 loss, 4 lse.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let v = params.vocab;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let x0 = o(1u) + row * v;
        // Two neighbours a thread: a warp's loads of 16-bit logits take whole 32-bit words.
        var m = -inf();
        for (var j = 2u * lid; j < v; j += 2u * WG) {
            m = max_nan(m, ld1(x0 + j));
            if (j + 1u < v) { m = max_nan(m, ld1(x0 + j + 1u)); }
        }
        m = wg_max(m, lid);
        var s = 0.0;
        for (var j = 2u * lid; j < v; j += 2u * WG) {
            s += exp(ld1(x0 + j) - m);
            if (j + 1u < v) { s += exp(ld1(x0 + j + 1u) - m); }
        }
        let lse = m + log(wg_sum(s, lid));
        if (lid == 0u) {
            let t = ldi2(o(2u) + row);
            var loss = 0.0;
            if (t >= 0 && u32(t) < v) { loss = lse - ld1(x0 + u32(t)); }
            st3(o(3u) + row, loss);
            st4(o(4u) + row, lse);
        }
    }
}

// @kernel cross_entropy_backward
// Bindings: 1 logits, 2 targets, 3 lse, 4 dloss, 5 dlogits. A thread per pair of elements
// that share a 32-bit word of dlogits (pairs may straddle rows): a bf16 output is then written
// a word at a time; the one element before the first whole word and the one after the last,
// where the output has them, are written alone.
fn logit_grad(e: u32) -> f32 {
    let v = params.vocab;
    let row = e / v;
    let t = ldi2(o(2u) + row);
    if (t < 0 || u32(t) >= v) { return 0.0; }
    let sm = exp(ld1(o(1u) + e) - ld3(o(3u) + row));
    return (sm - select(0.0, 1.0, u32(t) == e % v)) * ld4(o(4u) + row);
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.rows * params.vocab;
    let first = o(5u) & 1u;
    let pairs = select(0u, (n - first) / 2u, n > first);
    let step = group_count(nwg) * WG;
    for (var p = group_index(wid, nwg) * WG + lid; p <= pairs; p += step) {
        if (p < pairs) {
            let e = first + 2u * p;
            st5_two(o(5u) + e, logit_grad(e), logit_grad(e + 1u));
        } else {
            if (first == 1u && n > 0u) { st5(o(5u), logit_grad(0u)); }
            let last = first + 2u * pairs;
            if (last < n) { st5(o(5u) + last, logit_grad(last)); }
        }
    }
}
