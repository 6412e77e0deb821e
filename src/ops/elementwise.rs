//! Elementwise operators with NumPy broadcasting and NEP 50 type promotion:
//! arithmetic, comparisons, logical operators, unary math, `clamp` and `where`.

use std::sync::Arc;

use super::kernels::{self, Elem, broadcast_shapes, make_overwritten, typed, with_elem};
use super::strided::{View, for_each_in, for_each_row};
use super::{ArgSpec, Kernel, OpDef, TMeta, par};
use crate::checks;
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, Args, Num};
use crate::tensor::{DType, Tensor};

/// The dtype NumPy 2 gives an operation on arrays of dtypes `a` and `b` (NEP 50).
pub fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let rank_int = |d: DType| match d {
        I8 => Some((true, 8)),
        I16 => Some((true, 16)),
        I32 => Some((true, 32)),
        I64 => Some((true, 64)),
        U8 => Some((false, 8)),
        U16 => Some((false, 16)),
        U32 => Some((false, 32)),
        U64 => Some((false, 64)),
        _ => None,
    };
    let int_of = |signed: bool, bits: u32| match (signed, bits) {
        (true, 8) => I8,
        (true, 16) => I16,
        (true, 32) => I32,
        (true, 64) => I64,
        (false, 8) => U8,
        (false, 16) => U16,
        (false, 32) => U32,
        (false, 64) => U64,
        _ => F64, // int64 with uint64
    };
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        _ => match (rank_int(a), rank_int(b)) {
            (Some((sa, ba)), Some((sb, bb))) => {
                if sa == sb {
                    int_of(sa, ba.max(bb))
                } else {
                    // Mixed signedness: a signed type wide enough for the unsigned one.
                    let (signed_bits, unsigned_bits) = if sa { (ba, bb) } else { (bb, ba) };
                    if signed_bits > unsigned_bits {
                        int_of(true, signed_bits)
                    } else {
                        int_of(true, unsigned_bits * 2)
                    }
                }
            }
            // bfloat16 holds every 8-bit integer exactly (ml_dtypes' rule).
            (Some((_, 8)), None) if b == BF16 => BF16,
            (None, Some((_, 8))) if a == BF16 => BF16,
            (Some(_), None) => promote(float_for(a), b),
            (None, Some(_)) => promote(a, float_for(b)),
            (None, None) => match (a, b) {
                (F16, BF16) | (BF16, F16) => F32,
                (F64, _) | (_, F64) => F64,
                (F32, _) | (_, F32) => F32,
                (F16, x) | (x, F16) => x,
                _ => BF16,
            },
        },
    }
}

/// The dtype NumPy 2 gives an operation on arrays of all of `dtypes` at once
/// (`np.result_type`), which is not a left-to-right fold of [`promote`]: int8, uint8
/// and float16 make float16, not float32 (through int16). Floats are folded first and
/// each integer then promotes against them; without floats the integers fold in any
/// order.
pub fn promote_all(dtypes: impl IntoIterator<Item = DType>) -> Option<DType> {
    let mut v: Vec<DType> = dtypes.into_iter().collect();
    v.sort_by_key(|d| match d {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => 0,
        DType::Bool => 2,
        _ => 1,
    });
    let first = *v.first()?;
    Some(v[1..].iter().fold(first, |acc, &d| promote(acc, d)))
}

/// The float type NumPy computes math functions of `d` in (the smallest float that
/// holds every value of an integer type; floats stay).
pub fn float_for(d: DType) -> DType {
    use DType::*;
    match d {
        Bool | I8 | U8 => F16,
        I16 | U16 => F32,
        I32 | U32 | I64 | U64 => F64,
        f => f,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
    Minimum,
    Maximum,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logic {
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unary {
    Neg,
    Abs,
    Sign,
    Relu,
    Floor,
    Ceil,
    Round,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Math {
    Sqrt,
    Rsqrt,
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
}

fn no_bool(op: &str, d: DType) -> Result<()> {
    if d == DType::Bool {
        return Err(Error::type_error(format!(
            "operator '{op}' does not support bool inputs"
        )));
    }
    Ok(())
}

/// The output's layout: that of the inputs of the output's shape that have one, when
/// they agree; none when they differ (`"HWC"` with `"CHW"`), or when none has one.
fn layout_of(inputs: &[&TMeta], shape: &[i64]) -> String {
    let mut given = inputs
        .iter()
        .filter(|m| m.shape == shape && !m.layout.is_empty())
        .map(|m| m.layout.as_str());
    match given.next() {
        Some(first) if given.all(|l| l == first) => first.to_string(),
        _ => String::new(),
    }
}

fn broadcast_all(inputs: &[&TMeta]) -> Result<Vec<i64>> {
    inputs
        .iter()
        .skip(1)
        .try_fold(inputs[0].shape.clone(), |acc, m| {
            broadcast_shapes(&acc, &m.shape)
        })
}

/// Output metadata of an n-ary elementwise op whose output dtype is `dtype`.
fn meta_out(inputs: &[&TMeta], dtype: DType) -> Result<Vec<TMeta>> {
    let shape = broadcast_all(inputs)?;
    let layout = layout_of(inputs, &shape);
    Ok(vec![TMeta {
        dtype,
        shape,
        layout,
    }])
}

/// `t` as `dtype` (a no-op view when it already is).
fn as_dtype(t: &Tensor, dtype: DType) -> Result<std::borrow::Cow<'_, Tensor>> {
    if t.dtype() == dtype {
        Ok(std::borrow::Cow::Borrowed(t))
    } else {
        kernels::cast(t, dtype).map(std::borrow::Cow::Owned)
    }
}

/// Names the output element an elementwise failure happened at.
fn at_element(e: Error, i: usize) -> Error {
    Error::new(e.kind(), format!("{} (output element {i})", e.message()))
}

/// `out[i] = f(a, b)` over broadcast inputs of one element type, read in place through
/// their strides.
fn zip2<T: Elem, O: Elem>(
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
    f: impl Fn(usize, T, T) -> Result<O> + Sync + Send,
) -> Result<Tensor> {
    let (va, vb) = (View::<T>::new(a, shape)?, View::<T>::new(b, shape)?);
    make_overwritten::<O>(shape, layout, |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            for_each_in(
                shape,
                first,
                piece.len(),
                [va.walk(), vb.walk()],
                |i, [x, y]| {
                    piece[i - first] = f(i, va.get(x), vb.get(y)).map_err(|e| at_element(e, i))?;
                    Ok(())
                },
            )
        })
    })
}

/// `out[i] = f(a, b)` for an operation that cannot fail, over broadcast inputs of one
/// element type read in place through their strides, a run of a row at a time: runs
/// where each input steps by 1 or 0 (compact rows, broadcast rows, a broadcast
/// scalar) are plain loops over slices, which the compiler vectorises; other strides
/// read element by element.
fn zip2_rows<T: Elem, O: Elem>(
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
    f: impl Fn(T, T) -> O + Sync + Send,
) -> Result<Tensor> {
    let (va, vb) = (View::<T>::new(a, shape)?, View::<T>::new(b, shape)?);
    make_overwritten::<O>(shape, layout, |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            let walks = [va.walk(), vb.walk()];
            for_each_row(shape, first, piece.len(), walks, |i, n, [x, y], steps| {
                let o = &mut piece[i - first..i - first + n];
                match steps {
                    [1, 1] => {
                        for ((o, &p), &q) in o.iter_mut().zip(va.run(x, n)).zip(vb.run(y, n)) {
                            *o = f(p, q);
                        }
                    }
                    [1, 0] => {
                        let q = vb.get(y);
                        for (o, &p) in o.iter_mut().zip(va.run(x, n)) {
                            *o = f(p, q);
                        }
                    }
                    [0, 1] => {
                        let p = va.get(x);
                        for (o, &q) in o.iter_mut().zip(vb.run(y, n)) {
                            *o = f(p, q);
                        }
                    }
                    [sx, sy] if sx > 0 && sy > 0 => {
                        // Stepped rows with gaps (`x[:, ::2]`): one bounds check per
                        // row, not per element.
                        let (px, py) =
                            (va.stepped(x, n, sx as usize), vb.stepped(y, n, sy as usize));
                        for ((o, &p), &q) in o.iter_mut().zip(px).zip(py) {
                            *o = f(p, q);
                        }
                    }
                    [sx, sy] => {
                        for (k, o) in o.iter_mut().enumerate() {
                            let k = k as isize;
                            *o = f(va.get(x + k * sx), vb.get(y + k * sy));
                        }
                    }
                }
                Ok(())
            })
        })
    })
}

