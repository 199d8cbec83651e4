// Reductions over any axes, argmax, and softmax over rows.
// Parameters: `ReduceParams` (ops/reduce.rs), one struct for every entry point.
// Reductions and argmax read the input in place through its strides: output `o` (row-major
// over the kept dimensions) reduces `row_len` elements, element `r` of it at
// `kept_offset(o) + reduced_offset(r)`, both dimension lists merged where the strides allow.
// Softmax and its backward: `rows` contiguous rows of `row_len`.
// Every combination happens in a fixed order (sequential per thread, then a fixed tree), so
// the same input gives the same bits.
// The planner defines:
//   IDX      the index type of input offsets (u32, or u64 past 2^32)
//   TI, TO   the input's and the output's stored types (argmax writes i32)
//   KIND     0 sum, 1 mean, 2 max, 3 min (reductions)
//   PARTIAL  1 when the output holds per-chunk partials that a second pass combines
//   LOG      1 for the log-softmax variants

#define MAX_DIMS 8
#define X ((const TI*)p.ptrs[0])
#define X2 ((const TI*)p.ptrs[1])
#define OUT ((TO*)p.ptrs[2])
#define IDS ((i32*)p.ptrs[2])

#ifndef KIND
#define KIND 0
#endif
#ifndef PARTIAL
#define PARTIAL 0
#endif
#ifndef LOG
#define LOG 0
#endif

DEV IDX kept_offset(const Params& p, u64 i) {
    IDX rem = (IDX)i, off = 0;
#pragma unroll
    for (int d = MAX_DIMS - 1; d >= 0; --d) {
        if (d >= (int)p.kept_rank) continue;
        const IDX s = (IDX)p.kept_shape[d];
        off += (rem % s) * (IDX)p.kept_strides[d];
        rem /= s;
    }
    return off;
}

DEV IDX reduced_offset(const Params& p, IDX r) {
    if (p.reduced_rank == 1) return r * (IDX)p.reduced_strides[0];
    IDX off = 0;
#pragma unroll
    for (int d = MAX_DIMS - 1; d >= 0; --d) {
        if (d >= (int)p.reduced_rank) continue;
        const IDX s = (IDX)p.reduced_shape[d];
        off += (r % s) * (IDX)p.reduced_strides[d];
        r /= s;
    }
    return off;
}

DEV float init() {
#if KIND == 2
    return -inf_f();
#elif KIND == 3
    return inf_f();
#else
    return 0.0f;
#endif
}

DEV float combine(float a, float b) {
#if KIND == 2
    return max_nan(a, b);
#elif KIND == 3
    return min_nan(a, b);
#else
    return a + b;
#endif
}

// The output value of a combined row: the mean divides by the full reduced count; a mean,
// max or min of nothing is NaN.
DEV float finish(const Params& p, float v) {
#if PARTIAL
    return v;
#elif KIND == 1
    return p.count == 0 ? nan_f() : v / (float)p.count;
#elif KIND == 2 || KIND == 3
    return p.count == 0 ? nan_f() : v;
#else
    return v;
#endif
}

// `combine` over a block (blockDim.x a multiple of the warp size, at most 1024 threads):
// a butterfly per warp, then the warps' results in order. `scratch` holds one float per warp.
DEV float block_combine(float v, float* scratch) {
    for (int m = WARP_SIZE / 2; m > 0; m /= 2) v = combine(v, shfl_xor(v, m));
    const u32 warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u32 warps = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = scratch[0];
    for (u32 w = 1; w < warps; ++w) r = combine(r, scratch[w]);
    return r;
}

// One thread per output, for short reduced extents.
KERNEL void reduce_thread(const Params p) {
    start_after_previous();
    const IDX n = (IDX)p.row_len;
    const u64 step = block_count() * blockDim.x;
    for (u64 o = block_index() * blockDim.x + threadIdx.x; o < p.rows; o += step) {
        const IDX base = kept_offset(p, o);
        float acc = init();
        for (IDX r = 0; r < n; ++r) acc = combine(acc, ld(X, base + reduced_offset(p, r)));
        st(OUT, o, finish(p, acc));
    }
}

