// Movement: concat, embedding, gather (copies of raw words), and the deterministic sums of
// scatter-add and embedding backward (no float atomics; every output sums its sources in
// increasing source order). Parameters: `MoveParams` (ops/movement.rs). Every operand is
// row-major. The planner defines, per entry point:
//   IDX   the index type (u32, or u64 past 2^32 elements)
//   W     the copied word (concat, embedding: 1 to 16 bytes; gather: the element's bits)
//   I     the index dtype (i32 or u32)
//   T     the summed data's stored type, ACC what it sums in (float, or u32 that wraps)

// A 16-byte word for wide copies.
struct alignas(16) w128 { u64 lo, hi; };

#if defined(ACC)
DEV float load_acc(const float* q, u64 i) { return q[i]; }
DEV float load_acc(const f16* q, u64 i) { return to_f32(q[i]); }
DEV float load_acc(const bf16* q, u64 i) { return to_f32(q[i]); }
DEV u32 load_acc(const i32* q, u64 i) { return (u32)q[i]; }
DEV u32 load_acc(const u32* q, u64 i) { return q[i]; }
DEV void store_acc(float* q, u64 i, float v) { q[i] = v; }
DEV void store_acc(f16* q, u64 i, float v) { q[i] = from_f32<f16>(v); }
DEV void store_acc(bf16* q, u64 i, float v) { q[i] = from_f32<bf16>(v); }
DEV void store_acc(i32* q, u64 i, u32 v) { q[i] = (i32)v; }
DEV void store_acc(u32* q, u64 i, u32 v) { q[i] = v; }
#endif

#define FOR_EACH(e, n) \
    for (IDX e = (IDX)(block_index() * blockDim.x + threadIdx.x); e < (IDX)(n); \
         e += (IDX)(block_count() * blockDim.x))

#if defined(W)
// One input's `elements` words, in rows of `row` words, into its slice of the output: rows
// of `out_row` words, starting at word `dst_offset`.
KERNEL void concat(const Params p) {
    start_after_previous();
    const W* src = (const W*)p.src;
    W* dst = (W*)p.dst;
    const IDX row = (IDX)p.row;
    FOR_EACH(i, p.elements) {
        const IDX o = i / row;
        dst[o * (IDX)p.out_row + (IDX)p.dst_offset + (i - o * row)] = src[i];
    }
}
#endif

#if defined(W) && defined(I)
// Row `ids[i]` of the table (`rows` rows of `row` words) for each position; zeros for ids
// outside the table.
KERNEL void embedding(const Params p) {
    start_after_previous();
    const W* table = (const W*)p.src;
    const I* ids = (const I*)p.index;
    W* dst = (W*)p.dst;
    const IDX row = (IDX)p.row;
    FOR_EACH(e, p.elements) {
        const IDX pos = e / row;
        const i64 id = (i64)ids[pos];
        W v = {};
        if (id >= 0 && id < (i64)p.rows) v = table[(IDX)id * row + (e - pos * row)];
        dst[e] = v;
    }
}

// Index copy: `src`'s rows of `row` words (`positions` of them per outer slice) into `dst` at
// row `index[t]` of each slice of `rows` rows; indices outside the slice are skipped. The
// rows not indexed are left alone, so the copy may run in place.
KERNEL void index_copy(const Params p) {
    start_after_previous();
    const W* src = (const W*)p.src;
    const I* index = (const I*)p.index;
    W* dst = (W*)p.dst;
    const IDX row = (IDX)p.row, count = (IDX)p.positions;
    FOR_EACH(e, p.elements) {
        const IDX r = e / row;
        const IDX o = r / count, t = r - o * count;
        const i64 id = (i64)index[t];
        if (id >= 0 && id < (i64)p.rows) dst[(o * (IDX)p.rows + (IDX)id) * row + (e - r * row)] = src[e];
    }
}

// out[e] = x[..., index[e], ...] along `axis`: the index's coordinates of e, through x's
// strides; zero for indices outside 0..rows.
KERNEL void gather(const Params p) {
    start_after_previous();
    const W* x = (const W*)p.src;
    const I* index = (const I*)p.index;
    W* dst = (W*)p.dst;
    const u32 axis = p.axis;
    FOR_EACH(e, p.elements) {
        IDX rem = e;
        IDX xo = 0;
        for (u32 k = p.rank; k > 0; --k) {
            const u32 d = k - 1;
            const IDX size = (IDX)p.index_shape[d];
            const IDX c = rem % size;
            rem /= size;
            if (d != axis) xo += c * (IDX)p.x_strides[d];
        }
        const i64 id = (i64)index[e];
        W v = {};
        if (id >= 0 && id < (i64)p.rows) v = x[xo + (IDX)id * (IDX)p.x_strides[axis]];
        dst[e] = v;
    }
}
#endif

