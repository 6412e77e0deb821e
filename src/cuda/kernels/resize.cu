// resize of compact images with OpenCV's half-pixel centres, as src/ops/resize.rs.
// ABI: ABI.md, section "resize.cu".
//
//   ndx_resize_linear_{dt}  (T* out, const T* src, ndx_resize_geom g)  dt: f32 f16 bf16 u8 i32
//   ndx_resize_nearest_{dt} (T* out, const T* src, ndx_resize_geom g)
//   ndx_resize_area2_u8     (u8* out, const u8* src, ndx_resize_geom g)
//
// An image is `planes` planes of in_h rows of in_w pixels of c interleaved channels:
// HWC is planes = 1, c = C; CHW is planes = C, c = 1. One thread per output element.
// The host handles, as resize.rs does: a same-size resize (a copy: the blend would
// turn inf * 0 into NaN), empty images, and the uint8 exact halving of pixels with
// c not in {1, 3, 4} (ndx_resize_area2_u8 instead of the linear kernel).

#include "ndx_common.cuh"

struct ndx_resize_geom {
    u64 planes;
    u64 in_h;
    u64 in_w;
    u64 c;
    u64 out_h;
    u64 out_w;
};

// Output element idx -> (plane, oy, ox, k).
NDX_DEV void out_coords(u64 idx, const ndx_resize_geom& g, u64& p, u64& oy, u64& ox, u64& k) {
    u64 t;
    ndx_divmod(idx, g.c, t, k);
    ndx_divmod(t, g.out_w, t, ox);
    ndx_divmod(t, g.out_h, p, oy);
}

NDX_DEV u64 src_index(const ndx_resize_geom& g, u64 p, u64 y, u64 x, u64 k) {
    return ((p * g.in_h + y) * g.in_w + x) * g.c + k;
}

NDX_DEV i64 clamp_i64(i64 v, i64 lo, i64 hi) { return v < lo ? lo : (v > hi ? hi : v); }

// One axis of linear sampling, OpenCV's way (linear_taps with TapRule::OpenCvColumns
// or OpenCvRows): the coordinate (d + 0.5) * in / out - 0.5 computed in double,
// rounded to float, split into floor and fraction in float. A column whose floor is
// outside [0, in - 1) gets fraction 0; a row keeps it. Both indices clamp.
NDX_DEV void taps_cv(u64 d, u64 n_in, u64 n_out, bool rows, u64& lo, u64& hi, float& frac) {
    const double scale = (double)n_in / (double)n_out;
    const double f = ((double)d + 0.5) * scale - 0.5;
    const float f32 = (float)f;
    const float fl = floorf(f32);
    frac = f32 - fl;
    const i64 s = (i64)fl;
    const i64 last = (i64)n_in - 1;
    if (!rows && (s < 0 || s >= last)) frac = 0.0f;
    lo = (u64)clamp_i64(s, 0, last);
    hi = (u64)clamp_i64(s + 1, 0, last);
}

// The exact rule (TapRule::Exact): double coordinate and fraction, both axes clamp
// the weight at the edges.
NDX_DEV void taps_exact(u64 d, u64 n_in, u64 n_out, u64& lo, u64& hi, double& frac) {
    const double scale = (double)n_in / (double)n_out;
    const double f = ((double)d + 0.5) * scale - 0.5;
    const double fl = floor(f);
    frac = f - fl;
    const i64 s = (i64)fl;
    const i64 last = (i64)n_in - 1;
    if (s < 0 || s >= last) frac = 0.0;
    lo = (u64)clamp_i64(s, 0, last);
    hi = (u64)clamp_i64(s + 1, 0, last);
}

// The OpenCV taps of output element `idx`: the source indices of its top-left,
// top-right, bottom-left and bottom-right neighbours, and the column and row fractions.
struct CvTaps {
    u64 at[4];
    float fx, fy;
};