/// `arith` by [`zip2_rows`] for the operations that cannot fail on `T` (and raise no
/// flag: the caller has checked that DIV is off); `None` for the others.
fn arith_rows<T: Elem>(
    op: Arith,
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
) -> Option<Result<Tensor>> {
    Some(match op {
        Arith::Add => zip2_rows::<T, T>(a, b, shape, layout, Elem::add),
        Arith::Sub => zip2_rows::<T, T>(a, b, shape, layout, Elem::sub),
        Arith::Mul => zip2_rows::<T, T>(a, b, shape, layout, Elem::mul),
        Arith::Div if !T::INT => {
            zip2_rows::<T, T>(a, b, shape, layout, |x, y| Elem::div(x, y).unwrap_or(x))
        }
        Arith::Minimum => zip2_rows::<T, T>(a, b, shape, layout, |x, y| {
            if Elem::is_nan(x) || x < y { x } else { y }
        }),
        Arith::Maximum => zip2_rows::<T, T>(a, b, shape, layout, |x, y| {
            if Elem::is_nan(x) || x > y { x } else { y }
        }),
        _ => return None,
    })
}

/// The check categories a fused kernel watches in its loop, with a tally for each.
struct Watch {
    tallies: Vec<(u32, checks::Tally)>,
}

impl Watch {
    /// The enabled ones of `categories` (none when checks are off), and tells the node
    /// that NAN, when among them, needs no separate pass.
    fn new(categories: &[u32]) -> Watch {
        if categories.contains(&checks::NAN) && checks::enabled(checks::NAN) {
            checks::nan_handled();
        }
        Watch {
            tallies: categories
                .iter()
                .filter(|&&c| checks::enabled(c))
                .map(|&c| (c, checks::Tally::new()))
                .collect(),
        }
    }
    /// The watch of an arithmetic kernel of `T` outputs (NAN for floats, and DIV too
    /// for a division) and the bits its loop ORs per element.
    fn arith<T: Elem>(division: bool) -> (Watch, impl Fn(T, T, T) -> u32 + Copy + Sync + Send) {
        let categories: &[u32] = match (T::INT, division) {
            (true, _) => &[],
            (false, false) => &[checks::NAN],
            (false, true) => &[checks::NAN, checks::DIV],
        };
        let watch = Watch::new(categories);
        let nan = watch.tallies.iter().any(|(c, _)| *c == checks::NAN);
        let div = watch.tallies.iter().any(|(c, _)| *c == checks::DIV);
        (watch, move |x: T, y: T, o: T| watch_bits(x, y, o, nan, div))
    }
    fn on(&self) -> bool {
        !self.tallies.is_empty()
    }
    /// After a piece whose loop OR-ed `bits`: counts, per raised category, the
    /// elements `0..n` (at `first` in the output) for which `bad(i)` has its bit.
    fn piece(&self, bits: u32, first: usize, n: usize, bad: impl Fn(usize) -> u32) {
        for (cat, tally) in &self.tallies {
            if bits & cat != 0 {
                tally.scan(first, n, |i| bad(i) & cat != 0);
            }
        }
    }
    /// Raises the flags of the categories that counted anything.
    fn raise(self) {
        for (cat, tally) in &self.tallies {
            checks::raise_tally(*cat, tally, |n| match *cat {
                checks::NAN => format!(
                    "{n} element{} became NaN or infinite from finite inputs",
                    if n == 1 { "" } else { "s" }
                ),
                _ => format!(
                    "{n} element{} divided by zero",
                    if n == 1 { "" } else { "s" }
                ),
            });
        }
    }
}

/// Category bits an element of a float operation raises: NAN when the output is not
/// finite though the inputs are, DIV when `div` and the divisor is zero.
#[inline(always)]
fn watch_bits<T: Elem>(x: T, y: T, o: T, nan: bool, div: bool) -> u32 {
    let new_nan = nan & !o.is_finite() & x.is_finite() & y.is_finite();
    let by_zero = div & (y == T::from_i128(0));
    (u32::from(new_nan) * checks::NAN) | (u32::from(by_zero) * checks::DIV)
}

/// The fast path of an operation that cannot fail: `out[i] = f(a[i], b[i])` when both
/// inputs have the output's shape, or with one of them a single element; a plain loop
/// over slices that the compiler vectorises, split across the pool when large. `None`
/// when the shapes need general broadcasting. With NAN (floats) or, for a division,
/// DIV checks on, the loop also ORs each element's flag bits; a piece that raised
/// any is counted again exactly (the rare path).
fn zip_fast<T: Elem>(
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
    division: bool,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Result<Option<Tensor>> {
    if a.dtype() != T::DTYPE || b.dtype() != T::DTYPE {
        // Float outputs only: each output type's loops and conversions are code (over
        // 1 MB for all ten), and integer promotions are cheap to cast first.
        if T::INT {
            return Ok(None);
        }
        return zip_fast_mixed(a, b, shape, layout, division, f);
    }
    let (full_a, full_b) = (a.shape() == shape, b.shape() == shape);
    let (one_a, one_b) = (a.numel() == 1, b.numel() == 1);
    if !((full_a || one_a) && (full_b || one_b)) || !a.is_compact() || !b.is_compact() {
        return Ok(None);
    }
    let (watch, bits) = Watch::arith::<T>(division);
    let t = if watch.on() {
        zip_fast_loop::<T, true>(a, b, shape, layout, &f, bits, &watch)?
    } else {
        zip_fast_loop::<T, false>(a, b, shape, layout, &f, bits, &watch)?
    };
    watch.raise();
    Ok(Some(t))
}

/// The loops of [`zip_fast`]. `CHECK` compiles the in-loop test in or out: an OR of
/// "the output is not finite", the one test both float categories need (a float
/// divided by zero is an infinity or NaN); a piece where it held is counted exactly
/// by `bits` afterwards.
fn zip_fast_loop<T: Elem, const CHECK: bool>(
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
    f: &(impl Fn(T, T) -> T + Sync + Send),
    bits: impl Fn(T, T, T) -> u32 + Sync + Send,
    watch: &Watch,
) -> Result<Tensor> {
    let (full_a, full_b) = (a.shape() == shape, b.shape() == shape);
    let (va, vb) = (typed::<T>(a)?, typed::<T>(b)?);
    let suspect = |_: T, o: T| CHECK && !o.is_finite();
    make_overwritten::<T>(shape, layout, |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            let r = first..first + piece.len();
            let mut any = false;
            match (full_a, full_b) {
                (true, true) => {
                    for ((o, &x), &y) in piece.iter_mut().zip(&va[r.clone()]).zip(&vb[r.clone()]) {
                        *o = f(x, y);
                        any |= suspect(y, *o);
                    }
                }
                (true, false) => {
                    let y = vb[0];
                    for (o, &x) in piece.iter_mut().zip(&va[r.clone()]) {
                        *o = f(x, y);
                        any |= suspect(y, *o);
                    }
                }
                (false, true) => {
                    let x = va[0];
                    for (o, &y) in piece.iter_mut().zip(&vb[r.clone()]) {
                        *o = f(x, y);
                        any |= suspect(y, *o);
                    }
                }
                (false, false) => {
                    let o = f(va[0], vb[0]);
                    piece.fill(o);
                    any |= suspect(vb[0], o);
                }
            }
            if any {
                let at = |v: &[T], full: bool, i: usize| if full { v[first + i] } else { v[0] };
                let bits_at = |i| bits(at(&va, full_a, i), at(&vb, full_b, i), piece[i]);
                let raised = (0..piece.len()).fold(0, |acc, i| acc | bits_at(i));
                watch.piece(raised, first, piece.len(), bits_at);
            }
            Ok(())
        })
    })
}

/// Reads a compact tensor's elements converted to `T`, as [`kernels::cast`] converts
/// them: `read(at, out)` fills `out` with the elements from index `at` on.
type Widened<'a, T> = Box<dyn Fn(usize, &mut [T]) + Sync + 'a>;