#if defined(ACC) && defined(I)
// Each output element sums, in source order, the sources along `axis` whose index names its
// coordinate there; zero where the index's shape does not reach it.
KERNEL void scatter_add(const Params p) {
    start_after_previous();
    const I* index = (const I*)p.index;
    const T* src = (const T*)p.src;
    T* dst = (T*)p.dst;
    const u32 axis = p.axis;
    FOR_EACH(e, p.elements) {
        IDX rem = e;
        IDX base = 0;
        IDX target = 0;
        bool inside = true;
        for (u32 k = p.rank; k > 0; --k) {
            const u32 d = k - 1;
            const IDX size = (IDX)p.out_shape[d];
            const IDX c = rem % size;
            rem /= size;
            if (d == axis) {
                target = c;
            } else {
                if (c >= (IDX)p.index_shape[d]) inside = false;
                base += c * (IDX)p.index_strides[d];
            }
        }
        ACC s = (ACC)0;
        if (inside) {
            const IDX len = (IDX)p.index_shape[axis];
            const IDX step = (IDX)p.index_strides[axis];
            for (IDX j = 0; j < len; ++j) {
                const IDX at = base + j * step;
                if ((i64)index[at] == (i64)target) s += load_acc(src, at);
            }
        }
        store_acc(dst, e, s);
    }
}
#endif

#if defined(I)
// Embedding backward, step 1: how many positions name each id (`counts`, zeroed first;
// integer atomics, so the counts do not depend on the order).
KERNEL void embedding_count(const Params p) {
    start_after_previous();
    const I* ids = (const I*)p.index;
    u32* counts = (u32*)p.aux0;
    FOR_EACH(i, p.positions) {
        const i64 id = (i64)ids[i];
        if (id >= 0 && id < (i64)p.rows) atomicAdd(&counts[id], 1u);
    }
}

#define ORDER_THREADS 256

// Step 2, one block: `cursor` = where each id's positions start (a scan of the counts), then
// `order` = the positions sorted by id, stably (each id's positions in increasing order). A
// tile of positions at a time: a position's slot is its id's cursor plus the number of
// earlier positions of its id in the tile. Afterwards `cursor[v]` is where id v's end.
KERNEL void embedding_order(const Params p) {
    start_after_previous();
    __shared__ u32 scan[ORDER_THREADS];
    __shared__ i64 tile[ORDER_THREADS];
    const I* ids = (const I*)p.index;
    const u32* counts = (const u32*)p.aux0;
    u32* cursor = (u32*)p.aux1;
    u32* order = (u32*)p.aux2;
    const u32 tid = threadIdx.x;
    const u32 nt = blockDim.x;
    const u64 vocab = p.rows;
    u32 carry = 0;
    for (u64 base = 0; base < vocab; base += nt) {
        const u64 v = base + tid;
        const u32 c = v < vocab ? counts[v] : 0u;
        scan[tid] = c;
        __syncthreads();
        for (u32 off = 1; off < nt; off *= 2) {
            const u32 add = tid >= off ? scan[tid - off] : 0u;
            __syncthreads();
            scan[tid] += add;
            __syncthreads();
        }
        if (v < vocab) cursor[v] = carry + scan[tid] - c;
        carry += scan[nt - 1];
        __syncthreads();
    }
    for (u64 base = 0; base < p.positions; base += nt) {
        const u64 i = base + tid;
        i64 id = -1;
        if (i < p.positions) {
            id = (i64)ids[i];
            if (id < 0 || id >= (i64)vocab) id = -1;
        }
        tile[tid] = id;
        __syncthreads();
        const u32 count = p.positions - base < (u64)nt ? (u32)(p.positions - base) : nt;
        u32 before = 0, total = 0;
        if (id >= 0) {
            for (u32 k = 0; k < count; ++k) {
                if (tile[k] == id) {
                    total += 1;
                    if (k < tid) before += 1;
                }
            }
            order[cursor[id] + before] = (u32)i;
        }
        __syncthreads();
        if (id >= 0 && before + 1 == total) cursor[id] += total;
        __syncthreads();
    }
}
#endif

#if defined(ACC)
// Step 3: dweight[v][c] sums dy[i][c] over id v's positions i in increasing order (zero for
// ids no position names). `row` is D.
KERNEL void embedding_sum(const Params p) {
    start_after_previous();
    const T* dy = (const T*)p.src;
    T* dst = (T*)p.dst;
    const u32* counts = (const u32*)p.aux0;
    const u32* cursor = (const u32*)p.aux1;
    const u32* order = (const u32*)p.aux2;
    const IDX row = (IDX)p.row;
    FOR_EACH(e, p.elements) {
        const IDX v = e / row;
        const IDX c = e - v * row;
        const u32 end = cursor[v];
        ACC s = (ACC)0;
        for (u32 k = end - counts[v]; k < end; ++k) s += load_acc(dy, (IDX)order[k] * row + c);
        store_acc(dst, e, s);
    }
}
#endif
