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
    start_after_previous();
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
    start_after_previous();
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

#if defined(CACHED)
// Attention over a KV cache at positions read from the device (`CachedAttention`: decoding),
// a block per query row. Its warps take KEYS visible keys in every WARPS x KEYS, each lane a
// slice of the head dims (the dot products summed across the warp), each warp keeping its
// own online softmax; the warps' maxima, sums and partial outputs merge at the end. Keys past
// the query's position are never read. I: the positions' type; THREADS: the block's threads.
#define WARPS (THREADS / WARP_SIZE)
#define QL ((KA + WARP_SIZE - 1) / WARP_SIZE)
#define VL ((VA + WARP_SIZE - 1) / WARP_SIZE)
KERNEL __launch_bounds__(THREADS) void cached(const Params p) {
    start_after_previous();
    __shared__ float part_m[WARPS];
    __shared__ float part_l[WARPS];
    __shared__ float part_f[WARPS];
    __shared__ float part_acc[WARPS * VA];
    const u32 w = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u32 tq = p.q_len;
    const u32 group = p.heads / p.kv_heads;
    // Rows (batch x heads x queries) count in u32: decoding never has 2^32 of them, and 64-bit
    // divisions would be most of a short row's instructions.
    const u32 rows = p.batch * p.heads * tq;
    for (u32 row = (u32)block_index(); row < rows; row += (u32)block_count()) {
        const u32 bh = row / tq;
        const u32 i = row % tq;
        const u32 b = bh / p.heads, g = (bh % p.heads) / group;
        const i64 pos = (i64)((const I*)p.positions)[i];
        const u32 n = pos < 0 ? 0u : (pos < (i64)p.k_len ? (u32)pos + 1 : p.k_len);
        const T* kh = k_head(p, b, g);
        const T* vh = v_head(p, b, g);
        const T* qr = (const T*)p.q + (u64)row * KD;
        float q[QL];
        float acc[VL];
UNROLL
        for (int c = 0; c < QL; ++c) {
            const u32 d = lane + c * WARP_SIZE;
            q[c] = d < (u32)KD ? ld(qr, d) : 0.0f;
        }
UNROLL
        for (int c = 0; c < VL; ++c) acc[c] = 0.0f;
        float m = -inf_f(), l = 0.0f;
        // KEYS keys per step of a warp, their values loaded with them: every load of a step
        // is independent of the others, so one memory latency covers the step, and the
        // online softmax rescales once per step.
        for (u32 j0 = w * KEYS; j0 < n; j0 += WARPS * KEYS) {
            float s[KEYS];
            float vals[KEYS][VL];
UNROLL
            for (int u = 0; u < KEYS; ++u) {
                const bool key = j0 + u < n;
                const T* kr = kh + (u64)(j0 + u) * KD;
                const T* vr = vh + (u64)(j0 + u) * VD;
                float x = 0.0f;
UNROLL
                for (int c = 0; c < QL; ++c) {
                    const u32 d = lane + c * WARP_SIZE;
                    if (key && d < (u32)KD) x += q[c] * ld(kr, d);
                }
                s[u] = x;
UNROLL
                for (int c = 0; c < VL; ++c) {
                    const u32 d = lane + c * WARP_SIZE;
                    vals[u][c] = key && d < (u32)VD ? ld(vr, d) : 0.0f;
                }
            }
UNROLL
            for (int u = 0; u < KEYS; ++u) s[u] = p.scale * warp_sum(s[u]);
            float top = m;
UNROLL
            for (int u = 0; u < KEYS; ++u) {
                if (j0 + u < n && s[u] > top) top = s[u];
            }
            if (top > m) {
                const float alpha = expf(m - top);
                l *= alpha;
UNROLL
                for (int c = 0; c < VL; ++c) acc[c] *= alpha;
                m = top;
            }
UNROLL
            for (int u = 0; u < KEYS; ++u) {
                if (j0 + u >= n) continue;
                const float e = expf(s[u] - m);
                l += e;
UNROLL
                for (int c = 0; c < VL; ++c) acc[c] += e * vals[u][c];
            }
        }
        if (lane == 0) {
            part_m[w] = m;
            part_l[w] = l;
        }
UNROLL
        for (int c = 0; c < VL; ++c) {
            const u32 d = lane + c * WARP_SIZE;
            if (d < (u32)VD) part_acc[w * VA + d] = acc[c];
        }
        __syncthreads();
        // Each warp's share of the result, exp(m_w - top), computed once; -inf marks a warp
        // that saw no key.
        if (threadIdx.x < WARPS) {
            float top = -inf_f();
            for (u32 k = 0; k < WARPS; ++k) top = fmaxf(top, part_m[k]);
            const float mk = part_m[threadIdx.x];
            part_f[threadIdx.x] = mk == -inf_f() ? 0.0f : expf(mk - top);
        }
        __syncthreads();
        T* out = (T*)p.out + (u64)row * VD;
        for (u32 d = threadIdx.x; d < VD; d += blockDim.x) {
            float sum = 0.0f, value = 0.0f;
            for (u32 k = 0; k < WARPS; ++k) {
                sum += part_l[k] * part_f[k];
                value += part_acc[k * VA + d] * part_f[k];
            }
            st(out, d, n == 0 ? 0.0f : value / sum);
        }
        __syncthreads();
    }
}
#endif

