// The matmul epilogue, after the GEMM has written f32 (or the output's own) accumulators in
// rows `acc_ld` apart: out = act(acc + bias[col]) + residual, rounded once to the output type.
// Parameters: `EpilogueParams` (ops/matmul.rs). Defines: IDX, T (the output and operands'
// type), ACC (the accumulator's type), HAS_BIAS, HAS_RESIDUAL, ACT(v).
// Also `repack`, which moves matrices into and out of padded scratch. Defines: R (an
// unsigned integer of the element's size: the kernel moves bits).
// And `few_rows`, the whole product of a few rows of `a` with a `b` contiguous along k (a
// linear layer's weight, as in decoding), epilogue included. Parameters: `FewRowsParams`.
// Defines: T, ROWS (the rows, 1 to 8), VEC (elements per load: 16 bytes' worth where every
// row is 16-byte aligned, else 1), HAS_BIAS, HAS_RESIDUAL, ACT(v).

#if defined(R)
// dst line l, element e gets src's where l < src_lines and e < src_inner, else 0 (zero
// padding; a smaller dst takes a window). Blocks take lines along y and chunks of
// REPACK_UNROLL x 256 elements along x; a thread's elements are 256 apart, so a warp's loads
// and stores are contiguous, and all its loads are issued before its stores.
#define REPACK_UNROLL 8
KERNEL void repack(const Params p) {
    start_after_previous();
    const u64 chunk = (u64)REPACK_UNROLL * blockDim.x;
    const u64 chunks = (p.dst_inner + chunk - 1) / chunk;
    for (u64 l = blockIdx.y; l < p.dst_lines; l += gridDim.y) {
        const R* src = (const R*)p.src + l * p.src_ld;
        R* dst = (R*)p.dst + l * p.dst_ld;
        const u64 src_inner = l < p.src_lines ? p.src_inner : 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
            const u64 e0 = c * chunk + threadIdx.x;
            R v[REPACK_UNROLL];
#pragma unroll
            for (int u = 0; u < REPACK_UNROLL; ++u) {
                const u64 e = e0 + (u64)u * blockDim.x;
                v[u] = e < src_inner ? src[e] : (R)0;
            }
#pragma unroll
            for (int u = 0; u < REPACK_UNROLL; ++u) {
                const u64 e = e0 + (u64)u * blockDim.x;
                if (e < p.dst_inner) dst[e] = v[u];
            }
        }
    }
}
#elif defined(ROWS)
// A warp per output column n, blocks of several warps (looping past the grid): its lanes
// stride over b's row n (the column of b^T) in chunks of VEC elements, each chunk met by
// every row of a, and the sums are warp shuffles in a fixed order, so the result does not
// depend on timing. Reads b once at full width, which is what bounds a few-row product; with
// no shared memory or barrier, each column costs one warp's loads and one reduction.
#if VEC > 1
union Chunk { u128 bits; T e[VEC]; };
DEV void load_chunk(const T* p, float* f) {
    Chunk c;
    c.bits = *(const u128*)p;
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = to_f32(c.e[i]);
}
#else
DEV void load_chunk(const T* p, float* f) { f[0] = to_f32(p[0]); }
#endif

// The bytes of b that the block's first columns span, for its L2 prefetch.
DEV u64 block_columns_bytes(const Params& p) {
    const u64 warps = blockDim.x / WARP_SIZE, first = block_index() * warps;
    if (first >= p.cols) return 0;
    const u64 own = p.cols - first < warps ? p.cols - first : warps;
    return ((own - 1) * p.ldb + p.k) * sizeof(T);
}

KERNEL void few_rows(const Params p) {
    // The block's first columns of b, pulled into L2 while the kernel ahead finishes.
    start_after_previous_prefetching(
        (const T*)p.b + block_index() * (blockDim.x / WARP_SIZE) * p.ldb, block_columns_bytes(p));
    const u32 warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u64 warps = blockDim.x / WARP_SIZE;
    const u64 first = block_index() * warps;
    const u64 chunks = p.k / VEC;
    const T* a = (const T*)p.a;
    // Lane r < ROWS finishes row r.
    const u32 r_out = lane < ROWS ? lane : 0;
    for (u64 n = first + warp; n < p.cols; n += block_count() * warps) {
        const T* b = (const T*)p.b + n * p.ldb;
        // The epilogue's operands are loaded first, their latency hidden behind the sums.
#if HAS_BIAS
        const float add = ld((const T*)p.bias, n);
#endif
#if HAS_RESIDUAL
        const float res = ld((const T*)p.residual, r_out * p.cols + n);
#endif
        float acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 4
        for (u64 c = lane; c < chunks; c += WARP_SIZE) {
            float w[VEC];
            load_chunk(b + c * VEC, w);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float x[VEC];
                load_chunk(a + r * p.lda + c * VEC, x);
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc[r] = fmaf(x[i], w[i], acc[r]);
            }
        }
        float v = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float s = warp_sum(acc[r]);
            if (lane == (u32)r) v = s;
        }
        if (lane < ROWS) {
#if HAS_BIAS
            v += add;
#endif
            v = ACT(v);
#if HAS_RESIDUAL
            v += res;
#endif
            st((T*)p.out, r_out * p.cols + n, v);
        }
    }
}
#else

KERNEL void epilogue(const Params p) {
    start_after_previous();
    const IDX n = (IDX)p.elements;
    const IDX cols = (IDX)p.cols;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX i = (IDX)(block_index() * blockDim.x + threadIdx.x); i < n; i += step) {
        const IDX row = i / cols;
        float v = ld((const ACC*)p.acc, (u64)row * p.acc_ld + (u64)(i - row * cols));
#if HAS_BIAS
        v += ld((const T*)p.bias, i % cols);
#endif
        v = ACT(v);
#if HAS_RESIDUAL
        v += ld((const T*)p.residual, i);
#endif
        st((T*)p.out, i, v);
    }
}
#endif
