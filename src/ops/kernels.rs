//! CPU kernels of the built-in operators: simple loops over compact, typed slices.
//!
//! Inputs are read in place when compact and aligned (zero-copy), else compacted once.
//! Outputs are new compact host tensors. Integer arithmetic wraps like NumPy's.

use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::par;
use crate::error::{Error, Result};
use crate::tensor::{DType, Storage, Tensor, dims};

/// Element types the kernels compute on.
pub trait Elem: Pod + Copy + Send + Sync + PartialEq + PartialOrd + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// Whether this is an integer type.
    const INT: bool;
    /// The value as f64 (exact for floats and integers up to 2^53).
    fn to_f64(self) -> f64;
    /// The value as i128 (integers only; floats truncate).
    fn to_i128(self) -> i128;
    /// From f64: rounds for floats; for integers saturates (NaN gives 0), like Rust `as`.
    fn from_f64(v: f64) -> Self;
    /// From i128: wraps to the type's width for integers; rounds for floats.
    fn from_i128(v: i128) -> Self;
    /// Whether every value is exactly an `f32` (through [`Elem::to_f32`]).
    const F32_EXACT: bool;
    /// The value as f32 (exact when [`Elem::F32_EXACT`]).
    fn to_f32(self) -> f32;
    /// From f32: the same as [`Elem::from_f64`] of the value.
    fn from_f32(v: f32) -> Self;
    /// `dst[i] = src[i].to_f32()`.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    /// `dst[i] = Self::from_f32(src[i])`.
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
    /// `dst[i] = Self::from_f64(src[i])`.
    fn slice_from_f64(src: &[f64], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f64(s);
        }
    }
    /// Wrapping/IEEE addition.
    fn add(self, o: Self) -> Self;
    /// Wrapping/IEEE multiplication.
    fn mul(self, o: Self) -> Self;
    /// Floor division for integers (None on division by zero); IEEE division for floats.
    fn div(self, o: Self) -> Option<Self>;
    /// Wrapping/IEEE subtraction.
    fn sub(self, o: Self) -> Self;
    /// NumPy's `floor_divide` (None: integer division by zero).
    fn floordiv(self, o: Self) -> Option<Self>;
    /// NumPy's `remainder`, the sign of the divisor (None: integer modulo by zero).
    fn rem(self, o: Self) -> Option<Self>;
    /// NumPy's `power` (None: integer base with a negative integer exponent).
    fn pow(self, o: Self) -> Option<Self>;
    /// Wrapping negation.
    fn neg(self) -> Self;
    /// Wrapping absolute value.
    fn abs(self) -> Self;
    /// -1, 0 or 1 (+0.0 for either float zero, NaN for NaN).
    fn sign(self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
    /// Whether the value is finite.
    fn is_finite(self) -> bool;
    /// Whether the value is non-zero.
    fn truthy(self) -> bool;
}

/// NumPy's float `divmod` (npy_divmod), in f64: (floor quotient, remainder).
pub fn float_divmod(a: f64, b: f64) -> (f64, f64) {
    if b == 0.0 {
        return (a / b, f64::NAN);
    }
    let mut m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m += b;
            div -= 1.0;
        }
    } else {
        m = 0f64.copysign(b);
    }
    let q = if div != 0.0 {
        let f = div.floor();
        if div - f > 0.5 { f + 1.0 } else { f }
    } else {
        0f64.copysign(a / b)
    };
    (q, m)
}

