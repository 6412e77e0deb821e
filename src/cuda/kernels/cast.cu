// cast between f32 f16 bf16 u8 i32, and from each of them to bool.
// ABI: ABI.md, section "cast.cu".
//
//   ndx_cast_{src}_{dst}  (DST* out, const SRC* in, u64 n)   src, dst: f32 f16 bf16 u8 i32
//                         (src == dst: a bit copy)
//   ndx_cast_{src}_bool   (u8* out, const SRC* in, u64 n)    writes 0 or 1
//
// Semantics (docs/operators.md, kernels::cast): integers to integers wrap (two's
// complement); floats to integers truncate toward zero and saturate, NaN gives 0;
// to a float, the exact value rounded once to nearest even; to bool, `value != 0`
// (NaN is true, -0.0 false).

#include "ndx_common.cuh"

template <class S, class D, int SF = S::FLOAT, int DF = D::FLOAT>
struct Cast;

template <class S, class D>
struct Cast<S, D, 1, 1> {  // float to float: float32 holds every source value exactly
    NDX_DEV typename D::T f(typename S::T v) { return D::from_f32(S::to_f32(v)); }
};
template <class S, class D>
struct Cast<S, D, 1, 0> {  // float to integer: truncate, saturate, NaN -> 0
    NDX_DEV typename D::T f(typename S::T v) { return D::from_f64(S::to_f64(v)); }
};
template <class S, class D>
struct Cast<S, D, 0, 1> {  // integer to float: exact in double, rounded once
    NDX_DEV typename D::T f(typename S::T v) { return D::from_f64(S::to_f64(v)); }
};
template <class S, class D>
struct Cast<S, D, 0, 0> {  // integer to integer: wrap
    NDX_DEV typename D::T f(typename S::T v) { return D::wrap(S::bits(v)); }
};

template <class S, class D>
struct Same {
    enum { value = 0 };
};
template <class S>
struct Same<S, S> {
    enum { value = 1 };
};

template <class S, class D>
NDX_DEV void cast_kernel(typename D::T* out, const typename S::T* in, u64 n) {
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        // The identity is a bit copy (NaN payloads included).
        out[i] = Same<S, D>::value ? (typename D::T)in[i] : Cast<S, D>::f(in[i]);
    }
}

template <class S>
NDX_DEV void cast_bool_kernel(u8* out, const typename S::T* in, u64 n) {
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        out[i] = S::nonzero(in[i]) ? 1 : 0;
    }
}

#define NDX_CAST(s, S, d, D)                                                              \
    extern "C" __global__ void ndx_cast_##s##_##d(D::T* out, const S::T* in, u64 n) {     \
        cast_kernel<S, D>(out, in, n);                                                    \
    }

#define NDX_CAST_FROM(s, S)                                                               \
    NDX_CAST(s, S, f32, DF32)                                                             \
    NDX_CAST(s, S, f16, DF16)                                                             \
    NDX_CAST(s, S, bf16, DBF16)                                                           \
    NDX_CAST(s, S, u8, DU8)                                                               \
    NDX_CAST(s, S, i32, DI32)                                                             \
    extern "C" __global__ void ndx_cast_##s##_bool(u8* out, const S::T* in, u64 n) {      \
        cast_bool_kernel<S>(out, in, n);                                                  \
    }

NDX_CAST_FROM(f32, DF32)
NDX_CAST_FROM(f16, DF16)
NDX_CAST_FROM(bf16, DBF16)
NDX_CAST_FROM(u8, DU8)
NDX_CAST_FROM(i32, DI32)
