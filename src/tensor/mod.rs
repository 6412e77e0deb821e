//! Tensors and batches: dtype, shape, strides and layout over a [`Storage`].

pub(crate) mod dest;
pub mod dlpack;
mod dtype;
pub(crate) mod storage;

pub use dtype::{DType, Device, DeviceKind, describe_dl_dtype, dl_device_name};
pub(crate) use storage::try_host_vec;
pub use storage::{ALIGNMENT, HostDeleter, Storage};

use std::ffi::{CStr, CString};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// The most dimensions a tensor may have (NumPy 2's limit): imports and host tensors
/// with more are refused, and so is an invocation whose output would have more
/// (`check_ndim`), so every tensor ndx makes can be exported and imported again.
pub const MAX_NDIM: i32 = 64;

/// Refuses a shape of more than [`MAX_NDIM`] dimensions; `what` names the tensor.
pub fn check_ndim(what: &str, shape: &[i64]) -> Result<()> {
    if shape.len() > MAX_NDIM as usize {
        return Err(Error::value(format!(
            "{what} would have {} dimensions; a tensor has at most {MAX_NDIM} (NDX_MAX_NDIM)",
            shape.len()
        )));
    }
    Ok(())
}

/// Options that apply to every import (DLPack or host memory).
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// A layout string such as `"HWC"`: one distinct ASCII letter per dimension.
    pub layout: Option<String>,
    /// Forces the imported tensors to be read-only.
    pub read_only: bool,
    /// For CUDA memory: the raw `CUstream` the producer's writes are ordered on (0 is
    /// the legacy default stream), or [`crate::cuda::STREAM_NO_SYNC`].
    pub stream: usize,
}

/// Formats a shape or strides as `[2, 3]`.
pub fn dims(values: &[i64]) -> String {
    let inner: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("[{}]", inner.join(", "))
}

/// Rows per tile of a strided copy (see [`Tensor::copy_to`]): a transposed view's
/// tile reads 64 consecutive elements of each source row (256 bytes of float32), runs
/// long enough that walking down the source's rows streams rather than waits on each
/// line.
const TILE_ROWS: usize = 64;
/// Elements per row of a tile: with [`TILE_ROWS`], a tile's local block (see
/// [`copy_tile`], 32 KiB at most, on the stack) and its source lines fit the L1 and L2
/// caches.
const TILE_COLS: usize = 64;

/// Copies the rows in `tile` — each `(at, out)`: `n` elements from `src[at]` on, `step`
/// apart, to `dst[out..out + n]` — column block by column block, and empties `tile`.
///
/// When a row's elements lie in separate cache lines (a transposed view), each column
/// block goes through a small local block: read column by column (the
/// tile's rows usually start next to each other, so one column is one or two cache
/// lines of `src`), then written out row by row. Reading the tile row by row instead
/// touches [`TILE_COLS`] lines of `src` per row, which a power-of-two row pitch maps to
/// one set of the L1 cache, where they evict each other before the next row reads them
/// again (a transposed 4096 x 4096 float32 gathered into a small buffer ran 3x slower).
fn copy_tile<T: Copy>(
    src: &[T],
    dst: &mut [T],
    tile: &mut Vec<(isize, usize)>,
    step: isize,
    n: usize,
) {
    let Some(&(first, _)) = tile.first() else {
        return;
    };
    if n < TILE_COLS || step.unsigned_abs() * size_of::<T>() <= 64 {
        // Short rows, where filling the local block would cost more than it saves, and
        // rows whose elements share cache lines (a stepped slice), which read best
        // row by row.
        for &(at, out) in tile.iter() {
            for (k, d) in dst[out..out + n].iter_mut().enumerate() {
                *d = src[(at + k as isize * step) as usize];
            }
        }
        tile.clear();
        return;
    }
    let mut block = [[src[first as usize]; TILE_COLS]; TILE_ROWS];
    let block = &mut block[..tile.len()];
    for c0 in (0..n).step_by(TILE_COLS) {
        let c1 = (c0 + TILE_COLS).min(n);
        for k in c0..c1 {
            let s = k as isize * step;
            for (b, &(at, _)) in block.iter_mut().zip(tile.iter()) {
                b[k - c0] = src[(at + s) as usize];
            }
        }
        for (b, &(_, out)) in block.iter().zip(tile.iter()) {
            dst[out + c0..out + c1].copy_from_slice(&b[..c1 - c0]);
        }
    }
    tile.clear();
}

/// Compact (row-major) strides in elements; `None` on overflow.
pub fn compact_strides(shape: &[i64]) -> Option<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.checked_mul(shape[i].max(1))?;
    }
    Some(strides)
}

/// The byte size of a compact tensor of `shape` and `itemsize`, when such a tensor can be
/// addressed: sizes non-negative, compact strides representable in `i64`, and the
/// itemsize times the sizes, multiplied from the outermost, at most `isize::MAX` before
/// any zero size (an empty shape whose other sizes overflow is refused too: kernels
/// multiply sizes without meeting the zero first); `None` otherwise.
pub fn compact_nbytes(shape: &[i64], itemsize: usize) -> Option<usize> {
    if shape.iter().any(|&d| d < 0) {
        return None;
    }
    compact_strides(shape)?;
    let nbytes = shape
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d as usize))?;
    (nbytes <= isize::MAX as usize).then_some(nbytes)
}

