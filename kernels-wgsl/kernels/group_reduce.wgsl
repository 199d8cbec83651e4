// Workgroup reductions: every thread passes its value and gets the result, `wg_sum` and
// `wg_max` (NaN wins). Call from uniform control flow only. Every kernel gets one of the two
// sections below (`shader.rs` says how kernels using them declare their entry point). Either
// way the order of the additions is fixed on a given device, so results are deterministic.

// @kernel tree
// A binary tree through workgroup memory: eight barriers per reduction.
fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
fn wg_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] = max_nan(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// @kernel subgroup
// Each subgroup reduces in registers; its first lane writes the result to `red` at the
// subgroup's index, and every thread adds those in index order: two barriers per reduction.
var<private> sg_index: u32;
var<private> sg_count: u32;
var<private> sg_lane: u32;
fn sg_enter(index: u32, count: u32, lane: u32) {
    sg_index = index;
    sg_count = count;
    sg_lane = lane;
}
fn wg_sum(v: f32, lid: u32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) { red[sg_index] = s; }
    workgroupBarrier();
    var r = red[0];
    for (var i = 1u; i < sg_count; i++) { r += red[i]; }
    workgroupBarrier();
    return r;
}
fn wg_max(v: f32, lid: u32) -> f32 {
    // Subgroup max leaves NaN to the implementation; NaN is looked for separately.
    let m = select(subgroupMax(v), nan(), subgroupAny(is_nan(v)));
    if (sg_lane == 0u) { red[sg_index] = m; }
    workgroupBarrier();
    var r = red[0];
    for (var i = 1u; i < sg_count; i++) { r = max_nan(r, red[i]); }
    workgroupBarrier();
    return r;
}
