// Batched matmul with epilogue, register-blocked: a 128x128 output tile per 256-thread
// workgroup, 8x8 outputs per thread, K in steps of 8 through double-buffered workgroup memory.
// Operands are read in place through their strides (transposed and broadcast views included).
// Parameters: `MatmulParams` (matmul.rs): sizes, each operand's offset and strides (batch
// strides per batch dimension, merged where every operand allows), the split-K count and the
// k per split (see sum_splits), and the epilogue's activation (see `activate`).
//
// Each thread owns rows 4*tr..4*tr+3 and 64+4*tr..64+4*tr+3 of the tile and the same pattern
// of columns in tc, so one k costs it four vec4 reads of workgroup memory for 64 FMAs, and the
// 16 accumulators are named vec4 fields, never indexed dynamically, which the compiler keeps in
// registers (an indexed array would go to local memory). The tiles are stored k-major, a row of
// 128 floats padded by 4 so that the loaders' scattered writes land in distinct banks. While a
// step computes from one buffer, the next step's operands are fetched from global memory into
// registers and then written to the other buffer: one barrier per step, and the load latency
// hides behind the arithmetic. The last step fetches zeros past K into the idle buffer, which
// nothing reads, rather than branch. Every output sums its products in increasing k, so results
// are deterministic.
//
// The steps are unrolled by hand so that the buffer and k-row of every workgroup access are
// constants: indices into workgroup arrays get clamped to their bounds, and with constant outer
// indices the clamps reduce to a few loop-invariant values and each read keeps a constant
// address offset.

// K step.
const TK: u32 = 8u;

// Two buffers of TK k-rows; a k-row holds 128 floats and 4 of padding.
var<workgroup> sa: array<array<array<vec4<f32>, 33>, 8>, 2>;
var<workgroup> sb: array<array<array<vec4<f32>, 33>, 8>, 2>;

// The (row or column, k) inside a 128 x 8 operand tile that thread `lid` loads with its load
// `j` of four. Consecutive threads walk the operand's dimension with the smaller stride, so a
// warp's loads coalesce however the operand is laid out: `along_k` for operands contiguous in
// k (a row-major `a`, a transposed `b`), `along_mn` for those contiguous in rows or columns.
fn along_k(lid: u32, j: u32) -> vec2<u32> { return vec2<u32>(lid / 8u + 32u * j, lid % 8u); }
fn along_mn(lid: u32, j: u32) -> vec2<u32> { return vec2<u32>(lid % 128u, lid / 128u + 2u * j); }

// A thread's four loads of one operand per step, worked out once per output tile.
struct Feed {
    // Element offset of each load's row (of `a`) or column (of `b`) at k = 0.
    line: vec4<u32>,
    // Whether that row or column exists.
    inside: vec4<bool>,
    // The k of each load inside the step.
    k: vec4<u32>,
    // Where each load goes in a workgroup k-row: vec4 index and component.
    col: vec4<u32>,
    lane: vec4<u32>,
}

// The feed of the loads `at` of a tile whose rows or columns start at `start` (of `limit`),
// for an operand at element `base` with stride `stride` along them.
fn feed(at: array<vec2<u32>, 4>, start: u32, limit: u32, base: u32, stride: u32) -> Feed {
    let x = vec4<u32>(at[0].x, at[1].x, at[2].x, at[3].x);
    let g = start + x;
    return Feed(base + g * stride, g < vec4<u32>(limit), vec4<u32>(at[0].y, at[1].y, at[2].y, at[3].y), x / 4u, x % 4u);
}

