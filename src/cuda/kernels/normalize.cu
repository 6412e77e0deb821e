// normalize: float32 out[i] = (x[i] - mean[ch]) / std[ch], computed in double and
// rounded once, for an input of f32 f16 bf16 u8 i32. ABI: ABI.md, "normalize.cu".
//
//   ndx_normalize_{dt} (float* out, const T* x, u64 n, u64 c, u64 inner,
//                       const double* mean, const double* std, u64 param_stride)
//
// The channel of flat element i is (i / inner) % c: inner = 1 for HWC (or any
// [..., C]), inner = H * W for CHW. mean and std are device arrays of doubles read
// at index ch * param_stride: param_stride 1 for C values, 0 for one value for all.
// Same arithmetic as normalize() in src/ops/image.rs.

#include "ndx_common.cuh"

template <class D>
NDX_DEV void normalize_kernel(float* out, const typename D::T* x, u64 n, u64 c, u64 inner,
                              const double* mean, const double* std, u64 param_stride) {
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        u64 q, rem, ch;
        ndx_divmod(i, inner, q, rem);
        ndx_divmod(q, c, q, ch);
        const u64 at = ch * param_stride;
        out[i] = (float)((D::to_f64(x[i]) - mean[at]) / std[at]);
    }
}

#define NDX_NORMALIZE(dt, D)                                                             \
    extern "C" __global__ void ndx_normalize_##dt(float* out, const D::T* x, u64 n,      \
                                                  u64 c, u64 inner, const double* mean,  \
                                                  const double* std, u64 param_stride) { \
        normalize_kernel<D>(out, x, n, c, inner, mean, std, param_stride);               \
    }

NDX_NORMALIZE(f32, DF32)
NDX_NORMALIZE(f16, DF16)
NDX_NORMALIZE(bf16, DBF16)
NDX_NORMALIZE(u8, DU8)
NDX_NORMALIZE(i32, DI32)
