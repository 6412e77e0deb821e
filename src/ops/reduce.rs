//! Reductions over axes: `sum prod mean min max all any` (argument `axes`, default
//! all) and `argmin argmax` (argument `axis`, default the flattened tensor), each with
//! `keepdims`.

use std::sync::Arc;

use super::kernels::{self, Elem, make, typed, with_elem};
use super::{ArgSpec, Kernel, OpDef, TMeta, par};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, Args};
use crate::tensor::{DType, Tensor, dims, try_host_vec};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Red {
    Sum,
    Prod,
    Mean,
    Min,
    Max,
    All,
    Any,
}

impl Red {
    fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Prod => "prod",
            Red::Mean => "mean",
            Red::Min => "min",
            Red::Max => "max",
            Red::All => "all",
            Red::Any => "any",
        }
    }

    /// The output dtype for an input of `d` (NumPy's defaults).
    fn dtype(self, d: DType) -> DType {
        use DType::*;
        match self {
            Red::Sum | Red::Prod => match d {
                Bool | I8 | I16 | I32 | I64 => I64,
                U8 | U16 | U32 | U64 => U64,
                f => f,
            },
            Red::Mean => match d {
                F16 | BF16 | F32 | F64 => d,
                _ => F64,
            },
            Red::Min | Red::Max => d,
            Red::All | Red::Any => Bool,
        }
    }
}

/// Validates reduction axes against `ndim`: unique, in range (negative counts from
/// the end). `None` means every axis.
pub fn normalize_axes(axes: Option<&[i64]>, ndim: usize) -> Result<Vec<usize>> {
    let Some(axes) = axes else {
        return Ok((0..ndim).collect());
    };
    let mut out = Vec::with_capacity(axes.len());
    // Marks the axes met, so a rank in the tens of thousands stays linear.
    let mut seen = vec![false; ndim];
    for &a in axes {
        let n = ndim as i64;
        if a < -n || a >= n {
            return Err(Error::index(format!(
                "axis {a} is out of range for a tensor of ndim {ndim}"
            )));
        }
        let a = if a < 0 { a + n } else { a } as usize;
        if std::mem::replace(&mut seen[a], true) {
            return Err(Error::value(format!(
                "axis {a} is repeated in axes {}",
                dims(axes)
            )));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

/// Whether each of `ndim` axes is among `axes` (each below `ndim`): a lookup per axis
/// without a search through `axes`, which made shape computations quadratic in the
/// rank.
pub(crate) fn axis_mask(axes: &[usize], ndim: usize) -> Vec<bool> {
    let mut mask = vec![false; ndim];
    for &a in axes {
        mask[a] = true;
    }
    mask
}

/// The shape of a reduction over `axes`.
pub fn reduced_shape(shape: &[i64], axes: &[usize], keepdims: bool) -> Vec<i64> {
    let reduced = axis_mask(axes, shape.len());
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (reduced[i], keepdims) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(d),
        })
        .collect()
}

/// For a compact `shape`, the output offset of every input element when `axes` are
/// reduced: `f(input_index, output_offset)`. Returns the number of outputs.
fn for_each_output(shape: &[i64], axes: &[usize], mut f: impl FnMut(usize, usize)) -> usize {
    let mut out_strides = vec![0usize; shape.len()];
    let mut acc = 1usize;
    let reduced = axis_mask(axes, shape.len());
    for i in (0..shape.len()).rev() {
        if !reduced[i] {
            out_strides[i] = acc;
            acc *= shape[i] as usize;
        }
    }
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut index = vec![0i64; shape.len()];
    let mut o = 0usize;
    for i in 0..n {
        f(i, o);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            o += out_strides[d];
            if index[d] < shape[d] {
                break;
            }
            o -= out_strides[d] * shape[d] as usize;
            index[d] = 0;
        }
    }
    acc
}

fn zero_size(op: &str) -> Error {
    Error::value(format!(
        "zero-size reduction: operator '{op}' has no identity for an empty set of elements"
    ))
}

/// [`zero_size`] naming what was reduced: `over` ("axes [1]", "axis 0", "every axis")
/// of a tensor of `shape`, which holds no element there.
pub(crate) fn empty_reduction(op: &str, shape: &[i64], over: &str) -> Error {
    Error::value(format!(
        "zero-size reduction: operator '{op}' has no identity for an empty set of elements \
         (it reduces {over} of shape {}: 0 elements, expected at least 1)",
        dims(shape)
    ))
}

/// How [`empty_reduction`] names reduced `axes`.
pub(crate) fn axes_named(axes: &[usize], ndim: usize) -> String {
    if axes.len() == ndim {
        "every axis".to_string()
    } else {
        let a: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        format!("axes {}", dims(&a))
    }
}

/// A compact `shape` reduced over `axes` seen as `[outer, len, inner]` reduced over
/// its middle axis, when the axes are consecutive (or none); `None` otherwise.
fn middle(shape: &[i64], axes: &[usize]) -> Option<(usize, usize, usize)> {
    let size = |r: &[i64]| r.iter().map(|&d| d as usize).product::<usize>();
    let (Some(&a), Some(&b)) = (axes.first(), axes.last()) else {
        return Some((size(shape), 1, 1));
    };
    (b - a + 1 == axes.len()).then(|| {
        (
            size(&shape[..a]),
            size(&shape[a..=b]),
            size(&shape[b + 1..]),
        )
    })
}

/// Outputs (pieces of) a `[outer, len, inner]` reduction over its middle axis:
/// `out[p]` for flat output index `p = o * inner + k` folds `src[(o * len + j) * inner
/// + k]` for `j` in order, starting from `init` of the element `j = 0` and going on
/// with `step(acc, value, j)`; so each output sees its elements in the order of the
/// sequential definition, whatever the pieces. `inner > 1` walks whole rows, which
/// the compiler vectorises across `k`. `len` must be at least 1.
fn fold_middle<S: Copy + Sync, A: Copy + Send>(
    src: &[S],
    len: usize,
    inner: usize,
    out: &mut [A],
    init: impl Fn(S) -> A + Sync + Send,
    step: impl Fn(A, S, usize) -> A + Sync + Send,
) {
    if inner == 1 {
        let _ = par::chunks_mut(out, 1, len, |first, piece| {
            for (i, a) in piece.iter_mut().enumerate() {
                let block = &src[(first + i) * len..(first + i + 1) * len];
                let mut acc = init(block[0]);
                for (j, &v) in block.iter().enumerate().skip(1) {
                    acc = step(acc, v, j);
                }
                *a = acc;
            }
            Ok(())
        });
        return;
    }
    // Runs of 16 KiB of accumulators (2048 `f64`), so that each row is read in long
    // runs; four rows at a time, so that each accumulator is loaded and stored once
    // for four elements (each still folds its elements in order, one at a time).
    let unit = inner.min((16384 / size_of::<A>()).max(1));
    row_runs(len, inner, unit, out, |accs, start| {
        let n = accs.len();
        let row = |j: usize| &src[start + j * inner..start + j * inner + n];
        for (a, &v) in accs.iter_mut().zip(row(0)) {
            *a = init(v);
        }
        let mut j0 = 1;
        while j0 + 4 <= len {
            let j = j0;
            for ((((a, &x0), &x1), &x2), &x3) in accs
                .iter_mut()
                .zip(row(j))
                .zip(row(j + 1))
                .zip(row(j + 2))
                .zip(row(j + 3))
            {
                *a = step(step(step(step(*a, x0, j), x1, j + 1), x2, j + 2), x3, j + 3);
            }
            j0 += 4;
        }
        for j in j0..len {
            for (a, &v) in accs.iter_mut().zip(row(j)) {
                *a = step(*a, v, j);
            }
        }
    });
}

/// Cuts the outputs of a `[outer, len, inner]` reduction over its middle axis (`inner
/// > 1`) into pieces of whole units of `unit` outputs for the worker pool, and calls
/// `run(accs, start)` for each run of outputs in a piece that lies in one row: the
/// run's elements of row `j` are `src[start + j * inner..][..accs.len()]`.
fn row_runs<A: Send>(
    len: usize,
    inner: usize,
    unit: usize,
    out: &mut [A],
    run: impl Fn(&mut [A], usize) + Sync + Send,
) {
    let _ = par::chunks_mut(out, unit, unit * len, |first, piece| {
        let (start, end) = (first * unit, first * unit + piece.len());
        let mut p = start;
        while p < end {
            let (o, k0) = (p / inner, p % inner);
            let k1 = inner.min(k0 + end - p);
            run(
                &mut piece[p - start..p - start + (k1 - k0)],
                o * len * inner + k0,
            );
            p += k1 - k0;
        }
        Ok(())
    });
}

/// [`fold_middle`] of `replaces` for `inner > 1`: the minimum (maximum) of each
/// output's elements in order, the first NaN or else the first of equal extremes. Rows
/// fold with the plain comparison (one vector instruction), which gives the same bits
/// unless a NaN comes after the first row; runs that saw one fold again with
/// `replaces`. Runs are 8 KiB of each row (two pages), read in full, four rows per
/// pass.
fn extreme_middle<S: Elem>(max: bool, src: &[S], len: usize, inner: usize, out: &mut [S]) {
    // One loop per direction (a constant, not a captured flag), so that the comparison
    // is one instruction.
    if max {
        extreme_rows::<S, true>(src, len, inner, out);
    } else {
        extreme_rows::<S, false>(src, len, inner, out);
    }
}

/// How many of a row's `inner` elements a run of the row-folding kernels takes: 8 KiB
/// of `S` (two pages), or the whole row when it is shorter.
fn row_unit<S>(inner: usize) -> usize {
    inner.min((8192 / size_of::<S>()).max(1))
}

fn extreme_rows<S: Elem, const MAX: bool>(src: &[S], len: usize, inner: usize, out: &mut [S]) {
    let unit = row_unit::<S>(inner);
    let pick = |a: S, v: S| {
        let better = if MAX { v > a } else { v < a };
        if better { v } else { a }
    };
    row_runs(len, inner, unit, out, |accs, start| {
        let n = accs.len();
        let row = |j: usize| &src[start + j * inner..start + j * inner + n];
        accs.copy_from_slice(row(0));
        let mut nan = false;
        // Four rows per pass over the run, each output still taking them in order.
        let mut j0 = 1;
        while j0 + 4 <= len {
            for ((((a, &x0), &x1), &x2), &x3) in accs
                .iter_mut()
                .zip(row(j0))
                .zip(row(j0 + 1))
                .zip(row(j0 + 2))
                .zip(row(j0 + 3))
            {
                nan |= Elem::is_nan(x0) | Elem::is_nan(x1) | Elem::is_nan(x2) | Elem::is_nan(x3);
                *a = pick(pick(pick(pick(*a, x0), x1), x2), x3);
            }
            j0 += 4;
        }
        for j in j0..len {
            for (a, &v) in accs.iter_mut().zip(row(j)) {
                nan |= Elem::is_nan(v);
                let better = if MAX { v > *a } else { v < *a };
                *a = if better { v } else { *a };
            }
        }
        if nan {
            accs.copy_from_slice(row(0));
            for j in 1..len {
                for (a, &v) in accs.iter_mut().zip(row(j)) {
                    *a = if replaces(MAX, *a, v) { v } else { *a };
                }
            }
        }
    });
}

/// Whether `v` replaces `a` as the running minimum (maximum): the first NaN wins and
/// stays; otherwise a strictly smaller (larger) value.
#[inline(always)]
fn replaces<S: Elem>(max: bool, a: S, v: S) -> bool {
    // Without short circuits, so that loops over rows vectorise.
    !Elem::is_nan(a) & (Elem::is_nan(v) | if max { v > a } else { v < a })
}

/// The minimum (maximum) of a non-empty block as the sequential scan
/// `a = if replaces(a, v) { v } else { a }` finds it, computed in 16 lanes that
/// the compiler vectorises. Lanes may see another one of several equal values first,
/// which matters only for a float zero (`-0.0 == 0.0`), and NaN stops the scan at the
/// first one: both are answered by the sequential scan (a NaN found, or a zero
/// result), so the value is always the sequential one, bit for bit.
fn extreme<S: Elem>(max: bool, v: &[S]) -> S {
    let sequential = || {
        v[1..]
            .iter()
            .fold(v[0], |a, &x| if replaces(max, a, x) { x } else { a })
    };
    let mut lanes = [v[0]; 16];
    let mut nan = false;
    let chunks = v.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in lanes.iter_mut().zip(c) {
            nan |= Elem::is_nan(x);
            let better = if max { x > *a } else { x < *a };
            *a = if better { x } else { *a };
        }
    }
    let mut m = lanes[0];
    for &x in lanes[1..].iter().chain(rest) {
        nan |= Elem::is_nan(x);
        m = if (max && x > m) || (!max && x < m) {
            x
        } else {
            m
        };
    }
    if nan || (!S::INT && m == S::from_i128(0)) {
        return sequential();
    }
    m
}