// The four elements of step `k0`, zero outside the matrix.
fn fetch_a(f: Feed, k0: u32, k: u32, sk: u32) -> vec4<f32> {
    let gk = k0 + f.k;
    let ok = f.inside & (gk < vec4<u32>(k));
    var v = vec4<f32>();
    if (ok.x) { v.x = ld1(f.line.x + gk.x * sk); }
    if (ok.y) { v.y = ld1(f.line.y + gk.y * sk); }
    if (ok.z) { v.z = ld1(f.line.z + gk.z * sk); }
    if (ok.w) { v.w = ld1(f.line.w + gk.w * sk); }
    return v;
}
fn fetch_b(f: Feed, k0: u32, k: u32, sk: u32) -> vec4<f32> {
    let gk = k0 + f.k;
    let ok = f.inside & (gk < vec4<u32>(k));
    var v = vec4<f32>();
    if (ok.x) { v.x = ld2(f.line.x + gk.x * sk); }
    if (ok.y) { v.y = ld2(f.line.y + gk.y * sk); }
    if (ok.z) { v.z = ld2(f.line.z + gk.z * sk); }
    if (ok.w) { v.w = ld2(f.line.w + gk.w * sk); }
    return v;
}

// Writes fetched elements into buffer `buf`.
fn stash_a(f: Feed, buf: u32, v: vec4<f32>) {
    sa[buf][f.k.x][f.col.x][f.lane.x] = v.x;
    sa[buf][f.k.y][f.col.y][f.lane.y] = v.y;
    sa[buf][f.k.z][f.col.z][f.lane.z] = v.z;
    sa[buf][f.k.w][f.col.w][f.lane.w] = v.w;
}
fn stash_b(f: Feed, buf: u32, v: vec4<f32>) {
    sb[buf][f.k.x][f.col.x][f.lane.x] = v.x;
    sb[buf][f.k.y][f.col.y][f.lane.y] = v.y;
    sb[buf][f.k.z][f.col.z][f.lane.z] = v.z;
    sb[buf][f.k.w][f.col.w][f.lane.w] = v.w;
}

// A thread's 8x8 outputs: `cIJ` is row I (0-3: 4*tr + I, 4-7: 64 + 4*tr + I - 4), columns
// 4*tc..4*tc+3 (J = 0) or 64 + 4*tc.. (J = 1).
struct Acc {
    c00: vec4<f32>, c01: vec4<f32>, c10: vec4<f32>, c11: vec4<f32>,
    c20: vec4<f32>, c21: vec4<f32>, c30: vec4<f32>, c31: vec4<f32>,
    c40: vec4<f32>, c41: vec4<f32>, c50: vec4<f32>, c51: vec4<f32>,
    c60: vec4<f32>, c61: vec4<f32>, c70: vec4<f32>, c71: vec4<f32>,
}

// Adds the products of k-row `kr` of buffer `buf`.
fn mac(acc: ptr<function, Acc>, buf: u32, kr: u32, tr: u32, tc: u32) {
    let u = sa[buf][kr][tr];
    let w = sa[buf][kr][tr + 16u];
    let x = sb[buf][kr][tc];
    let y = sb[buf][kr][tc + 16u];
    (*acc).c00 += u.x * x;
    (*acc).c01 += u.x * y;
    (*acc).c10 += u.y * x;
    (*acc).c11 += u.y * y;
    (*acc).c20 += u.z * x;
    (*acc).c21 += u.z * y;
    (*acc).c30 += u.w * x;
    (*acc).c31 += u.w * y;
    (*acc).c40 += w.x * x;
    (*acc).c41 += w.x * y;
    (*acc).c50 += w.y * x;
    (*acc).c51 += w.y * y;
    (*acc).c60 += w.z * x;
    (*acc).c61 += w.z * y;
    (*acc).c70 += w.w * x;
    (*acc).c71 += w.w * y;
}

// One step: every k-row of buffer `buf`, in order.
fn step(acc: ptr<function, Acc>, buf: u32, tr: u32, tc: u32) {
    mac(acc, buf, 0u, tr, tc);
    mac(acc, buf, 1u, tr, tc);
    mac(acc, buf, 2u, tr, tc);
    mac(acc, buf, 3u, tr, tc);
    mac(acc, buf, 4u, tr, tc);
    mac(acc, buf, 5u, tr, tc);
    mac(acc, buf, 6u, tr, tc);
    mac(acc, buf, 7u, tr, tc);
}