#if defined(MMA) && defined(TESSERA_NVIDIA)
// Attention on NVIDIA's tensor cores, for 16-bit data and equal query and value head dims D
// (a multiple of 16, at most 128): four warps per block, 16 rows each, the other side in
// tiles of 64 rows; every product is an m16n8k16 MMA with f32 accumulators, exponentials are
// base 2 of scores pre-scaled by log2 e, and probabilities (and their gradients) go into an
// MMA as two 16-bit parts (`split2`). Tiles sit in dynamic shared memory, rows padded by 8
// elements against bank conflicts. Defines: D, MMA_BF16 (1: bf16, 0: f16), and one of
// FORWARD_MMA, DQ_MMA, DKV_MMA. Registers bound the blocks an SM holds (the forward needed 141
// per thread unbounded, three blocks; `__launch_bounds__` keeps it to four), so each kernel
// overlaps its own tile loads with its work (two stages, cp.async).
#define BQ 64
#define BK 64
#define DP (D + 8)
#define LOG2E 1.4426950408889634f

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

// Fragments of m16n8k16 operands from padded tiles, four 8 x 8 matrices per `ldmatrix`
// (each lane names one row of one matrix; rows are 16-byte aligned, and the padding puts the
// 8 rows of a matrix in different banks). `a_frag`: the A operand, rows `r0..r0 + 16`,
// columns `16 kk..16 kk + 16` of a row-major tile. `b_frags_t`: B operands (k x n) for n
// blocks `n0..n0 + 8` and `n0 + 8..n0 + 16` where the tile holds B transposed (row n, column
// k: the Q or K rows scores are formed against). `b_frags`: the same where the tile holds B
// as is (row k, column n: values or gradients summed over rows), transposed on the way in.
DEV u32 shared_address(const u16* p) { return (u32)__cvta_generic_to_shared(p); }
DEV void ldmatrix4(u32* r, const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}
DEV void ldmatrix4_trans(u32* r, const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}
// Tiles move from global to shared memory asynchronously (cp.async, 16 bytes per copy), in
// groups: a kernel starts the next tile's group, then waits for all but that one, so each
// tile's load overlaps the work on the one before (two stages).
// `load_tile`: rows `first..first + 64` of a head's [rows, D] matrix into a padded tile;
// rows past `count` are zero-filled (their scores are masked, and zeros keep products
// finite). `load_column`: 64 f32 values, those past `count` zero-filled.
DEV void load_tile(u16* tile, const u16* rows, u32 first, u32 count) {
    for (u32 e = threadIdx.x * 8; e < BQ * D; e += blockDim.x * 8) {
        const u32 r = e / D, c = e % D;
        const bool inside = first + r < count;
        const u16* src = inside ? rows + (u64)(first + r) * D + c : rows;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     :: "r"(shared_address(tile + r * DP + c)), "l"(src), "r"(inside ? 16u : 0u)
                     : "memory");
    }
}
DEV void load_column(float* column, const float* values, u32 first, u32 count) {
    for (u32 e = threadIdx.x; e < BQ; e += blockDim.x) {
        const bool inside = first + e < count;
        const float* src = inside ? values + first + e : values;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                     :: "r"((u32)__cvta_generic_to_shared(column + e)), "l"(src), "r"(inside ? 4u : 0u)
                     : "memory");
    }
}
DEV void commit_loads() { asm volatile("cp.async.commit_group;" ::: "memory"); }
DEV void wait_loads_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
DEV void wait_loads() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

DEV void a_frag(u32* a, const u16* tile, u32 r0, int kk, u32 lane) {
    const u32 m = lane / 8;
    ldmatrix4(a, tile + (r0 + lane % 8 + (m % 2) * 8) * DP + kk * 16 + (m / 2) * 8);
}
DEV void b_frags_t(u32* b, const u16* tile, u32 n0, int kk, u32 lane) {
    const u32 m = lane / 8;
    ldmatrix4(b, tile + (n0 + lane % 8 + (m / 2) * 8) * DP + kk * 16 + (m % 2) * 8);
}
DEV void b_frags(u32* b, const u16* tile, u32 k0, u32 n0, u32 lane) {
    const u32 m = lane / 8;
    ldmatrix4_trans(b, tile + (k0 + lane % 8 + (m % 2) * 8) * DP + n0 + (m / 2) * 8);
}

