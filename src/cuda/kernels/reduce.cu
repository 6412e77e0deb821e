// Reductions sum, mean, max over the middle axis of a compact input viewed as
// [outer, r, inner]; the output is compact [outer, inner]. Two passes, no atomics,
// so results are deterministic (they depend on the shape and `chunk`, never on the
// grid). ABI: ABI.md, section "reduce.cu".
//
//   ndx_{sum,max}_{dt}_partial (P* partial, const T* x, u64 outer, u64 r, u64 inner, u64 chunk)
//   ndx_{sum,mean,max}_{dt}_final (O* out, const P* partial, u64 outer, u64 r, u64 inner, u64 chunk)
//
// r is split into nchunks = ceil(r / chunk) chunks; the partial pass writes one
// value per (outer, chunk, inner) — the temp buffer is [outer, nchunks, inner] of P —
// and the final pass combines the nchunks values of each output. `mean` uses the
// `sum` partial pass. P: double (sum of floats), 64-bit integer (sum of integers),
// T itself (max). Output dtypes as docs/operators.md: sum u8 -> uint64, i32 ->
// int64, floats -> their own (accumulated in double, rounded once); mean of integers
// -> float64, of floats their own; max keeps the dtype, NaN propagates.

#include "ndx_common.cuh"

// ---------------------------------------------------------------------------
// Reduction operations: Acc is the accumulator, P the partial's storage type.

template <class D, int FLOAT = D::FLOAT>
struct SumOp;

template <class D>
struct SumOp<D, 1> {
    typedef double Acc;
    typedef double P;
    NDX_DEV Acc identity() { return 0.0; }
    NDX_DEV Acc load(typename D::T v) { return D::to_f64(v); }
    NDX_DEV Acc combine(Acc a, Acc b) { return a + b; }
    NDX_DEV P store_p(Acc a) { return a; }
    NDX_DEV Acc load_p(P p) { return p; }
};

template <class D>
struct SumOp<D, 0> {  // integers: exact, wrapping 64-bit sums
    typedef u64 Acc;
    typedef u64 P;
    NDX_DEV Acc identity() { return 0; }
    NDX_DEV Acc load(typename D::T v) { return (u64)(i64)v; }  // sign-extends i32
    NDX_DEV Acc combine(Acc a, Acc b) { return a + b; }
    NDX_DEV P store_p(Acc a) { return a; }
    NDX_DEV Acc load_p(P p) { return p; }
};

template <class D, int FLOAT = D::FLOAT>
struct MaxOp;

template <class D>
struct MaxOp<D, 1> {  // in float32, which holds every f16/bf16 value; NaN wins
    typedef float Acc;
    typedef typename D::T P;
    NDX_DEV Acc identity() { return f32_from_bits(0xff800000u); }  // -inf
    NDX_DEV Acc load(typename D::T v) { return D::to_f32(v); }
    NDX_DEV Acc combine(Acc a, Acc b) {
        if (a != a) return a;
        if (b != b) return b;
        return b > a ? b : a;
    }
    NDX_DEV P store_p(Acc a) { return D::from_f32(a); }  // exact: a is a value of T
    NDX_DEV Acc load_p(P p) { return D::to_f32(p); }
};

template <class D>
struct MaxOp<D, 0> {
    typedef i32 Acc;
    typedef typename D::T P;
    NDX_DEV Acc identity() { return D::SIGNED ? (i32)0x80000000u : 0; }
    NDX_DEV Acc load(typename D::T v) { return (i32)v; }
    NDX_DEV Acc combine(Acc a, Acc b) { return b > a ? b : a; }
    NDX_DEV P store_p(Acc a) { return (typename D::T)a; }
    NDX_DEV Acc load_p(P p) { return (i32)p; }
};

// Tree reduction over the 32 lanes of a warp; lane 0 gets the result.
template <class Op>
NDX_DEV typename Op::Acc warp_reduce(typename Op::Acc a) {
    for (int o = 16; o > 0; o >>= 1) {
        a = Op::combine(a, __shfl_down_sync(NDX_FULL_MASK, a, o));
    }
    return a;
}

NDX_DEV u64 n_chunks(u64 r, u64 chunk) { return r == 0 ? 0 : (r - 1) / chunk + 1; }

// ---------------------------------------------------------------------------
// Pass 1: partial[(o * nchunks + k) * inner + i] = op over rows
// [k * chunk, min(r, (k + 1) * chunk)) of x[o, :, i].
//
// With inner == 1 and chunk >= 32 each chunk is a contiguous run reduced by one warp
// (lane l takes elements l, l + 32, ..., then a tree over the lanes); otherwise one
// thread reduces one (o, k, i) sequentially. The choice depends only on the
// arguments.