// 32 neighbouring outputs per block, each reduced by blockDim.x / 32 (a power of two) threads
// that take every so many elements, then a tree over them: for reductions over outer axes,
// where neighbouring outputs lie next to each other in memory and a block per output would
// read with a stride.
KERNEL __launch_bounds__(1024) void reduce_cols(const Params p) {
    start_after_previous();
    __shared__ float part[1024];
    const u32 tx = threadIdx.x % 32, ty = threadIdx.x / 32, lanes = blockDim.x / 32;
    const IDX n = (IDX)p.row_len;
    const u64 groups = (p.rows + 31) / 32;
    // Blocks take (group, chunk) pairs: with few groups, the reduced extent is split into
    // `chunks` of `chunk` elements whose partials (PARTIAL) a second launch combines.
    for (u64 gc = block_index(); gc < groups * p.chunks; gc += block_count()) {
        const u64 g = gc % groups, c = gc / groups;
        const u64 o = g * 32 + tx;
        const IDX begin = (IDX)(c * p.chunk);
        const u64 stop = (c + 1) * p.chunk;
        const IDX end = stop < (u64)n ? (IDX)stop : n;
        float acc = init();
        if (o < p.rows) {
            const IDX base = kept_offset(p, o);
            // Unrolled so that several loads are in flight; the sum stays in order.
#pragma unroll 8
            for (IDX r = begin + ty; r < end; r += lanes) acc = combine(acc, ld(X, base + reduced_offset(p, r)));
        }
        part[threadIdx.x] = acc;
        __syncthreads();
        for (u32 s = lanes / 2; s > 0; s /= 2) {
            if (ty < s) part[threadIdx.x] = combine(part[threadIdx.x], part[threadIdx.x + s * 32]);
            __syncthreads();
        }
        if (ty == 0 && o < p.rows) st(OUT, c * p.rows + o, finish(p, part[tx]));
        __syncthreads();
    }
}

#if defined(VEC_COLS)
// reduce_cols for a contiguous [row_len, rows] input whose rows are whole 16-byte groups of
// VEC_COLS outputs: a thread takes a group (one 16-byte load per reduced row, several in
// flight), COL_LANES lanes of threads share a group's reduced rows, then a tree over the
// lanes; chunks of the reduced extent as in reduce_cols.
#define COL_LANES 8
struct alignas(16) ColGroup { TI v[VEC_COLS]; };
KERNEL __launch_bounds__(32 * COL_LANES) void reduce_cols_vec(const Params p) {
    start_after_previous();
    __shared__ float part[COL_LANES][32][VEC_COLS + 1];
    const u32 tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const u64 groups = p.rows / VEC_COLS;
    const u64 tiles = (groups + 31) / 32;
    const u64 n = p.row_len;
    for (u64 gc = block_index(); gc < tiles * p.chunks; gc += block_count()) {
        const u64 g = (gc % tiles) * 32 + tx, c = gc / tiles;
        const u64 begin = c * p.chunk;
        const u64 end = (c + 1) * p.chunk < n ? (c + 1) * p.chunk : n;
        float acc[VEC_COLS];
#pragma unroll
        for (int e = 0; e < VEC_COLS; ++e) acc[e] = init();
        if (g < groups) {
            const ColGroup* src = (const ColGroup*)X + g;
#pragma unroll 4
            for (u64 r = begin + ty; r < end; r += COL_LANES) {
                const ColGroup v = src[r * groups];
#pragma unroll
                for (int e = 0; e < VEC_COLS; ++e) acc[e] = combine(acc[e], to_f32(v.v[e]));
            }
        }
#pragma unroll
        for (int e = 0; e < VEC_COLS; ++e) part[ty][tx][e] = acc[e];
        __syncthreads();
        for (u32 half = COL_LANES / 2; half > 0; half /= 2) {
            if (ty < half) {
#pragma unroll
                for (int e = 0; e < VEC_COLS; ++e) part[ty][tx][e] = combine(part[ty][tx][e], part[ty + half][tx][e]);
            }
            __syncthreads();
        }
        if (ty == 0 && g < groups) {
#pragma unroll
            for (int e = 0; e < VEC_COLS; ++e) st(OUT, c * p.rows + g * VEC_COLS + e, finish(p, part[0][tx][e]));
        }
        __syncthreads();
    }
}
#endif

