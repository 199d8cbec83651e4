// 2-D convolution (cross-correlation, zero padding) and its backward passes, direct: each
// output element is summed by one thread (or, for the weight gradient, one block) in a fixed
// order, in f32. Parameters: `ConvParams` (ops/conv.rs): x [N, C, H, W], w [O, C, KH, KW],
// y [N, O, OH, OW]; the backward passes read dy through `y` and write dx through `x` or dw
// through `w`. The planner defines:
//   T      the stored type of every tensor
//   IDX    the index type
//   BIAS   1 when Conv2d adds a bias

// The input coordinate kernel tap `k` meets at output coordinate `o` along an axis, or -1 in
// the padding.
DEV i64 source(i64 o, i64 k, i64 stride, i64 pad, i64 dil, i64 size) {
    const i64 i = o * stride + k * dil - pad;
    return (i >= 0 && i < size) ? i : -1;
}

#if defined(FORWARD)
// y[n, o, oy, ox] = sum over (c, ki, kj) of w[o, c, ki, kj] x[n, c, iy, ix], plus bias[o].
KERNEL void conv2d(const Params p) {
    start_after_previous();
    const T* x = (const T*)p.x;
    const T* w = (const T*)p.w;
    T* y = (T*)p.y;
    const IDX n = (IDX)p.elements;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX e = (IDX)(block_index() * blockDim.x + threadIdx.x); e < n; e += step) {
        const IDX ox = e % p.ow;
        const IDX oy = (e / p.ow) % p.oh;
        const IDX oc = (e / ((IDX)p.ow * p.oh)) % p.o;
        const IDX ni = e / ((IDX)p.ow * p.oh * p.o);
        float s = 0.0f;
        for (u32 c = 0; c < p.c; ++c) {
            const IDX xc = (ni * p.c + c) * p.height;
            const IDX wc = ((oc * p.c + c) * p.kh) * p.kw;
            for (u32 ki = 0; ki < p.kh; ++ki) {
                const i64 iy = source(oy, ki, p.stride[0], p.pad[0], p.dil[0], p.height);
                if (iy < 0) continue;
                for (u32 kj = 0; kj < p.kw; ++kj) {
                    const i64 ix = source(ox, kj, p.stride[1], p.pad[1], p.dil[1], p.width);
                    if (ix < 0) continue;
                    s += ld(w, wc + (IDX)ki * p.kw + kj) * ld(x, (xc + (IDX)iy) * p.width + (IDX)ix);
                }
            }
        }
#if BIAS
        s += ld((const T*)p.bias, oc);
#endif
        st(y, e, s);
    }
}
#endif

#if defined(BACKWARD_DATA)
// dx[n, c, iy, ix] = sum over the taps (ki, kj) that read it, in order, of
// sum over o of w[o, c, ki, kj] dy[n, o, oy, ox].
KERNEL void conv2d_dx(const Params p) {
    start_after_previous();
    const T* dy = (const T*)p.y;
    const T* w = (const T*)p.w;
    T* dx = (T*)p.x;
    const IDX n = (IDX)p.elements;
    const IDX step = (IDX)(block_count() * blockDim.x);
    const IDX pixels = (IDX)p.oh * p.ow;
    const IDX taps = (IDX)p.kh * p.kw;
    for (IDX e = (IDX)(block_index() * blockDim.x + threadIdx.x); e < n; e += step) {
        const i64 ix = (i64)(e % p.width);
        const i64 iy = (i64)((e / p.width) % p.height);
        const IDX c = (e / ((IDX)p.width * p.height)) % p.c;
        const IDX ni = e / ((IDX)p.width * p.height * p.c);
        float s = 0.0f;
        for (u32 ki = 0; ki < p.kh; ++ki) {
            const i64 ty = iy + (i64)p.pad[0] - (i64)ki * p.dil[0];
            if (ty < 0 || ty % p.stride[0] != 0) continue;
            const i64 oy = ty / p.stride[0];
            if (oy >= p.oh) continue;
            for (u32 kj = 0; kj < p.kw; ++kj) {
                const i64 tx = ix + (i64)p.pad[1] - (i64)kj * p.dil[1];
                if (tx < 0 || tx % p.stride[1] != 0) continue;
                const i64 ox = tx / p.stride[1];
                if (ox >= p.ow) continue;
                const IDX tap = (IDX)ki * p.kw + kj;
                const IDX at = (IDX)oy * p.ow + (IDX)ox;
                float t = 0.0f;
                for (u32 o = 0; o < p.o; ++o) {
                    t += ld(w, ((IDX)o * p.c + c) * taps + tap) * ld(dy, ((ni * p.o + o) * pixels) + at);
                }
                s += t;
            }
        }
        st(dx, e, s);
    }
}
#endif

#if defined(BACKWARD_WEIGHT)
// A block per dw[o, c, ki, kj]: its threads sum strided parts of the N * OH * OW products
// dy[n, o, oy, ox] x[n, c, iy, ix], then a tree sum joins them.
KERNEL void conv2d_dw(const Params p) {
    start_after_previous();
    __shared__ float scratch[1024 / 32];
    const T* x = (const T*)p.x;
    const T* dy = (const T*)p.y;
    T* dw = (T*)p.w;
    const IDX pixels = (IDX)p.oh * p.ow;
    const IDX terms = (IDX)p.n * pixels;
    for (u64 r = block_index(); r < p.elements; r += block_count()) {
        const IDX e = (IDX)r;
        const u32 kj = (u32)(e % p.kw);
        const u32 ki = (u32)((e / p.kw) % p.kh);
        const IDX c = (e / ((IDX)p.kw * p.kh)) % p.c;
        const IDX oc = e / ((IDX)p.kw * p.kh * p.c);
        float s = 0.0f;
        for (IDX t = threadIdx.x; t < terms; t += blockDim.x) {
            const IDX ni = t / pixels;
            const IDX pix = t % pixels;
            const i64 iy = source((i64)(pix / p.ow), ki, p.stride[0], p.pad[0], p.dil[0], p.height);
            const i64 ix = source((i64)(pix % p.ow), kj, p.stride[1], p.pad[1], p.dil[1], p.width);
            if (iy < 0 || ix < 0) continue;
            s += ld(dy, (ni * p.o + oc) * pixels + pix) *
                 ld(x, ((ni * p.c + c) * p.height + (IDX)iy) * p.width + (IDX)ix);
        }
        const float total = block_sum(s, scratch);
        if (threadIdx.x == 0) st(dw, e, total);
    }
}
#endif