// Offsets of batch `z` (row-major over the batch dimensions) in a (x), b (y) and the
// residual (z).
fn batch_offsets(z: u32) -> vec3<u32> {
    var rem = z;
    var off = vec3<u32>(0u);
    for (var d = params.batch_rank; d > 0u; d--) {
        let s = params.batch_shape[d - 1u];
        let a = params.a_batch_strides[d - 1u];
        let strides = vec3<u32>(a, params.b_batch_strides[d - 1u], params.res_batch_strides[d - 1u]);
        off += (rem % s) * strides;
        rem /= s;
    }
    return off;
}

// The epilogue's activation, a parameter rather than code so that one kernel serves them all:
// 0 none, 1 ReLU, 2 GELU, 3 SiLU. A uniform branch per output costs nothing beside the
// products, and drivers that compile each kernel when it first runs (LLVM, in lavapipe) compile
// a quarter as many.
fn activate(v: f32) -> f32 {
    switch params.activation {
        case 1u: { return relu(v); }
        case 2u: { return gelu(v); }
        case 3u: { return silu(v); }
        default: { return v; }
    }
}

// Output (gm, gn) finished from its sum `x`: the epilogue.
fn finished(gm: u32, gn: u32, r_base: u32, x: f32) -> f32 {
    var v = x;
    EPILOGUE
    return v;
}

// Finishes and writes output (gm, gn) if it is inside the M x N matrix.
fn put(m: u32, n: u32, gm: u32, gn: u32, r_base: u32, o_base: u32, x: f32) {
    if (gm < m && gn < n) {
        STORE(o_base + gm * n + gn, finished(gm, gn, r_base, x));
    }
}

// Outputs (gm, gn) and (gm, gn + 1) together where both are inside: bf16 outputs then take
// one word store rather than two atomic updates each (`stK_two`, source.rs).
fn put2(m: u32, n: u32, gm: u32, gn: u32, r_base: u32, o_base: u32, x: f32, y: f32) {
    if (gm < m && gn + 1u < n) {
        STORE_two(o_base + gm * n + gn, finished(gm, gn, r_base, x), finished(gm, gn + 1u, r_base, y));
    } else {
        put(m, n, gm, gn, r_base, o_base, x);
        put(m, n, gm, gn + 1u, r_base, o_base, y);
    }
}
fn put4(m: u32, n: u32, gm: u32, gn: u32, r_base: u32, o_base: u32, v: vec4<f32>) {
    put2(m, n, gm, gn, r_base, o_base, v.x, v.y);
    put2(m, n, gm, gn + 2u, r_base, o_base, v.z, v.w);
}