// A block per (output, chunk of `chunk` reduced elements): `chunks` partials per output when
// a few outputs reduce long extents (a second launch combines them), one chunk otherwise.
// Output `b = o * chunks + c`.
KERNEL void reduce_block(const Params p) {
    start_after_previous();
    __shared__ float scratch[32];
    const u64 total = p.rows * p.chunks;
    const IDX n = (IDX)p.row_len, bd = (IDX)blockDim.x;
    for (u64 b = block_index(); b < total; b += block_count()) {
        const u64 o = b / p.chunks, c = b % p.chunks;
        const IDX begin = (IDX)(c * p.chunk);
        const u64 stop = (c + 1) * p.chunk;
        const IDX end = stop < (u64)n ? (IDX)stop : n;
        const IDX base = kept_offset(p, o);
        float acc = init();
        IDX r = begin + (IDX)threadIdx.x;
        if (p.reduced_rank <= 1) {
            // Four loads in flight per step; combined in the same order as one at a time.
            const IDX rs = p.reduced_rank == 1 ? (IDX)p.reduced_strides[0] : (IDX)0;
            for (; r + 3 * bd < end; r += 4 * bd) {
                const float x0 = ld(X, base + r * rs);
                const float x1 = ld(X, base + (r + bd) * rs);
                const float x2 = ld(X, base + (r + 2 * bd) * rs);
                const float x3 = ld(X, base + (r + 3 * bd) * rs);
                acc = combine(combine(combine(combine(acc, x0), x1), x2), x3);
            }
        }
        for (; r < end; r += bd) acc = combine(acc, ld(X, base + reduced_offset(p, r)));
        acc = block_combine(acc, scratch);
        if (threadIdx.x == 0) st(OUT, b, finish(p, acc));
    }
}

// Whether (v2, i2) beats (v1, i1) for argmax: larger, NaN largest, the first index on ties.
DEV bool better(float v1, IDX i1, float v2, IDX i2) {
    const bool n1 = is_nan(v1), n2 = is_nan(v2);
    if (n1 && n2) return i2 < i1;
    if (n2) return true;
    if (n1) return false;
    if (v2 > v1) return true;
    return v2 == v1 && i2 < i1;
}

// Argmax with one thread per output, for short extents: the CPU's scan.
KERNEL void argmax_thread(const Params p) {
    start_after_previous();
    const IDX n = (IDX)p.row_len;
    const u64 step = block_count() * blockDim.x;
    for (u64 o = block_index() * blockDim.x + threadIdx.x; o < p.rows; o += step) {
        const IDX base = kept_offset(p, o);
        float bv = ld(X, base);
        IDX bi = 0;
        for (IDX r = 1; r < n && !is_nan(bv); ++r) {
            const float v = ld(X, base + reduced_offset(p, r));
            if (is_nan(v) || v > bv) {
                bv = v;
                bi = r;
            }
        }
        IDS[o] = (i32)bi;
    }
}

// The best (value, index) pair of a block's threads, a tree keeping the better of each pair
// (blockDim.x a power of two, at most 1024); thread 0 gets it.
DEV void block_argmax(float& bv, IDX& bi, float* sv, IDX* si) {
    const u32 t = threadIdx.x;
    sv[t] = bv;
    si[t] = bi;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s && better(sv[t], si[t], sv[t + s], si[t + s])) {
            sv[t] = sv[t + s];
            si[t] = si[t + s];
        }
        __syncthreads();
    }
    bv = sv[0];
    bi = si[0];
    __syncthreads();
}

