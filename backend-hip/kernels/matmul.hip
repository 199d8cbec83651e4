// The matmul epilogue, after the GEMM has written f32 (or the output's own) accumulators in
// rows `acc_ld` apart: out = act(acc + bias[col]) + residual, rounded once to the output type.
// Parameters: `EpilogueParams` (ops/matmul.rs). Defines: IDX, T (the output and operands'
// type), ACC (the accumulator's type), HAS_BIAS, HAS_RESIDUAL, ACT(v).
// Also `repack`, which moves matrices into and out of padded scratch. Defines: R (an
// unsigned integer of the element's size: the kernel moves bits).

#if defined(R)
// dst line l, element e gets src's where l < src_lines and e < src_inner, else 0 (zero
// padding; a smaller dst takes a window). Blocks take lines along y and chunks of
// REPACK_UNROLL x 256 elements along x; a thread's elements are 256 apart, so a warp's loads
// and stores are contiguous, and all its loads are issued before its stores.
#define REPACK_UNROLL 8
KERNEL void repack(const Params p) {
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
#else

KERNEL void epilogue(const Params p) {
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