// @kernel matmul
// @indices-in-range
// Every workgroup index is in range by construction (INDICES_IN_RANGE in gpu.rs): the loads'
// rows or columns are below 128 and their k below TK (`along_k`, `along_mn` and the wide
// loaders' functions of `lid` < 256), the reads' rows tr + 16 and columns tc + 16 below 32;
// parameter arrays are indexed below `batch_rank`, at most their length.
STAGING
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = params.m;
    let n = params.n;
    let batch = params.batch;
    let sam = params.a_row_stride;
    let sak = params.a_k_stride;
    let sbk = params.b_k_stride;
    let sbn = params.b_col_stride;
    let splits = params.splits;
    let tiles_m = (m + 127u) / 128u;
    let tiles_n = (n + 127u) / 128u;
    let tr = lid / 16u;
    let tc = lid % 16u;
    // z runs over (batch, split): split s takes k from s * kc on, and with S > 1 the output
    // is the partial sums [batch, S, M, N].
    for (var z = wid.z; z < batch * splits; z += nwg.z) {
        let zb = z / splits;
        let k0 = (z % splits) * params.k_per_split;
        let k = min(params.k_per_split, params.k - k0);
        let steps = (k + TK - 1u) / TK;
        let zo = batch_offsets(zb);
        let a_base = params.a_offset + zo.x + k0 * sak;
        let b_base = params.b_offset + zo.y + k0 * sbk;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        for (var ty = wid.y; ty < tiles_m; ty += nwg.y) {
            for (var tx = wid.x; tx < tiles_n; tx += nwg.x) {
                let m0 = ty * 128u;
                let n0 = tx * 128u;
                FEED
                if (steps > 0u) {
                    let k0 = 0u;
                    FETCH
                    STASH0
                }
                workgroupBarrier();
                var acc: Acc;
                for (var s = 0u; s < steps; s += 2u) {
                    {
                        let k0 = (s + 1u) * TK;
                        FETCH
                        step(&acc, 0u, tr, tc);
                        STASH1
                    }
                    workgroupBarrier();
                    if (s + 1u < steps) {
                        let k0 = (s + 2u) * TK;
                        FETCH
                        step(&acc, 1u, tr, tc);
                        STASH0
                        workgroupBarrier();
                    }
                }
                let gm = m0 + 4u * tr;
                let gn = n0 + 4u * tc;
                put4(m, n, gm, gn, r_base, o_base, acc.c00);
                put4(m, n, gm, gn + 64u, r_base, o_base, acc.c01);
                put4(m, n, gm + 1u, gn, r_base, o_base, acc.c10);
                put4(m, n, gm + 1u, gn + 64u, r_base, o_base, acc.c11);
                put4(m, n, gm + 2u, gn, r_base, o_base, acc.c20);
                put4(m, n, gm + 2u, gn + 64u, r_base, o_base, acc.c21);
                put4(m, n, gm + 3u, gn, r_base, o_base, acc.c30);
                put4(m, n, gm + 3u, gn + 64u, r_base, o_base, acc.c31);
                put4(m, n, gm + 64u, gn, r_base, o_base, acc.c40);
                put4(m, n, gm + 64u, gn + 64u, r_base, o_base, acc.c41);
                put4(m, n, gm + 65u, gn, r_base, o_base, acc.c50);
                put4(m, n, gm + 65u, gn + 64u, r_base, o_base, acc.c51);
                put4(m, n, gm + 66u, gn, r_base, o_base, acc.c60);
                put4(m, n, gm + 66u, gn + 64u, r_base, o_base, acc.c61);
                put4(m, n, gm + 67u, gn, r_base, o_base, acc.c70);
                put4(m, n, gm + 67u, gn + 64u, r_base, o_base, acc.c71);
            }
        }
    }
}

// @kernel sum_splits
// Split K (few output tiles, long K: weight gradients): adds each output's S partial sums in
// order and finishes it with the epilogue. Bindings as matmul's, binding 1 the partial sums
// instead of `a` (binding 2 unused).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = params.m;
    let n = params.n;
    let splits = params.splits;
    let mn = m * n;
    let step = group_count(nwg) * WG;
    for (var e = group_index(wid, nwg) * WG + lid; e < params.batch * mn; e += step) {
        let z = e / mn;
        let gm = (e % mn) / n;
        let gn = e % n;
        let r_base = params.res_offset + batch_offsets(z).z;
        var v = 0.0;
        for (var s = 0u; s < splits; s++) { v += ld1(params.a_offset + (z * splits + s) * mn + e % mn); }
        EPILOGUE
        STORE(params.out_offset + e, v);
    }
}