// acc[nt] += X Y over 64 rows of the k dimension, where X (16 x 64) is held as C fragments
// `x[8][4]` (the layout an MMA leaves, which is the A layout of the next) and Y is a padded
// tile with rows k and D columns: the step shared by O += P V, dV += P^T dO, dK += dS^T Q and
// dQ += dS K. X goes in as two 16-bit parts.
DEV void accumulate_product(float (*acc)[4], float (*x)[4], const u16* tile, u32 lane) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        u32 hi[4], lo[4];
        split2(x[2 * kk][0], x[2 * kk][1], hi[0], lo[0]);
        split2(x[2 * kk][2], x[2 * kk][3], hi[1], lo[1]);
        split2(x[2 * kk + 1][0], x[2 * kk + 1][1], hi[2], lo[2]);
        split2(x[2 * kk + 1][2], x[2 * kk + 1][3], hi[3], lo[3]);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt += 2) {
            u32 b[4];
            b_frags(b, tile, kk * 16, nt * 8, lane);
            mma16816(acc[nt], hi, b);
            mma16816(acc[nt], lo, b);
            mma16816(acc[nt + 1], hi, b + 2);
            mma16816(acc[nt + 1], lo, b + 2);
        }
    }
}

// s[8][4] = A B^T for 16 rows `r0..` of tile `a` against 64 rows of tile `b` (both D wide).
DEV void scores(float (*s)[4], const u16* a, u32 r0, const u16* b, u32 lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 af[4];
        a_frag(af, a, r0, kk, lane);
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            u32 bf[4];
            b_frags_t(bf, b, j * 8, kk, lane);
            mma16816(s[j], af, bf);
            mma16816(s[j + 1], af, bf + 2);
        }
    }
}

// Stores rows of a warp's C fragments `acc[D / 8][4]` times `mul`: row `r0 + gid + 8 h` of
// `out` (D wide) for h = 0, 1 where that row is below `count`.
DEV void store_rows(T* out, float (*acc)[4], float mul, u32 r0, u32 count, u32 gid, u32 tig) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 r = r0 + gid + 8 * h;
        if (r >= count) continue;
        T* row = out + (u64)r * D;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            st(row, nt * 8 + tig * 2, acc[nt][2 * h] * mul);
            st(row, nt * 8 + tig * 2 + 1, acc[nt][2 * h + 1] * mul);
        }
    }
}

#if defined(FORWARD_MMA)
// O = softmax(scale Q K^T) V with the online softmax in registers: per 64-key tile the
// scores, the running maximum and sum per row (a row's 64 scores sit in the 4 lanes of a
// quad), then O += P V.
KERNEL void __launch_bounds__(128, 4) forward_mma(const Params p) {
    start_after_previous();
    extern __shared__ uint4 smem_words[];
    // The query tile, then two stages of key and value tiles.
    u16* qs = (u16*)smem_words;
    u16* stages = qs + BQ * DP;
    const u32 tq = p.q_len;
    const u32 blocks = (tq + BQ - 1) / BQ;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const float scale2 = p.scale * LOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (u32)(t % blocks) * BQ;
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const u16* kh = (const u16*)k_head(p, b, g);
        const u16* vh = (const u16*)v_head(p, b, g);
        __syncthreads();
        load_tile(qs, (const u16*)p.q + bh * tq * D, i0, tq);
        load_tile(stages, kh, 0, p.k_len);
        load_tile(stages + BK * DP, vh, 0, p.k_len);
        commit_loads();
        float o[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
        const u32 rows[2] = {i0 + warp * 16 + gid, i0 + warp * 16 + gid + 8};
        const u32 lim[2] = {rows[0] < tq ? visible(p, rows[0]) : 0u,
                            rows[1] < tq ? visible(p, rows[1]) : 0u};
        float m[2] = {-inf_f(), -inf_f()}, l[2] = {0.0f, 0.0f};
        const u32 last = (i0 + BQ < tq ? i0 + BQ : tq) - 1;
        const u32 span = visible(p, last);
        for (u32 j0 = 0, stage = 0; j0 < span; j0 += BK, stage ^= 1) {
            const u16* ks = stages + stage * 2 * BK * DP;
            const u16* vs = ks + BK * DP;
            if (j0 + BK < span) {
                u16* next = stages + (stage ^ 1) * 2 * BK * DP;
                load_tile(next, kh, j0 + BK, p.k_len);
                load_tile(next + BK * DP, vh, j0 + BK, p.k_len);
            }
            commit_loads();
            wait_loads_but_newest();
            __syncthreads();
            float s[BK / 8][4];
            scores(s, qs, warp * 16, ks, lane);
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
            accumulate_product(o, s, vs, lane);
            // The next step loads into the stage this one read.
            __syncthreads();
        }
        wait_loads();
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += shfl_xor(l[h], 1);
            l[h] += shfl_xor(l[h], 2);
            inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            if (rows[h] < tq && tig == 0) {
                ((float*)p.lse)[bh * tq + rows[h]] =
                    l[h] > 0.0f ? (m[h] + log2f(l[h])) / LOG2E : -inf_f();
            }
        }
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            o[nt][0] *= inv[0];
            o[nt][1] *= inv[0];
            o[nt][2] *= inv[1];
            o[nt][3] *= inv[1];
        }
        store_rows((T*)p.out + bh * tq * D, o, 1.0f, i0 + warp * 16, tq, gid, tig);
    }
}
#endif

