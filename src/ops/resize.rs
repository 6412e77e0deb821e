//! `resize(h, w, interp)` of HWC or CHW images, with OpenCV's half-pixel centres.
//!
//! Linear: output pixel `d` samples source coordinate `(d + 0.5) * in / out - 0.5`,
//! clamped to the first and last pixel; the two neighbours are blended separably,
//! rows after columns. For the types OpenCV resizes the same way (`uint8`, `float32`,
//! and `float16`/`bfloat16` through `float32`) the coordinate is computed in `f32` and
//! the edges are treated as OpenCV treats them (a clamped column takes weight 0; a
//! clamped row keeps its weight and blends the edge row with itself); other types use
//! the exact `f64` coordinate. A same-size resize returns the pixels unchanged. `uint8` uses OpenCV's
//! fixed-point weights (11 bits each way) and its vectorised path's rounding, so it
//! equals `cv2.resize(..., INTER_LINEAR)` bit for bit; `float32`/`float64`
//! blend in their own type; other integer types blend in `f64` and round half to even;
//! `float16`/`bfloat16` blend in `f32`. Nearest: source pixel
//! `floor((d + 0.5) * in / out)` in exact integer arithmetic. This is OpenCV's
//! `INTER_NEAREST_EXACT` except where the centre falls exactly on a pixel's edge:
//! OpenCV's 16-bit fixed point lands just below it there and picks the pixel before.

use super::kernels::{self, Elem, make, make_overwritten, typed};
use super::{TMeta, par};
use crate::error::{Error, Result};
use crate::exec::args::{ArgValue, Args};
use crate::tensor::{DType, Tensor, dims};

/// Interpolation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Interp {
    Nearest,
    Linear,
}

/// A checked `resize` request.
pub struct Plan {
    pub out_h: i64,
    pub out_w: i64,
    pub interp: Interp,
    /// Axes of H, W and C.
    pub axes: (usize, usize, usize),
}

/// Validates `resize`'s arguments against an input's metadata.
pub fn plan(m: &TMeta, args: &Args) -> Result<Plan> {
    let axes = super::image::hwc_axes(&m.layout, &m.shape, "resize")?;
    if m.dtype == DType::Bool {
        return Err(Error::type_error(
            "operator 'resize' does not support dtype bool",
        ));
    }
    let get = |n: &str| super::image::required_int(args, "resize", n);
    let (out_h, out_w) = (get("h")?, get("w")?);
    if out_h <= 0 || out_w <= 0 {
        let (name, value) = if out_h <= 0 {
            ("h", out_h)
        } else {
            ("w", out_w)
        };
        return Err(Error::value(format!(
            "resize to h = {out_h}, w = {out_w}: argument '{name}' is {value}; expected a size >= 1"
        )));
    }
    let mut out = m.shape.clone();
    out[axes.0] = out_h;
    out[axes.1] = out_w;
    if crate::tensor::compact_nbytes(&out, m.dtype.itemsize()).is_none() {
        return Err(Error::value(format!(
            "resize to h = {out_h}, w = {out_w}: the output of shape {} ({}) is too large to address",
            dims(&out),
            m.dtype.name()
        )));
    }
    let interp = match args.get("interp") {
        None => Interp::Linear,
        Some(ArgValue::Str(s)) => match s.to_bytes() {
            b"linear" => Interp::Linear,
            b"nearest" => Interp::Nearest,
            other => {
                return Err(Error::value(format!(
                    "resize: interp \"{}\" is not \"linear\" or \"nearest\"",
                    String::from_utf8_lossy(other)
                )));
            }
        },
        Some(_) => return Err(Error::type_error("resize: 'interp' must be a string")),
    };
    let (in_h, in_w) = (m.shape[axes.0], m.shape[axes.1]);
    if (in_h == 0 || in_w == 0) && m.shape[axes.2] > 0 {
        return Err(Error::value(format!(
            "resize of an empty image (shape {}) to {out_w}x{out_h}: there is nothing to sample",
            dims(&m.shape)
        )));
    }
    Ok(Plan {
        out_h,
        out_w,
        interp,
        axes,
    })
}

impl Plan {
    /// Whether the linear resize of an image of `shape` and `dtype` is OpenCV's 2 x 2
    /// area filter instead: an exact uint8 halving of pixels of other than 1, 3 or 4
    /// channels, whose block means OpenCV rounds half to even (for 1, 3 and 4 channels
    /// its vector path equals the linear blend). The pixel's channels, whatever the
    /// layout: a CHW image of 2 planes has 2-channel pixels.
    pub fn halves_by_area(&self, shape: &[i64], dtype: DType) -> bool {
        self.interp == Interp::Linear
            && dtype == DType::U8
            && self.out_h.checked_mul(2) == Some(shape[self.axes.0])
            && self.out_w.checked_mul(2) == Some(shape[self.axes.1])
            && !matches!(shape[self.axes.2], 1 | 3 | 4)
    }
}