/// The validated geometry of a view: strides, element count, and the byte span
/// `[lo, lo + len)` it touches relative to the data pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// Number of elements.
    pub numel: usize,
    /// Start of the touched span, in bytes from the data pointer.
    pub lo: isize,
    /// Length of the touched span in bytes.
    pub len: usize,
}

/// Validates a view described by C or DLPack: sizes non-negative, element count and
/// every byte address representable, NULL data only when empty. `what` names the
/// tensor in messages (`"tensor"`, `"tensors[3]"`).
pub fn validate_geometry(
    what: &str,
    data: usize,
    shape: &[i64],
    strides: Option<&[i64]>,
    itemsize: usize,
    byte_offset: u64,
) -> Result<Geometry> {
    for (i, &d) in shape.iter().enumerate() {
        if d < 0 {
            return Err(Error::value(format!(
                "{what}: shape[{i}] is {d}, expected a non-negative size (shape {})",
                dims(shape)
            )));
        }
    }
    let overflow = || {
        Error::value(format!(
            "{what}: shape {} with strides {} and itemsize {itemsize} from byte_offset {byte_offset} overflows the address space",
            dims(shape),
            strides.map_or_else(|| "compact".to_string(), dims)
        ))
    };
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .ok_or_else(overflow)?;
    // Whatever the strides (zero ones broadcast a few bytes to many elements), the
    // elements must fit compacted: copies, exports and outputs of the same shape.
    if compact_nbytes(shape, itemsize).is_none() {
        let why = if numel == 0 {
            "it holds no elements, but its other sizes multiply past the address space".to_string()
        } else {
            format!(
                "its compact size ({numel} elements x {itemsize} bytes) overflows the \
                 address space"
            )
        };
        return Err(Error::value(format!(
            "{what}: shape {} of itemsize {itemsize} is too large to address: {why}",
            dims(shape),
        )));
    }
    let strides = match strides {
        Some(s) => s.to_vec(),
        None => compact_strides(shape).ok_or_else(overflow)?,
    };
    if numel == 0 {
        let lo = isize::try_from(byte_offset).map_err(|_| overflow())?;
        return Ok(Geometry {
            strides,
            numel,
            lo,
            len: 0,
        });
    }
    if data == 0 {
        return Err(Error::value(format!(
            "{what}: data is NULL but the tensor has {numel} elements (shape {})",
            dims(shape)
        )));
    }
    // Extreme element offsets, in i128 so no intermediate can overflow.
    let (mut min_el, mut max_el) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(&strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 {
            min_el += reach;
        } else {
            max_el += reach;
        }
    }
    let item = itemsize as i128;
    let lo = byte_offset as i128 + min_el * item;
    let hi = byte_offset as i128 + (max_el + 1) * item;
    let addr_lo = data as i128 + lo;
    let addr_hi = data as i128 + hi;
    if addr_lo < 0 || addr_hi > isize::MAX as i128 || hi - lo > isize::MAX as i128 {
        return Err(overflow());
    }
    Ok(Geometry {
        strides,
        numel,
        lo: lo as isize,
        len: (hi - lo) as usize,
    })
}

/// Checks a layout string against `ndim`: one distinct ASCII letter per dimension.
pub fn validate_layout(layout: &str, ndim: usize, what: &str) -> Result<CString> {
    if layout.is_empty() {
        return Ok(CString::default());
    }
    if !layout.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(Error::value(format!(
            "{what}: layout \"{layout}\" must consist of ASCII letters, one per dimension"
        )));
    }
    if layout.len() != ndim {
        return Err(Error::value(format!(
            "{what}: layout \"{layout}\" has {} letters but the tensor has ndim {ndim}",
            layout.len()
        )));
    }
    let mut seen = [false; 128];
    for b in layout.bytes() {
        if std::mem::replace(&mut seen[b as usize], true) {
            return Err(Error::value(format!(
                "{what}: layout \"{layout}\" names dimension '{}' twice",
                b as char
            )));
        }
    }
    Ok(CString::new(layout).unwrap_or_default())
}

/// An n-dimensional view of a [`Storage`]. Cloning copies the view, not the data.
#[derive(Debug, Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Byte offset of element 0 from the storage's data pointer (DLPack's meaning).
    byte_offset: u64,
    numel: usize,
    layout: CString,
    read_only: bool,
}

impl Tensor {
    /// A view over `storage`, whose geometry the caller has validated.
    pub(crate) fn from_parts(
        storage: Arc<Storage>,
        dtype: DType,
        shape: Vec<i64>,
        geometry: Geometry,
        byte_offset: u64,
        layout: CString,
        read_only: bool,
    ) -> Tensor {
        let read_only = read_only || storage.read_only();
        Tensor {
            storage,
            dtype,
            shape,
            strides: geometry.strides,
            byte_offset,
            numel: geometry.numel,
            layout,
            read_only,
        }
    }