NDX_DEV CvTaps cv_taps(u64 idx, const ndx_resize_geom& g) {
    u64 p, oy, ox, k;
    out_coords(idx, g, p, oy, ox, k);
    u64 x0, x1, y0, y1;
    CvTaps t;
    taps_cv(ox, g.in_w, g.out_w, false, x0, x1, t.fx);
    taps_cv(oy, g.in_h, g.out_h, true, y0, y1, t.fy);
    t.at[0] = src_index(g, p, y0, x0, k);
    t.at[1] = src_index(g, p, y0, x1, k);
    t.at[2] = src_index(g, p, y1, x0, k);
    t.at[3] = src_index(g, p, y1, x1, k);
    return t;
}

// ---------------------------------------------------------------------------
// Linear, float32 arithmetic (f32; f16 and bf16 widened to f32 and rounded back
// once, as resize.rs casts them): columns blended first, then rows.

template <class D>
NDX_DEV void linear_float(typename D::T* out, const typename D::T* src, const ndx_resize_geom& g) {
    const u64 n = g.planes * g.out_h * g.out_w * g.c;
    for (u64 idx = ndx_tid(); idx < n; idx += ndx_nthreads()) {
        const CvTaps t = cv_taps(idx, g);
        const float cw0 = 1.0f - t.fx, cw1 = t.fx;
        const float rw0 = 1.0f - t.fy, rw1 = t.fy;
        const float a0 = D::to_f32(src[t.at[0]]);
        const float b0 = D::to_f32(src[t.at[1]]);
        const float a1 = D::to_f32(src[t.at[2]]);
        const float b1 = D::to_f32(src[t.at[3]]);
        const float h0 = a0 * cw0 + b0 * cw1;
        const float h1 = a1 * cw0 + b1 * cw1;
        out[idx] = D::from_f32(h0 * rw0 + h1 * rw1);
    }
}

// Linear, uint8: OpenCV's fixed point (FixedU8 in resize.rs). Weights are the float
// fractions scaled by 2^11 and rounded half to even; the column pass is exact in
// int32; the row pass rounds as OpenCV's vectorised path does.
NDX_DEV i32 q11(float v) { return (i32)rintf(v * 2048.0f); }

NDX_DEV void linear_u8(u8* out, const u8* src, const ndx_resize_geom& g) {
    const u64 n = g.planes * g.out_h * g.out_w * g.c;
    for (u64 idx = ndx_tid(); idx < n; idx += ndx_nthreads()) {
        const CvTaps t = cv_taps(idx, g);
        const i32 cw0 = q11(1.0f - t.fx), cw1 = q11(t.fx);
        const i32 rw0 = q11(1.0f - t.fy), rw1 = q11(t.fy);
        const i32 h0 = (i32)src[t.at[0]] * cw0 + (i32)src[t.at[1]] * cw1;
        const i32 h1 = (i32)src[t.at[2]] * cw0 + (i32)src[t.at[3]] * cw1;
        i32 v = ((((h0 >> 4) * rw0) >> 16) + (((h1 >> 4) * rw1) >> 16) + 2) >> 2;
        v = v < 0 ? 0 : (v > 255 ? 255 : v);
        out[idx] = (u8)v;
    }
}

// Linear, int32: exact double taps, blended in double, rounded half to even.
NDX_DEV void linear_i32(i32* out, const i32* src, const ndx_resize_geom& g) {
    const u64 n = g.planes * g.out_h * g.out_w * g.c;
    for (u64 idx = ndx_tid(); idx < n; idx += ndx_nthreads()) {
        u64 p, oy, ox, k;
        out_coords(idx, g, p, oy, ox, k);
        u64 x0, x1, y0, y1;
        double fx, fy;
        taps_exact(ox, g.in_w, g.out_w, x0, x1, fx);
        taps_exact(oy, g.in_h, g.out_h, y0, y1, fy);
        const double cw0 = 1.0 - fx, cw1 = fx;
        const double rw0 = 1.0 - fy, rw1 = fy;
        const double h0 = (double)src[src_index(g, p, y0, x0, k)] * cw0 +
                          (double)src[src_index(g, p, y0, x1, k)] * cw1;
        const double h1 = (double)src[src_index(g, p, y1, x0, k)] * cw0 +
                          (double)src[src_index(g, p, y1, x1, k)] * cw1;
        out[idx] = f64_to_i32_sat(rint(h0 * rw0 + h1 * rw1));
    }
}