/// The index of the first minimum (maximum) of a non-empty block, or of its first NaN:
/// the extreme (see [`extreme`]), then the first element equal to it (NaN for NaN),
/// looked for 64 elements at a time (without stopping inside a run of 64, so that the
/// comparisons vectorise) before the run that has it is searched one by one.
fn arg_extreme<S: Elem>(max: bool, v: &[S]) -> i64 {
    fn first_hit<S: Elem>(v: &[S], hit: impl Fn(S) -> bool) -> usize {
        let mut base = 0;
        for c in v.chunks(64) {
            if c.iter().fold(false, |a, &x| a | hit(x)) {
                return base + c.iter().position(|&x| hit(x)).unwrap_or(0);
            }
            base += c.len();
        }
        0
    }
    let m = extreme(max, v);
    let k = if Elem::is_nan(m) {
        first_hit(v, |x| Elem::is_nan(x))
    } else {
        first_hit(v, |x| x == m)
    };
    k as i64
}

/// The index `j` of the first minimum (maximum) along the middle axis of a compact
/// `[outer, len, inner]` tensor (`inner > 1`, `len` at least 1), or of its first NaN,
/// into `out[o * inner + k]`: each output keeps its extreme and that index side by
/// side with the others of its run (8 KiB of each row, as [`extreme_rows`]), taking
/// the rows in order with the plain (strict) comparison, which keeps the first of
/// equal extremes (zeros of either sign included) and gives the sequential scan's
/// index unless a NaN comes after the first row; runs that saw one fold again with
/// [`replaces`].
fn arg_middle<S: Elem>(max: bool, src: &[S], len: usize, inner: usize, out: &mut [i64]) {
    if max {
        arg_rows::<S, true>(src, len, inner, out);
    } else {
        arg_rows::<S, false>(src, len, inner, out);
    }
}

fn arg_rows<S: Elem, const MAX: bool>(src: &[S], len: usize, inner: usize, out: &mut [i64]) {
    let unit = row_unit::<S>(inner);
    row_runs(len, inner, unit, out, |idx, start| {
        let n = idx.len();
        let row = |j: usize| &src[start + j * inner..start + j * inner + n];
        let mut vals = row(0).to_vec();
        idx.fill(0);
        let mut nan = false;
        for j in 1..len {
            let jj = j as i64;
            for ((a, k), &x) in vals.iter_mut().zip(idx.iter_mut()).zip(row(j)) {
                nan |= Elem::is_nan(x);
                let better = if MAX { x > *a } else { x < *a };
                *a = if better { x } else { *a };
                *k = if better { jj } else { *k };
            }
        }
        if nan {
            vals.copy_from_slice(row(0));
            idx.fill(0);
            for j in 1..len {
                for ((a, k), &x) in vals.iter_mut().zip(idx.iter_mut()).zip(row(j)) {
                    if replaces(MAX, *a, x) {
                        (*a, *k) = (x, j as i64);
                    }
                }
            }
        }
    });
}

/// The layout of a reduction's output: the input's where the output keeps its rank
/// (`keepdims`, or no axis reduced), else none.
fn kept_layout(layout: &str, axes: &[usize], keepdims: bool) -> String {
    if keepdims || axes.is_empty() {
        layout.to_string()
    } else {
        String::new()
    }
}

/// Reduces `t` over `axes`.
fn reduce(red: Red, t: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor> {
    let out_shape = reduced_shape(t.shape(), axes, keepdims);
    let layout = kept_layout(t.layout(), axes, keepdims);
    if !t.is_compact()
        && !broadcast(t)
        && let Some(r) = reduce_in_memory_order(red, t, axes, &out_shape, &layout)
    {
        return r;
    }
    reduce_into(red, t, axes, out_shape, &layout)
}

/// A reduction whose result does not depend on the order of the elements (`all`,
/// `any`, integer sums and products, integer minimums and maximums; float ones
/// unless the result is NaN or zero, where the first NaN or the first zero's sign
/// decides), or hardly does (sums and means of float16, bfloat16 and float32, see
/// below), of a view that its memory order makes compact (a transposed view, a view
/// with reduced axes reversed): the compact tensor reduced over the same axes, read
/// in place. `None` where that does not apply.
///
/// A narrow float's sum adds in `f64` in the order of memory rather than the
/// logical one: the order changes the `f64` sum by far less than half a unit of the
/// narrow result (about `n · 2^-53` of the sum of magnitudes, against `2^-24`), so
/// the rounded result is the logical order's unless that sum lies within this of a
/// rounding boundary. A NaN result (whose payload the order decides) is computed in
/// the logical order instead. `float64` sums keep the logical order, whose rounding
/// they would show.
fn reduce_in_memory_order(
    red: Red,
    t: &Tensor,
    axes: &[usize],
    out_shape: &[i64],
    layout: &str,
) -> Option<Result<Tensor>> {
    // An empty view's strides may be anything (DLPack): reversing them overflowed.
    if t.numel() == 0 {
        return None;
    }
    let d = t.dtype();
    let float = matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    let narrow = matches!(d, DType::F16 | DType::BF16 | DType::F32);
    let order_free = match red {
        Red::All | Red::Any | Red::Min | Red::Max => true,
        Red::Sum => !float || narrow,
        Red::Prod => !float,
        Red::Mean => narrow,
    };
    if !order_free {
        return None;
    }
    let (c, perm) = memory_order(t, axes)?;
    let mut c_axes: Vec<usize> = (0..perm.len())
        .filter(|&i| axes.contains(&perm[i]))
        .collect();
    c_axes.sort_unstable();
    let r = match reduce_into(red, &c, &c_axes, out_shape.to_vec(), layout) {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    // A float minimum (maximum) of NaN or zero: the logical order decides which; a
    // float sum or mean of NaN: the logical order decides its payload.
    if float {
        let extreme = matches!(red, Red::Min | Red::Max);
        let decided = with_elem!(r.dtype(), S => typed::<S>(&r).is_ok_and(|v| {
            v.iter().all(|&x| !Elem::is_nan(x) && (!extreme || x != S::from_i128(0)))
        }), bool => true);
        if !decided {
            return None;
        }
    }
    Some(Ok(r))
}

/// `t` with its axes by decreasing stride and the reduced ones (among `axes`)
/// reversed where their stride is negative, and the permutation (axis `q` of the
/// result is axis `perm[q]` of `t`): a view whose row-major order is the order of
/// memory. `None` unless it is compact (dense memory) with the kept axes in their
/// order (the outputs') and none of them reversed.
fn memory_order(t: &Tensor, axes: &[usize]) -> Option<(Tensor, Vec<usize>)> {
    // Axes by decreasing stride, reduced ones reversed where their stride is negative;
    // the kept axes must stay in their order (the outputs' order).
    let (shape, strides) = (t.shape(), t.strides());
    let mut perm: Vec<usize> = (0..t.ndim()).collect();
    perm.sort_by_key(|&a| std::cmp::Reverse(strides[a].unsigned_abs()));
    let kept: Vec<usize> = perm.iter().copied().filter(|a| !axes.contains(a)).collect();
    if !kept.is_sorted() {
        return None;
    }
    let mut origin = 0i64;
    let mut new_strides = Vec::with_capacity(perm.len());
    for &a in &perm {
        let s = strides[a];
        if s < 0 && shape[a] > 1 {
            if !axes.contains(&a) {
                return None;
            }
            origin += (shape[a] - 1) * s;
            new_strides.push(-s);
        } else {
            new_strides.push(s);
        }
    }
    let c = t.restride(
        perm.iter().map(|&a| shape[a]).collect(),
        new_strides,
        origin,
    );
    if !c.is_compact() {
        return None;
    }
    Some((c, perm))
}

/// [`reduce`] into an output of `out_shape` (with `layout`).
fn reduce_into(
    red: Red,
    t: &Tensor,
    axes: &[usize],
    out_shape: Vec<i64>,
    layout: &str,
) -> Result<Tensor> {
    let layout = layout.to_string();
    let count: usize = axes.iter().map(|&a| t.shape()[a] as usize).product();
    if count == 0 && matches!(red, Red::Min | Red::Max) {
        let n_out: usize = out_shape.iter().map(|&d| d as usize).product();
        if n_out > 0 {
            return Err(empty_reduction(
                red.name(),
                t.shape(),
                &axes_named(axes, t.ndim()),
            ));
        }
    }
    if matches!(red, Red::All | Red::Any)
        || (t.dtype() == DType::Bool && matches!(red, Red::Min | Red::Max))
    {
        let b = kernels::cast(t, DType::Bool)?;
        let v = typed::<u8>(&b)?;
        let all = matches!(red, Red::All | Red::Min);
        if let Some((_, len, inner)) = middle(t.shape(), axes) {
            return make::<u8>(&out_shape, &layout, |out| {
                if len == 0 {
                    out.fill(u8::from(all));
                } else if all {
                    fold_middle(
                        &v,
                        len,
                        inner,
                        out,
                        |x| u8::from(x != 0),
                        |a, x, _| a & u8::from(x != 0),
                    );
                } else {
                    fold_middle(
                        &v,
                        len,
                        inner,
                        out,
                        |x| u8::from(x != 0),
                        |a, x, _| a | u8::from(x != 0),
                    );
                }
                Ok(())
            })
            .map(|t| t.with_dtype_of_same_size(DType::Bool));
        }
        let n = for_each_output(t.shape(), axes, |_, _| {});
        let mut accs = accumulators(&out_shape, n, all)?;
        for_each_output(t.shape(), axes, |i, o| {
            if all {
                accs[o] &= v[i] != 0;
            } else {
                accs[o] |= v[i] != 0;
            }
        });
        return make::<u8>(&out_shape, &layout, |out| {
            for (o, a) in out.iter_mut().zip(accs) {
                *o = u8::from(a);
            }
            Ok(())
        })
        .map(|t| t.with_dtype_of_same_size(DType::Bool));
    }
    let src = if t.dtype() == DType::Bool {
        kernels::cast(t, DType::I64)?
    } else {
        t.clone()
    };
    with_elem!(src.dtype(), S => reduce_typed::<S>(red, &src, axes, &out_shape, &layout, count),
        bool => unreachable!("bool cast above"))
}

/// Whether `t` repeats elements (a zero stride on an axis longer than 1): such a
/// view stays on the compact-copy paths, which refuse one too large to copy
/// (NDX_ERROR_MEMORY) rather than fold all of its repeated elements.
fn broadcast(t: &Tensor) -> bool {
    t.shape()
        .iter()
        .zip(t.strides())
        .any(|(&d, &s)| d > 1 && s == 0)
}

/// Whether `axes` (sorted, distinct) are the last axes of an `ndim`-d tensor.
fn is_suffix(axes: &[usize], ndim: usize) -> bool {
    axes.iter()
        .enumerate()
        .all(|(i, &a)| a == ndim - axes.len() + i)
}

/// The sum of a block in `f64`: eight running sums over the elements (which the
/// compiler vectorises), in pieces of a fixed size whose sums are added in order, so
/// the rounding never depends on the number of threads.
fn sum_block<S: Elem>(v: &[S]) -> f64 {
    par::map_pieces(v.len(), 1, |r| {
        let mut st = [Fold::<S>::start(&LaneSum)];
        LaneSum.feed(&mut st, &[&v[r]], 0);
        Fold::<S>::finish(&LaneSum, st[0])
    })
    .into_iter()
    .sum()
}

fn reduce_typed<S: Elem>(
    red: Red,
    t: &Tensor,
    axes: &[usize],
    out_shape: &[i64],
    layout: &str,
    count: usize,
) -> Result<Tensor> {
    if !t.is_compact()
        && !broadcast(t)
        && let Some(r) = reduce_strided::<S>(red, t, axes, out_shape, layout, count)
    {
        return r;
    }
    let src = typed::<S>(t)?;
    let out_dtype = red.dtype(S::DTYPE);
    if let Some((_, len, inner)) = middle(t.shape(), axes)
        && !(is_suffix(axes, t.ndim()) && (red == Red::Mean || (red == Red::Sum && !S::INT)))
    {
        return reduce_middle::<S>(red, &src, len, inner, out_shape, layout);
    }
    match red {
        Red::Min | Red::Max => {
            let n = for_each_output(t.shape(), axes, |_, _| {});
            let mut accs: Vec<Option<S>> = accumulators(out_shape, n, None)?;
            let max = red == Red::Max;
            for_each_output(t.shape(), axes, |i, o| {
                let v = src[i];
                accs[o] = Some(match accs[o] {
                    None => v,
                    Some(a) if Elem::is_nan(a) => a,
                    Some(_) if Elem::is_nan(v) => v,
                    Some(a) if (max && v > a) || (!max && v < a) => v,
                    Some(a) => a,
                });
            });
            make::<S>(out_shape, layout, |out| {
                for (o, a) in out.iter_mut().zip(accs) {
                    *o = a.ok_or_else(|| zero_size(red.name()))?;
                }
                Ok(())
            })
        }
        Red::Sum | Red::Prod if S::INT => {
            let prod = red == Red::Prod;
            let n = for_each_output(t.shape(), axes, |_, _| {});
            let mut accs = accumulators(out_shape, n, i128::from(prod))?;
            for_each_output(t.shape(), axes, |i, o| {
                let v = src[i].to_i128();
                accs[o] = if prod {
                    accs[o].wrapping_mul(v)
                } else {
                    accs[o].wrapping_add(v)
                };
            });
            int_output(&accs, out_dtype, out_shape, layout)
        }
        Red::Sum | Red::Mean if is_suffix(axes, t.ndim()) => {
            // Each output sums one contiguous block: the fast path.
            let n_out: usize = out_shape.iter().map(|&d| d as usize).product();
            let accs: Vec<f64> = if count == 0 {
                accumulators(out_shape, n_out, 0.0)?
            } else {
                src.chunks(count).map(sum_block).collect()
            };
            float_output(red, accs, count, out_dtype, out_shape, layout)
        }
        Red::Sum | Red::Prod | Red::Mean => {
            let prod = red == Red::Prod;
            let n = for_each_output(t.shape(), axes, |_, _| {});
            let mut accs = accumulators(out_shape, n, if prod { 1.0 } else { 0.0 })?;
            for_each_output(t.shape(), axes, |i, o| {
                let v = src[i].to_f64();
                if prod {
                    accs[o] *= v;
                } else {
                    accs[o] += v;
                }
            });
            float_output(red, accs, count, out_dtype, out_shape, layout)
        }
        Red::All | Red::Any => unreachable!("handled on bools"),
    }
}

/// [`reduce_typed`] over consecutive axes (`[outer, len, inner]`, reduced over
/// `len`): each output folds its elements in the sequential order, so every result
/// (a float sum's rounding, which of equal extremes, the first NaN) is the generic
/// path's, bit for bit. Float sums over the last axes take the blocked path instead.
fn reduce_middle<S: Elem>(
    red: Red,
    src: &[S],
    len: usize,
    inner: usize,
    out_shape: &[i64],
    layout: &str,
) -> Result<Tensor> {
    let out_dtype = red.dtype(S::DTYPE);
    match red {
        Red::Min | Red::Max => {
            let max = red == Red::Max;
            make::<S>(out_shape, layout, |out| {
                if out.is_empty() {
                    return Ok(());
                }
                if len == 0 {
                    return Err(zero_size(red.name()));
                }
                if inner == 1 {
                    let _ = par::chunks_mut(out, 1, len, |first, piece| {
                        for (i, o) in piece.iter_mut().enumerate() {
                            *o = extreme(max, &src[(first + i) * len..(first + i + 1) * len]);
                        }
                        Ok(())
                    });
                } else {
                    extreme_middle(max, src, len, inner, out);
                }
                Ok(())
            })
        }
        Red::Sum | Red::Prod if S::INT => {
            // Wrapping in 64 bits: the int64/uint64 result of the exact sum's wrap.
            let prod = red == Red::Prod;
            let wide = |v: S| v.to_i128() as u64;
            let mut accs = accumulators(out_shape, out_count(out_shape), u64::from(prod))?;
            if len > 0 && !accs.is_empty() {
                if prod {
                    fold_middle(src, len, inner, &mut accs, wide, |a, v, _| {
                        a.wrapping_mul(wide(v))
                    });
                } else {
                    fold_middle(src, len, inner, &mut accs, wide, |a, v, _| {
                        a.wrapping_add(wide(v))
                    });
                }
            }
            int_output(&accs, out_dtype, out_shape, layout)
        }
        Red::Sum | Red::Prod | Red::Mean => {
            let prod = red == Red::Prod;
            let identity = if prod { 1.0 } else { 0.0 };
            let mut accs = accumulators(out_shape, out_count(out_shape), identity)?;
            if len > 0 && !accs.is_empty() {
                // The first element joins the identity like every other one (0.0 + -0.0
                // is 0.0).
                let first = |v: S| {
                    if prod {
                        identity * v.to_f64()
                    } else {
                        identity + v.to_f64()
                    }
                };
                if prod {
                    fold_middle(src, len, inner, &mut accs, first, |a, v, _| a * v.to_f64());
                } else {
                    fold_middle(src, len, inner, &mut accs, first, |a, v, _| a + v.to_f64());
                }
            }
            float_output(red, accs, len, out_dtype, out_shape, layout)
        }
        Red::All | Red::Any => unreachable!("handled on bools"),
    }
}

/// The output of a float sum, product or mean: `accs`, each divided by `count` for a
/// mean, rounded once to `out_dtype`.
fn float_output(
    red: Red,
    mut accs: Vec<f64>,
    count: usize,
    out_dtype: DType,
    out_shape: &[i64],
    layout: &str,
) -> Result<Tensor> {
    if red == Red::Mean {
        accs.iter_mut().for_each(|a| *a /= count as f64);
    }
    with_elem!(out_dtype, D => make::<D>(out_shape, layout, |out| {
        for (o, &a) in out.iter_mut().zip(&accs) {
            *o = D::from_f64(a);
        }
        Ok(())
    }), bool => unreachable!("float results"))
}

/// The int64/uint64 output of an integer sum or product: `accs` wrapped to it.
fn int_output<A: Copy + Into<i128>>(
    accs: &[A],
    out_dtype: DType,
    out_shape: &[i64],
    layout: &str,
) -> Result<Tensor> {
    with_elem!(out_dtype, D => make::<D>(out_shape, layout, |out| {
        for (o, &a) in out.iter_mut().zip(accs) {
            *o = D::from_i128(a.into());
        }
        Ok(())
    }), bool => unreachable!("integer sums are int64 or uint64"))
}

/// `n` accumulators, one per element of the output of shape `out_shape`, or
/// `NDX_ERROR_MEMORY` naming that output where the system refuses the memory: a
/// reduction over an empty axis has outputs without inputs to bound them.
fn accumulators<T: Clone>(out_shape: &[i64], n: usize, init: T) -> Result<Vec<T>> {
    try_host_vec(n, init).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "the accumulators of the output of shape {}: {}",
                dims(out_shape),
                e.message()
            ),
        )
    })
}