#if defined(DQ_MMA)
// dQ for 64 query rows per block: a first pass over the visible keys forms
// delta_i = sum_j P_ij dP_ij (from the f32 products, not from the 16-bit `out`, whose
// rounding would leak into every dS) and leaves it for `dkv_mma`; a second forms
// dS = P (dP - delta) and dQ += dS K. P = exp(scale q.k - lse), dP = dout . v.
KERNEL void __launch_bounds__(128, 3) dq_mma(const Params p) {
    start_after_previous();
    extern __shared__ uint4 smem_words[];
    // The query and output-gradient tiles, then two stages of key and value tiles.
    u16* qs = (u16*)smem_words;
    u16* gs = qs + BQ * DP;
    u16* stages = gs + BQ * DP;
    const u32 tq = p.q_len;
    const u32 blocks = (tq + BQ - 1) / BQ;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const float scale2 = p.scale * LOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (u32)(t % blocks) * BQ;
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const u16* kh = (const u16*)k_head(p, b, g);
        const u16* vh = (const u16*)v_head(p, b, g);
        __syncthreads();
        load_tile(qs, (const u16*)p.q + bh * tq * D, i0, tq);
        load_tile(gs, (const u16*)p.dout + bh * tq * D, i0, tq);
        const u32 rows[2] = {i0 + warp * 16 + gid, i0 + warp * 16 + gid + 8};
        u32 lim[2];
        float lse2[2], delta[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const bool live = rows[h] < tq;
            lim[h] = live ? visible(p, rows[h]) : 0u;
            lse2[h] = live ? ((const float*)p.lse)[bh * tq + rows[h]] * LOG2E : 0.0f;
        }
        const u32 last = (i0 + BQ < tq ? i0 + BQ : tq) - 1;
        const u32 span = visible(p, last);
        float acc[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        for (int pass = 0; pass < 2; ++pass) {
            load_tile(stages, kh, 0, p.k_len);
            load_tile(stages + BK * DP, vh, 0, p.k_len);
            commit_loads();
            for (u32 j0 = 0, stage = 0; j0 < span; j0 += BK, stage ^= 1) {
                const u16* ks = stages + stage * 2 * BK * DP;
                const u16* vs = ks + BK * DP;
                if (j0 + BK < span) {
                    u16* next = stages + (stage ^ 1) * 2 * BK * DP;
                    load_tile(next, kh, j0 + BK, p.k_len);
                    load_tile(next + BK * DP, vh, j0 + BK, p.k_len);
                }
                commit_loads();
                wait_loads_but_newest();
                __syncthreads();
                float s[8][4], dp[8][4];
                scores(s, qs, warp * 16, ks, lane);
                scores(dp, gs, warp * 16, vs, lane);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const u32 col = j0 + j * 8 + tig * 2 + (e & 1);
                        const float pj = col < lim[e / 2] ? exp2f(s[j][e] * scale2 - lse2[e / 2]) : 0.0f;
                        if (pass == 0) {
                            delta[e / 2] += pj * dp[j][e];
                        } else {
                            s[j][e] = pj * (dp[j][e] - delta[e / 2]);
                        }
                    }
                }
                if (pass == 1) accumulate_product(acc, s, ks, lane);
                // The next step loads into the stage this one read.
                __syncthreads();
            }
            wait_loads();
            if (pass == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    delta[h] += shfl_xor(delta[h], 1);
                    delta[h] += shfl_xor(delta[h], 2);
                    if (rows[h] < tq && tig == 0) ((float*)p.delta)[bh * tq + rows[h]] = delta[h];
                }
            }
        }
        store_rows((T*)p.dq + bh * tq * D, acc, p.scale, i0 + warp * 16, tq, gid, tig);
    }
}
#endif