/// The output shape.
pub fn out_shape(m: &TMeta, p: &Plan) -> Vec<i64> {
    let mut shape = m.shape.clone();
    shape[p.axes.0] = p.out_h;
    shape[p.axes.1] = p.out_w;
    shape
}

/// One axis of linear sampling: for each output coordinate the two source
/// coordinates and the second one's weight.
struct Taps {
    lo: Vec<usize>,
    hi: Vec<usize>,
    frac: Vec<f64>,
}

/// How taps are computed: OpenCV's way (coordinates in `f32`; columns clamp the
/// weight at the edges, rows keep it and clamp only the row index) for the types it
/// resizes, or exactly (`f64`, both axes clamped) for the others.
#[derive(Clone, Copy, PartialEq)]
enum TapRule {
    OpenCvColumns,
    OpenCvRows,
    Exact,
}

fn linear_taps(n_in: usize, n_out: usize, rule: TapRule) -> Taps {
    let scale = n_in as f64 / n_out as f64;
    let mut t = Taps {
        lo: Vec::with_capacity(n_out),
        hi: Vec::with_capacity(n_out),
        frac: Vec::with_capacity(n_out),
    };
    let last = n_in as i64 - 1;
    for d in 0..n_out {
        let f = (d as f64 + 0.5) * scale - 0.5;
        let (s, mut frac) = if rule == TapRule::Exact {
            (f.floor(), f - f.floor())
        } else {
            let f = f as f32;
            (f64::from(f.floor()), f64::from(f - f.floor()))
        };
        let s = s as i64;
        if rule != TapRule::OpenCvRows && (s < 0 || s >= last) {
            frac = 0.0;
        }
        t.lo.push(s.clamp(0, last) as usize);
        t.hi.push((s + 1).clamp(0, last) as usize);
        t.frac.push(frac);
    }
    t
}

fn nearest_taps(n_in: usize, n_out: usize) -> Vec<usize> {
    (0..n_out)
        .map(|d| {
            (((2 * d + 1) as u128 * n_in as u128 / (2 * n_out) as u128) as usize).min(n_in - 1)
        })
        .collect()
}

/// A compact image as `planes` planes of `h` rows of `w` pixels of `c` interleaved
/// channels (HWC: one plane of C channels; CHW: C planes of one channel).
#[derive(Clone, Copy)]
struct Geom {
    planes: usize,
    h: usize,
    w: usize,
    c: usize,
}

fn geom(shape: &[i64], (h_ax, w_ax, c_ax): (usize, usize, usize)) -> Geom {
    let (h, w, ch) = (
        shape[h_ax] as usize,
        shape[w_ax] as usize,
        shape[c_ax] as usize,
    );
    let (planes, c) = if c_ax == 2 { (1, ch) } else { (ch, 1) };
    Geom { planes, h, w, c }
}

/// The horizontal pass over one source row of `C`-channel pixels.
fn row_pass<B: Blend, const C: usize>(s: &[B::S], cols: &Taps, w: &[(B::W, B::W)], h: &mut [B::H]) {
    for (((px, &l), &r), &w) in h.chunks_exact_mut(C).zip(&cols.lo).zip(&cols.hi).zip(w) {
        let (a, b) = (&s[l * C..l * C + C], &s[r * C..r * C + C]);
        for k in 0..C {
            px[k] = B::horizontal(a[k], b[k], w);
        }
    }
}

/// Blends rows in a caller-chosen arithmetic: `H` is the horizontal pass's value type.
trait Blend: Sync {
    type S: Copy + Sync;
    type H: Copy + Default + Send;
    type O: Copy + Send;
    /// Weight of the second tap, in this arithmetic.
    type W: Copy + Sync;
    fn weights(frac: f64) -> (Self::W, Self::W);
    fn horizontal(a: Self::S, b: Self::S, w: (Self::W, Self::W)) -> Self::H;
    fn vertical(a: Self::H, b: Self::H, w: (Self::W, Self::W)) -> Self::O;
}

