// What every kernel gets, for both vendors' compilers (NVRTC with TESSERA_NVIDIA, hiprtc with
// TESSERA_AMD), without any vendor header: fixed-width integers, the 16-bit float types and
// their conversions, warp shuffles and the warp size, and the float helpers whose exact
// behaviour the op catalog defines (NaN handling, saturating casts, powf).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#if defined(TESSERA_AMD)
#define WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#endif
#ifndef WARP_SIZE
#error "WARP_SIZE must be defined (32 on NVIDIA and RDNA, 64 on CDNA)"
#endif

#define KERNEL extern "C" __global__
#define DEV static __device__ __forceinline__
// Explicit specializations take no storage class.
#define DEV_SPEC __device__ __forceinline__

// Sixteen bytes moved as one (wide copies).
struct alignas(16) u128 { u32 w[4]; };

// 16-bit floats as their bits; arithmetic happens in f32.
struct f16 { u16 bits; };
struct bf16 { u16 bits; };

DEV float bits_f32(u32 b) { return __uint_as_float(b); }
DEV u32 f32_bits(float f) { return __float_as_uint(f); }

DEV float to_f32(float v) { return v; }
DEV float to_f32(f16 v) {
#if defined(TESSERA_NVIDIA)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, v.bits);
#endif
}
DEV float to_f32(bf16 v) { return bits_f32(((u32)v.bits) << 16); }

// Rounding to nearest even, as the CPU reference (the `half` crate) rounds; NaN stays NaN.
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> DEV_SPEC float from_f32<float>(float v) { return v; }
template <> DEV_SPEC f16 from_f32<f16>(float v) {
    f16 h;
#if defined(TESSERA_NVIDIA)
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
#else
    h.bits = __builtin_bit_cast(u16, (_Float16)v);
#endif
    return h;
}
template <> DEV_SPEC bf16 from_f32<bf16>(float v) {
    u32 b = f32_bits(v);
    bf16 h;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        h.bits = (u16)((b >> 16) | 0x40u);
    } else {
        h.bits = (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
    return h;
}

// Loads and stores of float data of any stored type, through f32.
template <typename T> DEV float ld(const T* p, u64 i) { return to_f32(p[i]); }
template <typename T> DEV void st(T* p, u64 i, float v) { p[i] = from_f32<T>(v); }

// Warp shuffles.
DEV float shfl_xor(float v, int mask) {
#if defined(TESSERA_NVIDIA)
    return __shfl_xor_sync(0xffffffffu, v, mask);
#else
    return __shfl_xor(v, mask);
#endif
}
DEV float warp_sum(float v) {
    for (int m = WARP_SIZE / 2; m > 0; m /= 2) v += shfl_xor(v, m);
    return v;
}
DEV float warp_max(float v) {
    for (int m = WARP_SIZE / 2; m > 0; m /= 2) v = fmaxf(v, shfl_xor(v, m));
    return v;
}

DEV float nan_f() { return bits_f32(0x7fc00000u); }
DEV float inf_f() { return bits_f32(0x7f800000u); }
// NaN test on the bits, immune to compilers that assume finite math.
DEV bool is_nan(float x) { return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }

// Sum (or max) over a block of `blockDim.x` threads, a multiple of the warp size; every
// thread gets the result. `scratch` holds one float per warp.
DEV float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const u32 warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u32 warps = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (u32 w = 0; w < warps; ++w) total += scratch[w];
    return total;
}
// Max that propagates NaN, like `max_nan`.
DEV float max_nan(float a, float b) { if (is_nan(a) || is_nan(b)) return nan_f(); return fmaxf(a, b); }
DEV float min_nan(float a, float b) { if (is_nan(a) || is_nan(b)) return nan_f(); return fminf(a, b); }
DEV float block_max(float v, float* scratch) {
    for (int m = WARP_SIZE / 2; m > 0; m /= 2) v = max_nan(v, shfl_xor(v, m));
    const u32 warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const u32 warps = blockDim.x / WARP_SIZE;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = scratch[0];
    for (u32 w = 1; w < warps; ++w) m = max_nan(m, scratch[w]);
    return m;
}

// Float to integer as `Cast` defines it: truncate toward zero, saturate, NaN to 0.
DEV i32 f2i(float v) {
    if (is_nan(v)) return 0;
    if (v >= 2147483648.0f) return 2147483647;
    if (v <= -2147483648.0f) return -2147483647 - 1;
    return (i32)v;
}
DEV u32 f2u(float v) {
    if (is_nan(v) || v <= 0.0f) return 0u;
    if (v >= 4294967296.0f) return 4294967295u;
    return (u32)v;
}

// `0 * x` without the compiler folding it to 0: NaN for NaN and infinite `x`.
DEV float zero_times(float x) { return (is_nan(x) || fabsf(x) == inf_f()) ? nan_f() : 0.0f; }

DEV float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
DEV float silu(float x) { return x / (1.0f + expf(-x)); }
#define GELU_K 0.7978845608028654f
DEV float gelu(float x) { return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))); }
DEV float gelu_grad(float x) {
    const float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}
DEV float relu(float x) { return (x > 0.0f || is_nan(x)) ? x : 0.0f; }

// powf as Rust defines it, including negative bases with integral exponents.
DEV float powf_r(float x, float y) {
    if (y == 0.0f || x == 1.0f) return 1.0f;
    if (is_nan(x) || is_nan(y)) return nan_f();
    const float ax = fabsf(x);
    float r;
    if (ax == 0.0f) r = y < 0.0f ? inf_f() : 0.0f;
    else if (ax == inf_f()) r = y < 0.0f ? 0.0f : inf_f();
    else if (y == 1.0f) r = ax;
    else if (y == 2.0f) r = ax * ax;
    else r = powf(ax, y);
    if (x < 0.0f || (x == 0.0f && f32_bits(x) != 0u)) {
        if (floorf(y) != y) {
            if (x == 0.0f || ax == inf_f()) return r;
            return nan_f();
        }
        const bool odd = fabsf(y) < 16777216.0f && (((u32)fabsf(y)) & 1u) == 1u;
        if (odd) return -r;
    }
    return r;
}

// The flat index of a block in a 2-D grid, and the number of blocks: grids past the
// per-dimension limit spread over y.
DEV u64 block_index() { return (u64)blockIdx.x + (u64)blockIdx.y * gridDim.x; }
DEV u64 block_count() { return (u64)gridDim.x * gridDim.y; }

// Every kernel's first statement. A kernel may be launched before the one queued ahead of it
// has finished (NVIDIA's programmatic dependent launch, Hopper on): its blocks become resident
// and wait here until that kernel has finished and its writes are visible, so nothing the
// kernel reads or writes races with earlier work. Then it lets the kernel queued after it do
// the same. Where the launch did not ask for an early start, and on AMD, the wait returns at
// once. Because each kernel releases the next only after its own wait, at most one kernel
// waits ahead of a running one, and its blocks only take room the running kernel's finished
// blocks left.
DEV void start_after_previous() {
#if defined(TESSERA_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for `bytes` from `p` in L2 (NVIDIA), then start_after_previous(). A prefetch is a hint
// that moves nothing into the kernel, so it is safe before the wait even if the work before
// writes those bytes: a kernel prefetches what it will read first (a weight) while the one
// ahead of it still runs.
DEV void start_after_previous_prefetching(const void* p, u64 bytes) {
#if defined(TESSERA_NVIDIA)
    const u64 end = (u64)p + bytes;
    for (u64 line = ((u64)p & ~127ull) + threadIdx.x * 128ull; line < end; line += blockDim.x * 128ull) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
    }
#endif
    start_after_previous();
}
