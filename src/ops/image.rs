//! `concat` and `stack` (one or more inputs), and image operators on HWC or CHW
//! tensors: `crop`, `resize` (in `resize.rs`), `flip_horizontal`, `flip_vertical`,
//! `normalize`, `rgb_to_gray`.

use std::sync::Arc;

use super::elementwise::promote_all;
use super::kernels::{self, Elem, make, typed};
use super::par;
use super::resize;
use super::{ArgSpec, Kernel, OpDef, SAMPLES, TMeta, VARIADIC};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, ArgValue, Args};
use crate::tensor::{DType, Tensor, dims, stacked_layout};

fn promoted(inputs: &[&TMeta]) -> DType {
    promote_all(inputs.iter().map(|m| m.dtype)).unwrap_or(DType::Bool)
}

/// The layout all inputs share, or none.
fn shared_layout(inputs: &[&TMeta]) -> String {
    let first = &inputs[0].layout;
    if inputs.iter().all(|m| &m.layout == first) {
        first.clone()
    } else {
        String::new()
    }
}

/// Output shape of `concat`, checking that inputs agree outside the axis.
fn concat_meta(inputs: &[&TMeta], args: &Args) -> Result<(usize, Vec<i64>)> {
    let first = &inputs[0].shape;
    if first.is_empty() {
        return Err(Error::value("concat: 0-d tensors cannot be concatenated"));
    }
    let axis = super::reduce::normalize_axes(Some(&[args.int_or("axis", 0)?]), first.len())?[0];
    let mut shape = first.clone();
    for (i, m) in inputs.iter().enumerate().skip(1) {
        let same = m.shape.len() == first.len()
            && m.shape
                .iter()
                .zip(first)
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b);
        if !same {
            return Err(Error::value(format!(
                "concat: input {i} has shape {}, which does not match input 0's {} outside axis {axis}",
                dims(&m.shape),
                dims(first)
            )));
        }
        shape[axis] = shape[axis].checked_add(m.shape[axis]).ok_or_else(|| {
            Error::value(format!(
                "concat: the extents along axis {axis} add up past int64 at input {i} (shape {})",
                dims(&m.shape)
            ))
        })?;
    }
    Ok((axis, shape))
}

fn stack_meta(inputs: &[&TMeta], args: &Args) -> Result<(usize, Vec<i64>)> {
    let first = &inputs[0].shape;
    let axis = super::shape::inserted_axis(args.int_or("axis", 0)?, first.len() + 1)?;
    if let Some((i, m)) = inputs.iter().enumerate().find(|(_, m)| &m.shape != first) {
        return Err(Error::value(format!(
            "stack: input {i} has shape {}, input 0 has {}",
            dims(&m.shape),
            dims(first)
        )));
    }
    let mut shape = first.clone();
    shape.insert(axis, inputs.len() as i64);
    Ok((axis, shape))
}

/// Copies each input (cast to `dtype` when it is not, compacted) into consecutive
/// slabs: for every index of the output's dimensions before `axis`, each input's
/// block from `axis` on (a concatenated input's extent along `axis` times the rest; a
/// stacked input's whole sample).
fn join(
    inputs: &[&Tensor],
    dtype: DType,
    axis: usize,
    shape: &[i64],
    layout: &str,
) -> Result<Tensor> {
    let layout_c = || std::ffi::CString::new(layout).unwrap_or_default();
    // An empty output has nothing to copy; its inputs' blocks from `axis` on (past
    // an extent of 0 before it) may not even be countable in bytes.
    if shape.contains(&0) {
        return Tensor::new_host_overwritten(dtype, shape, layout_c(), |_| Ok(()));
    }
    let item = dtype.itemsize();
    let cast: Vec<Option<Tensor>> = inputs
        .iter()
        .map(|t| {
            (t.dtype() != dtype)
                .then(|| kernels::cast(t, dtype))
                .transpose()
        })
        .collect::<Result<_>>()?;
    // Each input's bytes, read in place when compact.
    let parts: Vec<std::borrow::Cow<'_, [u8]>> = inputs
        .iter()
        .zip(&cast)
        .map(|(t, c)| c.as_ref().unwrap_or(t).compact_bytes())
        .collect::<Result<_>>()?;
    // Bytes of one input per outer index: its extent along the axis times the inner size.
    let slab: Vec<usize> = inputs
        .iter()
        .map(|t| {
            let s = t.shape();
            s[axis..].iter().map(|&d| d as usize).product::<usize>() * item
        })
        .collect();
    let total: usize = slab.iter().sum();
    Tensor::new_host_overwritten(dtype, shape, layout_c(), |out| {
        if total == 0 {
            return Ok(());
        }
        // Pieces of whole outer indices; in each, input by input, its slabs.
        par::chunks_mut(out, total, total / item, |first, piece| {
            let n = piece.len() / total;
            let mut at = 0;
            for (p, &len) in parts.iter().zip(&slab) {
                scatter(piece, at, total, &p[first * len..(first + n) * len], len);
                at += len;
            }
            Ok(())
        })
    })
}

