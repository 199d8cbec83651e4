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
        // Each pass loads four elements per thread before using them (enough loads in
        // flight); past the row they read as -inf, which adds nothing.
        float m = -inf_f();
        for (u64 j0 = threadIdx.x; j0 < v; j0 += 4 * blockDim.x) {
            float x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const u64 j = j0 + u * blockDim.x;
                x[u] = j < v ? ld(xr, j) : -inf_f();
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) m = max_nan(m, x[u]);
        }
        m = block_max(m, scratch);
        float s = 0.0f;
        for (u64 j0 = threadIdx.x; j0 < v; j0 += 4 * blockDim.x) {
            float x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const u64 j = j0 + u * blockDim.x;
                x[u] = j < v ? ld(xr, j) : -inf_f();
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) s += expf(x[u] - m);
        }
        const float lse = m + logf(block_sum(s, scratch));
        if (threadIdx.x == 0) {
            const i64 t = (i64)targets[row];
            const float loss = (t >= 0 && (u64)t < v) ? lse - ld(xr, (u64)t) : 0.0f;
            ((float*)p.loss)[row] = loss;
            ((float*)p.lse)[row] = lse;
        }
    }
}

// Four elements per thread, a grid apart, all loaded before any is stored (the operands
// are distinct): (exp(logit - lse) - onehot(target)) * dloss, 0 in ignored rows.
KERNEL void cross_entropy_backward(const Params p) {
    const T* __restrict__ logits = (const T*)p.logits;
    const I* __restrict__ targets = (const I*)p.targets;
    const float* __restrict__ lse = (const float*)p.lse;
    const float* __restrict__ dloss = (const float*)p.dloss;
    T* __restrict__ dlogits = (T*)p.dlogits;
    const IDX v = (IDX)p.vocab;
    // Positions in u64: `first + u * step` may pass the range of a u32 IDX.
    const u64 n = p.elements;
    const u64 step = block_count() * blockDim.x;
    for (u64 first = block_index() * blockDim.x + threadIdx.x; first < n; first += 4 * step) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (first + u * step >= n) continue;
            const IDX e = (IDX)(first + u * step);
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
}