/// `t`'s elements as `T`, run by run (`None` for bool, which the cast route takes).
fn widened<T: Elem>(t: &Tensor) -> Result<Option<Widened<'_, T>>> {
    with_elem!(t.dtype(), S => {
        let v = typed::<S>(t)?;
        let read = move |at: usize, out: &mut [T]| {
            kernels::convert_run::<S, T>(&v[at..at + out.len()], out);
        };
        Ok(Some(Box::new(read) as Widened<'_, T>))
    }, bool => Ok(None))
}

/// [`zip_fast`] for inputs whose element types are not the (float) output's, both of
/// the output's shape: each piece converts runs of both inputs into buffers,
/// exactly as casting them first would, and combines those, rather than casting each
/// whole input to a new tensor first (float32 + int32 to float64, 1M elements: two
/// 8 MB temporaries written and read again). The same checks as [`zip_fast`]'s, on the
/// converted values. `None` for other shapes, views and bool inputs (the cast route).
fn zip_fast_mixed<T: Elem>(
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
    division: bool,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Result<Option<Tensor>> {
    if a.shape() != shape || b.shape() != shape || !a.is_compact() || !b.is_compact() {
        return Ok(None);
    }
    let (Some(wa), Some(wb)) = (widened::<T>(a)?, widened::<T>(b)?) else {
        return Ok(None);
    };
    let (watch, bits) = Watch::arith::<T>(division);
    let t = if watch.on() {
        zip_mixed_loop::<T, true>(&wa, &wb, shape, layout, &f, bits, &watch)?
    } else {
        zip_mixed_loop::<T, false>(&wa, &wb, shape, layout, &f, bits, &watch)?
    };
    watch.raise();
    Ok(Some(t))
}

/// The loops of [`zip_fast_mixed`], in runs of [`MIXED_RUN`] elements; `CHECK` as in
/// [`zip_fast_loop`] (a run where an output is not finite is counted exactly).
fn zip_mixed_loop<T: Elem, const CHECK: bool>(
    wa: &Widened<'_, T>,
    wb: &Widened<'_, T>,
    shape: &[i64],
    layout: &str,
    f: &(impl Fn(T, T) -> T + Sync + Send),
    bits: impl Fn(T, T, T) -> u32 + Sync + Send,
    watch: &Watch,
) -> Result<Tensor> {
    make_overwritten::<T>(shape, layout, |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            let zero = T::from_i128(0);
            let (mut xs, mut ys) = ([zero; MIXED_RUN], [zero; MIXED_RUN]);
            for (k, run) in piece.chunks_mut(MIXED_RUN).enumerate() {
                let at = first + k * MIXED_RUN;
                let (xs, ys) = (&mut xs[..run.len()], &mut ys[..run.len()]);
                wa(at, xs);
                wb(at, ys);
                let mut any = false;
                for ((o, &x), &y) in run.iter_mut().zip(xs.iter()).zip(ys.iter()) {
                    *o = f(x, y);
                    any |= CHECK && !o.is_finite();
                }
                if any {
                    let bits_at = |i: usize| bits(xs[i], ys[i], run[i]);
                    let raised = (0..run.len()).fold(0, |acc, i| acc | bits_at(i));
                    watch.piece(raised, at, run.len(), bits_at);
                }
            }
            Ok(())
        })
    })
}

/// Elements per run of [`zip_mixed_loop`]'s buffers (2 KiB each for float64).
const MIXED_RUN: usize = 256;

/// `arith` on the fast path, for the operations that cannot fail on `T`.
fn arith_fast<T: Elem>(
    op: Arith,
    a: &Tensor,
    b: &Tensor,
    shape: &[i64],
    layout: &str,
) -> Result<Option<Tensor>> {
    match op {
        Arith::Add => zip_fast::<T>(a, b, shape, layout, false, Elem::add),
        Arith::Sub => zip_fast::<T>(a, b, shape, layout, false, Elem::sub),
        Arith::Mul => zip_fast::<T>(a, b, shape, layout, false, Elem::mul),
        Arith::Div if !T::INT => zip_fast::<T>(a, b, shape, layout, true, |x, y| {
            Elem::div(x, y).unwrap_or(x)
        }),
        Arith::Minimum => zip_fast::<T>(a, b, shape, layout, false, |x, y| {
            if Elem::is_nan(x) || x < y { x } else { y }
        }),
        Arith::Maximum => zip_fast::<T>(a, b, shape, layout, false, |x, y| {
            if Elem::is_nan(x) || x > y { x } else { y }
        }),
        _ => Ok(None),
    }
}

fn as_bool(t: Tensor) -> Tensor {
    t.with_dtype_of_same_size(DType::Bool)
}

fn arith_kernel(op: Arith, name: &'static str, inputs: &[&Tensor]) -> Result<Tensor> {
    let metas = [TMeta::of(inputs[0]), TMeta::of(inputs[1])];
    let out = arith_infer(op, name, &[&metas[0], &metas[1]])?.remove(0);
    if inputs.iter().any(|t| t.dtype() != out.dtype) {
        // Promoted inputs of the output's shape convert run by run in the fast loop.
        let fast = with_elem!(out.dtype, T => arith_fast::<T>(op, inputs[0], inputs[1], &out.shape, &out.layout),
            bool => unreachable!("rejected at inference"))?;
        if let Some(t) = fast {
            return Ok(t);
        }
    }
    let (a, b) = (
        as_dtype(inputs[0], out.dtype)?,
        as_dtype(inputs[1], out.dtype)?,
    );
    let fast = with_elem!(out.dtype, T => arith_fast::<T>(op, &a, &b, &out.shape, &out.layout),
        bool => unreachable!("rejected at inference"))?;
    if let Some(t) = fast {
        return Ok(t);
    }
    // With DIV checked, a zero divisor raises a flag; an integer result is then 0.
    let divides = matches!(op, Arith::Div | Arith::FloorDiv | Arith::Mod);
    let div = Watch::new(if divides { &[checks::DIV] } else { &[] });
    if !div.on() {
        let rows = with_elem!(out.dtype, T => arith_rows::<T>(op, &a, &b, &out.shape, &out.layout),
            bool => unreachable!("rejected at inference"));
        if let Some(t) = rows {
            return t;
        }
    }
    let t = with_elem!(out.dtype, T => zip2::<T, T>(&a, &b, &out.shape, &out.layout, |i, x, y| {
        if div.on() && y == T::from_i128(0) {
            div.tallies[0].1.add(i as u64, 1);
            if T::INT {
                return Ok(T::from_i128(0));
            }
        }
        let r = match op {
            Arith::Add => Some(Elem::add(x, y)),
            Arith::Sub => Some(Elem::sub(x, y)),
            Arith::Mul => Some(Elem::mul(x, y)),
            Arith::Div => Elem::div(x, y),
            Arith::FloorDiv => Elem::floordiv(x, y),
            Arith::Mod => Elem::rem(x, y),
            Arith::Pow => Elem::pow(x, y),
            Arith::Minimum => Some(if Elem::is_nan(x) || x < y { x } else { y }),
            Arith::Maximum => Some(if Elem::is_nan(x) || x > y { x } else { y }),
        };
        r.ok_or_else(|| match op {
            Arith::Pow => Error::value("integers to negative integer powers are not allowed"),
            Arith::Mod => Error::value("integer modulo by zero"),
            _ => Error::value("integer division by zero"),
        })
    }), bool => unreachable!("rejected at inference"))?;
    div.raise();
    Ok(t)
}

fn arith_infer(op: Arith, name: &str, inputs: &[&TMeta]) -> Result<Vec<TMeta>> {
    let _ = op;
    no_bool(name, inputs[0].dtype)?;
    no_bool(name, inputs[1].dtype)?;
    meta_out(inputs, promote(inputs[0].dtype, inputs[1].dtype))
}

fn cmp_kernel(op: Cmp, inputs: &[&Tensor]) -> Result<Tensor> {
    let metas = [TMeta::of(inputs[0]), TMeta::of(inputs[1])];
    let refs = [&metas[0], &metas[1]];
    let common = promote(metas[0].dtype, metas[1].dtype);
    let out = meta_out(&refs, DType::Bool)?.remove(0);
    let integer = |d: DType| {
        use DType::*;
        matches!(d, I8 | I16 | I32 | I64 | U8 | U16 | U32 | U64)
    };
    if common == DType::F64 && metas.iter().all(|m| integer(m.dtype)) {
        return cmp_mixed_signs(op, inputs, &out);
    }
    let (a, b) = (as_dtype(inputs[0], common)?, as_dtype(inputs[1], common)?);
    fn rows<T: Elem>(
        op: Cmp,
        a: &Tensor,
        b: &Tensor,
        shape: &[i64],
        layout: &str,
    ) -> Result<Tensor> {
        // One loop per comparison, so that each vectorises.
        match op {
            Cmp::Eq => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x == y)),
            Cmp::Ne => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x != y)),
            Cmp::Lt => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x < y)),
            Cmp::Le => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x <= y)),
            Cmp::Gt => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x > y)),
            Cmp::Ge => zip2_rows::<T, u8>(a, b, shape, layout, |x, y| u8::from(x >= y)),
        }
    }
    let t = with_elem!(common, T => rows::<T>(op, &a, &b, &out.shape, &out.layout),
        bool => rows::<u8>(op, &a, &b, &out.shape, &out.layout))?;
    Ok(as_bool(t))
}