macro_rules! int_elem {
    ($t:ty, $d:expr, $exact:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $d;
            const INT: bool = true;
            const F32_EXACT: bool = $exact;
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
                f32_to_int(src, dst);
            }
            fn slice_from_f64(src: &[f64], dst: &mut [Self]) {
                f64_to_int(src, dst);
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn from_i128(v: i128) -> Self {
                v as $t
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn div(self, o: Self) -> Option<Self> {
                self.floordiv(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn floordiv(self, o: Self) -> Option<Self> {
                if o == 0 {
                    return None;
                }
                // Floor division (NumPy's //); MIN / -1 wraps like NumPy.
                let q = self.wrapping_div(o);
                let r = self.wrapping_rem(o);
                #[allow(unused_comparisons)]
                let adjust = r != 0 && ((r < 0) != (o < 0));
                Some(if adjust { q.wrapping_sub(1) } else { q })
            }
            fn rem(self, o: Self) -> Option<Self> {
                if o == 0 {
                    return None;
                }
                let r = self.wrapping_rem(o);
                #[allow(unused_comparisons)]
                let adjust = r != 0 && ((r < 0) != (o < 0));
                Some(if adjust { r.wrapping_add(o) } else { r })
            }
            fn pow(self, o: Self) -> Option<Self> {
                #[allow(unused_comparisons)]
                if o < 0 {
                    return None;
                }
                let (mut base, mut exp, mut acc) = (self, o as u64, 1 as $t);
                while exp > 0 {
                    if exp & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    exp >>= 1;
                }
                Some(acc)
            }
            fn neg(self) -> Self {
                (0 as $t).wrapping_sub(self)
            }
            fn abs(self) -> Self {
                #[allow(unused_comparisons)]
                if self < 0 { Elem::neg(self) } else { self }
            }
            fn sign(self) -> Self {
                #[allow(unused_comparisons)]
                if self < 0 {
                    (0 as $t).wrapping_sub(1)
                } else if self == 0 {
                    0
                } else {
                    1
                }
            }
            fn is_nan(self) -> bool {
                false
            }
            fn is_finite(self) -> bool {
                true
            }
            fn truthy(self) -> bool {
                self != 0
            }
        }
    };
}

int_elem!(i8, DType::I8, true);
int_elem!(i16, DType::I16, true);
int_elem!(i32, DType::I32, false);
int_elem!(i64, DType::I64, false);
int_elem!(u8, DType::U8, true);
int_elem!(u16, DType::U16, true);
int_elem!(u32, DType::U32, false);
int_elem!(u64, DType::U64, false);

/// `dst[i] = src[i] as D` for an integer `D`: Rust's saturating conversion (toward
/// zero, clamped to `D`'s range, NaN to 0), which the compiler does not vectorise, in
/// branch-free `f32` and integer arithmetic that it does, for `D` of up to 32 bits
/// (64-bit `D` keep the scalar conversion). Equal to `as` for every `f32`.
///
/// Runs of 16: unsigned 8- and 16-bit `D` clamp in `f32` and take the floor; the
/// others take the truncation of magnitudes below 2^22 in the fewest steps, saturated
/// to `D` in the integers (the packing instructions saturate), and redo a run in the
/// exact general way when one of its values is NaN or not below 2^22 in magnitude.
#[inline(always)]
fn f32_to_int<D: Elem>(src: &[f32], dst: &mut [D]) {
    debug_assert!(D::INT);
    let len = src.len().min(dst.len());
    let (src, dst) = (&src[..len], &mut dst[..len]);
    if size_of::<D>() > 4 {
        // Widening to f64 is exact, and converts to D as the f32 does.
        return to_int64(src, dst, f64::from);
    }
    // D's limits rounded to f32: exact up to 16 bits; 2^31 and 2^32 for i32 and u32's
    // largest values.
    let (lo, hi) = (
        D::from_f32(f32::NEG_INFINITY).to_f32(),
        D::from_f32(f32::INFINITY).to_f32(),
    );
    let (src_runs, src_end) = src.as_chunks::<16>();
    let (dst_runs, dst_end) = dst.as_chunks_mut::<16>();
    if size_of::<D>() <= 2 && lo == 0.0 {
        // Only the low bits of the floor's f32 bits are kept: D's bits, as the
        // packing instructions take them without saturating.
        let mask = if size_of::<D>() == 1 { 0xff } else { 0xffff };
        for (s, d) in src_runs.iter().zip(dst_runs) {
            let mut n = [0u32; 16];
            for i in 0..16 {
                n[i] = unsigned_floor_bits(s[i], hi) & mask;
            }
            for i in 0..16 {
                d[i] = D::from_i128(i128::from(n[i]));
            }
        }
        for (d, &v) in dst_end.iter_mut().zip(src_end) {
            *d = D::from_i128(i128::from(unsigned_floor_bits(v, hi) & mask));
        }
        return;
    }
    // D's limits as i32 (u32's largest value is past every truncation below 2^22).
    let (min, max) = (
        D::from_f32(f32::NEG_INFINITY)
            .to_i128()
            .max(i128::from(i32::MIN)) as i32,
        D::from_f32(f32::INFINITY)
            .to_i128()
            .min(i128::from(i32::MAX)) as i32,
    );
    for (s, d) in src_runs.iter().zip(dst_runs) {
        let mut bits = [0u32; 16];
        for i in 0..16 {
            let (n, b) = trunc_below_2_22(s[i]);
            d[i] = D::from_i128(i128::from(n.clamp(min, max)));
            bits[i] = b;
        }
        // Every magnitude below 2^22 (none NaN) made a sum in [1.5 * 2^23, 2^24),
        // whose bits above the low 22 are those of M; any other sum sets another bit
        // of those (a larger sum, NaN) or is one of them (2^24 and up).
        if bits.iter().fold(0, |a, &b| a | b) >> 22 != M_BITS >> 22 {
            f32_to_int_exact(s, d);
        }
    }
    f32_to_int_exact(src_end, dst_end);
}

/// Adding M = 1.5 * 2^23 to a magnitude below 2^22 leaves its nearest integer in the
/// low mantissa bits (the ulp there is 1).
const M: f32 = 12_582_912.0;
const M_BITS: u32 = M.to_bits();

/// The bits of M plus the floor of `v` clamped to `[0, hi]` (NaN to 0), for `hi` below
/// 2^22.
#[inline(always)]
fn unsigned_floor_bits(v: f32, hi: f32) -> u32 {
    // NaN fails `v > 0.0` and so becomes 0 with the clamp.
    let c = if v > 0.0 { v } else { 0.0 };
    let c = if c < hi { c } else { hi };
    // The nearest integer, less one where that rounded up.
    let r = c + M;
    r.to_bits().wrapping_sub(u32::from(r - M > c))
}

/// `v` truncated toward zero when `|v|` is below 2^22, and the bits of `|v| + M`,
/// which say whether it was (see [`f32_to_int`]).
#[inline(always)]
fn trunc_below_2_22(v: f32) -> (i32, u32) {
    // The floor of the magnitude (its nearest integer, less one where that rounded
    // up) plus M's bits, given v's sign: `(u ^ s) - (M ^ s)` is `u - M` for s = 0 and
    // `M - u` for s = -1.
    let a = v.abs();
    let r = a + M;
    let u = r.to_bits().wrapping_sub(u32::from(r - M > a));
    let s = ((v.to_bits() as i32) >> 31) as u32;
    ((u ^ s).wrapping_sub(M_BITS ^ s) as i32, r.to_bits())
}

/// [`f32_to_int`] for any `f32`, for `D` of up to 32 bits, in branch-free arithmetic.
#[inline(always)]
fn f32_to_int_exact<D: Elem>(src: &[f32], dst: &mut [D]) {
    let (lo, hi) = (
        D::from_f32(f32::NEG_INFINITY).to_f32(),
        D::from_f32(f32::INFINITY).to_f32(),
    );
    if size_of::<D>() <= 2 {
        for (d, &v) in dst.iter_mut().zip(src) {
            let c = if v < lo { lo } else { v };
            let c = if c > hi { hi } else { c };
            // Truncation is the floor of the magnitude: the nearest integer, less one
            // where that rounded up.
            let a = c.abs();
            let r = a + M;
            let n = r.to_bits().wrapping_sub(M_BITS) as i32 - i32::from(r - M > a);
            let n = if c < 0.0 { -n } else { n };
            *d = D::from_i128(i128::from(if v.is_nan() { 0 } else { n }));
        }
        return;
    }
    // Magnitudes up to 2^32 (u32) are split into a multiple of 2^shift, the magnitude
    // rounded in the binade of `big` (where the ulp is 2^shift), and an exact rest of
    // at most 2^(shift - 1) either way, whose floor is taken as above.
    let big = 2.0 * if -lo > hi { -lo } else { hi }; // 2^32 (i32) or 2^33 (u32)
    let shift = (big.to_bits() >> 23) - 127 - 23;
    for (d, &v) in dst.iter_mut().zip(src) {
        let c = if v < lo { lo } else { v };
        let c = if c > hi { hi } else { c };
        let a = c.abs();
        let t = a + big;
        let units = t.to_bits().wrapping_sub(big.to_bits());
        let rest = a - (t - big);
        let r = rest + M;
        let floor_rest = r
            .to_bits()
            .wrapping_sub(M.to_bits())
            .wrapping_sub(u32::from(r - M > rest));
        let n = (units << shift).wrapping_add(floor_rest);
        let n = if c < 0.0 { n.wrapping_neg() } else { n };
        // `hi` is one past D's largest value, which wraps to D's smallest: step back.
        let n = if c >= hi { n.wrapping_sub(1) } else { n };
        // As D's bits (u32 to i32 wraps).
        *d = D::from_i128(i128::from(if v.is_nan() { 0 } else { n }));
    }
}

/// `dst[i] = src[i] as D` for an integer `D`, as [`f32_to_int`] for `f64`: runs of 8
/// whose magnitudes are all below 2^31 take the truncation in vectorised arithmetic,
/// saturated to `D` in the integers; other runs, 64-bit `D` and the end convert with
/// Rust's `as`.
#[inline(always)]
fn f64_to_int<D: Elem>(src: &[f64], dst: &mut [D]) {
    debug_assert!(D::INT);
    let len = src.len().min(dst.len());
    let (src, dst) = (&src[..len], &mut dst[..len]);
    if size_of::<D>() > 4 {
        return to_int64(src, dst, |v| v);
    }
    // D's limits as i32 (u32's largest value is past every truncation below 2^31).
    let (min, max) = (
        D::from_f64(f64::NEG_INFINITY)
            .to_i128()
            .max(i128::from(i32::MIN)) as i32,
        D::from_f64(f64::INFINITY)
            .to_i128()
            .min(i128::from(i32::MAX)) as i32,
    );
    let (src_runs, src_end) = src.as_chunks::<8>();
    let (dst_runs, dst_end) = dst.as_chunks_mut::<8>();
    for (s, d) in src_runs.iter().zip(dst_runs) {
        let mut bits = [0u64; 8];
        let mut n = [0i32; 8];
        for i in 0..8 {
            let (t, b) = trunc_below_2_31(s[i]);
            n[i] = t.clamp(min, max);
            bits[i] = b;
        }
        // As in f32_to_int: every magnitude below 2^31 (none NaN) made a sum whose
        // bits above the low 31 are those of M64; any other sum is larger.
        if bits.iter().fold(0, |a, &b| a | b) >> 31 == M64_BITS >> 31 {
            for (d, &n) in d.iter_mut().zip(&n) {
                *d = D::from_i128(i128::from(n));
            }
        } else {
            for (d, &v) in d.iter_mut().zip(s) {
                *d = D::from_f64(v);
            }
        }
    }
    for (d, &v) in dst_end.iter_mut().zip(src_end) {
        *d = D::from_f64(v);
    }
}

/// `dst[i] = wide(src[i]) as D` for a 64-bit integer `D` (`wide` gives an exact
/// f64): runs of 8 whose magnitudes are all below 2^51 take the truncation in
/// vectorised arithmetic (the floor of the magnitude, negated, or 0 for an unsigned
/// `D`, where the value is negative); other runs and the end convert with Rust's `as`
/// (which the compiler does not vectorise).
#[inline(always)]
fn to_int64<S: Copy, D: Elem>(src: &[S], dst: &mut [D], wide: impl Fn(S) -> f64) {
    debug_assert!(D::INT && size_of::<D>() == 8);
    let signed = D::from_f64(-1.0).to_i128() < 0;
    let (src_runs, src_end) = src.as_chunks::<8>();
    let (dst_runs, dst_end) = dst.as_chunks_mut::<8>();
    for (s, d) in src_runs.iter().zip(dst_runs) {
        let mut n = [0u64; 8];
        let mut bits = [0u64; 8];
        for i in 0..8 {
            let v = wide(s[i]);
            // The nearest integer to the magnitude in the low 51 bits of `r`, less
            // one where that rounded up.
            let a = v.abs();
            let r = a + M64;
            let u = r
                .to_bits()
                .wrapping_sub(u64::from(r - M64 > a))
                .wrapping_sub(M64_BITS);
            let neg = if signed { u.wrapping_neg() } else { 0 };
            n[i] = if v < 0.0 { neg } else { u };
            bits[i] = r.to_bits();
        }
        // Every magnitude below 2^51 (none NaN) made a sum in [1.5 * 2^52, 2^53),
        // whose bits above the low 51 are those of M64; any other sum is larger, or
        // NaN, and sets another bit of those.
        if bits.iter().fold(0, |a, &b| a | b) >> 51 == M64_BITS >> 51 {
            for (d, &n) in d.iter_mut().zip(&n) {
                *d = D::from_i128(i128::from(n as i64));
            }
        } else {
            for (d, &v) in d.iter_mut().zip(s) {
                *d = D::from_f64(wide(v));
            }
        }
    }
    for (d, &v) in dst_end.iter_mut().zip(src_end) {
        *d = D::from_f64(wide(v));
    }
}

/// M64 = 1.5 * 2^52: added to a magnitude below 2^51, it leaves its nearest integer in
/// the low mantissa bits.
const M64: f64 = 6_755_399_441_055_744.0;
const M64_BITS: u64 = M64.to_bits();

/// `v` truncated toward zero when `|v|` is below 2^31, and the bits of `|v| + M64`,
/// which say whether it was (see [`f64_to_int`]).
#[inline(always)]
fn trunc_below_2_31(v: f64) -> (i32, u64) {
    // The floor of the magnitude (its nearest integer, less one where that rounded
    // up) in the low 32 bits (M64's are 0), negated for a negative `v`.
    let a = v.abs();
    let r = a + M64;
    let u = r.to_bits().wrapping_sub(u64::from(r - M64 > a)) as u32;
    let s = ((v.to_bits() as i64) >> 63) as u32;
    ((u ^ s).wrapping_sub(s) as i32, r.to_bits())
}

macro_rules! float_elem {
    ($t:ty, $d:expr, $to:expr, $from:expr, $exact:expr, $to32:expr, $from32:expr $(, $extra:item)*) => {
        impl Elem for $t {
            const DTYPE: DType = $d;
            const INT: bool = false;
            const F32_EXACT: bool = $exact;
            fn to_f32(self) -> f32 {
                $to32(self)
            }
            fn from_f32(v: f32) -> Self {
                $from32(v)
            }
            $($extra)*
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn to_i128(self) -> i128 {
                $to(self) as i128
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn from_i128(v: i128) -> Self {
                // Rounded once: to f64 exactly (nearest), or, for the narrower types,
                // to odd first, which their rounding from f64 then takes to nearest as
                // if from `v` itself (`v as f64` then rounded again, 2^60 + 2^36 + 1
                // became 2^60 in f32, not 2^60 + 2^37).
                if $d == DType::F64 {
                    $from(v as f64)
                } else {
                    $from(int_round_to_odd(v))
                }
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Option<Self> {
                Some(self / o)
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn floordiv(self, o: Self) -> Option<Self> {
                Some($from(float_divmod($to(self), $to(o)).0))
            }
            fn rem(self, o: Self) -> Option<Self> {
                Some($from(float_divmod($to(self), $to(o)).1))
            }
            fn pow(self, o: Self) -> Option<Self> {
                Some($from($to(self).powf($to(o))))
            }
            fn neg(self) -> Self {
                $from(-$to(self))
            }
            fn abs(self) -> Self {
                $from($to(self).abs())
            }
            fn sign(self) -> Self {
                // NumPy's: both zeros give +0.0, NaN stays.
                let v = $to(self);
                $from(if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                })
            }
            // The types' own tests: no widening, so checked loops stay vectorised.
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn truthy(self) -> bool {
                $to(self) != 0.0
            }
        }
    };
}

float_elem!(
    f32,
    DType::F32,
    |v: f32| v as f64,
    |v: f64| v as f32,
    true,
    |v: f32| v,
    |v: f32| v
);
float_elem!(
    f64,
    DType::F64,
    |v: f64| v,
    |v: f64| v,
    false,
    |v: f64| v as f32,
    |v: f32| v as f64
);
// Slices of halves convert with the CPU's conversion instructions when it has them.
float_elem!(
    f16,
    DType::F16,
    f16::to_f64,
    f16_from_f64,
    true,
    f16::to_f32,
    f16::from_f32,
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    },
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
);
float_elem!(
    bf16,
    DType::BF16,
    bf16::to_f64,
    bf16_from_f64,
    true,
    bf16_to_f32,
    bf16_from_f32,
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        bf16_slice_to_f32(src, dst);
    }
);

/// `v` to `bfloat16`, rounded to nearest even; NaN keeps its sign and high payload bits
/// and is made quiet (as `half`'s `bf16::from_f32`, without branches).
fn bf16_from_f32(v: f32) -> bf16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
    let nan = (x & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if nan {
        (x >> 16) as u16 | 0x40
    } else {
        rounded
    })
}

/// `v` as `f32` (exact); NaN is made quiet (as `half`'s `bf16::to_f32`).
fn bf16_to_f32(v: bf16) -> f32 {
    f32::from_bits(u32::from(bf16_quiet_bits(v.to_bits())) << 16)
}

/// The bits `b` of a bfloat16, with the quiet bit set where it is NaN.
#[inline(always)]
fn bf16_quiet_bits(b: u16) -> u16 {
    b | (u16::from((b & 0x7fff) > 0x7f80) << 6)
}

/// [`bf16_to_f32`] of every element, in runs of 16: the NaN test on 8 halves at a
/// time, then the widening (a third faster than element by element).
fn bf16_slice_to_f32(src: &[bf16], dst: &mut [f32]) {
    let len = src.len().min(dst.len());
    let src: &[u16] = bytemuck::cast_slice(&src[..len]);
    let dst = &mut dst[..len];
    let (src_runs, src_end) = src.as_chunks::<16>();
    let (dst_runs, dst_end) = dst.as_chunks_mut::<16>();
    for (s, d) in src_runs.iter().zip(dst_runs) {
        let mut q = [0u16; 16];
        for i in 0..16 {
            q[i] = bf16_quiet_bits(s[i]);
        }
        for i in 0..16 {
            d[i] = f32::from_bits(u32::from(q[i]) << 16);
        }
    }
    for (d, &b) in dst_end.iter_mut().zip(src_end) {
        *d = f32::from_bits(u32::from(bf16_quiet_bits(b)) << 16);
    }
}

/// `v` rounded to `f32` toward zero, with the last bit set when that was inexact
/// ("round to odd"): rounding this to a format of at most 22 significant bits (half,
/// bfloat16) to nearest even gives the same result as rounding `v` once. (`half`'s
/// own `from_f64` rounds twice or looks at only the high 32 bits of the `f64`.)
fn f32_round_to_odd(v: f64) -> f32 {
    let t = v as f32;
    if v.is_nan() || f64::from(t) == v {
        return t;
    }
    // Inexact: step back toward zero if nearest rounding went away from it (this also
    // turns an overflow to infinity into f32::MAX), then mark the loss in the last bit.
    let mut bits = t.to_bits();
    if f64::from(t).abs() > v.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// The integer `v` rounded to `f64` toward zero, with the last bit set when that was
/// inexact ("round to odd", as [`f32_round_to_odd`]): rounding this to a type of at
/// most 51 significant bits (f32, and through [`f32_round_to_odd`] float16 and
/// bfloat16) to nearest even gives the same result as rounding `v` once.
#[inline(always)]
fn int_round_to_odd(v: i128) -> f64 {
    // The usual integers are doubles as they are.
    const EXACT: i128 = 1 << 53;
    if (-EXACT..=EXACT).contains(&v) {
        return v as i64 as f64;
    }
    // In 64-bit arithmetic (no i128 conversions, which are library calls) for every
    // integer of ours; round to odd is symmetric, so the magnitude's sign is put back.
    let m = v.unsigned_abs();
    let Ok(m) = u64::try_from(m) else {
        let t = v as f64;
        let back = t as i128; // exact below 2^127
        if back == v {
            return t;
        }
        let bits = t.to_bits() - u64::from(back.unsigned_abs() > v.unsigned_abs());
        return f64::from_bits(bits | 1);
    };
    // Truncated to 53 significant bits, the last one set when bits were dropped: a
    // value that converts exactly, in integer arithmetic without branches.
    let shift = 11u32.saturating_sub(m.leading_zeros());
    let dropped = (1u64 << shift) - 1;
    let sticky = u64::from(m & dropped != 0);
    let r = ((m & !dropped) | (sticky << shift)) as f64;
    if v < 0 { -r } else { r }
}

/// `v` to `float16`, rounded once to nearest even.
fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

/// `v` to `bfloat16`, rounded once to nearest even.
fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

/// Runs `$body` with `$T` bound to the element type of `$dtype` (bool excluded: the
/// caller decides what bool means for its operator).
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr, bool => $bool_body:expr) => {
        match $dtype {
            DType::Bool => $bool_body,
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::U16 => {
                type $T = u16;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::U64 => {
                type $T = u64;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

/// The elements of a tensor as a compact slice of `T` (through `Deref`): borrowed
/// from the tensor, or a compact copy in a buffer of ndx's host cache.
pub(crate) enum Elems<'a, T> {
    Borrowed(&'a [T]),
    Copied(Storage, std::marker::PhantomData<T>),
}

impl<T: Elem> std::ops::Deref for Elems<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Elems::Borrowed(s) => s,
            // An owned buffer: host memory aligned to 64 bytes, a whole number of `T`s.
            Elems::Copied(s, _) => bytemuck::cast_slice(s.host_bytes().unwrap_or_default()),
        }
    }
}

/// The elements of `t` as a compact slice of `T`: borrowed when possible, else
/// compacted once (strided, misaligned or not host memory).
pub(crate) fn typed<T: Elem>(t: &Tensor) -> Result<Elems<'_, T>> {
    debug_assert_eq!(std::mem::size_of::<T>(), t.dtype().itemsize());
    if t.nbytes() == 0 {
        return Ok(Elems::Borrowed(&[]));
    }
    if t.is_compact()
        && let Some((span, origin)) = t.host_span()
        && let Ok(s) = bytemuck::try_cast_slice::<u8, T>(&span[origin as usize..][..t.nbytes()])
    {
        return Ok(Elems::Borrowed(s));
    }
    Ok(Elems::Copied(t.compact_copy()?, std::marker::PhantomData))
}

/// A new compact tensor of `T` filled by `fill`, which receives zeroed elements.
pub(crate) fn make<T: Elem>(
    shape: &[i64],
    layout: &str,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    make_in(shape, layout, true, fill)
}

/// Like [`make`] for a `fill` that writes every element (the slice may hold a reused
/// buffer's old values).
pub(crate) fn make_overwritten<T: Elem>(
    shape: &[i64],
    layout: &str,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    make_in(shape, layout, false, fill)
}

fn make_in<T: Elem>(
    shape: &[i64],
    layout: &str,
    zeroed: bool,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    let layout = std::ffi::CString::new(layout).unwrap_or_default();
    let fill_bytes = |bytes: &mut [u8]| {
        if bytes.is_empty() {
            // An empty buffer has no aligned address to cast; there is nothing to fill.
            return fill(&mut []);
        }
        fill(bytemuck::cast_slice_mut(bytes))
    };
    if zeroed {
        Tensor::new_host(T::DTYPE, shape, layout, fill_bytes)
    } else {
        Tensor::new_host_overwritten(T::DTYPE, shape, layout, fill_bytes)
    }
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    if a == b {
        return Ok(a.to_vec());
    }
    let n = a.len().max(b.len());
    let mut out = vec![0i64; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::value(format!(
                    "shapes {} and {} cannot be broadcast together (dimension {i}: {da} vs {db})",
                    dims(a),
                    dims(b)
                )));
            }
        };
    }
    Ok(out)
}