// @kernel rows
// Few rows (M <= 8, as in decoding) with `b` contiguous in k: the tiled kernel would leave
// most of the GPU idle. A workgroup takes 256 / LANES output columns, LANES threads each (more
// threads per column for narrower matrices, so that enough loads are in flight); the threads
// of a column split K (consecutive threads read consecutive k of b, four k per thread at a
// time), and their partial sums meet in a fixed order in workgroup memory, so results are
// deterministic. The upper-case parts are generated for M rows (matmul.rs).
const LANES: u32 = LANES_U;
const COLS: u32 = 256u / LANES;
var<workgroup> part: array<f32, PARTS>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = params.m;
    let n = params.n;
    let k = params.k;
    let batch = params.batch;
    let sam = params.a_row_stride;
    let sak = params.a_k_stride;
    let sbk = params.b_k_stride;
    let sbn = params.b_col_stride;
    let lane = lid % LANES;
    let col = lid / LANES;
    for (var z = wid.z; z < batch; z += nwg.z) {
        let zo = batch_offsets(z);
        let a_base = params.a_offset + zo.x;
        let b_base = params.b_offset + zo.y;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        for (var n0 = wid.x * COLS; n0 < n; n0 += nwg.x * COLS) {
            let gn = n0 + col;
            let bn = b_base + min(gn, n - 1u) * sbn;
            ZERO
            if (gn < n) {
                var kk = lane;
                for (; kk + 3u * LANES < k; kk += 4u * LANES) {
                    MAC4
                }
                for (; kk < k; kk += LANES) {
                    MAC1
                }
            }
            SAVE
            workgroupBarrier();
            // Each column's first 32 threads fold the column's LANES partial sums to 32, then
            // one thread per row adds those 32.
            if (lane < 32u) {
                for (var r = 0u; r < m; r++) {
                    let at = r * 256u + col * LANES + lane;
                    var s = part[at];
                    for (var j = 32u; j < LANES; j += 32u) { s += part[at + j]; }
                    part[at] = s;
                }
            }
            workgroupBarrier();
            if (lane < m) {
                var s = 0.0;
                for (var j = 0u; j < 32u; j++) { s += part[lane * 256u + col * LANES + j]; }
                put(m, n, lane, gn, r_base, o_base, s);
            }
            workgroupBarrier();
        }
    }
}

// @kernel rows_wide
// Few rows with `a` and `b` contiguous in k and read as 16-byte vectors (VEC elements each,
// `dotv` their dot product in f32; source.rs), on devices with subgroups: a few subgroups per
// output column (fewer where a workgroup has fewer), each taking its share of the column's k,
// its lanes taking every width-th vector of it, UNROLL of them per step (loaded before any is
// summed); a subgroup's sums meet by subgroupAdd (in the device's fixed order, so results are
// deterministic), and split subgroups' in workgroup memory. A subgroup's load moves 16
// bytes a lane where `rows` moves one element, and bytes in flight are what a matrix-vector
// product waits on. Small workgroups spread narrow matrices over every multiprocessor. The
// upper-case parts are generated for M rows, the operands' dtype, the walk over k and the
// epilogue (matmul.rs).
VECTOR_MATH
PARTIAL_DECL
@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) sgs: u32, @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32) {
    let m = params.m;
    let n = params.n;
    let kv = params.k / VEC;
    let sam = params.a_row_stride / VEC;
    let sbn = params.b_col_stride / VEC;
    let parts = min(PARTS_U, sgs);
    let cols = sgs / parts;
    let part = sg % parts;
    let share = (kv + parts - 1u) / parts;
    let kbegin = min(part * share, kv);
    let kend = min(kbegin + share, kv);
    for (var z = wid.z; z < params.batch; z += nwg.z) {
        let zo = batch_offsets(z);
        let a_base = (params.a_offset + zo.x) / VEC;
        let b_base = (params.b_offset + zo.y) / VEC;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        // Every subgroup of a workgroup walks the same columns' steps (the split sums meet
        // behind barriers); one past the last column reads the last and stores nothing.
        for (var g0 = wid.x * cols; g0 < n; g0 += nwg.x * cols) {
            let live = g0 + sg / parts < n;
            let gn = min(g0 + sg / parts, n - 1u);
            let bn = b_base + gn * sbn;
            EARLY
            ZERO
            for (var kk = kbegin + lane; kk < kend; kk += UNROLL_U * width) {
                MACS
            }
            FINISH
        }
    }
}