/// OpenCV's `uint8` weights of the two taps: `1 - frac` and `frac` in `f32`, scaled
/// by 2^11 and rounded.
fn u8_weights(frac: f64) -> (i16, i16) {
    let frac = frac as f32;
    let q = |v: f32| (v * 2048.0).round_ties_even() as i16;
    (q(1.0 - frac), q(frac))
}

/// OpenCV's fixed point for `uint8` as a [`Blend`]: weights scaled by 2^11, the row
/// pass in `i32`, the column pass as OpenCV's SIMD path rounds it. The plain
/// statement of what [`linear_u8`] computes, which the tests compare it with.
#[cfg(test)]
struct FixedU8;
#[cfg(test)]
impl Blend for FixedU8 {
    type S = u8;
    type H = i32;
    type O = u8;
    type W = i32;
    fn weights(frac: f64) -> (i32, i32) {
        let (w0, w1) = u8_weights(frac);
        (w0.into(), w1.into())
    }
    #[inline(always)]
    fn horizontal(a: u8, b: u8, w: (i32, i32)) -> i32 {
        a as i32 * w.0 + b as i32 * w.1
    }
    #[inline(always)]
    fn vertical(a: i32, b: i32, w: (i32, i32)) -> u8 {
        // OpenCV's vectorised rounding, which its x86 builds use for all but the
        // last few pixels of a row: each product's high half, then 2 bits.
        (((((a >> 4) * w.0) >> 16) + (((b >> 4) * w.1) >> 16) + 2) >> 2).clamp(0, 255) as u8
    }
}

macro_rules! float_blend {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Blend for $name {
            type S = $t;
            type H = $t;
            type O = $t;
            type W = $t;
            fn weights(frac: f64) -> ($t, $t) {
                (1.0 - frac as $t, frac as $t)
            }
            #[inline(always)]
            fn horizontal(a: $t, b: $t, w: ($t, $t)) -> $t {
                a * w.0 + b * w.1
            }
            #[inline(always)]
            fn vertical(a: $t, b: $t, w: ($t, $t)) -> $t {
                a * w.0 + b * w.1
            }
        }
    };
}
float_blend!(F32Blend, f32);
float_blend!(F64Blend, f64);

/// Integers other than `uint8`: each tap as `f64` (its `as` value), blended in `f64`
/// as [`F64Blend`] blends, rounded half to even and narrowed (a blend stays between
/// its taps, so it is in range). The same values as casting the image to `float64`,
/// resizing and casting back, without the two image-sized casts.
struct IntBlend<T>(std::marker::PhantomData<T>);
impl<T: Elem> Blend for IntBlend<T> {
    type S = T;
    type H = f64;
    type O = T;
    type W = f64;
    fn weights(frac: f64) -> (f64, f64) {
        F64Blend::weights(frac)
    }
    #[inline(always)]
    fn horizontal(a: T, b: T, w: (f64, f64)) -> f64 {
        F64Blend::horizontal(a.to_f64(), b.to_f64(), w)
    }
    #[inline(always)]
    fn vertical(a: f64, b: f64, w: (f64, f64)) -> T {
        T::from_f64(F64Blend::vertical(a, b, w).round_ties_even())
    }
}