/// Element strides of a compact `shape` broadcast to `out` (0 where broadcast).
pub(crate) fn broadcast_strides(shape: &[i64], out: &[i64]) -> Vec<usize> {
    let mut strides = vec![0usize; out.len()];
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        let o = i + out.len() - shape.len();
        if shape[i] != 1 {
            strides[o] = acc;
        }
        acc *= shape[i].max(0) as usize;
    }
    strides
}

/// Converts every element of `t` to `to`. Integers to integers wrap (two's
/// complement, like NumPy); floats to integers truncate toward zero and saturate, NaN
/// becomes 0; anything to bool is `value != 0`; bool is 0 or 1.
pub fn cast(t: &Tensor, to: DType) -> Result<Tensor> {
    if t.dtype() == to {
        return t.to_compact();
    }
    with_elem!(t.dtype(), S => cast_from::<S>(t, to), bool => {
        let src = t.compact_bytes()?;
        with_elem!(to, D => make_overwritten::<D>(t.shape(), t.layout(), |out| {
            let (zero, one) = (D::from_i128(0), D::from_i128(1));
            convert_pieces(&src, out, |s, o| {
                for (o, &v) in o.iter_mut().zip(s) {
                    *o = if v != 0 { one } else { zero };
                }
            })
        }), bool => unreachable!("bool to bool is handled above"))
    })
}

