"""Joining and image operators through the C ABI (`ndx_invoke`, SYNC_CPU), compared
with NumPy 2 and OpenCV: concat stack crop flip_horizontal flip_vertical normalize
resize rgb_to_gray, on random values of bool int8 uint8 int32 uint16 int64 float16
float32 float64 (resize and rgb_to_gray: the dtypes they take), compact and strided
inputs (DLPack views: transposed, stepped, reversed, broadcast), and the errors at
`ndx_invoke`. Outputs are checked for dtype, shape, values, compact strides and their
layout string (`Tensor.layout`, i.e. `ndx_tensor_layout`), and the inputs for being left unchanged. The binding has no batch helper
(no `ndx_batch_*` wrapper), so batch inputs are not tested here.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_ops_image.py

OpenCV (cv2) is needed by the resize and rgb_to_gray comparisons only; those tests
are skipped when it cannot be imported.

Image operators take a 3-d tensor whose layout is "HWC" (H, W, C = axes 0, 1, 2) or
"CHW" (axes 1, 2, 0), given at import (`tensor_from_numpy(x, layout=...)`); their
output keeps the layout.

References (r = np.result_type of the inputs' dtypes: NEP 50, arrays only):
  concat(xs..., axis=0)    np.concatenate([x.astype(r) for x in xs], axis); 1..4
                           inputs; negative axis counts from the end; zero-size parts.
                           Layout: "" for inputs without one, the inputs' layout when
                           they all share it.
  stack(xs..., axis=0)     np.stack([x.astype(r) ...], axis), axis in [-(ndim+1), ndim];
                           layout "".
  crop(x, y, w, h)         HWC: img[y:y+h, x:x+w, :]; CHW: img[:, y:y+h, x:x+w].
  flip_horizontal()        np.flip(img, W axis); flip_vertical(): np.flip(img, H axis).
  normalize(mean, std)     ((img.astype(float64) - mean[c]) / std[c]).astype(float32),
                           c the channel; mean and std have 1 (broadcast) or C values.
                           Compared bit for bit (NaN equals NaN): ndx evaluates the
                           same float64 expression and rounds once.
  resize(h, w, interp)     OpenCV's half-pixel centres. "linear" (default): source
                           coordinate s = (d + 0.5) * in / out - 0.5 clamped to >= 0,
                           x0 = floor(s), x1 = min(x0 + 1, in - 1), weight s - x0
                           (0 at the clamps), separable; "nearest": source pixel
                           min(floor((d + 0.5) * in / out), in - 1), exactly (OpenCV's
                           INTER_NEAREST_EXACT except on ties, below).
                             uint8 linear vs cv2.resize(INTER_LINEAR): max |diff| <= 1
                               and >= 99% exactly equal (ndx uses the 11-bit fixed
                               point weights of OpenCV's generic path; OpenCV's SIMD
                               path rounds differently by at most 1).
                             float32 linear vs cv2: atol 1e-4 * max|x|.
                             nearest, uint8 and float32, vs cv2.INTER_NEAREST_EXACT:
                               exact, except where a source coordinate falls exactly
                               on a pixel edge (e.g. 1920 -> 224): ndx takes that
                               pixel, OpenCV's 16-bit fixed point sometimes the one
                               before; those rows and columns are compared with the
                               exact reference only.
                             other dtypes (int8 uint8 int16 uint16 int32 float16
                               float32 float64, and int64 with values in +-2**40) vs
                               the NumPy reference above evaluated in float64:
                               integers rounded half to even and saturated, within
                               1; floats within rtol (float16 2**-10, float32 2**-23,
                               float64 1e-12) plus atol = max|x| * (2**-20 *
                               max(in_h, in_w) + 2**-20) (room for a source
                               coordinate rounded to float32, as OpenCV rounds it);
                               nearest exact. Inputs are finite (a zero weight times
                               inf is NaN in any blend).
                           CHW equals the HWC result transposed; a strided input equals
                           its compact copy (both exact).
  rgb_to_gray()            3 (RGB) or 4 (RGBA, alpha ignored) channels to 1, same dtype
                           and layout. uint8 and uint16: cv2.cvtColor(COLOR_RGB2GRAY /
                           COLOR_RGBA2GRAY) exactly; float32: cv2 with rtol 1e-6, atol
                           1e-6; float64 and float16: 0.299 R + 0.587 G + 0.114 B in
                           float64 (float64: rtol 1e-12; float16: rtol 2**-10, atol
                           2**-24).

Errors, all at `ndx_invoke`:
  concat: no inputs, 0-d inputs, shapes that differ outside the axis (the message
    names "input i has shape" and both shapes) -> ValueError; axis out of range ->
    IndexError ("axis 5 is out of range"); a float axis -> TypeError.
  stack: no inputs, shapes that differ ("operator 'stack': input 1 has shape") -> ValueError;
    axis out of range -> IndexError.
  crop: a window not inside the image ("is not inside the {W}x{H} image": w or h 0 or
    negative, negative x or y, x + w > W, y + h > H, int64 extremes) -> ValueError; a
    missing argument -> ValueError, a float one -> TypeError.
  every image operator: an input without layout "HWC"/"CHW" or not 3-d -> ValueError
    ('layout "HWC" or "CHW"'); an unknown argument -> ValueError; no or two inputs.
  normalize: std containing 0 -> ValueError ("argument 'std' [...] has 0.0 at index i"); a count other than
    1 or C -> ValueError ("'mean' has 2 values, the image has 3 channels").
  resize: bool -> TypeError ("resize", "bool"); h or w <= 0 -> ValueError ("resize
    to"); an unknown interp -> ValueError ("interp"); an empty (0-pixel) image ->
    ValueError.
  rgb_to_gray: channels other than 3 or 4 -> ValueError ("3 or 4 channels"); int8,
    int32, bool -> TypeError ("rgb_to_gray").
"""

import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

BOOL = np.dtype(np.bool_)
I8, I16, I32, I64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
U8, U16, U32, U64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [BOOL, I8, U8, I32, U16, I64, F16, F32, F64]

IMAGE_OPS = ["crop", "flip_horizontal", "flip_vertical", "normalize", "resize", "rgb_to_gray"]
OPS = ["concat", "stack"] + IMAGE_OPS

VIEWS = ["compact", "T", "step", "neg", "bcast"]
LAYOUTS = ["HWC", "CHW"]
AXES = {"HWC": (0, 1, 2), "CHW": (1, 2, 0)}  # the (H, W, C) axes

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)


def need(module):
    """The module, or a skip where it is not installed; CI sets NDX_REQUIRE_OPENCV=1
    so that a missing OpenCV fails instead of silently skipping the comparisons."""
    if os.environ.get("NDX_REQUIRE_OPENCV") == "1":
        return __import__(module)
    return pytest.importorskip(module)


def name(dt):
    return np.dtype(dt).name


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ------------------------------------------------------------------- inputs


def make_values(rng, dt, shape, specials=True):
    """Random values of `dt`: bool uniform; integers over the full range; floats
    normal * 100, with ~10% NaN, +-inf, +-0 when `specials`."""
    shape = tuple(shape)
    dt = np.dtype(dt)
    if dt == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    x = rng.standard_normal(shape) * 100
    if specials:
        special = rng.random(shape) < 0.1
        picks = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0]), size=shape)
        x = np.where(special, picks, x)
    return np.asarray(x).astype(dt)


def pixel_values(rng, dt, shape):
    """Image values for resize and rgb_to_gray: integers over the full range (int64:
    +-2**40, exact in float64), floats uniform in [0, 255) (finite: a zero weight
    times inf is NaN in any blend)."""
    dt = np.dtype(dt)
    if dt == I64:
        return rng.integers(-(2**40), 2**40, size=shape, dtype=dt, endpoint=True)
    if dt.kind in "iu":
        return make_values(rng, dt, shape)
    return rng.uniform(0, 255, size=shape).astype(dt)


def view(make, shape, how):
    """An array of logical `shape` laid out as `how` (None: no such view of a 0-d
    shape): "T" reversed axes, "step" every 2nd along the first and the last axis,
    "neg" the first and the last axis reversed, "bcast" a zero stride on axis 1 (1-d:
    axis 0). `make(base_shape)` fills the base array."""
    shape = tuple(shape)
    n = len(shape)
    if how == "compact":
        return make(shape)
    if n == 0:
        return None
    idx = [slice(None)] * n
    if how == "T":
        if n == 1:
            return make((shape[0], 3))[:, 1]
        return make(shape[::-1]).T
    if how == "step":
        base = list(shape)
        base[0] *= 2
        idx[0] = slice(None, None, 2)
        if n > 1:
            base[-1] *= 2
            idx[-1] = slice(None, None, 2)
        return make(tuple(base))[tuple(idx)]
    if how == "neg":
        idx[0] = slice(None, None, -1)
        idx[-1] = slice(None, None, -1)
        return make(shape)[tuple(idx)]
    if how == "bcast":
        ax = 1 if n > 1 else 0
        base = list(shape)
        base[ax] = 1
        return np.broadcast_to(make(tuple(base)), shape)
    raise AssertionError(how)


