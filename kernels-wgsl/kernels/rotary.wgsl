// Rotary position embeddings: each pair (d, d + D/2) of a row rotated by its position's angle.

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
