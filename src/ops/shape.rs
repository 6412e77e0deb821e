//! Shape operators: `reshape transpose slice flip squeeze expand_dims pad`. Each is a
//! strided view of its input (computed at enqueue for the metadata) compacted once;
//! the output owns its data.

use std::sync::Arc;

use crate::checks;

use super::kernels::{self, Elem, make};
use super::par;
use super::reduce::{axis_mask, normalize_axes};
use super::{ArgSpec, Kernel, OpDef, TMeta};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, ArgValue, Args, Num};
use crate::tensor::{DType, Tensor, compact_strides, dims};

/// A view description: shape, strides and origin, in elements of the input, whose
/// own strides are given.
struct View {
    shape: Vec<i64>,
    strides: Vec<i64>,
    origin: i64,
}

fn ints(args: &Args, name: &str) -> Result<Option<Vec<i64>>> {
    args.ints(name)
}

fn reshape_view(shape: &[i64], args: &Args) -> Result<Vec<i64>> {
    let target =
        ints(args, "shape")?.ok_or_else(|| Error::value("reshape needs argument 'shape'"))?;
    let numel = shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::value(format!(
                "reshape: the input of shape {} has more elements than fit in int64",
                dims(shape)
            ))
        })?;
    let unknown: Vec<usize> = target
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == -1)
        .map(|(i, _)| i)
        .collect();
    if unknown.len() > 1 {
        return Err(Error::value(format!(
            "reshape: only one dimension may be -1, got shape {}",
            dims(&target)
        )));
    }
    if let Some((i, &d)) = target.iter().enumerate().find(|(_, d)| **d < -1) {
        return Err(Error::value(format!(
            "reshape: argument 'shape' {} has {d} at index {i}; expected a size >= 0, or -1 \
             for the one size to infer",
            dims(&target)
        )));
    }
    let too_large = || {
        Error::value(format!(
            "cannot reshape a tensor of shape {} ({numel} elements) into shape {}: its size overflows",
            dims(shape),
            dims(&target)
        ))
    };
    let known = target
        .iter()
        .filter(|&&d| d != -1)
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    let mut out = target.clone();
    if let Some(&i) = unknown.first() {
        if known == 0 || numel % known != 0 {
            return Err(Error::value(format!(
                "cannot reshape a tensor of shape {} ({numel} elements) into shape {}",
                dims(shape),
                dims(&target)
            )));
        }
        out[i] = numel / known;
        // A zero-size target with other large dimensions must still be addressable.
        compact_strides(&out).ok_or_else(too_large)?;
    } else if known != numel || compact_strides(&out).is_none() {
        return Err(Error::value(format!(
            "cannot reshape a tensor of shape {} ({numel} elements) into shape {}",
            dims(shape),
            dims(&target)
        )));
    }
    Ok(out)
}

fn transpose_view(shape: &[i64], strides: &[i64], args: &Args) -> Result<View> {
    let n = shape.len();
    let perm = match ints(args, "perm")? {
        Some(p) => p,
        None => (0..n as i64).rev().collect(),
    };
    let bad = || {
        Error::value(format!(
            "transpose: perm {} is not a permutation of the {n} axes",
            dims(&perm)
        ))
    };
    if perm.len() != n {
        return Err(bad());
    }
    let perm: Vec<usize> = perm
        .iter()
        .map(|&p| if p < 0 { p + n as i64 } else { p })
        .map(|p| usize::try_from(p).ok().filter(|&p| p < n))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    let mut seen = vec![false; n];
    for &p in &perm {
        if std::mem::replace(&mut seen[p], true) {
            return Err(bad());
        }
    }
    Ok(View {
        shape: perm.iter().map(|&p| shape[p]).collect(),
        strides: perm.iter().map(|&p| strides[p]).collect(),
        origin: 0,
    })
}

/// Python's `slice(start, stop, step).indices(len)` followed by the length.
fn slice_indices(start: i64, stop: i64, step: i64, len: i64) -> (i64, i64) {
    // In i128 so that bounds and steps at the i64 limits cannot overflow.
    let (start, stop, step, len) = (start as i128, stop as i128, step as i128, len as i128);
    let clamp = |v: i128, lo: i128, hi: i128| v.max(lo).min(hi);
    let adjust = |v: i128| if v < 0 { v + len } else { v };
    let (lo, hi) = if step > 0 { (0, len) } else { (-1, len - 1) };
    let start = clamp(adjust(start), lo, hi);
    let stop = clamp(adjust(stop), lo, hi);
    let count = if step > 0 {
        if stop > start {
            (stop - start - 1) / step + 1
        } else {
            0
        }
    } else if start > stop {
        (start - stop - 1) / (-step) + 1
    } else {
        0
    };
    (start as i64, count as i64)
}

