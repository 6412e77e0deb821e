//! The check operators (`check`, `check_finite`, `check_range`, `check_shape`): each
//! passes its input through unchanged (same memory) and, when the USER category is
//! checked, raises a flag for the elements that fail. With checks off they do no work.
//! Also the NAN pass the node runs after kernels that do not watch NAN in their loops.

use std::sync::Arc;

use super::kernels::{Elem, typed, with_elem};
use super::{ArgSpec, Kernel, OpDef, TMeta};
use crate::checks::{self, Raised, Tally};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, Args, Num};
use crate::tensor::{DType, Tensor, dims};

/// Counts the elements of `t` for which `bad` holds: `(first flat index, count)`.
fn count_where<T: Elem>(t: &Tensor, bad: impl Fn(T) -> bool + Sync + Send) -> Result<Tally> {
    let v = typed::<T>(t)?;
    let tally = Tally::new();
    let pieces = super::par::map_pieces(v.len(), 1, |r| {
        let mut first = None;
        let mut count = 0u64;
        for (i, &x) in v[r.clone()].iter().enumerate() {
            if bad(x) {
                first.get_or_insert(r.start + i);
                count += 1;
            }
        }
        (first, count)
    });
    for (first, count) in pieces {
        if let Some(f) = first {
            tally.add(f as u64, count);
        }
    }
    Ok(tally)
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn raise_user(tally: &Tally, message: impl FnOnce(u64) -> String) {
    checks::raise_tally(checks::USER, tally, message);
}

fn bool_pred(m: &TMeta, _: &Args) -> Result<()> {
    if m.dtype != DType::Bool {
        return Err(Error::type_error(format!(
            "needs a bool predicate, got {}",
            m.dtype.name()
        )));
    }
    Ok(())
}

fn check_kernel(t: &Tensor, args: &Args) -> Result<()> {
    let what = args.string("message")?.unwrap_or_else(|| "check".into());
    let tally = count_where::<u8>(t, |v| v == 0)?;
    raise_user(&tally, |n| {
        format!(
            "{what}: {n} of {} element{} false",
            t.numel(),
            plural(t.numel() as u64)
        )
    });
    Ok(())
}

fn finite_kernel(t: &Tensor) -> Result<()> {
    let tally = with_elem!(t.dtype(), T => count_where::<T>(t, |v| !v.is_finite()),
        bool => Ok(Tally::new()))?;
    raise_user(&tally, |n| {
        format!(
            "{n} of {} element{} not finite",
            t.numel(),
            plural(t.numel() as u64)
        )
    });
    Ok(())
}

fn range_bounds(args: &Args) -> Result<(Num, Num)> {
    let lo = args.number("lo")?.unwrap_or(Num::Float(f64::NEG_INFINITY));
    let hi = args.number("hi")?.unwrap_or(Num::Float(f64::INFINITY));
    if lo.is_nan() || hi.is_nan() || lo.gt(hi) {
        return Err(Error::value(format!(
            "needs lo <= hi, got lo={lo} and hi={hi}"
        )));
    }
    Ok((lo, hi))
}

fn range_kernel(t: &Tensor, args: &Args) -> Result<()> {
    let (lo, hi) = range_bounds(args)?;
    let tally = with_elem!(t.dtype(), T => {
        if T::INT && size_of::<T>() == 8 {
            // int64 and uint64 are not all doubles (2^53 + 1 is not): compared exactly
            // with the integer bounds, lo rounded up and hi down.
            let (lo, hi) = (lo.ceil_int(), hi.floor_int());
            count_where::<T>(t, |v| {
                let x = v.to_i128();
                !(x >= lo && x <= hi)
            })
        } else {
            // Every other value is exactly a double. NaN is outside every range.
            let (lo, hi) = (lo.to_f64(), hi.to_f64());
            count_where::<T>(t, |v| {
                let x = v.to_f64();
                !(x >= lo && x <= hi)
            })
        }
    }, bool => {
        let (lo, hi) = (lo.to_f64(), hi.to_f64());
        count_where::<u8>(t, |v| {
            let x = f64::from(v);
            !(x >= lo && x <= hi)
        })
    })?;
    raise_user(&tally, |n| {
        format!(
            "{n} of {} element{} outside [{lo}, {hi}]",
            t.numel(),
            plural(t.numel() as u64)
        )
    });
    Ok(())
}

fn shape_pattern(args: &Args) -> Result<Vec<i64>> {
    let p = args
        .ints("pattern")?
        .ok_or_else(|| Error::value("check_shape needs argument 'pattern'"))?;
    if let Some((i, bad)) = p.iter().enumerate().find(|(_, d)| **d < -1) {
        return Err(Error::value(format!(
            "argument 'pattern' entry {i}: pattern entries are sizes or -1 (any), got {bad}"
        )));
    }
    Ok(p)
}

fn shape_kernel(t: &Tensor, args: &Args) -> Result<()> {
    let pattern = shape_pattern(args)?;
    let shape = t.shape();
    let first = if shape.len() != pattern.len() {
        Some(shape.len().min(pattern.len()))
    } else {
        shape
            .iter()
            .zip(&pattern)
            .position(|(&d, &p)| p != -1 && d != p)
    };
    if let Some(axis) = first {
        checks::raise(Raised {
            category: checks::USER,
            message: format!(
                "shape {} does not match the pattern {} (-1: any size)",
                dims(shape),
                dims(&pattern)
            ),
            first_index: axis as u64,
            count: 1,
            sample: None,
            axis: true,
        });
    }
    Ok(())
}

/// Checks NAN after a kernel that did not watch it: when every float input is finite
/// and an output holds NaN or an infinity, raises one NAN flag per such output.
pub fn flag_new_non_finite(inputs: &[Arc<Tensor>], outs: &[Arc<Tensor>]) {
    let non_finite = |t: &Tensor| -> Option<Tally> {
        let tally = with_elem!(t.dtype(), T => {
            if T::INT {
                return None;
            }
            count_where::<T>(t, |v| !v.is_finite())
        }, bool => return None);
        tally.ok().filter(|t| t.get().is_some())
    };
    let mut inputs_finite = None;
    for (k, out) in outs.iter().enumerate() {
        let Some(tally) = non_finite(out) else {
            continue;
        };
        if !*inputs_finite.get_or_insert_with(|| inputs.iter().all(|t| non_finite(t).is_none())) {
            return;
        }
        checks::raise_tally(checks::NAN, &tally, |n| {
            format!(
                "output {k} has {n} NaN or infinite element{} from finite inputs",
                plural(n)
            )
        });
    }
}

fn spec(name: &str, ty: ArgType, required: bool) -> ArgSpec {
    ArgSpec {
        name: name.to_string(),
        ty,
        required,
    }
}

fn check_op(
    name: &str,
    args: Vec<ArgSpec>,
    validate: fn(&TMeta, &Args) -> Result<()>,
    kernel: fn(&Tensor, &Args) -> Result<()>,
) -> OpDef {
    OpDef {
        name: name.into(),
        n_inputs: 1,
        n_outputs: 1,
        args,
        infer: Some(Arc::new(move |i: &[&TMeta], a: &Args| {
            validate(i[0], a)?;
            Ok(vec![i[0].clone()])
        })),
        kernel: Kernel::Builtin(Arc::new(move |i: &[&Tensor], a: &Args| {
            if checks::enabled(checks::USER) {
                kernel(i[0], a)?;
            }
            // Outputs are compact: a compact input passes through as it is (the same
            // memory), a strided view is compacted.
            let t = i[0];
            if t.is_compact() {
                Ok(vec![t.clone()])
            } else {
                Ok(vec![t.to_compact()?])
            }
        })),
    }
}

/// The check operators.
pub fn ops() -> Vec<OpDef> {
    vec![
        check_op(
            "check",
            vec![spec("message", ArgType::Str, false)],
            bool_pred,
            check_kernel,
        ),
        check_op(
            "check_finite",
            vec![],
            |_, _| Ok(()),
            |t, _| finite_kernel(t),
        ),
        check_op(
            "check_range",
            vec![
                spec("lo", ArgType::Float, false),
                spec("hi", ArgType::Float, false),
            ],
            |_, a| range_bounds(a).map(|_| ()),
            range_kernel,
        ),
        check_op(
            "check_shape",
            vec![spec("pattern", ArgType::Ints, true)],
            |_, a| shape_pattern(a).map(|_| ()),
            shape_kernel,
        ),
    ]
}