/// Linear resize of `src` (compact, `g`) into `out` (compact, `out_h` x `out_w`).
fn linear<B: Blend>(
    src: &[B::S],
    g: Geom,
    out_h: usize,
    out_w: usize,
    exact: bool,
    out: &mut [B::O],
) -> Result<()> {
    let (cols, rows) = if exact {
        (TapRule::Exact, TapRule::Exact)
    } else {
        (TapRule::OpenCvColumns, TapRule::OpenCvRows)
    };
    let cols = linear_taps(g.w, out_w, cols);
    let rows = linear_taps(g.h, out_h, rows);
    let col_w: Vec<(B::W, B::W)> = cols.frac.iter().map(|&f| B::weights(f)).collect();
    let row_len = out_w * g.c;
    let src_row = g.w * g.c;
    let plane = g.h * src_row;
    // Work per output row: two horizontal passes and a blend.
    par::chunks_mut(out, row_len, row_len * 3, |first_row, piece| {
        let mut cache: [(usize, Vec<B::H>); 2] = [
            (usize::MAX, vec![B::H::default(); row_len]),
            (usize::MAX, vec![B::H::default(); row_len]),
        ];
        let pass = |y: usize, base: usize, h: &mut Vec<B::H>| {
            let s = &src[base + y * src_row..base + (y + 1) * src_row];
            match g.c {
                1 => row_pass::<B, 1>(s, &cols, &col_w, h),
                3 => row_pass::<B, 3>(s, &cols, &col_w, h),
                4 => row_pass::<B, 4>(s, &cols, &col_w, h),
                c => {
                    for (((px, &l), &r), &w) in h
                        .chunks_exact_mut(c)
                        .zip(&cols.lo)
                        .zip(&cols.hi)
                        .zip(&col_w)
                    {
                        let (a, b) = (&s[l * c..(l + 1) * c], &s[r * c..(r + 1) * c]);
                        for ((o, &x), &y) in px.iter_mut().zip(a).zip(b) {
                            *o = B::horizontal(x, y, w);
                        }
                    }
                }
            }
        };
        for (k, row) in piece.chunks_mut(row_len).enumerate() {
            let r = first_row + k;
            let (p, oy) = (r / out_h, r % out_h);
            let base = p * plane;
            let key = |y: usize| p * g.h + y;
            let (y0, y1) = (rows.lo[oy], rows.hi[oy]);
            // Keep whichever cached row is still needed, recompute the other.
            if cache[0].0 != key(y0) {
                if cache[1].0 == key(y0) {
                    cache.swap(0, 1);
                } else {
                    pass(y0, base, &mut cache[0].1);
                    cache[0].0 = key(y0);
                }
            }
            if cache[1].0 != key(y1) {
                pass(y1, base, &mut cache[1].1);
                cache[1].0 = key(y1);
            }
            let w = B::weights(rows.frac[oy]);
            let (h0, h1) = (&cache[0].1, &cache[1].1);
            for ((o, &a), &b) in row.iter_mut().zip(h0.iter()).zip(h1.iter()) {
                *o = B::vertical(a, b, w);
            }
        }
        Ok(())
    })
}

/// The columns of a `uint8` linear resize in OpenCV's fixed point: each output
/// pixel's source offset and, per output element, the two taps' weights.
struct U8Cols {
    /// `lo * c` of each pixel.
    offs: Vec<usize>,
    /// `hi * c` of each pixel.
    offs_hi: Vec<usize>,
    /// Pixels before this one read both taps in one load of [`u8_reach`] bytes at
    /// their offset (the rest read the two pixels apart).
    fast: usize,
    /// The taps' weights, per output element.
    w0: Vec<i16>,
    w1: Vec<i16>,
}

/// Bytes a fast pixel of `c` channels reads at its offset: both taps, as one 8-byte
/// word for 3 and 4 channels.
fn u8_reach(c: usize) -> usize {
    if c == 3 || c == 4 { 8 } else { 2 * c }
}

fn u8_cols(cols: &Taps, c: usize, n_in: usize) -> U8Cols {
    let weights: Vec<(i16, i16)> = cols.frac.iter().map(|&f| u8_weights(f)).collect();
    // Fast: the second tap is the pixel after the first, or weighs nothing (the pixel
    // after is then read and multiplied by 0), and the bytes read are in the row.
    let fast = cols
        .lo
        .iter()
        .zip(&cols.hi)
        .zip(&weights)
        .take_while(|&((&l, &r), w)| l * c + u8_reach(c) <= n_in * c && (r == l + 1 || w.1 == 0))
        .count();
    let each = |f: fn(&(i16, i16)) -> i16| -> Vec<i16> {
        weights
            .iter()
            .flat_map(|w| std::iter::repeat_n(f(w), c))
            .collect()
    };
    U8Cols {
        offs: cols.lo.iter().map(|&l| l * c).collect(),
        offs_hi: cols.hi.iter().map(|&r| r * c).collect(),
        fast,
        w0: each(|w| w.0),
        w1: each(|w| w.1),
    }
}

/// The horizontal pass of `K` `uint8` rows (`s`, into `h`), each blend shifted right
/// by 4 (all the vertical pass uses). `ab`: each row's scratch for its pixels' first
/// and second taps, one element longer than a row of `h`.
fn u8_rows_pass<const K: usize>(
    s: [&[u8]; K],
    c: usize,
    cols: &U8Cols,
    ab: &mut [(Vec<u8>, Vec<u8>); 2],
    h: [&mut [i16]; K],
) {
    match c {
        1 => u8_rows_pass_c::<1, K>(s, 1, cols, ab, h),
        3 => u8_rows_pass_c::<3, K>(s, 3, cols, ab, h),
        4 => u8_rows_pass_c::<4, K>(s, 4, cols, ab, h),
        c => u8_rows_pass_c::<0, K>(s, c, cols, ab, h),
    }
}

