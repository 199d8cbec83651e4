// Layer norm and RMS norm over rows of any length, forward and backward: a block per row
// (looping over rows past the grid), tree sums in f32. The weight (and bias) gradients sum
// over rows in a fixed order: each block sums a chunk of rows for a tile of columns, then a
// second kernel adds the chunks' partial sums in a fixed order. Parameters: `NormParams`
// (ops/norm.rs). The planner defines T (the data's stored type) and LAYER (1 for layer norm,
// 0 for RMS norm); `norm_forward_regs` also REGS, the elements each thread holds.

#define MAX_WARPS 32

KERNEL void norm_forward(const Params p) {
    start_after_previous();
    __shared__ float scratch[MAX_WARPS];
    const T* x = (const T*)p.x;
    const T* w = (const T*)p.w;
    T* y = (T*)p.y;
    const u64 n = p.n;
    const float nf = (float)n;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const T* xr = x + row * n;
#if LAYER
        float s = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) s += ld(xr, j);
        const float mean = block_sum(s, scratch) / nf;
        float q = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const float d = ld(xr, j) - mean;
            q += d * d;
        }
        const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / nf + p.eps);
        const T* b = (const T*)p.b;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            st(y, row * n + j, (ld(xr, j) - mean) * rstd * ld(w, j) + ld(b, j));
        }
        if (threadIdx.x == 0) ((float*)p.mean)[row] = mean;
#else
        float q = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const float v = ld(xr, j);
            q += v * v;
        }
        const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / nf + p.eps);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            st(y, row * n + j, ld(xr, j) * rstd * ld(w, j));
        }
#endif
        if (threadIdx.x == 0) ((float*)p.rstd)[row] = rstd;
    }
}

#if defined(REGS)
// norm_forward for rows of at most REGS x blockDim.x elements: each thread loads its
// elements once into registers (element j = threadIdx.x + i * blockDim.x, as norm_forward
// strides, so the sums and results are the same bits) and works from there, one trip to
// memory per row instead of three.
KERNEL void norm_forward_regs(const Params p) {
    // The weight, pulled into L2 while the kernel ahead finishes.
    start_after_previous_prefetching((const T*)p.w, p.w ? p.n * sizeof(T) : 0);
    __shared__ float scratch[MAX_WARPS];
    T* y = (T*)p.y;
    const u64 n = p.n;
    const float nf = (float)n;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const T* xr = (const T*)p.x + row * n;
        // The row, weight and bias are all loaded before the first sum waits on them.
        float v[REGS], wv[REGS];
#if LAYER
        float bv[REGS];
#endif
#pragma unroll
        for (int i = 0; i < REGS; ++i) {
            const u64 j = threadIdx.x + (u64)i * blockDim.x;
            v[i] = j < n ? ld(xr, j) : 0.0f;
            wv[i] = j < n ? ld((const T*)p.w, j) : 0.0f;
#if LAYER
            bv[i] = j < n ? ld((const T*)p.b, j) : 0.0f;
#endif
        }
#if LAYER
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < REGS; ++i) s += v[i];
        const float mean = block_sum(s, scratch) / nf;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < REGS; ++i) {
            const u64 j = threadIdx.x + (u64)i * blockDim.x;
            const float d = v[i] - mean;
            if (j < n) q += d * d;
        }
        const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / nf + p.eps);
#pragma unroll
        for (int i = 0; i < REGS; ++i) {
            const u64 j = threadIdx.x + (u64)i * blockDim.x;
            if (j < n) st(y, row * n + j, (v[i] - mean) * rstd * wv[i] + bv[i]);
        }
        if (threadIdx.x == 0) ((float*)p.mean)[row] = mean;
#else
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < REGS; ++i) q += v[i] * v[i];
        const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / nf + p.eps);
#pragma unroll
        for (int i = 0; i < REGS; ++i) {
            const u64 j = threadIdx.x + (u64)i * blockDim.x;
            if (j < n) st(y, row * n + j, v[i] * rstd * wv[i]);
        }
#endif
        if (threadIdx.x == 0) ((float*)p.rstd)[row] = rstd;
    }
}
#endif

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight; RMS norm has no
// mean(g) term and xhat = x * rstd.
KERNEL void norm_dx(const Params p) {
    start_after_previous();
    __shared__ float scratch[MAX_WARPS];
    const T* x = (const T*)p.x;
    const T* w = (const T*)p.w;
    const T* dy = (const T*)p.dy;
    T* dx = (T*)p.dx;
    const u64 n = p.n;
    const float nf = (float)n;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const T* xr = x + row * n;
        const T* dyr = dy + row * n;
#if LAYER
        const float mean = ((const float*)p.mean)[row];
#else
        const float mean = 0.0f;
#endif
        const float rstd = ((const float*)p.rstd)[row];
        float sg = 0.0f, sgx = 0.0f;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const float g = ld(dyr, j) * ld(w, j);
            sg += g;
            sgx += g * ((ld(xr, j) - mean) * rstd);
        }