fn cast_from<S: Elem>(t: &Tensor, to: DType) -> Result<Tensor> {
    let src = typed::<S>(t)?;
    with_elem!(to, D => make_overwritten::<D>(t.shape(), t.layout(), |out| {
        convert_pieces(&src, out, convert_run::<S, D>)
    }), bool => make_overwritten::<u8>(t.shape(), t.layout(), |out| {
        convert_pieces(&src, out, |s, o| {
            for (o, &v) in o.iter_mut().zip(s) {
                *o = u8::from(v.truthy());
            }
        })
    }).map(|t| t.with_dtype_of_same_size(DType::Bool)))
}

/// Runs `run(src piece, out piece)` over matching pieces of `src` and `out`, across
/// the worker pool when they are large.
fn convert_pieces<S: Sync, D: Send>(
    src: &[S],
    out: &mut [D],
    run: impl Fn(&[S], &mut [D]) + Sync + Send,
) -> Result<()> {
    par::chunks_mut(out, 1, 1, |first, piece| {
        run(&src[first..first + piece.len()], piece);
        Ok(())
    })
}

/// `out[i] = src[i]` converted as [`cast`] documents.
pub(crate) fn convert_run<S: Elem, D: Elem>(src: &[S], out: &mut [D]) {
    if D::INT && S::DTYPE == DType::F32 {
        // As a slice, which converts in vectorised arithmetic.
        return D::slice_from_f32(bytemuck::cast_slice(src), out);
    }
    if D::INT && S::DTYPE == DType::F64 {
        return D::slice_from_f64(bytemuck::cast_slice(src), out);
    }
    if D::DTYPE == DType::F32 && S::F32_EXACT && !S::INT {
        // Halves widen as slices, straight into the output.
        return S::slice_to_f32(src, bytemuck::cast_slice_mut(out));
    }
    if S::F32_EXACT && (S::DTYPE == DType::F16 || D::DTYPE == DType::F16 || (!S::INT && D::INT)) {
        // Through f32 in blocks, so that halves and conversions of floats to integers
        // run as slices.
        let mut buf = [0f32; 256];
        for (s, o) in src.chunks(buf.len()).zip(out.chunks_mut(buf.len())) {
            let b = &mut buf[..s.len()];
            S::slice_to_f32(s, b);
            D::slice_from_f32(b, o);
        }
        return;
    }
    for (o, &v) in out.iter_mut().zip(src) {
        *o = convert::<S, D>(v);
    }
}

