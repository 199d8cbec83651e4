// Elementwise ops over strided inputs, one thread per output element, grid-stride loop.
// Parameters: `MapParams` (elementwise.rs). The shape arrives with its dimensions merged
// wherever every operand allows, so most launches are of rank 1; code generated for the rank
// works out the element's coordinates once and each operand's offset `oK` from them.

fn s0() -> f32 { return params.scalars[0]; }
fn s1() -> f32 { return params.scalars[1]; }

// @kernel map
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let step = group_count(nwg) * WG;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        OFFSETS
        BODY
    }
}

// @kernel map_wide
// A thread per 8 elements along a contiguous innermost dimension, `params.elements` a
// multiple of 8; the generated code loads and stores 16-byte vectors (`wide_body`).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements / 8u;
    let step = group_count(nwg) * WG;
    for (var g = group_index(wid, nwg) * WG + lid; g < n; g += step) {
        let i = g * 8u;
        OFFSETS
        BODY
    }
}