/// With INDEX checked, raises a flag for a slice bound outside `[-len, len]` (the
/// slice still clamps like NumPy's).
fn flag_out_of_range(axis: usize, start: i64, end: i64, len: i64) {
    if !checks::enabled(checks::INDEX) {
        return;
    }
    let outside = |b: i64| b < -len || b > len;
    let bad: Vec<String> = [("start", start), ("end", end)]
        .into_iter()
        .filter(|(_, b)| outside(*b) && *b != i64::MAX && *b != i64::MIN)
        .map(|(name, b)| format!("{name} {b}"))
        .collect();
    if !bad.is_empty() {
        checks::raise(checks::Raised {
            category: checks::INDEX,
            message: format!(
                "slice {} out of range for axis {axis} of size {len} (clamped)",
                bad.join(" and ")
            ),
            first_index: axis as u64,
            count: bad.len() as u64,
            sample: None,
            axis: true,
        });
    }
}

fn slice_view(shape: &[i64], strides: &[i64], args: &Args) -> Result<View> {
    let start = ints(args, "start")?.ok_or_else(|| Error::value("slice needs argument 'start'"))?;
    let end = ints(args, "end")?.ok_or_else(|| Error::value("slice needs argument 'end'"))?;
    let step = ints(args, "step")?.unwrap_or_else(|| vec![1; start.len()]);
    let axes = match ints(args, "axes")? {
        Some(a) => a,
        None => (0..start.len() as i64).collect(),
    };
    if end.len() != start.len() || step.len() != start.len() || axes.len() != start.len() {
        // Only what was given: a step or axes left out has one entry per start.
        let counts: Vec<String> = [
            ("start", &start),
            ("end", &end),
            ("step", &step),
            ("axes", &axes),
        ]
        .into_iter()
        .filter(|(name, _)| args.get(name).is_some())
        .map(|(name, v)| format!("{} in {name}", v.len()))
        .collect();
        return Err(Error::value(format!(
            "slice: start, end, step and axes must have one entry per sliced axis; got {}",
            counts.join(", ")
        )));
    }
    let axes = normalize_axes(Some(&axes), shape.len())?;
    let given = ints(args, "axes")?.unwrap_or_else(|| (0..start.len() as i64).collect());
    let mut view = View {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        origin: 0,
    };
    for (k, &g) in given.iter().enumerate() {
        let axis = if g < 0 {
            (g + shape.len() as i64) as usize
        } else {
            g as usize
        };
        debug_assert!(axes.contains(&axis));
        if step[k] == 0 {
            return Err(Error::value(format!(
                "slice: argument 'step' {} has 0 at index {k} (the step along axis {axis}); \
                 expected a non-zero step",
                dims(&step)
            )));
        }
        flag_out_of_range(axis, start[k], end[k], shape[axis]);
        let (s, count) = slice_indices(start[k], end[k], step[k], shape[axis]);
        if count > 0 {
            view.origin += s * strides[axis];
        }
        view.shape[axis] = count;
        // A step larger than the axis takes at most one element: its stride is moot.
        view.strides[axis] = if count <= 1 {
            strides[axis]
        } else {
            strides[axis] * step[k]
        };
    }
    Ok(view)
}

fn flip_view(shape: &[i64], strides: &[i64], args: &Args) -> Result<View> {
    let axes = normalize_axes(ints(args, "axes")?.as_deref(), shape.len())?;
    let mut view = View {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        origin: 0,
    };
    // Flipping an extent of 0 or 1 changes nothing; its stride, which may be any
    // value there (even i64::MIN), is left as it is.
    for a in axes {
        if shape[a] > 1 {
            view.origin += (shape[a] - 1) * strides[a];
            view.strides[a] = -strides[a];
        }
    }
    Ok(view)
}

fn squeeze_shape(shape: &[i64], args: &Args) -> Result<Vec<i64>> {
    let axes = match ints(args, "axes")? {
        None => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
        Some(a) => normalize_axes(Some(&a), shape.len())?,
    };
    if let Some(&a) = axes.iter().find(|&&a| shape[a] != 1) {
        return Err(Error::value(format!(
            "squeeze: axis {a} has size {}, not 1 (shape {})",
            shape[a],
            dims(shape)
        )));
    }
    let squeezed = axis_mask(&axes, shape.len());
    Ok(shape
        .iter()
        .enumerate()
        .filter(|&(i, _)| !squeezed[i])
        .map(|(_, &d)| d)
        .collect())
}

