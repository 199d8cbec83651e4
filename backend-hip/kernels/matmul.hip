// The matmul epilogue, after the GEMM has written f32 (or the output's own) accumulators:
// out = act(acc + bias[col]) + residual, rounded once to the output type.
// Parameters: `EpilogueParams` (ops/matmul.rs). Defines: IDX, T (the output and operands'
// type), ACC (the accumulator's type), HAS_BIAS, HAS_RESIDUAL, ACT(v).

KERNEL void epilogue(const Params p) {
    const IDX n = (IDX)p.elements;
    const IDX cols = (IDX)p.cols;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX i = (IDX)(block_index() * blockDim.x + threadIdx.x); i < n; i += step) {
        float v = ld((const ACC*)p.acc, i);
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
