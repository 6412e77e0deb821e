// Binary arithmetic: add sub mul div, same dtype in and out (the host promotes with
// cast first). ABI: ABI.md, section "binary.cu".
//
//   ndx_{op}_{dt}        (T* out, const T* a, const T* b, u64 n,
//                         ndx_flag* nan_flag, ndx_flag* div_flag)
//   ndx_{op}_{dt}_bcast  (T* out, const T* a, const T* b, u64 n, ndx_bcast2 p,
//                         ndx_flag* nan_flag, ndx_flag* div_flag)
//   op: add sub mul div; dt: f32 f16 bf16 u8 i32
//
// Semantics (src/ops/kernels.rs, docs/operators.md): floats compute in float32 and
// round once to their own type (float16/bfloat16 as the `half` crate does); integers
// wrap; integer div is floor division (NumPy //, INT_MIN // -1 wraps to INT_MIN) and a
// zero divisor writes 0 and counts in div_flag. Floats: div by zero is IEEE and counts
// in div_flag; nan_flag counts outputs that are NaN or infinite from finite inputs.
// Either flag pointer may be NULL (not watched).

#include "ndx_common.cuh"

enum { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3 };

// The broadcast view: out shape and each input's element strides (0 for broadcast
// dims, may be negative), dims [0, ndim) used, C order (last dim fastest).
struct ndx_bcast2 {
    u32 ndim;
    u32 reserved;
    i64 shape[8];
    i64 a_strides[8];
    i64 b_strides[8];
};

template <int OP>
NDX_DEV float float_op(float x, float y) {
    if (OP == OP_ADD) return x + y;
    if (OP == OP_SUB) return x - y;
    if (OP == OP_MUL) return x * y;
    return x / y;
}

// Integer ops in u32 (wrapping, no UB); the caller narrows.
template <int OP, class D>
NDX_DEV typename D::T int_op(typename D::T x, typename D::T y) {
    u32 ux = D::bits(x), uy = D::bits(y);
    if (OP == OP_ADD) return D::wrap(ux + uy);
    if (OP == OP_SUB) return D::wrap(ux - uy);
    if (OP == OP_MUL) return D::wrap(ux * uy);
    // Floor division; the caller handled y == 0.
    if (!D::SIGNED) {
        return (typename D::T)(ux / uy);  // unsigned
    }
    i32 sx = (i32)ux, sy = (i32)uy;
    if (sy == -1) return D::wrap(0u - ux);  // MIN // -1 wraps to MIN
    i32 q = sx / sy, r = sx % sy;
    if (r != 0 && ((r < 0) != (sy < 0))) q -= 1;
    return D::wrap((u32)q);
}

template <int OP, class D, bool FLOAT = (bool)D::FLOAT>
struct Elem;

template <int OP, class D>
struct Elem<OP, D, true> {
    typedef typename D::T T;
    enum { WATCH_NAN = 1, WATCH_DIV = OP == OP_DIV };
    NDX_DEV T apply(T x, T y, u64 i, bool nan_on, bool div_on, FlagAcc& nan, FlagAcc& div) {
        float fx = D::to_f32(x), fy = D::to_f32(y);
        T o = D::from_f32(float_op<OP>(fx, fy));
        if (OP == OP_DIV && div_on && fy == 0.0f) div.hit(i);
        if (nan_on && !D::finite(o) && D::finite(x) && D::finite(y)) nan.hit(i);
        return o;
    }
};

template <int OP, class D>
struct Elem<OP, D, false> {
    typedef typename D::T T;
    enum { WATCH_NAN = 0, WATCH_DIV = OP == OP_DIV };
    NDX_DEV T apply(T x, T y, u64 i, bool, bool div_on, FlagAcc&, FlagAcc& div) {
        if (OP == OP_DIV && y == 0) {
            if (div_on) div.hit(i);
            return 0;
        }
        return int_op<OP, D>(x, y);
    }
};

template <int OP, class D>
NDX_DEV void binary_compact(typename D::T* out, const typename D::T* a,
                            const typename D::T* b, u64 n, ndx_flag* nan_flag,
                            ndx_flag* div_flag) {
    typedef Elem<OP, D> E;
    FlagAcc nan, div;
    const bool nan_on = E::WATCH_NAN && nan_flag != 0;
    const bool div_on = E::WATCH_DIV && div_flag != 0;
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        out[i] = Elem<OP, D>::apply(a[i], b[i], i, nan_on, div_on, nan, div);
    }
    if (E::WATCH_NAN) ndx_flag_commit(nan_flag, nan);
    if (E::WATCH_DIV) ndx_flag_commit(div_flag, div);
}

template <int OP, class D>
NDX_DEV void binary_bcast(typename D::T* out, const typename D::T* a,
                          const typename D::T* b, u64 n, const ndx_bcast2& p,
                          ndx_flag* nan_flag, ndx_flag* div_flag) {
    typedef Elem<OP, D> E;
    FlagAcc nan, div;
    const bool nan_on = E::WATCH_NAN && nan_flag != 0;
    const bool div_on = E::WATCH_DIV && div_flag != 0;
    const int ndim = (int)p.ndim;
    for (u64 i = ndx_tid(); i < n; i += ndx_nthreads()) {
        u64 rest = i;
        i64 oa = 0, ob = 0;
#pragma unroll 1
        for (int d = ndim - 1; d >= 0; --d) {
            u64 c;
            ndx_divmod(rest, (u64)p.shape[d], rest, c);
            oa += (i64)c * p.a_strides[d];
            ob += (i64)c * p.b_strides[d];
        }
        out[i] = Elem<OP, D>::apply(a[oa], b[ob], i, nan_on, div_on, nan, div);
    }
    if (E::WATCH_NAN) ndx_flag_commit(nan_flag, nan);
    if (E::WATCH_DIV) ndx_flag_commit(div_flag, div);
}

#define NDX_BINARY(opname, OPC, dt, D)                                                   \
    extern "C" __global__ void ndx_##opname##_##dt(                                      \
        D::T* out, const D::T* a, const D::T* b, u64 n, ndx_flag* nan_flag,              \
        ndx_flag* div_flag) {                                                            \
        binary_compact<OPC, D>(out, a, b, n, nan_flag, div_flag);                        \
    }                                                                                    \
    extern "C" __global__ void ndx_##opname##_##dt##_bcast(                              \
        D::T* out, const D::T* a, const D::T* b, u64 n, ndx_bcast2 p,                    \
        ndx_flag* nan_flag, ndx_flag* div_flag) {                                        \
        binary_bcast<OPC, D>(out, a, b, n, p, nan_flag, div_flag);                       \
    }

#define NDX_BINARY_ALL_TYPES(opname, OPC) \
    NDX_BINARY(opname, OPC, f32, DF32)    \
    NDX_BINARY(opname, OPC, f16, DF16)    \
    NDX_BINARY(opname, OPC, bf16, DBF16)  \
    NDX_BINARY(opname, OPC, u8, DU8)      \
    NDX_BINARY(opname, OPC, i32, DI32)

NDX_BINARY_ALL_TYPES(add, OP_ADD)
NDX_BINARY_ALL_TYPES(sub, OP_SUB)
NDX_BINARY_ALL_TYPES(mul, OP_MUL)
NDX_BINARY_ALL_TYPES(div, OP_DIV)
