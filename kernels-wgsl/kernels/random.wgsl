// Creation and random ops over a row-major output, one thread per element.
// Parameters: `FillParams`, `ArangeParams`, `RandomParams` (random.rs); `first` is the index
// of the output's first element in the whole tensor (a part of a tensor past one binding).

fn out_at(i: u32) -> u32 { return params.offsets[0] + i; }

// High and low words of a 32x32-bit product.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    let hi = ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, a * b);
}

// Philox4x32-10, as core's `rng::philox4x32`.
fn philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let p0 = mulhilo(0xD2511F53u, c.x);
        let p1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}

// -ln(u) for u in (0, 1]. Near 1 the series of -ln(1 - d) replaces log, whose error bound
// there is absolute, not relative.
fn neg_log_unit(u: f32) -> f32 {
    let d = 1.0 - u;
    if (d < 0.0625) {
        return d * (1.0 + d * (0.5 + d * (0.33333334 + d * (0.25 + d * (0.2 + d * (0.16666667 + d * 0.14285715))))));
    }
    return -log(u);
}

// @kernel fill
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        stn1(out_at(i), FILL_VALUE);
    }
}

// @kernel fill_words
// A bf16 fill of whole 32-bit words (`params.elements` even, the output starting on a word):
// a thread per word, no atomic updates of half words.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements / 2u;
    let word = params.value | (params.value << 16u);
    let step = group_count(nwg) * WG;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        stw1(params.offsets[0] / 2u + i, word);
    }
}

// @kernel arange_float
// start and step arrive as (hi, lo) f32 pairs; the product and sum are carried in two floats
// (exact products by fma), so the result is the f64 value rounded once to f32, or truncated
// exactly for integer outputs.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    let a_hi = params.start_hi;
    let a_lo = params.start_lo;
    let d_hi = params.step_hi;
    let d_lo = params.step_lo;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        let g = params.first + i;
        let ih = f32(g & 0xfffff000u);
        let il = f32(g & 0xfffu);
        let ph = ih * d_hi;
        let pe = fma(ih, d_hi, -ph);
        let qh = il * d_hi;
        let qe = fma(il, d_hi, -qh);
        let s1 = ph + qh;
        let bb = s1 - ph;
        let e1 = (ph - (s1 - bb)) + (qh - bb);
        let s = a_hi + s1;
        let cc = s - a_hi;
        let e2 = (a_hi - (s - cc)) + (s1 - cc);
        let lo = e1 + e2 + pe + qe + a_lo + (ih + il) * d_lo;
        STORE
    }
}

// @kernel uniform
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    let key = vec2<u32>(params.key[0], params.key[1]);
    let lo = params.a;
    let hi = params.b;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        let w = philox(vec4<u32>(params.first + i, 0u, params.stream[0], params.stream[1]), key);
        st1(out_at(i), lo + (hi - lo) * (f32(w.x >> 8u) * 5.9604644775390625e-8));
    }
}

// @kernel normal
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    let key = vec2<u32>(params.key[0], params.key[1]);
    let mean = params.a;
    let sd = params.b;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        let w = philox(vec4<u32>(params.first + i, 0u, params.stream[0], params.stream[1]), key);
        let u1 = f32((w.x >> 8u) + 1u) * 5.9604644775390625e-8;
        let u2 = f32(w.y >> 8u) * 5.9604644775390625e-8;
        st1(out_at(i), mean + sd * sqrt(2.0 * neg_log_unit(u1)) * -cos(6.2831854820251465 * (u2 - 0.5)));
    }
}
