// im2col and col2im for conv2d (which then runs as matmuls), over a part of the columns.
// Parameters: p[0] images N, p[1] C, p[2] H, p[3] W, p[4] KH, p[5] KW, p[6] OH, p[7] OW,
// p[8..10] stride, p[10..12] padding, p[12..14] dilation; the part: p[14] first channel,
// p[15] channels CP, p[16] first output position, p[17] positions LP; binding offsets from
// p[18]. Columns of a part are [N, CP*KH*KW, LP].

fn o(k: u32) -> u32 { return p[17u + k]; }

// @kernel im2col
// Bindings: 1 x [N, C, H, W], 2 the part's columns.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lp = p[17];
    let kk = p[4] * p[5];
    let rows = p[15] * kk;
    let total = p[0] * rows * lp;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < total; e += step) {
        let li = p[16] + e % lp;
        let r = (e / lp) % rows;
        let n = e / (lp * rows);
        let c = p[14] + r / kk;
        let kh = (r / p[5]) % p[4];
        let kw = r % p[5];
        let h = i32((li / p[7]) * p[8] + kh * p[12]) - i32(p[10]);
        let w = i32((li % p[7]) * p[9] + kw * p[13]) - i32(p[11]);
        var v = 0.0;
        if (h >= 0 && w >= 0 && u32(h) < p[2] && u32(w) < p[3]) {
            v = ld1(o(1u) + ((n * p[1] + c) * p[2] + u32(h)) * p[3] + u32(w));
        }
        st2(o(2u) + e, v);
    }
}

// @kernel col2im
// Bindings: 1 the part's columns (all positions: p[16] 0, LP = OH*OW), 2 dx [N, C, H, W], of
// which the part's channels are written. Each input element sums the column entries it fed,
// in a fixed order.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let l = p[6] * p[7];
    let cp = p[15];
    let rows = cp * p[4] * p[5];
    let total = p[0] * cp * p[2] * p[3];
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < total; e += step) {
        let w = e % p[3];
        let h = (e / p[3]) % p[2];
        let cl = (e / (p[3] * p[2])) % cp;
        let n = e / (p[3] * p[2] * cp);
        var s = 0.0;
        for (var kh = 0u; kh < p[4]; kh++) {
            let th = i32(h + p[10]) - i32(kh * p[12]);
            if (th < 0 || u32(th) % p[8] != 0u) { continue; }
            let oh = u32(th) / p[8];
            if (oh >= p[6]) { continue; }
            for (var kw = 0u; kw < p[5]; kw++) {
                let tw = i32(w + p[11]) - i32(kw * p[13]);
                if (tw < 0 || u32(tw) % p[9] != 0u) { continue; }
                let ow = u32(tw) / p[9];
                if (ow >= p[7]) { continue; }
                let r = (cl * p[4] + kh) * p[5] + kw;
                s += ld1(o(1u) + (n * rows + r) * l + oh * p[7] + ow);
            }
        }
        st2(o(2u) + ((n * p[1] + p[14] + cl) * p[2] + h) * p[3] + w, s);
    }
}