// @kernel rows_normed
// A normalized product of few rows (NormMatmul in decoding) with `a` (the rows), `b` (a
// linear's weight, contiguous in k) and the norm's weight and shift read as 16-byte vectors,
// on devices with subgroups: a subgroup takes a few output columns, loads its first step of
// every operand at once (UNROLL vectors a lane), takes each row's mean and variance from
// them (and from the rest of the row where k is longer than a step), and multiplies the
// normalized row, computed once, by each of its columns; sums meet by subgroupAdd, in the
// device's fixed order. The upper-case parts are generated for M rows, the dtype, the walk,
// the norm and the epilogue (normed_rows.rs).
VECTOR_MATH
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) sgs: u32, @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32) {
    let m = params.m;
    let n = params.n;
    let kv = params.k / VEC;
    let sam = params.a_row_stride / VEC;
    let sbn = params.b_col_stride / VEC;
    let nw = params.norm_offset / VEC;
    let ns = params.shift_offset / VEC;
    let groups = (n + COLUMNS_U - 1u) / COLUMNS_U;
    let step = UNROLL_U * width;
    for (var z = wid.z; z < params.batch; z += nwg.z) {
        let zo = batch_offsets(z);
        let a_base = (params.a_offset + zo.x) / VEC;
        let b_base = (params.b_offset + zo.y) / VEC;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        for (var gc = wid.x * sgs + sg; gc < groups; gc += nwg.x * sgs) {
            COLUMN_SETUP
            EARLY
            FIRST_LOADS
            STATS
            ZERO
            for (var kk = lane + step; kk < kv; kk += step) {
                MACS
            }
            FINISH
        }
    }
}

// @kernel columns
// Few rows (M <= 8) with `b` contiguous in its columns (a convolution's im2col columns, a
// product with an untransposed weight): the tiled kernel would compute 128 rows for each one
// wanted. A workgroup takes 256 / KLANES consecutive output columns, KLANES threads each;
// consecutive threads read consecutive columns of b, so loads coalesce, and the threads of a
// column take every KLANES-th k. Their partial sums meet in a fixed order in workgroup
// memory, so results are deterministic. The upper-case parts are generated for M rows
// (matmul.rs).
const KLANES: u32 = KLANES_U;
const COLS: u32 = 256u / KLANES;
var<workgroup> part: array<f32, PARTS>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = params.m;
    let n = params.n;
    let k = params.k;
    let batch = params.batch;
    let sam = params.a_row_stride;
    let sak = params.a_k_stride;
    let sbk = params.b_k_stride;
    let sbn = params.b_col_stride;
    let col = lid % COLS;
    let lane = lid / COLS;
    for (var z = wid.z; z < batch; z += nwg.z) {
        let zo = batch_offsets(z);
        let a_base = params.a_offset + zo.x;
        let b_base = params.b_offset + zo.y;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        for (var n0 = wid.x * COLS; n0 < n; n0 += nwg.x * COLS) {
            let gn = n0 + col;
            ZERO
            if (gn < n) {
                let bn = b_base + gn * sbn;
                for (var kk = lane; kk < k; kk += KLANES) {
                    MAC1
                }
            }
            SAVE
            workgroupBarrier();
            // One thread per row and column adds the column's KLANES partial sums in order.
            for (var t = lid; t < m * COLS; t += 256u) {
                let r = t / COLS;
                let c = t % COLS;
                var s = 0.0;
                for (var j = 0u; j < KLANES; j++) { s += part[r * 256u + j * COLS + c]; }
                put(m, n, r, n0 + c, r_base, o_base, s);
            }
            workgroupBarrier();
        }
    }
}