/// A comparison of `uint64` with a signed integer (whose promoted dtype, float64,
/// does not hold every value of either: 2^53 + 1 would equal 2^53), exactly, as
/// NumPy's `qQ` comparison loops do: the signed input as `int64`, and both read as
/// their 64-bit patterns, compared as the `i128` values they stand for.
fn cmp_mixed_signs(op: Cmp, inputs: &[&Tensor], out: &TMeta) -> Result<Tensor> {
    let signed = |t: &Tensor| t.dtype() != DType::U64;
    let (a_signed, b_signed) = (signed(inputs[0]), signed(inputs[1]));
    let bits = |t: &Tensor| -> Result<Tensor> {
        let wide = if signed(t) { DType::I64 } else { DType::U64 };
        Ok(as_dtype(t, wide)?
            .into_owned()
            .with_dtype_of_same_size(DType::U64))
    };
    let (a, b) = (bits(inputs[0])?, bits(inputs[1])?);
    let value = |x: u64, signed: bool| {
        if signed {
            i128::from(x as i64)
        } else {
            i128::from(x)
        }
    };
    let (shape, layout) = (&out.shape, &out.layout);
    let t = zip2_rows::<u64, u8>(&a, &b, shape, layout, move |x, y| {
        let (x, y) = (value(x, a_signed), value(y, b_signed));
        u8::from(match op {
            Cmp::Eq => x == y,
            Cmp::Ne => x != y,
            Cmp::Lt => x < y,
            Cmp::Le => x <= y,
            Cmp::Gt => x > y,
            Cmp::Ge => x >= y,
        })
    })?;
    Ok(as_bool(t))
}

fn logic_kernel(op: Logic, inputs: &[&Tensor]) -> Result<Tensor> {
    let metas = [TMeta::of(inputs[0]), TMeta::of(inputs[1])];
    let out = meta_out(&[&metas[0], &metas[1]], DType::Bool)?.remove(0);
    let (a, b) = (
        as_dtype(inputs[0], DType::Bool)?,
        as_dtype(inputs[1], DType::Bool)?,
    );
    let (shape, layout) = (&out.shape, &out.layout);
    let t = match op {
        Logic::And => {
            zip2_rows::<u8, u8>(&a, &b, shape, layout, |x, y| u8::from((x != 0) & (y != 0)))
        }
        Logic::Or => {
            zip2_rows::<u8, u8>(&a, &b, shape, layout, |x, y| u8::from((x != 0) | (y != 0)))
        }
        Logic::Xor => {
            zip2_rows::<u8, u8>(&a, &b, shape, layout, |x, y| u8::from((x != 0) != (y != 0)))
        }
    }?;
    Ok(as_bool(t))
}

/// `out[i] = f(t[i])`, split across the pool when large. A float output is watched
/// for NaN or infinities made from finite inputs in the same loop when NAN is checked.
fn map<T: Elem, O: Elem>(t: &Tensor, f: impl Fn(T) -> O + Sync + Send) -> Result<Tensor> {
    let watch = Watch::new(if O::INT { &[] } else { &[checks::NAN] });
    let out = if watch.on() {
        map_loop::<T, O, true>(t, f, &watch)
    } else {
        map_loop::<T, O, false>(t, f, &watch)
    }?;
    watch.raise();
    Ok(out)
}

/// The loop of [`map`]; `CHECK` compiles the NAN watch in or out.
fn map_loop<T: Elem, O: Elem, const CHECK: bool>(
    t: &Tensor,
    f: impl Fn(T) -> O + Sync + Send,
    watch: &Watch,
) -> Result<Tensor> {
    let bad = |v: T, o: O| u32::from(!o.is_finite() & v.is_finite()) * checks::NAN;
    if !t.is_compact() {
        // Strided: read in place, row by row.
        let (shape, src) = (t.shape(), View::<T>::new(t, t.shape())?);
        return make_overwritten::<O>(shape, t.layout(), |out| {
            par::chunks_mut(out, 1, 1, |first, piece| {
                let mut any = false;
                for_each_in(shape, first, piece.len(), [src.walk()], |i, [x]| {
                    let o = f(src.get(x));
                    piece[i - first] = o;
                    any |= CHECK && !o.is_finite();
                    Ok(())
                })?;
                if any {
                    let mut inputs = Vec::with_capacity(piece.len());
                    for_each_in(shape, first, piece.len(), [src.walk()], |_, [x]| {
                        inputs.push(src.get(x));
                        Ok(())
                    })?;
                    watch.piece(checks::NAN, first, piece.len(), |i| {
                        bad(inputs[i], piece[i])
                    });
                }
                Ok(())
            })
        });
    }
    let src = typed::<T>(t)?;
    make_overwritten::<O>(t.shape(), t.layout(), |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            let n = piece.len();
            let mut any = false;
            for (o, &v) in piece.iter_mut().zip(&src[first..first + n]) {
                *o = f(v);
                any |= CHECK && !o.is_finite();
            }
            if any {
                watch.piece(checks::NAN, first, n, |i| bad(src[first + i], piece[i]));
            }
            Ok(())
        })
    })
}

fn unary_kernel(op: Unary, t: &Tensor) -> Result<Tensor> {
    if let (DType::F16 | DType::BF16, Unary::Neg | Unary::Abs | Unary::Sign) = (t.dtype(), op) {
        return half_sign_bits(op, t);
    }
    with_elem!(t.dtype(), T => unary_typed::<T>(op, t), bool => unreachable!("rejected at inference"))
}

/// neg, abs and sign of float16 and bfloat16 on their bits (as `u16`), which
/// vectorises, instead of a conversion to f64 and back per element. The same bits as
/// that route: a NaN keeps its payload and comes back quiet (its sign flipped by neg,
/// cleared by abs, kept by sign); sign of either zero is +0 (NumPy's). None of these makes a
/// NaN or an infinity from a finite value, so there is nothing for the NAN check.
fn half_sign_bits(op: Unary, t: &Tensor) -> Result<Tensor> {
    let dtype = t.dtype();
    // The exponent all ones, and the quiet bit (the mantissa's highest); 1.0.
    let (inf, quiet, one): (u16, u16, u16) = if dtype == DType::F16 {
        (0x7c00, 0x0200, 0x3c00)
    } else {
        (0x7f80, 0x0040, 0x3f80)
    };
    let quieted = move |b: u16| if b & 0x7fff > inf { b | quiet } else { b };
    let bits = t.clone().with_dtype_of_same_size(DType::U16);
    let out = match op {
        Unary::Neg => map::<u16, u16>(&bits, move |b| quieted(b ^ 0x8000)),
        Unary::Abs => map::<u16, u16>(&bits, move |b| quieted(b & 0x7fff)),
        _ => map::<u16, u16>(&bits, move |b| {
            if b & 0x7fff == 0 {
                0
            } else {
                let s = (b & 0x8000) | one;
                if b & 0x7fff > inf { b | quiet } else { s }
            }
        }),
    }?;
    Ok(out.with_dtype_of_same_size(dtype))
}

/// One loop per operation (the choice is made once, not per element, so each loop
/// vectorises).
fn unary_typed<T: Elem>(op: Unary, t: &Tensor) -> Result<Tensor> {
    let zero = T::from_i128(0);
    // Without SSE4.1 (the x86-64 baseline) `f64::floor` and friends are calls into
    // libm; these are the same functions inline, exact for every f64.
    fn round_even(x: f64) -> f64 {
        const BIG: f64 = 4503599627370496.0; // 2^52: every f64 at least this is whole
        if x.abs() < BIG {
            // Adding 2^52 rounds to a whole number, to even (the default rounding).
            ((x.abs() + BIG) - BIG).copysign(x)
        } else {
            x
        }
    }
    // A whole result has the input's sign (floor(0.5) = 0, ceil(-0.5) = -0).
    fn floor(x: f64) -> f64 {
        let r = round_even(x);
        (if r > x { r - 1.0 } else { r }).copysign(x)
    }
    fn ceil(x: f64) -> f64 {
        let r = round_even(x);
        (if r < x { r + 1.0 } else { r }).copysign(x)
    }
    // float32 rounds in f32 (exact: the whole number nearest an f32 is one too, and
    // twice as many lanes as in f64); compact half types in blocks through f32 (per
    // element, their conversions to f32 measured slower than the f64 route).
    let narrow = T::DTYPE == DType::F32;
    match op {
        Unary::Floor | Unary::Ceil | Unary::Round if T::INT => map::<T, T>(t, |v| v),
        // A closure per operation (not one taking a function pointer), so that each
        // loop gets its own instance with the rounding inlined.
        Unary::Floor if narrow => map::<T, T>(t, |v| T::from_f32(floor_f32(v.to_f32()))),
        Unary::Ceil if narrow => map::<T, T>(t, |v| T::from_f32(ceil_f32(v.to_f32()))),
        Unary::Round if narrow => map::<T, T>(t, |v| T::from_f32(round_even_f32(v.to_f32()))),
        // Compact half types: whole blocks widened to f32 and narrowed back with the
        // slice conversions (exact, and vectorised where the CPU converts halves).
        Unary::Floor | Unary::Ceil | Unary::Round if T::F32_EXACT && t.is_compact() => {
            round_halves::<T>(t, op)
        }
        Unary::Floor => map::<T, T>(t, |v| T::from_f64(floor(v.to_f64()))),
        Unary::Ceil => map::<T, T>(t, |v| T::from_f64(ceil(v.to_f64()))),
        Unary::Round => map::<T, T>(t, |v| T::from_f64(round_even(v.to_f64()))),
        Unary::Neg => map::<T, T>(t, Elem::neg),
        Unary::Abs => map::<T, T>(t, Elem::abs),
        Unary::Sign => map::<T, T>(t, Elem::sign),
        Unary::Relu => map::<T, T>(
            t,
            move |v| {
                if Elem::is_nan(v) || v > zero { v } else { zero }
            },
        ),
    }
}

