// Optimizer updates, a thread per element in place (each thread reads its element of every
// input before writing, so outputs may be the input buffers; Adam over up to 16 parameters
// of a group per launch), and the squared norm of many
// tensors by per-chunk partial sums added up by one block: a fixed order, no atomics.
// Parameters: `AdamParams`, `SgdParams`, `SquaresParams`, `SumParams` (ops/optim.rs). The
// planner defines:
//   T           the stored type of the parameters, gradients and state
//   DECOUPLED   1 for AdamW's decay of the parameter, 0 for Adam's decay through the gradient
//   MOMENTUM    1 when SGD keeps a momentum buffer
//   NESTEROV    1 for Nesterov's look-ahead

#if defined(ADAM)
// A group's parameters in one launch: block c updates chunk c of them, counted over all of
// them in order (parameter t's chunks from `chunk0[t]`).
KERNEL void adam(const Params p) {
    start_after_previous();
    const float* values = (const float*)p.step_values;
    const float scale = values[0], step_size = values[1], decay = values[2], bc2_sqrt = values[3];
    for (u64 c = block_index(); c < p.chunks; c += block_count()) {
        u32 t = 0;
        while (t + 1 < p.count && p.chunk0[t + 1] <= c) ++t;
        const T* param = (const T*)p.param[t];
        const T* grad = (const T*)p.grad[t];
        const T* m_in = (const T*)p.m[t];
        const T* v_in = (const T*)p.v[t];
        T* param_out = (T*)p.param_out[t];
        T* m_out = (T*)p.m_out[t];
        T* v_out = (T*)p.v_out[t];
        const u64 begin = (c - p.chunk0[t]) * p.chunk;
        const u64 end = begin + p.chunk < p.elements[t] ? begin + p.chunk : p.elements[t];
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
            float w = ld(param, i);
            float g = ld(grad, i) * scale;
#if DECOUPLED
            w *= decay;
#else
            g += p.weight_decay * w;
#endif
            const float m = p.beta1 * ld(m_in, i) + p.c1 * g;
            const float v = p.beta2 * ld(v_in, i) + p.c2 * g * g;
            w -= step_size * (m / (sqrtf(v) / bc2_sqrt + p.eps));
            st(param_out, i, w);
            st(m_out, i, m);
            st(v_out, i, v);
        }
    }
}
#endif

#if defined(SGD)
KERNEL void sgd(const Params p) {
    start_after_previous();
    const T* param = (const T*)p.param;
    const T* grad = (const T*)p.grad;
    T* param_out = (T*)p.param_out;
    const float scale = *(const float*)p.grad_scale;
    const u64 step = block_count() * blockDim.x;
    for (u64 i = block_index() * blockDim.x + threadIdx.x; i < p.elements; i += step) {
        const float w = ld(param, i);
        float d = ld(grad, i) * scale + p.weight_decay * w;
#if MOMENTUM
        const float b = p.momentum * ld((const T*)p.buf, i) + p.grad_coef * d;
        st((T*)p.buf_out, i, b);
#if NESTEROV
        d = d + p.momentum * b;
#else
        d = b;
#endif
#endif
        st(param_out, i, w - p.lr * d);
    }
}
#endif

#if defined(SQUARES)
// Block c sums the squares of chunk c of the launch's tensors, counted over all of them in
// order (tensor t's chunks from `chunk0[t]`), into partial `first + c`.
KERNEL void squares(const Params p) {
    start_after_previous();
    __shared__ float scratch[1024 / 32];
    for (u64 c = block_index(); c < p.chunks; c += block_count()) {
        u32 t = 0;
        while (t + 1 < p.count && p.chunk0[t + 1] <= c) ++t;
        const T* x = (const T*)p.ptrs[t];
        const u64 local = c - p.chunk0[t];
        const u64 begin = local * p.chunk;
        const u64 end = begin + p.chunk < p.elements[t] ? begin + p.chunk : p.elements[t];
        float s = 0.0f;
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const float v = ld(x, i);
            s += v * v;
        }
        const float total = block_sum(s, scratch);
        if (threadIdx.x == 0) ((float*)p.partials)[p.first + c] = total;
    }
}
#endif

#if defined(SUM_PARTIALS)
KERNEL void sum_partials(const Params p) {
    start_after_previous();
    __shared__ float scratch[1024 / 32];
    const float* partials = (const float*)p.partials;
    float s = 0.0f;
    for (u64 i = threadIdx.x; i < p.count; i += blockDim.x) s += partials[i];
    const float total = block_sum(s, scratch);
    if (threadIdx.x == 0) *(float*)p.out = total;
}
#endif
