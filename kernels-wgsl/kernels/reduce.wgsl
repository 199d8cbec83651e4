// Reductions over any axes, argmax, and softmax over rows.
// Parameters: `ReduceParams` (reduce.rs). Reductions and argmax: `rows` outputs, each over
// `row_len` elements, the input's kept and reduced dimensions (merged where they allow) and,
// for argmax, the index of the first reduced element in the whole op (`first`). Softmax:
// `rows` rows of `row_len`.

// Input offsets of row-major element `i` of the kept and of the reduced dimensions.
fn kept_offset(i: u32) -> u32 {
    var rem = i;
    var off = 0u;
    for (var d = params.kept_rank; d > 0u; d--) {
        let s = params.kept_shape[d - 1u];
        off += (rem % s) * params.kept_strides[d - 1u];
        rem /= s;
    }
    return off;
}
fn reduced_offset(i: u32) -> u32 {
    var rem = i;
    var off = 0u;
    for (var d = params.reduced_rank; d > 0u; d--) {
        let s = params.reduced_shape[d - 1u];
        off += (rem % s) * params.reduced_strides[d - 1u];
        rem /= s;
    }
    return off;
}
fn in_at(row: u32, r: u32) -> u32 { return params.offsets[0] + kept_offset(row) + reduced_offset(r); }

var<workgroup> idx: array<u32, 256>;

// Where the reduced elements of output `o` start and how far apart they lie, when they form
// one run (one reduced dim): element r is at `base + r * stride`. The loops over them read
// four elements per step, issued together, so the loads' latency overlaps (a lone workgroup
// reducing a long row, as argmax over a vocabulary when decoding, waits on memory otherwise).
fn run_stride() -> u32 { return params.reduced_strides[0]; }
// Elements r, r + WG, r + 2 WG and r + 3 WG of the run at `base` with stride `rs`.
fn run4(base: u32, rs: u32, r: u32) -> vec4<f32> {
    return vec4<f32>(ld1(base + r * rs), ld1(base + (r + WG) * rs), ld1(base + (r + 2u * WG) * rs), ld1(base + (r + 3u * WG) * rs));
}

// The workgroup's best (value, index) of every thread's (v, i) for argmax, by a tree in
// workgroup memory; every thread gets it. Call from uniform control flow.
struct Best { v: f32, i: u32 }
fn best_in_group(v: f32, i: u32, lid: u32) -> Best {
    red[lid] = v;
    idx[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && better(red[lid], idx[lid], red[lid + s], idx[lid + s])) {
            red[lid] = red[lid + s];
            idx[lid] = idx[lid + s];
        }
        workgroupBarrier();
    }
    let best = Best(red[0], idx[0]);
    workgroupBarrier();
    return best;
}

// The best of `start` and the elements r0, r0 + WG, ... below `end` of the run at `base` with
// stride `rs`, for argmax: four loads issued together per step.
fn best_in_run(start: Best, base: u32, rs: u32, r0: u32, end: u32) -> Best {
    var bv = start.v;
    var bi = start.i;
    var r = r0;
    for (; r + 3u * WG < end; r += 4u * WG) {
        let x = run4(base, rs, r);
        if (better(bv, bi, x.x, r)) { bv = x.x; bi = r; }
        if (better(bv, bi, x.y, r + WG)) { bv = x.y; bi = r + WG; }
        if (better(bv, bi, x.z, r + 2u * WG)) { bv = x.z; bi = r + 2u * WG; }
        if (better(bv, bi, x.w, r + 3u * WG)) { bv = x.w; bi = r + 3u * WG; }
    }
    for (; r < end; r += WG) {
        let v = ld1(base + r * rs);
        if (better(bv, bi, v, r)) { bv = v; bi = r; }
    }
    return Best(bv, bi);
}

// Whether (v2, i2) beats (v1, i1) for argmax: larger, NaN largest, first index on ties.
fn better(v1: f32, i1: u32, v2: f32, i2: u32) -> bool {
    let n1 = is_nan(v1);
    let n2 = is_nan(v2);
    if (n1 && n2) { return i2 < i1; }
    if (n2) { return true; }
    if (n1) { return false; }
    if (v2 > v1) { return true; }
    return v2 == v1 && i2 < i1;
}

