// Optimizer updates, a thread per element, in place, and the squared norm by partial sums.
// Parameters: p[0] element count, p[1..8] scalars, then binding offsets from p[8].

fn o(k: u32) -> u32 { return p[7u + k]; }

// @kernel adam
// Bindings: 1 param, 2 grad, 3 m, 4 v, 5 grad_scale, 6 param out, 7 m out, 8 v out.
// Scalars: lr / bc1, beta1, beta2, eps, weight decay, sqrt(bc2), 1 - lr * weight decay.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let step = group_count(nwg) * WG;
    let scale = ld5(o(5u));
    let b1 = pf(2u);
    let b2 = pf(3u);
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        var w = ld1(o(1u) + i);
        var g = ld2(o(2u) + i) * scale;
        DECAY
        let m = b1 * ld3(o(3u) + i) + (1.0 - b1) * g;
        let v = b2 * ld4(o(4u) + i) + (1.0 - b2) * g * g;
        w -= pf(1u) * m / (sqrt(v) / pf(6u) + pf(4u));
        st6(o(6u) + i, w);
        st7(o(7u) + i, m);
        st8(o(8u) + i, v);
    }
}

// @kernel sgd
// Bindings: 1 param, 2 grad, [3 momentum buffer,] scale, param out, [buffer out].
// Scalars: lr, momentum, grad_coef, weight decay.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let step = group_count(nwg) * WG;
    let scale = ldSCALE(o(SCALEu));
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        let w = ld1(o(1u) + i);
        var d = ld2(o(2u) + i) * scale + pf(4u) * w;
        MOMENTUM
        stPOUT(o(POUTu) + i, w - pf(1u) * d);
    }
}

// @kernel squares
// Bindings: 1 x, 2 partial sums. p[0] elements, p[1] elements per chunk, p[2] first partial.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let n = p[0];
    let chunk = p[1];
    let chunks = (n + chunk - 1u) / chunk;
    for (var c = group_index(wid, nwg); c < chunks; c += group_count(nwg)) {
        var s = 0.0;
        let end = min(n, (c + 1u) * chunk);
        for (var i = c * chunk + lid; i < end; i += WG) { let x = ld1(o(1u) + i); s += x * x; }
        let t = wg_sum(s, lid);
        if (lid == 0u) { st2(o(2u) + p[2] + c, t); }
    }
}

// @kernel sum_partials
// Bindings: 1 partial sums, 2 output [1]. p[0] partial count.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    var s = 0.0;
    for (var i = lid; i < p[0]; i += WG) { s += ld1(o(1u) + i); }
    let t = wg_sum(s, lid);
    if (lid == 0u) { st2(o(2u), t); }
}