/// Copies consecutive blocks of `len` bytes of `src` to `dst` from byte `at` on, one
/// every `stride` bytes.
fn scatter(dst: &mut [u8], at: usize, stride: usize, src: &[u8], len: usize) {
    fn blocks<const N: usize>(dst: &mut [u8], at: usize, stride: usize, src: &[u8]) {
        for (d, s) in dst.chunks_exact_mut(stride).zip(src.chunks_exact(N)) {
            d[at..at + N].copy_from_slice(s);
        }
    }
    match len {
        0 => {}
        1 => blocks::<1>(dst, at, stride, src),
        2 => blocks::<2>(dst, at, stride, src),
        4 => blocks::<4>(dst, at, stride, src),
        8 => blocks::<8>(dst, at, stride, src),
        12 => blocks::<12>(dst, at, stride, src),
        16 => blocks::<16>(dst, at, stride, src),
        _ => {
            for (d, s) in dst.chunks_exact_mut(stride).zip(src.chunks_exact(len)) {
                d[at..at + len].copy_from_slice(s);
            }
        }
    }
}

/// Integer argument `name` of `op`, which its schema marks required.
pub(crate) fn required_int(args: &Args, op: &str, name: &str) -> Result<i64> {
    match args.get(name) {
        Some(ArgValue::Int(v)) => Ok(*v),
        _ => Err(Error::value(format!(
            "{op} needs integer argument '{name}'"
        ))),
    }
}

/// The (H, W, C) axes of a 3-d image tensor, from its layout.
pub(crate) fn hwc_axes(layout: &str, shape: &[i64], op: &str) -> Result<(usize, usize, usize)> {
    match (layout, shape.len()) {
        ("HWC", 3) => Ok((0, 1, 2)),
        ("CHW", 3) => Ok((1, 2, 0)),
        _ => Err(Error::value(format!(
            "operator '{op}' needs a 3-d image with layout \"HWC\" or \"CHW\"; got layout \"{layout}\" and shape {}",
            dims(shape)
        ))),
    }
}

fn crop_window(m: &TMeta, args: &Args) -> Result<(usize, usize, [i64; 4])> {
    let (h_ax, w_ax, _) = hwc_axes(&m.layout, &m.shape, "crop")?;
    let get = |n: &str| required_int(args, "crop", n);
    let (x, y, w, h) = (get("x")?, get("y")?, get("w")?, get("h")?);
    let (img_h, img_w) = (m.shape[h_ax], m.shape[w_ax]);
    // The first rule the window breaks, if any.
    let past =
        |at: i64, at_name: &str, len: i64, len_name: &str, size: i64, size_name: &str| match at
            .checked_add(len)
        {
            Some(end) if end <= size => None,
            Some(end) => Some(format!(
                "{at_name} + {len_name} = {end} is past the {size_name} {size}"
            )),
            None => Some(format!("{at_name} + {len_name} overflows int64")),
        };
    let broken = if x < 0 || y < 0 {
        let (n, v) = if x < 0 { ("x", x) } else { ("y", y) };
        Some(format!("{n} = {v}; expected a value >= 0"))
    } else if w < 1 || h < 1 {
        let (n, v) = if w < 1 { ("w", w) } else { ("h", h) };
        Some(format!("{n} = {v}; expected a size >= 1"))
    } else {
        past(x, "x", w, "w", img_w, "width").or_else(|| past(y, "y", h, "h", img_h, "height"))
    };
    if let Some(why) = broken {
        return Err(Error::value(format!(
            "crop window x={x} y={y} w={w} h={h} is not inside the {img_w}x{img_h} image: {why}"
        )));
    }
    Ok((h_ax, w_ax, [x, y, w, h]))
}