// @kernel reduce_group
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nout = params.rows;
    let nred = params.row_len;
    for (var o = group_index(wid, nwg); o < nout; o += group_count(nwg)) {
        var acc = INIT;
        var r = lid;
        if (params.reduced_rank == 1u) {
            let base = in_at(o, 0u);
            let rs = run_stride();
            for (; r + 3u * WG < nred; r += 4u * WG) {
                let x = run4(base, rs, r);
                { let a = acc; let b = x.x; acc = COMBINE; }
                { let a = acc; let b = x.y; acc = COMBINE; }
                { let a = acc; let b = x.z; acc = COMBINE; }
                { let a = acc; let b = x.w; acc = COMBINE; }
            }
        }
        for (; r < nred; r += WG) {
            let a = acc;
            let b = ld1(in_at(o, r));
            acc = COMBINE;
        }
        red[lid] = acc;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s) {
                let a = red[lid];
                let b = red[lid + s];
                red[lid] = COMBINE;
            }
            workgroupBarrier();
        }
        if (lid == 0u) {
            let v = red[0];
            st2(params.offsets[1] + o, FINISH);
        }
        workgroupBarrier();
    }
}

// @kernel reduce_thread
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nout = params.rows;
    let nred = params.row_len;
    let step = group_count(nwg) * WG;
    for (var o = group_index(wid, nwg) * WG + lid; o < nout; o += step) {
        var acc = INIT;
        for (var r = 0u; r < nred; r++) {
            let a = acc;
            let b = ld1(in_at(o, r));
            acc = COMBINE;
        }
        let v = acc;
        st2(params.offsets[1] + o, FINISH);
    }
}

// @kernel reduce_columns
// Reductions over the rows of a matrix whose outputs lie next to each other in the input (bias
// gradients: [8192, n] summed over its rows), first step: a workgroup takes 64 consecutive
// outputs and `chunk_len` of their rows, four threads an output each taking every fourth row,
// so that consecutive threads read consecutive elements (a workgroup per output, as in
// `reduce_group`, reads one element of each 32-byte sector it fetches), and leaves each
// output's result over the chunk in binding 3. `reduce_columns_finish` combines the chunks.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nout = params.rows;
    let nred = params.row_len;
    let chunks = params.chunks;
    let span = params.chunk_len;
    let blocks = (nout + 63u) / 64u;
    let rs = run_stride();
    for (var t = group_index(wid, nwg); t < blocks * chunks; t += group_count(nwg)) {
        let o = (t % blocks) * 64u + lid % 64u;
        let chunk = t / blocks;
        let end = min((chunk + 1u) * span, nred);
        // Lanes past the last output read its elements again and write nothing.
        let base = in_at(min(o, nout - 1u), 0u);
        var acc = INIT;
        var r = chunk * span + lid / 64u;
        for (; r + 12u < end; r += 16u) {
            let x = vec4<f32>(ld1(base + r * rs), ld1(base + (r + 4u) * rs), ld1(base + (r + 8u) * rs), ld1(base + (r + 12u) * rs));
            { let a = acc; let b = x.x; acc = COMBINE; }
            { let a = acc; let b = x.y; acc = COMBINE; }
            { let a = acc; let b = x.z; acc = COMBINE; }
            { let a = acc; let b = x.w; acc = COMBINE; }
        }
        for (; r < end; r += 4u) {
            let a = acc;
            let b = ld1(base + r * rs);
            acc = COMBINE;
        }
        red[lid] = acc;
        workgroupBarrier();
        if (lid < 64u && o < nout) {
            var v = red[lid];
            for (var q = 1u; q < 4u; q++) {
                let a = v;
                let b = red[lid + 64u * q];
                v = COMBINE;
            }
            st3(params.offsets[2] + chunk * nout + o, v);
        }
        workgroupBarrier();
    }
}

// @kernel reduce_columns_finish
// Reductions over the rows of a matrix, second step: a workgroup takes 16 consecutive outputs,
// sixteen threads each (`FINISH_OUTPUTS` in reduce.rs). Thread `part` of an output combines
// its chunks `part`, `part + 16`, ... from binding 3 in order, then the first thread combines
// the sixteen in order and writes the output: the same order on every run, and a sixteenth
// of the dependent loads of a thread walking all the chunks (a bias gradient of 768 outputs
// over 32 chunks had three workgroups waiting on 32 loads each).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nout = params.rows;
    let nred = params.row_len;
    let blocks = (nout + 15u) / 16u;
    let part = lid / 16u;
    for (var t = group_index(wid, nwg); t < blocks; t += group_count(nwg)) {
        let o = t * 16u + lid % 16u;
        var acc = INIT;
        if (o < nout) {
            for (var c = part; c < params.chunks; c += 16u) {
                let a = acc;
                let b = ld3(params.offsets[2] + c * nout + o);
                acc = COMBINE;
            }
        }
        red[lid] = acc;
        workgroupBarrier();
        if (lid < 16u && o < nout) {
            var v = red[lid];
            for (var q = 1u; q < 16u; q++) {
                let a = v;
                let b = red[lid + 16u * q];
                v = COMBINE;
            }
            st2(params.offsets[1] + o, FINISH);
        }
        workgroupBarrier();
    }
}