/// Where a new axis goes in a result of `ndim` dimensions (`axis` negative counts
/// from the end of the result): `expand_dims`, `stack`.
pub(crate) fn inserted_axis(axis: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    if axis < -n || axis >= n {
        return Err(Error::index(format!(
            "axis {axis} is out of range for the result of ndim {n}"
        )));
    }
    Ok((if axis < 0 { axis + n } else { axis }) as usize)
}

fn expand_shape(shape: &[i64], args: &Args) -> Result<Vec<i64>> {
    if args.get("axis").is_none() {
        return Err(Error::value("expand_dims needs argument 'axis'"));
    }
    let at = inserted_axis(args.int_or("axis", 0)?, shape.len() + 1)?;
    let mut out = shape.to_vec();
    out.insert(at, 1);
    Ok(out)
}

fn pad_widths(shape: &[i64], args: &Args) -> Result<Vec<(i64, i64)>> {
    let w = ints(args, "widths")?.ok_or_else(|| Error::value("pad needs argument 'widths'"))?;
    if w.len() != 2 * shape.len() {
        return Err(Error::value(format!(
            "pad: widths has {} entries, expected {} (before and after for each of {} axes)",
            w.len(),
            2 * shape.len(),
            shape.len()
        )));
    }
    if let Some((i, &v)) = w.iter().enumerate().find(|(_, v)| **v < 0) {
        return Err(Error::value(format!(
            "pad: argument 'widths' {} has {v} at index {i} (the width {} axis {}); \
             expected a width >= 0",
            dims(&w),
            if i % 2 == 0 { "before" } else { "after" },
            i / 2
        )));
    }
    let widths: Vec<(i64, i64)> = w.chunks(2).map(|c| (c[0], c[1])).collect();
    let padded: Option<Vec<i64>> = shape
        .iter()
        .zip(&widths)
        .map(|(&d, (b, a))| d.checked_add(*b)?.checked_add(*a))
        .collect();
    let addressable = padded.as_deref().is_some_and(|p| {
        compact_strides(p).is_some()
            && p.iter()
                .try_fold(1i64, |acc, &d| acc.checked_mul(d))
                .is_some()
    });
    if !addressable {
        return Err(Error::value(format!(
            "pad: widths {} make a tensor of shape {} too large to address",
            dims(&w),
            dims(shape)
        )));
    }
    Ok(widths)
}

fn pad_value(args: &Args) -> Result<Num> {
    match args.get("value") {
        None => Ok(Num::Float(0.0)),
        Some(ArgValue::Float(v)) => Ok(Num::Float(*v)),
        Some(ArgValue::Int(v)) => Ok(Num::Int(*v)),
        Some(v) => Err(Error::type_error(format!(
            "argument 'value' is {}, expected a float or an int",
            v.arg_type().a()
        ))),
    }
}

/// `value` converted to `dtype` as `cast` converts, as bytes.
fn fill_bytes<S: Elem>(value: S, dtype: DType) -> Result<Vec<u8>> {
    let one = make::<S>(&[], "", |o| {
        o[0] = value;
        Ok(())
    })?;
    kernels::cast(&one, dtype)?.to_bytes()
}

fn pad(t: &Tensor, widths: &[(i64, i64)], value: Num) -> Result<Tensor> {
    let shape: Vec<i64> = t
        .shape()
        .iter()
        .zip(widths)
        .map(|(&d, (b, a))| d + b + a)
        .collect();
    // The fill value in the element type, then the input copied into the interior. An
    // int value fills an integer tensor exactly (saturated to its range, as a float
    // value would be; an int64 beyond 2^53 is not rounded to a double first).
    let fill = match value {
        Num::Int(v) => kernels::with_elem!(t.dtype(), T => {
            if T::INT {
                bytemuck::bytes_of(&kernels::saturate_int::<T>(i128::from(v))).to_vec()
            } else {
                fill_bytes::<i64>(v, t.dtype())?
            }
        }, bool => fill_bytes::<i64>(v, t.dtype())?),
        Num::Float(v) => fill_bytes::<f64>(v, t.dtype())?,
    };
    let item = t.dtype().itemsize();
    let src = t.compact_bytes()?;
    Tensor::new_host_overwritten(t.dtype(), &shape, Default::default(), |out| {
        let Some((&inner, outer)) = shape.split_last() else {
            out.copy_from_slice(&src);
            return Ok(());
        };
        if out.is_empty() {
            return Ok(());
        }
        let row = inner as usize * item;
        let in_shape = &t.shape()[..outer.len()];
        let in_row = t.shape()[outer.len()] as usize * item;
        let before = widths[outer.len()].0 as usize * item;
        // Output row by output row: the input row it holds (when its index lies inside
        // the input on every outer axis) between fill, or fill only.
        par::chunks_mut(out, row, inner as usize, |first, piece| {
            let mut index = vec![0i64; outer.len()];
            let mut rest = first as i64;
            for d in (0..outer.len()).rev() {
                index[d] = rest % outer[d];
                rest /= outer[d];
            }
            for dst in piece.chunks_exact_mut(row) {
                let mut from = Some(0usize);
                for ((&i, &n), &(b, _)) in index.iter().zip(in_shape).zip(widths) {
                    from = from
                        .filter(|_| i >= b && i - b < n)
                        .map(|r| r * n as usize + (i - b) as usize);
                }
                match from.filter(|_| in_row > 0) {
                    Some(r) => {
                        let (head, rest) = dst.split_at_mut(before);
                        let (mid, tail) = rest.split_at_mut(in_row);
                        fill_items(head, &fill);
                        mid.copy_from_slice(&src[r * in_row..(r + 1) * in_row]);
                        fill_items(tail, &fill);
                    }
                    None => fill_items(dst, &fill),
                }
                for d in (0..outer.len()).rev() {
                    index[d] += 1;
                    if index[d] < outer[d] {
                        break;
                    }
                    index[d] = 0;
                }
            }
            Ok(())
        })
    })
}