/// [`u8_rows_pass`] for `C`-channel pixels (`C` 0: `c`).
fn u8_rows_pass_c<const C: usize, const K: usize>(
    s: [&[u8]; K],
    c: usize,
    cols: &U8Cols,
    ab: &mut [(Vec<u8>, Vec<u8>); 2],
    h: [&mut [i16]; K],
) {
    let c = if C == 0 { c } else { C };
    let fast = &cols.offs[..cols.fast];
    if c == 3 || c == 4 {
        // One 8-byte load holds both taps; each is stored as 4 bytes (for 3 channels
        // the fourth is overwritten by the next pixel, or lands in the spare element).
        // The rows go together, so that their loads from memory overlap.
        for (px, &o) in fast.iter().enumerate() {
            let i = px * c;
            for (s, (a, b)) in s.iter().zip(ab.iter_mut()) {
                let v = u64::from_le_bytes(s[o..o + 8].try_into().unwrap());
                a[i..i + 4].copy_from_slice(&(v as u32).to_le_bytes());
                b[i..i + 4].copy_from_slice(&((v >> (8 * c)) as u32).to_le_bytes());
            }
        }
    } else {
        for (s, (a, b)) in s.iter().zip(ab.iter_mut()) {
            for ((pa, pb), &o) in a.chunks_exact_mut(c).zip(b.chunks_exact_mut(c)).zip(fast) {
                let p = &s[o..o + 2 * c];
                pa.copy_from_slice(&p[..c]);
                pb.copy_from_slice(&p[c..]);
            }
        }
    }
    let split = cols.fast * c;
    let rest = cols.offs[cols.fast..]
        .iter()
        .zip(&cols.offs_hi[cols.fast..]);
    for ((s, h), (a, b)) in s.iter().zip(h).zip(ab.iter_mut()) {
        for ((pa, pb), (&l, &r)) in a[split..]
            .chunks_exact_mut(c)
            .zip(b[split..].chunks_exact_mut(c))
            .zip(rest.clone())
        {
            pa.copy_from_slice(&s[l..l + c]);
            pb.copy_from_slice(&s[r..r + c]);
        }
        for ((((h, &a), &b), &w0), &w1) in
            h.iter_mut().zip(&*a).zip(&*b).zip(&cols.w0).zip(&cols.w1)
        {
            *h = ((i32::from(a) * i32::from(w0) + i32::from(b) * i32::from(w1)) >> 4) as i16;
        }
    }
}

/// The vertical pass of `uint8`: OpenCV's vectorised rounding: each product's high
/// half, then 2 bits (its x86 builds round so all but the last few pixels of a row).
/// `w0`, `w1`: the rows' weights, repeated per element (loaded in the loop, where the
/// compiler sees that they are 16-bit and multiplies in 16-bit lanes; a weight held in
/// a register it multiplies in 32-bit lanes, which SSE2 lacks).
fn u8_blend_rows(h0: &[i16], h1: &[i16], w0: &[i16], w1: &[i16], out: &mut [u8]) {
    for ((((o, &a), &b), &w0), &w1) in out.iter_mut().zip(h0).zip(h1).zip(w0).zip(w1) {
        let p = ((i32::from(a) * i32::from(w0)) >> 16) as i16;
        let q = ((i32::from(b) * i32::from(w1)) >> 16) as i16;
        *o = (p.wrapping_add(q).wrapping_add(2) >> 2).clamp(0, 255) as u8;
    }
}