/// `normalize`'s channel axis and per-channel mean and std, validated against the
/// image's metadata: both of one length, 1 (one value for every channel) or the
/// number of channels. A single value is not repeated per channel: an image may have
/// more channels than memory (a broadcast view, or no pixels at all).
pub(crate) fn normalize_params(m: &TMeta, args: &Args) -> Result<(usize, Vec<f64>, Vec<f64>)> {
    let (_, _, c_ax) = hwc_axes(&m.layout, &m.shape, "normalize")?;
    let c = m.shape[c_ax] as usize;
    let get = |n: &str| -> Result<Vec<f64>> {
        let v = match args.get(n) {
            Some(ArgValue::Floats(v)) => v.clone(),
            Some(ArgValue::Float(v)) => vec![*v],
            Some(ArgValue::Int(v)) => vec![*v as f64],
            Some(ArgValue::Ints(v)) => v.iter().map(|&x| x as f64).collect(),
            _ => {
                return Err(Error::value(format!(
                    "normalize needs float-array argument '{n}'"
                )));
            }
        };
        match v.len() {
            k if k == 1 || k == c => Ok(v),
            k => Err(Error::value(format!(
                "normalize: argument '{n}' has {k} values, the image has {c} channels; expected 1 \
                 (for every channel) or {c}"
            ))),
        }
    };
    let (mut mean, mut std) = (get("mean")?, get("std")?);
    if let Some(i) = std.iter().position(|&v| v == 0.0) {
        return Err(Error::value(format!(
            "normalize: argument 'std' {std:?} has {:?} at index {i}; expected a non-zero value",
            std[i]
        )));
    }
    // One given per channel and the other once: repeat that one (c values exist).
    if mean.len() != std.len() {
        let (one, many) = if mean.len() == 1 {
            (&mut mean, std.len())
        } else {
            (&mut std, mean.len())
        };
        *one = vec![one[0]; many];
    }
    Ok((c_ax, mean, std))
}

fn normalize(t: &Tensor, c_ax: usize, mean: &[f64], std: &[f64]) -> Result<Tensor> {
    let x = kernels::cast(t, DType::F64)?;
    let v = typed::<f64>(&x)?;
    let inner: usize = t.shape()[c_ax + 1..].iter().map(|&d| d as usize).product();
    let c = t.shape()[c_ax] as usize;
    // Parameters per channel (stride 1) or one for all (stride 0).
    let stride = usize::from(mean.len() > 1);
    make::<f32>(t.shape(), t.layout(), |out| {
        for (i, (o, &val)) in out.iter_mut().zip(v.iter()).enumerate() {
            let ch = (i / inner) % c * stride;
            *o = ((val - mean[ch]) / std[ch]) as f32;
        }
        Ok(())
    })
}

fn int_arg(name: &str) -> ArgSpec {
    ArgSpec {
        name: name.into(),
        ty: ArgType::Int,
        required: true,
    }
}

fn one_in(name: &str, args: Vec<ArgSpec>, infer: super::InferFn, kernel: super::KernelFn) -> OpDef {
    OpDef {
        name: name.into(),
        n_inputs: 1,
        n_outputs: 1,
        args,
        infer: Some(infer),
        kernel: Kernel::Builtin(kernel),
    }
}

fn flip_op(name: &'static str, horizontal: bool) -> OpDef {
    one_in(
        name,
        vec![],
        Arc::new(move |i: &[&TMeta], _: &Args| {
            hwc_axes(&i[0].layout, &i[0].shape, name)?;
            Ok(vec![i[0].clone()])
        }),
        Arc::new(move |i: &[&Tensor], _: &Args| {
            let t = i[0];
            let (h, w, _) = hwc_axes(t.layout(), t.shape(), name)?;
            if t.numel() == 0 {
                // Nothing to flip, and the strides of an empty image may be anything
                // (DLPack): scaling them overflowed.
                return Ok(vec![t.to_compact()?]);
            }
            let a = if horizontal { w } else { h };
            let mut strides = t.strides().to_vec();
            let mut origin = 0;
            // An extent of 0 or 1 is not flipped: its stride may be any value (even
            // i64::MIN, which cannot be negated).
            if t.shape()[a] > 1 {
                origin = (t.shape()[a] - 1) * strides[a];
                strides[a] = -strides[a];
            }
            let flipped = t.restride(t.shape().to_vec(), strides, origin);
            Ok(vec![
                flipped.to_compact()?.with_layout(t.c_layout().to_owned()),
            ])
        }),
    )
}