fn out_count(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

/// The index of the first minimum (maximum) along `axis`, or over the flattened tensor.
fn argreduce(max: bool, t: &Tensor, axis: Option<usize>, keepdims: bool) -> Result<Tensor> {
    let name = if max { "argmax" } else { "argmin" };
    let shape = t.shape();
    let out_shape = match axis {
        Some(a) => reduced_shape(shape, &[a], keepdims),
        None if keepdims => vec![1; shape.len()],
        None => vec![],
    };
    let (len, inner) = match axis {
        Some(a) => (
            shape[a] as usize,
            shape[a + 1..]
                .iter()
                .map(|&d| d as usize)
                .product::<usize>(),
        ),
        None => (t.numel(), 1),
    };
    if len == 0 {
        let over = match axis {
            Some(a) => format!("axis {a}"),
            None => "the flattened tensor".to_string(),
        };
        return Err(empty_reduction(name, shape, &over));
    }
    let src = if t.dtype() == DType::Bool {
        kernels::cast(t, DType::U8)?
    } else {
        t.clone()
    };
    let axes = match axis {
        Some(a) => vec![a],
        None => (0..shape.len()).collect(),
    };
    if axis.is_none()
        && !src.is_compact()
        && !broadcast(&src)
        && let Some(k) = with_elem!(src.dtype(), S => arg_in_memory_order::<S>(max, &src),
            bool => unreachable!("bool cast above"))
    {
        let k = k?;
        return make::<i64>(&out_shape, "", |out| {
            out.fill(k);
            Ok(())
        });
    }
    let best = with_elem!(src.dtype(), S => {
        if !src.is_compact()
            && !broadcast(&src)
            && let Some(best) = axis.and_then(|a| arg_axis_in_memory_order::<S>(max, &src, a))
        {
            best?
        } else if !src.is_compact()
            && !broadcast(&src)
            && let Some(best) = arg_strided::<S>(max, &src, &axes, len)
        {
            best?
        } else {
            let v = typed::<S>(&src)?;
            arg_compact(max, &v, len, inner)
        }
    }, bool => unreachable!("bool cast above"));
    let layout = if keepdims { t.layout() } else { "" };
    make::<i64>(&out_shape, layout, |out| {
        out.copy_from_slice(&best);
        Ok(())
    })
}

/// The index along the middle axis of the first minimum (maximum), or of the first
/// NaN, of each output of the compact `[outer, len, inner]` tensor `v` (`len` at
/// least 1), in the order of the outputs.
fn arg_compact<S: Elem>(max: bool, v: &[S], len: usize, inner: usize) -> Vec<i64> {
    let mut best = vec![0i64; v.len() / len];
    if best.is_empty() {
        return best;
    }
    if inner == 1 {
        let _ = par::chunks_mut(&mut best, 1, len, |first, piece| {
            for (i, o) in piece.iter_mut().enumerate() {
                *o = arg_extreme(max, &v[(first + i) * len..(first + i + 1) * len]);
            }
            Ok(())
        });
    } else {
        arg_middle(max, v, len, inner, &mut best);
    }
    best
}

/// [`argreduce`] over `axis` of a view that its memory order makes compact with the
/// kept axes in their order (see [`memory_order`]; a transposed or permuted view)
/// and `axis` not reversed: the compact tensor reduced in place over the axis that
/// `axis` becomes, whose index along it is the logical one and whose outputs come in
/// the logical order. `None` where that does not apply (a reversed `axis`, whose
/// first logical extreme is the last in memory, or memory not on the host).
fn arg_axis_in_memory_order<S: Elem>(
    max: bool,
    t: &Tensor,
    axis: usize,
) -> Option<Result<Vec<i64>>> {
    if t.numel() == 0 || (t.strides()[axis] < 0 && t.shape()[axis] > 1) {
        return None;
    }
    let (c, perm) = memory_order(t, &[axis])?;
    let q = perm.iter().position(|&a| a == axis)?;
    let (_, len, inner) = middle(c.shape(), &[q])?;
    let (items, origin) = c.host_items::<S>()?;
    Some(
        t.storage()
            .wait_host_readable()
            .map(|()| arg_compact(max, &items[origin..origin + c.numel()], len, inner)),
    )
}

/// The flat (row-major) index of the first minimum (maximum) of `t`, or of its first
/// NaN, for a view that its memory order makes compact (see [`memory_order`]; a
/// transposed or flipped view), reading it twice in the order of memory: once for the
/// extreme (whose value does not depend on the order; NaN if there is one), once for
/// the elements equal to it (any NaN for NaN; zeros of either sign for a zero, as
/// the sequential scan keeps the first of those), of which the smallest logical index
/// wins. `None` where that does not apply.
fn arg_in_memory_order<S: Elem>(max: bool, t: &Tensor) -> Option<Result<i64>> {
    if t.numel() == 0 {
        return None;
    }
    let all: Vec<usize> = (0..t.ndim()).collect();
    let (c, perm) = memory_order(t, &all)?;
    let (items, origin) = c.host_items::<S>()?;
    Some(t.storage().wait_host_readable().map(|()| {
        let v = &items[origin..origin + c.numel()];
        let m = par::map_pieces(v.len(), 1, |r| extreme(max, &v[r]))
            .into_iter()
            .reduce(|a, b| if replaces(max, a, b) { b } else { a })
            .unwrap_or(v[0]);
        let nan = Elem::is_nan(m);
        // The logical index of element 0 of `c` and its step along each axis of `c`.
        let (shape, strides) = (t.shape(), t.strides());
        let mut row_major = vec![0i64; shape.len()];
        let mut acc = 1i64;
        for a in (0..shape.len()).rev() {
            row_major[a] = acc;
            acc *= shape[a];
        }
        let mut first = 0i64;
        let steps: Vec<i64> = perm
            .iter()
            .map(|&a| {
                if strides[a] < 0 && shape[a] > 1 {
                    first += (shape[a] - 1) * row_major[a];
                    -row_major[a]
                } else {
                    row_major[a]
                }
            })
            .collect();
        let cshape = c.shape();
        let last = cshape.len() - 1;
        let (inner, step) = (cshape[last] as usize, steps[last]);
        let hit = |x: S| if nan { Elem::is_nan(x) } else { x == m };
        par::map_pieces(v.len() / inner, inner, |rows| {
            let mut best = i64::MAX;
            for row in rows {
                let r = &v[row * inner..(row + 1) * inner];
                // The row's smallest logical index: its first hit, or its last one
                // where the logical index falls along the row.
                let k = if step >= 0 {
                    r.iter().position(|&x| hit(x))
                } else {
                    r.iter().rposition(|&x| hit(x))
                };
                let Some(k) = k else { continue };
                let mut at = first + k as i64 * step;
                let mut rest = row;
                for q in (0..last).rev() {
                    let n = cshape[q] as usize;
                    at += (rest % n) as i64 * steps[q];
                    rest /= n;
                }
                best = best.min(at);
            }
            best
        })
        .into_iter()
        .min()
        .unwrap_or(0)
    }))
}

/// Pieces of a split block (see [`fold_blocks`]) read together: a transposed view's
/// gathered rows are then runs of 4 pieces' worth of its columns (the gathering
/// buffer of each thread grows to 4 x 2^16 elements).
const PIECE_GROUP: usize = 4;

/// Elements a reduction of a non-compact view gathers at a time: a piece of
/// [`sum_block`] (256 KiB of float32, about an L2 cache), read in tiles.
const CHUNK: usize = par::PIECE_WORK;

thread_local! {
    /// Each thread's buffer for the elements [`Blocks::read`] gathers.
    static GATHERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The elements of a reduction whose every output folds one block of `len`
/// consecutive elements of `view`'s row-major order: `view` is the input with the
/// reduced axes moved last (see [`blocked_view`]).
enum Blocks<'a, S> {
    /// A compact view: its elements in place.
    Slice(&'a [S]),
    /// A non-compact view (its memory as [`Tensor::host_items`] gives it), gathered
    /// piece by piece into a small buffer of each thread.
    View(&'a Tensor, &'a [S]),
}

impl<S: Elem> Blocks<'_, S> {
    /// Calls `f` with the elements of each `(first, n)` of `ranges` (at most 8).
    fn read<R>(&self, ranges: &[(usize, usize)], f: impl FnOnce(&[&[S]]) -> R) -> R {
        match self {
            Blocks::Slice(s) => {
                let mut parts: [&[S]; 8] = [&[]; 8];
                for (p, &(first, n)) in parts.iter_mut().zip(ranges) {
                    *p = &s[first..first + n];
                }
                f(&parts[..ranges.len()])
            }
            Blocks::View(t, items) => GATHERED.with_borrow_mut(|buf| {
                let total: usize = ranges.iter().map(|r| r.1).sum();
                let words = (total * size_of::<S>()).div_ceil(8);
                if buf.len() < words {
                    buf.resize(words, 0);
                }
                let all = &mut bytemuck::cast_slice_mut::<u64, S>(&mut buf[..words])[..total];
                let mut at = 0;
                for &(first, n) in ranges {
                    t.gather_elems(items, first, &mut all[at..at + n]);
                    at += n;
                }
                let mut local: [&[S]; 8] = [&[]; 8];
                let mut rest: &[S] = all;
                for (p, &(_, n)) in local.iter_mut().zip(ranges) {
                    (*p, rest) = rest.split_at(n);
                }
                f(&local[..ranges.len()])
            }),
        }
    }
}

/// `t` with the `axes` (sorted) moved after the other axes: each output of the
/// reduction over `axes` folds one block of consecutive elements of its row-major
/// order, in the order of the sequential definition.
fn blocked_view(t: &Tensor, axes: &[usize]) -> Tensor {
    let perm: Vec<usize> = (0..t.ndim())
        .filter(|a| !axes.contains(a))
        .chain(axes.iter().copied())
        .collect();
    t.restride(
        perm.iter().map(|&a| t.shape()[a]).collect(),
        perm.iter().map(|&a| t.strides()[a]).collect(),
        0,
    )
}

/// A reduction of blocks (see [`fold_blocks`]): a state per output fed the block's
/// elements in order, piece by piece.
trait Fold<S: Elem>: Sync {
    type St: Copy + Send;
    type Out: Copy + Send;
    /// Whether a large block may be cut into the pieces of [`par::map_pieces`], whose
    /// results [`Fold::combine`] joins in order.
    const SPLIT: bool;
    fn start(&self) -> Self::St;
    /// Feeds each block `b` of a group its next elements `parts[b]` (all of the same
    /// length), which start at element `offset` of the block (a multiple of 8 but for
    /// the last piece of a block).
    fn feed(&self, sts: &mut [Self::St], parts: &[&[S]], offset: usize);
    fn finish(&self, st: Self::St) -> Self::Out;
    fn combine(&self, parts: Vec<Self::Out>) -> Self::Out;
}

/// [`sum_block`]'s pieces: eight running sums over the elements, then the remainder.
struct LaneSum;

#[derive(Clone, Copy)]
struct Lanes {
    acc: [f64; 8],
    rest: [f64; 7],
    n_rest: usize,
}

impl<S: Elem> Fold<S> for LaneSum {
    type St = Lanes;
    type Out = f64;
    const SPLIT: bool = true;
    fn start(&self) -> Lanes {
        Lanes {
            acc: [0.0; 8],
            rest: [0.0; 7],
            n_rest: 0,
        }
    }
    fn feed(&self, sts: &mut [Lanes], parts: &[&[S]], _: usize) {
        for (st, v) in sts.iter_mut().zip(parts) {
            debug_assert_eq!(st.n_rest, 0, "only the last piece has a remainder");
            let mut acc = st.acc;
            let chunks = v.chunks_exact(8);
            let rest = chunks.remainder();
            for c in chunks {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a += x.to_f64();
                }
            }
            st.acc = acc;
            for x in rest {
                st.rest[st.n_rest] = x.to_f64();
                st.n_rest += 1;
            }
        }
    }
    fn finish(&self, st: Lanes) -> f64 {
        let acc = st.acc;
        let mut s =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for x in &st.rest[..st.n_rest] {
            s += x;
        }
        s
    }
    fn combine(&self, parts: Vec<f64>) -> f64 {
        parts.into_iter().sum()
    }
}

