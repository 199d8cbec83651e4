// Embedding and index copy (row-major), gather and deterministic scatter-adds (through
// strides), a thread per output element (per source element for index copy). Parameters:
// `MovementParams` (movement.rs).

fn o(k: u32) -> u32 { return params.offsets[k - 1u]; }

// @kernel embedding
// Bindings: 1 rows `first` .. `first + window_rows` of the weight [V = total_rows, D =
// row_len], 2 ids, 3 out.
// Ids in those rows are looked up; ids outside [0, V) give zeros in the launch from row 0
// (a table past one binding runs as one launch per range of rows).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let d = params.row_len;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let id = ldi2(o(2u) + e / d);
        let r = id - i32(params.first);
        if (r >= 0 && u32(r) < params.window_rows) {
            st3(o(3u) + e, ld1(o(1u) + u32(r) * d + e % d));
        } else if (params.first == 0u && (id < 0 || u32(id) >= params.total_rows)) {
            st3(o(3u) + e, 0.0);
        }
    }
}

// @kernel embedding_links
// Bindings: 1 ids [P], 2 links [2P] (u32). For each position i: links[i] is the next position
// with the same id (P if none), links[P + i] is 1 when no earlier position has i's id. The ids
// pass through workgroup memory WG at a time. `elements` is P.
var<workgroup> seen: array<i32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    for (var base = group_index(wid, nwg) * WG; base < n; base += group_count(nwg) * WG) {
        let i = base + lid;
        var id = -1;
        if (i < n) { id = ldi1(o(1u) + i); }
        var next = n;
        var first = 1u;
        for (var t0 = 0u; t0 < n; t0 += WG) {
            workgroupBarrier();
            var x = -1;
            if (t0 + lid < n) { x = ldi1(o(1u) + t0 + lid); }
            seen[lid] = x;
            workgroupBarrier();
            let cnt = min(WG, n - t0);
            for (var k = 0u; k < cnt; k++) {
                let j = t0 + k;
                if (seen[k] == id) {
                    if (j < i) { first = 0u; }
                    if (j > i && next == n) { next = j; }
                }
            }
        }
        if (i < n) {
            stn2(o(2u) + i, next);
            stn2(o(2u) + n + i, first);
        }
    }
}

// @kernel embedding_backward
// Bindings: 1 ids [P], 2 dy [P, D = row_len], 3 rows `first` .. `first + window_rows` of
// dweight [V, D] (zeroed first), 4 links. A thread per (position, column) of the `elements`:
// the first position of each id in those rows sums the rows of its positions in order,
// following the links, and adds the sum to dweight (positions past one binding run as
// several launches, in order).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let d = params.row_len;
    let positions = n / d;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let i = e / d;
        let c = e % d;
        let r = ldi1(o(1u) + i) - i32(params.first);
        if (r < 0 || u32(r) >= params.window_rows || ldn4(o(4u) + positions + i) == 0u) { continue; }
        var s = 0.0;
        for (var j = i; j < positions; j = ldn4(o(4u) + j)) { s += ld2(o(2u) + j * d + c); }
        let at = o(3u) + u32(r) * d + c;
        st3(at, ld3(at) + s);
    }
}

// @kernel gather
// Bindings: 1 x, 2 index, 3 out (of index's shape). x's binding holds rows `first` ..
// `first + window_rows` along the axis of the `total_rows` the whole op's x has. Indices in
// the window read x; the launch of the window from row 0 writes zeros for indices outside
// [0, total_rows); others are left to the launch of their window.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let r = params.rank;
    let axis = params.axis;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        var rem = e;
        var xo = 0u;
        var io = 0u;
        var oo = 0u;
        for (var k = r; k > 0u; k--) {
            let dim = k - 1u;
            let c = rem % params.index_shape[dim];
            rem /= params.index_shape[dim];
            if (dim != axis) { xo += c * params.x_strides[dim]; }
            io += c * params.index_strides[dim];
            oo += c * params.out_strides[dim];
        }
        let id = ldi2(o(2u) + io);
        let row = id - i32(params.first);
        if (row >= 0 && u32(row) < params.window_rows) {
            st3(o(3u) + oo, ld1(o(1u) + xo + u32(row) * params.x_strides[axis]));
        } else if (params.first == 0u && (id < 0 || u32(id) >= params.total_rows)) {
            st3(o(3u) + oo, 0.0);
        }
    }
}

// @kernel scatter_add
// Bindings: 1 index, 2 src (index's shape and strides), 3 out. `first` is the target of out's
// first element along the axis; `accumulate` 1 adds onto out's values (parts of an op over
// windows, after zeroing), 0 writes. Each output sums the matching sources in source order.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let r = params.rank;
    let axis = params.axis;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        var rem = e;
        var base = 0u;
        var oo = 0u;
        var inside = true;
        var tgt = 0u;
        for (var k = r; k > 0u; k--) {
            let dim = k - 1u;
            let c = rem % params.out_shape[dim];
            rem /= params.out_shape[dim];
            oo += c * params.out_strides[dim];
            if (dim == axis) {
                tgt = c + params.first;
            } else {
                if (c >= params.index_shape[dim]) { inside = false; }
                base += c * params.index_strides[dim];
            }
        }
        var s = 0.0;
        if (params.accumulate != 0u) { s = ld3(o(3u) + oo); }
        if (inside) {
            let len = params.index_shape[axis];
            let st = params.index_strides[axis];
            for (var j = 0u; j < len; j++) {
                let id = ldi1(o(1u) + base + j * st);
                if (id >= 0 && u32(id) == tgt) { s += ld2(o(2u) + base + j * st); }
            }
        }
        st3(o(3u) + oo, s);
    }
}

// @kernel index_copy
// Bindings: 1 index [T = window_rows], 2 src [outer, T, row_len], 3 out [outer, total_rows,
// row_len], both row-major. A thread per source element stores its bits in out's row
// index[t]; indices outside [0, total_rows) are skipped, and no other row is touched.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = params.elements;
    let d = params.row_len;
    let len = params.window_rows;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < n; e += step) {
        let t = (e / d) % len;
        let id = ldi1(o(1u) + t);
        if (id >= 0 && u32(id) < params.total_rows) {
            let row = (e / d / len) * params.total_rows + u32(id);
            stn3(o(3u) + row * d + e % d, ldn2(o(2u) + e));
        }
    }
}