/// floor, ceil or round (`op`) of a compact float16 or bfloat16 tensor, in blocks
/// through f32 (exact: the whole number nearest such a value is one too). Rounding
/// makes no NaN or infinity from a finite value: nothing for the NAN check.
fn round_halves<T: Elem>(t: &Tensor, op: Unary) -> Result<Tensor> {
    const BLOCK: usize = 1024;
    let src = typed::<T>(t)?;
    make_overwritten::<T>(t.shape(), t.layout(), |out| {
        par::chunks_mut(out, 1, 1, |first, piece| {
            let mut buf = [0f32; BLOCK];
            for (i, o) in piece.chunks_mut(BLOCK).enumerate() {
                let at = first + i * BLOCK;
                let b = &mut buf[..o.len()];
                T::slice_to_f32(&src[at..at + o.len()], b);
                // A loop per rounding, chosen once per block.
                match op {
                    Unary::Floor => b.iter_mut().for_each(|v| *v = floor_f32(*v)),
                    Unary::Ceil => b.iter_mut().for_each(|v| *v = ceil_f32(*v)),
                    _ => b.iter_mut().for_each(|v| *v = round_even_f32(*v)),
                }
                T::slice_from_f32(b, o);
            }
            Ok(())
        })
    })
}

/// [`f32::round_ties_even`] inline (without SSE4.1 the library's is a call into libm),
/// exact for every f32. A NaN comes back as it is: a signalling one is not made quiet,
/// as the optimised f64 route did not either (LLVM narrowed it to this f32 code).
#[inline(always)]
fn round_even_f32(x: f32) -> f32 {
    const BIG: f32 = 8_388_608.0; // 2^23: every f32 at least this is whole
    if x.abs() < BIG {
        // Adding 2^23 rounds to a whole number, to even (the default rounding).
        ((x.abs() + BIG) - BIG).copysign(x)
    } else {
        x
    }
}

/// [`f32::floor`] inline, exact for every f32 (the sign as [`round_even_f32`]'s).
#[inline(always)]
fn floor_f32(x: f32) -> f32 {
    let r = round_even_f32(x);
    (if r > x { r - 1.0 } else { r }).copysign(x)
}

/// [`f32::ceil`] inline, exact for every f32.
#[inline(always)]
fn ceil_f32(x: f32) -> f32 {
    let r = round_even_f32(x);
    (if r < x { r + 1.0 } else { r }).copysign(x)
}

fn math_kernel(op: Math, t: &Tensor) -> Result<Tensor> {
    let dtype = float_for(t.dtype());
    let x = as_dtype(t, dtype)?;
    let f: fn(f64) -> f64 = match op {
        Math::Sqrt => f64::sqrt,
        Math::Rsqrt => |v| 1.0 / v.sqrt(),
        Math::Exp => f64::exp,
        Math::Log => f64::ln,
        Math::Sin => f64::sin,
        Math::Cos => f64::cos,
        Math::Tanh => f64::tanh,
        Math::Sigmoid => |v| 1.0 / (1.0 + (-v).exp()),
    };
    // Computed in f64 and rounded once to the output type.
    with_elem!(dtype, T => math_typed::<T>(&x, op, f), bool => unreachable!("floats only"))
}

/// A loop per math function; `sqrt` (the common one) gets its own instance so it
/// vectorises. For float32 it is taken in f32: square roots are correctly rounded, and
/// f64 has more than twice f32's precision plus two bits, so the f64 root rounded to
/// f32 is the f32 root (with twice the lanes).
fn math_typed<T: Elem>(x: &Tensor, op: Math, f: fn(f64) -> f64) -> Result<Tensor> {
    match op {
        Math::Sqrt if T::DTYPE == DType::F32 => map::<T, T>(x, |v| T::from_f32(v.to_f32().sqrt())),
        Math::Sqrt => map::<T, T>(x, |v| T::from_f64(Elem::to_f64(v).sqrt())),
        _ => map::<T, T>(x, move |v| T::from_f64(f(Elem::to_f64(v)))),
    }
}

fn predicate_kernel(name: &str, t: &Tensor) -> Result<Tensor> {
    let out = with_elem!(t.dtype(), T => map::<T, u8>(t, |v| u8::from(match name {
        "isnan" => Elem::is_nan(v),
        "isfinite" => Elem::is_finite(v),
        _ => !Elem::truthy(v),
    })), bool => map::<u8, u8>(t, |v| u8::from(match name {
        "isnan" => false,
        "isfinite" => true,
        _ => v == 0,
    })))?;
    Ok(as_bool(out))
}

fn clamp_bounds(args: &Args) -> Result<(Option<Num>, Option<Num>)> {
    let get = |name: &str| -> Result<Option<Num>> {
        match args.get(name) {
            None => Ok(None),
            Some(crate::exec::ArgValue::Float(v)) => Ok(Some(Num::Float(*v))),
            Some(crate::exec::ArgValue::Int(v)) => Ok(Some(Num::Int(*v))),
            Some(v) => Err(Error::type_error(format!(
                "argument '{name}' is {}, expected a float or an int",
                v.arg_type().a()
            ))),
        }
    };
    let (lo, hi) = (get("lo")?, get("hi")?);
    // A NaN bound has no meaning: integers took it as 0, floats ignored it.
    for (name, b) in [("lo", lo), ("hi", hi)] {
        if let Some(b) = b
            && b.is_nan()
        {
            return Err(Error::value(format!(
                "argument '{name}' is NaN, not a bound (leave it out for no bound)"
            )));
        }
    }
    if let (Some(l), Some(h)) = (lo, hi)
        && l.gt(h)
    {
        return Err(Error::value(format!(
            "clamp bounds are reversed: lo = {l} is greater than hi = {h}"
        )));
    }
    Ok((lo, hi))
}

/// For an integer dtype `lo` rounds up and `hi` down: bounds with no integer between
/// them (lo = 0.5, hi = 0.7) would clamp every value to the rounded `hi`, so they are
/// refused.
fn integer_bounds(dtype: DType, bounds: (Option<Num>, Option<Num>)) -> Result<()> {
    let int = matches!(
        dtype,
        DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
    );
    if let (true, (Some(l), Some(h))) = (int, bounds)
        && l.ceil_int() > h.floor_int()
    {
        return Err(Error::value(format!(
            "clamp bounds lo = {l} and hi = {h} hold no integer: for {} inputs lo rounds up to {} and hi down to {}",
            dtype.name(),
            l.ceil_int(),
            h.floor_int()
        )));
    }
    Ok(())
}

fn clamp_kernel(t: &Tensor, args: &Args) -> Result<Tensor> {
    let (lo, hi) = clamp_bounds(args)?;
    with_elem!(t.dtype(), T => {
        // Bounds in the element type: integers round inwards (lo up, hi down), exactly
        // (an int bound beyond 2^53 is not a double).
        let lo = lo.map(|l| if T::INT { kernels::saturate_int::<T>(l.ceil_int()) } else { T::from_f64(l.to_f64()) });
        let hi = hi.map(|h| if T::INT { kernels::saturate_int::<T>(h.floor_int()) } else { T::from_f64(h.to_f64()) });
        // A loop per pair of bounds, without branches (NaN compares false: it stays).
        match (lo, hi) {
            (Some(l), Some(h)) => map::<T, T>(t, move |v| {
                let v = if v < l { l } else { v };
                if v > h { h } else { v }
            }),
            (Some(l), None) => map::<T, T>(t, move |v| if v < l { l } else { v }),
            (None, Some(h)) => map::<T, T>(t, move |v| if v > h { h } else { v }),
            (None, None) => map::<T, T>(t, |v| v),
        }
    }, bool => Err(Error::type_error("operator 'clamp' does not support bool inputs")))
}