// Argmax with a block per output and chunk of `chunk` elements (`chunks` per output; one
// chunk is the whole row): each thread scans every blockDim.x-th element of its chunk,
// ARGMAX_LOADS loads in flight at a time (`better` breaks ties by index, so the order of
// comparisons does not matter), then a tree. With PARTIAL, chunk c of output o leaves its
// value and index at [o * chunks + c] of ptrs[2] (f32) and ptrs[1] (IDX) for argmax_finish.
#define ARGMAX_LOADS 16
KERNEL __launch_bounds__(1024) void argmax_block(const Params p) {
    start_after_previous();
    __shared__ float sv[1024];
    __shared__ IDX si[1024];
    const IDX n = (IDX)p.row_len, stride = (IDX)blockDim.x;
    for (u64 b = block_index(); b < p.rows * p.chunks; b += block_count()) {
        const u64 o = b / p.chunks;
        const IDX first = (IDX)((b % p.chunks) * p.chunk);
        const IDX end = first + (IDX)p.chunk < n ? first + (IDX)p.chunk : n;
        const IDX base = kept_offset(p, o);
        float bv = ld(X, base + reduced_offset(p, first));
        IDX bi = first;
        for (IDX r0 = first + threadIdx.x; r0 < end; r0 += ARGMAX_LOADS * stride) {
            float v[ARGMAX_LOADS];
            // Indices past the chunk are clamped rather than branched around, so that the
            // loads issue together (12.6 us for 4,096 elements on an H200 with the branches,
            // 6.9 without); the comparisons below skip them.
#pragma unroll
            for (int k = 0; k < ARGMAX_LOADS; ++k) {
                const IDX r = r0 + (IDX)k * stride;
                v[k] = ld(X, base + reduced_offset(p, r < end ? r : end - 1));
            }
#pragma unroll
            for (int k = 0; k < ARGMAX_LOADS; ++k) {
                const IDX r = r0 + (IDX)k * stride;
                if (r < end && better(bv, bi, v[k], r)) {
                    bv = v[k];
                    bi = r;
                }
            }
        }
        block_argmax(bv, bi, sv, si);
        if (threadIdx.x == 0) {
#if PARTIAL
            ((float*)p.ptrs[2])[b] = bv;
            ((IDX*)p.ptrs[1])[b] = bi;
#else
            IDS[o] = (i32)bi;
#endif
        }
    }
}

// The chunks' pairs of each output (ptrs[0] values, ptrs[1] indices, `chunks` per output),
// combined by a block per output into the argmax: the same pair one pass would pick.
KERNEL __launch_bounds__(1024) void argmax_finish(const Params p) {
    start_after_previous();
    __shared__ float sv[1024];
    __shared__ IDX si[1024];
    const float* values = (const float*)p.ptrs[0];
    const IDX* indices = (const IDX*)p.ptrs[1];
    for (u64 o = block_index(); o < p.rows; o += block_count()) {
        const u64 at = o * p.chunks;
        float bv = values[at];
        IDX bi = indices[at];
        for (u64 c = threadIdx.x; c < p.chunks; c += blockDim.x) {
            if (better(bv, bi, values[at + c], indices[at + c])) {
                bv = values[at + c];
                bi = indices[at + c];
            }
        }
        block_argmax(bv, bi, sv, si);
        if (threadIdx.x == 0) IDS[o] = (i32)bi;
    }
}

// Softmax or log-softmax of each row, a block per row: the maximum, the sum of exponentials
// shifted by it, then the outputs.
KERNEL __launch_bounds__(1024) void softmax(const Params p) {
    start_after_previous();
    __shared__ float scratch[32];
    const u64 n = p.row_len;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const TI* x = X + row * n;
        TO* y = OUT + row * n;
        float m = -inf_f();
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) m = max_nan(m, ld(x, j));
        m = block_max(m, scratch);
        float s = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) s += expf(ld(x, j) - m);
        s = block_sum(s, scratch);
#if LOG
        const float ls = logf(s);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) st(y, j, ld(x, j) - m - ls);
#else
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) st(y, j, expf(ld(x, j) - m) / s);
#endif
    }
}

// Softmax's backward `y (dy - sum(dy y))`, or log-softmax's `dy - exp(y) sum(dy)`, from the
// forward output `y` (ptrs[0]) and `dy` (ptrs[1]), a block per row.
KERNEL __launch_bounds__(1024) void softmax_backward(const Params p) {
    start_after_previous();
    __shared__ float scratch[32];
    const u64 n = p.row_len;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const TI* yr = X + row * n;
        const TI* dyr = X2 + row * n;
        TO* dx = OUT + row * n;
        float s = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
#if LOG
            s += ld(dyr, j);
#else
            s += ld(dyr, j) * ld(yr, j);
#endif
        }
        s = block_sum(s, scratch);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const float y = ld(yr, j), dy = ld(dyr, j);
#if LOG
            st(dx, j, dy - expf(y) * s);
#else
            st(dx, j, y * (dy - s));
#endif
        }
    }
}