/// One element converted as [`cast`] documents, in the cheapest exact way for the
/// pair of types: integers wrap, and a value that is exactly an `f32` goes through
/// `f32` (the same result as through `f64`, in narrower arithmetic).
#[inline(always)]
fn convert<S: Elem, D: Elem>(v: S) -> D {
    if S::INT && D::INT {
        D::from_i128(v.to_i128())
    } else if S::INT && size_of::<S>() == 8 && D::DTYPE == DType::F32 {
        // Not through f64, which would round twice; Rust's `as` rounds once.
        D::from_f32(v.to_f32())
    } else if S::INT && size_of::<S>() == 8 && D::DTYPE != DType::F64 {
        // float16, bfloat16: rounded once from the exact integer.
        D::from_i128(v.to_i128())
    } else if S::F32_EXACT {
        D::from_f32(v.to_f32())
    } else {
        D::from_f64(v.to_f64())
    }
}

/// The integer `v` in the integer type `T`, saturated to `T`'s range (where a cast
/// would wrap).
pub(crate) fn saturate_int<T: Elem>(v: i128) -> T {
    debug_assert!(T::INT);
    let (min, max) = (
        T::from_f64(f64::NEG_INFINITY).to_i128(),
        T::from_f64(f64::INFINITY).to_i128(),
    );
    T::from_i128(v.clamp(min, max))
}

/// Adds one to every element (the `inject_accuracy_error` backend).
pub fn add_one(t: &Tensor) -> Result<Tensor> {
    with_elem!(t.dtype(), T => {
        let src = typed::<T>(t)?;
        make::<T>(t.shape(), t.layout(), |out| {
            for (o, &v) in out.iter_mut().zip(src.iter()) {
                *o = v.add(T::from_i128(1));
            }
            Ok(())
        })
    }, bool => {
        let src = t.compact_bytes()?;
        make::<u8>(t.shape(), t.layout(), |out| {
            out.iter_mut().for_each(|o| *o = 1);
            let _ = &src;
            Ok(())
        }).map(|o| o.with_dtype_of_same_size(DType::Bool))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::args::Args;

    fn t<T: Elem>(values: &[T], shape: &[i64]) -> Tensor {
        make::<T>(shape, "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })
        .unwrap()
    }

    fn vals<T: Elem>(t: &Tensor) -> Vec<T> {
        typed::<T>(t).unwrap().to_vec()
    }

    #[test]
    fn empty_outputs_of_wide_types_are_made_without_casting_an_empty_buffer() {
        let a = make::<f64>(&[0, 3], "", |_| Ok(())).unwrap();
        let b = make::<f64>(&[1, 3], "", |o| {
            o.fill(1.0);
            Ok(())
        })
        .unwrap();
        let c = crate::ops::builtin("add").map(|op| match &op.kernel {
            crate::ops::Kernel::Builtin(f) => f(&[&a, &b], &Args::new()).unwrap(),
            _ => unreachable!(),
        });
        assert_eq!(c.unwrap()[0].shape(), [0, 3]);
    }

    #[test]
    fn integer_division_floors_and_rejects_zero() {
        assert_eq!(7i32.div(2), Some(3));
        assert_eq!((-7i32).div(2), Some(-4));
        assert_eq!(7i32.div(-2), Some(-4));
        assert_eq!((-7i32).div(-2), Some(3));
        assert_eq!(i32::MIN.div(-1), Some(i32::MIN));
        assert_eq!(5u8.div(0), None);
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]).unwrap(), [2, 4, 3]);
        let e = broadcast_shapes(&[2, 3], &[4]).unwrap_err();
        assert!(
            e.message()
                .contains("shapes [2, 3] and [4] cannot be broadcast"),
            "{e}"
        );
    }

    #[test]
    fn casts_wrap_saturate_and_round() {
        let f = t::<f32>(&[1.7, -1.7, f32::NAN, 1e10, -0.0], &[5]);
        assert_eq!(
            vals::<i32>(&cast(&f, DType::I32).unwrap()),
            [1, -1, 0, i32::MAX, 0]
        );
        let i = t::<i32>(&[300, -1], &[2]);
        assert_eq!(vals::<u8>(&cast(&i, DType::U8).unwrap()), [44, 255]);
        let b = cast(&i, DType::Bool).unwrap();
        assert_eq!(b.dtype(), DType::Bool);
        assert_eq!(b.to_bytes().unwrap(), [1, 1]);
        let h = cast(&t::<f32>(&[0.1], &[1]), DType::F16).unwrap();
        assert_eq!(vals::<f16>(&h), [f16::from_f32(0.1)]);
    }

    #[test]
    fn doubles_to_integers_truncate_saturate_and_take_nan_to_zero() {
        let x = [
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            -0.9,
            2.9,
            -2.9,
            2_147_483_647.9,
            2_147_483_648.0,
            -2_147_483_648.9,
            -2_147_483_649.0,
            255.9,
            256.0,
            -1.0,
            1e300,
            9.3e18,
            -9.3e18,
            1.8e19,
            1.9e19,
        ];
        let f = t::<f64>(&x, &[x.len() as i64]);
        let (max, min) = (i32::MAX, i32::MIN);
        assert_eq!(
            vals::<i32>(&cast(&f, DType::I32).unwrap()),
            [
                0, 0, max, min, 0, 0, 2, -2, max, max, min, min, 255, 256, -1, max, max, min, max,
                max
            ]
        );
        assert_eq!(
            vals::<u8>(&cast(&f, DType::U8).unwrap()),
            [
                0, 0, 255, 0, 0, 0, 2, 0, 255, 255, 0, 0, 255, 255, 0, 255, 255, 0, 255, 255
            ]
        );
        let (max, min) = (i64::MAX, i64::MIN);
        assert_eq!(
            vals::<i64>(&cast(&f, DType::I64).unwrap()),
            [
                0,
                0,
                max,
                min,
                0,
                0,
                2,
                -2,
                2_147_483_647,
                2_147_483_648,
                -2_147_483_648,
                -2_147_483_649,
                255,
                256,
                -1,
                max,
                max,
                min,
                max,
                max
            ]
        );
        let u = vals::<u64>(&cast(&f, DType::U64).unwrap());
        assert_eq!(u[..4], [0, 0, u64::MAX, 0]);
        assert_eq!(
            u[14..],
            [
                0,
                u64::MAX,
                9_300_000_000_000_000_000,
                0,
                18_000_000_000_000_000_000,
                u64::MAX
            ]
        );
    }
}

