// Rotary embeddings, and attention forward and backward in the flash style: a thread per
// query row (or key row), ROWS rows per block, the other side streamed through shared memory
// TILE rows at a time, so nothing T x T is ever stored. Head rows live in per-thread arrays
// sized by the head dims, which are compile-time constants (loops over them unroll).
// Parameters: `RotaryParams`, `AttnParams` (ops/attention.rs). Rows of k and v are
// contiguous; their heads and batches may lie further apart (a view of a KV cache). The
// planner defines:
//   T      the stored type of q, k, v, out, dout and the gradients (lse and delta are f32)
//   IDX    rotary's index type
//   KD VD  head dims of queries/keys and of values
//   TILE   rows per streamed tile
//   ROWS   threads per block, one row each
//   DELTA_SUM  1: the dq kernel forms delta_i = sum_j P_ij dP_ij itself (16-bit `out`, whose
//          rounding would otherwise leak into delta); 0: delta_i = dout_i . out_i

#if defined(ROTARY)
// A thread per pair (d, d + D/2) of a row, so the op may run in place.
KERNEL void rotary(const Params p) {
    const T* x = (const T*)p.x;
    const T* cs = (const T*)p.cos;
    const T* sn = (const T*)p.sin;
    T* y = (T*)p.y;
    const IDX half = (IDX)p.half;
    const IDX pairs = (IDX)p.pairs;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX e = (IDX)(block_index() * blockDim.x + threadIdx.x); e < pairs; e += step) {
        const IDX row = e / half, d = e % half;
        const IDX t = row % (IDX)p.positions;
        const IDX a = row * 2 * half + d, b = a + half, c = t * half + d;
        const float x0 = ld(x, a), x1 = ld(x, b);
        const float co = ld(cs, c), si = ld(sn, c);
        st(y, a, x0 * co - x1 * si);
        st(y, b, x1 * co + x0 * si);
    }
}
#else

// Array sizes: a head dim may be 0.
#define KA (KD > 0 ? KD : 1)
#define VA (VD > 0 ? VD : 1)

// Loops over head rows unroll fully where the rows fit in registers; past that they spill
// anyway, and fully unrolled loops only take the compiler longer.
#if KD <= 128 && VD <= 128
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("unroll 8")
#endif

// The number of keys query `i` sees (causal: key j when j <= i + Tk - Tq, and Tk >= Tq).
DEV u32 visible(const Params& p, u32 i) {
    if (!p.causal) return p.k_len;
    const u32 n = i + p.k_len - p.q_len + 1;
    return n < p.k_len ? n : p.k_len;
}

// The first key row of batch `b`, key/value head `g`, and the same for values.
DEV const T* k_head(const Params& p, u64 b, u64 g) {
    return (const T*)p.k + b * p.k_batch_stride + g * p.k_head_stride;
}
DEV const T* v_head(const Params& p, u64 b, u64 g) {
    return (const T*)p.v + b * p.v_batch_stride + g * p.v_head_stride;
}

// Copies rows `first..first + cnt` of a matrix of `DIM` columns into `tile` (rows past `cnt`
// are left alone: no thread reads them).
template <int DIM>
DEV void fill(float* tile, const T* rows, u32 first, u32 cnt) {
    const T* src = rows + (u64)first * DIM;
    for (u32 e = threadIdx.x; e < cnt * DIM; e += ROWS) tile[e] = ld(src, e);
}

template <int DIM>
DEV float dot_row(const float* a, const float* b) {
    float s = 0.0f;
UNROLL
    for (int d = 0; d < DIM; ++d) s += a[d] * b[d];
    return s;
}

