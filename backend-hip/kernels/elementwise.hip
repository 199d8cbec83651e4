// Elementwise ops over strided operands, a few output elements per thread, grid-stride loop.
// Parameters: `MapParams` (ops/elementwise.rs). The shape arrives with its dimensions merged
// wherever every operand allows, so most launches have rank 1. The planner defines:
//   IDX       the index type (u32, or u64 for tensors past 2^32 elements)
//   T0..T4    the operands' stored types (inputs, then outputs)
//   OFFSETS   code that sets o0, o1, ... to each operand's element offset from `i`
//   BODY      the op on one element
//   INPUTS    how many operands are inputs
//   VEC       elements per group of the vector walk (then the shape and strides count groups)

#define S0 p.scalars[0]
#define S1 p.scalars[1]

// A thread takes MAP_UNROLL elements a grid apart (coalesced across the warp) per step. The
// operands are `__restrict__`: a thread's elements are distinct and each element's loads
// come before its store, so the compiler may issue every element's loads before the first
// store, which keeps enough loads in flight to approach the memory's bandwidth (one 2-byte
// element per thread reaches about a quarter of it). An output that is also an input (in
// place) is only ever read and written at the same element.
#define MAP_UNROLL 4

#if defined(VEC)
// Operands whose innermost dimension is contiguous, in whole groups of VEC elements, each
// operand's groups aligned to their size (at most 16 bytes): a thread finds group `i`'s
// offset in every operand (OFFSETS, in groups), loads a group of every input with one load,
// runs BODY on each element in registers (P0... point at the groups, o0... index them), and
// stores the groups of the outputs (INPUTS inputs come first).
#define GROUP(k) \
    struct alignas(sizeof(T##k) * VEC) G##k { T##k v[VEC]; }; \
    G##k r##k; \
    if (INPUTS > k) r##k = ((const G##k*)p.ptrs[k])[o##k]; \
    T##k* const P##k = r##k.v;
#define STORE(k) \
    if (INPUTS <= k) ((G##k*)p.ptrs[k])[o##k] = r##k;

KERNEL void map(const Params p) {
    start_after_previous();
    const u64 groups = p.elements / VEC;
    const u64 step = block_count() * blockDim.x;
    for (u64 g = block_index() * blockDim.x + threadIdx.x; g < groups; g += step) {
        const IDX i = (IDX)g;
        OFFSETS
        GROUP(0)
#if defined(T1)
        GROUP(1)
#endif
#if defined(T2)
        GROUP(2)
#endif
#if defined(T3)
        GROUP(3)
#endif
#if defined(T4)
        GROUP(4)
#endif
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const IDX o0 = (IDX)j, o1 = (IDX)j, o2 = (IDX)j, o3 = (IDX)j, o4 = (IDX)j;
            (void)o0; (void)o1; (void)o2; (void)o3; (void)o4;
            BODY
        }
        STORE(0)
#if defined(T1)
        STORE(1)
#endif
#if defined(T2)
        STORE(2)
#endif
#if defined(T3)
        STORE(3)
#endif
#if defined(T4)
        STORE(4)
#endif
    }
}
#else
KERNEL void map(const Params p) {
    start_after_previous();
    T0* __restrict__ const P0 = (T0*)p.ptrs[0];
#if defined(T1)
    T1* __restrict__ const P1 = (T1*)p.ptrs[1];
#endif
#if defined(T2)
    T2* __restrict__ const P2 = (T2*)p.ptrs[2];
#endif
#if defined(T3)
    T3* __restrict__ const P3 = (T3*)p.ptrs[3];
#endif
#if defined(T4)
    T4* __restrict__ const P4 = (T4*)p.ptrs[4];
#endif
    // Positions in u64: `first + u * step` may pass the range of a u32 IDX.
    const u64 n = p.elements;
    const u64 step = block_count() * blockDim.x;
    for (u64 first = block_index() * blockDim.x + threadIdx.x; first < n; first += MAP_UNROLL * step) {
#pragma unroll
        for (int u = 0; u < MAP_UNROLL; ++u) {
            if (first + u * step < n) {
                const IDX i = (IDX)(first + u * step);
                OFFSETS
                BODY
            }
        }
    }
}
#endif
