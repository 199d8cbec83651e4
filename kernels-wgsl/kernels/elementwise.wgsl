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
