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
        var m = -inf();
        for (var j = lid; j < v; j += WG) { m = max_nan(m, ld1(x0 + j)); }
        m = wg_max(m, lid);
        var s = 0.0;
        for (var j = lid; j < v; j += WG) { s += exp(ld1(x0 + j) - m); }
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
// Bindings: 1 logits, 2 targets, 3 lse, 4 dloss, 5 dlogits. A thread per element.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.rows * params.vocab;
    let v = params.vocab;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let row = e / v;
        let j = e % v;
        let t = ldi2(o(2u) + row);
        var g = 0.0;
        if (t >= 0 && u32(t) < v) {
            let sm = exp(ld1(o(1u) + e) - ld3(o(3u) + row));
            g = (sm - select(0.0, 1.0, u32(t) == j)) * ld4(o(4u) + row);
        }
        st5(o(5u) + e, g);
    }
}