    /// A new compact host tensor filled by `fill`, which receives the zeroed bytes.
    pub fn new_host(
        dtype: DType,
        shape: &[i64],
        layout: CString,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Tensor> {
        Tensor::new_host_in("the output", dtype, shape, layout, true, fill)
    }

    /// Like [`Tensor::new_host`] for a copy of another tensor: an allocation failure
    /// names "the copy" rather than "the output".
    pub(crate) fn new_host_copy(
        dtype: DType,
        shape: &[i64],
        layout: CString,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Tensor> {
        Tensor::new_host_in("the copy", dtype, shape, layout, true, fill)
    }

    /// Like [`Tensor::new_host`] for a `fill` that writes every byte: the bytes it
    /// receives may hold a reused buffer's old contents.
    pub fn new_host_overwritten(
        dtype: DType,
        shape: &[i64],
        layout: CString,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Tensor> {
        Tensor::new_host_in("the output", dtype, shape, layout, false, fill)
    }

    fn new_host_in(
        what: &str,
        dtype: DType,
        shape: &[i64],
        layout: CString,
        zeroed: bool,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Tensor> {
        if let Some(out) = dest::take(dtype, shape) {
            out.fill_compact(|bytes| {
                if zeroed {
                    bytes.fill(0);
                }
                fill(bytes)
            })?;
            return Ok((*out).clone().with_layout(layout));
        }
        let geometry = validate_geometry("output", 1, shape, None, dtype.itemsize(), 0)?;
        let nbytes = geometry
            .numel
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Memory,
                    format!("shape {} is too large to allocate", dims(shape)),
                )
            })?;
        let storage = if zeroed {
            Storage::owned(nbytes)
        } else {
            Storage::owned_stale(nbytes)
        };
        let mut storage = storage.map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "{what} of shape {} ({}): {}",
                    dims(shape),
                    dtype.name(),
                    e.message()
                ),
            )
        })?;
        if let Some(bytes) = storage.owned_bytes_mut() {
            fill(bytes)?;
        }
        let geometry = Geometry {
            lo: 0,
            len: nbytes,
            ..geometry
        };
        Ok(Tensor::from_parts(
            Arc::new(storage),
            dtype,
            shape.to_vec(),
            geometry,
            0,
            layout,
            false,
        ))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// The strides, in elements.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Byte offset of element 0 from the storage's data pointer.
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }
    /// Bytes of the data when compact (`numel * itemsize`).
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.itemsize()
    }
    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.storage.device()
    }
    /// The layout string (empty when none).
    pub fn layout(&self) -> &str {
        self.layout.to_str().unwrap_or("")
    }
    /// The layout as a C string borrowed from the tensor.
    pub fn c_layout(&self) -> &CStr {
        &self.layout
    }
    /// Whether ndx (and consumers of an export) must not write the data.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    /// The storage behind this view.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }
    /// Whether the strides are the compact row-major strides of the shape.
    pub fn is_compact(&self) -> bool {
        // A shape without compact strides cannot be compact (never a valid tensor's).
        compact_strides(&self.shape).is_some_and(|compact| {
            self.shape
                .iter()
                .zip(&self.strides)
                .zip(compact)
                .all(|((&d, &s), c)| d <= 1 || s == c)
        })
    }

    /// Copies the elements, compacted in row-major order, into `dst`, which must hold
    /// at least [`Tensor::nbytes`] bytes.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        let nbytes = self.nbytes();
        if dst.len() < nbytes {
            return Err(Error::value(format!(
                "buffer too small: the tensor has {nbytes} bytes ({} x {} of {}), the buffer holds {}",
                self.numel,
                self.dtype.itemsize(),
                self.dtype.name(),
                dst.len()
            )));
        }
        if nbytes == 0 {
            return Ok(());
        }
        self.storage.wait_host_readable()?;
        let src = self.storage.host_bytes().ok_or_else(|| {
            Error::value(format!(
                "the tensor lives in {} device memory, which the host cannot read; ndx_tensor_copy_to reads host-accessible memory only",
                self.device()
            ))
        })?;
        let origin = self.byte_offset as isize - self.storage.span_start();
        let dst = &mut dst[..nbytes];
        if self.is_compact() {
            let start = origin as usize;
            dst.copy_from_slice(&src[start..start + nbytes]);
            return Ok(());
        }
        match self.dtype.itemsize() {
            1 => self.gather::<u8, 1>(src, origin, dst),
            2 => self.gather::<u16, 2>(src, origin, dst),
            4 => self.gather::<u32, 4>(src, origin, dst),
            _ => self.gather::<u64, 8>(src, origin, dst),
        }
        Ok(())
    }

    /// Copies the elements of this non-compact view, whose element 0 is at byte
    /// `origin` of `span`, compacted into `dst` (exactly [`Tensor::nbytes`] long), as
    /// items of `N` bytes: `U` (an unsigned integer of `N` bytes) when both buffers are
    /// aligned for it, else byte arrays.
    fn gather<U: bytemuck::Pod + Send + Sync, const N: usize>(
        &self,
        span: &[u8],
        origin: isize,
        dst: &mut [u8],
    ) {
        // Every element starts at a multiple of N from `origin`: cut the span there.
        let shift = origin.rem_euclid(N as isize) as usize;
        let span = &span[shift..];
        let span = &span[..span.len() / N * N];
        match (
            bytemuck::try_cast_slice::<u8, U>(span),
            bytemuck::try_cast_slice_mut::<u8, U>(dst),
        ) {
            (Ok(src), Ok(dst)) => self.gather_items(src, shift, dst),
            _ => self.gather_items::<[u8; N]>(span.as_chunks().0, shift, dst.as_chunks_mut().0),
        }
    }

    /// [`Tensor::gather`] over typed items: `src` is the span from byte `shift` on.
    /// Large copies are split into pieces of whole rows across the worker pool.
    fn gather_items<T: Copy + Send + Sync>(&self, src: &[T], shift: usize, dst: &mut [T]) {
        let row = self.row_len();
        let _ = crate::ops::par::chunks_mut(dst, row, row, |first, piece| {
            self.gather_range(src, shift, first * row, piece);
            Ok(())
        });
    }

    /// This view's host memory as items of `T` (the dtype's size) and the index of
    /// element 0 among them, for [`Tensor::gather_elems`]; `None` when the memory is
    /// not host memory or not aligned for `T`.
    pub(crate) fn host_items<T: bytemuck::Pod>(&self) -> Option<(&[T], usize)> {
        let item = std::mem::size_of::<T>();
        debug_assert_eq!(item, self.dtype.itemsize());
        let (span, origin) = self.host_span()?;
        if origin < 0 || !(origin as usize).is_multiple_of(item) {
            return None;
        }
        let items = bytemuck::try_cast_slice::<u8, T>(&span[..span.len() / item * item]).ok()?;
        Some((items, origin as usize / item))
    }

    /// Copies the elements `first..first + dst.len()` of this view, in row-major
    /// order, into `dst`: `items` is its memory as [`Tensor::host_items`] gives it. A
    /// reduction reads a large view piece by piece this way instead of compacting all
    /// of it first.
    pub(crate) fn gather_elems<T: Copy>(&self, items: &[T], first: usize, dst: &mut [T]) {
        debug_assert!(first + dst.len() <= self.numel);
        self.gather_range(items, 0, first, dst);
    }

    /// The elements `first..first + dst.len()` (in row-major order) of
    /// [`Tensor::gather_items`]: `src` is the span from byte `shift` on.
    ///
    /// Rows whose elements lie apart (a transposed view, say) are copied in tiles of
    /// [`TILE_ROWS`] rows by [`TILE_COLS`] elements: the rows of a tile usually start
    /// next to each other, so a tile reads each cache line of its columns once instead
    /// of once per row.
    fn gather_range<T: Copy>(&self, src: &[T], shift: usize, first: usize, dst: &mut [T]) {
        if dst.is_empty() {
            return;
        }
        let item = std::mem::size_of::<T>() as isize;
        let row = self.row_len();
        let end = first + dst.len();
        let rows = first / row..end.div_ceil(row);
        // The element index of the first row's first element.
        let base = rows.start * row;
        // Whole rows waiting for their tile: (first element in `src`, offset in `dst`),
        // and the step every row of this view shares (allocated at the first).
        let mut tile: Vec<(isize, usize)> = Vec::new();
        let mut tile_step = 0isize;
        self.for_each_row(rows, |at, step, out, _| {
            let (mut at, step) = ((at - shift as isize) / item, step / item);
            // This row's part inside `first..end`.
            let row_start = base + out / item as usize;
            let (lo, hi) = (row_start.max(first), (row_start + row).min(end));
            at += (lo - row_start) as isize * step;
            let (out, n) = (lo - first, hi - lo);
            let d = &mut dst[out..out + n];
            match step {
                1 => d.copy_from_slice(&src[at as usize..at as usize + n]),
                -1 => {
                    let lo = (at + 1) as usize - n;
                    for (d, s) in d.iter_mut().zip(src[lo..lo + n].iter().rev()) {
                        *d = *s;
                    }
                }
                0 => d.fill(src[at as usize]),
                _ if n == row => {
                    tile_step = step;
                    tile.push((at, out));
                    if tile.len() == TILE_ROWS {
                        copy_tile(src, dst, &mut tile, tile_step, row);
                    }
                }
                _ => {
                    for (k, d) in d.iter_mut().enumerate() {
                        *d = src[(at + k as isize * step) as usize];
                    }
                }
            }
        });
        copy_tile(src, dst, &mut tile, tile_step, row);
    }

    /// Elements per innermost row (1 for a 0-d tensor).
    fn row_len(&self) -> usize {
        self.shape.last().map_or(1, |&n| n as usize)
    }

    /// Calls `f(at, step, out, row)` for each innermost row in `rows` (counted in
    /// row-major order) of a non-empty view: `at` is the byte index of the row's first
    /// element inside the span, `step` the bytes between its elements, `out` its byte
    /// offset in the compact order counted from the first row of `rows`, and `row` its
    /// length in bytes.
    fn for_each_row(
        &self,
        rows: std::ops::Range<usize>,
        mut f: impl FnMut(isize, isize, usize, usize),
    ) {
        let item = self.dtype.itemsize() as isize;
        let origin = self.byte_offset as isize - self.storage.span_start();
        let ndim = self.ndim();
        if ndim == 0 {
            if !rows.is_empty() {
                f(origin, item, 0, item as usize);
            }
            return;
        }
        let inner = self.shape[ndim - 1] as usize;
        // A row of one element takes no step: its stride may be any value, even one
        // that overflows when scaled to bytes.
        let step = if inner > 1 {
            self.strides[ndim - 1] as isize * item
        } else {
            item
        };
        let row = inner * item as usize;
        // The outer index of row `rows.start` (mixed radix over the outer dimensions).
        let mut index = vec![0i64; ndim - 1];
        let mut rest = rows.start as i64;
        for k in (0..ndim - 1).rev() {
            let n = self.shape[k].max(1);
            index[k] = rest % n;
            rest /= n;
        }
        let mut out = 0usize;
        for _ in rows {
            let mut at = origin;
            for (k, &i) in index.iter().enumerate() {
                at += (i * self.strides[k]) as isize * item;
            }
            f(at, step, out, row);
            out += row;
            // Odometer over the outer dimensions.
            for k in (0..ndim - 1).rev() {
                index[k] += 1;
                if index[k] < self.shape[k] {
                    break;
                }
                index[k] = 0;
            }
        }
    }

    /// The host bytes this view may touch and the byte index of element 0 inside them;
    /// `None` when the host cannot read the memory.
    pub fn host_span(&self) -> Option<(&[u8], isize)> {
        let span = self.storage.host_bytes()?;
        Some((span, self.byte_offset as isize - self.storage.span_start()))
    }

    /// Writes `bytes`, this view's elements compacted in row-major order, into this
    /// view, which must be writable host memory (an out tensor). `bytes` must not be
    /// memory this view touches.
    pub(crate) fn write_compact(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.nbytes() {
            return Err(Error::internal(format!(
                "{} bytes given for the {} {} out tensor of {} bytes",
                bytes.len(),
                self.dtype.name(),
                dims(&self.shape),
                self.nbytes()
            )));
        }
        if self.numel == 0 {
            return Ok(());
        }
        let item = self.dtype.itemsize();
        let (lo, len) = self.byte_range();
        if self.read_only {
            return Err(self.not_writable());
        }
        self.storage
            .write_span(lo, len, |dst| {
                self.for_each_row(0..self.numel / self.row_len(), |at, step, out, row| {
                    let at = at - lo as isize;
                    if step == item as isize {
                        let a = at as usize;
                        dst[a..a + row].copy_from_slice(&bytes[out..out + row]);
                    } else {
                        for (k, o) in (out..out + row).step_by(item).enumerate() {
                            let a = (at + k as isize * step) as usize;
                            dst[a..a + item].copy_from_slice(&bytes[o..o + item]);
                        }
                    }
                })
            })
            .ok_or_else(|| self.not_writable())
    }

    /// The bytes this view touches, as (start inside the span, length); (0, 0) when
    /// empty.
    pub(crate) fn byte_range(&self) -> (usize, usize) {
        if self.numel == 0 {
            return (0, 0);
        }
        let item = self.dtype.itemsize() as i128;
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        let origin = (self.byte_offset as isize - self.storage.span_start()) as i128;
        let start = origin + lo * item;
        (start as usize, ((hi - lo + 1) * item) as usize)
    }

    /// Runs `fill` on this compact view's bytes as writable memory (an out tensor).
    pub(crate) fn fill_compact(&self, fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
        debug_assert!(self.is_compact());
        let (start, len) = self.byte_range();
        if self.read_only {
            return Err(self.not_writable());
        }
        self.storage
            .write_span(start, len, fill)
            .ok_or_else(|| self.not_writable())?
    }

    fn not_writable(&self) -> Error {
        Error::value(format!(
            "the {} {} tensor is not writable host memory (read-only or on {})",
            self.dtype.name(),
            dims(&self.shape),
            self.device()
        ))
    }

    /// Whether this view and `other` may share bytes (the byte ranges they touch
    /// intersect): host memory of any kind by host address, CUDA device memory by
    /// device address on the same device.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        match (self.extent(), other.extent()) {
            (Some((xd, xs, xe)), Some((yd, ys, ye))) => xd == yd && xs < ye && ys < xe,
            _ => false,
        }
    }

    /// The addresses `[start, end)` of the bytes this view touches, with the address
    /// space they live in: the host's (`None`: every host-accessible kind of memory) or
    /// a CUDA device's. `None` when the view touches no byte.
    pub(crate) fn extent(&self) -> Option<(Option<Device>, usize, usize)> {
        let device = self.device();
        if device.host_accessible() {
            let (start, end) = self.host_extent()?;
            return Some((None, start, end));
        }
        let (offset, len) = self.byte_range();
        let start = (self.storage.data_ptr() as usize)
            .wrapping_add_signed(self.storage.span_start())
            .wrapping_add(offset);
        (len > 0).then_some((Some(device), start, start.wrapping_add(len)))
    }

    /// The host addresses `[start, end)` of the bytes this view touches; `None` when
    /// it touches none or the host cannot read its memory.
    pub(crate) fn host_extent(&self) -> Option<(usize, usize)> {
        let span = self.storage.host_bytes()?;
        let (offset, len) = self.byte_range();
        let start = span.as_ptr() as usize + offset;
        (len > 0).then_some((start, start + len))
    }

    /// Whether the view's elements lie at addresses aligned for its dtype, as the typed
    /// host kernels read and write them; true when it touches no host byte.
    pub fn is_aligned(&self) -> bool {
        self.host_extent()
            .is_none_or(|(start, _)| start.is_multiple_of(self.dtype.itemsize()))
    }

    /// Whether two indices of this view may name one element (a zero stride, or
    /// strides too small for the sizes below them); such a view cannot be an out
    /// tensor.
    pub fn may_overlap_itself(&self) -> bool {
        if self.numel <= 1 {
            return false;
        }
        let mut dims: Vec<(u64, u64)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d > 1)
            .map(|(&d, &s)| (s.unsigned_abs(), d as u64))
            .collect();
        dims.sort_unstable();
        let mut extent = 1u64;
        for (stride, size) in dims {
            if stride < extent {
                return true;
            }
            extent = stride.saturating_mul(size - 1).saturating_add(extent);
        }
        false
    }

    /// The elements as compact bytes: borrowed when the view is compact and host
    /// memory, copied otherwise.
    pub fn compact_bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        if self.is_compact()
            && self.nbytes() > 0
            && let Some(span) = self.storage.host_bytes()
        {
            let start = (self.byte_offset as isize - self.storage.span_start()) as usize;
            return Ok(std::borrow::Cow::Borrowed(
                &span[start..start + self.nbytes()],
            ));
        }
        self.to_bytes().map(std::borrow::Cow::Owned)
    }

    /// The same view with another dtype of the same item size (a kernel that wrote
    /// bools as bytes, say).
    pub fn with_dtype_of_same_size(mut self, dtype: DType) -> Tensor {
        debug_assert_eq!(dtype.itemsize(), self.dtype.itemsize());
        self.dtype = dtype;
        self
    }

    /// Another view of the same storage: `shape` and `strides` (elements) from element
    /// `origin` (counted in elements from this view's element 0). The caller keeps every
    /// element inside this view's span.
    pub(crate) fn restride(&self, shape: Vec<i64>, strides: Vec<i64>, origin: i64) -> Tensor {
        let numel = shape.iter().map(|&d| d.max(0) as usize).product();
        let byte_offset = (self.byte_offset as i64 + origin * self.dtype.itemsize() as i64) as u64;
        Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape,
            strides,
            byte_offset,
            numel,
            layout: CString::default(),
            read_only: self.read_only,
        }
    }

    /// The same view with another layout string.
    pub fn with_layout(mut self, layout: CString) -> Tensor {
        self.layout = layout;
        self
    }

    /// The same view, read-only.
    pub fn into_read_only(mut self) -> Tensor {
        self.read_only = true;
        self
    }

    /// The elements as a compact vector of bytes; `NDX_ERROR_MEMORY` naming the copy
    /// where the system refuses the memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out =
            storage::try_host_vec(self.nbytes(), 0u8).map_err(|e| self.compact_copy_error(e))?;
        self.copy_to(&mut out)?;
        Ok(out)
    }

    /// The elements compacted into a buffer of ndx's own (aligned to [`ALIGNMENT`],
    /// from the cache of freed buffers when one fits: no fresh pages to fault in).
    pub(crate) fn compact_copy(&self) -> Result<Storage> {
        let mut copy =
            Storage::owned_stale(self.nbytes()).map_err(|e| self.compact_copy_error(e))?;
        if let Some(bytes) = copy.owned_bytes_mut() {
            self.copy_to(bytes)?;
        }
        Ok(copy)
    }

    /// `e`, an allocation failure of a compact copy of this tensor, saying so.
    fn compact_copy_error(&self, e: Error) -> Error {
        Error::new(
            e.kind(),
            format!(
                "a compact copy of the {} tensor of shape {}: {}",
                self.dtype.name(),
                dims(&self.shape),
                e.message()
            ),
        )
    }

    /// A compact host copy with its own storage.
    pub fn to_compact(&self) -> Result<Tensor> {
        Tensor::new_host(self.dtype, &self.shape, self.layout.clone(), |bytes| {
            self.copy_to(bytes)
        })
    }
}