def viewed(rng, dt, shape, how, values=make_values):
    x = view(lambda s: values(rng, dt, s), shape, how)
    assert x is not None and x.shape == tuple(shape), (how, shape)
    if how != "compact" and min(shape, default=0) > 1:
        assert not x.flags.c_contiguous, (how, shape, x.strides)
    return x


def image_shape(layout, h, w, c):
    return (h, w, c) if layout == "HWC" else (c, h, w)


def to_hwc(img, layout):
    return img if layout == "HWC" else img.transpose(1, 2, 0)


def from_hwc(img, layout):
    return img if layout == "HWC" else img.transpose(2, 0, 1)


# ------------------------------------------------------------------- references


def ref_concat(xs, axis):
    res = np.result_type(*[x.dtype for x in xs])
    return np.concatenate([x.astype(res) for x in xs], axis=axis)


def ref_stack(xs, axis):
    res = np.result_type(*[x.dtype for x in xs])
    return np.stack([x.astype(res) for x in xs], axis=axis)


def ref_crop(img, layout, x, y, w, h):
    if layout == "HWC":
        return img[y : y + h, x : x + w, :]
    return img[:, y : y + h, x : x + w]


def ref_flip(img, layout, horizontal):
    h_ax, w_ax, _ = AXES[layout]
    return np.flip(img, w_ax if horizontal else h_ax)


def ref_normalize(img, layout, mean, std):
    c_ax = AXES[layout][2]
    c = img.shape[c_ax]
    bshape = [1, 1, 1]
    bshape[c_ax] = c
    m = np.broadcast_to(np.asarray(mean, np.float64), (c,)).reshape(bshape)
    s = np.broadcast_to(np.asarray(std, np.float64), (c,)).reshape(bshape)
    with np.errstate(all="ignore"):
        return ((img.astype(np.float64) - m) / s).astype(np.float32)


def linear_taps(n_in, n_out):
    """Per output coordinate: the two source pixels and the second one's weight."""
    d = np.arange(n_out, dtype=np.float64)
    src = np.maximum((d + 0.5) * n_in / n_out - 0.5, 0.0)
    lo = np.floor(src).astype(np.int64)
    frac = src - lo
    last = lo >= n_in - 1
    lo[last] = n_in - 1
    frac[last] = 0.0
    return lo, np.minimum(lo + 1, n_in - 1), frac


def ref_resize_linear(img, layout, h, w):
    """The linear resize in float64, unrounded."""
    x = to_hwc(img, layout).astype(np.float64)
    y0, y1, fy = linear_taps(x.shape[0], h)
    x0, x1, fx = linear_taps(x.shape[1], w)
    fx = fx[None, :, None]
    fy = fy[:, None, None]
    top, bottom = x[y0], x[y1]
    top = top[:, x0] * (1 - fx) + top[:, x1] * fx
    bottom = bottom[:, x0] * (1 - fx) + bottom[:, x1] * fx
    return from_hwc(top * (1 - fy) + bottom * fy, layout)


def nearest_index(n_in, n_out):
    d = np.arange(n_out, dtype=np.int64)
    return np.minimum((2 * d + 1) * n_in // (2 * n_out), n_in - 1)


def has_tie(n_in, n_out):
    """Whether some output pixel's source coordinate (d + 0.5) * in / out is exactly
    an integer: on the edge between two source pixels."""
    return any((2 * d + 1) * n_in % (2 * n_out) == 0 for d in range(n_out))


def ref_resize_nearest(img, layout, h, w):
    x = to_hwc(img, layout)
    out = x[nearest_index(x.shape[0], h)][:, nearest_index(x.shape[1], w)]
    return from_hwc(out, layout)


def round_to(x, dt):
    """float64 values to `dt`: integers rounded half to even and saturated."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(x), info.min, info.max).astype(dt)
    return x.astype(dt)


def ref_gray(img, layout):
    """0.299 R + 0.587 G + 0.114 B in float64, shape with C = 1."""
    x = to_hwc(img, layout).astype(np.float64)
    g = 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    return from_hwc(g[..., None], layout)


def cv_resize(cv2, img, layout, h, w, interp):
    x = np.ascontiguousarray(to_hwc(img, layout))
    out = cv2.resize(x, (w, h), interpolation=interp)
    return from_hwc(out.reshape(h, w, x.shape[2]), layout)


def cv_gray(cv2, img, layout):
    x = np.ascontiguousarray(to_hwc(img, layout))
    code = cv2.COLOR_RGB2GRAY if x.shape[2] == 3 else cv2.COLOR_RGBA2GRAY
    g = cv2.cvtColor(x, code)
    return from_hwc(g.reshape(x.shape[0], x.shape[1], 1), layout)


def test_references():
    """A few reference values worked out by hand, and the NumPy references against
    NumPy's own functions and OpenCV."""
    a, b = np.array([[1, 2]], np.int8), np.array([[3.5, 4.5]], np.float16)
    assert ref_concat([a, b], 0).dtype == F16
    assert ref_concat([a, b], 0).tolist() == [[1, 2], [3.5, 4.5]]
    for da in DTYPES + [U64, U32, I16]:
        for db in DTYPES + [U64]:
            xs = [np.zeros((1, 2), da), np.ones((2, 2), db)]
            assert ref_concat(xs, 0).dtype == np.concatenate(xs).dtype, (da, db)
            assert ref_stack(xs[:1] * 2, 1).dtype == np.stack(xs[:1] * 2, 1).dtype
    assert ref_concat([np.zeros(1, I64), np.zeros(1, U64)], 0).dtype == F64
    img = np.arange(24).reshape(2, 3, 4)  # HWC: H 2, W 3, C 4
    assert ref_crop(img, "HWC", 1, 0, 2, 1).tolist() == [[[4, 5, 6, 7], [8, 9, 10, 11]]]
    assert ref_crop(img, "CHW", 1, 0, 2, 1).tolist() == [[[1, 2]], [[13, 14]]]
    assert ref_flip(img, "HWC", True)[0, 0].tolist() == [8, 9, 10, 11]
    assert ref_flip(img, "CHW", False)[0].tolist() == [[8, 9, 10, 11], [4, 5, 6, 7], [0, 1, 2, 3]]
    n = ref_normalize(np.array([[[1, 2]]], np.uint8), "HWC", [1.0, 0.0], [2.0, 4.0])
    assert n.dtype == F32 and n.tolist() == [[[0.0, 0.5]]]
    n = ref_normalize(np.array([[[1]], [[2]]], np.uint8), "CHW", [1.0, 0.0], [2.0, 4.0])
    assert n.tolist() == [[[0.0]], [[0.5]]]
    # 4 -> 2: centres 0.5 and 2.5; 2 -> 4: -0.25 clamps, 1.25 is past the last pixel.
    lo, hi, fr = linear_taps(4, 2)
    assert (lo.tolist(), hi.tolist(), fr.tolist()) == ([0, 2], [1, 3], [0.5, 0.5])
    lo, hi, fr = linear_taps(2, 4)
    assert (lo.tolist(), fr.tolist()) == ([0, 0, 0, 1], [0.0, 0.25, 0.75, 0.0])
    assert nearest_index(3, 7).tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert round_to(np.array([0.5, 1.5, -0.5, 300.0]), U8).tolist() == [0, 2, 0, 255]
    g = ref_gray(np.array([[[100, 50, 10, 255]]], np.uint8), "HWC")
    assert g.shape == (1, 1, 1) and abs(g[0, 0, 0] - (29.9 + 29.35 + 1.14)) < 1e-12


def test_references_agree_with_opencv():
    """The float64 linear reference is OpenCV's INTER_LINEAR (up to OpenCV's float32
    source coordinates); the nearest reference is INTER_NEAREST_EXACT where no
    source coordinate falls exactly on a pixel edge; the gray reference is cv2's
    float32 conversion."""
    cv2 = need("cv2")
    rng = rng_for("references", "opencv")
    for (ih, iw), (oh, ow) in [((37, 53), (11, 17)), ((5, 7), (16, 23)), ((9, 13), (9, 13)), ((1, 1), (3, 4)), ((48, 64), (36, 40))]:
        img = rng.uniform(0, 255, size=(ih, iw, 3))
        want = cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_LINEAR)
        np.testing.assert_allclose(ref_resize_linear(img, "HWC", oh, ow), want, rtol=0, atol=1e-3)
        if not (has_tie(ih, oh) or has_tie(iw, ow)):
            want = cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_NEAREST_EXACT)
            np.testing.assert_array_equal(ref_resize_nearest(img, "HWC", oh, ow), want)
    img = rng.uniform(0, 1, size=(7, 9, 3)).astype(np.float32)
    np.testing.assert_allclose(ref_gray(img, "HWC"), cv_gray(cv2, img, "HWC"), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------- calling ndx


@pytest.fixture(scope="module")
def ctx():
    c = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    yield c
    c.release()


def compact_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def to_tensors(xs, layout):
    """Imports each of `xs` (DLPack, no copy) with `layout` (a string for all, a list
    for each, None for none)."""
    layouts = layout if isinstance(layout, (list, tuple)) else [layout] * len(xs)
    return [ndx.tensor_from_numpy(x, layout=lay) for x, lay in zip(xs, layouts, strict=True)]


def run(ctx, op, xs, args=None, layout=None, what=""):
    """Invokes `op` (SYNC_CPU) on the arrays `xs`; returns its single output as a
    NumPy array and its layout string, after checking that the output is compact and
    the inputs were left unchanged."""
    before = [np.array(x, copy=True) for x in xs]
    tensors = to_tensors(xs, layout)
    fut = ctx.invoke(op, tensors, mode=ndx.NDX_EVAL_SYNC_CPU, args=args)
    try:
        assert fut.poll() != ndx.NDX_FUTURE_PENDING, f"{what}: SYNC_CPU: pending after invoke"
        fut.wait()
        assert fut.output_count() == 1, what
        with fut.tensor(0) as out:
            shape = out.shape
            if int(np.prod(shape, dtype=np.int64)) > 0:
                strides = out.strides
                want = compact_strides(shape)
                assert all(s == w for s, w, n in zip(strides, want, shape) if n > 1), (
                    f"{what}: output strides {strides} of shape {shape} are not compact"
                )
            got_layout = out.layout
            got = out.numpy()
    finally:
        fut.release()
        for t in tensors:
            t.release()
    for x, b in zip(xs, before):
        assert_same(x, b, f"{what}: an input was modified")
    return got, got_layout


def invoke_error(ctx, op, xs, args=None, layout=None):
    """The NdxError that `ndx_invoke` itself returns."""
    tensors = to_tensors(xs, layout)
    try:
        with pytest.raises(ndx.NdxError) as info:
            ctx.invoke(op, tensors, mode=ndx.NDX_EVAL_SYNC_CPU, args=args).release()
        return info.value
    finally:
        for t in tensors:
            t.release()


KINDS = {ndx.NDX_ERROR_VALUE: "ValueError", ndx.NDX_ERROR_INDEX: "IndexError", ndx.NDX_ERROR_TYPE: "TypeError"}


def expect_error(ctx, op, xs, args, kind, *needles, layout=None):
    """Checks that invoking fails at `ndx_invoke` with `kind`, the message holding
    every one of `needles`; returns the error."""
    what = describe(op, xs, args_text(args), layout)
    err = invoke_error(ctx, op, xs, args, layout)
    assert err.kind == kind, f"{what}: {err.kind_name} ({err.message}), expected {KINDS[kind]}"
    assert err.kind_name == KINDS[kind], (what, err.kind_name)
    assert isinstance(err, {"ValueError": ValueError, "IndexError": IndexError, "TypeError": TypeError}[KINDS[kind]])
    for needle in needles:
        assert needle in err.message, f"{what}: {needle!r} is not in the message {err.message!r}"
    return err


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def assert_same(got, want, what):
    """Same dtype and shape, and the same values bit for bit (two NaNs are equal)."""
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind == "f":
        g = np.ascontiguousarray(got)
        w = np.ascontiguousarray(want)
        bad = (g.view(_BITS[g.itemsize]) != w.view(_BITS[w.itemsize])) & ~(np.isnan(g) & np.isnan(w))
    else:
        bad = got != want
    if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(np.count_nonzero(bad))} of {want.size} elements differ; "
            f"first at {i}: ndx {got[i]!r}, expected {want[i]!r}"
        )


