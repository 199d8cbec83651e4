// Creation and random ops over a row-major output, one thread per element, grid-stride loop.
// Parameters: `RandomParams` (ops/random.rs), one struct for every entry point. The planner
// defines:
//   T       the output's stored type
//   FILL_T  fill's: an unsigned integer of the element's size, whose bits the planner
//           computed on the host as the CPU converts
// (Every entry point is compiled with the others, so each must compile for every T.)
//
// The float formulas must round as the CPU's do, so their products and sums are never fused
// into FMAs: NVRTC fuses by default (`__f*_rn` intrinsics are never fused) and hiprtc fuses
// unless a pragma says otherwise.

#if defined(TESSERA_NVIDIA)
#define FADD(a, b) __fadd_rn(a, b)
#define FSUB(a, b) __fsub_rn(a, b)
#define FMUL(a, b) __fmul_rn(a, b)
#define DADD(a, b) __dadd_rn(a, b)
#define DMUL(a, b) __dmul_rn(a, b)
#define NO_CONTRACT
#else
#define FADD(a, b) ((a) + (b))
#define FSUB(a, b) ((a) - (b))
#define FMUL(a, b) ((a) * (b))
#define DADD(a, b) ((a) + (b))
#define DMUL(a, b) ((a) * (b))
#define NO_CONTRACT _Pragma("clang fp contract(off)")
#endif

#ifndef FILL_T
#define FILL_T u32
#endif
#define OUT ((T*)p.out)

DEV u64 first_index() { return block_index() * blockDim.x + threadIdx.x; }
DEV u64 grid_step() { return block_count() * blockDim.x; }

KERNEL void fill(const Params p) {
    start_after_previous();
    const FILL_T v = (FILL_T)p.value;
    for (u64 i = first_index(); i < p.elements; i += grid_step()) ((FILL_T*)p.out)[i] = v;
}

// f64 to f32 rounding to odd (core's `f32_round_to_odd`): rounding that once more to f16 or
// bf16 gives the correctly rounded f64 value, as the CPU's conversion does.
DEV float round_to_odd(double x) {
    const float f = (float)x;
    if (x != x || (double)f == x) return f;
    u32 b = f32_bits(f);
    if (fabs((double)f) > fabs(x)) b -= 1u;
    return bits_f32(b | 1u);
}

// f64 to each stored type as Rust's `as` (and `Element::from_f64`) converts.
template <typename U> __device__ __forceinline__ U from_f64(double v);
template <> DEV_SPEC float from_f64<float>(double v) { return (float)v; }
template <> DEV_SPEC f16 from_f64<f16>(double v) { return from_f32<f16>(round_to_odd(v)); }
template <> DEV_SPEC bf16 from_f64<bf16>(double v) { return from_f32<bf16>(round_to_odd(v)); }
template <> DEV_SPEC i32 from_f64<i32>(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return -2147483647 - 1;
    return (i32)v;
}
template <> DEV_SPEC u32 from_f64<u32>(double v) {
    if (v != v || v <= 0.0) return 0u;
    if (v >= 4294967295.0) return 4294967295u;
    return (u32)v;
}
template <> DEV_SPEC u8 from_f64<u8>(double v) { return v != 0.0 ? 1 : 0; }

// `start + i * step` in f64, each operation rounded once, as the CPU computes it.
DEV double arange_value(double start, double step, u64 i) {
    NO_CONTRACT
    return DADD(start, DMUL((double)i, step));
}

KERNEL void arange(const Params p) {
    start_after_previous();
    const double start = __longlong_as_double((long long)p.start);
    const double step = __longlong_as_double((long long)p.step);
    for (u64 i = first_index(); i < p.elements; i += grid_step()) {
        OUT[i] = from_f64<T>(arange_value(start, step, i));
    }
}

// The random values are f32, so `from_f64` stores them as `from_f32` would.

// Philox4x32-10, as core's `rng::philox4x32`.
DEV void philox(u32 c[4], u32 k0, u32 k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const u32 c0 = c[0], c2 = c[2];
        const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c[0] = hi1 ^ c[1] ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c[3] ^ k1;
        c[3] = lo0;
    }
}

// The words of element `i`: counter `(i lo, i hi, counter lo, counter hi)`.
DEV void element_words(const Params& p, u64 i, u32 w[4]) {
    w[0] = (u32)i;
    w[1] = (u32)(i >> 32);
    w[2] = p.counter[0];
    w[3] = p.counter[1];
    philox(w, p.key[0], p.key[1]);
}

#define INV_2_24 5.9604644775390625e-8f

DEV float uniform_value(u32 w0, float lo, float hi) {
    NO_CONTRACT
    const float u = (float)(w0 >> 8) * INV_2_24;
    return FADD(lo, FMUL(FSUB(hi, lo), u));
}

// Box-Muller as the CPU computes it: `-ln u1` as `-log1p(-(1 - u1))` (relative error bound
// near u1 = 1) and the cosine's argument in [-pi, pi).
DEV float normal_value(u32 w0, u32 w1, float mean, float sd) {
    NO_CONTRACT
    const float u1 = (float)((w0 >> 8) + 1u) * INV_2_24;
    const float u2 = (float)(w1 >> 8) * INV_2_24;
    const float l = -log1pf(-(1.0f - u1));
    const float r = sqrtf(FMUL(2.0f, l));
    const float c = -cosf(FMUL(6.2831854820251465f, FSUB(u2, 0.5f)));
    return FADD(mean, FMUL(FMUL(sd, r), c));
}

KERNEL void uniform(const Params p) {
    start_after_previous();
    for (u64 i = first_index(); i < p.elements; i += grid_step()) {
        u32 w[4];
        element_words(p, i, w);
        OUT[i] = from_f64<T>(uniform_value(w[0], p.a, p.b));
    }
}

KERNEL void normal(const Params p) {
    start_after_previous();
    for (u64 i = first_index(); i < p.elements; i += grid_step()) {
        u32 w[4];
        element_words(p, i, w);
        OUT[i] = from_f64<T>(normal_value(w[0], w[1], p.a, p.b));
    }
}