/// The sequential float fold from the identity (`fold_middle`'s order): products,
/// and sums over axes that are not the last ones. Blocks of a group fold side by
/// side, so that their additions overlap.
struct SeqFold {
    prod: bool,
}

impl<S: Elem> Fold<S> for SeqFold {
    type St = f64;
    type Out = f64;
    const SPLIT: bool = false;
    fn start(&self) -> f64 {
        if self.prod { 1.0 } else { 0.0 }
    }
    fn feed(&self, sts: &mut [f64], parts: &[&[S]], _: usize) {
        fn run<S: Elem>(sts: &mut [f64], parts: &[&[S]], op: impl Fn(f64, f64) -> f64) {
            let mut acc = [0f64; 8];
            acc[..sts.len()].copy_from_slice(sts);
            for j in 0..parts[0].len() {
                for (a, p) in acc.iter_mut().zip(parts) {
                    *a = op(*a, p[j].to_f64());
                }
            }
            sts.copy_from_slice(&acc[..sts.len()]);
        }
        if self.prod {
            run(sts, parts, |a, x| a * x);
        } else {
            run(sts, parts, |a, x| a + x);
        }
    }
    fn finish(&self, st: f64) -> f64 {
        st
    }
    fn combine(&self, _: Vec<f64>) -> f64 {
        unreachable!("a sequential fold is never split")
    }
}

/// Integer sums and products wrapping in 64 bits, in any order.
struct WrapFold {
    prod: bool,
}

impl<S: Elem> Fold<S> for WrapFold {
    type St = u64;
    type Out = u64;
    const SPLIT: bool = true;
    fn start(&self) -> u64 {
        u64::from(self.prod)
    }
    fn feed(&self, sts: &mut [u64], parts: &[&[S]], _: usize) {
        let wide = |v: S| v.to_i128() as u64;
        for (a, v) in sts.iter_mut().zip(parts) {
            *a = if self.prod {
                v.iter().fold(*a, |a, &x| a.wrapping_mul(wide(x)))
            } else {
                v.iter().fold(*a, |a, &x| a.wrapping_add(wide(x)))
            };
        }
    }
    fn finish(&self, st: u64) -> u64 {
        st
    }
    fn combine(&self, parts: Vec<u64>) -> u64 {
        let mut st = [Fold::<S>::start(self)];
        for p in parts {
            st[0] = if self.prod {
                st[0].wrapping_mul(p)
            } else {
                st[0].wrapping_add(p)
            };
        }
        st[0]
    }
}

/// The minimum (maximum) and its index in the block: the first NaN, else the first
/// of the extremes. Pieces join in order by [`replaces`], which keeps the earlier of
/// two equal ones, so any cut gives the sequential scan's element.
struct ArgFold {
    max: bool,
}

impl<S: Elem> Fold<S> for ArgFold {
    type St = Option<(S, i64)>;
    type Out = Option<(S, i64)>;
    const SPLIT: bool = true;
    fn start(&self) -> Self::St {
        None
    }
    fn feed(&self, sts: &mut [Self::St], parts: &[&[S]], offset: usize) {
        for (st, v) in sts.iter_mut().zip(parts) {
            if v.is_empty() {
                continue;
            }
            let k = arg_extreme(self.max, v) as usize;
            *st = self.join(*st, Some((v[k], (offset + k) as i64)));
        }
    }
    fn finish(&self, st: Self::St) -> Self::St {
        st
    }
    fn combine(&self, parts: Vec<Self::St>) -> Self::St {
        parts.into_iter().fold(None, |a, b| self.join(a, b))
    }
}

/// The minimum (maximum) of the block: the first NaN, else the first of the
/// extremes, as [`ArgFold`] without the index.
struct ExtremeFold {
    max: bool,
}

impl<S: Elem> Fold<S> for ExtremeFold {
    type St = Option<S>;
    type Out = Option<S>;
    const SPLIT: bool = true;
    fn start(&self) -> Option<S> {
        None
    }
    fn feed(&self, sts: &mut [Option<S>], parts: &[&[S]], _: usize) {
        for (st, v) in sts.iter_mut().zip(parts) {
            if !v.is_empty() {
                *st = self.join(*st, Some(extreme(self.max, v)));
            }
        }
    }
    fn finish(&self, st: Option<S>) -> Option<S> {
        st
    }
    fn combine(&self, parts: Vec<Option<S>>) -> Option<S> {
        parts.into_iter().fold(None, |a, b| self.join(a, b))
    }
}

impl ExtremeFold {
    fn join<S: Elem>(&self, a: Option<S>, b: Option<S>) -> Option<S> {
        match (a, b) {
            (Some(x), Some(y)) => Some(if replaces(self.max, x, y) { y } else { x }),
            (x, None) => x,
            (None, y) => y,
        }
    }
}

impl ArgFold {
    fn join<S: Elem>(&self, a: Option<(S, i64)>, b: Option<(S, i64)>) -> Option<(S, i64)> {
        match (a, b) {
            (Some(x), Some(y)) => Some(if replaces(self.max, x.0, y.0) { y } else { x }),
            (x, None) => x,
            (None, y) => y,
        }
    }
}

/// Folds each block of `len` elements of `src` into `out[o]` (`len` at least 1):
/// large blocks of a [`Fold::SPLIT`] fold in the pieces of [`par::map_pieces`]
/// (those of [`sum_block`]) on the worker pool, read [`PIECE_GROUP`] at a time;
/// otherwise outputs split across the pool, small blocks read many at a time and
/// larger ones in groups of 8 side by side, piece by piece.
fn fold_blocks<S: Elem, F: Fold<S>>(f: &F, src: &Blocks<S>, len: usize, out: &mut [F::Out]) {
    if F::SPLIT
        && let Some((per, n)) = par::pieces(len, 1)
    {
        // The pieces of map_pieces(len, 1), read PIECE_GROUP at a time: a transposed
        // view's gathered rows are then that many times longer runs of its memory.
        let groups = n.div_ceil(PIECE_GROUP);
        for (o, r) in out.iter_mut().enumerate() {
            let parts = par::map_pieces(groups, PIECE_GROUP * per, |gs| {
                let first = gs.start * PIECE_GROUP * per;
                let end = (gs.end * PIECE_GROUP * per).min(len);
                src.read(&[(o * len + first, end - first)], |all| {
                    all[0]
                        .chunks(per)
                        .enumerate()
                        .map(|(i, piece)| {
                            let mut st = [f.start()];
                            f.feed(&mut st, &[piece], first + i * per);
                            f.finish(st[0])
                        })
                        .collect::<Vec<_>>()
                })
            });
            *r = f.combine(parts.into_iter().flatten().collect());
        }
        return;
    }
    let _ = par::chunks_mut(out, 1, len, |first, piece| {
        if len <= CHUNK / 2 {
            let per = CHUNK / len;
            for (i, batch) in piece.chunks_mut(per).enumerate() {
                let o = first + i * per;
                src.read(&[(o * len, batch.len() * len)], |all| {
                    let blocks: Vec<&[S]> = all[0].chunks(len).collect();
                    for (group, parts) in batch.chunks_mut(8).zip(blocks.chunks(8)) {
                        let mut sts = [f.start(); 8];
                        let sts = &mut sts[..group.len()];
                        f.feed(sts, parts, 0);
                        for (r, &st) in group.iter_mut().zip(sts.iter()) {
                            *r = f.finish(st);
                        }
                    }
                });
            }
        } else {
            for (i, group) in piece.chunks_mut(8).enumerate() {
                let mut sts = [f.start(); 8];
                let sts = &mut sts[..group.len()];
                fold_group(f, src, first + i * 8, len, 0..len, sts);
                for (r, &st) in group.iter_mut().zip(sts.iter()) {
                    *r = f.finish(st);
                }
            }
        }
        Ok(())
    });
}

/// Feeds the elements `range` of the blocks `o..o + sts.len()` (at most 8) to
/// their states, in pieces of at most [`CHUNK`] elements in all.
fn fold_group<S: Elem, F: Fold<S>>(
    f: &F,
    src: &Blocks<S>,
    o: usize,
    len: usize,
    range: std::ops::Range<usize>,
    sts: &mut [F::St],
) {
    let seg = (CHUNK / sts.len()) / 8 * 8;
    let mut j = range.start;
    while j < range.end {
        let m = seg.min(range.end - j);
        let mut ranges = [(0usize, 0usize); 8];
        for (b, r) in ranges[..sts.len()].iter_mut().enumerate() {
            *r = ((o + b) * len + j, m);
        }
        src.read(&ranges[..sts.len()], |parts| f.feed(sts, parts, j));
        j += m;
    }
}