#[cfg(test)]
mod cast_tests {
    use super::*;

    /// `src` converted to `D` by [`convert_run`] is, bit for bit, what the wide route
    /// gives: integers through i128, everything else through f64.
    fn check<S: Elem, D: Elem>(src: &[S]) {
        let mut out = vec![D::from_i128(0); src.len()];
        convert_run::<S, D>(src, &mut out);
        for (&v, o) in src.iter().zip(&out) {
            let want = if S::INT {
                D::from_i128(v.to_i128())
            } else {
                D::from_f64(v.to_f64())
            };
            assert_eq!(
                bytemuck::bytes_of(o),
                bytemuck::bytes_of(&want),
                "{} {:?} to {}",
                S::DTYPE.name(),
                bytemuck::bytes_of(&v),
                D::DTYPE.name()
            );
        }
    }

    /// Every other type (a cast to the same type copies).
    fn to_every_type<S: Elem>(src: &[S]) {
        for d in DType::ALL.into_iter().filter(|&d| d != S::DTYPE) {
            with_elem!(d, D => check::<S, D>(src), bool => {});
        }
    }

    #[test]
    fn typed_casts_equal_the_wide_route_bit_for_bit() {
        // Every 8- and 16-bit pattern.
        let bytes: Vec<u8> = (0..=u8::MAX).collect();
        to_every_type::<u8>(&bytes);
        to_every_type::<i8>(bytemuck::cast_slice(&bytes));
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        to_every_type::<u16>(&halves);
        to_every_type::<i16>(bytemuck::cast_slice(&halves));
        to_every_type::<f16>(bytemuck::cast_slice(&halves));
        to_every_type::<bf16>(bytemuck::cast_slice(&halves));
        // f32: patterns spread over every bit, and the edges: NaNs (quiet, signalling,
        // negative), infinities, -0.0, subnormals, the largest finite values, halfway
        // cases of bfloat16 and float16, and values at and past the integer limits.
        let mut f: Vec<u32> = (0..=u32::from(u16::MAX)).map(|i| i * 65537).collect();
        f.extend([
            0x7fc0_0000,
            0x7f80_0001,
            0xffc0_0001,
            0x7fff_ffff,
            0xff80_0000,
            0x7f80_0000,
            0x8000_0000,
            0x0000_0001,
            0x007f_ffff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x3f80_7fff,
            0x477f_f000,
            0x477f_efff,
            0x3380_0000,
            0x3380_0001,
            0x3300_0000,
        ]);
        f.extend(
            [
                0.5f32,
                1.5,
                2.5,
                -0.5,
                -1.5,
                255.5,
                256.0,
                -1.0,
                -0.9,
                65535.9,
                65536.0,
                -129.0,
                2_147_483_520.0,
                2_147_483_648.0,
                -2_147_483_904.0,
                4_294_967_296.0,
                9.223_372e18,
                1.844_674_4e19,
                -9.223_373e18,
            ]
            .map(f32::to_bits),
        );
        to_every_type::<f32>(bytemuck::cast_slice(&f));
        // The wide types: extremes and values that round when narrowed.
        let wide: Vec<u64> = [
            0,
            1,
            u64::MAX,
            i64::MAX as u64,
            i64::MIN as u64,
            (1 << 24) + 1,
            (1 << 53) + 1,
            u32::MAX as u64,
            0xffff_ff80_0000_0001,
            0x1234_5678_9abc_def0,
        ]
        .into_iter()
        .chain((0..4096u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
        to_every_type::<u64>(&wide);
        to_every_type::<i64>(bytemuck::cast_slice(&wide));
        let w32: Vec<u32> = wide.iter().map(|&v| (v >> 17) as u32).collect();
        to_every_type::<u32>(&w32);
        to_every_type::<i32>(bytemuck::cast_slice(&w32));
        let mut doubles: Vec<f64> = wide.iter().map(|&v| f64::from_bits(v)).collect();
        doubles.extend(f.iter().map(|&b| f64::from(f32::from_bits(b))));
        doubles.extend([1.0 + 2f64.powi(-8) + 2f64.powi(-40), 65519.999, -0.0, 1e300]);
        to_every_type::<f64>(&doubles);
    }
}

#[cfg(test)]
mod float_to_int_tests {
    use super::*;

    /// `src` to `D` by the slice conversion equals Rust's `as`, over every start and
    /// length up to 40 (vectorised bodies and their scalar ends).
    fn check<D: Elem>(src: &[f32]) {
        let want: Vec<D> = src.iter().map(|&v| D::from_f32(v)).collect();
        let mut out = vec![D::from_i128(0); src.len()];
        D::slice_from_f32(src, &mut out);
        for (i, (&v, (o, w))) in src.iter().zip(out.iter().zip(&want)).enumerate() {
            assert_eq!(
                bytemuck::bytes_of(o),
                bytemuck::bytes_of(w),
                "{} ({:#010x}) at {i} to {}",
                v,
                v.to_bits(),
                D::DTYPE.name()
            );
        }
        for start in 0..8.min(src.len()) {
            for len in 0..=40.min(src.len() - start) {
                let mut part = vec![D::from_i128(7); len];
                D::slice_from_f32(&src[start..start + len], &mut part);
                assert_eq!(
                    bytemuck::cast_slice::<D, u8>(&part),
                    bytemuck::cast_slice::<D, u8>(&want[start..start + len]),
                    "{} from {start}, {len} elements",
                    D::DTYPE.name()
                );
            }
        }
    }

    #[test]
    fn floats_to_integers_equal_rusts_saturating_as() {
        // NaNs, infinities, zeros, subnormals, the largest values, ties and near-ties,
        // and every integer type's limits with their neighbouring floats and halves.
        let mut v: Vec<f32> = vec![
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffff_ffff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            0.5,
            -0.5,
            0.999_999_94,
            -0.999_999_94,
            1.0,
            -1.0,
            1.5,
            -1.5,
            2.5,
            -2.5,
            3.5,
            -3.5,
            4_194_303.5,
            4_194_304.5,
            8_388_607.5,
            -8_388_607.5,
            8_388_608.0,
            16_777_215.0,
            16_777_216.0,
            1_000_192.0,
            1_000_448.5,
            -1_000_447.75,
        ];
        let limits = [
            i8::MIN as f32,
            i8::MAX as f32,
            u8::MAX as f32,
            i16::MIN as f32,
            i16::MAX as f32,
            u16::MAX as f32,
            i32::MIN as f32,
            i32::MAX as f32,
            u32::MAX as f32,
            i64::MIN as f32,
            i64::MAX as f32,
            u64::MAX as f32,
        ];
        for l in limits {
            for x in [l, -l] {
                v.extend([x, x - 0.5, x + 0.5, x - 1.0, x + 1.0, x - 0.25, x + 0.75]);
                v.extend([
                    f32::from_bits(x.to_bits() - 1),
                    f32::from_bits(x.to_bits() + 1),
                ]);
            }
        }
        // Values whose split into multiples of 512 or 1024 ties or rounds up.
        for k in [1u32, 3, 1000, 4_194_303, 4_194_304] {
            for d in [-256.5f32, -256.0, -255.5, 0.5, 255.5, 256.0, 256.5, 511.5] {
                let x = (k * 512) as f32 + d;
                v.extend([x, -x]);
            }
        }
        check::<i8>(&v);
        check::<u8>(&v);
        check::<i16>(&v);
        check::<u16>(&v);
        check::<i32>(&v);
        check::<u32>(&v);
        check::<i64>(&v);
        check::<u64>(&v);
    }
}

#[cfg(test)]
mod float_to_int_run_tests {
    use super::*;

    /// The next xorshift64 value.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// `src` from each of `starts` (so that runs fall differently) converted to `D` by
    /// the slice conversion `slice` equals the element conversion `one` (Rust's `as`)
    /// at every index.
    fn check_slice<S: Copy + std::fmt::Debug, D: Elem>(
        src: &[S],
        starts: [usize; 2],
        slice: fn(&[S], &mut [D]),
        one: fn(S) -> D,
    ) {
        // Every length up to 17 (no run, one, one and an end), then two starts.
        let short = (0..=17).map(|n| (0, n));
        for (start, n) in short.chain(starts.map(|s| (s, src.len() - s))) {
            let src = &src[start..start + n];
            let mut out = vec![D::from_i128(7); src.len()];
            slice(src, &mut out);
            for (i, (&v, o)) in src.iter().zip(&out).enumerate() {
                let want = one(v);
                assert!(
                    bytemuck::bytes_of(o) == bytemuck::bytes_of(&want),
                    "{v:?} at {i} to {}: {:?}, not {:?}",
                    D::DTYPE.name(),
                    bytemuck::bytes_of(o),
                    bytemuck::bytes_of(&want)
                );
            }
        }
    }

    /// `cast` of stepped and reversed views of float32 and float64 to int64 and
    /// uint64 equals Rust's `as` of each element the view shows, for lengths around
    /// the runs' ends, with values at the edges of the short way (2^51) and of the
    /// targets' ranges among them.
    #[test]
    fn casts_of_views_to_64_bit_integers_equal_rusts_as() {
        let edges = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            f64::from_bits(1),
            -0.5,
            2.5,
            -2.5,
            2f64.powi(51),
            2f64.powi(51) - 0.5,
            -(2f64.powi(51) - 1.0),
            2f64.powi(63),
            -(2f64.powi(63)),
            2f64.powi(64),
            -1.0,
        ];
        let mut x = 0x5851_f42d_4c95_7f2d_u64;
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 1003] {
            let vals: Vec<f64> = (0..3 * n + 1)
                .map(|i| {
                    let r = next(&mut x);
                    if i % 5 == 2 {
                        edges[(r % edges.len() as u64) as usize]
                    } else {
                        (r >> 11) as f64 / 2f64.powi(40) - 2048.0
                    }
                })
                .collect();
            let f64s =
                Tensor::new_host(DType::F64, &[vals.len() as i64], Default::default(), |b| {
                    b.copy_from_slice(bytemuck::cast_slice(&vals));
                    Ok(())
                })
                .unwrap();
            let f32s = cast(&f64s, DType::F32).unwrap();
            let n = n as i64;
            // Every 3rd element forward, and every 2nd backward from the end.
            let views = [
                (vec![n], vec![3], 0),
                (vec![n], vec![-2], 2 * (n - 1).max(0)),
            ];
            for (shape, strides, origin) in views {
                for src in [&f64s, &f32s] {
                    let v = src.restride(shape.clone(), strides.clone(), origin);
                    let wide = cast(&v, DType::F64).unwrap();
                    let want = typed::<f64>(&wide).unwrap();
                    let i = cast(&v, DType::I64).unwrap();
                    let u = cast(&v, DType::U64).unwrap();
                    let (i, u) = (typed::<i64>(&i).unwrap(), typed::<u64>(&u).unwrap());
                    for (k, &w) in want.iter().enumerate() {
                        let what =
                            format!("{w:?} at {k} of {n}, {} {strides:?}", src.dtype().name());
                        assert_eq!(i[k], w as i64, "int64: {what}");
                        assert_eq!(u[k], w as u64, "uint64: {what}");
                    }
                }
            }
        }
    }