#if defined(FORWARD)
// Online softmax: the running maximum `m`, the sum `l` of exp(s - m) and the weighted sum of
// values, rescaled when the maximum grows. Scores are `scale * (q . k)`, as the CPU forms them.
KERNEL void forward(const Params p) {
    __shared__ float ks[TILE * KA];
    __shared__ float vs[TILE * VA];
    const u32 tq = p.q_len;
    const u32 blocks = (tq + ROWS - 1) / ROWS;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (u32)(t % blocks) * ROWS;
        const u32 i = i0 + threadIdx.x;
        const bool live = i < tq;
        const u64 row = bh * tq + (live ? i : tq - 1);
        const u32 lim = live ? visible(p, i) : 0;
        const u32 last = (i0 + ROWS < tq ? i0 + ROWS : tq) - 1;
        const u32 span = visible(p, last);
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const T* kh = k_head(p, b, g);
        const T* vh = v_head(p, b, g);
        float q[KA];
        float acc[VA];
        const T* qr = (const T*)p.q + row * KD;
UNROLL
        for (int d = 0; d < KD; ++d) q[d] = ld(qr, d);
UNROLL
        for (int d = 0; d < VD; ++d) acc[d] = 0.0f;
        float m = -inf_f(), l = 0.0f;
        for (u32 j0 = 0; j0 < span; j0 += TILE) {
            const u32 cnt = span - j0 < TILE ? span - j0 : TILE;
            __syncthreads();
            fill<KD>(ks, kh, j0, cnt);
            fill<VD>(vs, vh, j0, cnt);
            __syncthreads();
            const u32 mine = lim > j0 ? (lim - j0 < cnt ? lim - j0 : cnt) : 0;
            for (u32 jj = 0; jj < mine; ++jj) {
                const float s = p.scale * dot_row<KD>(q, ks + jj * KD);
                if (s > m) {
                    const float alpha = expf(m - s);
                    l *= alpha;
UNROLL
                    for (int d = 0; d < VD; ++d) acc[d] *= alpha;
                    m = s;
                }
                const float e = expf(s - m);
                l += e;
                const float* vr = vs + jj * VD;
UNROLL
                for (int d = 0; d < VD; ++d) acc[d] += e * vr[d];
            }
        }
        if (live) {
            T* out = (T*)p.out + row * VD;
            if (lim == 0) {
UNROLL
                for (int d = 0; d < VD; ++d) st(out, d, 0.0f);
                ((float*)p.lse)[row] = -inf_f();
            } else {
UNROLL
                for (int d = 0; d < VD; ++d) st(out, d, acc[d] / l);
                ((float*)p.lse)[row] = m + logf(l);
            }
        }
    }
}
#endif

#if defined(DQ)
// A thread per query row: delta_i (written for the key kernels), then
// dq_i = sum_j scale * P_ij (dP_ij - delta_i) k_j with P_ij = exp(s_ij - lse_i) and
// dP_ij = dout_i . v_j, over the keys in order.
KERNEL void dq(const Params p) {
    __shared__ float ks[TILE * KA];
    __shared__ float vs[TILE * VA];
    const u32 tq = p.q_len;
    const u32 blocks = (tq + ROWS - 1) / ROWS;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (u32)(t % blocks) * ROWS;
        const u32 i = i0 + threadIdx.x;
        const bool live = i < tq;
        const u64 row = bh * tq + (live ? i : tq - 1);
        const u32 lim = live ? visible(p, i) : 0;
        const u32 last = (i0 + ROWS < tq ? i0 + ROWS : tq) - 1;
        const u32 span = visible(p, last);
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const T* kh = k_head(p, b, g);
        const T* vh = v_head(p, b, g);
        const float lse = ((const float*)p.lse)[row];
        float q[KA];
        float go[VA];
        float acc[KA];
        const T* qr = (const T*)p.q + row * KD;
        const T* gr = (const T*)p.dout + row * VD;
UNROLL
        for (int d = 0; d < KD; ++d) { q[d] = ld(qr, d); acc[d] = 0.0f; }
UNROLL
        for (int d = 0; d < VD; ++d) go[d] = ld(gr, d);
        float delta = 0.0f;
#if DELTA_SUM
        for (u32 j0 = 0; j0 < span; j0 += TILE) {
            const u32 cnt = span - j0 < TILE ? span - j0 : TILE;
            __syncthreads();
            fill<KD>(ks, kh, j0, cnt);
            fill<VD>(vs, vh, j0, cnt);
            __syncthreads();
            const u32 mine = lim > j0 ? (lim - j0 < cnt ? lim - j0 : cnt) : 0;
            for (u32 jj = 0; jj < mine; ++jj) {
                const float pj = expf(p.scale * dot_row<KD>(q, ks + jj * KD) - lse);
                delta += pj * dot_row<VD>(go, vs + jj * VD);
            }
        }
#else
        {
            const T* orow = (const T*)p.out + row * VD;
UNROLL
            for (int d = 0; d < VD; ++d) delta += go[d] * ld(orow, d);
        }
#endif
        if (live) ((float*)p.delta)[row] = delta;
        for (u32 j0 = 0; j0 < span; j0 += TILE) {
            const u32 cnt = span - j0 < TILE ? span - j0 : TILE;
            __syncthreads();
            fill<KD>(ks, kh, j0, cnt);
            fill<VD>(vs, vh, j0, cnt);
            __syncthreads();
            const u32 mine = lim > j0 ? (lim - j0 < cnt ? lim - j0 : cnt) : 0;
            for (u32 jj = 0; jj < mine; ++jj) {
                const float* kr = ks + jj * KD;
                const float pj = expf(p.scale * dot_row<KD>(q, kr) - lse);
                const float ds = pj * (dot_row<VD>(go, vs + jj * VD) - delta);
                const float w = p.scale * ds;
UNROLL
                for (int d = 0; d < KD; ++d) acc[d] += w * kr[d];
            }
        }
        if (live) {
            T* out = (T*)p.dq + row * KD;
UNROLL
            for (int d = 0; d < KD; ++d) st(out, d, acc[d]);
        }
    }
}
#endif