/// Fills `dst` with copies of the item `value`.
fn fill_items(dst: &mut [u8], value: &[u8]) {
    fn fill<const N: usize>(dst: &mut [u8], value: [u8; N]) {
        for d in dst.chunks_exact_mut(N) {
            d.copy_from_slice(&value);
        }
    }
    if value.iter().all(|&b| b == value[0]) {
        dst.fill(value[0]);
    } else if let Ok(v) = <[u8; 2]>::try_from(value) {
        fill(dst, v);
    } else if let Ok(v) = <[u8; 4]>::try_from(value) {
        fill(dst, v);
    } else if let Ok(v) = <[u8; 8]>::try_from(value) {
        fill(dst, v);
    } else {
        for d in dst.chunks_exact_mut(value.len()) {
            d.copy_from_slice(value);
        }
    }
}

fn meta(dtype: DType, shape: Vec<i64>) -> Vec<TMeta> {
    vec![TMeta {
        dtype,
        shape,
        layout: String::new(),
    }]
}

fn spec(name: &str, ty: ArgType, required: bool) -> ArgSpec {
    ArgSpec {
        name: name.to_string(),
        ty,
        required,
    }
}

fn view_op(
    name: &str,
    args: Vec<ArgSpec>,
    view: fn(&[i64], &[i64], &Args) -> Result<View>,
) -> OpDef {
    OpDef {
        name: name.to_string(),
        n_inputs: 1,
        n_outputs: 1,
        args,
        infer: Some(Arc::new(move |i: &[&TMeta], a: &Args| {
            let strides = compact_strides(&i[0].shape).unwrap_or_default();
            Ok(meta(i[0].dtype, view(&i[0].shape, &strides, a)?.shape))
        })),
        kernel: Kernel::Builtin(Arc::new(move |i: &[&Tensor], a: &Args| {
            let t = i[0];
            if t.numel() == 0 {
                // An empty view reads nothing, and DLPack lets its strides be anything
                // (i64::MIN, say): scaling them for a flip or a slice overflowed. The
                // view is taken over compact strides, as at inference.
                let strides = compact_strides(t.shape()).unwrap_or_default();
                let v = view(t.shape(), &strides, a)?;
                return Ok(vec![Tensor::new_host(
                    t.dtype(),
                    &v.shape,
                    Default::default(),
                    |_| Ok(()),
                )?]);
            }
            let v = view(t.shape(), t.strides(), a)?;
            Ok(vec![t.restride(v.shape, v.strides, v.origin).to_compact()?])
        })),
    }
}

fn reshape_op(
    name: &str,
    args: Vec<ArgSpec>,
    new_shape: fn(&[i64], &Args) -> Result<Vec<i64>>,
) -> OpDef {
    OpDef {
        name: name.to_string(),
        n_inputs: 1,
        n_outputs: 1,
        args,
        infer: Some(Arc::new(move |i: &[&TMeta], a: &Args| {
            Ok(meta(i[0].dtype, new_shape(&i[0].shape, a)?))
        })),
        kernel: Kernel::Builtin(Arc::new(move |i: &[&Tensor], a: &Args| {
            let t = i[0].to_compact()?;
            let shape = new_shape(t.shape(), a)?;
            let strides = compact_strides(&shape).unwrap_or_default();
            Ok(vec![t.restride(shape, strides, 0)])
        })),
    }
}