#if defined(DKV_MMA)
// dK and dV for 64 key rows of one key/value head per block: the query rows of every head
// of its group stream through in order, and each warp forms its 16 keys' transposed scores
// S^T = K Q^T and dP^T = V dout^T, then dV += P^T dout and dK += dS^T Q (scaled once at the
// end), with delta from `dq_mma`.
KERNEL void __launch_bounds__(128, 3) dkv_mma(const Params p) {
    start_after_previous();
    // The key and value tiles, then two stages of a query tile, an output-gradient tile and
    // the lse and delta of their rows.
    extern __shared__ uint4 smem_words[];
    u16* ks = (u16*)smem_words;
    u16* vs = ks + BK * DP;
    u16* stages = vs + BK * DP;
    const u32 stage_halves = 2 * BQ * DP + 2 * BQ * 2;
    const u32 tq = p.q_len, tk = p.k_len;
    const u32 blocks = (tk + BK - 1) / BK;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.kv_heads * blocks;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const float scale2 = p.scale * LOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bg = t / blocks;
        const u32 j0 = (u32)(t % blocks) * BK;
        const u64 b = bg / p.kv_heads, g = bg % p.kv_heads;
        // Query i sees key j when j + Tq <= i + Tk: the first query the block's keys meet,
        // and the query tiles from there on, head after head of the group.
        const u32 first = (p.causal && j0 + tq > tk) ? j0 + tq - tk : 0;
        const u32 per_head = first < tq ? (tq - first + BQ - 1) / BQ : 0;
        const u32 steps = per_head * group;
        // Loads query tile `n` (of `steps`) into `stage`.
        auto load_step = [&](u32 n, u32 stage) {
            const u64 qrow0 = (b * p.heads + g * group + n / per_head) * tq;
            const u32 i0 = first + (n % per_head) * BQ;
            u16* qs = stages + stage * stage_halves;
            u16* gs = qs + BQ * DP;
            float* lse_col = (float*)(gs + BQ * DP);
            load_tile(qs, (const u16*)p.q + qrow0 * D, i0, tq);
            load_tile(gs, (const u16*)p.dout + qrow0 * D, i0, tq);
            load_column(lse_col, (const float*)p.lse + qrow0, i0, tq);
            load_column(lse_col + BQ, (const float*)p.delta + qrow0, i0, tq);
        };
        __syncthreads();
        load_tile(ks, (const u16*)k_head(p, b, g), j0, tk);
        load_tile(vs, (const u16*)v_head(p, b, g), j0, tk);
        if (steps > 0) load_step(0, 0);
        commit_loads();
        const u32 keys[2] = {j0 + warp * 16 + gid, j0 + warp * 16 + gid + 8};
        float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            dk[nt][0] = dk[nt][1] = dk[nt][2] = dk[nt][3] = 0.0f;
            dv[nt][0] = dv[nt][1] = dv[nt][2] = dv[nt][3] = 0.0f;
        }
        for (u32 n = 0, stage = 0; n < steps; ++n, stage ^= 1) {
            if (n + 1 < steps) load_step(n + 1, stage ^ 1);
            commit_loads();
            wait_loads_but_newest();
            __syncthreads();
            const u16* qs = stages + stage * stage_halves;
            const u16* gs = qs + BQ * DP;
            const float* lse_col = (const float*)(gs + BQ * DP);
            const float* delta_col = lse_col + BQ;
            const u32 i0 = first + (n % per_head) * BQ;
            float s[8][4], dp[8][4];
            scores(s, ks, warp * 16, qs, lane);
            scores(dp, vs, warp * 16, gs, lane);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 c = j * 8 + tig * 2 + (e & 1);
                    const u32 i = i0 + c;
                    const bool seen = i < tq && (!p.causal || keys[e / 2] + tq <= i + tk);
                    const float pj = seen ? exp2f(s[j][e] * scale2 - lse_col[c] * LOG2E) : 0.0f;
                    s[j][e] = pj;
                    dp[j][e] = pj * (dp[j][e] - delta_col[c]);
                }
            }
            accumulate_product(dv, s, gs, lane);
            accumulate_product(dk, dp, qs, lane);
            // The next step loads into the stage this one read.
            __syncthreads();
        }
        wait_loads();
        store_rows((T*)p.dk + bg * tk * D, dk, p.scale, j0 + warp * 16, tk, gid, tig);
        store_rows((T*)p.dv + bg * tk * D, dv, 1.0f, j0 + warp * 16, tk, gid, tig);
    }
}
#endif
#endif

#if defined(TILED) && defined(TESSERA_NVIDIA)
// Attention in f32 on the CUDA cores, tiled for reuse: 256 threads per block, each holding a
// 4 x 4 share of a 64 x 64 tile of scores and 4 rows of D / 16 columns of what it sums, so a
// pair of 16-byte shared loads feeds 16 multiply-adds (a thread per row fed one). The same
// passes as the tensor-core kernels: `forward_tiled` with an online softmax, `dq_tiled` (which
// leaves delta_i = dout_i . out_i for the keys' pass), then `dkv_tiled`, each recomputing the
// scores it needs. Products sum over the head dim and over rows in the CPU's order. D: the
// head dim (queries', keys' and values', a multiple of 64 up to 128). Tiles sit in dynamic
// shared memory (`tiled_shared_bytes` in ops/attention.rs) as columns (`[d][row]`, rows padded
// to LDT) for the scores' products and as rows (`[row][d]`, padded to LDR) for the sums over
// rows.
#define LDT 68
#define LDR (D + 4)
#define OC (D / 16)
#define TLOG2E 1.4426950408889634f

struct alignas(16) f4 { float x, y, z, w; };
DEV f4 ld4(const float* p) { return *(const f4*)p; }
DEV void st4(float* p, f4 v) { *(f4*)p = v; }