#if LAYER
        const float mg = block_sum(sg, scratch) / nf;
#else
        (void)sg;
        const float mg = 0.0f;
#endif
        const float mgx = block_sum(sgx, scratch) / nf;
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const float g = ld(dyr, j) * ld(w, j);
            const float xh = (ld(xr, j) - mean) * rstd;
            st(dx, row * n + j, rstd * (g - mg - xh * mgx));
        }
    }
}

#if defined(KV)
// The whole backward for rows of 16-byte groups (V elements of T, at most KV groups per lane),
// a warp per row: each lane holds its groups of x and dy (group k * WARP_SIZE + lane), the
// row's two sums are warp shuffles (no block barrier per row), and the lanes sum the weight
// (and bias) gradients of their columns over the warp's rows while the next row's groups are
// already on their way. Block b takes chunk b of `chunk_rows` rows, a share per warp; at the
// end its warps' sums are added in warp order (one barrier) into `partial` (as
// `norm_dw_partial` leaves them for `norm_dw_finish`), or straight into dw and db when one
// chunk holds every row.
// Dynamic shared memory: n floats per gradient and warp.
struct alignas(16) Group { T v[V]; };
#define SUMS (LAYER ? 2 : 1)

KERNEL void norm_backward_rows(const Params p) {
    start_after_previous();
    extern __shared__ float col_sums[];
    const Group* x = (const Group*)p.x;
    const Group* dy = (const Group*)p.dy;
    Group* dx = (Group*)p.dx;
    const float* rstds = (const float*)p.rstd;
#if LAYER
    const float* means = (const float*)p.mean;
#endif
    const u64 n = p.n, groups = n / V;
    const float nf = (float)n;
    const u32 warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const u32 lane = threadIdx.x % WARP_SIZE;
    float wv[KV][V];
#pragma unroll
    for (int k = 0; k < KV; ++k) {
        const u64 gi = (u64)k * WARP_SIZE + lane;
        const Group wg = gi < groups ? ((const Group*)p.w)[gi] : Group{};
#pragma unroll
        for (int e = 0; e < V; ++e) wv[k][e] = gi < groups ? to_f32(wg.v[e]) : 0.0f;
    }
    for (u64 b = block_index(); b < p.chunks; b += block_count()) {
        const u64 r0 = b * p.chunk_rows;
        const u64 r1 = r0 + p.chunk_rows < p.rows ? r0 + p.chunk_rows : p.rows;
        const u64 per = (p.chunk_rows + warps - 1) / warps;
        const u64 a0 = r0 + warp * per < r1 ? r0 + warp * per : r1;
        const u64 a1 = a0 + per < r1 ? a0 + per : r1;
        float sw[KV][V], sb[KV][V];
        Group xg[KV], gg[KV];
#pragma unroll
        for (int k = 0; k < KV; ++k) {
#pragma unroll
            for (int e = 0; e < V; ++e) sw[k][e] = sb[k][e] = 0.0f;
            const u64 gi = (u64)k * WARP_SIZE + lane;
            if (a0 < a1 && gi < groups) {
                xg[k] = x[a0 * groups + gi];
                gg[k] = dy[a0 * groups + gi];
            }
        }
        for (u64 r = a0; r < a1; ++r) {
            float xh[KV][V], g[KV][V], d[KV][V];
#pragma unroll
            for (int k = 0; k < KV; ++k) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    xh[k][e] = to_f32(xg[k].v[e]);
                    d[k][e] = to_f32(gg[k].v[e]);
                }
            }
            if (r + 1 < a1) {
#pragma unroll
                for (int k = 0; k < KV; ++k) {
                    const u64 gi = (u64)k * WARP_SIZE + lane;
                    if (gi < groups) {
                        xg[k] = x[(r + 1) * groups + gi];
                        gg[k] = dy[(r + 1) * groups + gi];
                    }
                }
            }
#if LAYER
            const float mean = means[r];
#else
            const float mean = 0.0f;
#endif
            const float rstd = rstds[r];
            float sg = 0.0f, sgx = 0.0f;
#pragma unroll
            for (int k = 0; k < KV; ++k) {
                const bool live = (u64)k * WARP_SIZE + lane < groups;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    xh[k][e] = live ? (xh[k][e] - mean) * rstd : 0.0f;
                    g[k][e] = live ? d[k][e] * wv[k][e] : 0.0f;
                    sg += g[k][e];
                    sgx += g[k][e] * xh[k][e];
                    sw[k][e] += live ? d[k][e] * xh[k][e] : 0.0f;
                    sb[k][e] += live ? d[k][e] : 0.0f;
                }
            }
#if LAYER
            const float mg = warp_sum(sg) / nf;
#else
            (void)sg;
            const float mg = 0.0f;
#endif
            const float mgx = warp_sum(sgx) / nf;
