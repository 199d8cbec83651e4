// Elementwise ops over strided inputs, one thread per output element, grid-stride loop.
// Parameters: p[0] element count, p[1] rank, p[2..6] scalars, p[6..6+rank] shape, then per
// tensor (inputs, then outputs) its element offset followed by its `rank` strides. The shape
// arrives with its dimensions merged wherever every operand allows (elementwise.rs), so most
// launches are of rank 1; code generated for the rank works out the element's coordinates once
// and each operand's offset `oK` from them.

fn s0() -> f32 { return pf(2u); }
fn s1() -> f32 { return pf(3u); }

// @kernel map
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let step = group_count(nwg) * WG;
    for (var i = group_index(wid, nwg) * WG + lid; i < n; i += step) {
        OFFSETS
        BODY
    }
}
