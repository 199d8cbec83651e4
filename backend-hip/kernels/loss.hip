// Fused cross-entropy over rows of any vocabulary. Parameters: `LossParams` (ops/loss.rs).
// The planner defines T (the logits' stored type), I (the targets' type, i32 or u32) and, for
// the backward, IDX (the element index type).

#define MAX_WARPS 32

// A block per row (looping past the grid): the row maximum, then the log-sum-exp with the
// maximum subtracted; loss = lse - logits[target], 0 for targets outside 0..vocab.
KERNEL void cross_entropy(const Params p) {
    __shared__ float scratch[MAX_WARPS];
    const T* logits = (const T*)p.logits;
    const I* targets = (const I*)p.targets;
    const u64 v = p.vocab;
    for (u64 row = block_index(); row < p.rows; row += block_count()) {
        const T* xr = logits + row * v;
        float m = -inf_f();
        for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = max_nan(m, ld(xr, j));
        m = block_max(m, scratch);
        float s = 0.0f;
        for (u64 j = threadIdx.x; j < v; j += blockDim.x) s += expf(ld(xr, j) - m);
        const float lse = m + logf(block_sum(s, scratch));
        if (threadIdx.x == 0) {
            const i64 t = (i64)targets[row];
            const float loss = (t >= 0 && (u64)t < v) ? lse - ld(xr, (u64)t) : 0.0f;
            ((float*)p.loss)[row] = loss;
            ((float*)p.lse)[row] = lse;
        }
    }
}

// A thread per element: (exp(logit - lse) - onehot(target)) * dloss, 0 in ignored rows.
KERNEL void cross_entropy_backward(const Params p) {
    const T* logits = (const T*)p.logits;
    const I* targets = (const I*)p.targets;
    const float* lse = (const float*)p.lse;
    const float* dloss = (const float*)p.dloss;
    T* dlogits = (T*)p.dlogits;
    const IDX v = (IDX)p.vocab;
    const IDX n = (IDX)p.elements;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX e = (IDX)(block_index() * blockDim.x + threadIdx.x); e < n; e += step) {
        const IDX row = e / v;
        const IDX j = e - row * v;
        const i64 t = (i64)targets[row];
        float g = 0.0f;
        if (t >= 0 && t < (i64)v) {
            const float onehot = (i64)j == t ? 1.0f : 0.0f;
            g = (expf(ld(logits, e) - lse[row]) - onehot) * dloss[row];
        }
        st(dlogits, e, g);
    }
}
