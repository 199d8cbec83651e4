// Fused cross-entropy over rows of any vocabulary. Parameters: `LossParams` (ops/loss.rs).
// The planner defines T (the logits' stored type) and I (the targets' type, i32 or u32).

#define MAX_WARPS 32

// A block per row (looping past the grid): the row maximum, then the log-sum-exp with the
// maximum subtracted; loss = lse - logits[target], 0 for targets outside 0..vocab.
KERNEL void cross_entropy(const Params p) {
    start_after_previous();
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

// Rows along y, chunks of 8 x 256 elements of a row along x (both loop past the grid); a
// thread's eight elements are 256 apart, all loaded before any is stored:
// (exp(logit - lse) - onehot(target)) * dloss, 0 in ignored rows.
KERNEL void cross_entropy_backward(const Params p) {
    start_after_previous();
    const u64 v = p.vocab;
    const u64 chunk = 8 * (u64)blockDim.x;
    const u64 chunks = (v + chunk - 1) / chunk;
    for (u64 row = blockIdx.y; row < p.rows; row += gridDim.y) {
        const i64 t = (i64)((const I*)p.targets)[row];
        const bool live = t >= 0 && (u64)t < v;
        const float lse = ((const float*)p.lse)[row];
        const float dloss = ((const float*)p.dloss)[row];
        const T* xr = (const T*)p.logits + row * v;
        T* gr = (T*)p.dlogits + row * v;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
            const u64 e0 = c * chunk + threadIdx.x;
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const u64 e = e0 + (u64)u * blockDim.x;
                x[u] = (live && e < v) ? ld(xr, e) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const u64 e = e0 + (u64)u * blockDim.x;
                if (e >= v) continue;
                float g = 0.0f;
                if (live) {
                    const float onehot = (i64)e == t ? 1.0f : 0.0f;
                    g = (expf(x[u] - lse) - onehot) * dloss;
                }
                st(gr, e, g);
            }
        }
    }
}
