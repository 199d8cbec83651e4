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
// A block per output column n (looping past the grid): its threads stride over b's row n
// (the column of b^T) in chunks of VEC elements, each chunk met by every row of a; sums go
// warp by warp, then warps in order, so the result does not depend on timing. Reads b once
// at full width, which is what bounds a few-row product.
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

KERNEL void few_rows(const Params p) {
    // The block's first column of b, pulled into L2 while the kernel ahead finishes.
    start_after_previous_prefetching((const T*)p.b + block_index() * p.ldb,
                                     block_index() < p.cols ? p.k * sizeof(T) : 0);
    __shared__ float partial[ROWS][1024 / WARP_SIZE];
    const u32 warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u32 warps = blockDim.x / WARP_SIZE;
    const u64 chunks = p.k / VEC;
    const T* a = (const T*)p.a;
    for (u64 n = block_index(); n < p.cols; n += block_count()) {
        const T* b = (const T*)p.b + n * p.ldb;
        // The epilogue's operands are loaded first, their latency hidden behind the sums.
        const u32 r_out = threadIdx.x < ROWS ? threadIdx.x : 0;
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
        for (u64 c = threadIdx.x; c < chunks; c += blockDim.x) {
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
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) partial[r][warp] = s;
        }
        __syncthreads();
        if (threadIdx.x < ROWS) {
            float v = 0.0f;
            for (u32 w = 0; w < warps; ++w) v += partial[r_out][w];
#if HAS_BIAS
            v += add;
#endif
            v = ACT(v);
#if HAS_RESIDUAL
            v += res;
#endif
            st((T*)p.out, r_out * p.cols + n, v);
        }
        __syncthreads();
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
