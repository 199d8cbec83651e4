// Layer norm and RMS norm over rows, forward and backward. Rows are written two neighbours
// per thread (`stK_two`): a bf16 output then takes whole 32-bit words, not one atomic update
// per element. The weight gradients are summed over rows in a fixed order: by chunks of rows
// over 64 columns at a time where there are many rows, else by a workgroup per column.
//
// layer_norm, rms_norm and their `_dx` kernels go a workgroup per row, or a subgroup per row
// (norm.rs, `rows_code`): the code that opens the loop over rows sets `row`, the thread's
// `lane` of `lanes` sharing it, and whether the row is `live` (a subgroup past the last row
// computes the last one again and stores nothing, so that its sums stay in uniform control
// flow), and `row_sum` adds a value over the row's threads: a workgroup sum, or a subgroup's
// without the workgroup's barriers, which a workgroup per row waits on with little else to do.
// Parameters: `NormParams` (norm.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// A short row (at most 4 x WG elements, held in registers): thread `lid`'s four elements, two
// pairs of neighbours (so that a 16-bit output is written a 32-bit word at a time, without
// atomics), which of them exist, and their indices clamped into the row (loads stay in it).
struct Short { j: vec4<u32>, live: vec4<bool>, at: vec4<u32> }
fn short_row(lid: u32, n: u32) -> Short {
    let j = vec4<u32>(2u * lid, 2u * lid + 1u, 2u * (lid + WG), 2u * (lid + WG) + 1u);
    return Short(j, j < vec4<u32>(n), min(j, vec4<u32>(max(n, 1u) - 1u)));
}
fn ld1x4(base: u32, at: vec4<u32>) -> vec4<f32> { return vec4<f32>(ld1(base + at.x), ld1(base + at.y), ld1(base + at.z), ld1(base + at.w)); }
fn ld2x4(base: u32, at: vec4<u32>) -> vec4<f32> { return vec4<f32>(ld2(base + at.x), ld2(base + at.y), ld2(base + at.z), ld2(base + at.w)); }
fn ld3x4(base: u32, at: vec4<u32>) -> vec4<f32> { return vec4<f32>(ld3(base + at.x), ld3(base + at.y), ld3(base + at.z), ld3(base + at.w)); }

// @kernel layer_norm
// Bindings: 1 x, 2 weight, 3 bias, 4 y, 5 mean, 6 rstd. Rows as the file's head says.
fn row_sum(v: f32, lid: u32) -> f32 { return ROW_SUM; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    let eps = params.eps;
    ROWS_BEGIN
        let x0 = o(1u) + row * n;
        var s = 0.0;
        for (var j = lane; j < n; j += lanes) { s += ld1(x0 + j); }
        let mean = row_sum(s, lid) / f32(n);
        var q = 0.0;
        for (var j = lane; j < n; j += lanes) { let d = ld1(x0 + j) - mean; q += d * d; }
        let rstd = 1.0 / sqrt(row_sum(q, lid) / f32(n) + eps);
        if (live) {
            for (var j = 2u * lane; j < n; j += 2u * lanes) {
                let y = (ld1(x0 + j) - mean) * rstd * ld2(o(2u) + j) + ld3(o(3u) + j);
                if (j + 1u < n) {
                    st4_two(o(4u) + row * n + j, y, (ld1(x0 + j + 1u) - mean) * rstd * ld2(o(2u) + j + 1u) + ld3(o(3u) + j + 1u));
                } else {
                    st4(o(4u) + row * n + j, y);
                }
            }
            if (lane == 0u) {
                st5(o(5u) + row, mean);
                st6(o(6u) + row, rstd);
            }
        }
    }
}

// @kernel rms_norm
// Bindings: 1 x, 2 weight, 3 y, 4 rstd. Rows as the file's head says.
fn row_sum(v: f32, lid: u32) -> f32 { return ROW_SUM; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    let eps = params.eps;
    ROWS_BEGIN
        let x0 = o(1u) + row * n;
        var q = 0.0;
        for (var j = lane; j < n; j += lanes) { let x = ld1(x0 + j); q += x * x; }
        let rstd = 1.0 / sqrt(row_sum(q, lid) / f32(n) + eps);
        if (live) {
            for (var j = 2u * lane; j < n; j += 2u * lanes) {
                let y = ld1(x0 + j) * rstd * ld2(o(2u) + j);
                if (j + 1u < n) {
                    st3_two(o(3u) + row * n + j, y, ld1(x0 + j + 1u) * rstd * ld2(o(2u) + j + 1u));
                } else {
                    st3(o(3u) + row * n + j, y);
                }
            }
            if (lane == 0u) {
                st4(o(4u) + row, rstd);
            }
        }
    }
}