/// An ordered list of samples sharing dtype, ndim and device; shapes may differ.
#[derive(Debug)]
pub struct Batch {
    samples: Vec<Arc<Tensor>>,
}

impl Batch {
    /// A batch of at least one sample; every sample must share dtype, ndim, device
    /// (kind and id) and layout with sample 0.
    pub fn new(samples: Vec<Arc<Tensor>>) -> Result<Batch> {
        let first = samples
            .first()
            .ok_or_else(|| Error::value("a batch needs at least one sample, got 0"))?;
        for (i, s) in samples.iter().enumerate().skip(1) {
            check_same_metadata(
                i,
                (s.dtype(), s.ndim(), s.device()),
                (first.dtype(), first.ndim(), first.device()),
            )?;
            if s.layout() != first.layout() {
                return Err(Error::value(format!(
                    "samples[{i}]: layout is \"{}\", expected \"{}\" like samples[0]",
                    s.layout(),
                    first.layout()
                )));
            }
        }
        Ok(Batch { samples })
    }

    /// Number of samples (at least 1).
    pub fn len(&self) -> usize {
        self.samples.len()
    }
    /// Always false: a batch has at least one sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
    /// The samples.
    pub fn samples(&self) -> &[Arc<Tensor>] {
        &self.samples
    }
    /// Sample `i`, or an `NDX_ERROR_INDEX` error.
    pub fn sample(&self, i: usize) -> Result<&Arc<Tensor>> {
        self.samples.get(i).ok_or_else(|| {
            Error::index(format!(
                "sample index {i} is out of range for a batch of {} samples",
                self.samples.len()
            ))
        })
    }
    fn first(&self) -> &Tensor {
        &self.samples[0]
    }
    /// The samples' dtype.
    pub fn dtype(&self) -> DType {
        self.first().dtype()
    }
    /// The samples' number of dimensions.
    pub fn ndim(&self) -> usize {
        self.first().ndim()
    }
    /// The samples' device.
    pub fn device(&self) -> Device {
        self.first().device()
    }
    /// The samples' layout (empty when none).
    pub fn c_layout(&self) -> &CStr {
        self.first().c_layout()
    }
    /// The first sample whose shape differs from sample 0's, if any.
    pub fn first_nonuniform(&self) -> Option<usize> {
        let shape = self.first().shape();
        self.samples.iter().position(|s| s.shape() != shape)
    }
    /// Whether every sample has the same shape.
    pub fn is_uniform(&self) -> bool {
        self.first_nonuniform().is_none()
    }