// Rows `first..first + 64` of a row-major [rows, D] matrix into `cols` as columns
// (cols[d * LDT + r]) and into `rows` as rows (rows[r * LDR + d]), as COLS and ROWS ask; rows
// at or past `count` become zeros. A warp takes 16 rows by two groups of 4 columns: 32-byte
// reads per row, and column writes that fall in distinct banks.
template <bool COLS, bool ROWM>
DEV void fill_tile(float* cols, float* rows, const float* src, u32 first, u32 count) {
    constexpr u32 G = D / 4;
    for (u32 e = threadIdx.x; e < 64 * G; e += 256) {
        const u32 r = e % 16 + 16 * (e / (16 * G));
        const u32 c = (e / 16) % G;
        f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
        if (first + r < count) v = ld4(src + (u64)(first + r) * D + 4 * c);
        if (COLS) {
            cols[(4 * c + 0) * LDT + r] = v.x;
            cols[(4 * c + 1) * LDT + r] = v.y;
            cols[(4 * c + 2) * LDT + r] = v.z;
            cols[(4 * c + 3) * LDT + r] = v.w;
        }
        if (ROWM) st4(rows + r * LDR + 4 * c, v);
    }
}

// acc[a][b] += sum over k < K of x[k][4 ty + a] * y[k][4 tx + b], both operands columns of
// 64-row tiles: the thread's share of a 64 x 64 product over K.
template <int K>
DEV void product_cols(float acc[4][4], const float* x, const float* y, u32 tx, u32 ty) {
#pragma unroll 8
    for (int k = 0; k < K; ++k) {
        const f4 a4 = ld4(x + k * LDT + 4 * ty), b4 = ld4(y + k * LDT + 4 * tx);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
    }
}

// acc[a][4 m + b] += sum over k < 64 of x[k][4 ty + a] * y[k][4 tx + 64 m + b]: x the columns
// of a 64 x 64 tile, y a 64-row tile of rows: the thread's 4 rows of a 64 x D product.
DEV void product_rows(float acc[4][OC], const float* x, const float* y, u32 tx, u32 ty) {
#pragma unroll 4
    for (int k = 0; k < 64; ++k) {
        const f4 a4 = ld4(x + k * LDT + 4 * ty);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int m = 0; m < D / 64; ++m) {
            const f4 b4 = ld4(y + k * LDR + 4 * tx + 64 * m);
            const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][4 * m + j] += a[i] * b[j];
            }
        }
    }
}

// Writes the thread's share of a 64 x 64 tile transposed, as columns: t[4 tx + b][4 ty + a].
DEV void store_transposed(float* t, const float v[4][4], u32 tx, u32 ty) {
#pragma unroll
    for (int b = 0; b < 4; ++b) st4(t + (4 * tx + b) * LDT + 4 * ty, {v[0][b], v[1][b], v[2][b], v[3][b]});
}

// Sums (or takes the maximum of) a value over the 16 threads that share a row.
DEV float row_sum(float v) {
#pragma unroll
    for (int o = 1; o < 16; o *= 2) v += shfl_xor(v, o);
    return v;
}
DEV float row_max(float v) {
#pragma unroll
    for (int o = 1; o < 16; o *= 2) v = fmaxf(v, shfl_xor(v, o));
    return v;
}

// Stores the thread's 4 rows of a 64 x D result times `mul`: row i0 + 4 ty + a of `out` (D
// wide) where it is below `count`.
DEV void store_result(float* out, const float acc[4][OC], float mul, u32 i0, u32 count, u32 tx, u32 ty) {
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const u32 i = i0 + 4 * ty + a;
        if (i >= count) continue;
#pragma unroll
        for (int m = 0; m < D / 64; ++m) {
            const float* v = acc[a] + 4 * m;
            st4(out + (u64)i * D + 4 * tx + 64 * m, {v[0] * mul, v[1] * mul, v[2] * mul, v[3] * mul});
        }
    }
}

#if defined(FORWARD_TILED)
// 64 query rows per block, the heaviest (last, under a causal mask) first; keys in tiles of
// 64: scores S = Q K^T, then the running maximum and sum per row and O += P V.
KERNEL void __launch_bounds__(256) forward_tiled(const Params p) {
    start_after_previous();
    extern __shared__ f4 tiles[];
    float* qt = (float*)tiles;
    float* kt = qt + D * LDT;
    float* vs = kt + D * LDT;
    float* pt = vs + 64 * LDR;
    const u32 tq = p.q_len;
    const u32 blocks = (tq + 63) / 64;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale2 = p.scale * TLOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (blocks - 1 - (u32)(t % blocks)) * 64;
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const float* kh = (const float*)k_head(p, b, g);
        const float* vh = (const float*)v_head(p, b, g);
        const u32 span = visible(p, (i0 + 64 < tq ? i0 + 64 : tq) - 1);
        u32 lim[4];
        float m[4], l[4], o[4][OC];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const u32 i = i0 + 4 * ty + a;
            lim[a] = i < tq ? visible(p, i) : 0u;
            m[a] = -inf_f();
            l[a] = 0.0f;
#pragma unroll
            for (int c = 0; c < OC; ++c) o[a][c] = 0.0f;
        }
        __syncthreads();
        fill_tile<true, false>(qt, nullptr, (const float*)p.q + bh * tq * D, i0, tq);
        for (u32 j0 = 0; j0 < span; j0 += 64) {
            // The previous tile's readers are done.
            __syncthreads();
            fill_tile<true, false>(kt, nullptr, kh, j0, p.k_len);
            fill_tile<false, true>(nullptr, vs, vh, j0, p.k_len);
            __syncthreads();
            float s[4][4] = {};
            product_cols<D>(s, qt, kt, tx, ty);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                float top = -inf_f();
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    s[a][c] = j0 + 4 * tx + c < lim[a] ? s[a][c] * scale2 : -inf_f();
                    top = fmaxf(top, s[a][c]);
                }
                const float mn = fmaxf(m[a], row_max(top));
                // Rows that have seen no key yet keep zeros (and no inf - inf).
                const float base = mn == -inf_f() ? 0.0f : mn;
                const float alpha = exp2f(m[a] - base);
                l[a] *= alpha;