#if defined(DK) || defined(DV)
// A thread per key row j of one key/value head; the query rows of every head of its group
// pass through shared memory in order, so each gradient sums its terms in the CPU's order:
// dk_j = sum_i scale * P_ij (dP_ij - delta_i) q_i (DK), dv_j = sum_i P_ij dout_i (DV).
KERNEL void dkv(const Params p) {
    __shared__ float qs[TILE * KA];
    __shared__ float gs[TILE * VA];
#if defined(DK)
    __shared__ float ds_row[TILE];
#define ACC_DIM KD
#define ACC_ARR KA
#else
#define ACC_DIM VD
#define ACC_ARR VA
#endif
    __shared__ float lse_row[TILE];
    const u32 tq = p.q_len, tk = p.k_len;
    const u32 blocks = (tk + ROWS - 1) / ROWS;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.kv_heads * blocks;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bg = t / blocks;
        const u32 j0 = (u32)(t % blocks) * ROWS;
        const u32 j = j0 + threadIdx.x;
        const bool live = j < tk;
        const u32 jr = live ? j : tk - 1;
        const u64 b = bg / p.kv_heads, g = bg % p.kv_heads;
        // Query i sees key j when i + Tk >= j + Tq: the block's first such query, and this
        // row's.
        const u32 first = (p.causal && j0 + tq > tk) ? j0 + tq - tk : 0;
        const u32 mine = (p.causal && j + tq > tk) ? j + tq - tk : 0;
        float k[KA];
        const T* kr = k_head(p, b, g) + (u64)jr * KD;
UNROLL
        for (int d = 0; d < KD; ++d) k[d] = ld(kr, d);
#if defined(DK)
        float v[VA];
        const T* vr = v_head(p, b, g) + (u64)jr * VD;
UNROLL
        for (int d = 0; d < VD; ++d) v[d] = ld(vr, d);
#endif
        float acc[ACC_ARR];
UNROLL
        for (int d = 0; d < ACC_DIM; ++d) acc[d] = 0.0f;
        for (u32 hh = 0; hh < group; ++hh) {
            const u64 qrow0 = (b * p.heads + g * group + hh) * tq;
            const T* qh = (const T*)p.q + qrow0 * KD;
            const T* gh = (const T*)p.dout + qrow0 * VD;
            for (u32 i0 = first; i0 < tq; i0 += TILE) {
                const u32 cnt = tq - i0 < TILE ? tq - i0 : TILE;
                __syncthreads();
                fill<KD>(qs, qh, i0, cnt);
                fill<VD>(gs, gh, i0, cnt);
                for (u32 e = threadIdx.x; e < cnt; e += ROWS) {
                    lse_row[e] = ((const float*)p.lse)[qrow0 + i0 + e];
#if defined(DK)
                    ds_row[e] = ((const float*)p.delta)[qrow0 + i0 + e];
#endif
                }
                __syncthreads();
                if (!live) continue;
                for (u32 ii = (mine > i0 ? mine - i0 : 0); ii < cnt; ++ii) {
                    const float* qr = qs + ii * KD;
                    const float* gr = gs + ii * VD;
                    const float pj = expf(p.scale * dot_row<KD>(qr, k) - lse_row[ii]);
#if defined(DK)
                    const float ds = pj * (dot_row<VD>(gr, v) - ds_row[ii]);
                    const float w = p.scale * ds;
UNROLL
                    for (int d = 0; d < KD; ++d) acc[d] += w * qr[d];
#else
UNROLL
                    for (int d = 0; d < VD; ++d) acc[d] += pj * gr[d];
#endif
                }
            }
        }
        if (live) {
#if defined(DK)
            T* out = (T*)p.dk + (bg * tk + j) * KD;
#else
            T* out = (T*)p.dv + (bg * tk + j) * VD;
#endif
UNROLL
            for (int d = 0; d < ACC_DIM; ++d) st(out, d, acc[d]);
        }
    }
}
#endif

#endif