// @kernel layer_norm_short
// Layer norm of rows of at most 4 x WG elements (decoding's one row): each thread loads its
// four elements of the row, the weight and the bias at once and keeps them in registers, so
// the row is read once and the kernel waits on memory once, not three times. Bindings as
// layer_norm.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    let e = short_row(lid, n);
    let j = e.j;
    let live = e.live;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let x = select(vec4<f32>(0.0), ld1x4(o(1u) + row * n, e.at), live);
        let w = ld2x4(o(2u), e.at);
        let b = ld3x4(o(3u), e.at);
        let mean = wg_sum(((x.x + x.y) + x.z) + x.w, lid) / f32(n);
        let d = select(vec4<f32>(0.0), x - mean, live);
        let rstd = 1.0 / sqrt(wg_sum(((d.x * d.x + d.y * d.y) + d.z * d.z) + d.w * d.w, lid) / f32(n) + params.eps);
        let y = d * rstd * w + b;
        let y0 = o(4u) + row * n;
        if (live.y) { st4_two(y0 + j.x, y.x, y.y); } else if (live.x) { st4(y0 + j.x, y.x); }
        if (live.w) { st4_two(y0 + j.z, y.z, y.w); } else if (live.z) { st4(y0 + j.z, y.z); }
        if (lid == 0u) {
            st5(o(5u) + row, mean);
            st6(o(6u) + row, rstd);
        }
    }
}

// @kernel rms_norm_short
// RMS norm of rows of at most 4 x WG elements, as layer_norm_short. Bindings as rms_norm.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    let e = short_row(lid, n);
    let j = e.j;
    let live = e.live;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let x = select(vec4<f32>(0.0), ld1x4(o(1u) + row * n, e.at), live);
        let w = ld2x4(o(2u), e.at);
        let rstd = 1.0 / sqrt(wg_sum(((x.x * x.x + x.y * x.y) + x.z * x.z) + x.w * x.w, lid) / f32(n) + params.eps);
        let y = x * rstd * w;
        let y0 = o(3u) + row * n;
        if (live.y) { st3_two(y0 + j.x, y.x, y.y); } else if (live.x) { st3(y0 + j.x, y.x); }
        if (live.w) { st3_two(y0 + j.z, y.z, y.w); } else if (live.z) { st3(y0 + j.z, y.z); }
        if (lid == 0u) {
            st4(o(4u) + row, rstd);
        }
    }
}

// @kernel layer_norm_dx
// Bindings: 1 x, 2 weight, 3 mean, 4 rstd, 5 dy, 6 dx, 7 dweight, 8 dbias. Rows as the
// file's head says.
fn row_sum(v: f32, lid: u32) -> f32 { return ROW_SUM; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    ROWS_BEGIN
        let x0 = o(1u) + row * n;
        let d0 = o(5u) + row * n;
        let mean = ld3(o(3u) + row);
        let rstd = ld4(o(4u) + row);
        var sg = 0.0;
        var sgx = 0.0;
        for (var j = lane; j < n; j += lanes) {
            let g = ld5(d0 + j) * ld2(o(2u) + j);
            sg += g;
            sgx += g * (ld1(x0 + j) - mean) * rstd;
        }
        let mg = row_sum(sg, lid) / f32(n);
        let mgx = row_sum(sgx, lid) / f32(n);
        if (live) {
            for (var j = 2u * lane; j < n; j += 2u * lanes) {
                let dx = rstd * (ld5(d0 + j) * ld2(o(2u) + j) - mg - (ld1(x0 + j) - mean) * rstd * mgx);
                if (j + 1u < n) {
                    let i = j + 1u;
                    let next = rstd * (ld5(d0 + i) * ld2(o(2u) + i) - mg - (ld1(x0 + i) - mean) * rstd * mgx);
                    st6_two(o(6u) + row * n + j, dx, next);
                } else {
                    st6(o(6u) + row * n + j, dx);
                }
            }
        }
    }
}