/// The channel axis and channel count of an `rgb_to_gray` input.
fn gray_meta(m: &TMeta) -> Result<(usize, usize)> {
    let (_, _, c_ax) = hwc_axes(&m.layout, &m.shape, "rgb_to_gray")?;
    if !matches!(
        m.dtype,
        DType::U8 | DType::U16 | DType::F16 | DType::BF16 | DType::F32 | DType::F64
    ) {
        return Err(Error::type_error(format!(
            "operator 'rgb_to_gray' does not support dtype {} (uint8, uint16, float16, bfloat16, float32, float64)",
            m.dtype.name()
        )));
    }
    let c = m.shape[c_ax];
    if c != 3 && c != 4 {
        return Err(Error::value(format!(
            "rgb_to_gray needs 3 or 4 channels (RGB or RGBA), got {c} (shape {}, layout \"{}\")",
            dims(&m.shape),
            m.layout
        )));
    }
    Ok((c_ax, c as usize))
}

/// ITU-R BT.601 luma, as OpenCV's `COLOR_RGB2GRAY`: integers in its 15-bit fixed
/// point (0.299, 0.587, 0.114 as 9798, 19235, 3735 / 2^15, rounded).
trait Luma: Elem {
    fn luma(r: Self, g: Self, b: Self) -> Self;
}
impl Luma for u8 {
    fn luma(r: u8, g: u8, b: u8) -> u8 {
        ((r as u32 * 9798 + g as u32 * 19235 + b as u32 * 3735 + (1 << 14)) >> 15) as u8
    }
}
impl Luma for u16 {
    fn luma(r: u16, g: u16, b: u16) -> u16 {
        ((r as u64 * 9798 + g as u64 * 19235 + b as u64 * 3735 + (1 << 14)) >> 15) as u16
    }
}
impl Luma for f32 {
    fn luma(r: f32, g: f32, b: f32) -> f32 {
        r * 0.299 + g * 0.587 + b * 0.114
    }
}
impl Luma for f64 {
    fn luma(r: f64, g: f64, b: f64) -> f64 {
        r * 0.299 + g * 0.587 + b * 0.114
    }
}

fn gray<T: Luma>(t: &Tensor, c_ax: usize, c: usize) -> Result<Tensor> {
    let v = typed::<T>(t)?;
    let mut shape = t.shape().to_vec();
    shape[c_ax] = 1;
    make::<T>(&shape, t.layout(), |out| {
        if c_ax == 2 {
            for (o, px) in out.iter_mut().zip(v.chunks_exact(c)) {
                *o = T::luma(px[0], px[1], px[2]);
            }
        } else {
            let n = out.len();
            let (r, rest) = v.split_at(n);
            let (g, b) = rest.split_at(n);
            for (((o, &r), &g), &b) in out.iter_mut().zip(r).zip(g).zip(&b[..n]) {
                *o = T::luma(r, g, b);
            }
        }
        Ok(())
    })
}

fn rgb_to_gray(t: &Tensor) -> Result<Tensor> {
    let (c_ax, c) = gray_meta(&TMeta::of(t))?;
    match t.dtype() {
        DType::U8 => gray::<u8>(t, c_ax, c),
        DType::U16 => gray::<u16>(t, c_ax, c),
        DType::F64 => gray::<f64>(t, c_ax, c),
        DType::F32 => gray::<f32>(t, c_ax, c),
        d => kernels::cast(&gray::<f32>(&kernels::cast(t, DType::F32)?, c_ax, c)?, d),
    }
}

/// The image and joining operators.
/// The output of stacking samples `i` along a new leading dimension: they must share
/// dtype and shape (a ragged batch fails naming its first odd sample).
fn batch_to_tensor_meta(i: &[&TMeta]) -> Result<TMeta> {
    let first = i[0];
    for (s, m) in i.iter().enumerate().skip(1) {
        if m.dtype != first.dtype {
            return Err(Error::type_error(format!(
                "sample {s} is {}, sample 0 is {}; stacked samples share a dtype",
                m.dtype.name(),
                first.dtype.name()
            )));
        }
        if m.shape != first.shape {
            return Err(Error::value(format!(
                "cannot stack a ragged batch: sample {s} has shape {}, sample 0 has shape {}",
                dims(&m.shape),
                dims(&first.shape)
            )));
        }
        // As a batch's samples do (tensors given as the samples are checked here,
        // at enqueue, not by the kernel making them a batch).
        if m.layout != first.layout {
            return Err(Error::value(format!(
                "sample {s} has layout \"{}\", sample 0 has layout \"{}\"; stacked samples share a layout",
                m.layout, first.layout
            )));
        }
    }
    let mut shape = vec![i.len() as i64];
    shape.extend_from_slice(&first.shape);
    Ok(TMeta {
        dtype: first.dtype,
        shape,
        layout: stacked_layout(&first.layout),
    })
}

