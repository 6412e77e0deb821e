//! Reductions over axes: `sum prod mean min max all any` (argument `axes`, default
//! all) and `argmin argmax` (argument `axis`, default the flattened tensor), each with
//! `keepdims`.

use std::sync::Arc;

use super::kernels::{self, Elem, make, typed, with_elem};
use super::{ArgSpec, Kernel, OpDef, TMeta, par};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, Args};
use crate::tensor::{DType, Tensor, dims};

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
    for &a in axes {
        let n = ndim as i64;
        if a < -n || a >= n {
            return Err(Error::index(format!(
                "axis {a} is out of range for a tensor of ndim {ndim}"
            )));
        }
        let a = if a < 0 { a + n } else { a } as usize;
        if out.contains(&a) {
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

/// The shape of a reduction over `axes`.
pub fn reduced_shape(shape: &[i64], axes: &[usize], keepdims: bool) -> Vec<i64> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
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
    for i in (0..shape.len()).rev() {
        if !axes.contains(&i) {
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

/// Reduces `t` over `axes`.
fn reduce(red: Red, t: &Tensor, axes: &[usize], keepdims: bool) -> Result<Tensor> {
    let out_shape = reduced_shape(t.shape(), axes, keepdims);
    let layout = if keepdims {
        t.layout().to_string()
    } else {
        String::new()
    };
    let count: usize = axes.iter().map(|&a| t.shape()[a] as usize).product();
    if count == 0 && matches!(red, Red::Min | Red::Max) {
        let n_out: usize = out_shape.iter().map(|&d| d as usize).product();
        if n_out > 0 {
            return Err(zero_size(red.name()));
        }
    }
    if matches!(red, Red::All | Red::Any)
        || (t.dtype() == DType::Bool && matches!(red, Red::Min | Red::Max))
    {
        let b = kernels::cast(t, DType::Bool)?;
        let v = typed::<u8>(&b)?;
        let all = matches!(red, Red::All | Red::Min);
        let mut accs = Vec::new();
        let n = for_each_output(t.shape(), axes, |_, _| {});
        accs.resize(n, all);
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
    fn lanes<S: Elem>(v: &[S]) -> f64 {
        let mut acc = [0f64; 8];
        let chunks = v.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for (a, x) in acc.iter_mut().zip(c) {
                *a += x.to_f64();
            }
        }
        let mut s =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for x in rest {
            s += x.to_f64();
        }
        s
    }
    par::map_pieces(v.len(), 1, |r| lanes(&v[r]))
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
    let src = typed::<S>(t)?;
    let out_dtype = red.dtype(S::DTYPE);
    match red {
        Red::Min | Red::Max => {
            let mut accs: Vec<Option<S>> = Vec::new();
            let n = for_each_output(t.shape(), axes, |_, _| {});
            accs.resize(n, None);
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
            let mut accs: Vec<i128> = Vec::new();
            let n = for_each_output(t.shape(), axes, |_, _| {});
            accs.resize(n, i128::from(prod));
            for_each_output(t.shape(), axes, |i, o| {
                let v = src[i].to_i128();
                accs[o] = if prod {
                    accs[o].wrapping_mul(v)
                } else {
                    accs[o].wrapping_add(v)
                };
            });
            with_elem!(out_dtype, D => make::<D>(out_shape, layout, |out| {
                for (o, a) in out.iter_mut().zip(accs) {
                    *o = D::from_i128(a);
                }
                Ok(())
            }), bool => unreachable!("integer sums are int64 or uint64"))
        }
        Red::Sum | Red::Mean if is_suffix(axes, t.ndim()) => {
            // Each output sums one contiguous block: the fast path.
            let n_out: usize = out_shape.iter().map(|&d| d as usize).product();
            let mut accs: Vec<f64> = if count == 0 {
                vec![0.0; n_out]
            } else {
                src.chunks(count).map(sum_block).collect()
            };
            if red == Red::Mean {
                accs.iter_mut().for_each(|a| *a /= count as f64);
            }
            with_elem!(out_dtype, D => make::<D>(out_shape, layout, |out| {
                for (o, a) in out.iter_mut().zip(accs) {
                    *o = D::from_f64(a);
                }
                Ok(())
            }), bool => unreachable!("float results"))
        }
        Red::Sum | Red::Prod | Red::Mean => {
            let prod = red == Red::Prod;
            let mut accs: Vec<f64> = Vec::new();
            let n = for_each_output(t.shape(), axes, |_, _| {});
            accs.resize(n, if prod { 1.0 } else { 0.0 });
            for_each_output(t.shape(), axes, |i, o| {
                let v = src[i].to_f64();
                if prod {
                    accs[o] *= v;
                } else {
                    accs[o] += v;
                }
            });
            if red == Red::Mean {
                accs.iter_mut().for_each(|a| *a /= count as f64);
            }
            with_elem!(out_dtype, D => make::<D>(out_shape, layout, |out| {
                for (o, a) in out.iter_mut().zip(accs) {
                    *o = D::from_f64(a);
                }
                Ok(())
            }), bool => unreachable!("float results"))
        }
        Red::All | Red::Any => unreachable!("handled on bools"),
    }
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
        return Err(zero_size(name));
    }
    let axes: Vec<usize> = axis.map_or_else(|| (0..shape.len()).collect(), |a| vec![a]);
    let src = if t.dtype() == DType::Bool {
        kernels::cast(t, DType::U8)?
    } else {
        t.clone()
    };
    let best = with_elem!(src.dtype(), S => {
        let v = typed::<S>(&src)?;
        let n = for_each_output(shape, &axes, |_, _| {});
        let mut best: Vec<Option<(S, i64)>> = vec![None; n];
        for_each_output(shape, &axes, |i, o| {
            let j = ((i / inner) % len) as i64;
            let x = v[i];
            best[o] = Some(match best[o] {
                None => (x, j),
                Some((b, k)) if Elem::is_nan(b) => (b, k),
                Some(_) if Elem::is_nan(x) => (x, j),
                Some((b, _)) if (max && x > b) || (!max && x < b) => (x, j),
                Some(keep) => keep,
            });
        });
        best.into_iter().map(|b| b.map_or(0, |(_, k)| k)).collect::<Vec<i64>>()
    }, bool => unreachable!("bool cast above"));
    make::<i64>(&out_shape, "", |out| {
        out.copy_from_slice(&best);
        Ok(())
    })
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
                layout: if keepdims {
                    m.layout.clone()
                } else {
                    String::new()
                },
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
                    layout: String::new(),
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
        typed::<T>(t).unwrap().into_owned()
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