// @kernel layer_norm_dw
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    for (var c = group_index(wid, nwg); c < n; c += group_count(nwg)) {
        var sw = 0.0;
        var sb = 0.0;
        for (var r = lid; r < rows; r += WG) {
            let dy = ld5(o(5u) + r * n + c);
            sw += dy * (ld1(o(1u) + r * n + c) - ld3(o(3u) + r)) * ld4(o(4u) + r);
            sb += dy;
        }
        let tw = wg_sum(sw, lid);
        let tb = wg_sum(sb, lid);
        if (lid == 0u) {
            st7(o(7u) + c, tw);
            st8(o(8u) + c, tb);
        }
    }
}

// @kernel rms_norm_dx
// Bindings: 1 x, 2 weight, 3 rstd, 4 dy, 5 dx, 6 dweight. Rows as the file's head says.
fn row_sum(v: f32, lid: u32) -> f32 { return ROW_SUM; }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    ROWS_BEGIN
        let x0 = o(1u) + row * n;
        let d0 = o(4u) + row * n;
        let rstd = ld3(o(3u) + row);
        var sgx = 0.0;
        for (var j = lane; j < n; j += lanes) {
            sgx += ld4(d0 + j) * ld2(o(2u) + j) * ld1(x0 + j) * rstd;
        }
        let mgx = row_sum(sgx, lid) / f32(n);
        if (live) {
            for (var j = 2u * lane; j < n; j += 2u * lanes) {
                let dx = rstd * (ld4(d0 + j) * ld2(o(2u) + j) - ld1(x0 + j) * rstd * mgx);
                if (j + 1u < n) {
                    let i = j + 1u;
                    st5_two(o(5u) + row * n + j, dx, rstd * (ld4(d0 + i) * ld2(o(2u) + i) - ld1(x0 + i) * rstd * mgx));
                } else {
                    st5(o(5u) + row * n + j, dx);
                }
            }
        }
    }
}

// @kernel rms_norm_dw
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    for (var c = group_index(wid, nwg); c < n; c += group_count(nwg)) {
        var sw = 0.0;
        for (var r = lid; r < rows; r += WG) {
            sw += ld4(o(4u) + r * n + c) * ld1(o(1u) + r * n + c) * ld3(o(3u) + r);
        }
        let tw = wg_sum(sw, lid);
        if (lid == 0u) {
            st6(o(6u) + c, tw);
        }
    }
}

// @kernel norm_dw_chunks
// A norm's weight (and bias) gradients over many rows, first step, as `reduce_columns`
// (reduce.wgsl): a workgroup takes 64 consecutive columns and `chunk_len` rows, four threads a
// column each taking every fourth row, so consecutive threads read consecutive elements (a
// workgroup per column reads one element of each 32-byte sector it fetches), and leaves each
// column's sums over the chunk in the scratch binding: weight terms at [chunk, column], bias
// terms after all of those. The upper-case parts, and the bindings they read, are generated
// per norm (norm.rs).
var<workgroup> part_w: array<f32, 256>;
var<workgroup> part_b: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = params.rows;
    let n = params.row_len;
    let chunks = params.chunks;
    let span = params.chunk_len;
    let blocks = (n + 63u) / 64u;
    for (var t = group_index(wid, nwg); t < blocks * chunks; t += group_count(nwg)) {
        let c = (t % blocks) * 64u + lid % 64u;
        // Lanes past the last column read its elements again and write nothing.
        let cc = min(c, n - 1u);
        let chunk = t / blocks;
        let end = min((chunk + 1u) * span, rows);
        var sw = 0.0;
        var sb = 0.0;
        for (var r = chunk * span + lid / 64u; r < end; r += 4u) {
            TERMS
        }
        part_w[lid] = sw;
        part_b[lid] = sb;
        workgroupBarrier();
        if (lid < 64u && c < n) {
            let w = ((part_w[lid] + part_w[lid + 64u]) + part_w[lid + 128u]) + part_w[lid + 192u];
            let b = ((part_b[lid] + part_b[lid + 64u]) + part_b[lid + 128u]) + part_b[lid + 192u];
            STASH
        }
        workgroupBarrier();
    }
}

// @kernel norm_dw_finish
// A norm's weight (and bias) gradients over many rows, second step: a thread per column adds
// its chunks' sums in order.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.row_len;
    let chunks = params.chunks;
    for (var c = group_index(wid, nwg) * WG + lid; c < n; c += group_count(nwg) * WG) {
        var w = 0.0;
        var b = 0.0;
        for (var k = 0u; k < chunks; k++) {
            SUM
        }
        FINISH
    }
}