/// `t` (not compact) reduced over `axes`, reading it in place through its strides
/// piece by piece instead of compacting it first, with the same results bit for bit
/// as the compact paths (each output sees its elements in the same order, float sums
/// over the last axes in [`sum_block`]'s pieces); `None` where its memory is not
/// host memory aligned for `S`.
fn reduce_strided<S: Elem>(
    red: Red,
    t: &Tensor,
    axes: &[usize],
    out_shape: &[i64],
    layout: &str,
    count: usize,
) -> Option<Result<Tensor>> {
    let view = blocked_view(t, axes);
    let suffix = is_suffix(axes, t.ndim());
    if !suffix && !view.is_compact() {
        // Gathering each output's elements across rows reads worse than a compact
        // copy reduced row by row (a stepped view over its first axis, say).
        return None;
    }
    let (items, origin) = view.host_items::<S>()?;
    let kept = t.ndim() - axes.len();
    if suffix && matches!(red, Red::Sum | Red::Mean) && !S::INT && sum_rows_fit(&view, kept) {
        return Some(t.storage().wait_host_readable().and_then(|()| {
            let mut accs = accumulators(out_shape, out_count(out_shape), 0.0)?;
            if count > 0 && !accs.is_empty() {
                sum_rows(&view, kept, items, origin, count, &mut accs);
            }
            float_output(red, accs, count, red.dtype(S::DTYPE), out_shape, layout)
        }));
    }
    Some(t.storage().wait_host_readable().and_then(|()| {
        let src = if view.is_compact() {
            Blocks::Slice(&items[origin..origin + view.numel()])
        } else {
            Blocks::View(&view, items)
        };
        reduce_blocks(
            red,
            &src,
            count,
            out_shape,
            layout,
            is_suffix(axes, t.ndim()),
        )
    }))
}

/// Outputs that [`sum_rows`] sums side by side at most: eight rows of running sums of
/// 1024 `f64` (64 KiB) stay in the L2 cache while the input streams through.
const SUM_ROW_RUN: usize = 1024;

/// Whether [`sum_rows`] applies to the blocked `view` (`kept` axes first): not compact,
/// with a last kept axis of stride 1 and at least 16 outputs long.
fn sum_rows_fit(view: &Tensor, kept: usize) -> bool {
    !view.is_compact() && kept >= 1 && view.strides()[kept - 1] == 1 && view.shape()[kept - 1] >= 16
}

/// [`LaneSum`] of every block of `len` (at least 1) elements of the blocked `view`
/// (its first `kept` axes the outputs', the last of them of stride 1: a transposed
/// matrix summed over its rows, say), read in place from `items` (element 0 at
/// `origin`): for a run of outputs next to each other in memory, each element of the
/// blocks is one contiguous row of the run, added to the row of running sums of its
/// lane (element `i` of a piece goes to lane `i % 8`), which the compiler vectorises
/// across the outputs. Gathering each block's elements instead reads one element of
/// each cache line per output. Every output gets the same lanes, the same order in each
/// lane, the same remainder and the same pieces (those of [`par::map_pieces`], joined
/// by `sum`) as [`fold_blocks`] with [`LaneSum`] and [`sum_block`] give it, so the
/// sums are the same bit for bit.
fn sum_rows<S: Elem>(
    view: &Tensor,
    kept: usize,
    items: &[S],
    origin: usize,
    len: usize,
    out: &mut [f64],
) {
    let (shape, strides) = (view.shape(), view.strides());
    let inner = shape[kept - 1] as usize;
    let split = par::pieces(len, 1).is_some();
    let piece = if split { par::PIECE_WORK } else { len };
    let unit = inner.min(SUM_ROW_RUN);
    // The identity `sum` starts from, which joins the pieces.
    let identity: f64 = std::iter::empty::<f64>().sum();
    let _ = par::chunks_mut(out, unit, unit * len, |first, part| {
        let mut lanes = vec![0f64; 8 * unit];
        let mut totals = vec![identity; unit];
        let (start, end) = (first * unit, first * unit + part.len());
        let mut p = start;
        while p < end {
            let (q, k0) = (p / inner, p % inner);
            let w = (inner - k0).min(end - p).min(unit);
            // Where output (q, k0) reads the first element of its block.
            let mut base = (origin + k0) as isize;
            let mut rest = q;
            for d in (0..kept - 1).rev() {
                let n = shape[d] as usize;
                base += (rest % n) as isize * strides[d] as isize;
                rest /= n;
            }
            let sums = &mut part[p - start..p - start + w];
            let totals = &mut totals[..w];
            totals.fill(identity);
            let lanes = &mut lanes[..8 * w];
            let mut offsets = Odometer::new(&shape[kept..], &strides[kept..]);
            let mut row = || &items[(base + offsets.next_offset()) as usize..][..w];
            let mut s = 0;
            while s < len {
                let e = (s + piece).min(len);
                let e8 = s + (e - s) / 8 * 8;
                lanes.fill(0.0);
                for i in s..e8 {
                    let lane = &mut lanes[(i % 8) * w..(i % 8 + 1) * w];
                    for (a, &x) in lane.iter_mut().zip(row()) {
                        *a += x.to_f64();
                    }
                }
                // LaneSum's finish: the lanes in a fixed tree, then the remainder.
                let l: Vec<&[f64]> = lanes.chunks(w).collect();
                for (k, o) in sums.iter_mut().enumerate() {
                    *o = ((l[0][k] + l[4][k]) + (l[1][k] + l[5][k]))
                        + ((l[2][k] + l[6][k]) + (l[3][k] + l[7][k]));
                }
                for _ in e8..e {
                    for (o, &x) in sums.iter_mut().zip(row()) {
                        *o += x.to_f64();
                    }
                }
                if split {
                    for (t, &o) in totals.iter_mut().zip(sums.iter()) {
                        *t += o;
                    }
                }
                s = e;
            }
            if split {
                sums.copy_from_slice(totals);
            }
            p += w;
        }
        Ok(())
    });
}

/// The offsets `Σ index[d] · strides[d]` of the indices of `shape`, in row-major
/// order.
struct Odometer<'a> {
    shape: &'a [i64],
    strides: &'a [i64],
    index: Vec<i64>,
    offset: isize,
}

impl<'a> Odometer<'a> {
    fn new(shape: &'a [i64], strides: &'a [i64]) -> Odometer<'a> {
        Odometer {
            shape,
            strides,
            index: vec![0; shape.len()],
            offset: 0,
        }
    }

    /// The current index's offset; then steps to the next index.
    fn next_offset(&mut self) -> isize {
        let at = self.offset;
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.offset += self.strides[d] as isize;
            if self.index[d] < self.shape[d] {
                break;
            }
            self.offset -= (self.shape[d] * self.strides[d]) as isize;
            self.index[d] = 0;
        }
        at
    }
}

/// [`reduce_strided`] over the blocks of `len` elements of `src`.
fn reduce_blocks<S: Elem>(
    red: Red,
    src: &Blocks<S>,
    len: usize,
    out_shape: &[i64],
    layout: &str,
    suffix: bool,
) -> Result<Tensor> {
    let out_dtype = red.dtype(S::DTYPE);
    match red {
        Red::Min | Red::Max => {
            let max = red == Red::Max;
            let mut accs = accumulators(out_shape, out_count(out_shape), None)?;
            if !accs.is_empty() {
                if len == 0 {
                    return Err(zero_size(red.name()));
                }
                fold_blocks(&ExtremeFold { max }, src, len, &mut accs);
            }
            make::<S>(out_shape, layout, |out| {
                for (o, a) in out.iter_mut().zip(accs) {
                    *o = a.unwrap_or(*o);
                }
                Ok(())
            })
        }
        Red::Sum | Red::Prod if S::INT => {
            let prod = red == Red::Prod;
            let mut accs = accumulators(out_shape, out_count(out_shape), u64::from(prod))?;
            if len > 0 && !accs.is_empty() {
                fold_blocks(&WrapFold { prod }, src, len, &mut accs);
            }
            int_output(&accs, out_dtype, out_shape, layout)
        }
        Red::Sum | Red::Prod | Red::Mean => {
            let prod = red == Red::Prod;
            let mut accs =
                accumulators(out_shape, out_count(out_shape), f64::from(u8::from(prod)))?;
            if len > 0 && !accs.is_empty() {
                if suffix && !prod {
                    fold_blocks(&LaneSum, src, len, &mut accs);
                } else {
                    fold_blocks(&SeqFold { prod }, src, len, &mut accs);
                }
            }
            float_output(red, accs, len, out_dtype, out_shape, layout)
        }
        Red::All | Red::Any => unreachable!("handled on bools"),
    }
}

/// [`argreduce`] of a non-compact `t` over `axes` (one, or all for the flattened
/// tensor; `len` elements each) read in place as [`reduce_strided`] does; `None`
/// where its memory is not host memory aligned for `S`.
fn arg_strided<S: Elem>(
    max: bool,
    t: &Tensor,
    axes: &[usize],
    len: usize,
) -> Option<Result<Vec<i64>>> {
    let view = blocked_view(t, axes);
    let (items, origin) = view.host_items::<S>()?;
    Some(t.storage().wait_host_readable().map(|()| {
        let src = if view.is_compact() {
            Blocks::Slice(&items[origin..origin + view.numel()])
        } else {
            Blocks::View(&view, items)
        };
        let mut accs = vec![None; t.numel() / len];
        fold_blocks(&ArgFold { max }, &src, len, &mut accs);
        accs.into_iter().map(|a| a.map_or(0, |(_, k)| k)).collect()
    }))
}

pub(crate) fn axes_arg(shape: &[i64], args: &Args) -> Result<(Vec<usize>, bool)> {
    let axes = args.ints("axes")?;
    let axes = normalize_axes(axes.as_deref(), shape.len())?;
    Ok((axes, args.bool_or("keepdims", false)?))
}

fn axis_arg(shape: &[i64], args: &Args) -> Result<(Option<usize>, bool)> {
    let keepdims = args.bool_or("keepdims", false)?;
    match args.get("axis") {
        None => Ok((None, keepdims)),
        Some(_) => {
            let a = args.int_or("axis", 0)?;
            let axes = normalize_axes(Some(&[a]), shape.len())?;
            Ok((Some(axes[0]), keepdims))
        }
    }
}

fn spec(name: &str, ty: ArgType) -> ArgSpec {
    ArgSpec {
        name: name.to_string(),
        ty,
        required: false,
    }
}

