// im2col and col2im for conv2d (which then runs as matmuls), over a part of the columns.
// Parameters: `Im2colParams` (conv.rs). Columns of a part are [N, CP*KH*KW, LP] for its
// `part_channels` CP from `first_channel` and `part_positions` LP from `first_position`.

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// @kernel im2col
// Bindings: 1 x [N, C, H, W], 2 the part's columns.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lp = params.part_positions;
    let kk = params.kernel_h * params.kernel_w;
    let rows = params.part_channels * kk;
    let total = params.images * rows * lp;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < total; e += step) {
        let li = params.first_position + e % lp;
        let r = (e / lp) % rows;
        let n = e / (lp * rows);
        let c = params.first_channel + r / kk;
        let kh = (r / params.kernel_w) % params.kernel_h;
        let kw = r % params.kernel_w;
        let h = i32((li / params.out_w) * params.stride[0] + kh * params.dilation[0]) - i32(params.padding[0]);
        let w = i32((li % params.out_w) * params.stride[1] + kw * params.dilation[1]) - i32(params.padding[1]);
        var v = 0.0;
        if (h >= 0 && w >= 0 && u32(h) < params.height && u32(w) < params.width) {
            v = ld1(o(1u) + ((n * params.channels + c) * params.height + u32(h)) * params.width + u32(w));
        }
        st2(o(2u) + e, v);
    }
}

// @kernel col2im
// Bindings: 1 the part's columns (all positions: `first_position` 0, LP = OH*OW), 2 dx [N, C, H, W], of
// which the part's channels are written. Each input element sums the column entries it fed,
// in a fixed order.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let l = params.out_h * params.out_w;
    let cp = params.part_channels;
    let rows = cp * params.kernel_h * params.kernel_w;
    let total = params.images * cp * params.height * params.width;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < total; e += step) {
        let w = e % params.width;
        let h = (e / params.width) % params.height;
        let cl = (e / (params.width * params.height)) % cp;
        let n = e / (params.width * params.height * cp);
        var s = 0.0;
        for (var kh = 0u; kh < params.kernel_h; kh++) {
            let th = i32(h + params.padding[0]) - i32(kh * params.dilation[0]);
            if (th < 0 || u32(th) % params.stride[0] != 0u) { continue; }
            let oh = u32(th) / params.stride[0];
            if (oh >= params.out_h) { continue; }
            for (var kw = 0u; kw < params.kernel_w; kw++) {
                let tw = i32(w + params.padding[1]) - i32(kw * params.dilation[1]);
                if (tw < 0 || u32(tw) % params.stride[1] != 0u) { continue; }
                let ow = u32(tw) / params.stride[1];
                if (ow >= params.out_w) { continue; }
                let r = (cl * params.kernel_h + kh) * params.kernel_w + kw;
                s += ld1(o(1u) + (n * rows + r) * l + oh * params.out_w + ow);
            }
        }
        st2(o(2u) + ((n * params.channels + params.first_channel + cl) * params.height + h) * params.width + w, s);
    }
}
