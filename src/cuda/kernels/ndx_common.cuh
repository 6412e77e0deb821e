// ndx CUDA kernels: definitions shared by every .cu file of this directory.
//
// Self-contained on purpose: no CUDA header is included (NVRTC from the PyPI wheel
// ships none), so the fixed-width types, the half-precision conversions and the
// flag record are defined here. scripts/build_ptx.py passes this file to NVRTC as an
// in-memory header. The ABI of every kernel is in ABI.md beside this file.

#ifndef NDX_COMMON_CUH
#define NDX_COMMON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
// float16 and bfloat16 travel as their raw 16 bits.
typedef unsigned short f16;
typedef unsigned short bf16;

// The flag record: device memory, zeroed count and first_index = ~0ull set by the
// host before the first kernel that may raise it; kernels add to `count` and lower
// `first_index` (a flat element index) with atomics. Read once at synchronisation.
struct ndx_flag {
    unsigned long long count;
    unsigned long long first_index;
};

#define NDX_FULL_MASK 0xffffffffu
#define NDX_DEV static __device__ __forceinline__

// ---------------------------------------------------------------------------
// Launch geometry: 1-D grids, blockDim.x a multiple of 32, grid-stride loops.

NDX_DEV u64 ndx_tid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
NDX_DEV u64 ndx_nthreads() { return (u64)gridDim.x * blockDim.x; }
NDX_DEV u32 ndx_lane() { return threadIdx.x & 31u; }
NDX_DEV u64 ndx_warp() { return ndx_tid() >> 5; }
NDX_DEV u64 ndx_nwarps() { return ndx_nthreads() >> 5; }

// q = a / b, r = a % b (b > 0), with 32-bit division when both fit: a 64-bit
// division is a long software sequence on the GPU.
NDX_DEV void ndx_divmod(u64 a, u64 b, u64& q, u64& r) {
    if (((a | b) >> 32) == 0) {
        const u32 a32 = (u32)a, b32 = (u32)b;
        q = a32 / b32;
        r = a32 % b32;
    } else {
        q = a / b;
        r = a % b;
    }
}

// ---------------------------------------------------------------------------
// Bits.

NDX_DEV u32 f32_bits(float v) { return __float_as_uint(v); }
NDX_DEV float f32_from_bits(u32 b) { return __uint_as_float(b); }

NDX_DEV bool f32_finite(float v) { return (f32_bits(v) & 0x7f800000u) != 0x7f800000u; }
NDX_DEV bool f16_finite(f16 h) { return (h & 0x7c00u) != 0x7c00u; }
NDX_DEV bool bf16_finite(bf16 h) { return (h & 0x7f80u) != 0x7f80u; }

// ---------------------------------------------------------------------------
// Conversions. Every narrowing rounds once, to nearest even.