// @kernel argmax
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nout = params.rows;
    let nred = params.row_len;
    for (var o = group_index(wid, nwg); o < nout; o += group_count(nwg)) {
        var mine = Best(ld1(in_at(o, 0u)), 0u);
        if (params.reduced_rank == 1u) {
            mine = best_in_run(mine, in_at(o, 0u), run_stride(), lid, nred);
        } else {
            for (var r = lid; r < nred; r += WG) {
                let v = ld1(in_at(o, r));
                if (better(mine.v, mine.i, v, r)) { mine = Best(v, r); }
            }
        }
        let best = best_in_group(mine.v, mine.i, lid);
        if (lid == 0u) {
            stn2(params.offsets[1] + o, i32(best.i + params.first));
        }
    }
}

// @kernel argmax_chunks
// Argmax of a few long rows (decoding's vocabulary), first step: `chunks` workgroups per row
// each take `chunk_len` elements of the row (the last chunk fewer, none empty) and leave its best (value bits, index) pair in binding 3, so
// that many workgroups' loads are in flight where one workgroup would walk the whole row.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let nred = params.row_len;
    let chunks = params.chunks;
    let span = params.chunk_len;
    for (var t = group_index(wid, nwg); t < params.rows * chunks; t += group_count(nwg)) {
        let base = in_at(t / chunks, 0u);
        let rs = run_stride();
        let first = (t % chunks) * span;
        let end = min(first + span, nred);
        let mine = best_in_run(Best(ld1(base + first * rs), first), base, rs, first + lid, end);
        let best = best_in_group(mine.v, mine.i, lid);
        if (lid == 0u) {
            stn3(params.offsets[2] + 2u * t, bitcast<u32>(best.v));
            stn3(params.offsets[2] + 2u * t + 1u, best.i);
        }
    }
}

// @kernel argmax_finish
// Argmax of a few long rows, second step: a workgroup per row picks the best of its chunks'
// pairs (binding 3) and writes its index.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let chunks = params.chunks;
    for (var o = group_index(wid, nwg); o < params.rows; o += group_count(nwg)) {
        let at = params.offsets[2] + 2u * o * chunks;
        var bv = bitcast<f32>(ldn3(at));
        var bi = ldn3(at + 1u);
        for (var c = lid; c < chunks; c += WG) {
            let v = bitcast<f32>(ldn3(at + 2u * c));
            let i = ldn3(at + 2u * c + 1u);
            if (better(bv, bi, v, i)) { bv = v; bi = i; }
        }
        let best = best_in_group(bv, bi, lid);
        if (lid == 0u) {
            stn2(params.offsets[1] + o, i32(best.i + params.first));
        }
    }
}

// @kernel softmax
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let x0 = params.offsets[0] + row * n;
        let y0 = params.offsets[1] + row * n;
        var m = -inf();
        for (var j = lid; j < n; j += WG) { m = max_nan(m, ld1(x0 + j)); }
        m = wg_max(m, lid);
        var s = 0.0;
        for (var j = lid; j < n; j += WG) { s += exp(ld1(x0 + j) - m); }
        s = wg_sum(s, lid);
        let ls = log(s);
        for (var j = lid; j < n; j += WG) {
            let x = ld1(x0 + j);
            st2(y0 + j, SOFTMAX_OUT);
        }
    }
}

// @kernel softmax_backward
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32 SUBGROUP_ARGS) {
    SUBGROUP_ENTER
    let rows = params.rows;
    let n = params.row_len;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let y0 = params.offsets[0] + row * n;
        let d0 = params.offsets[1] + row * n;
        let o0 = params.offsets[2] + row * n;
        var s = 0.0;
        for (var j = lid; j < n; j += WG) {
            let y = ld1(y0 + j);
            let dy = ld2(d0 + j);
            s += DOT_TERM;
        }
        s = wg_sum(s, lid);
        for (var j = lid; j < n; j += WG) {
            let y = ld1(y0 + j);
            let dy = ld2(d0 + j);
            st3(o0 + j, GRAD);
        }
    }
}
