// Optimizer updates, a thread per element, in place, and the squared norm by partial sums.
// Parameters: `AdamParams`, `SgdParams`, `SquaresParams`, `SumParams` (optim.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// @kernel adam
// Bindings: 1 param, 2 grad, 3 m, 4 v, 5 the step's values (grad scale, step size, decay,
// sqrt of bias correction 2), 6 param out, 7 m out, 8 v out.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    let scale = ld5(o(5u));
    let step_size = ld5(o(5u) + 1u);
    let decay_factor = ld5(o(5u) + 2u);
    let sqrt_bias_correction2 = ld5(o(5u) + 3u);
    let b1 = params.beta1;
    let b2 = params.beta2;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        var w = ld1(o(1u) + i);
        var g = ld2(o(2u) + i) * scale;
        DECAY
        let m = b1 * ld3(o(3u) + i) + (1.0 - b1) * g;
        let v = b2 * ld4(o(4u) + i) + (1.0 - b2) * g * g;
        w -= step_size * m / (sqrt(v) / sqrt_bias_correction2 + params.eps);
        st6(o(6u) + i, w);
        st7(o(7u) + i, m);
        st8(o(8u) + i, v);
    }
}

// @kernel sgd
// Bindings: 1 param, 2 grad, [3 momentum buffer,] scale, param out, [buffer out].
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    let scale = ldSCALE(o(SCALEu));
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        let w = ld1(o(1u) + i);
        var d = ld2(o(2u) + i) * scale + params.weight_decay * w;
        MOMENTUM
        stPOUT(o(POUTu) + i, w - params.lr * d);
    }
}

// @kernel squares
// Bindings: 1 x, 2 partial sums, written from `params.first`.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let n = params.elements;
    let chunk = params.chunk;
    let chunks = (n + chunk - 1u) / chunk;
    for (var c = group_index(wid, nwg); c < chunks; c += group_count(nwg)) {
        var s = 0.0;
        let end = min(n, (c + 1u) * chunk);
        for (var i = c * chunk + lid; i < end; i += WG) { let x = ld1(o(1u) + i); s += x * x; }
        let t = wg_sum(s, lid);
        if (lid == 0u) { st2(o(2u) + params.first + c, t); }
    }
}

// @kernel sum_partials
// Bindings: 1 partial sums, 2 output [1].
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    var s = 0.0;
    for (var i = lid; i < params.count; i += WG) { s += ld1(o(1u) + i); }
    let t = wg_sum(s, lid);
    if (lid == 0u) { st2(o(2u), t); }
}