// ---------------------------------------------------------------------------
// Nearest: source pixel min(floor((2d + 1) * in / (2 out)), in - 1), exactly.

NDX_DEV u64 nearest_tap(u64 d, u64 n_in, u64 n_out) {
    const u64 s = ((2 * d + 1) * n_in) / (2 * n_out);
    return s < n_in - 1 ? s : n_in - 1;
}

template <class T>
NDX_DEV void nearest(T* out, const T* src, const ndx_resize_geom& g) {
    const u64 n = g.planes * g.out_h * g.out_w * g.c;
    for (u64 idx = ndx_tid(); idx < n; idx += ndx_nthreads()) {
        u64 p, oy, ox, k;
        out_coords(idx, g, p, oy, ox, k);
        const u64 y = nearest_tap(oy, g.in_h, g.out_h);
        const u64 x = nearest_tap(ox, g.in_w, g.out_w);
        out[idx] = src[src_index(g, p, y, x, k)];
    }
}

// ---------------------------------------------------------------------------
// OpenCV's area filter for an exact uint8 halving (in = 2 * out on both axes):
// each output the mean of its 2 x 2 block, rounded half to even (halve_u8).

NDX_DEV void area2_u8(u8* out, const u8* src, const ndx_resize_geom& g) {
    const u64 n = g.planes * g.out_h * g.out_w * g.c;
    for (u64 idx = ndx_tid(); idx < n; idx += ndx_nthreads()) {
        u64 p, oy, ox, k;
        out_coords(idx, g, p, oy, ox, k);
        const u32 s = (u32)src[src_index(g, p, 2 * oy, 2 * ox, k)] +
                      (u32)src[src_index(g, p, 2 * oy, 2 * ox + 1, k)] +
                      (u32)src[src_index(g, p, 2 * oy + 1, 2 * ox, k)] +
                      (u32)src[src_index(g, p, 2 * oy + 1, 2 * ox + 1, k)];
        const u32 whole = s >> 2, rest = s & 3u;
        out[idx] = (u8)(whole + ((rest > 2u || (rest == 2u && (whole & 1u))) ? 1u : 0u));
    }
}

// ---------------------------------------------------------------------------

#define NDX_RESIZE_LINEAR(dt, T, call)                                                    \
    extern "C" __global__ void ndx_resize_linear_##dt(T* out, const T* src,               \
                                                      ndx_resize_geom g) {                \
        call(out, src, g);                                                                \
    }
#define NDX_RESIZE_NEAREST(dt, T)                                                         \
    extern "C" __global__ void ndx_resize_nearest_##dt(T* out, const T* src,              \
                                                       ndx_resize_geom g) {               \
        nearest<T>(out, src, g);                                                          \
    }

NDX_RESIZE_LINEAR(f32, float, linear_float<DF32>)
NDX_RESIZE_LINEAR(f16, f16, linear_float<DF16>)
NDX_RESIZE_LINEAR(bf16, bf16, linear_float<DBF16>)
NDX_RESIZE_LINEAR(u8, u8, linear_u8)
NDX_RESIZE_LINEAR(i32, i32, linear_i32)

NDX_RESIZE_NEAREST(f32, float)
NDX_RESIZE_NEAREST(f16, f16)
NDX_RESIZE_NEAREST(bf16, bf16)
NDX_RESIZE_NEAREST(u8, u8)
NDX_RESIZE_NEAREST(i32, i32)

extern "C" __global__ void ndx_resize_area2_u8(u8* out, const u8* src, ndx_resize_geom g) {
    area2_u8(out, src, g);
}
