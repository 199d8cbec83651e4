// The row pass of attention's backward on tensor cores (attention_products.rs): between the
// products S = q k^T, dP = dout v^T (f32, one row per query of every batch and head) and the
// products of the gradients, it forms each row's probabilities and score gradients.
// Parameters: `ScoresParams` (attention_products.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// The keys query `i` sees (causal: key j is visible when j + Tq <= i + Tk).
fn seen(i: u32) -> u32 {
    if (params.causal == 0u) { return params.k_len; }
    if (i + params.k_len + 1u <= params.q_len) { return 0u; }
    return min(params.k_len, i + params.k_len + 1u - params.q_len);
}

// `v` as two values of the bindings' dtype: rounded, and what the rounding left out.
fn parts(v: f32) -> vec2<f32> {
    let hi = ROUNDED;
    return vec2<f32>(hi, v - hi);
}

// (P_ij, dP_ij) of key `j` of the row whose S and dP start at `s0` and `d0`; zeros past the
// `visible` keys.
fn prob(s0: u32, d0: u32, j: u32, visible: u32, lse: f32) -> vec2<f32> {
    if (j >= visible) { return vec2<f32>(0.0); }
    return vec2<f32>(exp(params.scale * ld1(s0 + j) - lse), ld2(d0 + j));
}

// Stores the parts of P_ij and dS_ij = scale P_ij (dP_ij - delta_i) of key `j` of `row`.
fn put_parts(row: u32, j: u32, x: vec2<f32>, delta: f32) {
    if (j >= params.k_len) { return; }
    let e = row * params.k_len + j;
    let p = parts(x.x);
    let ds = parts(params.scale * x.x * (x.y - delta));
    KEEP_PARTS
}

// Stores keys `j` (even) and `j + 1` of `row`, as whole words where the dtype packs two to a
// word (generated, attention_products.rs).
fn put_pair(row: u32, j: u32, x: vec2<f32>, y: vec2<f32>, delta: f32) {
    PUT_PAIR
}

// @kernel scores_grad
// Bindings: 1 S, 2 dP, 3 lse, 4 and 5 P's parts, 6 and 7 dS's (f32: 4 P, 5 dS, whole). A
// workgroup per row: P_ij = exp(scale S_ij - lse_i) for the visible keys (0 past them, and
// for a row that sees none: lse = -inf), then delta_i = sum_j P_ij dP_ij (in f32, as the fused
// kernels form it for 16-bit outputs) and dS_ij = scale P_ij (dP_ij - delta_i), the gradient
// of the unscaled scores, each stored in two parts (`parts`) where the dtype is 16-bit. Each
// thread takes pairs of adjacent keys; rows of up to 4 * WG keys are read once, held in
// registers, longer ones twice.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let tk = params.k_len;
    let rows = params.batch * params.heads * params.q_len;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let lse = ld3(o(3u) + row);
        let visible = select(seen(row % params.q_len), 0u, lse == -inf());
        let s0 = o(1u) + row * tk;
        let d0 = o(2u) + row * tk;
        if (tk <= 4u * WG) {
            let j0 = 2u * lid;
            let j1 = j0 + 2u * WG;
            let x0 = prob(s0, d0, j0, visible, lse);
            let y0 = prob(s0, d0, j0 + 1u, visible, lse);
            let x1 = prob(s0, d0, j1, visible, lse);
            let y1 = prob(s0, d0, j1 + 1u, visible, lse);
            let delta = wg_sum(x0.x * x0.y + y0.x * y0.y + x1.x * x1.y + y1.x * y1.y, lid);
            put_pair(row, j0, x0, y0, delta);
            put_pair(row, j1, x1, y1, delta);
        } else {
            var part = 0.0;
            for (var j = lid; j < visible; j += WG) {
                let x = prob(s0, d0, j, visible, lse);
                part += x.x * x.y;
            }
            let delta = wg_sum(part, lid);
            for (var j = 2u * lid; j < tk; j += 2u * WG) {
                let x = prob(s0, d0, j, visible, lse);
                put_pair(row, j, x, prob(s0, d0, j + 1u, visible, lse), delta);
            }
        }
    }
}