def assert_within(got, want, dt, rtol, atol, what):
    """`got` of dtype `dt` and `want`'s shape, with values within rtol / atol of
    `want` (float64)."""
    assert got.dtype == dt, f"{what}: dtype {got.dtype}, expected {dt}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol, err_msg=what)


def describe(op, xs, given="", layout=None):
    def one(x):
        strides = "" if x.flags.c_contiguous else f" strides={x.strides}"
        return f"{name(x.dtype)}{list(x.shape)}{strides}"

    lay = f" layout={layout}" if layout else ""
    return f"{op}({', '.join(one(x) for x in xs)}{', ' if given else ''}{given}){lay}"


def args_text(args):
    return "" if args is None else ("<args>" if isinstance(args, ndx.Args) else ", ".join(f"{k}={v}" for k, v in args.items()))


def shape_mentioned(message, shape):
    """Whether `message` shows `shape` as (2, 3), [2, 3] or 2x3."""
    inner = ", ".join(str(n) for n in shape)
    forms = [f"({inner})", f"[{inner}]", "x".join(str(n) for n in shape)]
    if len(shape) == 1:
        forms.append(f"({shape[0]},)")
    return any(f in message for f in forms)


def pid(v):
    """Test ids: arrays by dtype and shape."""
    if isinstance(v, np.ndarray):
        return f"{name(v.dtype)}{list(v.shape)}"
    return str(v)


# ------------------------------------------------------------------- concat

# (shapes of the inputs, axis)
CONCAT_CASES = [
    ([(5,)], 0),
    ([(2, 3)], 1),
    ([(2, 3), (4, 3)], 0),
    ([(2, 3), (2, 1), (2, 4)], 1),
    ([(2, 3), (2, 1), (2, 4)], -1),
    ([(3, 2), (3, 5)], -1),
    ([(1, 3, 4), (2, 3, 4), (3, 3, 4), (1, 3, 4)], 0),
    ([(1, 3, 4), (2, 3, 4), (3, 3, 4), (1, 3, 4)], -3),
    ([(2, 1, 4), (2, 3, 4), (2, 2, 4)], -2),
    ([(2, 3, 2), (2, 3, 5)], 2),
    ([(4,), (0,), (3,)], -1),  # a zero-size part
    ([(0, 3), (2, 3)], 0),
    ([(2, 0), (2, 3), (2, 0)], 1),
    ([(0, 3), (0, 3)], 0),  # all empty
    ([(2, 0, 4), (2, 0, 4)], 2),  # empty outside the axis
]


def check_join(ctx, op, xs, axis, what_extra=""):
    args = None if axis is None else ndx.Args().set_int("axis", axis)
    ax = 0 if axis is None else axis
    want = ref_concat(xs, ax) if op == "concat" else ref_stack(xs, ax)
    what = describe(op, xs, f"axis={axis}") + what_extra
    got, lay = run(ctx, op, xs, args, what=what)
    assert_same(got, want, what)
    assert lay == "", f"{what}: layout {lay!r} of inputs without one"