/// [`linear`] with `FixedU8`'s arithmetic (the tests' statement of it), bit for bit,
/// in loops the compiler vectorises: the row pass gathers each pixel's two taps into
/// contiguous scratch and then blends whole rows, keeping `blend >> 4` (at most
/// 255 * 2049 / 16, an `i16`), the only bits the column pass uses; the column pass
/// multiplies in 16-bit lanes.
fn linear_u8(src: &[u8], g: Geom, out_h: usize, out_w: usize, out: &mut [u8]) -> Result<()> {
    let cols = linear_taps(g.w, out_w, TapRule::OpenCvColumns);
    let rows = linear_taps(g.h, out_h, TapRule::OpenCvRows);
    let cols = u8_cols(&cols, g.c, g.w);
    let row_len = out_w * g.c;
    let src_row = g.w * g.c;
    let plane = g.h * src_row;
    par::chunks_mut(out, row_len, row_len * 3, |first_row, piece| {
        let mut cache: [(usize, Vec<i16>); 2] = [
            (usize::MAX, vec![0; row_len]),
            (usize::MAX, vec![0; row_len]),
        ];
        let mut ab: [(Vec<u8>, Vec<u8>); 2] =
            std::array::from_fn(|_| (vec![0; row_len + 1], vec![0; row_len + 1]));
        // The rows' weights for a block of elements (see `u8_blend_rows`).
        let (mut wy0, mut wy1) = ([0i16; 256], [0i16; 256]);
        let src_rows = |base: usize, y: usize| &src[base + y * src_row..base + (y + 1) * src_row];
        for (k, row) in piece.chunks_mut(row_len).enumerate() {
            let r = first_row + k;
            let (p, oy) = (r / out_h, r % out_h);
            let base = p * plane;
            let key = |y: usize| p * g.h + y;
            let (y0, y1) = (rows.lo[oy], rows.hi[oy]);
            // Keep whichever cached row is still needed, recompute the others (two
            // different rows in one pass).
            if cache[0].0 != key(y0) && cache[1].0 == key(y0) {
                cache.swap(0, 1);
            }
            let [c0, c1] = &mut cache;
            if c0.0 != key(y0) && c1.0 != key(y1) && y0 != y1 {
                let s = [src_rows(base, y0), src_rows(base, y1)];
                u8_rows_pass(s, g.c, &cols, &mut ab, [&mut c0.1, &mut c1.1]);
            } else {
                if c0.0 != key(y0) {
                    u8_rows_pass([src_rows(base, y0)], g.c, &cols, &mut ab, [&mut c0.1]);
                }
                if c1.0 != key(y1) {
                    u8_rows_pass([src_rows(base, y1)], g.c, &cols, &mut ab, [&mut c1.1]);
                }
            }
            (c0.0, c1.0) = (key(y0), key(y1));
            let (w0, w1) = u8_weights(rows.frac[oy]);
            wy0.fill(w0);
            wy1.fill(w1);
            for ((o, h0), h1) in row
                .chunks_mut(wy0.len())
                .zip(cache[0].1.chunks(wy0.len()))
                .zip(cache[1].1.chunks(wy0.len()))
            {
                u8_blend_rows(h0, h1, &wy0, &wy1, o);
            }
        }
        Ok(())
    })
}
fn nearest<T: Copy + Send + Sync>(
    src: &[T],
    g: Geom,
    out_h: usize,
    out_w: usize,
    out: &mut [T],
) -> Result<()> {
    let cols = nearest_taps(g.w, out_w);
    let rows = nearest_taps(g.h, out_h);
    let offs: Vec<usize> = cols
        .iter()
        .flat_map(|&x| (0..g.c).map(move |k| x * g.c + k))
        .collect();
    let row_len = out_w * g.c;
    let src_row = g.w * g.c;
    par::chunks_mut(out, row_len, row_len, |first_row, piece| {
        for (k, row) in piece.chunks_mut(row_len).enumerate() {
            let r = first_row + k;
            let (p, oy) = (r / out_h, r % out_h);
            let start = p * g.h * src_row + rows[oy] * src_row;
            let s = &src[start..start + src_row];
            for (o, &i) in row.iter_mut().zip(&offs) {
                *o = s[i];
            }
        }
        Ok(())
    })
}

/// Each output pixel the mean of a 2 x 2 source block, rounded half to even.
fn halve_u8(src: &[u8], g: Geom, out: &mut [u8]) {
    let (row, c) = (g.w * g.c, g.c);
    let (oh, ow) = (g.h / 2, g.w / 2);
    for p in 0..g.planes {
        let plane = &src[p * g.h * row..(p + 1) * g.h * row];
        for y in 0..oh {
            let (r0, r1) = (&plane[2 * y * row..], &plane[(2 * y + 1) * row..]);
            let o = &mut out[(p * oh + y) * ow * c..(p * oh + y + 1) * ow * c];
            for (i, v) in o.iter_mut().enumerate() {
                let (x, k) = (i / c, i % c);
                let (a, b) = (2 * x * c + k, (2 * x + 1) * c + k);
                let q = r0[a] as u32 + r0[b] as u32 + r1[a] as u32 + r1[b] as u32;
                let (whole, rest) = (q >> 2, q & 3);
                *v = (whole + u32::from(rest > 2 || (rest == 2 && whole & 1 == 1))) as u8;
            }
        }
    }
}

fn resize_typed<T: Elem>(
    t: &Tensor,
    shape: &[i64],
    run: impl FnOnce(&[T], &mut [T]) -> Result<()>,
) -> Result<Tensor> {
    let src = typed::<T>(t)?;
    // Every kernel writes every output element.
    make_overwritten::<T>(shape, t.layout(), |out| run(&src, out))
}

