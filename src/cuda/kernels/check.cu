// Check operators (docs/diagnostics.md, src/ops/check.rs): they never trap and never
// write the data; each counts the failing elements of a compact input into a flag
// record (count, smallest flat index). ABI: ABI.md, section "check.cu".
//
//   ndx_flags_reset       (ndx_flag* flags, u64 n)
//   ndx_check_bool        (const u8* x, u64 n, ndx_flag* flag)           fails: x == 0
//   ndx_check_finite_{dt} (const T* x, u64 n, ndx_flag* flag)            dt: f32 f16 bf16
//   ndx_check_range_{dt}  (const T* x, u64 n, double lo, double hi, ndx_flag* flag)
//                                                                        dt: f32 f16 bf16 u8 i32
// check_range fails outside [lo, hi], NaN included, comparing in double. Integers
// are always finite (no kernel). check_shape needs no kernel.

#include "ndx_common.cuh"

// Sets n flag records to {count 0, first_index ~0}.
extern "C" __global__ void ndx_flags_reset(ndx_flag* flags, u64 n) {
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        flags[i].count = 0;
        flags[i].first_index = ~0ull;
    }
}

template <class D, class Bad>
NDX_DEV void count_where(const typename D::T* x, u64 n, ndx_flag* flag, Bad bad) {
    FlagAcc acc;
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        if (bad(x[i])) acc.hit(i);
    }
    ndx_flag_commit(flag, acc);
}

struct IsFalse {
    __device__ bool operator()(u8 v) const { return v == 0; }
};
template <class D>
struct NotFinite {
    __device__ bool operator()(typename D::T v) const { return !D::finite(v); }
};
template <class D>
struct OutOfRange {
    double lo, hi;
    __device__ bool operator()(typename D::T v) const {
        const double x = D::to_f64(v);
        return !(x >= lo && x <= hi);
    }
};

extern "C" __global__ void ndx_check_bool(const u8* x, u64 n, ndx_flag* flag) {
    count_where<DU8>(x, n, flag, IsFalse());
}

#define NDX_CHECK_FINITE(dt, D)                                                             \
    extern "C" __global__ void ndx_check_finite_##dt(const D::T* x, u64 n, ndx_flag* flag) { \
        count_where<D>(x, n, flag, NotFinite<D>());                                          \
    }
NDX_CHECK_FINITE(f32, DF32)
NDX_CHECK_FINITE(f16, DF16)
NDX_CHECK_FINITE(bf16, DBF16)

#define NDX_CHECK_RANGE(dt, D)                                                            \
    extern "C" __global__ void ndx_check_range_##dt(const D::T* x, u64 n, double lo,      \
                                                    double hi, ndx_flag* flag) {          \
        OutOfRange<D> bad;                                                                \
        bad.lo = lo;                                                                      \
        bad.hi = hi;                                                                      \
        count_where<D>(x, n, flag, bad);                                                  \
    }
NDX_CHECK_RANGE(f32, DF32)
NDX_CHECK_RANGE(f16, DF16)
NDX_CHECK_RANGE(bf16, DBF16)
NDX_CHECK_RANGE(u8, DU8)
NDX_CHECK_RANGE(i32, DI32)
