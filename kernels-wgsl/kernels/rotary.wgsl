// Rotary position embeddings: each pair (d, d + D/2) of a row rotated by its position's angle.

// @kernel rotary
// Bindings: 1 x, 2 cos, 3 sin, 4 y. Parameters: `RotaryParams` (attention.rs).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let dd = params.head_size;
    let half = dd / 2u;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let d = e % dd;
        let t = (e / dd) % params.positions;
        let x = ld1(params.offsets[0] + e);
        var y: f32;
        if (d < half) {
            let cs = t * half + d;
            y = x * ld2(params.offsets[1] + cs) - ld1(params.offsets[0] + e + half) * ld3(params.offsets[2] + cs);
        } else {
            let cs = t * half + d - half;
            y = x * ld2(params.offsets[1] + cs) + ld1(params.offsets[0] + e - half) * ld3(params.offsets[2] + cs);
        }
        st4(params.offsets[3] + e, y);
    }
}