fn where_kernel(inputs: &[&Tensor]) -> Result<Tensor> {
    let metas: Vec<TMeta> = inputs.iter().map(|t| TMeta::of(t)).collect();
    let refs: Vec<&TMeta> = metas.iter().collect();
    let out = where_infer(&refs)?.remove(0);
    let cond = as_dtype(inputs[0], DType::Bool)?;
    let (a, b) = (
        as_dtype(inputs[1], out.dtype)?,
        as_dtype(inputs[2], out.dtype)?,
    );
    let shape = &out.shape;
    let c = View::<u8>::new(&cond, shape)?;
    fn pick<T: Elem>(
        c: &View<u8>,
        a: &Tensor,
        b: &Tensor,
        shape: &[i64],
        layout: &str,
    ) -> Result<Tensor> {
        let (va, vb) = (View::<T>::new(a, shape)?, View::<T>::new(b, shape)?);
        make_overwritten::<T>(shape, layout, |o| {
            par::chunks_mut(o, 1, 1, |first, piece| {
                let walks = [c.walk(), va.walk(), vb.walk()];
                for_each_in(shape, first, piece.len(), walks, |i, [z, x, y]| {
                    piece[i - first] = if c.get(z) != 0 { va.get(x) } else { vb.get(y) };
                    Ok(())
                })
            })
        })
    }
    with_elem!(out.dtype, T => pick::<T>(&c, &a, &b, shape, &out.layout),
        bool => pick::<u8>(&c, &a, &b, shape, &out.layout).map(as_bool))
}

fn where_infer(inputs: &[&TMeta]) -> Result<Vec<TMeta>> {
    meta_out(inputs, promote(inputs[1].dtype, inputs[2].dtype))
}

fn op(
    name: &str,
    n_inputs: usize,
    args: Vec<ArgSpec>,
    infer: super::InferFn,
    kernel: super::KernelFn,
) -> OpDef {
    OpDef {
        name: name.to_string(),
        n_inputs,
        n_outputs: 1,
        args,
        infer: Some(infer),
        kernel: Kernel::Builtin(kernel),
    }
}

/// The elementwise operators.
pub fn ops() -> Vec<OpDef> {
    let mut ops = Vec::new();
    let arith = [
        ("add", Arith::Add),
        ("sub", Arith::Sub),
        ("mul", Arith::Mul),
        ("div", Arith::Div),
        ("floordiv", Arith::FloorDiv),
        ("mod", Arith::Mod),
        ("pow", Arith::Pow),
        ("minimum", Arith::Minimum),
        ("maximum", Arith::Maximum),
    ];
    for (name, a) in arith {
        ops.push(op(
            name,
            2,
            vec![],
            Arc::new(move |i, _| arith_infer(a, name, i)),
            Arc::new(move |i, _| Ok(vec![arith_kernel(a, name, i)?])),
        ));
    }
    let cmps = [
        ("eq", Cmp::Eq),
        ("ne", Cmp::Ne),
        ("lt", Cmp::Lt),
        ("le", Cmp::Le),
        ("gt", Cmp::Gt),
        ("ge", Cmp::Ge),
    ];
    for (name, c) in cmps {
        ops.push(op(
            name,
            2,
            vec![],
            Arc::new(|i, _| meta_out(i, DType::Bool)),
            Arc::new(move |i, _| Ok(vec![cmp_kernel(c, i)?])),
        ));
    }
    for (name, l) in [
        ("logical_and", Logic::And),
        ("logical_or", Logic::Or),
        ("logical_xor", Logic::Xor),
    ] {
        ops.push(op(
            name,
            2,
            vec![],
            Arc::new(|i, _| meta_out(i, DType::Bool)),
            Arc::new(move |i, _| Ok(vec![logic_kernel(l, i)?])),
        ));
    }
    let unary = [
        ("neg", Unary::Neg),
        ("abs", Unary::Abs),
        ("sign", Unary::Sign),
        ("relu", Unary::Relu),
        ("floor", Unary::Floor),
        ("ceil", Unary::Ceil),
        ("round", Unary::Round),
    ];
    for (name, u) in unary {
        ops.push(op(
            name,
            1,
            vec![],
            Arc::new(move |i, _| {
                no_bool(name, i[0].dtype)?;
                Ok(vec![i[0].clone()])
            }),
            Arc::new(move |i, _| Ok(vec![unary_kernel(u, i[0])?])),
        ));
    }
    let math = [
        ("sqrt", Math::Sqrt),
        ("rsqrt", Math::Rsqrt),
        ("exp", Math::Exp),
        ("log", Math::Log),
        ("sin", Math::Sin),
        ("cos", Math::Cos),
        ("tanh", Math::Tanh),
        ("sigmoid", Math::Sigmoid),
    ];
    for (name, m) in math {
        ops.push(op(
            name,
            1,
            vec![],
            Arc::new(move |i, _| {
                no_bool(name, i[0].dtype)?;
                Ok(vec![TMeta {
                    dtype: float_for(i[0].dtype),
                    ..i[0].clone()
                }])
            }),
            Arc::new(move |i, _| Ok(vec![math_kernel(m, i[0])?])),
        ));
    }
    for name in ["isnan", "isfinite", "logical_not"] {
        ops.push(op(
            name,
            1,
            vec![],
            Arc::new(|i, _| {
                Ok(vec![TMeta {
                    dtype: DType::Bool,
                    ..i[0].clone()
                }])
            }),
            Arc::new(move |i, _| Ok(vec![predicate_kernel(name, i[0])?])),
        ));
    }
    let bound = |name: &str| ArgSpec {
        name: name.to_string(),
        ty: ArgType::Float,
        required: false,
    };
    ops.push(op(
        "clamp",
        1,
        vec![bound("lo"), bound("hi")],
        Arc::new(|i, args| {
            no_bool("clamp", i[0].dtype)?;
            integer_bounds(i[0].dtype, clamp_bounds(args)?)?;
            Ok(vec![i[0].clone()])
        }),
        Arc::new(|i, args| Ok(vec![clamp_kernel(i[0], args)?])),
    ));
    ops.push(op(
        "where",
        3,
        vec![],
        Arc::new(|i, _| where_infer(i)),
        Arc::new(|i, _| Ok(vec![where_kernel(i)?])),
    ));
    ops
}

#[cfg(test)]
mod tests {
    use super::kernels::make;
    use super::*;
    use crate::exec::ArgValue;
    use DType::*;

    #[test]
    fn promotion_follows_numpy() {
        assert_eq!(promote(I8, U8), I16);
        assert_eq!(promote(I64, U64), F64);
        assert_eq!(promote(I16, F16), F32);
        assert_eq!(promote(U8, F16), F16);
        assert_eq!(promote(I32, F32), F64);
        assert_eq!(promote(Bool, I8), I8);
        assert_eq!(promote(U32, I32), I64);
        assert_eq!(promote(U8, I64), I64);
        assert_eq!(promote(BF16, F16), F32);
        assert_eq!(promote(U8, BF16), BF16);
        assert_eq!(float_for(I16), F32);
    }

