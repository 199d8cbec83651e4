// The matmul epilogue, after the GEMM has written f32 (or the output's own) accumulators in
// rows `acc_ld` apart: out = act(acc + bias[col]) + residual, rounded once to the output type.
// Parameters: `EpilogueParams` (ops/matmul.rs). Defines: IDX, T (the output and operands'
// type), ACC (the accumulator's type), HAS_BIAS, HAS_RESIDUAL, ACT(v).
// Also `repack`, which moves matrices into and out of padded scratch. Defines: R (an
// unsigned integer of the element's size: the kernel moves bits).

#if defined(R)
// dst line l, element e gets src's where l < src_lines and e < src_inner, else 0 (zero
// padding; a smaller dst takes a window). Eight consecutive elements per thread, all loaded
// before any is stored, so that enough loads are in flight.
KERNEL void repack(const Params p) {
    const u64 groups = (p.dst_inner + 7) / 8;
    const u64 total = p.dst_lines * groups;
    const u64 step = block_count() * blockDim.x;
    for (u64 g = block_index() * blockDim.x + threadIdx.x; g < total; g += step) {
        const u64 l = g / groups, e0 = (g - l * groups) * 8;
        const R* src = (const R*)p.src + l * p.src_ld;
        R* dst = (R*)p.dst + l * p.dst_ld;
        R v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            v[j] = (l < p.src_lines && e0 + j < p.src_inner) ? src[e0 + j] : (R)0;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (e0 + j < p.dst_inner) dst[e0 + j] = v[j];
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