#pragma unroll
                for (int c = 0; c < OC; ++c) o[a][c] *= alpha;
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    s[a][c] = exp2f(s[a][c] - base);
                    l[a] += s[a][c];
                }
                m[a] = mn;
            }
            store_transposed(pt, s, tx, ty);
            __syncthreads();
            product_rows(o, pt, vs, tx, ty);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            l[a] = row_sum(l[a]);
#pragma unroll
            for (int c = 0; c < OC; ++c) o[a][c] = l[a] > 0.0f ? o[a][c] / l[a] : 0.0f;
            const u32 i = i0 + 4 * ty + a;
            if (tx == 0 && i < tq) {
                ((float*)p.lse)[bh * tq + i] = l[a] > 0.0f ? (m[a] + log2f(l[a])) / TLOG2E : -inf_f();
            }
        }
        store_result((float*)p.out + bh * tq * D, o, 1.0f, i0, tq, tx, ty);
    }
}
#endif

#if defined(DQ_TILED)
// dQ for 64 query rows per block (the heaviest first): delta_i = dout_i . out_i, left for
// `dkv_tiled`, then per tile of 64 keys S = Q K^T and dP = dout V^T,
// dS = P (dP - delta) with P = exp(scale S - lse), and dQ += dS K.
KERNEL void __launch_bounds__(256) dq_tiled(const Params p) {
    start_after_previous();
    extern __shared__ f4 tiles[];
    float* qt = (float*)tiles;
    float* gt = qt + D * LDT;
    float* kt = gt + D * LDT;
    float* vt = kt + D * LDT;
    float* ks = vt + D * LDT;
    float* dst = ks + 64 * LDR;
    const u32 tq = p.q_len;
    const u32 blocks = (tq + 63) / 64;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.heads * blocks;
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale2 = p.scale * TLOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bh = t / blocks;
        const u32 i0 = (blocks - 1 - (u32)(t % blocks)) * 64;
        const u64 b = bh / p.heads, g = (bh % p.heads) / group;
        const float* kh = (const float*)k_head(p, b, g);
        const float* vh = (const float*)v_head(p, b, g);
        const float* outh = (const float*)p.out + bh * tq * D;
        const float* douth = (const float*)p.dout + bh * tq * D;
        const u32 span = visible(p, (i0 + 64 < tq ? i0 + 64 : tq) - 1);
        u32 lim[4];
        float lse2[4], delta[4], dq[4][OC];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const u32 i = i0 + 4 * ty + a;
            const bool live = i < tq;
            lim[a] = live ? visible(p, i) : 0u;
            lse2[a] = live ? ((const float*)p.lse)[bh * tq + i] * TLOG2E : 0.0f;
            float part = 0.0f;
            if (live) {
#pragma unroll
                for (int mm = 0; mm < D / 64; ++mm) {
                    const u64 at = (u64)i * D + 4 * tx + 64 * mm;
                    const f4 x = ld4(douth + at), y = ld4(outh + at);
                    part += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
                }
            }
            delta[a] = row_sum(part);
            if (live && tx == 0) ((float*)p.delta)[bh * tq + i] = delta[a];
#pragma unroll
            for (int c = 0; c < OC; ++c) dq[a][c] = 0.0f;
        }
        __syncthreads();
        fill_tile<true, false>(qt, nullptr, (const float*)p.q + bh * tq * D, i0, tq);
        fill_tile<true, false>(gt, nullptr, douth, i0, tq);
        for (u32 j0 = 0; j0 < span; j0 += 64) {
            __syncthreads();
            fill_tile<true, true>(kt, ks, kh, j0, p.k_len);
            fill_tile<true, false>(vt, nullptr, vh, j0, p.k_len);
            __syncthreads();
            float s[4][4] = {}, dp[4][4] = {};
            product_cols<D>(s, qt, kt, tx, ty);
            product_cols<D>(dp, gt, vt, tx, ty);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float pj = j0 + 4 * tx + c < lim[a] ? exp2f(s[a][c] * scale2 - lse2[a]) : 0.0f;
                    s[a][c] = pj * (dp[a][c] - delta[a]);
                }
            }
            store_transposed(dst, s, tx, ty);
            __syncthreads();
            product_rows(dq, dst, ks, tx, ty);
        }
        store_result((float*)p.dq + bh * tq * D, dq, p.scale, i0, tq, tx, ty);
    }
}
#endif