    /// Stacks a uniform batch into one compact tensor with a leading batch dimension.
    /// Its layout is the samples' prefixed with `N` (when they have one without `N`).
    pub fn to_tensor(&self) -> Result<Tensor> {
        stack(&self.samples)
    }
}

/// Stacks `samples` (at least one, sharing sample 0's dtype and layout) into one new
/// compact host tensor with a leading dimension, whatever host-readable memory each
/// sample lives in; a set with a sample in device memory (kDLCUDA) or a ragged set
/// fails naming its first such sample. Its layout is
/// the samples' prefixed with `N` (when they have one without `N`).
pub(crate) fn stack<S: std::ops::Deref<Target = Tensor>>(samples: &[S]) -> Result<Tensor> {
    let first = samples
        .first()
        .ok_or_else(|| Error::value("a batch needs at least one sample, got 0"))?;
    // Said here, naming the sample: the copy below would fail with ndx_tensor_copy_to's
    // message, which names neither the sample nor the call.
    if let Some(s) = samples.iter().position(|s| !s.device().host_accessible()) {
        return Err(Error::value(format!(
            "cannot stack sample {s}: it lives in {} device memory, which the host cannot \
             read; stacking copies host-accessible samples (kDLCPU, kDLCUDAHost, \
             kDLCUDAManaged) into host memory: copy the samples to the host first (the \
             to_host operator)",
            samples[s].device()
        )));
    }
    if let Some(i) = samples.iter().position(|s| s.shape() != first.shape()) {
        return Err(Error::value(format!(
            "cannot stack a ragged batch: sample {i} has shape {}, sample 0 has shape {}",
            dims(samples[i].shape()),
            dims(first.shape())
        )));
    }
    debug_assert!(samples.iter().all(|s| s.dtype() == first.dtype()));
    let mut shape = vec![samples.len() as i64];
    shape.extend_from_slice(first.shape());
    check_ndim(
        &format!(
            "the stacked tensor (samples of {} dimensions)",
            first.ndim()
        ),
        &shape,
    )?;
    // Said here, naming the stack: the allocation would fail as "output: shape ...".
    if compact_nbytes(&shape, first.dtype().itemsize()).is_none() {
        return Err(Error::value(format!(
            "cannot stack {} samples of shape {} ({}): the stacked tensor of shape {} is too \
             large to address",
            samples.len(),
            dims(first.shape()),
            first.dtype().name(),
            dims(&shape)
        )));
    }
    let layout = CString::new(stacked_layout(first.layout())).unwrap_or_default();
    let per_sample = first.nbytes();
    Tensor::new_host_overwritten(first.dtype(), &shape, layout, |bytes| {
        if per_sample == 0 {
            return Ok(());
        }
        for (sample, chunk) in samples.iter().zip(bytes.chunks_mut(per_sample)) {
            sample.copy_to(chunk)?;
        }
        Ok(())
    })
}