// float16 <-> float32 with PTX cvt (compute_70 has both). NaN comes back as a NaN
// (payloads are not promised).
// (NDX_HOST_EMULATION: the CPU build of the tests, see host_emulation.h.)
NDX_DEV float f16_to_f32(f16 h) {
#ifdef NDX_HOST_EMULATION
    return ndx_emu_f16_to_f32(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}
NDX_DEV f16 f32_to_f16(float f) {
#ifdef NDX_HOST_EMULATION
    return ndx_emu_f32_to_f16(f);
#else
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

// bfloat16 is the high half of a float32.
NDX_DEV float bf16_to_f32(bf16 h) { return f32_from_bits((u32)h << 16); }
NDX_DEV bf16 f32_to_bf16(float f) {
    u32 x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (bf16)((x >> 16) | 0x0040u);  // NaN: keep sign and payload, make it quiet
    }
    x += 0x7fffu + ((x >> 16) & 1u);  // to nearest, ties to even (overflow gives inf)
    return (bf16)(x >> 16);
}

// `v` rounded to float32 toward zero with the last bit set when inexact ("round to
// odd"): narrowing that to a format of at most 22 significant bits to nearest even
// equals rounding `v` once. Same as f32_round_to_odd in src/ops/kernels.rs.
NDX_DEV float f64_to_f32_odd(double v) {
#ifdef NDX_HOST_EMULATION
    float t = ndx_emu_f64_to_f32_rz(v);
#else
    float t;
    asm("cvt.rz.f32.f64 %0, %1;" : "=f"(t) : "d"(v));
#endif
    if (v == v && (double)t != v) {
        t = f32_from_bits(f32_bits(t) | 1u);
    }
    return t;
}
NDX_DEV f16 f64_to_f16(double v) { return f32_to_f16(f64_to_f32_odd(v)); }
NDX_DEV bf16 f64_to_bf16(double v) { return f32_to_bf16(f64_to_f32_odd(v)); }
NDX_DEV float f64_to_f32(double v) { return (float)v; }  // cvt.rn.f32.f64

// Float to integer as Rust's `as`: truncate toward zero, saturate, NaN gives 0.
NDX_DEV i32 f64_to_i32_sat(double v) {
    if (!(v == v)) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return (i32)0x80000000u;
    return (i32)v;
}
NDX_DEV u8 f64_to_u8_sat(double v) {
    if (!(v > 0.0)) return 0;  // NaN, negatives and -0.x
    if (v >= 255.0) return 255;
    return (u8)(u32)v;
}

// ---------------------------------------------------------------------------
// Element types. Each has: T (storage), FLOAT, SIGNED, to_f64 (exact), from_f64 (one
// rounding for floats; truncating saturation for integers), and for floats the
// float32 compute type (to_f32 exact, from_f32 one rounding).

struct DF32 {
    typedef float T;
    enum { FLOAT = 1, SIGNED = 1 };
    NDX_DEV float to_f32(T v) { return v; }
    NDX_DEV T from_f32(float v) { return v; }
    NDX_DEV double to_f64(T v) { return (double)v; }
    NDX_DEV T from_f64(double v) { return f64_to_f32(v); }
    NDX_DEV bool finite(T v) { return f32_finite(v); }
    NDX_DEV bool nonzero(T v) { return v != 0.0f; }  // NaN is non-zero
};
struct DF16 {
    typedef f16 T;
    enum { FLOAT = 1, SIGNED = 1 };
    NDX_DEV float to_f32(T v) { return f16_to_f32(v); }
    NDX_DEV T from_f32(float v) { return f32_to_f16(v); }
    NDX_DEV double to_f64(T v) { return (double)f16_to_f32(v); }
    NDX_DEV T from_f64(double v) { return f64_to_f16(v); }
    NDX_DEV bool finite(T v) { return f16_finite(v); }
    NDX_DEV bool nonzero(T v) { return (v & 0x7fffu) != 0; }
};
struct DBF16 {
    typedef bf16 T;
    enum { FLOAT = 1, SIGNED = 1 };
    NDX_DEV float to_f32(T v) { return bf16_to_f32(v); }
    NDX_DEV T from_f32(float v) { return f32_to_bf16(v); }
    NDX_DEV double to_f64(T v) { return (double)bf16_to_f32(v); }
    NDX_DEV T from_f64(double v) { return f64_to_bf16(v); }
    NDX_DEV bool finite(T v) { return bf16_finite(v); }
    NDX_DEV bool nonzero(T v) { return (v & 0x7fffu) != 0; }
};
struct DU8 {
    typedef u8 T;
    enum { FLOAT = 0, SIGNED = 0 };
    NDX_DEV double to_f64(T v) { return (double)v; }
    NDX_DEV T from_f64(double v) { return f64_to_u8_sat(v); }
    NDX_DEV bool finite(T) { return true; }
    NDX_DEV bool nonzero(T v) { return v != 0; }
    // Two's complement wrap from a 32-bit pattern.
    NDX_DEV T wrap(u32 v) { return (u8)v; }
    NDX_DEV u32 bits(T v) { return v; }
};
struct DI32 {
    typedef i32 T;
    enum { FLOAT = 0, SIGNED = 1 };
    NDX_DEV double to_f64(T v) { return (double)v; }
    NDX_DEV T from_f64(double v) { return f64_to_i32_sat(v); }
    NDX_DEV bool finite(T) { return true; }
    NDX_DEV bool nonzero(T v) { return v != 0; }
    NDX_DEV T wrap(u32 v) { return (i32)v; }
    NDX_DEV u32 bits(T v) { return (u32)v; }
};

// ---------------------------------------------------------------------------
// Flags. Each thread counts its own hits (its indices grow, so its first hit is its
// smallest); at the end every lane of every warp calls ndx_flag_commit, which sums
// the warp's counts and takes its minimum index, and one lane issues the atomics.

struct FlagAcc {
    u64 count;
    u64 first;
    __device__ FlagAcc() : count(0), first(~0ull) {}
    __device__ void hit(u64 i) {
        if (count == 0) first = i;
        count += 1;
    }
};

// Must be called by all 32 lanes of the warp (no thread may have returned). Not
// inlined: one copy per PTX file keeps the PTX small; it runs once per thread.
static __device__ __noinline__ void ndx_flag_commit_warp(ndx_flag* flag, u64 count, u64 first) {
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_down_sync(NDX_FULL_MASK, count, o);
        u64 f = __shfl_down_sync(NDX_FULL_MASK, first, o);
        first = f < first ? f : first;
    }
    if (ndx_lane() == 0 && count != 0) {
        atomicAdd(&flag->count, count);
        atomicMin(&flag->first_index, first);
    }
}

NDX_DEV void ndx_flag_commit(ndx_flag* flag, const FlagAcc& a) {
    if (flag == 0) return;  // uniform: a kernel argument
    if (!__any_sync(NDX_FULL_MASK, a.count != 0)) return;
    ndx_flag_commit_warp(flag, a.count, a.first);
}

#endif  // NDX_COMMON_CUH
