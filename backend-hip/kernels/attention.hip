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

#if defined(FORWARD_MMA) && defined(TESSERA_NVIDIA)
// The forward pass on NVIDIA's tensor cores, for 16-bit data and equal query and value head
// dims D (a multiple of 16, at most 128): four warps per block, 16 query rows each, keys in
// tiles of 64; S = Q K^T and O += P V as m16n8k16 MMAs with f32 accumulators, the online
// softmax in registers (base-2 exponentials of scores pre-scaled by log2 e), P carried into
// its MMA as two 16-bit parts (`split2`). Tiles sit in dynamic shared memory, rows
// padded by 8 elements against bank conflicts. Defines: D, MMA_BF16 (1: bf16, 0: f16).
#define BQ 64
#define BK 64
#define DP (D + 8)

DEV void mma16816(float* c, const u32* a, const u32* b) {
#if MMA_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Two floats as one register of 16-bit values, `lo` in the low half.
DEV u32 pack2(float lo, float hi) {
    u32 r;
#if MMA_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// The two 16-bit values of a register as floats.
DEV float low_half(u32 v) {
#if MMA_BF16
    return __uint_as_float(v << 16);
#else
    f16 h;
    h.bits = (u16)(v & 0xffffu);
    return to_f32(h);
#endif
}
DEV float high_half(u32 v) {
#if MMA_BF16
    return __uint_as_float(v & 0xffff0000u);
#else
    f16 h;
    h.bits = (u16)(v >> 16);
    return to_f32(h);
#endif
}

// Two probabilities as a 16-bit pair `hi` and the pair `lo` of what rounding left out, so
// that P V = hi V + lo V keeps P to about f32 precision (P rounded once to 16 bits misses the
// CPU's f32 result where the weighted values cancel).
DEV void split2(float a, float b, u32& hi, u32& lo) {
    hi = pack2(a, b);
    lo = pack2(a - low_half(hi), b - high_half(hi));
}

// Rows `first..first + BQ` of a head's [rows, D] matrix into a padded tile; rows past `count`
// are zeros (their scores are masked, and zero values keep P V finite).
DEV void load_tile(u16* tile, const u16* rows, u32 first, u32 count) {
    for (u32 e = threadIdx.x * 8; e < BQ * D; e += blockDim.x * 8) {
        const u32 r = e / D, c = e % D;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (first + r < count) v = *(const uint4*)(rows + (u64)(first + r) * D + c);
        *(uint4*)(tile + r * DP + c) = v;
    }
}

KERNEL void __launch_bounds__(128) forward_mma(const Params p) {
    extern __shared__ uint4 smem_words[];
    u16* qs = (u16*)smem_words;
    u16* ks = qs + BQ * DP;
    u16* vs = ks + BK * DP;
    const u32 tq = p.q_len;
    const u32 blocks = (tq + BQ - 1) / BQ;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const float scale2 = p.scale * 1.4426950408889634f;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (u32)(t % blocks) * BQ;
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const u16* kh = (const u16*)k_head(p, b, g);
        const u16* vh = (const u16*)v_head(p, b, g);
        __syncthreads();
        load_tile(qs, (const u16*)p.q + bh * tq * D, i0, tq);
        __syncthreads();
        const u32 r0 = warp * 16 + gid;
        u32 qa[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const u16* lo = qs + r0 * DP + kk * 16 + tig * 2;
            const u16* hi = lo + 8 * DP;
            qa[kk][0] = *(const u32*)lo;
            qa[kk][1] = *(const u32*)hi;
            qa[kk][2] = *(const u32*)(lo + 8);
            qa[kk][3] = *(const u32*)(hi + 8);
        }
        float o[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
        const u32 rows[2] = {i0 + r0, i0 + r0 + 8};
        const u32 lim[2] = {rows[0] < tq ? visible(p, rows[0]) : 0u,
                            rows[1] < tq ? visible(p, rows[1]) : 0u};
        float m[2] = {-inf_f(), -inf_f()}, l[2] = {0.0f, 0.0f};
        const u32 last = (i0 + BQ < tq ? i0 + BQ : tq) - 1;
        const u32 span = visible(p, last);
        for (u32 j0 = 0; j0 < span; j0 += BK) {
            __syncthreads();
            load_tile(ks, kh, j0, p.k_len);
            load_tile(vs, vh, j0, p.k_len);
            __syncthreads();
            float s[BK / 8][4];
#pragma unroll
            for (int j = 0; j < BK / 8; ++j) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const u16* kr = ks + (j * 8 + gid) * DP + kk * 16 + tig * 2;
                    const u32 kb[2] = {*(const u32*)kr, *(const u32*)(kr + 8)};
                    mma16816(s[j], qa[kk], kb);
                }
            }
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int j = 0; j < BK / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 col = j0 + j * 8 + tig * 2 + (e & 1);
                    const float v = col < lim[e / 2] ? s[j][e] * scale2 : -inf_f();
                    s[j][e] = v;
                    mx[e / 2] = fmaxf(mx[e / 2], v);
                }
            }
            float base[2], corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
                mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
                base[h] = mx[h] == -inf_f() ? 0.0f : mx[h];
                corr[h] = exp2f(m[h] - base[h]);
                m[h] = mx[h];
            }
#pragma unroll
            for (int j = 0; j < BK / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[j][e] = exp2f(s[j][e] - base[e / 2]);
                    sum[e / 2] += s[j][e];
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + sum[h];
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][0] *= corr[0];
                o[nt][1] *= corr[0];
                o[nt][2] *= corr[1];
                o[nt][3] *= corr[1];
            }
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                u32 hi[4], lo[4];
                split2(s[2 * kk][0], s[2 * kk][1], hi[0], lo[0]);
                split2(s[2 * kk][2], s[2 * kk][3], hi[1], lo[1]);
                split2(s[2 * kk + 1][0], s[2 * kk + 1][1], hi[2], lo[2]);
                split2(s[2 * kk + 1][2], s[2 * kk + 1][3], hi[3], lo[3]);
                const u16* v0 = vs + (kk * 16 + tig * 2) * DP + gid;
#pragma unroll
                for (int nt = 0; nt < D / 8; ++nt) {
                    const u16* vc = v0 + nt * 8;
                    const u32 vb[2] = {(u32)vc[0] | ((u32)vc[DP] << 16),
                                       (u32)vc[8 * DP] | ((u32)vc[9 * DP] << 16)};
                    mma16816(o[nt], hi, vb);
                    mma16816(o[nt], lo, vb);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += shfl_xor(l[h], 1);
            l[h] += shfl_xor(l[h], 2);
            if (rows[h] >= tq) continue;
            const u64 row = bh * tq + rows[h];
            T* out = (T*)p.out + row * D;
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                st(out, nt * 8 + tig * 2, o[nt][2 * h] * inv);
                st(out, nt * 8 + tig * 2 + 1, o[nt][2 * h + 1] * inv);
            }
            if (tig == 0) {
                ((float*)p.lse)[row] = l[h] > 0.0f ? (m[h] + log2f(l[h])) * 0.6931471805599453f : -inf_f();
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