/// A linear resize of an integer image other than `uint8` (see [`IntBlend`]).
fn linear_int<T: Elem>(
    t: &Tensor,
    shape: &[i64],
    g: Geom,
    (oh, ow): (usize, usize),
) -> Result<Tensor> {
    resize_typed::<T>(t, shape, |s, o| {
        linear::<IntBlend<T>>(s, g, oh, ow, true, o)
    })
}

/// Runs a checked resize.
pub fn run(t: &Tensor, p: &Plan) -> Result<Tensor> {
    let shape = out_shape(&TMeta::of(t), p);
    let g = geom(t.shape(), p.axes);
    let (oh, ow) = (p.out_h as usize, p.out_w as usize);
    if (oh, ow) == (g.h, g.w) {
        // Same size: every output pixel is its source pixel, exactly.
        return Ok(t.to_compact()?.with_layout(t.c_layout().to_owned()));
    }
    if g.planes * g.c == 0 {
        return kernels::with_elem!(t.dtype(), T => make::<T>(&shape, t.layout(), |_| Ok(())),
            bool => unreachable!("rejected by plan"));
    }
    if p.interp == Interp::Nearest {
        return kernels::with_elem!(t.dtype(), T => resize_typed::<T>(t, &shape,
            |s, o| nearest(s, g, oh, ow, o)),
            bool => unreachable!("rejected by plan"));
    }
    match t.dtype() {
        DType::U8 if p.halves_by_area(t.shape(), DType::U8) => {
            resize_typed::<u8>(t, &shape, |s, o| {
                halve_u8(s, g, o);
                Ok(())
            })
        }
        DType::U8 => resize_typed::<u8>(t, &shape, |s, o| linear_u8(s, g, oh, ow, o)),
        DType::F32 => {
            resize_typed::<f32>(t, &shape, |s, o| linear::<F32Blend>(s, g, oh, ow, false, o))
        }
        DType::F64 => {
            resize_typed::<f64>(t, &shape, |s, o| linear::<F64Blend>(s, g, oh, ow, true, o))
        }
        DType::F16 | DType::BF16 => {
            let wide = kernels::cast(t, DType::F32)?;
            let r = resize_typed::<f32>(&wide, &shape, |s, o| {
                linear::<F32Blend>(s, g, oh, ow, false, o)
            })?;
            kernels::cast(&r, t.dtype())
        }
        DType::I8 => linear_int::<i8>(t, &shape, g, (oh, ow)),
        DType::I16 => linear_int::<i16>(t, &shape, g, (oh, ow)),
        DType::I32 => linear_int::<i32>(t, &shape, g, (oh, ow)),
        DType::I64 => linear_int::<i64>(t, &shape, g, (oh, ow)),
        DType::U16 => linear_int::<u16>(t, &shape, g, (oh, ow)),
        DType::U32 => linear_int::<u32>(t, &shape, g, (oh, ow)),
        DType::U64 => linear_int::<u64>(t, &shape, g, (oh, ow)),
        DType::Bool => unreachable!("rejected by plan"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_follow_half_pixel_centres() {
        // 4 -> 2: centres at 0.5 and 2.5.
        let t = linear_taps(4, 2, TapRule::Exact);
        assert_eq!(
            (t.lo, t.hi, t.frac),
            (vec![0, 2], vec![1, 3], vec![0.5, 0.5])
        );
        // 2 -> 4: -0.25 clamps to 0; 1.25 is past the last pixel.
        let t = linear_taps(2, 4, TapRule::OpenCvColumns);
        assert_eq!(t.lo, vec![0, 0, 0, 1]);
        assert_eq!(t.frac, vec![0.0, 0.25, 0.75, 0.0]);
        // Rows keep the weight and clamp the index.
        let t = linear_taps(2, 4, TapRule::OpenCvRows);
        assert_eq!((t.lo, t.hi), (vec![0, 0, 0, 1], vec![0, 1, 1, 1]));
        assert_eq!(t.frac, vec![0.75, 0.25, 0.75, 0.25]);
        assert_eq!(nearest_taps(4, 2), vec![1, 3]);
        assert_eq!(nearest_taps(3, 7), vec![0, 0, 1, 1, 1, 2, 2]);
    }

    #[test]
    fn halving_rounds_block_means_half_to_even() {
        // One 2 x 2 block of 2-channel pixels: channel 0 sums to 6 (mean 1.5 -> 2),
        // channel 1 to 10 (mean 2.5 -> 2); a second plane sums to 7 and 1.
        let src = [0u8, 1, 1, 2, 2, 3, 3, 4, 1, 0, 2, 0, 2, 0, 2, 1];
        let g = Geom {
            planes: 2,
            h: 2,
            w: 2,
            c: 2,
        };
        let mut out = [0u8; 4];
        halve_u8(&src, g, &mut out);
        assert_eq!(out, [2, 2, 2, 0]);
    }

    #[test]
    fn uint8_blend_rounds_like_opencv() {
        let w = FixedU8::weights(0.5);
        assert_eq!(w, (1024, 1024));
        let h = FixedU8::horizontal(10, 11, w);
        assert_eq!(FixedU8::vertical(h, h, w), 11); // 10.5 rounds up at the end
    }

    #[test]
    fn uint8_kernel_equals_the_plain_fixed_point_blend() {
        // linear_u8 (contiguous 8-byte tap loads, 16-bit passes) against the plain
        // per-pixel statement, bit for bit: random pixels, 1 to 5 channels, one or two
        // planes, shrinking and growing, and 1- to 3-pixel edges where taps clamp.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let sizes = [(1, 1), (1, 3), (2, 1), (3, 2), (9, 40), (37, 5), (64, 64)];
        let outs = [(1, 1), (2, 7), (5, 3), (16, 16), (33, 100), (70, 9)];
        for (planes, c) in [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 1), (3, 1)] {
            for &(h, w) in &sizes {
                let g = Geom { planes, h, w, c };
                let src: Vec<u8> = (0..planes * h * w * c).map(|_| next() as u8).collect();
                for &(oh, ow) in &outs {
                    let n = planes * oh * ow * c;
                    let (mut want, mut got) = (vec![0u8; n], vec![1u8; n]);
                    linear::<FixedU8>(&src, g, oh, ow, false, &mut want).unwrap();
                    linear_u8(&src, g, oh, ow, &mut got).unwrap();
                    assert_eq!(got, want, "{planes} x {h} x {w} x {c} to {oh} x {ow}");
                }
            }
        }
    }

    /// `IntBlend<T>` against the route it replaces: the image cast to `f64`, resized
    /// with `F64Blend`, rounded half to even and cast back.
    fn int_blend_matches_the_f64_route<T: Elem>(bits: impl Fn(u64) -> T) {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (planes, h, w, c) in [(1, 5, 7, 3), (2, 9, 4, 1), (1, 1, 6, 2), (1, 40, 33, 1)] {
            let g = Geom { planes, h, w, c };
            let src: Vec<T> = (0..planes * h * w * c).map(|_| bits(next())).collect();
            let wide: Vec<f64> = src.iter().map(|v| v.to_f64()).collect();
            for (oh, ow) in [(3, 11), (13, 2), (1, 1), (20, 50)] {
                let n = planes * oh * ow * c;
                let mut want = vec![0f64; n];
                linear::<F64Blend>(&wide, g, oh, ow, true, &mut want).unwrap();
                let want: Vec<T> = want
                    .iter()
                    .map(|v| T::from_f64(v.round_ties_even()))
                    .collect();
                let mut got = vec![T::from_i128(0); n];
                linear::<IntBlend<T>>(&src, g, oh, ow, true, &mut got).unwrap();
                assert!(
                    got == want,
                    "{} {h} x {w} x {c} to {oh} x {ow}",
                    T::DTYPE.name()
                );
            }
        }
    }

    #[test]
    fn integer_blends_equal_the_float64_route() {
        int_blend_matches_the_f64_route::<i8>(|b| b as i8);
        int_blend_matches_the_f64_route::<u16>(|b| b as u16);
        int_blend_matches_the_f64_route::<i32>(|b| b as i32);
        int_blend_matches_the_f64_route::<u32>(|b| b as u32);
        int_blend_matches_the_f64_route::<i64>(|b| (b as i64) >> 23);
        int_blend_matches_the_f64_route::<u64>(|b| b >> 11);
    }

    /// An output height past half of i64 (the fuzz property's h = i64::MAX on a 1x1
    /// uint8 image) is not a halving, and asking does not overflow.
    #[test]
    fn a_huge_output_is_not_a_halving_and_does_not_overflow() {
        let p = Plan {
            out_h: i64::MAX,
            out_w: 1,
            interp: Interp::Linear,
            axes: (1, 2, 0),
        };
        assert!(!p.halves_by_area(&[1, 1, 1], DType::U8));
        let half = Plan {
            out_h: 1,
            out_w: 1,
            ..p
        };
        assert!(half.halves_by_area(&[2, 2, 2], DType::U8));
    }
}