/// The shape operators.
pub fn ops() -> Vec<OpDef> {
    vec![
        reshape_op(
            "reshape",
            vec![spec("shape", ArgType::Ints, true)],
            reshape_view,
        ),
        reshape_op(
            "squeeze",
            vec![spec("axes", ArgType::Ints, false)],
            squeeze_shape,
        ),
        reshape_op(
            "expand_dims",
            vec![spec("axis", ArgType::Int, true)],
            expand_shape,
        ),
        view_op(
            "transpose",
            vec![spec("perm", ArgType::Ints, false)],
            transpose_view,
        ),
        view_op(
            "slice",
            vec![
                spec("start", ArgType::Ints, true),
                spec("end", ArgType::Ints, true),
                spec("step", ArgType::Ints, false),
                spec("axes", ArgType::Ints, false),
            ],
            slice_view,
        ),
        view_op("flip", vec![spec("axes", ArgType::Ints, false)], flip_view),
        OpDef {
            name: "pad".into(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![
                spec("widths", ArgType::Ints, true),
                spec("value", ArgType::Float, false),
            ],
            infer: Some(Arc::new(|i: &[&TMeta], a: &Args| {
                let w = pad_widths(&i[0].shape, a)?;
                pad_value(a)?;
                let shape = i[0]
                    .shape
                    .iter()
                    .zip(&w)
                    .map(|(&d, (b, af))| d + b + af)
                    .collect();
                Ok(meta(i[0].dtype, shape))
            })),
            kernel: Kernel::Builtin(Arc::new(|i: &[&Tensor], a: &Args| {
                let w = pad_widths(i[0].shape(), a)?;
                Ok(vec![pad(i[0], &w, pad_value(a)?)?])
            })),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_slice_indices() {
        assert_eq!(slice_indices(1, 4, 1, 5), (1, 3));
        assert_eq!(slice_indices(-100, 100, 2, 5), (0, 3));
        assert_eq!(slice_indices(100, -100, -1, 5), (4, 5));
        assert_eq!(slice_indices(-1, -6, -2, 5), (4, 3));
        assert_eq!(slice_indices(3, 1, 1, 5), (3, 0));
        assert_eq!(slice_indices(0, 6, i64::MAX, 6), (0, 1));
        assert_eq!(slice_indices(i64::MAX, i64::MIN, i64::MIN, 6), (5, 1));
        assert_eq!(slice_indices(i64::MIN, i64::MAX, i64::MAX, 6), (0, 1));
    }
}

#[cfg(test)]
mod pad_tests {
    use super::*;

    /// `values` padded by one `value` on each side, through the operator.
    fn padded<T: Elem>(values: &[T], value: Num) -> Vec<T> {
        let x = make::<T>(&[values.len() as i64], "", |o| {
            o.copy_from_slice(values);
            Ok(())
        })
        .unwrap();
        let value = match value {
            Num::Int(v) => ArgValue::Int(v),
            Num::Float(v) => ArgValue::Float(v),
        };
        let args = Args::new()
            .with("widths", ArgValue::Ints(vec![1, 1]))
            .with("value", value);
        let Some(Kernel::Builtin(f)) = crate::ops::builtin("pad").map(|op| op.kernel.clone())
        else {
            unreachable!("pad is a built-in")
        };
        let t = f(&[&x], &args).unwrap().remove(0);
        kernels::typed::<T>(&t).unwrap().to_vec()
    }

    #[test]
    fn an_int_pad_value_is_exact_and_saturates() {
        // Through f64, 2^53 + 1 filled as 2^53.
        let big = (1i64 << 53) + 1;
        assert_eq!(padded::<i64>(&[7], Num::Int(big)), [big, 7, big]);
        assert_eq!(
            padded::<u64>(&[7], Num::Int(i64::MAX)),
            [i64::MAX as u64, 7, i64::MAX as u64]
        );
        // Out of range: saturated, as a float value is (not wrapped like a cast).
        assert_eq!(padded::<u8>(&[7], Num::Int(300)), [255, 7, 255]);
        assert_eq!(padded::<u64>(&[7], Num::Int(-1)), [0, 7, 0]);
        assert_eq!(padded::<u8>(&[7], Num::Float(300.0)), [255, 7, 255]);
        assert_eq!(padded::<f64>(&[7.0], Num::Int(-3)), [-3.0, 7.0, -3.0]);
        assert_eq!(padded::<i32>(&[7], Num::Float(-2.9)), [-2, 7, -2]);
    }
}