/// The reduction operators.
pub fn ops() -> Vec<OpDef> {
    let mut ops: Vec<OpDef> = [
        Red::Sum,
        Red::Prod,
        Red::Mean,
        Red::Min,
        Red::Max,
        Red::All,
        Red::Any,
    ]
    .into_iter()
    .map(|red| OpDef {
        name: red.name().to_string(),
        n_inputs: 1,
        n_outputs: 1,
        args: vec![spec("axes", ArgType::Ints), spec("keepdims", ArgType::Bool)],
        infer: Some(Arc::new(move |i: &[&TMeta], args: &Args| {
            let m = i[0];
            let (axes, keepdims) = axes_arg(&m.shape, args)?;
            Ok(vec![TMeta {
                dtype: red.dtype(m.dtype),
                shape: reduced_shape(&m.shape, &axes, keepdims),
                layout: kept_layout(&m.layout, &axes, keepdims),
            }])
        })),
        kernel: Kernel::Builtin(Arc::new(move |i: &[&Tensor], args: &Args| {
            let (axes, keepdims) = axes_arg(i[0].shape(), args)?;
            Ok(vec![reduce(red, i[0], &axes, keepdims)?])
        })),
    })
    .collect();
    for (name, max) in [("argmin", false), ("argmax", true)] {
        ops.push(OpDef {
            name: name.to_string(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![spec("axis", ArgType::Int), spec("keepdims", ArgType::Bool)],
            infer: Some(Arc::new(|i: &[&TMeta], args: &Args| {
                let m = i[0];
                let (axis, keepdims) = axis_arg(&m.shape, args)?;
                let shape = match axis {
                    Some(a) => reduced_shape(&m.shape, &[a], keepdims),
                    None if keepdims => vec![1; m.shape.len()],
                    None => vec![],
                };
                Ok(vec![TMeta {
                    dtype: DType::I64,
                    shape,
                    layout: if keepdims {
                        m.layout.clone()
                    } else {
                        String::new()
                    },
                }])
            })),
            kernel: Kernel::Builtin(Arc::new(move |i: &[&Tensor], args: &Args| {
                let (axis, keepdims) = axis_arg(i[0].shape(), args)?;
                Ok(vec![argreduce(max, i[0], axis, keepdims)?])
            })),
        });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn sums_products_and_means_over_axes() {
        let a = t::<i32>(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let all = reduce(Red::Sum, &a, &[0, 1], false).unwrap();
        assert_eq!(
            (all.dtype(), all.shape().to_vec(), vals::<i64>(&all)),
            (DType::I64, vec![], vec![21])
        );
        let rows = reduce(Red::Sum, &a, &[1], true).unwrap();
        assert_eq!(
            (rows.shape().to_vec(), vals::<i64>(&rows)),
            (vec![2, 1], vec![6, 15])
        );
        assert_eq!(
            vals::<i64>(&reduce(Red::Prod, &a, &[0], false).unwrap()),
            [4, 10, 18]
        );
        let m = reduce(Red::Mean, &a, &[1], false).unwrap();
        assert_eq!((m.dtype(), vals::<f64>(&m)), (DType::F64, vec![2.0, 5.0]));
        assert!(
            normalize_axes(Some(&[2]), 2)
                .unwrap_err()
                .message()
                .contains("axis 2 is out of range")
        );
    }

    #[test]
    fn min_max_propagate_nan_and_refuse_empty() {
        let f = t::<f32>(&[1.0, f32::NAN, -3.0, 2.0], &[2, 2]);
        let mn = reduce(Red::Min, &f, &[1], false).unwrap();
        let v = vals::<f32>(&mn);
        assert!(v[0].is_nan() && v[1] == -3.0, "{v:?}");
        let empty = t::<f32>(&[], &[0, 2]);
        let e = reduce(Red::Max, &empty, &[0], false).unwrap_err();
        assert!(e.message().contains("zero-size"), "{e}");
    }

    #[test]
    fn arg_reductions_take_the_first_extreme_and_first_nan() {
        let a = t::<i32>(&[3, 1, 1, 7, 7, 0], &[2, 3]);
        assert_eq!(
            vals::<i64>(&argreduce(false, &a, None, false).unwrap()),
            [5]
        );
        assert_eq!(
            vals::<i64>(&argreduce(true, &a, Some(1), false).unwrap()),
            [0, 0]
        );
        assert_eq!(
            vals::<i64>(&argreduce(false, &a, Some(0), true).unwrap()),
            [0, 0, 1]
        );
        let f = t::<f64>(&[1.0, f64::NAN, 5.0, f64::NAN], &[4]);
        assert_eq!(vals::<i64>(&argreduce(true, &f, None, false).unwrap()), [1]);
    }

    #[test]
    fn all_any_and_bool_min_max() {
        let b = t::<u8>(&[1, 0, 1, 1], &[2, 2]).with_dtype_of_same_size(DType::Bool);
        assert_eq!(
            reduce(Red::All, &b, &[1], false)
                .unwrap()
                .to_bytes()
                .unwrap(),
            [0, 1]
        );
        assert_eq!(
            reduce(Red::Any, &b, &[0], false)
                .unwrap()
                .to_bytes()
                .unwrap(),
            [1, 1]
        );
        assert_eq!(
            reduce(Red::Min, &b, &[0, 1], false).unwrap().dtype(),
            DType::Bool
        );
    }
}

#[cfg(test)]
mod fast_path_tests {
    use super::*;

    /// Min/max/argmax over `axis` of a compact `[outer, len, inner]` f32 tensor, by
    /// the sequential definition: the first NaN wins, else the first strictly better.
    fn sequential(max: bool, v: &[f32], len: usize, inner: usize) -> (Vec<u32>, Vec<i64>) {
        let outer = v.len() / (len * inner);
        let (mut vals, mut idx) = (Vec::new(), Vec::new());
        for o in 0..outer {
            for k in 0..inner {
                let (mut b, mut bj) = (v[o * len * inner + k], 0);
                for j in 1..len {
                    let x = v[(o * len + j) * inner + k];
                    if !b.is_nan() && (x.is_nan() || (max && x > b) || (!max && x < b)) {
                        (b, bj) = (x, j as i64);
                    }
                }
                vals.push(b.to_bits());
                idx.push(bj);
            }
        }
        (vals, idx)
    }

    #[test]
    fn min_max_over_rows_give_the_sequential_bits_with_nans_anywhere() {
        // Rows wider than one run (runs of 1024 f32 cut across the outer index too),
        // equal zeros of both signs, NaNs of distinct payloads: in the first row (kept),
        // late in a column (the first one wins), in the last row, and none in some
        // runs; on several threads for the larger shapes.
        let pattern = [0.0f32, -0.0, -1.0, -0.0, 0.0, -3.0, 2.0, 2.0];
        let nans = [0x7fc0_0001u32, 0x7fc0_0002, 0xffc0_0003, 0x7f80_0004];
        for (len, inner) in [(5, 1500), (70, 2100), (2, 3000), (9, 2)] {
            let outer = 3;
            let mut v: Vec<f32> = (0..outer * len * inner)
                .map(|i| pattern[(i * 7 + i / 5) % pattern.len()])
                .collect();
            let at = |o: usize, j: usize, k: usize| (o * len + j) * inner + k;
            v[at(0, 0, 1)] = f32::from_bits(nans[0]);
            v[at(0, len - 1, 1)] = f32::from_bits(nans[1]);
            v[at(1, len / 2, inner - 1)] = f32::from_bits(nans[2]);
            v[at(1, len - 1, inner - 1)] = f32::from_bits(nans[3]);
            v[at(2, len - 1, 0)] = f32::from_bits(nans[3]);
            let t = make::<f32>(&[outer as i64, len as i64, inner as i64], "", |o| {
                o.copy_from_slice(&v);
                Ok(())
            })
            .unwrap();
            for max in [false, true] {
                let (want, _) = sequential(max, &v, len, inner);
                let (red, got) = extreme_bits(max, &t);
                let first_wrong = got.iter().zip(&want).position(|(g, w)| g != w);
                assert_eq!(first_wrong, None, "{red:?} len {len} inner {inner}");
                assert_eq!(got[1], nans[0], "the first row's NaN stays");
                if len > 2 {
                    assert_eq!(got[2 * inner - 1], nans[2], "the first NaN wins");
                }
                assert_eq!(got[2 * inner], nans[3], "a NaN in the last row");
            }
        }
    }

    /// min (or max) of float32 `t` over axis 1, as bits.
    fn extreme_bits(max: bool, t: &Tensor) -> (Red, Vec<u32>) {
        let red = if max { Red::Max } else { Red::Min };
        let got = reduce(red, t, &[1], false).unwrap();
        let values = typed::<f32>(&got).unwrap();
        (red, values.iter().map(|x| x.to_bits()).collect())
    }

    #[test]
    fn min_max_and_argmax_fast_paths_give_the_sequential_bits() {
        // Equal zeros of both signs spread across the 16 lanes, NaN late, and blocks
        // long enough for the lanes and for pieces on several threads.
        let pattern = [0.0f32, -0.0, -1.0, -0.0, 0.0, -3.0];
        for (len, inner, nan_at) in [
            (40, 1, None),
            (40, 3, None),
            (37, 1, Some(35)),
            (33, 5, Some(20)),
            (300_000, 1, None),
        ] {
            let outer = 3;
            let mut v: Vec<f32> = (0..outer * len * inner)
                .map(|i| pattern[(i * 7 + i / 5) % 6])
                .collect();
            if let Some(at) = nan_at {
                v[at * inner] = f32::NAN;
            }
            let t = make::<f32>(&[outer as i64, len as i64, inner as i64], "", |o| {
                o.copy_from_slice(&v);
                Ok(())
            })
            .unwrap();
            for max in [false, true] {
                let (want, want_idx) = sequential(max, &v, len, inner);
                let (red, got) = extreme_bits(max, &t);
                assert_eq!(got, want, "{red:?} len {len} inner {inner}");
                let idx = argreduce(max, &t, Some(1), false).unwrap();
                assert_eq!(
                    typed::<i64>(&idx).unwrap().to_vec(),
                    want_idx,
                    "arg {red:?} len {len} inner {inner}"
                );
            }
        }
    }

    #[test]
    fn float_sums_over_leading_axes_fold_each_output_in_order() {
        // [outer, len, inner] float64 of magnitudes that round differently in another
        // order: runs of outputs that cross from one outer index to the next, rows
        // folded four at a time with 0 to 3 left over, and enough work for pieces.
        for (outer, len, inner) in [(2, 11, 2500), (3, 6, 5), (1, 9, 70_000), (2, 4, 3)] {
            let v: Vec<f64> = (0..outer * len * inner)
                .map(|i| {
                    let scale = [1e12, 0.3, -1e12, 0.7, 1e-3][(i * 3 + i / 7) % 5];
                    (i as f64 * 0.37).sin() * scale + (i % 7) as f64
                })
                .collect();
            let t = make::<f64>(&[outer as i64, len as i64, inner as i64], "", |o| {
                o.copy_from_slice(&v);
                Ok(())
            })
            .unwrap();
            let at = |o: usize, j: usize, k: usize| v[(o * len + j) * inner + k];
            let mut want = Vec::new();
            let mut reversed_differs = false;
            for o in 0..outer {
                for k in 0..inner {
                    let s = (0..len).fold(0.0, |a, j| a + at(o, j, k));
                    let r = (0..len).rev().fold(0.0, |a, j| a + at(o, j, k));
                    reversed_differs |= s.to_bits() != r.to_bits();
                    want.push(s);
                }
            }
            assert!(reversed_differs, "the values show the order");
            let what = format!("[{outer}, {len}, {inner}]");
            let got = reduce(Red::Sum, &t, &[1], false).unwrap();
            let got = typed::<f64>(&got).unwrap();
            let first_wrong = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g.to_bits() != w.to_bits());
            assert_eq!(first_wrong, None, "sum over {what}");
            let mean = reduce(Red::Mean, &t, &[1], false).unwrap();
            let mean = typed::<f64>(&mean).unwrap();
            let first_wrong = mean
                .iter()
                .zip(&want)
                .position(|(g, w)| g.to_bits() != (w / len as f64).to_bits());
            assert_eq!(first_wrong, None, "mean over {what}");
        }
    }

    #[test]
    fn integer_sums_wrap_to_64_bits_and_float_sums_start_from_zero() {
        let big = make::<i64>(&[2, 2], "", |o| {
            o.copy_from_slice(&[i64::MAX, 5, 2, -7]);
            Ok(())
        })
        .unwrap();
        let s = reduce(Red::Sum, &big, &[0], false).unwrap();
        assert_eq!(typed::<i64>(&s).unwrap().to_vec(), [i64::MIN + 1, -2]);
        let u = make::<u8>(&[3, 2], "", |o| {
            o.copy_from_slice(&[255, 1, 255, 2, 255, 3]);
            Ok(())
        })
        .unwrap();
        let p = reduce(Red::Prod, &u, &[0], false).unwrap();
        assert_eq!(typed::<u64>(&p).unwrap().to_vec(), [255 * 255 * 255, 6]);
        // 0.0 + -0.0 is 0.0: a sum over -0.0 alone is +0.0, as NumPy's.
        let z = make::<f32>(&[1, 2], "", |o| {
            o.fill(-0.0);
            Ok(())
        })
        .unwrap();
        let s = reduce(Red::Sum, &z, &[0], false).unwrap();
        assert!(typed::<f32>(&s).unwrap().iter().all(|x| x.to_bits() == 0));
    }
}

#[cfg(test)]
mod strided_tests {
    use super::*;

    /// NaN number `k` of a float type, with its own payload.
    fn nan<S: Elem>(k: u64) -> S {
        let bytes = match size_of::<S>() {
            2 => (0x7e00u16 | k as u16).to_ne_bytes().to_vec(),
            4 => (0x7fc0_0000u32 | k as u32).to_ne_bytes().to_vec(),
            _ => (0x7ff8_0000_0000_0000u64 | k).to_ne_bytes().to_vec(),
        };
        bytemuck::pod_read_unaligned(&bytes)
    }

    /// A compact tensor of `n` values of `S` of many magnitudes (so that a float sum
    /// rounds differently in another order), with zeros of both signs, equal
    /// extremes, and NaNs of distinct payloads at `nans`.
    fn base<S: Elem>(n: usize, nans: &[usize]) -> Tensor {
        make::<S>(&[n as i64], "", |o| {
            for (i, x) in o.iter_mut().enumerate() {
                let v = (i as f64 * 0.7).sin() * 10f64.powi((i % 9) as i32 - 3);
                *x = S::from_f64(match i % 13 {
                    3 => -0.0,
                    7 => 0.0,
                    11 => 90.0,
                    _ => v,
                });
            }
            if !S::INT {
                for (k, &at) in nans.iter().enumerate() {
                    o[at % n] = nan::<S>(k as u64 + 1);
                }
            }
            Ok(())
        })
        .unwrap()
    }

    /// Every reduction of `view` (non-compact) over every set of axes, against the
    /// same reduction of its compact copy: the same dtype, shape and bytes.
    fn check(view: &Tensor, what: &str) {
        assert!(!view.is_compact(), "{what}");
        let compact = view.to_compact().unwrap();
        let n = view.ndim();
        let mut axes_sets: Vec<Vec<usize>> = vec![(0..n).collect(), vec![]];
        axes_sets.extend((0..n).map(|a| vec![a]));
        if n == 3 {
            axes_sets.extend([vec![0, 2], vec![1, 2], vec![0, 1]]);
        }
        let same = |a: Result<Tensor>, b: Result<Tensor>, label: String| {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.dtype(), b.dtype(), "{label}");
            assert_eq!(a.shape(), b.shape(), "{label}");
            assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{label}");
        };
        for red in [
            Red::Sum,
            Red::Prod,
            Red::Mean,
            Red::Min,
            Red::Max,
            Red::All,
            Red::Any,
        ] {
            for axes in &axes_sets {
                same(
                    reduce(red, view, axes, false),
                    reduce(red, &compact, axes, false),
                    format!("{what}: {red:?} over {axes:?}"),
                );
            }
        }
        for max in [false, true] {
            for axis in std::iter::once(None).chain((0..n).map(Some)) {
                same(
                    argreduce(max, view, axis, false),
                    argreduce(max, &compact, axis, false),
                    format!("{what}: arg (max {max}) over {axis:?}"),
                );
            }
        }
    }

    /// Transposed, flipped, stepped and permuted 3-d views of a tensor of `S`.
    fn views<S: Elem>(nans: &[usize]) {
        let name = S::DTYPE.name();
        // [r, c] = [40, 27] and its transpose.
        let b = base::<S>(40 * 27, nans);
        check(
            &b.restride(vec![27, 40], vec![1, 27], 0),
            &format!("{name} transposed"),
        );
        // Rows and columns reversed.
        check(
            &b.restride(vec![40, 27], vec![-27, -1], 40 * 27 - 1),
            &format!("{name} flipped"),
        );
        // [::2, ::3].
        check(
            &b.restride(vec![20, 9], vec![54, 3], 0),
            &format!("{name} stepped"),
        );
        // A [4, 5, 6] tensor with its axes permuted to [6, 4, 5], one reversed.
        check(
            &b.restride(vec![6, 4, 5], vec![1, 30, -6], 24),
            &format!("{name} 3-d"),
        );
    }

    #[test]
    fn strided_reductions_give_the_compact_copys_bits() {
        let nans = [5, 333, 334, 700, 701, 1000];
        views::<f32>(&nans);
        views::<f64>(&nans);
        views::<half::f16>(&nans);
        views::<i32>(&[]);
        views::<u8>(&[]);
        let b = base::<u8>(40 * 27, &[]).with_dtype_of_same_size(DType::Bool);
        check(&b.restride(vec![27, 40], vec![1, 27], 0), "bool transposed");
        // Without NaNs, so that the sums' rounding shows.
        views::<f32>(&[]);
        // Zeros of both signs as the minimums, no NaN: the first zero's sign.
        let z = make::<f32>(&[40 * 27], "", |o| {
            for (i, x) in o.iter_mut().enumerate() {
                *x = [0.0, -0.0, 1.0, 0.0, -0.0, -0.0, 2.0][(i * 5 + i / 7) % 7];
            }
            Ok(())
        })
        .unwrap();
        check(
            &z.restride(vec![27, 40], vec![1, 27], 0),
            "zeros transposed",
        );
        check(
            &z.restride(vec![40, 27], vec![-27, -1], 40 * 27 - 1),
            "zeros flipped",
        );
    }

    #[test]
    fn large_strided_reductions_keep_the_pieces_of_the_compact_sum() {
        // Enough elements for pieces on several threads (a full sum of 2^18 and more
        // in pieces of 2^16; blocks longer than a gathered piece), NaNs late or none.
        for nans in [vec![], vec![300_001, 299_999]] {
            let b = base::<f32>(600 * 520, &nans);
            let t = b.restride(vec![520, 600], vec![1, 520], 0);
            let c = t.to_compact().unwrap();
            for red in [Red::Sum, Red::Mean, Red::Prod, Red::Max, Red::Min] {
                for axes in [vec![0, 1], vec![0], vec![1]] {
                    let got = reduce(red, &t, &axes, false).unwrap();
                    let want = reduce(red, &c, &axes, false).unwrap();
                    assert_eq!(
                        got.to_bytes().unwrap(),
                        want.to_bytes().unwrap(),
                        "{red:?} over {axes:?} with NaNs {nans:?}"
                    );
                }
            }
            for axis in [None, Some(0), Some(1)] {
                let got = argreduce(true, &t, axis, false).unwrap();
                let want = argreduce(true, &c, axis, false).unwrap();
                assert_eq!(
                    got.to_bytes().unwrap(),
                    want.to_bytes().unwrap(),
                    "{axis:?}"
                );
            }
            // Zeros as extremes, in pieces: the first one's sign (-0.0, the others
            // 0.0).
            let z = make::<f32>(&[600 * 520], "", |o| {
                o[0] = -0.0;
                Ok(())
            })
            .unwrap();
            let t = z.restride(vec![520, 600], vec![1, 520], 0);
            let c = t.to_compact().unwrap();
            for red in [Red::Min, Red::Max] {
                let got = reduce(red, &t, &[0, 1], false).unwrap();
                let want = reduce(red, &c, &[0, 1], false).unwrap();
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{red:?}");
            }
            // A float64 sum shows the rounding of its pieces' sums: pieces of 2^16
            // elements of 1e12, 0.3, -1e12, 0.7 and the rest.
            let b = base::<f64>(600 * 520, &nans);
            let b = make::<f64>(&[600 * 520], "", |o| {
                o.copy_from_slice(&typed::<f64>(&b).unwrap());
                let scale = [1e12, 0.3, -1e12, 0.7];
                for (i, x) in o.iter_mut().enumerate().take(4 << 16) {
                    *x = x.abs().min(1.0) * scale[i >> 16] + 1e-3 * i as f64;
                }
                Ok(())
            })
            .unwrap();
            let t = b.restride(vec![520, 600], vec![1, 520], 0);
            let c = t.to_compact().unwrap();
            for red in [Red::Sum, Red::Mean] {
                let got = reduce(red, &t, &[0, 1], false).unwrap();
                let want = reduce(red, &c, &[0, 1], false).unwrap();
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{red:?}");
            }
            // Two blocks of 2^18 elements, each summed in pieces.
            let b = base::<f32>(2 << 18, &nans);
            let t = b.restride(vec![2, 1 << 18], vec![1, 2], 0);
            let c = t.to_compact().unwrap();
            for red in [Red::Sum, Red::Max] {
                let got = reduce(red, &t, &[1], false).unwrap();
                let want = reduce(red, &c, &[1], false).unwrap();
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{red:?}");
            }
            // Blocks longer than half a gathered piece, several outputs.
            let b = base::<f64>(3 * 40_000, &nans);
            let t = b.restride(vec![3, 40_000], vec![1, 3], 0);
            let c = t.to_compact().unwrap();
            for red in [Red::Sum, Red::Prod, Red::Min] {
                let got = reduce(red, &t, &[1], false).unwrap();
                let want = reduce(red, &c, &[1], false).unwrap();
                assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{red:?}");
            }
        }
    }

    /// The documented order of a float sum over the last axes, written out: pieces of
    /// 2^16 elements when the block has 2^18 or more (joined by `sum`), each in eight
    /// lanes by index, the lanes added in a fixed tree, then the remainder in order.
    fn lane_sum_reference(block: &[f64]) -> f64 {
        let piece_sum = |p: &[f64]| {
            let mut lanes = [0f64; 8];
            let n8 = p.len() / 8 * 8;
            for (i, &x) in p[..n8].iter().enumerate() {
                lanes[i % 8] += x;
            }
            let l = lanes;
            let mut s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
            for &x in &p[n8..] {
                s += x;
            }
            s
        };
        if block.len() >= par::MIN_WORK {
            block.chunks(par::PIECE_WORK).map(piece_sum).sum()
        } else {
            piece_sum(block)
        }
    }

    /// Sums over the last axes of views whose outputs lie next to each other in memory
    /// (summed as rows of partial sums, read in place) against the compact copy's sum,
    /// bit for bit, and against the documented order written out: odd sizes, runs of
    /// outputs that cross rows, several reduced axes, a reversed one, and blocks long
    /// enough to be summed in pieces with a remainder.
    #[test]
    fn sums_of_rows_of_outputs_keep_the_lanes_and_pieces_of_the_compact_sum() {
        // [37, 3, 1030] of many magnitudes, NaN-free, as f32 and f64.
        fn views_of<S: Elem>() {
            let name = S::DTYPE.name();
            let b = base::<S>(37 * 3 * 1030, &[]);
            let cases = [
                // [3, 1030, 37] over the last axis: 1030 outputs a row, in runs that
                // cross from one row of outputs to the next.
                (vec![3, 1030, 37], vec![1030, 1, 3090], 0, vec![2]),
                // [1030, 37, 3] over its last two axes.
                (vec![1030, 37, 3], vec![1, 3090, 1030], 0, vec![1, 2]),
                // The same with the 37 reversed.
                (
                    vec![1030, 37, 3],
                    vec![1, -3090, 1030],
                    36 * 3090,
                    vec![1, 2],
                ),
                // [1030, 111] (the 37 and 3 merged, stepped by 1030) over its last axis.
                (vec![1030, 111], vec![1, 1030], 0, vec![1]),
                // Outputs [1030, 3] whose last axis is not of stride 1: the gathered
                // path, for comparison.
                (vec![1030, 3, 37], vec![1, 1030, 3090], 0, vec![2]),
            ];
            for (shape, strides, origin, axes) in cases {
                let what = format!("{name} {shape:?} / {strides:?} over {axes:?}");
                let t = b.restride(shape.clone(), strides.clone(), origin);
                let c = t.to_compact().unwrap();
                for red in [Red::Sum, Red::Mean] {
                    let got = reduce(red, &t, &axes, false).unwrap();
                    let want = reduce(red, &c, &axes, false).unwrap();
                    assert_eq!(got.shape(), want.shape(), "{what}");
                    assert_eq!(
                        got.to_bytes().unwrap(),
                        want.to_bytes().unwrap(),
                        "{red:?} {what}"
                    );
                }
                // The compact copy's blocks, in the documented order.
                let len: usize = axes.iter().map(|&a| shape[a] as usize).product();
                let vals: Vec<f64> = typed::<S>(&c).unwrap().iter().map(|x| x.to_f64()).collect();
                let got = reduce(Red::Sum, &t, &axes, false).unwrap();
                let got: Vec<f64> = typed::<S>(&got)
                    .unwrap()
                    .iter()
                    .map(|x| x.to_f64())
                    .collect();
                let want: Vec<f64> = vals
                    .chunks(len)
                    .map(|b| S::from_f64(lane_sum_reference(b)).to_f64())
                    .collect();
                assert_eq!(got.len(), want.len(), "{what}");
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "output {k} of {what}");
                }
            }
        }
        // float32 views compact in memory order (all but the last case) are summed in
        // memory order (see reduce_in_memory_order), which rounds to the same float32
        // here; float64 ones take the rows of outputs.
        views_of::<f32>();
        views_of::<f64>();
        // 17 outputs of 2^18 + 13 elements each: pieces of 2^16 and a last one with
        // a remainder of 5, magnitudes that round differently in another order.
        let len = (1usize << 18) + 13;
        let b = make::<f64>(&[len as i64, 17], "", |o| {
            for (i, x) in o.iter_mut().enumerate() {
                let scale = [1e12, 0.3, -1e12, 0.7, 1e-3][((i / 17) >> 16) % 5];
                *x = (i as f64 * 0.37).sin() * scale + (i % 7) as f64;
            }
            Ok(())
        })
        .unwrap();
        let t = b.restride(vec![17, len as i64], vec![1, 17], 0);
        let c = t.to_compact().unwrap();
        let got = reduce(Red::Sum, &t, &[1], false).unwrap();
        let want = reduce(Red::Sum, &c, &[1], false).unwrap();
        assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap());
        let got = typed::<f64>(&got).unwrap();
        let vals = typed::<f64>(&c).unwrap();
        for (k, block) in vals.chunks(len).enumerate() {
            assert_eq!(
                got[k].to_bits(),
                lane_sum_reference(block).to_bits(),
                "output {k}"
            );
        }
        let naive: f64 = vals[..len].iter().sum();
        assert_ne!(
            lane_sum_reference(&vals[..len]).to_bits(),
            naive.to_bits(),
            "the values show the order"
        );
    }
}