    fn i32s(values: &[i32], shape: &[i64]) -> Tensor {
        make::<i32>(shape, "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })
        .unwrap()
    }

    /// `add`, `maximum` and `lt` of stepped views with gaps (`x[:, ::s]`, rows
    /// stepped too, steps mixed, one view reversed) equal a plain element-by-element
    /// reference bit for bit, for rows of lengths around the unrolled loops' ends, with
    /// NaN, infinities, -0.0 and subnormals among the values.
    #[test]
    fn stepped_views_with_gaps_equal_a_plain_reference() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            f32::from_bits(1),
            -f32::from_bits(0x007f_ffff),
            2.5,
            -2.5,
            f32::MAX,
        ];
        let mut seed = 0x9e37_79b9_u32;
        for cols in [0i64, 1, 15, 16, 17, 1003] {
            for (sx, sy, rows_x) in [
                (2i64, 2i64, 1i64),
                (4, 4, 2),
                (2, 3, 1),
                (3, 1, 2),
                (2, -2, 1),
            ] {
                let rows = 3i64;
                let width = |s: i64| cols * s.abs() + 1;
                let mut base = |w: i64, h: i64| {
                    let n = (w * h) as usize;
                    let v: Vec<f32> = (0..n)
                        .map(|i| {
                            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            if i % 7 == 3 {
                                specials[(seed >> 8) as usize % specials.len()]
                            } else {
                                f32::from_bits(seed >> 2) - 1.0
                            }
                        })
                        .collect();
                    make::<f32>(&[n as i64], "", |o| {
                        o.copy_from_slice(&v);
                        Ok(())
                    })
                    .unwrap()
                };
                let (wx, wy) = (width(sx), width(sy));
                let bx = base(wx, rows * rows_x);
                let by = base(wy, rows);
                let vx = bx.restride(vec![rows, cols], vec![wx * rows_x, sx], 0);
                let origin_y = if sy < 0 { (cols - 1).max(0) * -sy } else { 0 };
                let vy = by.restride(vec![rows, cols], vec![wy, sy], origin_y);
                let (cx, cy) = (vx.to_compact().unwrap(), vy.to_compact().unwrap());
                let (x, y) = (typed::<f32>(&cx).unwrap(), typed::<f32>(&cy).unwrap());
                let what = format!("cols {cols}, steps {sx}/{sy}");
                let sum = arith_kernel(Arith::Add, "add", &[&vx, &vy]).unwrap();
                let want: Vec<u32> = x
                    .iter()
                    .zip(y.iter())
                    .map(|(a, b)| (a + b).to_bits())
                    .collect();
                let got: Vec<u32> = typed::<f32>(&sum)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, want, "add, {what}");
                let max = arith_kernel(Arith::Maximum, "maximum", &[&vx, &vy]).unwrap();
                let want: Vec<u32> = x
                    .iter()
                    .zip(y.iter())
                    .map(|(&a, &b)| if a.is_nan() || a > b { a } else { b }.to_bits())
                    .collect();
                let got: Vec<u32> = typed::<f32>(&max)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, want, "maximum, {what}");
                let lt = cmp_kernel(Cmp::Lt, &[&vx, &vy]).unwrap();
                let want: Vec<u8> = x
                    .iter()
                    .zip(y.iter())
                    .map(|(a, b)| u8::from(a < b))
                    .collect();
                assert_eq!(lt.compact_bytes().unwrap().to_vec(), want, "lt, {what}");
            }
        }
    }

    #[test]
    fn broadcasting_and_promotion_compute_numpy_values() {
        let a = i32s(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let col = i32s(&[100, 200], &[2, 1]);
        let c = arith_kernel(Arith::Add, "add", &[&a, &col]).unwrap();
        assert_eq!(
            typed::<i32>(&c).unwrap().to_vec(),
            [101, 102, 103, 204, 205, 206]
        );
        let f = kernels::cast(&i32s(&[1, 2, 3], &[3]), F16).unwrap();
        let m = arith_kernel(Arith::Mul, "mul", &[&a, &f]).unwrap();
        assert_eq!(m.dtype(), F64, "int32 with float16 promotes to float64");
        let e =
            arith_kernel(Arith::FloorDiv, "floordiv", &[&a, &i32s(&[1, 0, 1], &[3])]).unwrap_err();
        assert_eq!(e.message(), "integer division by zero (output element 1)");
        let lt = cmp_kernel(Cmp::Lt, &[&a, &i32s(&[3], &[1])]).unwrap();
        assert_eq!(
            (lt.dtype(), lt.to_bytes().unwrap()),
            (Bool, vec![1, 1, 0, 0, 0, 0])
        );
    }

    /// A tensor of `n` elements of `d`: values of every kind (through `f64`, as the
    /// cast converts them), NaN and infinities where `d` has them.
    fn mixed_values(d: DType, n: usize, seed: u64) -> Tensor {
        let mut x = seed;
        let v: Vec<f64> = (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match i % 11 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => -1e300,
                    3 => 0.0,
                    4 => (x % 1000) as f64 - 500.0,
                    5 => f64::from_bits(x),
                    _ => (x as i64 as f64) * 2f64.powi((x % 80) as i32 - 70),
                }
            })
            .collect();
        let t = make::<f64>(&[n as i64], "", |o| {
            o.copy_from_slice(&v);
            Ok(())
        })
        .unwrap();
        kernels::cast(&t, d).unwrap()
    }

    #[test]
    fn promoted_inputs_convert_run_by_run_as_casting_them_first_does() {
        let ops = [
            (Arith::Add, "add"),
            (Arith::Sub, "sub"),
            (Arith::Mul, "mul"),
            (Arith::Div, "div"),
            (Arith::Minimum, "minimum"),
            (Arith::Maximum, "maximum"),
        ];
        let pairs = [
            (F32, I32),
            (I32, F32),
            (F32, F16),
            (BF16, F16),
            (U8, I8),
            (U64, I64),
            (F64, U32),
        ];
        // Small, and past the size split across the pool, neither a multiple of a run.
        for n in [1001, par::MIN_WORK + 777] {
            for (da, db) in pairs {
                let (a, b) = (mixed_values(da, n, 1), mixed_values(db, n, 2));
                let common = promote(da, db);
                let (ca, cb) = (
                    kernels::cast(&a, common).unwrap(),
                    kernels::cast(&b, common).unwrap(),
                );
                for (op, name) in ops {
                    if !matches!(common, F16 | BF16 | F32 | F64) && op == Arith::Div {
                        continue;
                    }
                    let got = arith_kernel(op, name, &[&a, &b]).unwrap();
                    let want = arith_kernel(op, name, &[&ca, &cb]).unwrap();
                    assert_eq!(got.dtype(), common);
                    assert!(
                        got.to_bytes().unwrap() == want.to_bytes().unwrap(),
                        "{name} of {da:?} and {db:?}, {n} elements"
                    );
                }
            }
        }
    }

    fn clamp_of<T: Elem>(
        values: &[T],
        lo: Option<ArgValue>,
        hi: Option<ArgValue>,
    ) -> Result<Vec<T>> {
        let x = make::<T>(&[values.len() as i64], "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })?;
        let mut args = Args::new();
        for (name, v) in [("lo", lo), ("hi", hi)] {
            if let Some(v) = v {
                args = args.with(name, v);
            }
        }
        Ok(typed::<T>(&clamp_kernel(&x, &args)?)?.to_vec())
    }

    #[test]
    fn clamp_keeps_int_bounds_exact_for_int64_and_uint64() {
        use ArgValue::{Float, Int};
        let big = (1i64 << 53) + 1;
        // Through f64 the bound 2^53 + 1 was 2^53: 2^53 + 1 came out as 2^53.
        assert_eq!(
            clamp_of::<i64>(
                &[big, big + 1, -big - 1, 0],
                Some(Int(-big)),
                Some(Int(big))
            )
            .unwrap(),
            [big, big, -big, 0]
        );
        assert_eq!(
            clamp_of::<u64>(&[u64::MAX, 1 << 60], Some(Int(big)), Some(Int(i64::MAX))).unwrap(),
            [i64::MAX as u64, 1 << 60]
        );
        // A bound outside the type saturates; float bounds round inwards.
        assert_eq!(
            clamp_of::<u8>(&[0, 7, 255], Some(Int(-5)), Some(Int(300))).unwrap(),
            [0, 7, 255]
        );
        assert_eq!(
            clamp_of::<i64>(
                &[i64::MIN, i64::MAX, 3],
                Some(Float(-1e300)),
                Some(Float(2.5))
            )
            .unwrap(),
            [i64::MIN, 2, 2]
        );
        // A NaN bound is refused (an integer lo of NaN was 0: -5 became 0).
        let e = clamp_of::<i32>(&[-5, 3], Some(Float(f64::NAN)), None).unwrap_err();
        assert_eq!(
            e.message(),
            "argument 'lo' is NaN, not a bound (leave it out for no bound)"
        );
        let e = clamp_of::<f32>(&[-5.0], None, Some(Float(f64::NAN))).unwrap_err();
        assert_eq!(
            e.message(),
            "argument 'hi' is NaN, not a bound (leave it out for no bound)"
        );
        // Reversed bounds are told apart exactly.
        let e = clamp_of::<i64>(&[0], Some(Int(big)), Some(Float(9007199254740992.0))).unwrap_err();
        assert_eq!(
            e.message(),
            "clamp bounds are reversed: lo = 9007199254740993 is greater than hi = 9007199254740992"
        );
    }

    #[test]
    fn uint64_compares_exactly_with_signed_integers() {
        let big = (1i64 << 53) + 1;
        let a = make::<i64>(&[4], "", |o| {
            o.copy_from_slice(&[big, i64::MAX, -1, big]);
            Ok(())
        })
        .unwrap();
        let b = make::<u64>(&[4], "", |o| {
            o.copy_from_slice(&[1 << 53, 1 << 63, u64::MAX, big as u64]);
            Ok(())
        })
        .unwrap();
        let i8s = make::<i8>(&[1], "", |o| {
            o[0] = -1;
            Ok(())
        })
        .unwrap();
        let bits = |op: Cmp, x: &Tensor, y: &Tensor| {
            let t = cmp_kernel(op, &[x, y]).unwrap();
            assert_eq!(t.dtype(), Bool);
            t.to_bytes().unwrap()
        };
        // In float64 2^53 + 1 == 2^53, i64::MAX == 2^63 and -1 < 2^64 - 1 held only
        // by rounding; NumPy compares int64 with uint64 exactly.
        assert_eq!(bits(Cmp::Eq, &a, &b), [0, 0, 0, 1]);
        assert_eq!(bits(Cmp::Ne, &a, &b), [1, 1, 1, 0]);
        assert_eq!(bits(Cmp::Lt, &a, &b), [0, 1, 1, 0]);
        assert_eq!(bits(Cmp::Le, &a, &b), [0, 1, 1, 1]);
        assert_eq!(bits(Cmp::Gt, &a, &b), [1, 0, 0, 0]);
        assert_eq!(bits(Cmp::Ge, &a, &b), [1, 0, 0, 1]);
        // Either order, a narrower signed type, broadcasting.
        assert_eq!(bits(Cmp::Gt, &b, &a), [0, 1, 1, 0]);
        assert_eq!(bits(Cmp::Eq, &b, &i8s), [0, 0, 0, 0]);
        assert_eq!(bits(Cmp::Lt, &i8s, &b), [1, 1, 1, 1]);
    }

    #[test]
    fn float_divmod_matches_python() {
        assert_eq!(kernels::float_divmod(7.0, 2.0), (3.0, 1.0));
        assert_eq!(kernels::float_divmod(-7.0, 2.0), (-4.0, 1.0));
        assert_eq!(kernels::float_divmod(7.0, -2.0), (-4.0, -1.0));
        assert_eq!(kernels::float_divmod(-0.5, 1.0), (-1.0, 0.5));
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::kernels::make;
    use super::*;

    #[test]
    fn inline_floor_ceil_and_round_equal_the_library_functions_bit_for_bit() {
        let edges = [
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.7,
            -0.7,
            0.49999999999999994,
            -0.49999999999999994,
            1.0 - f64::EPSILON / 2.0,
            4503599627370495.5,
            -4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1e300,
            -1e300,
            5e-324,
            -5e-324,
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let t = make::<f64>(&[edges.len() as i64], "", |o| {
            o.copy_from_slice(&edges);
            Ok(())
        })
        .unwrap();
        type Reference = fn(f64) -> f64;
        let cases: [(Unary, Reference); 3] = [
            (Unary::Floor, f64::floor),
            (Unary::Ceil, f64::ceil),
            (Unary::Round, f64::round_ties_even),
        ];
        for (op, want) in cases {
            let got = unary_kernel(op, &t).unwrap();
            for (&x, g) in edges.iter().zip(typed::<f64>(&got).unwrap().iter()) {
                assert_eq!(g.to_bits(), want(x).to_bits(), "{op:?}({x:e})");
            }
        }
    }
}

#[cfg(test)]
mod f64_route_tests {
    use super::kernels::make;
    use super::*;
    use half::{bf16, f16};

    fn tensor<T: Elem>(values: &[T]) -> Tensor {
        make::<T>(&[values.len() as i64], "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })
        .unwrap()
    }

    /// `got` equals `want` of each value through f64 (widened, computed, rounded
    /// back), bit for bit.
    fn equal_the_f64_route<T: Elem + std::fmt::Debug>(
        what: &str,
        values: &[T],
        got: &Tensor,
        want: fn(f64) -> f64,
    ) {
        for (&x, g) in values.iter().zip(typed::<T>(got).unwrap().iter()) {
            let w = T::from_f64(want(x.to_f64()));
            assert_eq!(
                bytemuck::bytes_of(g),
                bytemuck::bytes_of(&w),
                "{what}({x:?}) of {:?}: got {g:?}, want {w:?}",
                T::DTYPE,
            );
        }
    }

    /// NumPy's sign: +0.0 for both zeros, NaN for NaN.
    fn sign(v: f64) -> f64 {
        if v > 0.0 {
            1.0
        } else if v < 0.0 {
            -1.0
        } else if v == 0.0 {
            0.0
        } else {
            v
        }
    }

    #[test]
    fn sign_of_a_negative_zero_is_positive_zero_as_numpy() {
        let x = tensor(&[-0.0f32, 0.0, -2.0, f32::NAN]);
        let got = typed::<f32>(&unary_kernel(Unary::Sign, &x).unwrap())
            .unwrap()
            .to_vec();
        assert_eq!(
            got[..3].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [0, 0, (-1f32).to_bits()]
        );
        assert!(got[3].is_nan());
        let x = tensor(&[-0.0f64]);
        assert_eq!(
            typed::<f64>(&unary_kernel(Unary::Sign, &x).unwrap()).unwrap()[0].to_bits(),
            0
        );
    }

    fn half_signs<T: Elem + std::fmt::Debug>(values: &[T]) {
        let t = tensor(values);
        type Reference = fn(f64) -> f64;
        let cases: [(Unary, Reference); 3] = [
            (Unary::Neg, |v| -v),
            (Unary::Abs, f64::abs),
            (Unary::Sign, sign),
        ];
        for (op, want) in cases {
            let got = unary_kernel(op, &t).unwrap();
            assert_eq!(got.dtype(), T::DTYPE);
            equal_the_f64_route(&format!("{op:?}"), values, &got, want);
        }
    }

    #[test]
    fn neg_abs_sign_of_every_half_and_bfloat16_equal_the_f64_route() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        half_signs(&all.iter().map(|&b| f16::from_bits(b)).collect::<Vec<_>>());
        half_signs(&all.iter().map(|&b| bf16::from_bits(b)).collect::<Vec<_>>());
    }

    #[test]
    fn float32_sqrt_equals_the_f64_route() {
        // A spread over the bit patterns (negatives, subnormals, NaNs included), the
        // squares of whole numbers with their neighbours (exact roots, and results
        // next to them), and the specials.
        let mut bits: Vec<u32> = (0..=u32::MAX).step_by(4093).collect();
        for k in 1..4096u32 {
            let sq = ((k * k) as f32).to_bits();
            bits.extend([sq - 1, sq, sq + 1]);
        }
        bits.extend([0, 1, 0x7f7f_ffff, 0x7f80_0000, 0x7f80_0001, 0x7fc0_0000]);
        bits.extend([
            0x8000_0000,
            0x8000_0001,
            0xff80_0000,
            0xff80_0001,
            0xffc0_0001,
        ]);
        let values: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
        let got = math_kernel(Math::Sqrt, &tensor(&values)).unwrap();
        equal_the_f64_route("sqrt", &values, &got, f64::sqrt);
    }
}

#[cfg(test)]
mod narrow_rounding_tests {
    use super::kernels::make;
    use super::*;
    use half::{bf16, f16};

    /// floor, ceil and round of `values` equal the f64 route (the value widened to
    /// f64, rounded by the library functions, narrowed back) bit for bit; a NaN comes
    /// back with its bits unchanged (unoptimised, the f64 route would make a
    /// signalling one quiet; optimised, it did not).
    fn equal_the_f64_route<T: Elem + std::fmt::Debug>(values: &[T]) {
        let t = make::<T>(&[values.len() as i64], "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })
        .unwrap();
        type Reference = fn(f64) -> f64;
        let cases: [(Unary, Reference); 3] = [
            (Unary::Floor, f64::floor),
            (Unary::Ceil, f64::ceil),
            (Unary::Round, f64::round_ties_even),
        ];
        for (op, want) in cases {
            let got = unary_kernel(op, &t).unwrap();
            for (&x, g) in values.iter().zip(typed::<T>(&got).unwrap().iter()) {
                let w = if T::DTYPE == DType::F32 && x.is_nan() {
                    x
                } else {
                    T::from_f64(want(x.to_f64()))
                };
                assert_eq!(
                    bytemuck::bytes_of(g),
                    bytemuck::bytes_of(&w),
                    "{op:?}({x:?}) of {:?}: got {g:?}, want {w:?}",
                    T::DTYPE,
                );
            }
        }
    }

    #[test]
    fn float32_rounds_in_f32_as_through_f64_bit_for_bit() {
        // A spread over all bit patterns (both signs, subnormals, NaNs) ...
        let mut bits: Vec<u32> = (0..=u32::MAX).step_by(4093).collect();
        // ... every pattern near the edges: zeros, the smallest subnormal and normal,
        // halves, 2^22 (from which every f32 is a multiple of 1/2), 2^23 (whole),
        // 2^24, the largest finite, infinity and the first and last NaNs of each kind.
        let edges = [
            0.0f32,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            0.5,
            1.0,
            1.5,
            2.5,
            4_194_304.0,
            8_388_608.0,
            16_777_216.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for e in edges {
            for sign in [0, 0x8000_0000] {
                let b = e.to_bits() | sign;
                bits.extend(b.saturating_sub(300)..=b.saturating_add(300));
            }
        }
        bits.extend([
            0x7f80_0001,
            0x7fbf_ffff,
            0x7fc0_0000,
            0x7fc0_0001,
            0x7fff_ffff,
        ]);
        bits.extend([
            0xff80_0001,
            0xffbf_ffff,
            0xffc0_0000,
            0xffc0_0001,
            0xffff_ffff,
        ]);
        // Halves and their neighbours below 2^22.
        for k in 0..3000u32 {
            let h = (k as f32 + 0.5).to_bits();
            bits.extend([h - 1, h, h + 1, h | 0x8000_0000]);
        }
        let values: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
        equal_the_f64_route(&values);
    }

    #[test]
    fn half_types_round_as_through_f64_bit_for_bit() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let halves: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
        equal_the_f64_route(&halves);
        let brains: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
        equal_the_f64_route(&brains);
    }
}