#pragma unroll
            for (int k = 0; k < KV; ++k) {
                const u64 gi = (u64)k * WARP_SIZE + lane;
                if (gi >= groups) continue;
                Group out;
#pragma unroll
                for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(rstd * (g[k][e] - mg - xh[k][e] * mgx));
                dx[r * groups + gi] = out;
            }
        }
        // Every warp's sums into shared memory, then each column's added in warp order.
#pragma unroll
        for (int k = 0; k < KV; ++k) {
            const u64 gi = (u64)k * WARP_SIZE + lane;
            if (gi >= groups) continue;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                col_sums[(u64)warp * SUMS * n + gi * V + e] = sw[k][e];
#if LAYER
                col_sums[((u64)warp * SUMS + 1) * n + gi * V + e] = sb[k][e];
#endif
            }
        }
        __syncthreads();
        for (u64 c = threadIdx.x; c < n; c += blockDim.x) {
            float dw = 0.0f, db = 0.0f;
            for (u32 w = 0; w < warps; ++w) {
                dw += col_sums[(u64)w * SUMS * n + c];
#if LAYER
                db += col_sums[((u64)w * SUMS + 1) * n + c];
#endif
            }
            (void)db;
            if (p.chunks == 1) {
                st((T*)p.dw, c, dw);
#if LAYER
                st((T*)p.db, c, db);
#endif
            } else {
                ((float*)p.partial)[b * n + c] = dw;
#if LAYER
                ((float*)p.partial)[(p.chunks + b) * n + c] = db;
#endif
            }
        }
        // The next chunk writes col_sums again.
        __syncthreads();
    }
}
#endif

// Partial weight (and bias) gradients: block b sums rows chunk * chunk_rows .. + chunk_rows
// of a tile of blockDim.x columns, in row order, into `partial` ([2][chunks][n] f32: dweight
// then dbias), or straight into dw and db when there is one chunk.
KERNEL void norm_dw_partial(const Params p) {
    start_after_previous();
    const T* x = (const T*)p.x;
    const T* dy = (const T*)p.dy;
    const float* rstd = (const float*)p.rstd;
#if LAYER
    const float* means = (const float*)p.mean;
#endif
    float* partial = (float*)p.partial;
    const u64 n = p.n;
    const u64 tiles = (n + blockDim.x - 1) / blockDim.x;
    for (u64 b = block_index(); b < tiles * p.chunks; b += block_count()) {
        const u64 chunk = b / tiles;
        const u64 c = (b - chunk * tiles) * blockDim.x + threadIdx.x;
        if (c >= n) continue;
        const u64 r0 = chunk * p.chunk_rows;
        const u64 r1 = r0 + p.chunk_rows < p.rows ? r0 + p.chunk_rows : p.rows;
        float sw = 0.0f, sb = 0.0f;
        for (u64 r = r0; r < r1; ++r) {
            const float g = ld(dy, r * n + c);
#if LAYER
            const float mean = means[r];
#else
            const float mean = 0.0f;
#endif
            sw += g * ((ld(x, r * n + c) - mean) * rstd[r]);
            sb += g;
        }
        if (p.chunks == 1) {
            st((T*)p.dw, c, sw);
#if LAYER
            st((T*)p.db, c, sb);
#endif
        } else {
            partial[chunk * n + c] = sw;
            partial[(p.chunks + chunk) * n + c] = sb;
        }
    }
}

// The chunks' partial sums: blocks of 32 columns by FINISH_LANES lanes, lane l adding chunks
// l, l + FINISH_LANES, ... in order (eight loads in flight), then the lanes' sums in a fixed
// tree, so the result is the same every run.
#define FINISH_LANES 8
KERNEL void __launch_bounds__(32 * FINISH_LANES) norm_dw_finish(const Params p) {
    start_after_previous();
    __shared__ float part[2][FINISH_LANES][32];
    const float* partial = (const float*)p.partial;
    const u64 n = p.n;
    const u32 tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (u64 c0 = block_index() * 32; c0 < n; c0 += block_count() * 32) {
        const u64 c = c0 + tx;
        float sw = 0.0f, sb = 0.0f;
        if (c < n) {
#pragma unroll 8
            for (u64 k = ty; k < p.chunks; k += FINISH_LANES) {
                sw += partial[k * n + c];
                sb += partial[(p.chunks + k) * n + c];
            }
        }
        part[0][ty][tx] = sw;
        part[1][ty][tx] = sb;
        __syncthreads();
        for (u32 half = FINISH_LANES / 2; half > 0; half /= 2) {
            if (ty < half) {
                part[0][ty][tx] += part[0][ty + half][tx];
                part[1][ty][tx] += part[1][ty + half][tx];
            }
            __syncthreads();
        }
        if (ty == 0 && c < n) {
            st((T*)p.dw, c, part[0][0][tx]);
#if LAYER
            st((T*)p.db, c, part[1][0][tx]);
#endif
        }
        __syncthreads();
    }
}