template <class Op, class D>
NDX_DEV void partial_kernel(typename Op::P* partial, const typename D::T* x, u64 outer,
                            u64 r, u64 inner, u64 chunk) {
    typedef typename Op::Acc Acc;
    const u64 nchunks = n_chunks(r, chunk);
    if (inner == 1 && chunk >= 32) {
        const u64 segments = outer * nchunks;
        const u32 lane = ndx_lane();
        for (u64 seg = ndx_warp(); seg < segments; seg += ndx_nwarps()) {
            const u64 o = seg / nchunks, k = seg % nchunks;
            const u64 start = k * chunk;
            const u64 len = (r - start) < chunk ? (r - start) : chunk;
            const typename D::T* p = x + o * r + start;
            Acc a = Op::identity();
            // Lane order is j = lane, lane + 32, ...; the first loop issues eight
            // independent loads per step (no bounds test between them), the second
            // takes the rest. The combination order is the same either way.
            u64 j = lane;
            const u64 whole = len & ~(u64)255;
            for (; j < whole; j += 256) {
                typename D::T v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) v[u] = p[j + 32 * u];
#pragma unroll
                for (int u = 0; u < 8; ++u) a = Op::combine(a, Op::load(v[u]));
            }
            for (; j < len; j += 32) {
                a = Op::combine(a, Op::load(p[j]));
            }
            a = warp_reduce<Op>(a);
            if (lane == 0) partial[seg] = Op::store_p(a);
        }
    } else {
        const u64 total = outer * nchunks * inner;
        for (u64 q = ndx_tid(); q < total; q += ndx_nthreads()) {
            const u64 i = q % inner, t = q / inner;
            const u64 k = t % nchunks, o = t / nchunks;
            const u64 start = k * chunk;
            const u64 end = (r - start) < chunk ? r : start + chunk;
            const typename D::T* p = x + (o * r) * inner + i;
            Acc a = Op::identity();
            for (u64 j = start; j < end; ++j) {
                a = Op::combine(a, Op::load(p[j * inner]));
            }
            partial[q] = Op::store_p(a);
        }
    }
}

// Pass 2: one warp per output (o, i): lane l combines chunks l, l + 32, ..., then a
// tree over the lanes; lane 0 writes fin(acc).
template <class Op, class Fin>
NDX_DEV void final_kernel(typename Fin::O* out, const typename Op::P* partial, u64 outer,
                          u64 r, u64 inner, u64 chunk) {
    typedef typename Op::Acc Acc;
    const u64 nchunks = n_chunks(r, chunk);
    const u64 outputs = outer * inner;
    const u32 lane = ndx_lane();
    for (u64 w = ndx_warp(); w < outputs; w += ndx_nwarps()) {
        const u64 o = w / inner, i = w % inner;
        const typename Op::P* p = partial + o * nchunks * inner + i;
        Acc a = Op::identity();
#pragma unroll 4
        for (u64 k = lane; k < nchunks; k += 32) {
            a = Op::combine(a, Op::load_p(p[k * inner]));
        }
        a = warp_reduce<Op>(a);
        if (lane == 0) out[w] = Fin::f(a, r);
    }
}

// Finishers: accumulator -> output element.
template <class D, int FLOAT = D::FLOAT>
struct SumFin;
template <class D>
struct SumFin<D, 1> {
    typedef typename D::T O;
    NDX_DEV O f(double a, u64) { return D::from_f64(a); }
};
template <class D>
struct SumFin<D, 0> {
    typedef u64 O;  // uint64 for u8, int64 (same bits) for i32
    NDX_DEV O f(u64 a, u64) { return a; }
};

template <class D, int FLOAT = D::FLOAT, int SIGNED = D::SIGNED>
struct MeanFin;
template <class D, int S>
struct MeanFin<D, 1, S> {
    typedef typename D::T O;
    NDX_DEV O f(double a, u64 r) { return D::from_f64(a / (double)r); }
};
template <class D>
struct MeanFin<D, 0, 0> {
    typedef double O;
    NDX_DEV O f(u64 a, u64 r) { return (double)a / (double)r; }
};
template <class D>
struct MeanFin<D, 0, 1> {
    typedef double O;
    NDX_DEV O f(u64 a, u64 r) { return (double)(i64)a / (double)r; }
};

template <class D>
struct MaxFin {
    typedef typename D::T O;
    NDX_DEV O f(typename MaxOp<D>::Acc a, u64) { return MaxOp<D>::store_p(a); }
};

#define NDX_REDUCE(dt, D)                                                                 \
    extern "C" __global__ void ndx_sum_##dt##_partial(                                    \
        SumOp<D>::P* partial, const D::T* x, u64 outer, u64 r, u64 inner, u64 chunk) {    \
        partial_kernel<SumOp<D>, D>(partial, x, outer, r, inner, chunk);                  \
    }                                                                                     \
    extern "C" __global__ void ndx_sum_##dt##_final(                                      \
        SumFin<D>::O* out, const SumOp<D>::P* partial, u64 outer, u64 r, u64 inner,       \
        u64 chunk) {                                                                      \
        final_kernel<SumOp<D>, SumFin<D> >(out, partial, outer, r, inner, chunk);         \
    }                                                                                     \
    extern "C" __global__ void ndx_mean_##dt##_final(                                     \
        MeanFin<D>::O* out, const SumOp<D>::P* partial, u64 outer, u64 r, u64 inner,      \
        u64 chunk) {                                                                      \
        final_kernel<SumOp<D>, MeanFin<D> >(out, partial, outer, r, inner, chunk);        \
    }                                                                                     \
    extern "C" __global__ void ndx_max_##dt##_partial(                                    \
        MaxOp<D>::P* partial, const D::T* x, u64 outer, u64 r, u64 inner, u64 chunk) {    \
        partial_kernel<MaxOp<D>, D>(partial, x, outer, r, inner, chunk);                  \
    }                                                                                     \
    extern "C" __global__ void ndx_max_##dt##_final(                                      \
        MaxFin<D>::O* out, const MaxOp<D>::P* partial, u64 outer, u64 r, u64 inner,       \
        u64 chunk) {                                                                      \
        final_kernel<MaxOp<D>, MaxFin<D> >(out, partial, outer, r, inner, chunk);         \
    }

NDX_REDUCE(f32, DF32)
NDX_REDUCE(f16, DF16)
NDX_REDUCE(bf16, DBF16)
NDX_REDUCE(u8, DU8)
NDX_REDUCE(i32, DI32)