pub fn ops() -> Vec<OpDef> {
    let axis = || {
        vec![ArgSpec {
            name: "axis".into(),
            ty: ArgType::Int,
            required: false,
        }]
    };
    vec![
        OpDef {
            name: "concat".into(),
            n_inputs: VARIADIC,
            n_outputs: 1,
            args: axis(),
            infer: Some(Arc::new(|i: &[&TMeta], a: &Args| {
                let (_, shape) = concat_meta(i, a)?;
                Ok(vec![TMeta {
                    dtype: promoted(i),
                    shape,
                    layout: shared_layout(i),
                }])
            })),
            kernel: Kernel::Builtin(Arc::new(|i: &[&Tensor], a: &Args| {
                let metas: Vec<TMeta> = i.iter().map(|t| TMeta::of(t)).collect();
                let refs: Vec<&TMeta> = metas.iter().collect();
                let (axis, shape) = concat_meta(&refs, a)?;
                let layout = shared_layout(&refs);
                Ok(vec![join(i, promoted(&refs), axis, &shape, &layout)?])
            })),
        },
        OpDef {
            name: "batch_to_tensor".into(),
            n_inputs: SAMPLES,
            n_outputs: 1,
            args: Vec::new(),
            infer: Some(Arc::new(|i: &[&TMeta], _: &Args| {
                Ok(vec![batch_to_tensor_meta(i)?])
            })),
            kernel: Kernel::Builtin(Arc::new(|i: &[&Tensor], _: &Args| {
                let metas: Vec<TMeta> = i.iter().map(|t| TMeta::of(t)).collect();
                batch_to_tensor_meta(&metas.iter().collect::<Vec<_>>())?;
                // Into new host memory: the samples need not share a device.
                Ok(vec![crate::tensor::stack(i)?])
            })),
        },
        OpDef {
            name: "stack".into(),
            n_inputs: VARIADIC,
            n_outputs: 1,
            args: axis(),
            infer: Some(Arc::new(|i: &[&TMeta], a: &Args| {
                let (_, shape) = stack_meta(i, a)?;
                Ok(vec![TMeta {
                    dtype: promoted(i),
                    shape,
                    layout: String::new(),
                }])
            })),
            kernel: Kernel::Builtin(Arc::new(|i: &[&Tensor], a: &Args| {
                let metas: Vec<TMeta> = i.iter().map(|t| TMeta::of(t)).collect();
                let refs: Vec<&TMeta> = metas.iter().collect();
                let (axis, shape) = stack_meta(&refs, a)?;
                Ok(vec![join(i, promoted(&refs), axis, &shape, "")?])
            })),
        },
        one_in(
            "crop",
            vec![int_arg("x"), int_arg("y"), int_arg("w"), int_arg("h")],
            Arc::new(|i: &[&TMeta], a: &Args| {
                let (h_ax, w_ax, [_, _, w, h]) = crop_window(i[0], a)?;
                let mut shape = i[0].shape.clone();
                shape[h_ax] = h;
                shape[w_ax] = w;
                Ok(vec![TMeta {
                    shape,
                    ..i[0].clone()
                }])
            }),
            Arc::new(|i: &[&Tensor], a: &Args| {
                let t = i[0];
                let (h_ax, w_ax, [x, y, w, h]) = crop_window(&TMeta::of(t), a)?;
                let mut shape = t.shape().to_vec();
                shape[h_ax] = h;
                shape[w_ax] = w;
                if t.numel() == 0 {
                    // An empty image's strides may be anything (DLPack): none is
                    // stepped, and the crop is as empty.
                    let layout = t.c_layout().to_owned();
                    return Ok(vec![Tensor::new_host(t.dtype(), &shape, layout, |_| {
                        Ok(())
                    })?]);
                }
                let origin = y * t.strides()[h_ax] + x * t.strides()[w_ax];
                let view = t.restride(shape, t.strides().to_vec(), origin);
                Ok(vec![
                    view.to_compact()?.with_layout(t.c_layout().to_owned()),
                ])
            }),
        ),
        one_in(
            "resize",
            vec![
                int_arg("h"),
                int_arg("w"),
                ArgSpec {
                    name: "interp".into(),
                    ty: ArgType::Str,
                    required: false,
                },
            ],
            Arc::new(|i: &[&TMeta], a: &Args| {
                let p = resize::plan(i[0], a)?;
                Ok(vec![TMeta {
                    shape: resize::out_shape(i[0], &p),
                    ..i[0].clone()
                }])
            }),
            Arc::new(|i: &[&Tensor], a: &Args| {
                let p = resize::plan(&TMeta::of(i[0]), a)?;
                Ok(vec![resize::run(i[0], &p)?])
            }),
        ),
        one_in(
            "rgb_to_gray",
            vec![],
            Arc::new(|i: &[&TMeta], _: &Args| {
                let (c_ax, _) = gray_meta(i[0])?;
                let mut shape = i[0].shape.clone();
                shape[c_ax] = 1;
                Ok(vec![TMeta {
                    shape,
                    ..i[0].clone()
                }])
            }),
            Arc::new(|i: &[&Tensor], _: &Args| Ok(vec![rgb_to_gray(i[0])?])),
        ),
        flip_op("flip_horizontal", true),
        flip_op("flip_vertical", false),
        one_in(
            "normalize",
            vec![
                ArgSpec {
                    name: "mean".into(),
                    ty: ArgType::Floats,
                    required: true,
                },
                ArgSpec {
                    name: "std".into(),
                    ty: ArgType::Floats,
                    required: true,
                },
            ],
            Arc::new(|i: &[&TMeta], a: &Args| {
                normalize_params(i[0], a)?;
                Ok(vec![TMeta {
                    dtype: DType::F32,
                    ..i[0].clone()
                }])
            }),
            Arc::new(|i: &[&Tensor], a: &Args| {
                let (c_ax, mean, std) = normalize_params(&TMeta::of(i[0]), a)?;
                Ok(vec![normalize(i[0], c_ax, &mean, &std)?])
            }),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hwc(h: i64, w: i64, c: i64) -> Tensor {
        make::<u8>(&[h, w, c], "HWC", |o| {
            for (i, v) in o.iter_mut().enumerate() {
                *v = i as u8;
            }
            Ok(())
        })
        .unwrap()
    }

    fn run(op: &str, t: &Tensor, args: Args) -> Result<Tensor> {
        let def = crate::ops::builtin(op).unwrap();
        (def.infer.as_ref().unwrap())(&[&TMeta::of(t)], &args)?;
        match &def.kernel {
            Kernel::Builtin(f) => Ok(f(&[t], &args)?.remove(0)),
            Kernel::Host(_) => unreachable!(),
        }
    }

    #[test]
    fn crop_flip_and_normalize_follow_the_layout() {
        let img = hwc(3, 4, 2);
        let args = Args::new()
            .with("x", ArgValue::Int(1))
            .with("y", ArgValue::Int(1))
            .with("w", ArgValue::Int(2))
            .with("h", ArgValue::Int(2));
        let c = run("crop", &img, args.clone()).unwrap();
        assert_eq!((c.shape(), c.layout()), (&[2i64, 2, 2][..], "HWC"));
        assert_eq!(c.to_bytes().unwrap(), [10, 11, 12, 13, 18, 19, 20, 21]);
        let f = run("flip_horizontal", &img, Args::new()).unwrap();
        assert_eq!(&f.to_bytes().unwrap()[..4], &[6, 7, 4, 5]);
        let outside = args.with("x", ArgValue::Int(3));
        assert!(
            run("crop", &img, outside)
                .unwrap_err()
                .message()
                .contains("not inside the 4x3 image")
        );
        let n = run(
            "normalize",
            &img,
            Args::new()
                .with("mean", ArgValue::Floats(vec![1.0, 2.0]))
                .with("std", ArgValue::Floats(vec![2.0])),
        )
        .unwrap();
        assert_eq!(typed::<f32>(&n).unwrap()[..2], [-0.5, -0.5]);
        let plain = make::<u8>(&[3, 4, 2], "", |_| Ok(())).unwrap();
        let e = run("flip_vertical", &plain, Args::new()).unwrap_err();
        assert!(e.message().contains("layout \"HWC\" or \"CHW\""), "{e}");
    }
}