#[cfg(test)]
mod memory_order_tests {
    use super::*;

    /// A compact tensor of `n` values of `S` whose sums are exact in `f64` in any
    /// order (multiples of 1/4 below 250 in magnitude; integers for integer types),
    /// distinct enough that every output of a reduction differs from its neighbours.
    fn exact_base<S: Elem>(n: usize) -> Tensor {
        make::<S>(&[n as i64], "", |o| {
            for (m, x) in o.iter_mut().enumerate() {
                let k = (m * 37 + m / 11) % 997;
                *x = if S::INT {
                    S::from_f64((k % 113) as f64)
                } else {
                    S::from_f64(k as f64 * 0.25 - 120.0)
                };
            }
            Ok(())
        })
        .unwrap()
    }

    /// `red` of `view` over `axes` the straightforward way: every element by its
    /// logical index (read through the view's strides from its memory), folded in
    /// `f64` into the output of its kept coordinates, in row-major order of the kept
    /// axes; the result rounded to the output dtype (a mean divided first).
    fn reference<S: Elem>(red: Red, view: &Tensor, axes: &[usize]) -> Vec<f64> {
        let (shape, strides) = (view.shape(), view.strides());
        let (items, origin) = view.host_items::<S>().unwrap();
        let reduced = axis_mask(axes, shape.len());
        let n_out: usize = (0..shape.len())
            .filter(|&a| !reduced[a])
            .map(|a| shape[a] as usize)
            .product();
        let mut acc: Vec<Option<f64>> = vec![None; n_out];
        let mut index = vec![0i64; shape.len()];
        for _ in 0..view.numel() {
            let at = origin as i64 + (0..shape.len()).map(|d| index[d] * strides[d]).sum::<i64>();
            let x = items[at as usize].to_f64();
            let o = (0..shape.len())
                .filter(|&a| !reduced[a])
                .fold(0usize, |o, a| o * shape[a] as usize + index[a] as usize);
            acc[o] = Some(match (red, acc[o]) {
                (_, None) => x,
                (Red::Sum | Red::Mean, Some(a)) => a + x,
                (Red::Min, Some(a)) => a.min(x),
                (Red::Max, Some(a)) => a.max(x),
                _ => unreachable!(),
            });
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        let count = view.numel() / n_out.max(1);
        acc.into_iter()
            .map(|a| {
                let a = a.unwrap();
                let v = if red == Red::Mean {
                    a / count as f64
                } else {
                    a
                };
                with_elem!(red.dtype(S::DTYPE), D => D::from_f64(v).to_f64(),
                    bool => unreachable!())
            })
            .collect()
    }

    fn as_f64(t: &Tensor) -> Vec<f64> {
        with_elem!(t.dtype(), D => typed::<D>(t).unwrap().iter().map(|x| x.to_f64()).collect(),
            bool => unreachable!())
    }

    /// Transposed, flipped and permuted 3-d views of dense memory (each compact in
    /// memory order) and every set of axes whose kept axes keep their memory order.
    fn views<S: Elem>() {
        let name = S::DTYPE.name();
        let b = exact_base::<S>(4 * 5 * 6 * 7);
        for (what, shape, strides, origin) in cases() {
            let view = b.restride(shape.clone(), strides, origin);
            assert!(!view.is_compact(), "{what}");
            let n = shape.len();
            let mut axes_sets: Vec<Vec<usize>> = vec![(0..n).collect()];
            axes_sets.extend((0..n).map(|a| vec![a]));
            axes_sets.extend((0..n).flat_map(|a| (a + 1..n).map(move |b| vec![a, b])));
            for axes in &axes_sets {
                for red in [Red::Sum, Red::Mean, Red::Min, Red::Max] {
                    let label = format!("{name} {what}: {red:?} over {axes:?}");
                    let got = reduce(red, &view, axes, false).unwrap();
                    assert_eq!(got.dtype(), red.dtype(S::DTYPE), "{label}");
                    assert_eq!(got.shape(), reduced_shape(&shape, axes, false), "{label}");
                    let want = reference::<S>(red, &view, axes);
                    let got = as_f64(&got);
                    let first_wrong = got.iter().zip(&want).position(|(g, w)| g != w);
                    assert_eq!(first_wrong, None, "{label}: {got:?} against {want:?}");
                    // The outputs differ, so that a wrong order of outputs shows.
                    if want.len() > 1 && red != Red::Min && red != Red::Max {
                        assert!(want.windows(2).any(|w| w[0] != w[1]), "{label}");
                    }
                }
            }
        }
    }

    /// The view cases of [`views`]: (name, shape, strides, origin) over 840 elements.
    fn cases() -> Vec<(&'static str, Vec<i64>, Vec<i64>, i64)> {
        vec![
            ("transposed", vec![35, 24], vec![1, 35], 0),
            ("flipped", vec![24, 35], vec![-35, -1], 24 * 35 - 1),
            (
                "transposed, one axis flipped",
                vec![35, 24],
                vec![-1, 35],
                34,
            ),
            // [4, 5, 6, 7] as [7, 4, 6, 5] (one axis reversed).
            ("permuted 4-d", vec![7, 4, 6, 5], vec![1, 210, -7, 42], 35),
            // [4, 5, 42] as [42, 5, 4].
            ("reversed 3-d", vec![42, 5, 4], vec![1, 42, 210], 0),
        ]
    }

    /// The first index of the minimum (maximum) of `v` in order, or of its first NaN.
    fn sequential_arg<S: Elem>(max: bool, v: &[S]) -> i64 {
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if replaces(max, v[best], x) {
                best = i;
            }
        }
        best as i64
    }