// @kernel coop
ENCODING
// @indices-in-range
// f16 operands on the tensor cores (cooperative matrices, 16x16x16 f16 products summed in
// f32), where the adapter offers them with subgroups of 32; bf16 operands too where the
// backend re-encodes the tiles' f16 type as bf16 (marked on the first line: F16_IS_BF16 in
// gpu.rs; the tiles are only converted into from f32, stored, loaded and multiplied).
//
// A 256-thread workgroup computes a 128x128 output tile; its eight subgroups each own a 64x32
// block (4 x 2 accumulators). Per step of CK k the threads copy both operand tiles into
// workgroup memory through the strided loaders (zeros past the matrix, so edges and
// transposed or broadcast operands need nothing special), then every subgroup multiplies from
// there. The next step's elements are fetched into registers before the multiplications, so
// their latency hides behind them: CK / 2 elements of each operand per thread, in named
// variables (generated, matmul.rs) so that the loads issue together and nothing is indexed
// dynamically; where both operands read as 16-byte vectors along their contiguous dimension,
// CK / 16 vectors of each per thread instead (their fetch and stash functions generated).
// Each accumulator is finished through a 16x16 f32 staging tile of its subgroup and the
// shared epilogue, two adjacent outputs per lane (`put2`). Products meet in a fixed order, so
// results are deterministic.
//
// Every index into the workgroup arrays is in range by construction (marked on the second
// line: INDICES_IN_RANGE in gpu.rs), so a backend may leave out naga's clamps, which cost
// the H100 a quarter of this kernel's speed. The indices depend only on builtins and
// constants, never on sizes or data: element e < 256 * CK / 2 of a tile is at row e / CK < 128
// and k e % CK (`coop_k`), or row e % 128 and k e / 128 < CK (`coop_mn`); vector v < 256 *
// CK / 16 at row v / (CK / 8) < 128, or row 8 * (v % 16) + 7 < 128 and k v / 16 < CK; the
// fragments' rows rm + 48 + 15 < 128 and columns rn + 16 + 15 < 128, k kk + 15 < CK; a
// subgroup's staging tile at 256 * sg < 2048 (eight subgroups of 32), elements e and e + 1
// below 256 (e even).
// Parameter arrays are indexed below `batch_rank`, at most their length (the planner merges
// batch dimensions or refuses the op).
const CK: u32 = COOP_STEP;
// Row strides of the staged tiles, padded by 8 halves against bank conflicts.
const LDA: u32 = CK + 8u;
const LDB: u32 = 136u;
var<workgroup> ca: array<f16, 128u * LDA>;
var<workgroup> cb: array<f16, CK * LDB>;
var<workgroup> cout: array<f32, 2048>;

// Element `e` of a 128 x 32 tile as (row or column, k): consecutive `e` walk k (`coop_k`) or
// the rows or columns (`coop_mn`).
fn coop_k(e: u32) -> vec2<u32> { return vec2<u32>(e / CK, e % CK); }
fn coop_mn(e: u32) -> vec2<u32> { return vec2<u32>(e % 128u, e / 128u); }

// Element `e` of the step at `k0` of `a` (`b`), zero outside the matrix. The address is
// clamped rather than branched around, so the loads of a step issue back to back.
fn elem_a(e: u32, m: u32, k: u32, m0: u32, k0: u32, a_base: u32) -> f16 {
    let r = A_AT(e);
    let gm = m0 + r.x;
    let gk = k0 + r.y;
    let v = ld1(a_base + min(gm, m - 1u) * params.a_row_stride + min(gk, k - 1u) * params.a_k_stride);
    return f16(select(0.0, v, gm < m && gk < k));
}
fn elem_b(e: u32, n: u32, k: u32, n0: u32, k0: u32, b_base: u32) -> f16 {
    let r = B_AT(e);
    let gn = n0 + r.x;
    let gk = k0 + r.y;
    let v = ld2(b_base + min(gn, n - 1u) * params.b_col_stride + min(gk, k - 1u) * params.b_k_stride);
    return f16(select(0.0, v, gn < n && gk < k));
}
fn put_a(e: u32, v: f16) {
    let r = A_AT(e);
    ca[r.x * LDA + r.y] = v;
}
fn put_b(e: u32, v: f16) {
    let r = B_AT(e);
    cb[r.y * LDB + r.x] = v;
}