    /// f32 `src` to `D` in runs of 16 (two starts) equals Rust's `as`.
    fn check<D: Elem>(src: &[f32]) {
        check_slice(src, [0, 5], D::slice_from_f32, D::from_f32);
    }

    #[test]
    fn runs_of_small_and_special_values_equal_rusts_saturating_as() {
        let mut v: Vec<f32> = Vec::with_capacity(3_000_000);
        // Every integer of magnitude up to 70000 (past every 8- and 16-bit limit), its
        // halves and quarters, and the floats next to it: runs converted in the short
        // way, where an off-by-one shows.
        for k in -70_000i32..=70_000 {
            let x = k as f32;
            v.extend([x, x + 0.5, x - 0.5, x + 0.25, x - 0.75]);
            v.extend([
                f32::from_bits(x.to_bits() + 1),
                f32::from_bits(x.to_bits().wrapping_sub(1)),
            ]);
        }
        // Every float within 64 steps of each power of two up to 2^64 (2^22 and 2^51,
        // where the short ways end, and the 32- and 64-bit limits), both signs.
        for e in 0..=64 {
            let p = 2f32.powi(e);
            for x in [p, -p] {
                v.extend((-64..=64).map(|d| f32::from_bits(x.to_bits().wrapping_add_signed(d))));
            }
        }
        // Random magnitudes below 2^23, mostly short runs, with every 37th value a
        // random pattern (NaNs, infinities and large values send their run the exact
        // way), and random patterns of every kind.
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffff_ffff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            f32::from_bits(1),
            f32::MAX,
            f32::MIN,
            4_194_304.0,
            -4_194_304.0,
            2_147_483_648.0,
            4_294_967_296.0,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..1_000_000 {
            let r = next(&mut x);
            v.push(if i % 37 == 36 {
                f32::from_bits(r as u32)
            } else if i % 101 == 100 {
                specials[(r % specials.len() as u64) as usize]
            } else {
                // Sign, and a value below 2^23 with any exponent.
                let mag = (r as u32) % 0x4b00_0000;
                f32::from_bits(mag | ((r >> 32) as u32 & 0x8000_0000))
            });
        }
        v.extend((0..500_000).map(|_| f32::from_bits(next(&mut x) as u32)));
        v.extend(specials);
        check::<i8>(&v);
        check::<u8>(&v);
        check::<i16>(&v);
        check::<u16>(&v);
        check::<i32>(&v);
        check::<u32>(&v);
        check::<i64>(&v);
        check::<u64>(&v);
    }

