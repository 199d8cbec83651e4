// Elementwise ops over strided operands, one thread per output element, grid-stride loop.
// Parameters: `MapParams` (ops/elementwise.rs). The shape arrives with its dimensions merged
// wherever every operand allows, so most launches have rank 1. The planner defines:
//   IDX       the index type (u32, or u64 for tensors past 2^32 elements)
//   T0..T4    the operands' stored types (inputs, then outputs)
//   OFFSETS   code that sets o0, o1, ... to each operand's element offset from `i`
//   BODY      the op on one element

#define S0 p.scalars[0]
#define S1 p.scalars[1]
#define P0 ((T0*)p.ptrs[0])
#define P1 ((T1*)p.ptrs[1])
#define P2 ((T2*)p.ptrs[2])
#define P3 ((T3*)p.ptrs[3])
#define P4 ((T4*)p.ptrs[4])

KERNEL void map(const Params p) {
    const IDX n = (IDX)p.elements;
    const IDX step = (IDX)(block_count() * blockDim.x);
    for (IDX i = (IDX)(block_index() * blockDim.x + threadIdx.x); i < n; i += step) {
        OFFSETS
        BODY
    }
}