STAGING
// Writes accumulator (i, j) of subgroup `sg` through its staging tile.
fn finish(acc: coop_mat16x16<f32, C>, sg: u32, lane: u32, m: u32, n: u32, gm0: u32, gn0: u32, r_base: u32, o_base: u32) {
    workgroupBarrier();
    coopStoreT(acc, &cout[sg * 256u], 16u);
    workgroupBarrier();
    for (var e = 2u * lane; e < 256u; e += 64u) {
        let x = cout[sg * 256u + e];
        put2(m, n, gm0 + e / 16u, gn0 + e % 16u, r_base, o_base, x, cout[sg * 256u + e + 1u]);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let m = params.m;
    let n = params.n;
    let batch = params.batch;
    let splits = params.splits;
    let tiles_m = (m + 127u) / 128u;
    let tiles_n = (n + 127u) / 128u;
    let rm = (sg / 4u) * 64u;
    let rn = (sg % 4u) * 32u;
    // z runs over (batch, split) as in the tiled kernel: split s takes k from s * kc on.
    for (var z = wid.z; z < batch * splits; z += nwg.z) {
        let ks = (z % splits) * params.k_per_split;
        let k = min(params.k_per_split, params.k - ks);
        let zo = batch_offsets(z / splits);
        let a_base = params.a_offset + zo.x + ks * params.a_k_stride;
        let b_base = params.b_offset + zo.y + ks * params.b_k_stride;
        let r_base = params.res_offset + zo.z;
        let o_base = params.out_offset + z * m * n;
        for (var ty = wid.y; ty < tiles_m; ty += nwg.y) {
            for (var tx = wid.x; tx < tiles_n; tx += nwg.x) {
                let m0 = ty * 128u;
                let n0 = tx * 128u;
                DECLARE
                var c00 = coop_mat16x16<f32, C>();
                var c01 = coop_mat16x16<f32, C>();
                var c10 = coop_mat16x16<f32, C>();
                var c11 = coop_mat16x16<f32, C>();
                var c20 = coop_mat16x16<f32, C>();
                var c21 = coop_mat16x16<f32, C>();
                var c30 = coop_mat16x16<f32, C>();
                var c31 = coop_mat16x16<f32, C>();
                var k0 = 0u;
                if (k > 0u) {
                    FETCH
                }
                for (; k0 < k; k0 += CK) {
                    workgroupBarrier();
                    STASH
                    workgroupBarrier();
                    if (k0 + CK < k) {
                        let k0 = k0 + CK;
                        FETCH
                    }
                    for (var kk = 0u; kk < CK; kk += 16u) {
                        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ca[rm * LDA + kk], LDA);
                        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ca[(rm + 16u) * LDA + kk], LDA);
                        let a2 = coopLoadT<coop_mat16x16<f16, A>>(&ca[(rm + 32u) * LDA + kk], LDA);
                        let a3 = coopLoadT<coop_mat16x16<f16, A>>(&ca[(rm + 48u) * LDA + kk], LDA);
                        let b0 = coopLoadT<coop_mat16x16<f16, B>>(&cb[kk * LDB + rn], LDB);
                        let b1 = coopLoadT<coop_mat16x16<f16, B>>(&cb[kk * LDB + rn + 16u], LDB);
                        c00 = coopMultiplyAdd(a0, b0, c00);
                        c01 = coopMultiplyAdd(a0, b1, c01);
                        c10 = coopMultiplyAdd(a1, b0, c10);
                        c11 = coopMultiplyAdd(a1, b1, c11);
                        c20 = coopMultiplyAdd(a2, b0, c20);
                        c21 = coopMultiplyAdd(a2, b1, c21);
                        c30 = coopMultiplyAdd(a3, b0, c30);
                        c31 = coopMultiplyAdd(a3, b1, c31);
                    }
                }
                let gm = m0 + rm;
                let gn = n0 + rn;
                finish(c00, sg, lane, m, n, gm, gn, r_base, o_base);
                finish(c01, sg, lane, m, n, gm, gn + 16u, r_base, o_base);
                finish(c10, sg, lane, m, n, gm + 16u, gn, r_base, o_base);
                finish(c11, sg, lane, m, n, gm + 16u, gn + 16u, r_base, o_base);
                finish(c20, sg, lane, m, n, gm + 32u, gn, r_base, o_base);
                finish(c21, sg, lane, m, n, gm + 32u, gn + 16u, r_base, o_base);
                finish(c30, sg, lane, m, n, gm + 48u, gn, r_base, o_base);
                finish(c31, sg, lane, m, n, gm + 48u, gn + 16u, r_base, o_base);
            }
        }
    }
}