    /// argmin/argmax of `view` over `axis` against the sequential scan of each output's
    /// elements of its compact copy, taken by logical index.
    fn check_arg_axis<S: Elem>(view: &Tensor, axis: usize, what: &str) {
        let logical = typed::<S>(&view.to_compact().unwrap()).unwrap().to_vec();
        let shape: Vec<usize> = view.shape().iter().map(|&d| d as usize).collect();
        let len = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        for max in [false, true] {
            let mut want = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for k in 0..inner {
                    let block: Vec<S> = (0..len)
                        .map(|j| logical[(o * len + j) * inner + k])
                        .collect();
                    want.push(sequential_arg(max, &block));
                }
            }
            let got = argreduce(max, view, Some(axis), false).unwrap();
            assert_eq!(
                typed::<i64>(&got).unwrap().to_vec(),
                want,
                "{what}: arg over axis {axis} (max {max})"
            );
        }
    }

    /// argmin/argmax of the views (read in memory order), flattened and over each
    /// axis, against the sequential scan of the compact copy: the first of equal
    /// extremes planted at memory positions whose logical order differs from theirs,
    /// the first of several NaNs, the first of zeros of both signs, and few distinct
    /// values (ties in every output) with NaNs in many outputs.
    fn arg_views<S: Elem>() {
        let name = S::DTYPE.name();
        let n = 840;
        let base = typed::<S>(&exact_base::<S>(n)).unwrap().to_vec();
        let big = S::from_f64(if S::INT { 120.0 } else { 200.0 });
        let small = S::from_f64(if S::INT { 0.0 } else { -200.0 });
        let mut variants: Vec<(&str, Vec<S>)> = vec![("distinct", base.clone())];
        let mut planted = base.clone();
        for at in [700, 37, 300, 301, 839, 0] {
            planted[at] = if at % 2 == 0 { big } else { small };
        }
        variants.push(("equal extremes", planted));
        if !S::INT {
            let mut nans = base.clone();
            for at in [650, 12, 13, 400] {
                nans[at] = S::from_f64(f64::NAN);
            }
            variants.push(("NaNs", nans));
            let zeros: Vec<S> = (0..n)
                .map(|m| S::from_f64([0.0, -0.0, 1.0, -0.0, 2.0][(m * 7 + m / 13) % 5]))
                .collect();
            variants.push(("zeros", zeros));
            let ties: Vec<S> = (0..n)
                .map(|m| match (m * 7 + m / 13) % 11 {
                    0 | 5 => S::from_f64(f64::NAN),
                    r => S::from_f64((r % 3) as f64),
                })
                .collect();
            variants.push(("ties and NaNs", ties));
        } else {
            variants.push((
                "ties",
                (0..n)
                    .map(|m| S::from_f64(((m * 7 + m / 13) % 3) as f64))
                    .collect(),
            ));
        }
        for (variant, values) in variants {
            let b = make::<S>(&[n as i64], "", |o| {
                o.copy_from_slice(&values);
                Ok(())
            })
            .unwrap();
            for (what, shape, strides, origin) in cases() {
                let view = b.restride(shape, strides, origin);
                let logical = typed::<S>(&view.to_compact().unwrap()).unwrap().to_vec();
                for max in [false, true] {
                    let got = argreduce(max, &view, None, false).unwrap();
                    assert_eq!(
                        typed::<i64>(&got).unwrap().to_vec(),
                        [sequential_arg(max, &logical)],
                        "{name} {what}, {variant}: arg (max {max})"
                    );
                }
                for axis in 0..view.ndim() {
                    check_arg_axis::<S>(&view, axis, &format!("{name} {what}, {variant}"));
                }
            }
        }
    }

    #[test]
    fn arg_reductions_of_views_read_in_memory_order_give_the_first_logical_index() {
        // Large enough for pieces on several threads: [600, 520] seen transposed, the
        // extremes (and then NaNs) planted in several pieces of memory, the logical
        // first of them in a later piece of memory than another.
        let (r, c) = (600usize, 520usize);
        for plant in [None, Some(f32::NAN)] {
            let mut v: Vec<f32> = (0..r * c).map(|m| ((m * 37) % 1001) as f32).collect();
            let x = plant.unwrap_or(5000.0);
            let y = plant.unwrap_or(-5000.0);
            // Memory (row, column) pairs; the view's logical index is column * 600 + row.
            for (row, col) in [(10, 400), (590, 3), (300, 3), (100, 519)] {
                v[row * c + col] = x;
                v[(row + 1) * c + col - 1] = y;
            }
            let b = make::<f32>(&[(r * c) as i64], "", |o| {
                o.copy_from_slice(&v);
                Ok(())
            })
            .unwrap();
            let view = b.restride(vec![c as i64, r as i64], vec![1, c as i64], 0);
            let logical = typed::<f32>(&view.to_compact().unwrap()).unwrap().to_vec();
            for max in [false, true] {
                let got = argreduce(max, &view, None, false).unwrap();
                let want = sequential_arg(max, &logical);
                assert_eq!(
                    typed::<i64>(&got).unwrap().to_vec(),
                    [want],
                    "{plant:?} {max}"
                );
            }
        }
        // Over one axis: [300, 4500] seen transposed, so that the reduction over its
        // axis 1 reads runs of 2048 outputs (the last one shorter) and that over its
        // axis 0 rows of 4500 on several threads; equal extremes (and then NaNs)
        // planted in one column of memory (an output of axis 1) in the first row, in
        // rows of a group of four and in the last rows, and along one row of memory
        // (an output of axis 0), in the last run of outputs too.
        let (r, c) = (300usize, 4500usize);
        for plant in [None, Some(f32::NAN)] {
            let mut v: Vec<f32> = (0..r * c).map(|m| ((m * 37) % 1001) as f32).collect();
            let x = plant.unwrap_or(5000.0);
            let y = plant.unwrap_or(-5000.0);
            for (row, col) in [
                (0, 7),
                (5, 7),
                (6, 7),
                (298, 4400),
                (299, 4400),
                (3, 4400),
                (150, 2047),
                (150, 2048),
                (150, 4499),
                (150, 0),
                (17, 3000),
                (18, 3000),
            ] {
                v[row * c + col] = x;
                v[(r - 1 - row) * c + (c - 1 - col)] = y;
            }
            v[(r - 1) * c + 5] = -0.0;
            v[(r - 2) * c + 5] = 0.0;
            let b = make::<f32>(&[(r * c) as i64], "", |o| {
                o.copy_from_slice(&v);
                Ok(())
            })
            .unwrap();
            let view = b.restride(vec![c as i64, r as i64], vec![1, c as i64], 0);
            check_arg_axis::<f32>(&view, 0, &format!("[4500, 300] {plant:?}"));
            check_arg_axis::<f32>(&view, 1, &format!("[4500, 300] {plant:?}"));
        }
        arg_views::<f32>();
        arg_views::<f64>();
        arg_views::<half::f16>();
        arg_views::<i32>();
        arg_views::<u8>();
    }

    #[test]
    fn narrow_float_sums_of_views_add_in_the_order_of_memory() {
        // A [8, 2] float32 tensor seen transposed as [2, 8]. In memory order the lanes
        // of the sum (element i to lane i % 8) pair 2^60 with -2^60 and 1 with 0: the
        // sum is 1. In the logical order they pair 2^60 with 1, which float64 loses:
        // the compact copy's sum is 0.
        let big = (60f64).exp2();
        let mut m = [0f32; 16];
        (m[0], m[1], m[8]) = (big as f32, 1.0, -big as f32);
        let a = make::<f32>(&[8, 2], "", |o| {
            o.copy_from_slice(&m);
            Ok(())
        })
        .unwrap();
        let view = a.restride(vec![2, 8], vec![1, 2], 0);
        let compact = view.to_compact().unwrap();
        let sum = |t: &Tensor, red: Red| vals_f32(&reduce(red, t, &[0, 1], false).unwrap());
        assert_eq!(sum(&view, Red::Sum), [1.0]);
        assert_eq!(sum(&view, Red::Mean), [1.0 / 16.0]);
        assert_eq!(
            sum(&compact, Red::Sum),
            [0.0],
            "the logical order loses the 1"
        );
        // float64 keeps the logical order: the same 0 as its compact copy.
        let a64 = kernels::cast(&a, DType::F64).unwrap();
        let view64 = a64.restride(vec![2, 8], vec![1, 2], 0);
        let got = reduce(Red::Sum, &view64, &[0, 1], false).unwrap();
        assert_eq!(typed::<f64>(&got).unwrap().to_vec(), [0.0]);
        // Over the axis that comes first in memory: each output adds its column of
        // memory in order from zero (2^60 + 1 loses the 1, then -2^60: 0), where the
        // logical order's lanes pair 2^60 with -2^60 and keep the 1.
        let mut m = [0f32; 16];
        (m[0], m[2], m[8]) = (big as f32, 1.0, -big as f32);
        let a = make::<f32>(&[8, 2], "", |o| {
            o.copy_from_slice(&m);
            Ok(())
        })
        .unwrap();
        let view = a.restride(vec![2, 8], vec![1, 2], 0);
        let columns = |t: &Tensor| vals_f32(&reduce(Red::Sum, t, &[1], false).unwrap());
        assert_eq!(columns(&view), [0.0, 0.0]);
        assert_eq!(columns(&view.to_compact().unwrap()), [1.0, 0.0]);
        // A NaN result takes the logical order's NaN (its payload): the compact copy's
        // bits, with NaNs of two payloads in lanes that the two orders join the other
        // way round (memory elements 1 and 8: logical lanes 0 and 4, memory lanes 1
        // and 0).
        let nan = |k: u32| f32::from_bits(0x7fc0_0000 | k);
        (m[1], m[8]) = (nan(1), nan(2));
        let a = make::<f32>(&[8, 2], "", |o| {
            o.copy_from_slice(&m);
            Ok(())
        })
        .unwrap();
        let view = a.restride(vec![2, 8], vec![1, 2], 0);
        let compact = view.to_compact().unwrap();
        for red in [Red::Sum, Red::Mean] {
            let bits = |t: &Tensor| reduce(red, t, &[0, 1], false).unwrap().to_bytes().unwrap();
            assert_eq!(bits(&view), bits(&compact), "{red:?}");
        }
    }

    fn vals_f32(t: &Tensor) -> Vec<f32> {
        typed::<f32>(t).unwrap().to_vec()
    }

    #[test]
    fn reductions_of_views_compact_in_memory_order_match_the_logical_reference() {
        views::<f32>();
        views::<half::f16>();
        views::<half::bf16>();
        views::<f64>();
        views::<i32>();
        views::<u8>();
        views::<i64>();
    }
}
