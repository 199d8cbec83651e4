// The row pass of attention's backward on tensor cores (attention_products.rs): between the
// products S = q k^T, dP = dout v^T (f32, one row per query of every batch and head) and the
// products of the gradients, it forms each row's probabilities and score gradients.
// Parameters: `AttentionParams` (attention.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// The keys query `i` sees (causal: key j is visible when j + Tq <= i + Tk).
fn seen(i: u32) -> u32 {
    if (params.causal == 0u) { return params.k_len; }
    if (i + params.k_len + 1u <= params.q_len) { return 0u; }
    return min(params.k_len, i + params.k_len + 1u - params.q_len);
}

// @kernel scores_grad
// Bindings: 1 S, 2 dP, 3 lse, 4 and 5 P's parts, 6 and 7 dS's. A workgroup per row:
// P_ij = exp(scale S_ij - lse_i) for the visible keys (0 past them, and for a row that sees
// none: lse = -inf), then delta_i = sum_j P_ij dP_ij (in f32, as the fused kernels form it for
// 16-bit outputs) and dS_ij = scale P_ij (dP_ij - delta_i), the gradient of the unscaled
// scores. Each is stored as two parts of the bindings' dtype: the value rounded, then what the
// rounding left out (read back from the first).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let tk = params.k_len;
    let rows = params.batch * params.heads * params.q_len;
    let scale = params.scale;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let lse = ld3(o(3u) + row);
        let visible = select(seen(row % params.q_len), 0u, lse == -inf());
        let s0 = o(1u) + row * tk;
        let d0 = o(2u) + row * tk;
        var part = 0.0;
        for (var j = lid; j < visible; j += WG) {
            part += exp(scale * ld1(s0 + j) - lse) * ld2(d0 + j);
        }
        let delta = wg_sum(part, lid);
        for (var j = lid; j < tk; j += WG) {
            var p = 0.0;
            var ds = 0.0;
            if (j < visible) {
                p = exp(scale * ld1(s0 + j) - lse);
                ds = scale * p * (ld2(d0 + j) - delta);
            }
            let e = row * tk + j;
            st4(o(4u) + e, p);
            st5(o(5u) + e, p - ld4(o(4u) + e));
            st6(o(6u) + e, ds);
            st7(o(7u) + e, ds - ld6(o(6u) + e));
        }
    }
}