    /// f64 `src` to `D` in runs of 8 (two starts) equals Rust's `as`.
    fn check_doubles<D: Elem>(src: &[f64]) {
        check_slice(src, [0, 3], D::slice_from_f64, D::from_f64);
    }

    #[test]
    fn runs_of_doubles_equal_rusts_saturating_as() {
        let mut v: Vec<f64> = Vec::with_capacity(2_000_000);
        // Every integer of magnitude up to 70000, halves, quarters and neighbours.
        for k in -70_000i32..=70_000 {
            let x = f64::from(k);
            v.extend([x, x + 0.5, x - 0.5, x + 0.25, x - 0.75]);
            v.extend([
                f64::from_bits(x.to_bits() + 1),
                f64::from_bits(x.to_bits().wrapping_sub(1)),
            ]);
        }
        // Around each power of two up to 2^64 (2^31 and 2^51, where the short ways end,
        // and the 32- and 64-bit limits), both signs: neighbouring floats and integers
        // with fractions.
        for e in 0..=64 {
            let p = 2f64.powi(e);
            for x in [p, -p] {
                v.extend((-64..=64).map(|d| f64::from_bits(x.to_bits().wrapping_add_signed(d))));
                v.extend((-8..=8).map(|d| x + f64::from(d) * 0.375));
            }
        }
        let specials = [
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            f64::from_bits(1),
            f64::MAX,
            2_147_483_648.0,
            -2_147_483_649.0,
            4_294_967_296.0,
            1e300,
        ];
        // Random magnitudes below 2^32 with any exponent, with every 37th value a random
        // pattern and every 101st a special one, and random patterns of every kind.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..600_000 {
            let r = next(&mut x);
            v.push(if i % 37 == 36 {
                f64::from_bits(r)
            } else if i % 101 == 100 {
                specials[(r % specials.len() as u64) as usize]
            } else {
                let mag = (r & !(1 << 63)) % 0x41f0_0000_0000_0000;
                f64::from_bits(mag | (r & (1 << 63)))
            });
        }
        v.extend((0..300_000).map(|_| f64::from_bits(next(&mut x))));
        v.extend(specials);
        check_doubles::<i8>(&v);
        check_doubles::<u8>(&v);
        check_doubles::<i16>(&v);
        check_doubles::<u16>(&v);
        check_doubles::<i32>(&v);
        check_doubles::<u32>(&v);
        check_doubles::<i64>(&v);
        check_doubles::<u64>(&v);
    }

    #[test]
    fn bfloat16_slices_widen_as_each_element_does() {
        // Every pattern twice, from every start up to 16 (runs and their ends).
        let b: Vec<bf16> = (0..=u16::MAX)
            .chain(0..=u16::MAX)
            .map(bf16::from_bits)
            .collect();
        for start in 0..=16 {
            let src = &b[start..b.len() - 16 + start];
            let mut out = vec![7.0f32; src.len()];
            bf16::slice_to_f32(src, &mut out);
            for (&h, o) in src.iter().zip(&out) {
                assert_eq!(
                    o.to_bits(),
                    bf16_to_f32(h).to_bits(),
                    "{:#06x}",
                    h.to_bits()
                );
                assert_eq!(o.to_bits(), h.to_f32().to_bits(), "{:#06x}", h.to_bits());
            }
        }
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;

    #[test]
    fn wide_integers_to_narrow_floats_round_once() {
        // Just above the halfway point between two f32s: through f64 the 1 was lost
        // and the tie went to even (down), where rounding once goes up.
        let i = [
            (1i64 << 60) + (1 << 36) + 1,
            -(1i64 << 60) - (1 << 36) - 1,
            (1i64 << 53) + (1 << 29) + 1,
            (1i64 << 60) + (1 << 36), // a true tie: to even
            i64::MAX,
            i64::MIN,
        ];
        let x = make::<i64>(&[i.len() as i64], "", |o| {
            o.copy_from_slice(&i);
            Ok(())
        })
        .unwrap();
        let want: Vec<f32> = i.iter().map(|&v| v as f32).collect();
        assert_eq!(want[0], ((1u64 << 60) + (1 << 37)) as f32);
        assert_eq!(
            typed::<f32>(&cast(&x, DType::F32).unwrap())
                .unwrap()
                .to_vec(),
            want
        );
        let u = [
            (1u64 << 63) + (1 << 39) + 1,
            u64::MAX,
            (1u64 << 63) + (1 << 39),
        ];
        let y = make::<u64>(&[3], "", |o| {
            o.copy_from_slice(&u);
            Ok(())
        })
        .unwrap();
        let want: Vec<f32> = u.iter().map(|&v| v as f32).collect();
        assert_eq!(
            typed::<f32>(&cast(&y, DType::F32).unwrap())
                .unwrap()
                .to_vec(),
            want
        );
        // bfloat16 (8 significant bits): 2^62 + 2^54 + 1 is above the tie between 2^62
        // and 2^62 + 2^55; through f64 it was the tie itself, and went to 2^62.
        let b = make::<i64>(&[2], "", |o| {
            o.copy_from_slice(&[(1 << 62) + (1 << 54) + 1, (1 << 62) + (1 << 54)]);
            Ok(())
        })
        .unwrap();
        let got: Vec<u16> = typed::<bf16>(&cast(&b, DType::BF16).unwrap())
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, [0x5e81, 0x5e80]);
        assert_eq!(
            f32::from(bf16::from_bits(0x5e81)),
            ((1u64 << 62) + (1 << 55)) as f32
        );
    }

    #[test]
    fn integers_rounded_to_odd_then_to_f32_round_once() {
        // Rust's i128 `as f32` rounds once: the reference.
        let mut v: Vec<i128> = vec![0, 1, -1, i128::from(u64::MAX), -i128::from(u64::MAX)];
        v.extend([
            i128::from(i64::MIN),
            i128::from(i64::MAX),
            1 << 100,
            (1 << 100) + (1 << 76) + 1,
        ]);
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for k in 0..4000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Random magnitudes in every binade, and halfway points of f32 plus one.
            let m = i128::from(x >> (k % 64));
            let h = (1i128 << (24 + k % 40)) + (1i128 << (k % 40)) + i128::from(k % 3);
            v.extend([m, -m, h, -h]);
        }
        for &i in &v {
            assert_eq!(int_round_to_odd(i) as f32, i as f32, "{i}");
        }
    }

    #[test]
    fn narrowing_to_half_types_rounds_once() {
        let just_above_tie = f64::from(f32::from_bits(0x3f80_8001));
        assert_eq!(bf16_from_f64(just_above_tie).to_bits(), 0x3f81);
        assert_eq!(
            bf16_from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)).to_bits(),
            0x3f81
        );
        assert_eq!(bf16_from_f64(1.0 + 2f64.powi(-8)).to_bits(), 0x3f80); // a tie: to even
        assert_eq!(
            f16_from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-30)).to_bits(),
            0x3c01
        );
        assert!(bf16_from_f64(f64::MAX).is_infinite());
        assert!(bf16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(-0.0).to_bits(), 0x8000);
    }
}