@pytest.mark.parametrize("how", VIEWS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_concat_same_dtype(ctx, dt, how):
    rng = rng_for("concat", name(dt), how)
    for shapes, axis in CONCAT_CASES:
        xs = [viewed(rng, dt, s, how) for s in shapes]
        check_join(ctx, "concat", xs, axis)


def test_concat_default_axis_is_0(ctx):
    rng = rng_for("concat default")
    xs = [make_values(rng, F32, (2, 3)), make_values(rng, F32, (1, 3))]
    check_join(ctx, "concat", xs, None)


# Dtype pairs whose promotion is not the wider of the two (NEP 50).
PROMOTION_EDGES = [(I64, U64), (U64, I8), (I16, F16), (U8, F16), (I8, U8), (U32, I32), (I32, F32), (U16, I8), (BOOL, F16)]


@pytest.mark.parametrize("da", DTYPES, ids=name)
def test_concat_mixed_dtypes(ctx, da):
    """Input 0 of dtype `da` with every other dtype, as 2 and 3 inputs (the third of a
    random dtype), each input in a random view."""
    rng = rng_for("concat mixed", name(da))
    for db in DTYPES:
        dc = DTYPES[int(rng.integers(len(DTYPES)))]
        for dts in ([da, db], [da, db, dc], [db, da]):
            hows = rng.choice(VIEWS, size=len(dts))
            shapes = [(2, 3 + i, 4) for i in range(len(dts))]
            xs = [viewed(rng, dt, s, str(h)) for dt, s, h in zip(dts, shapes, hows)]
            want_dt = np.result_type(*dts)
            check_join(ctx, "concat", xs, 1, f" views={list(hows)}")
            assert ref_concat(xs, 1).dtype == want_dt


@pytest.mark.parametrize("da,db", PROMOTION_EDGES + [(b, a) for a, b in PROMOTION_EDGES], ids=pid)
def test_concat_promotion_edges(ctx, da, db):
    rng = rng_for("concat edge", name(da), name(db))
    xs = [make_values(rng, da, (3, 2)), make_values(rng, db, (3, 4))]
    check_join(ctx, "concat", xs, -1)
    check_join(ctx, "concat", [xs[0], xs[1][:, :2], xs[0]], 0)


# Three dtypes whose promotion taken pairwise from the left differs from NumPy's
# np.result_type of all three (e.g. int8, uint8 -> int16, then with float16 ->
# float32; NumPy: float16), with the float moved to every position.
NON_ASSOCIATIVE = [
    (I8, U8, F16),  # float16
    (I8, U16, F16),  # float32
    (I8, U16, F32),  # float32
    (I16, U16, F16),  # float32
    (U16, I16, F32),  # float32
]
_NON_ASSOCIATIVE_ORDERS = [t for a, b, f in NON_ASSOCIATIVE for t in ((a, b, f), (b, a, f), (f, a, b), (a, f, b))]


@pytest.mark.parametrize("dts", _NON_ASSOCIATIVE_ORDERS, ids=lambda t: "-".join(map(name, t)))
@pytest.mark.parametrize("op", ["concat", "stack"])
def test_join_promotes_all_inputs_at_once(ctx, op, dts):
    """The output dtype is np.result_type of all the inputs, whatever their order (not
    the pairwise promotion folded from the left, which is not associative)."""
    rng = rng_for("promote all", op, [name(d) for d in dts])
    xs = [make_values(rng, dt, (2, 3)) for dt in dts]
    assert ref_concat(xs, 0).dtype == np.concatenate(xs).dtype == np.result_type(*dts)
    check_join(ctx, op, xs, 0)


def test_concat_large(ctx):
    """Larger inputs, strided, along every axis."""
    rng = rng_for("concat large")
    base = make_values(rng, F32, (40, 64, 9))
    parts = [base[::2], base[::-1][:20], base.transpose(0, 2, 1).copy().transpose(0, 2, 1)[5:25]]
    for axis in (0, 1, 2, -1):
        xs = [p if axis == 0 else p[:20] for p in parts]
        check_join(ctx, "concat", xs, axis)


@pytest.mark.parametrize("layout,axis", [("HWC", 1), ("HWC", 0), ("CHW", 0), ("CHW", 2)])
def test_concat_images_keep_their_layout(ctx, layout, axis):
    """Images sharing a layout joined along an axis: the output has that layout."""
    rng = rng_for("concat layout", layout, axis)
    xs = [make_values(rng, U8, (3, 4, 5)), make_values(rng, U8, (3, 4, 5))[::-1]]
    what = describe("concat", xs, f"axis={axis}", layout)
    got, lay = run(ctx, "concat", xs, ndx.Args().set_int("axis", axis), layout=layout, what=what)
    assert_same(got, ref_concat(xs, axis), what)
    assert lay == layout, f"{what}: layout {lay!r}"


# ------------------------------------------------------------------- stack

STACK_SHAPES = [(), (4,), (2, 3), (2, 3, 4), (0, 3)]


@pytest.mark.parametrize("how", VIEWS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_stack_same_dtype(ctx, dt, how):
    rng = rng_for("stack", name(dt), how)
    for shape in STACK_SHAPES:
        if how != "compact" and not shape:
            continue
        n = len(shape)
        for axis in range(-(n + 1), n + 1):
            count = 1 + (axis + n + 1) % 4  # 1..4 inputs
            xs = [viewed(rng, dt, shape, how) for _ in range(count)]
            check_join(ctx, "stack", xs, axis)


def test_stack_default_axis_is_0(ctx):
    rng = rng_for("stack default")
    xs = [make_values(rng, I32, (2, 3)) for _ in range(3)]
    check_join(ctx, "stack", xs, None)


@pytest.mark.parametrize("da", DTYPES, ids=name)
def test_stack_mixed_dtypes(ctx, da):
    rng = rng_for("stack mixed", name(da))
    for db in DTYPES:
        dc = DTYPES[int(rng.integers(len(DTYPES)))]
        for dts in ([da, db], [db, dc, da]):
            hows = rng.choice(VIEWS, size=len(dts))
            xs = [viewed(rng, dt, (3, 4), str(h)) for dt, h in zip(dts, hows)]
            check_join(ctx, "stack", xs, -1, f" views={list(hows)}")
    for db, dc in PROMOTION_EDGES:
        xs = [make_values(rng, dt, (2, 2)) for dt in (da, db, dc)]
        check_join(ctx, "stack", xs, 1)


def test_stack_of_images_has_no_layout(ctx):
    """Stacking HWC images gives a 4-d tensor: it cannot keep the 3-letter layout."""
    rng = rng_for("stack layout")
    xs = [make_values(rng, U8, (3, 4, 2)) for _ in range(2)]
    got, lay = run(ctx, "stack", xs, ndx.Args().set_int("axis", 0), layout="HWC", what="stack HWC")
    assert_same(got, np.stack(xs), "stack HWC")
    assert len(lay) in (0, 4), lay  # "" or, say, "NHWC"; never a 3-letter layout


# ------------------------------------------------------------------- concat / stack errors


def test_join_no_inputs(ctx):
    for op in ("concat", "stack"):
        expect_error(ctx, op, [], None, ndx.NDX_ERROR_VALUE)
        expect_error(ctx, op, [], ndx.Args().set_int("axis", 0), ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize("xs", [[np.array(1.0)], [np.array(1), np.array(2)], [np.array(True), np.zeros(2)]], ids=lambda xs: "+".join(pid(x) for x in xs))
def test_concat_zero_d(ctx, xs):
    with pytest.raises(ValueError):
        np.concatenate(xs)
    expect_error(ctx, "concat", xs, None, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "shapes,axis,bad",
    [
        ([(2, 3), (3, 3)], 1, 1),
        ([(2, 3), (2, 4)], 0, 1),
        ([(2, 3), (2, 3), (2, 4)], 0, 2),
        ([(2, 3), (2, 3, 1)], 0, 1),  # another ndim
        ([(2, 3, 4), (2, 3)], 0, 1),
        ([(2, 3, 4), (2, 5, 4), (3, 3, 4)], 1, 2),
        ([(0, 3), (0, 4)], 0, 1),
    ],
    ids=str,
)
def test_concat_shape_mismatch(ctx, shapes, axis, bad):
    xs = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(ValueError):
        np.concatenate(xs, axis)
    err = expect_error(ctx, "concat", xs, ndx.Args().set_int("axis", axis), ndx.NDX_ERROR_VALUE, f"input {bad} has shape")
    assert shape_mentioned(err.message, shapes[bad]), err.message
    assert shape_mentioned(err.message, shapes[0]), err.message


@pytest.mark.parametrize("shape,axis", [((2, 3), 5), ((2, 3), 2), ((2, 3), -3), ((4,), 1), ((2, 3), I64_MAX), ((2, 3), I64_MIN)], ids=str)
def test_concat_axis_out_of_range(ctx, shape, axis):
    xs = [np.zeros(shape, np.int32)] * 2
    needles = [f"axis {axis} is out of range"] if axis == 5 else [str(axis)]
    expect_error(ctx, "concat", xs, ndx.Args().set_int("axis", axis), ndx.NDX_ERROR_INDEX, *needles)


@pytest.mark.parametrize(
    "shapes",
    [[(2, 3), (3, 2)], [(2, 3), (2, 3), (2, 4)], [(2, 3), (2, 3, 1)], [(), (1,)], [(0, 3), (0, 2)]],
    ids=str,
)
def test_stack_shape_mismatch(ctx, shapes):
    xs = [np.zeros(s, np.uint8) for s in shapes]
    bad = next(i for i, s in enumerate(shapes) if s != shapes[0])
    with pytest.raises(ValueError):
        np.stack(xs)
    err = expect_error(ctx, "stack", xs, None, ndx.NDX_ERROR_VALUE, f"operator 'stack': input {bad} has shape")
    assert shape_mentioned(err.message, shapes[bad]), err.message


@pytest.mark.parametrize("shape,axis", [((2, 3), 3), ((2, 3), -4), ((), 1), ((), -2), ((4,), 2), ((2, 3), I64_MAX), ((2, 3), I64_MIN)], ids=str)
def test_stack_axis_out_of_range(ctx, shape, axis):
    xs = [np.zeros(shape, np.int32)] * 2
    expect_error(ctx, "stack", xs, ndx.Args().set_int("axis", axis), ndx.NDX_ERROR_INDEX, str(axis))


@pytest.mark.parametrize("op", ["concat", "stack"])
def test_join_axis_wrong_type(ctx, op):
    xs = [np.zeros((2, 3))] * 2
    for args in (ndx.Args().set_float("axis", 1.0), ndx.Args().set_int_array("axis", [0, 1]), ndx.Args().set_string("axis", "0")):
        expect_error(ctx, op, xs, args, ndx.NDX_ERROR_TYPE)


# ------------------------------------------------------------------- crop and flips

# (H, W, C) of the test images
IMAGE_HWC = [(5, 7, 3), (4, 6, 1), (3, 8, 4), (1, 1, 2), (2, 9, 2)]


def windows(h, w):
    """Crop windows (x, y, w, h) inside an h x w image: the whole image, corners,
    edges, rows, columns and an interior."""
    out = [(0, 0, w, h), (0, 0, 1, 1), (w - 1, h - 1, 1, 1), (w - 1, 0, 1, h), (0, h - 1, w, 1), (0, 0, w, 1)]
    if w > 2 and h > 2:
        out += [(1, 1, w - 2, h - 2), (2, 1, w - 3, 2), (w - 3, 0, 3, h)]
    if w > 1:
        out += [(1, 0, w - 1, h), (0, 0, w - 1, h)]
    if h > 1:
        out += [(0, 1, w, h - 1), (0, 0, 1, h - 1)]
    return list(dict.fromkeys(out))


def crop_args(x, y, w, h):
    return ndx.Args().set_int("x", x).set_int("y", y).set_int("w", w).set_int("h", h)


@pytest.mark.parametrize("how", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_crop(ctx, dt, layout, how):
    rng = rng_for("crop", name(dt), layout, how)
    for h, w, c in IMAGE_HWC:
        img = viewed(rng, dt, image_shape(layout, h, w, c), how)
        for win in windows(h, w):
            what = describe("crop", [img], "x={} y={} w={} h={}".format(*win), layout)
            got, lay = run(ctx, "crop", [img], crop_args(*win), layout=layout, what=what)
            assert_same(got, ref_crop(img, layout, *win), what)
            assert lay == layout, f"{what}: layout {lay!r}"


def test_crop_large(ctx):
    """A 480x640x3 uint8 image, compact and as a CHW view of an HWC array."""
    rng = rng_for("crop large")
    hwc = make_values(rng, U8, (480, 640, 3))
    for layout, img in (("HWC", hwc), ("CHW", hwc.transpose(2, 0, 1)), ("HWC", hwc[::-1, ::2])):
        H, W = img.shape[AXES[layout][0]], img.shape[AXES[layout][1]]
        for win in ((17, 33, 224, 224), (0, 0, W, H), (W - 100, H - 1, 100, 1)):
            what = describe("crop", [img], "x={} y={} w={} h={}".format(*win), layout)
            got, lay = run(ctx, "crop", [img], crop_args(*win), layout=layout, what=what)
            assert_same(got, ref_crop(img, layout, *win), what)
            assert lay == layout


FLIP_HWC = IMAGE_HWC + [(0, 4, 3), (3, 0, 2), (2, 3, 0)]


@pytest.mark.parametrize("how", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
@pytest.mark.parametrize("op", ["flip_horizontal", "flip_vertical"])
def test_flip(ctx, op, dt, layout, how):
    rng = rng_for(op, name(dt), layout, how)
    for h, w, c in FLIP_HWC:
        img = viewed(rng, dt, image_shape(layout, h, w, c), how)
        what = describe(op, [img], "", layout)
        got, lay = run(ctx, op, [img], layout=layout, what=what)
        assert_same(got, ref_flip(img, layout, op == "flip_horizontal"), what)
        assert lay == layout, f"{what}: layout {lay!r}"


@pytest.mark.parametrize("op", ["flip_horizontal", "flip_vertical"])
def test_flip_large(ctx, op):
    rng = rng_for("flip large", op)
    hwc = make_values(rng, F32, (123, 321, 3))
    for layout, img in (("HWC", hwc), ("CHW", hwc.transpose(2, 0, 1)), ("CHW", np.ascontiguousarray(hwc.transpose(2, 0, 1))[:, ::3])):
        what = describe(op, [img], "", layout)
        got, lay = run(ctx, op, [img], layout=layout, what=what)
        assert_same(got, ref_flip(img, layout, op == "flip_horizontal"), what)
        assert lay == layout


WINDOW_ERRORS = [
    (0, 0, 0, 1),  # w = 0
    (0, 0, 1, 0),  # h = 0
    (0, 0, 0, 0),
    (-1, 0, 2, 2),  # negative x
    (0, -1, 2, 2),
    (0, 0, -1, 2),  # negative w
    (0, 0, 2, -3),
    (1, 0, 6, 1),  # x + w = W + 1
    (0, 1, 1, 4),  # y + h = H + 1
    (6, 0, 1, 1),  # x = W
    (0, 4, 1, 1),  # y = H
    (0, 0, 7, 4),
    (I64_MAX, 0, 1, 1),
    (0, I64_MAX, 1, 1),
    (0, 0, I64_MAX, 1),
    (1, 0, I64_MAX, 1),  # x + w overflows int64
    (0, 1, 1, I64_MAX),
    (I64_MAX, I64_MAX, I64_MAX, I64_MAX),
    (I64_MIN, 0, 1, 1),
    (0, 0, I64_MIN, 1),
    (-5, 0, 10, 1),  # x + w inside, x not
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("win", WINDOW_ERRORS, ids=str)
def test_crop_window_not_inside(ctx, win, layout):
    img = np.zeros(image_shape(layout, 4, 6, 3), np.uint8)  # 6 wide, 4 high
    expect_error(ctx, "crop", [img], crop_args(*win), ndx.NDX_ERROR_VALUE, "is not inside the 6x4 image", layout=layout)


@pytest.mark.parametrize("missing", ["x", "y", "w", "h"])
def test_crop_missing_argument(ctx, missing):
    img = np.zeros((4, 6, 3), np.uint8)
    args = ndx.Args()
    for k in "xywh":
        if k != missing:
            args.set_int(k, 1)
    expect_error(ctx, "crop", [img], args, ndx.NDX_ERROR_VALUE, layout="HWC")


def test_crop_argument_wrong_type(ctx):
    img = np.zeros((4, 6, 3), np.uint8)
    for k in "xywh":
        args = ndx.Args()
        for j in "xywh":
            if j == k:
                args.set_float(j, 1.0)
            else:
                args.set_int(j, 1)
        expect_error(ctx, "crop", [img], args, ndx.NDX_ERROR_TYPE, layout="HWC")


# ------------------------------------------------------------------- normalize


def norm_choices(rng, c):
    """(mean, std) pairs: 1 value each, C each, and mixed."""
    mean_c = [float(v) for v in rng.normal(0, 50, c)]
    std_c = [float(v) for v in rng.uniform(0.1, 80, c) * rng.choice([-1, 1], c)]
    return [
        ([0.0], [1.0]),
        ([0.5], [0.25]),
        ([127.5], [-3.0]),
        (mean_c, std_c),
        (mean_c, [1 / 3]),
        ([-1e3], std_c),
        ([0.1] * c, [1e-3] * c),
    ]


def norm_args(mean, std):
    return ndx.Args().set_float_array("mean", mean).set_float_array("std", std)


@pytest.mark.parametrize("how", VIEWS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_normalize(ctx, dt, layout, how):
    rng = rng_for("normalize", name(dt), layout, how)
    for h, w, c in IMAGE_HWC + [(0, 3, 3), (2, 3, 0)]:
        img = viewed(rng, dt, image_shape(layout, h, w, c), how)
        for mean, std in norm_choices(rng, c) if c else [([1.0], [2.0])]:
            what = describe("normalize", [img], f"mean={mean} std={std}", layout)
            got, lay = run(ctx, "normalize", [img], norm_args(mean, std), layout=layout, what=what)
            assert_same(got, ref_normalize(img, layout, mean, std), what)
            assert lay == layout, f"{what}: layout {lay!r}"


def test_normalize_large(ctx):
    """The usual ImageNet statistics on a 224x224 uint8 image, HWC and CHW."""
    rng = rng_for("normalize large")
    hwc = make_values(rng, U8, (224, 224, 3))
    mean, std = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
    for layout, img in (("HWC", hwc), ("CHW", hwc.transpose(2, 0, 1)), ("CHW", np.ascontiguousarray(hwc.transpose(2, 0, 1)))):
        what = describe("normalize", [img], "imagenet", layout)
        got, lay = run(ctx, "normalize", [img], norm_args(mean, std), layout=layout, what=what)
        assert_same(got, ref_normalize(img, layout, mean, std), what)
        assert lay == layout


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("std", [[0.0], [-0.0], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0]], ids=str)
def test_normalize_std_zero(ctx, std, layout):
    """The message names the argument, its first zero's index and value (it said only
    "'std' contains 0")."""
    img = np.ones(image_shape(layout, 2, 3, 3), np.float32)
    i = next(k for k, v in enumerate(std) if v == 0.0)
    needle = f"argument 'std' {std!r} has {std[i]!r} at index {i}; expected a non-zero value"
    expect_error(ctx, "normalize", [img], norm_args([0.0], std), ndx.NDX_ERROR_VALUE, needle, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "mean,std,needle",
    [
        ([1.0, 2.0], [1.0], "'mean' has 2 values, the image has 3 channels"),
        ([1.0], [1.0, 2.0, 3.0, 4.0], "'std' has 4 values, the image has 3 channels"),
        ([], [1.0], "'mean' has 0 values, the image has 3 channels"),
        ([1.0], [], "'std' has 0 values, the image has 3 channels"),
        ([1.0] * 6, [1.0] * 6, "'mean' has 6 values, the image has 3 channels"),
    ],
    ids=str,
)
def test_normalize_wrong_count(ctx, mean, std, needle, layout):
    img = np.ones(image_shape(layout, 2, 3, 3), np.uint8)
    expect_error(ctx, "normalize", [img], norm_args(mean, std), ndx.NDX_ERROR_VALUE, needle, layout=layout)


def test_normalize_missing_argument(ctx):
    img = np.ones((2, 3, 3), np.uint8)
    for args in (ndx.Args().set_float_array("mean", [0.0]), ndx.Args().set_float_array("std", [1.0]), None):
        expect_error(ctx, "normalize", [img], args, ndx.NDX_ERROR_VALUE, layout="HWC")


# ------------------------------------------------------------------- resize

# (in_h, in_w, out_h, out_w)
RESIZE_CASES = [
    (37, 53, 11, 17),  # downscale, non-integer ratios
    (48, 64, 36, 40),  # 4/3 and 8/5
    (30, 40, 15, 20),  # exactly half
    (5, 7, 16, 23),  # upscale
    (17, 13, 40, 9),  # up in H, down in W
    (20, 30, 20, 30),  # the same size
    (1, 1, 4, 5),  # one source pixel
    (1, 9, 3, 4),
    (9, 1, 3, 7),
    (7, 5, 1, 1),  # one output pixel
]


def resize_args(h, w, interp=None):
    args = ndx.Args().set_int("h", h).set_int("w", w)
    return args if interp is None else args.set_string("interp", interp)


def resize_id(case):
    ih, iw, oh, ow = case
    return f"{ih}x{iw}-{oh}x{ow}"


def run_resize(ctx, img, layout, h, w, interp=None):
    what = describe("resize", [img], f"h={h} w={w} interp={interp}", layout)
    got, lay = run(ctx, "resize", [img], resize_args(h, w, interp), layout=layout, what=what)
    want_shape = list(img.shape)
    want_shape[AXES[layout][0]], want_shape[AXES[layout][1]] = h, w
    assert got.shape == tuple(want_shape), f"{what}: shape {got.shape}, expected {tuple(want_shape)}"
    assert got.dtype == img.dtype, f"{what}: dtype {got.dtype}"
    assert lay == layout, f"{what}: layout {lay!r}"
    return got, what


def assert_u8_like_opencv(got, want, what):
    """uint8 against OpenCV's INTER_LINEAR: within 1, and >= 99% exactly equal."""
    assert got.dtype == U8 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    equal = float(np.mean(diff == 0)) if diff.size else 1.0
    if diff.size and (diff.max() > 1 or equal < 0.99):
        i = tuple(int(k) for k in np.argwhere(diff == diff.max())[0])
        raise AssertionError(
            f"{what}: max |ndx - cv2| = {int(diff.max())}, {equal:.2%} equal; "
            f"at {i}: ndx {got[i]}, cv2 {want[i]}"
        )


@pytest.mark.parametrize("case", RESIZE_CASES, ids=resize_id)
@pytest.mark.parametrize("c", [1, 3, 4])
def test_resize_uint8_linear_matches_opencv(ctx, c, case):
    cv2 = need("cv2")
    ih, iw, oh, ow = case
    img = make_values(rng_for("resize u8", c, case), U8, (ih, iw, c))
    for interp in (None, "linear"):
        got, what = run_resize(ctx, img, "HWC", oh, ow, interp)
        assert_u8_like_opencv(got, cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_LINEAR), what)
    if (ih, iw) == (oh, ow):
        assert_same(got, img, f"{what}: the same size")


@pytest.mark.parametrize("case", [(30, 40, 15, 20), (37, 53, 11, 17), (8, 6, 4, 3), (5, 7, 16, 23)], ids=resize_id)
@pytest.mark.parametrize("c", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_resize_uint8_linear_equals_opencv_bit_for_bit(ctx, layout, c, case):
    """Every pixel equal, for any channel count and layout: OpenCV halves an image
    exactly with its area filter (2 x 2 means rounded half to even for pixels of 2, 5,
    6 channels, which a CHW image of as many planes has too)."""
    cv2 = need("cv2")
    ih, iw, oh, ow = case
    img = from_hwc(make_values(rng_for("resize u8 exact", c, case), U8, (ih, iw, c)), layout)
    got, what = run_resize(ctx, img, layout, oh, ow)
    want = cv_resize(cv2, img, layout, oh, ow, cv2.INTER_LINEAR)
    assert_same(got, want, what)


def test_resize_uint8_full_hd_to_224(ctx):
    """1080x1920x3 -> 224x224, linear, against OpenCV."""
    cv2 = need("cv2")
    rng = rng_for("resize full hd")
    # A smooth picture plus noise (closer to a photograph than pure noise).
    yy, xx = np.mgrid[0:1080, 0:1920]
    base = 127 + 100 * np.sin(xx / 37.0)[..., None] * np.cos(yy[..., None] / 23.0 + np.arange(3))
    img = np.clip(base + rng.normal(0, 20, (1080, 1920, 3)), 0, 255).astype(np.uint8)
    got, what = run_resize(ctx, img, "HWC", 224, 224)
    assert_u8_like_opencv(got, cv_resize(cv2, img, "HWC", 224, 224, cv2.INTER_LINEAR), what)


@pytest.mark.parametrize("case", RESIZE_CASES, ids=resize_id)
@pytest.mark.parametrize("c", [1, 3, 4])
def test_resize_float32_linear_matches_opencv(ctx, c, case):
    cv2 = need("cv2")
    ih, iw, oh, ow = case
    img = make_values(rng_for("resize f32", c, case), F32, (ih, iw, c), specials=False)
    got, what = run_resize(ctx, img, "HWC", oh, ow)
    want = cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_LINEAR)
    assert_within(got, want.astype(np.float64), F32, 0, 1e-4 * float(np.max(np.abs(img))), what)
    if (ih, iw) == (oh, ow):
        assert_same(got, img, f"{what}: the same size")


_NO_TIES = [c for c in RESIZE_CASES if not (has_tie(c[0], c[2]) or has_tie(c[1], c[3]))]
_WITH_TIES = [c for c in RESIZE_CASES if c not in _NO_TIES]


@pytest.mark.parametrize("case", _NO_TIES, ids=resize_id)
@pytest.mark.parametrize("dt", [U8, F32], ids=name)
@pytest.mark.parametrize("c", [1, 3, 4])
def test_resize_nearest_matches_opencv(ctx, c, dt, case):
    """Sizes where no source coordinate lies on a pixel edge (those are below)."""
    cv2 = need("cv2")
    ih, iw, oh, ow = case
    img = pixel_values(rng_for("resize nearest", c, name(dt), case), dt, (ih, iw, c))
    got, what = run_resize(ctx, img, "HWC", oh, ow, "nearest")
    assert_same(got, cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_NEAREST_EXACT), what)


# Sizes where a source coordinate (d + 0.5) * in / out falls exactly on a pixel edge.
NEAREST_TIES = [(3, 2, 3, 7), (3, 4, 3, 6), (2, 5, 7, 5), (4, 3, 6, 3), (3, 1920, 2, 224), (1920, 3, 224, 2)] + _WITH_TIES


@pytest.mark.parametrize("case", NEAREST_TIES, ids=resize_id)
@pytest.mark.parametrize("dt", [U8, F32], ids=name)
def test_resize_nearest_ties_take_the_exact_pixel(ctx, dt, case):
    """Output pixels whose source coordinate lies exactly on the edge between two
    pixels (e.g. 1920 -> 224: (10 + 0.5) * 1920 / 224 = 90, 2 -> 7: (3 + 0.5) * 2 / 7
    = 1) take that pixel (floor of the exact coordinate); OpenCV's 16-bit fixed point
    lands just below the edge and sometimes takes the pixel before. Everywhere else
    ndx equals OpenCV."""
    assert has_tie(case[0], case[2]) or has_tie(case[1], case[3])
    cv2 = need("cv2")
    ih, iw, oh, ow = case
    img = pixel_values(rng_for("resize ties", name(dt), case), dt, (ih, iw, 3))
    got, what = run_resize(ctx, img, "HWC", oh, ow, "nearest")
    assert_same(got, ref_resize_nearest(img, "HWC", oh, ow), what)
    assert_matches_opencv_off_ties(cv2, got, img, case, what)


def assert_matches_opencv_off_ties(cv2, got, img, case, what):
    ih, iw, oh, ow = case
    rows = ~tie_mask(ih, oh)
    cols = ~tie_mask(iw, ow)
    want = cv_resize(cv2, img, "HWC", oh, ow, cv2.INTER_NEAREST_EXACT)
    assert_same(got[rows][:, cols], want[rows][:, cols], f"{what}: off the ties, vs OpenCV")


def tie_mask(n_in, n_out):
    """Output coordinates whose source coordinate (d + 0.5) * in / out is an integer."""
    d = np.arange(n_out, dtype=np.int64)
    return ((2 * d + 1) * n_in) % (2 * n_out) == 0


def test_resize_nearest_full_hd_to_224(ctx):
    """1080x1920x3 -> 224x224, nearest (1920 / 224 has ties): the exact reference,
    and OpenCV off the ties."""
    cv2 = need("cv2")
    img = make_values(rng_for("resize nearest full hd"), U8, (1080, 1920, 3))
    got, what = run_resize(ctx, img, "HWC", 224, 224, "nearest")
    assert_same(got, ref_resize_nearest(img, "HWC", 224, 224), what)
    assert_matches_opencv_off_ties(cv2, got, img, (1080, 1920, 224, 224), what)


RESIZE_DTYPES = [I8, U8, I16, U16, I32, I64, F16, F32, F64]
# rtol of a float resize against the float64 reference: the dtype's rounding
RESIZE_RTOL = {F16: 2.0**-10, F32: 2.0**-23, F64: 1e-12}


def check_resize_reference(got, img, layout, h, w, what):
    """`got` against the float64 reference: integers within 1, floats within
    RESIZE_RTOL plus atol = max|x| * (2**-20 * max(in_h, in_w) + 2**-20)."""
    want = ref_resize_linear(img, layout, h, w)
    dt = img.dtype
    if dt.kind in "iu":
        rounded = round_to(want, dt)
        assert got.dtype == dt and got.shape == rounded.shape, (what, got.dtype, got.shape)
        diff = np.abs(got.astype(np.float64) - rounded.astype(np.float64))
        if diff.size and diff.max() > 1:
            i = tuple(int(k) for k in np.argwhere(diff > 1)[0])
            raise AssertionError(f"{what}: at {i}: ndx {got[i]}, reference {want[i]!r} (rounded {rounded[i]})")
        return
    in_h, in_w = img.shape[AXES[layout][0]], img.shape[AXES[layout][1]]
    m = float(np.max(np.abs(img.astype(np.float64)))) if img.size else 0.0
    atol = m * (2.0**-20 * max(in_h, in_w) + 2.0**-20)
    assert_within(got, want, dt, RESIZE_RTOL[dt], atol, what)


@pytest.mark.parametrize("how", ["compact", "neg", "T"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", RESIZE_DTYPES, ids=name)
def test_resize_linear_matches_reference(ctx, dt, layout, how):
    rng = rng_for("resize reference", name(dt), layout, how)
    for ih, iw, oh, ow in RESIZE_CASES:
        img = viewed(rng, dt, image_shape(layout, ih, iw, 3), how, pixel_values)
        got, what = run_resize(ctx, img, layout, oh, ow)
        check_resize_reference(got, img, layout, oh, ow, what)


@pytest.mark.parametrize("how", ["compact", "neg"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", RESIZE_DTYPES, ids=name)
def test_resize_nearest_matches_reference(ctx, dt, layout, how):
    rng = rng_for("resize nearest reference", name(dt), layout, how)
    for ih, iw, oh, ow in RESIZE_CASES:
        img = viewed(rng, dt, image_shape(layout, ih, iw, 2), how, pixel_values)
        got, what = run_resize(ctx, img, layout, oh, ow, "nearest")
        assert_same(got, ref_resize_nearest(img, layout, oh, ow), what)


@pytest.mark.parametrize("interp", ["linear", "nearest"])
@pytest.mark.parametrize("dt", RESIZE_DTYPES, ids=name)
def test_resize_same_size_and_one_pixel(ctx, dt, interp):
    """Resizing to the same size is the identity; a 1x1 image resizes to copies of
    its pixel: exact, except float32/float16 "linear", which blends the clamped edge
    row with itself as OpenCV does (cv2 gives 249.19714 for a 249.19713 pixel too), so
    within two roundings."""
    rng = rng_for("resize identity", name(dt), interp)
    for layout in LAYOUTS:
        img = pixel_values(rng, dt, image_shape(layout, 6, 9, 3))
        got, what = run_resize(ctx, img, layout, 6, 9, interp)
        assert_same(got, img, what)
        px = pixel_values(rng, dt, image_shape(layout, 1, 1, 4))
        got, what = run_resize(ctx, px, layout, 5, 3, interp)
        want = np.broadcast_to(px, got.shape)
        if interp == "linear" and dt in (F16, F32):
            assert_within(got, want.astype(np.float64), dt, 2 * RESIZE_RTOL[dt], 0, what)
        else:
            assert_same(got, want, what)


@pytest.mark.parametrize("interp", ["linear", "nearest"])
@pytest.mark.parametrize("dt", [U8, I16, F16, F32, F64], ids=name)
def test_resize_chw_is_hwc_transposed(ctx, dt, interp):
    """The CHW result (a compact CHW input, and a CHW view of an HWC array) is the HWC
    result transposed, exactly."""
    rng = rng_for("resize chw", name(dt), interp)
    for ih, iw, oh, ow in RESIZE_CASES[:6]:
        hwc = pixel_values(rng, dt, (ih, iw, 3))
        want, _ = run_resize(ctx, hwc, "HWC", oh, ow, interp)
        for chw in (np.ascontiguousarray(hwc.transpose(2, 0, 1)), hwc.transpose(2, 0, 1)):
            got, what = run_resize(ctx, chw, "CHW", oh, ow, interp)
            assert_same(got, want.transpose(2, 0, 1), what)


@pytest.mark.parametrize("interp", ["linear", "nearest"])
@pytest.mark.parametrize("dt", [U8, U16, F32, F64], ids=name)
def test_resize_strided_equals_compact(ctx, dt, interp):
    """A strided input (img[::2, ::-1], a transposed, a stepped and a broadcast view)
    gives exactly the result of its compact copy."""
    rng = rng_for("resize strided", name(dt), interp)
    base = pixel_values(rng, dt, (40, 30, 3))
    views = [
        ("HWC", base[::2, ::-1]),
        ("HWC", base[3:30, 5:25][::-1, ::3]),
        ("HWC", pixel_values(rng, dt, (3, 30, 20)).transpose(2, 1, 0)),
        ("HWC", np.broadcast_to(base[:1], (20, 30, 3))),
        ("CHW", base.transpose(2, 0, 1)[::-1, ::3, ::2]),
    ]
    for layout, v in views:
        assert not v.flags.c_contiguous
        h, w = v.shape[AXES[layout][0]], v.shape[AXES[layout][1]]
        for oh, ow in ((7, 9), (h * 2 + 1, w + 3), (h, w)):
            got, what = run_resize(ctx, v, layout, oh, ow, interp)
            want, _ = run_resize(ctx, np.ascontiguousarray(v), layout, oh, ow, interp)
            assert_same(got, want, what)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resize_bool_rejected(ctx, layout):
    img = np.zeros(image_shape(layout, 4, 4, 3), bool)
    for interp in (None, "nearest"):
        err = expect_error(ctx, "resize", [img], resize_args(2, 2, interp), ndx.NDX_ERROR_TYPE, "resize", layout=layout)
        assert "bool" in err.message, err.message


@pytest.mark.parametrize("h,w", [(0, 5), (5, 0), (0, 0), (-1, 5), (5, -2), (I64_MIN, 1), (1, I64_MIN)], ids=str)
def test_resize_size_not_positive(ctx, h, w):
    for layout in LAYOUTS:
        img = np.zeros(image_shape(layout, 4, 4, 3), np.uint8)
        err = expect_error(ctx, "resize", [img], resize_args(h, w), ndx.NDX_ERROR_VALUE, "resize to", layout=layout)
        # The message names the first argument that is not a size, with its value.
        name, value = ("h", h) if h <= 0 else ("w", w)
        assert f"resize to h = {h}, w = {w}: argument '{name}' is {value}; expected a size >= 1" in err.message


@pytest.mark.parametrize("interp", ["cubic", "", "LINEAR", "Nearest", "area", "linear "])
def test_resize_unknown_interp(ctx, interp):
    img = np.zeros((4, 4, 3), np.float32)
    expect_error(ctx, "resize", [img], resize_args(2, 2, interp), ndx.NDX_ERROR_VALUE, "interp", layout="HWC")


def test_resize_argument_errors(ctx):
    img = np.zeros((4, 4, 3), np.float32)
    for args in (ndx.Args().set_int("h", 2), ndx.Args().set_int("w", 2), None):
        expect_error(ctx, "resize", [img], args, ndx.NDX_ERROR_VALUE, layout="HWC")
    for args in (
        ndx.Args().set_float("h", 2.0).set_int("w", 2),
        ndx.Args().set_int("h", 2).set_int_array("w", [2]),
        resize_args(2, 2).set_int("interp", 1),
    ):
        expect_error(ctx, "resize", [img], args, ndx.NDX_ERROR_TYPE, layout="HWC")


@pytest.mark.parametrize("shape", [(0, 4, 3), (4, 0, 3)], ids=str)
def test_resize_empty_image(ctx, shape):
    """An image without pixels has nothing to sample (OpenCV refuses it too)."""
    img = np.zeros(shape, np.uint8)
    expect_error(ctx, "resize", [img], resize_args(2, 2), ndx.NDX_ERROR_VALUE, layout="HWC")


# ------------------------------------------------------------------- rgb_to_gray

GRAY_HW = [(5, 7), (31, 45), (1, 1), (2, 33)]


def gray_views():
    return ["compact", "T", "neg", "step"]


def run_gray(ctx, img, layout):
    what = describe("rgb_to_gray", [img], "", layout)
    got, lay = run(ctx, "rgb_to_gray", [img], layout=layout, what=what)
    want_shape = list(img.shape)
    want_shape[AXES[layout][2]] = 1
    assert got.shape == tuple(want_shape), f"{what}: shape {got.shape}, expected {tuple(want_shape)}"
    assert got.dtype == img.dtype, f"{what}: dtype {got.dtype}"
    assert lay == layout, f"{what}: layout {lay!r}"
    return got, what


@pytest.mark.parametrize("how", gray_views())
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", [3, 4])
@pytest.mark.parametrize("dt", [U8, U16], ids=name)
def test_rgb_to_gray_integers_match_opencv(ctx, dt, c, layout, how):
    cv2 = need("cv2")
    rng = rng_for("gray", name(dt), c, layout, how)
    for h, w in GRAY_HW:
        img = viewed(rng, dt, image_shape(layout, h, w, c), how)
        got, what = run_gray(ctx, img, layout)
        assert_same(got, cv_gray(cv2, img, layout), what)


@pytest.mark.parametrize("dt", [U8, U16], ids=name)
def test_rgb_to_gray_rounding_edges(ctx, dt):
    """Every pure grey (R = G = B stays itself), the extremes, and pixels whose exact
    value is near a half: against OpenCV."""
    cv2 = need("cv2")
    top = int(np.iinfo(dt).max)
    levels = np.unique(np.linspace(0, top, 256).astype(dt))
    grey = np.repeat(levels[:, None], 3, axis=1)[None]
    got, what = run_gray(ctx, grey, "HWC")
    assert_same(got, levels[None, :, None], what)
    assert_same(got, cv_gray(cv2, grey, "HWC"), what)
    rng = rng_for("gray edges", name(dt))
    corners = np.array([[a, b, c] for a in (0, top) for b in (0, top) for c in (0, top)], dt)[None]
    mixed = np.concatenate([corners, make_values(rng, dt, (1, 500, 3))], axis=1)
    got, what = run_gray(ctx, mixed, "HWC")
    assert_same(got, cv_gray(cv2, mixed, "HWC"), what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", [3, 4])
def test_rgb_to_gray_float32_matches_opencv(ctx, c, layout):
    cv2 = need("cv2")
    rng = rng_for("gray f32", c, layout)
    for how in gray_views():
        for h, w in GRAY_HW:
            for scale in (1.0, 255.0):
                img = viewed(rng, F32, image_shape(layout, h, w, c), how, lambda r, d, s: (r.uniform(0, 1, s) * scale).astype(d))
                got, what = run_gray(ctx, img, layout)
                assert_within(got, cv_gray(cv2, img, layout).astype(np.float64), F32, 1e-6, 1e-6, what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", [3, 4])
@pytest.mark.parametrize("dt", [F16, F64], ids=name)
def test_rgb_to_gray_float_formula(ctx, dt, c, layout):
    """float64 and float16 against 0.299 R + 0.587 G + 0.114 B in float64."""
    rng = rng_for("gray formula", name(dt), c, layout)
    rtol, atol = (1e-12, 0.0) if dt == F64 else (2.0**-10, 2.0**-24)
    for how in gray_views():
        for h, w in GRAY_HW:
            img = viewed(rng, dt, image_shape(layout, h, w, c), how, pixel_values)
            got, what = run_gray(ctx, img, layout)
            assert_within(got, ref_gray(img, layout), dt, rtol, atol, what)


def test_rgb_to_gray_alpha_is_ignored(ctx):
    rng = rng_for("gray alpha")
    rgb = make_values(rng, U8, (6, 5, 3))
    rgba = np.concatenate([rgb, make_values(rng, U8, (6, 5, 1))], axis=2)
    a, _ = run_gray(ctx, rgb, "HWC")
    b, what = run_gray(ctx, rgba, "HWC")
    assert_same(b, a, what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", [1, 2, 5, 0])
def test_rgb_to_gray_channel_count(ctx, c, layout):
    img = np.zeros(image_shape(layout, 3, 4, c), np.uint8)
    expect_error(ctx, "rgb_to_gray", [img], None, ndx.NDX_ERROR_VALUE, "3 or 4 channels", layout=layout)


@pytest.mark.parametrize("dt", [I8, I32, BOOL], ids=name)
def test_rgb_to_gray_dtype_rejected(ctx, dt):
    for layout in LAYOUTS:
        img = np.zeros(image_shape(layout, 3, 4, 3), dt)
        expect_error(ctx, "rgb_to_gray", [img], None, ndx.NDX_ERROR_TYPE, "rgb_to_gray", layout=layout)


# ------------------------------------------------------------------- image operators in general

# A valid invocation of each image operator on a (4, 6, 3) image (None: no arguments).
VALID = {
    "crop": lambda: crop_args(1, 1, 2, 2),
    "flip_horizontal": lambda: None,
    "flip_vertical": lambda: None,
    "normalize": lambda: norm_args([0.5], [2.0]),
    "resize": lambda: resize_args(2, 3),
    "rgb_to_gray": lambda: None,
}

BAD_LAYOUTS = [
    ((4, 6, 3), None),  # no layout
    ((4, 6), None),
    ((4, 6), "HW"),
    ((1, 4, 6, 3), "NHWC"),
    ((2, 4, 6, 3), None),
    ((4, 6, 3), "WHC"),
    ((4, 6, 3), "hwc"),
    ((3, 4, 6), "CWH"),
    ((4, 6, 3), "HCW"),
    ((24,), "C"),
    ((), None),
]


@pytest.mark.parametrize("shape,layout", BAD_LAYOUTS, ids=str)
@pytest.mark.parametrize("op", IMAGE_OPS)
def test_image_op_needs_hwc_or_chw(ctx, op, shape, layout):
    img = np.zeros(shape, np.uint8)
    expect_error(ctx, op, [img], VALID[op](), ndx.NDX_ERROR_VALUE, 'layout "HWC" or "CHW"', layout=layout)


@pytest.mark.parametrize("op", IMAGE_OPS)
def test_image_op_valid_arguments(ctx, op):
    """The VALID invocations succeed (so the errors around them are the errors
    meant), keeping the layout."""
    for layout in LAYOUTS:
        img = make_values(rng_for("valid", op, layout), U8, image_shape(layout, 4, 6, 3))
        _, lay = run(ctx, op, [img], VALID[op](), layout=layout, what=f"{op} {layout}")
        assert lay == layout


@pytest.mark.parametrize("op", IMAGE_OPS)
def test_image_op_unknown_argument(ctx, op):
    img = np.zeros((4, 6, 3), np.uint8)
    args = VALID[op]() or ndx.Args()
    err = expect_error(ctx, op, [img], args.set_int("bogus", 0), ndx.NDX_ERROR_VALUE, layout="HWC")
    assert "bogus" in err.message, err.message


@pytest.mark.parametrize("op", IMAGE_OPS)
def test_image_op_input_count(ctx, op):
    """Valid arguments, but no input or two inputs."""
    img = np.zeros((4, 6, 3), np.uint8)
    for xs in ([], [img, img]):
        expect_error(ctx, op, xs, VALID[op](), ndx.NDX_ERROR_VALUE, layout="HWC")


def test_every_operator_is_covered():
    assert set(OPS) == set("concat stack crop flip_horizontal flip_vertical normalize resize rgb_to_gray".split())