/// The layout of samples stacked along a new leading dimension: the samples' prefixed
/// with `N`, or none when they have none or already use `N`.
pub fn stacked_layout(sample_layout: &str) -> String {
    if !sample_layout.is_empty() && !sample_layout.contains('N') {
        format!("N{sample_layout}")
    } else {
        String::new()
    }
}

/// Checks sample `i`'s (dtype, ndim, device) against sample 0's.
pub(crate) fn check_same_metadata(
    i: usize,
    (dtype, ndim, device): (DType, usize, Device),
    (dtype0, ndim0, device0): (DType, usize, Device),
) -> Result<()> {
    let mismatch = |what: &str, actual: String, expected: String| {
        Err(Error::value(format!(
            "samples[{i}]: {what} is {actual}, expected {expected} like samples[0]"
        )))
    };
    if device.kind != device0.kind {
        let name = |d: Device| dl_device_name(d.to_dl().device_type.0).to_string();
        return mismatch("device type", name(device), name(device0));
    }
    if device.id != device0.id {
        return mismatch("device id", device.id.to_string(), device0.id.to_string());
    }
    if dtype != dtype0 {
        return mismatch("dtype", dtype.name().into(), dtype0.name().into());
    }
    if ndim != ndim0 {
        return mismatch("ndim", ndim.to_string(), ndim0.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `copy_to` of strided views (transposed, flipped, sliced with steps, 3-d, rows
    /// more and fewer than a tile, lengths not multiples of a tile's width; small ones
    /// and ones large enough to be split across the pool, with pieces starting inside
    /// an outer dimension) against the elements read one by one through the strides.
    #[test]
    fn strided_copies_equal_the_elements_read_one_by_one() {
        let check = |rows: i64, cols: i64, views: &[(Vec<i64>, Vec<i64>, i64)]| {
            let base = Tensor::new_host(DType::I32, &[rows * cols], Default::default(), |b| {
                for (i, c) in b.chunks_mut(4).enumerate() {
                    c.copy_from_slice(&(i as i32).to_ne_bytes());
                }
                Ok(())
            })
            .unwrap();
            for (shape, strides, origin) in views {
                let v = base.restride(shape.clone(), strides.clone(), *origin);
                let mut got = vec![0u8; v.nbytes()];
                v.copy_to(&mut got).unwrap();
                let got: Vec<i32> = got
                    .chunks(4)
                    .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                let mut want = Vec::new();
                let mut index = vec![0i64; shape.len()];
                'all: loop {
                    let at = origin + index.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>();
                    want.push(at as i32);
                    for k in (0..shape.len()).rev() {
                        index[k] += 1;
                        if index[k] < shape[k] {
                            continue 'all;
                        }
                        index[k] = 0;
                    }
                    break;
                }
                assert_eq!(
                    got, want,
                    "shape {shape:?} strides {strides:?} from {origin}"
                );
            }
        };
        let (rows, cols) = (70i64, 90i64);
        let last = rows * cols - 1;
        // (shape, strides, origin), all inside the 70 x 90 elements.
        check(
            rows,
            cols,
            &[
                (vec![cols, rows], vec![1, cols], 0),         // transposed
                (vec![cols, rows], vec![-1, -cols], last),    // transposed, flipped
                (vec![33, 65], vec![1, cols], 0),             // a transposed corner
                (vec![45, 35], vec![2, 2 * cols], 0),         // stepped both ways
                (vec![3, 10, 7], vec![1, 3 * cols, 3], 0),    // 3-d, strided rows
                (vec![5, 31, 2], vec![cols, 1, 5 * cols], 0), // short rows
                (vec![1, 64], vec![0, cols], 0),              // one row of a tile
                (vec![67, 64], vec![1, cols], 0),             // a tile and 3 rows of 64
                (vec![67, 63], vec![1, cols], 0),             // rows of 63
                (vec![rows, 1, cols], vec![cols, 0, 1], 0),   // compact rows
            ],
        );
        // 420,000 elements: split into pieces of 109 rows of 600.
        let (rows, cols) = (600i64, 700i64);
        check(
            rows,
            cols,
            &[
                (vec![cols, rows], vec![1, cols], 0),
                (vec![7, 100, rows], vec![100, 1, cols], 0),
                (vec![300, 350], vec![2 * cols, 2], 0), // stepped rows of 350
                (vec![cols, rows], vec![-1, -cols], rows * cols - 1),
            ],
        );
    }

    #[test]
    fn geometry_rejects_negative_dims_and_null_data() {
        let e = validate_geometry("tensor", 64, &[2, -3], None, 4, 0).unwrap_err();
        assert!(e.message().contains("shape[1] is -3"), "{e}");
        let e = validate_geometry("tensor", 0, &[2, 3], None, 4, 0).unwrap_err();
        assert!(
            e.message()
                .contains("data is NULL but the tensor has 6 elements"),
            "{e}"
        );
        let g = validate_geometry("tensor", 0, &[2, 0], None, 4, 0).expect("empty may be NULL");
        assert_eq!((g.numel, g.len), (0, 0));
    }

    #[test]
    fn geometry_spans_negative_and_zero_strides() {
        // A flipped row of 4 floats whose element 0 is 12 bytes into the buffer.
        let g = validate_geometry("t", 4096, &[4], Some(&[-1]), 4, 12).expect("valid");
        assert_eq!((g.lo, g.len), (0, 16));
        // A broadcast (zero-stride) view touches one row.
        let g = validate_geometry("t", 4096, &[5, 3], Some(&[0, 1]), 4, 0).expect("valid");
        assert_eq!((g.lo, g.len), (0, 12));
    }

    #[test]
    fn geometry_detects_overflow() {
        let e = validate_geometry("t", 4096, &[i64::MAX, 2], None, 8, 0).unwrap_err();
        assert!(e.message().contains("overflows the address space"), "{e}");
        let e = validate_geometry("t", 4096, &[2], Some(&[i64::MAX / 2]), 8, 0).unwrap_err();
        assert!(e.message().contains("overflows"), "{e}");
        let e = validate_geometry("t", 16, &[2], Some(&[-8]), 4, 0).unwrap_err();
        assert!(e.message().contains("overflows"), "{e}");
        // Zero strides touch 8 bytes, but the elements do not fit compacted.
        let e = validate_geometry("t", 4096, &[1 << 61], Some(&[0]), 8, 0).unwrap_err();
        assert!(e.message().contains("too large to address"), "{e}");
        let e = validate_geometry("t", 4096, &[1 << 62, 3], Some(&[0, 0]), 1, 0).unwrap_err();
        assert!(e.message().contains("too large to address"), "{e}");
        // Empty, but the sizes before the zero overflow: said so, not "0 elements x 4
        // bytes overflows".
        let e = validate_geometry("t", 4096, &[1 << 62, 0], None, 4, 0).unwrap_err();
        assert_eq!(
            e.message(),
            "t: shape [4611686018427387904, 0] of itemsize 4 is too large to address: it \
             holds no elements, but its other sizes multiply past the address space"
        );
    }

    #[test]
    fn compact_nbytes_refuses_what_cannot_be_addressed() {
        assert_eq!(compact_nbytes(&[2, 3], 4), Some(24));
        assert_eq!(compact_nbytes(&[0, 5], 8), Some(0));
        assert_eq!(compact_nbytes(&[], 2), Some(2));
        // Elements fit in i64 but bytes pass isize::MAX.
        assert_eq!(compact_nbytes(&[1 << 61], 8), None);
        assert_eq!(compact_nbytes(&[1 << 62, 4, 1], 1), None);
        // Empty, yet its compact strides overflow.
        assert_eq!(compact_nbytes(&[0, 1 << 40, 1 << 40], 1), None);
        assert_eq!(compact_nbytes(&[-1, 3], 1), None);
    }

    #[test]
    fn layout_must_match_ndim_and_be_distinct_letters() {
        assert!(validate_layout("HWC", 3, "t").is_ok());
        let e = validate_layout("HWC", 2, "t").unwrap_err();
        assert!(
            e.message()
                .contains("has 3 letters but the tensor has ndim 2"),
            "{e}"
        );
        let e = validate_layout("HH", 2, "t").unwrap_err();
        assert!(e.message().contains("twice"), "{e}");
        let e = validate_layout("H1", 2, "t").unwrap_err();
        assert!(e.message().contains("ASCII letters"), "{e}");
    }
}