#if defined(DKV_TILED)
// dK and dV for 64 key rows of one key/value head per block: the query rows of every head of
// its group stream through in tiles of 64, in order; per tile S^T = K Q^T and
// dP^T = V dout^T, then dV += P^T dout and dK += dS^T Q (scaled once at the end), with delta
// from `dq_tiled`.
KERNEL void __launch_bounds__(256) dkv_tiled(const Params p) {
    start_after_previous();
    extern __shared__ f4 tiles[];
    float* kt = (float*)tiles;
    float* vt = kt + D * LDT;
    float* qt = vt + D * LDT;
    float* gt = qt + D * LDT;
    float* qs = gt + D * LDT;
    float* gs = qs + 64 * LDR;
    float* ps = gs + 64 * LDR;
    float* lse_col = ps + 64 * LDT;
    float* delta_col = lse_col + 64;
    const u32 tq = p.q_len, tk = p.k_len;
    const u32 blocks = (tk + 63) / 64;
    const u32 group = p.heads / p.kv_heads;
    const u64 total = (u64)p.batch * p.kv_heads * blocks;
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale2 = p.scale * TLOG2E;
    for (u64 t = block_index(); t < total; t += block_count()) {
        const u64 bg = t / blocks;
        const u32 j0 = (u32)(t % blocks) * 64;
        const u64 b = bg / p.kv_heads, g = bg % p.kv_heads;
        // Query i sees key j when j + Tq <= i + Tk: the first query the block's keys meet,
        // and the query tiles from there on, head after head of the group.
        const u32 first = (p.causal && j0 + tq > tk) ? j0 + tq - tk : 0;
        const u32 per_head = first < tq ? (tq - first + 63) / 64 : 0;
        const u32 steps = per_head * group;
        u32 keys[4];
        float dk[4][OC], dv[4][OC];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            keys[a] = j0 + 4 * ty + a;
#pragma unroll
            for (int c = 0; c < OC; ++c) dk[a][c] = dv[a][c] = 0.0f;
        }
        __syncthreads();
        fill_tile<true, false>(kt, nullptr, (const float*)k_head(p, b, g), j0, tk);
        fill_tile<true, false>(vt, nullptr, (const float*)v_head(p, b, g), j0, tk);
        for (u32 n = 0; n < steps; ++n) {
            const u64 qrow0 = (b * p.heads + g * group + n / per_head) * tq;
            const u32 i0 = first + (n % per_head) * 64;
            __syncthreads();
            fill_tile<true, true>(qt, qs, (const float*)p.q + qrow0 * D, i0, tq);
            fill_tile<true, true>(gt, gs, (const float*)p.dout + qrow0 * D, i0, tq);
            if (threadIdx.x < 64) {
                const u32 i = i0 + threadIdx.x;
                lse_col[threadIdx.x] = i < tq ? ((const float*)p.lse)[qrow0 + i] * TLOG2E : 0.0f;
                delta_col[threadIdx.x] = i < tq ? ((const float*)p.delta)[qrow0 + i] : 0.0f;
            }
            __syncthreads();
            float s[4][4] = {}, dp[4][4] = {};
            product_cols<D>(s, kt, qt, tx, ty);
            product_cols<D>(dp, vt, gt, tx, ty);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const u32 cc = 4 * tx + c, i = i0 + cc;
                    const bool seen = keys[a] < tk && i < tq && (!p.causal || keys[a] + tq <= i + tk);
                    const float pj = seen ? exp2f(s[a][c] * scale2 - lse_col[cc]) : 0.0f;
                    s[a][c] = pj;
                    dp[a][c] = pj * (dp[a][c] - delta_col[cc]);
                }
            }
            store_transposed(ps, s, tx, ty);
            __syncthreads();
            product_rows(dv, ps, gs, tx, ty);
            __syncthreads();
            store_transposed(ps, dp, tx, ty);
            __syncthreads();
            product_rows(dk, ps, qs, tx, ty);
        }
        store_result((float*)p.dk + bg * tk * D, dk, p.scale, j0, tk, tx, ty);
        store_result((float*)p.dv + bg * tk * D, dv, 1.0f, j0, tk, tx, ty);
    }
}
#endif
#endif
#if defined(DQ)
// A thread per query row: delta_i (written for the key kernels), then
// dq_i = sum_j scale * P_ij (dP_ij - delta_i) k_j with P_ij = exp(s_ij - lse_i) and
// dP_ij = dout_i . v_j, over the keys in order.
KERNEL void dq(const Params p) {
    start_after_previous();
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
    start_after_previous();
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
