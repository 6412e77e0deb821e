//! Tensors and batches: DLPack import/export, host memory, accessors.
//!
//! Ownership: an import takes ownership of the producer's tensor only when it
//! succeeds (see `ndx_tensor_from_dlpack_versioned` for the one exception the DLPack
//! specification imposes). Handles are reference counted; every handle returned is a
//! new reference the caller releases. Tensors are immutable and thread-safe.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use dlpark::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned};

use super::handle::{borrow, clone_arc, into_handle, release};
use super::{
    boundary, boundary_out, boundary_value, clear_out, host_str, ndx_batch_t, ndx_error_t,
    ndx_tensor_t, out_param,
};
use crate::debug::explain::Flush;
use crate::error::{Error, Result};
use crate::exec::{BatchRef, TensorRef};
use crate::tensor::{
    DType, Geometry, ImportOptions, MAX_NDIM, Storage, Tensor, dlpack, validate_geometry,
    validate_layout,
};

/// Element types. Values are never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_dtype_t {
    /// One byte per element, 0 or 1.
    NDX_DTYPE_BOOL = 1,
    /// Signed 8-bit integer.
    NDX_DTYPE_INT8 = 2,
    /// Signed 16-bit integer.
    NDX_DTYPE_INT16 = 3,
    /// Signed 32-bit integer.
    NDX_DTYPE_INT32 = 4,
    /// Signed 64-bit integer.
    NDX_DTYPE_INT64 = 5,
    /// Unsigned 8-bit integer.
    NDX_DTYPE_UINT8 = 6,
    /// Unsigned 16-bit integer.
    NDX_DTYPE_UINT16 = 7,
    /// Unsigned 32-bit integer.
    NDX_DTYPE_UINT32 = 8,
    /// Unsigned 64-bit integer.
    NDX_DTYPE_UINT64 = 9,
    /// IEEE 754 half precision.
    NDX_DTYPE_FLOAT16 = 10,
    /// bfloat16.
    NDX_DTYPE_BFLOAT16 = 11,
    /// IEEE 754 single precision.
    NDX_DTYPE_FLOAT32 = 12,
    /// IEEE 754 double precision.
    NDX_DTYPE_FLOAT64 = 13,
}

/// Options for every import. Set `struct_size = sizeof(ndx_import_options_t)`;
/// fields may be appended in later versions. NULL options mean all defaults.
#[repr(C)]
pub struct ndx_import_options_t {
    /// Set by the caller to `sizeof(ndx_import_options_t)`.
    pub struct_size: usize,
    /// Layout string such as "HWC" (one distinct ASCII letter per dimension), or NULL
    /// for none. Copied.
    pub layout: *const c_char,
    /// Makes the imported tensors read-only (in addition to DLPack's READ_ONLY flag).
    pub read_only: bool,
    /// For CUDA memory (kDLCUDA, kDLCUDAManaged): the `CUstream` on which the
    /// producer's writes to it are ordered. ndx records an event there and orders its
    /// own work after it (no device-wide synchronisation); kDLCUDAManaged memory, which
    /// the host reads directly, is read by host work (CPU operators, `to_device`,
    /// `ndx_tensor_copy_to`) once that event has completed. NULL is the legacy default
    /// stream (CUDA's stream 0), also what callers of an older, shorter struct get;
    /// `NDX_STREAM_NO_SYNC` means the memory is ready as is. Ignored for host memory
    /// and where no CUDA driver is present (nothing can be pending then). Translating
    /// Python's `__dlpack__(stream=...)` integers into a `CUstream` is the binding's job.
    pub stream: *mut c_void,
}

impl super::Options for ndx_import_options_t {
    fn zeroed() -> Self {
        ndx_import_options_t {
            struct_size: 0,
            layout: std::ptr::null(),
            read_only: false,
            stream: std::ptr::null_mut(),
        }
    }
}

/// Called once with `(data, user)` when the last reference to a tensor made by
/// `ndx_tensor_wrap_host` goes away, on whichever thread releases it.
pub type ndx_host_deleter_t = Option<unsafe extern "C" fn(data: *mut c_void, user: *mut c_void)>;

fn import_options(opts: *const ndx_import_options_t) -> Result<ImportOptions> {
    if opts.is_null() {
        return Ok(ImportOptions::default());
    }
    let o = super::read_options(opts, std::mem::offset_of!(ndx_import_options_t, stream))?;
    let layout = if o.layout.is_null() {
        None
    } else {
        Some(host_str(o.layout, "opts->layout")?)
    };
    Ok(ImportOptions {
        layout,
        read_only: o.read_only,
        stream: o.stream as usize,
    })
}

fn dtype_arg(dtype: i32) -> Result<DType> {
    DType::from_raw(dtype).ok_or_else(|| {
        Error::value(format!(
            "argument 'dtype' is {dtype}, not an ndx_dtype_t value (expected 1 to {})",
            DType::ALL.len()
        ))
    })
}

/// The most dimensions a tensor has (NumPy 2's limit). The DLPack imports,
/// `ndx_tensor_from_host` and `ndx_tensor_wrap_host` refuse more,
/// `ndx_invoke` refuses an invocation whose output would have more (an `expand_dims`
/// or `reshape` too far) and `ndx_batch_to_tensor` a stack of samples with as many:
/// each with `NDX_ERROR_VALUE`. So every tensor ndx makes can be exported and
/// imported again.
pub const NDX_MAX_NDIM: i32 = 64;
const _: () = assert!(NDX_MAX_NDIM == MAX_NDIM);

/// Reads a C description of host memory: dtype, shape and optional strides.
fn host_view(
    data: *const c_void,
    dtype: i32,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
) -> Result<(DType, Vec<i64>, Geometry)> {
    let dtype = dtype_arg(dtype)?;
    if !(0..=MAX_NDIM).contains(&ndim) {
        return Err(Error::value(format!(
            "argument 'ndim' is {ndim}, expected 0 to {MAX_NDIM}"
        )));
    }
    let n = ndim as usize;
    if n > 0 && shape.is_null() {
        return Err(Error::value(format!(
            "argument 'shape' is NULL but ndim is {ndim}"
        )));
    }
    for (p, name) in [(shape, "shape"), (strides, "strides")] {
        if n > 0 && !p.is_null() && !p.is_aligned() {
            return Err(Error::value(format!(
                "argument '{name}' ({p:p}) is not aligned to 8 bytes"
            )));
        }
    }
    let shape = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: non-NULL; the caller promises `ndim` entries.
        unsafe { std::slice::from_raw_parts(shape, n) }.to_vec()
    };
    let strides = (n > 0 && !strides.is_null()).then(|| {
        // SAFETY: non-NULL; the caller promises `ndim` entries.
        unsafe { std::slice::from_raw_parts(strides, n) }.to_vec()
    });
    let geometry = validate_geometry(
        "tensor",
        data as usize,
        &shape,
        strides.as_deref(),
        dtype.itemsize(),
        0,
    )?;
    Ok((dtype, shape, geometry))
}

/// Imports a versioned DLPack tensor (DLPack >= 1.0) without copying.
///
/// On success ndx owns `tensor` and calls its deleter exactly once, when the last
/// reference to `*out` is released (on that thread; invocations that use it hold
/// references too, and a worker finishing one may release the last just after a wait
/// returned: `ndx_context_release` waits for that). On failure the caller still owns
/// `tensor` — except when its major version is not 1: then, as the DLPack
/// specification requires, ndx calls its deleter and says so in the error.
/// The READ_ONLY flag is honoured (ndx never writes such memory) and IS_COPIED kept.
/// CPU, CUDA, CUDA-host and CUDA-managed memory are accepted as metadata, whether or
/// not a CUDA driver is present. `opts` may be NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_from_dlpack_versioned(
    tensor: *mut DLManagedTensorVersioned,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary("ndx_tensor_from_dlpack_versioned", || {
        clear_out(out, std::ptr::null_mut());
        // SAFETY: the caller passes NULL or a valid producer tensor it owns; an
        // unknown major version is released before anything else is checked.
        unsafe { dlpack::release_if_unknown_version(tensor) }?;
        out_param(out, std::ptr::null_mut(), || {
            let opts = import_options(opts)?;
            // SAFETY: the caller passes NULL or a valid producer tensor it owns.
            let t = unsafe { dlpack::import_versioned(tensor, &opts) }?;
            Ok(into_handle(Arc::new(TensorRef::ready(Arc::new(t)))))
        })
    })
}

/// Imports a legacy DLPack tensor without copying. On success ndx owns `tensor` and
/// calls its deleter exactly once; on failure the caller still owns it. `opts` may be
/// NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_from_dlpack(
    tensor: *mut DLManagedTensor,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_from_dlpack", out, std::ptr::null_mut(), || {
        let opts = import_options(opts)?;
        // SAFETY: the caller passes NULL or a valid producer tensor it owns.
        let t = unsafe { dlpack::import_legacy(tensor, &opts) }?;
        Ok(into_handle(Arc::new(TensorRef::ready(Arc::new(t)))))
    })
}

/// Imports `n >= 1` versioned DLPack tensors as one batch, without copying.
///
/// Every sample is validated before any is taken: the same pointer listed twice
/// (NDX_ERROR_VALUE naming both indices, checked first: no deleter runs), NULL entries,
/// ndim, dtype, device, shape, strides and byte_offset of each, then that all share
/// device type, device id, dtype and ndim with `tensors[0]`. On failure the error
/// names the sample index with the expected and actual values, and the caller still
/// owns every tensor — except samples with a major version other than 1, whose
/// deleters ndx calls (the DLPack specification requires it; versions are checked for
/// every sample first and the error lists them). On success ndx owns all `n` tensors.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_from_dlpack_versioned(
    tensors: *const *mut DLManagedTensorVersioned,
    n: usize,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_batch_t,
) -> *mut ndx_error_t {
    boundary("ndx_batch_from_dlpack_versioned", || {
        clear_out(out, std::ptr::null_mut());
        // SAFETY: the caller passes `n` entries, each NULL or a producer tensor it
        // owns; unknown major versions are released before anything else is checked.
        unsafe { dlpack::release_unknown_versions(tensors, n) }?;
        out_param(out, std::ptr::null_mut(), || {
            let opts = import_options(opts)?;
            // SAFETY: the caller passes `n` entries, each NULL or a producer tensor it owns.
            let b = unsafe { dlpack::import_batch_versioned(tensors, n, &opts) }?;
            Ok(into_handle(Arc::new(BatchRef::ready(Arc::new(b)))))
        })
    })
}

/// Imports `n >= 1` legacy DLPack tensors as one batch, without copying. Validation
/// and ownership as for `ndx_batch_from_dlpack_versioned` (legacy tensors have no
/// version to check). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_from_dlpack(
    tensors: *const *mut DLManagedTensor,
    n: usize,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_batch_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_batch_from_dlpack", out, std::ptr::null_mut(), || {
        let opts = import_options(opts)?;
        // SAFETY: the caller passes `n` entries, each NULL or a producer tensor it owns.
        let b = unsafe { dlpack::import_batch_legacy(tensors, n, &opts) }?;
        Ok(into_handle(Arc::new(BatchRef::ready(Arc::new(b)))))
    })
}

/// A new compact host tensor holding a copy of `data`: `ndim` (0 to `NDX_MAX_NDIM`)
/// dimensions of `shape`, with `strides` in elements (NULL for compact; negative and
/// zero strides allowed). `data` points at element [0, ..., 0], as DLPack's
/// `data + byte_offset` does, not at the lowest address: with a negative stride the
/// elements along that axis lie before it (for `{1, 2, 3, 4}` read backwards, pass
/// shape `{4}`, strides `{-1}` and the address of the 4). `data` may be NULL only
/// when the tensor has no elements. The caller keeps `data`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_from_host(
    data: *const c_void,
    dtype: i32,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_from_host", out, std::ptr::null_mut(), || {
        let opts = import_options(opts)?;
        let (dtype, shape, geometry) = host_view(data, dtype, ndim, shape, strides)?;
        let layout = validate_layout(opts.layout.as_deref().unwrap_or(""), shape.len(), "tensor")?;
        // SAFETY: a borrowed view (no deleter) of the caller's memory, read only
        // during this call; the geometry bounds every read.
        let view_storage = unsafe {
            Storage::from_host(
                data.cast_mut(),
                geometry.lo,
                geometry.len,
                true,
                None,
                std::ptr::null_mut(),
            )
        };
        let view = Tensor::from_parts(
            Arc::new(view_storage),
            dtype,
            shape.clone(),
            geometry,
            0,
            layout.clone(),
            true,
        );
        let copy = Tensor::new_host_copy(dtype, &shape, layout, |bytes| view.copy_to(bytes))?;
        let copy = if opts.read_only {
            copy.into_read_only()
        } else {
            copy
        };
        Ok(into_handle(Arc::new(TensorRef::ready(Arc::new(copy)))))
    })
}

/// A tensor over the caller's host memory, without copying: `data`, `dtype`, `ndim`,
/// `shape` and `strides` as for `ndx_tensor_from_host` (`data` points at element
/// [0, ..., 0]; every element the strides reach must lie in the caller's memory). On
/// success ndx calls `deleter(data, user)` (if not NULL) exactly once, when the last
/// reference goes, on the thread that releases it (as for
/// `ndx_tensor_from_dlpack_versioned`); on failure it is not called and the caller
/// keeps `data`. ndx writes into wrapped memory only when it is passed as an out
/// tensor (`ndx_output_t`); the caller must not write into it while work that reads
/// it is pending. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_wrap_host(
    data: *mut c_void,
    dtype: i32,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
    deleter: ndx_host_deleter_t,
    user: *mut c_void,
    opts: *const ndx_import_options_t,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_wrap_host", out, std::ptr::null_mut(), || {
        let opts = import_options(opts)?;
        let (dtype, shape, geometry) = host_view(data, dtype, ndim, shape, strides)?;
        let layout = validate_layout(opts.layout.as_deref().unwrap_or(""), shape.len(), "tensor")?;
        // SAFETY: validated; the caller lends the memory until the deleter runs.
        let storage = unsafe {
            Storage::from_host(
                data,
                geometry.lo,
                geometry.len,
                opts.read_only,
                deleter,
                user,
            )
        };
        let t = Tensor::from_parts(
            Arc::new(storage),
            dtype,
            shape,
            geometry,
            0,
            layout,
            opts.read_only,
        );
        Ok(into_handle(Arc::new(TensorRef::ready(Arc::new(t)))))
    })
}

/// Copies the tensor's elements, compacted in row-major order, into `buf` (`cap`
/// bytes). Fails with NDX_ERROR_VALUE when `cap` is smaller than the tensor's byte
/// size (`ndx_tensor_nbytes`), the memory is not host-accessible (kDLCUDA), or `buf`
/// overlaps the bytes the tensor reads. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_copy_to(
    tensor: *const ndx_tensor_t,
    buf: *mut c_void,
    cap: usize,
) -> *mut ndx_error_t {
    boundary("ndx_tensor_copy_to", || {
        let t = borrow(tensor, "tensor")?.resolve()?;
        if buf.is_null() && t.nbytes() > 0 {
            return Err(Error::value("argument 'buf' is NULL"));
        }
        // Never more than the tensor's bytes: a `cap` of SIZE_MAX ("enough") must not
        // reach `from_raw_parts_mut`, whose precondition (at most isize::MAX bytes)
        // aborts in debug builds.
        let cap = cap.min(t.nbytes());
        // The copy reads the tensor's bytes while it writes `buf`: the two must not
        // share a byte (a transposed view copied onto its own memory read what it had
        // just overwritten).
        if cap > 0
            && let Some((start, end)) = t.host_extent()
            && (buf as usize) < end
            && start < (buf as usize).saturating_add(cap)
        {
            return Err(Error::value(format!(
                "argument 'buf' ({buf:p}, {cap} bytes) overlaps the tensor's memory \
                 ({start:#x} to {end:#x}); ndx_tensor_copy_to needs a buffer of its own"
            )));
        }
        let dst: &mut [u8] = if cap == 0 || buf.is_null() {
            &mut []
        } else {
            // SAFETY: the caller gives `cap` writable bytes at `buf` (or more).
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) }
        };
        t.copy_to(dst)
    })
}

/// Exports the tensor as a versioned DLPack tensor, without copying. The consumer
/// owns `*out` and must call its deleter exactly once (from any thread); until then
/// the data stays alive. READ_ONLY is set when the tensor is read-only, IS_COPIED when
/// the producer of the imported data set it. Strides are always given. For CUDA memory
/// this is `ndx_tensor_to_dlpack_versioned_stream` with the legacy default stream
/// (NULL): the consumer's work is taken to be on that stream, also when it calls the
/// deleter. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_to_dlpack_versioned(
    tensor: *const ndx_tensor_t,
    out: *mut *mut DLManagedTensorVersioned,
) -> *mut ndx_error_t {
    boundary_out(
        "ndx_tensor_to_dlpack_versioned",
        out,
        std::ptr::null_mut(),
        || export_for(tensor, 0),
    )
}

/// Like `ndx_tensor_to_dlpack_versioned`, for a consumer that will use the data on
/// `consumer_stream` (a `CUstream`; NULL is the legacy default stream): for CUDA
/// memory, that stream is made to wait (with an event, no host synchronisation) for
/// the work that produces the tensor, as DLPack's exchange protocol asks.
///
/// The deleter may be called while the consumer's work that reads the memory is
/// still queued on `consumer_stream`: it records an event on that stream (like
/// PyTorch's `record_stream`), and ndx reuses the memory for its own work only after
/// that event, without a host synchronisation (memory ndx imported is given back to
/// its producer only once that event has completed, waiting on the host when the
/// last reference goes). The stream must therefore still exist when the deleter is
/// called; if the event cannot be recorded there (the stream was destroyed, say),
/// the deleter synchronises the device's context instead, blocking until all its
/// work has completed. The per-thread default stream is the stream of the thread
/// that calls the deleter.
///
/// `NDX_STREAM_NO_SYNC` orders nothing (the consumer synchronises itself) and records
/// no event: the consumer must then call the deleter only once its work on the
/// memory has completed, or ndx may overwrite it while that work still reads it.
/// The stream is ignored for host memory and where no CUDA driver is present. On
/// failure (an invalid stream, say) nothing is exported. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_to_dlpack_versioned_stream(
    tensor: *const ndx_tensor_t,
    consumer_stream: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> *mut ndx_error_t {
    boundary_out(
        "ndx_tensor_to_dlpack_versioned_stream",
        out,
        std::ptr::null_mut(),
        || export_for(tensor, consumer_stream as usize),
    )
}

/// The tensor's data, with `stream` (a `CUstream`) ordered after its pending CUDA work.
fn resolve_for(tensor: *const ndx_tensor_t, stream: usize) -> Result<Arc<crate::tensor::Tensor>> {
    let t = borrow(tensor, "tensor")?.resolve_as(Flush::Export)?.clone();
    crate::cuda::order_consumer(t.storage().ready_event().as_ref(), stream).map_err(|e| {
        Error::new(
            e.kind(),
            format!("argument 'consumer_stream': {}", e.message()),
        )
    })?;
    Ok(t)
}

fn export_for(tensor: *const ndx_tensor_t, stream: usize) -> Result<*mut DLManagedTensorVersioned> {
    Ok(dlpack::export_versioned(
        resolve_for(tensor, stream)?,
        stream,
    ))
}

/// Exports the tensor as a legacy DLPack tensor, without copying. Fails with
/// NDX_ERROR_VALUE for a read-only tensor (the legacy form cannot say so; use
/// `ndx_tensor_to_dlpack_versioned`). For CUDA memory the legacy default stream is made
/// to wait for the work that produces the tensor, and the consumer's work is taken to
/// be on it: the deleter records an event there, after which ndx reuses the memory
/// (as for `ndx_tensor_to_dlpack_versioned_stream` with NULL). The consumer calls the
/// deleter exactly once. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_to_dlpack(
    tensor: *const ndx_tensor_t,
    out: *mut *mut DLManagedTensor,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_to_dlpack", out, std::ptr::null_mut(), || {
        dlpack::export_legacy(resolve_for(tensor, 0)?, 0)
    })
}

/// Adds a reference to `tensor`. Fails with NDX_ERROR_VALUE for NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_retain(tensor: *const ndx_tensor_t) -> *mut ndx_error_t {
    boundary("ndx_tensor_retain", || {
        std::mem::forget(clone_arc(tensor, "tensor")?);
        Ok(())
    })
}

/// Drops a reference to `tensor`; the last one frees it (and calls the producer's
/// deleter). NULL is a no-op. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_release(tensor: *const ndx_tensor_t) {
    boundary_value("ndx_tensor_release", |_| (), || release(tensor))
}

/// The element type (an `ndx_dtype_t` value).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_dtype(tensor: *const ndx_tensor_t, out: *mut i32) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_dtype", out, 0, || {
        Ok(borrow(tensor, "tensor")?.dtype()? as i32)
    })
}

/// The number of dimensions.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_ndim(tensor: *const ndx_tensor_t, out: *mut i32) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_ndim", out, 0, || {
        Ok(borrow(tensor, "tensor")?.shape()?.len() as i32)
    })
}

/// The shape: `ndim` values, borrowed from the tensor (valid while it lives). For a
/// 0-d tensor `*out` is a non-NULL pointer that must not be read.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_shape(
    tensor: *const ndx_tensor_t,
    out: *mut *const i64,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_shape", out, std::ptr::null(), || {
        Ok(borrow(tensor, "tensor")?.shape()?.as_ptr())
    })
}

/// The strides in elements: `ndim` values, borrowed from the tensor (for a 0-d
/// tensor, a non-NULL pointer that must not be read, as for `ndx_tensor_shape`).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_strides(
    tensor: *const ndx_tensor_t,
    out: *mut *const i64,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_strides", out, std::ptr::null(), || {
        Ok(borrow(tensor, "tensor")?.strides()?.as_ptr())
    })
}

/// The number of elements.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_numel(
    tensor: *const ndx_tensor_t,
    out: *mut usize,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_numel", out, 0, || {
        borrow(tensor, "tensor")?.numel()
    })
}

/// The byte size of the elements when compact (numel x itemsize): what
/// `ndx_tensor_copy_to` writes.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_nbytes(
    tensor: *const ndx_tensor_t,
    out: *mut usize,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_nbytes", out, 0, || {
        borrow(tensor, "tensor")?.nbytes()
    })
}

/// Where the data lives (DLPack device type and id).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_device(
    tensor: *const ndx_tensor_t,
    out: *mut DLDevice,
) -> *mut ndx_error_t {
    boundary_out(
        "ndx_tensor_device",
        out,
        crate::tensor::Device::CPU.to_dl(),
        || Ok(borrow(tensor, "tensor")?.device()?.to_dl()),
    )
}

/// The layout string ("" when none), borrowed from the tensor.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_layout(
    tensor: *const ndx_tensor_t,
    out: *mut *const c_char,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_layout", out, std::ptr::null(), || {
        Ok(borrow(tensor, "tensor")?.c_layout()?.as_ptr())
    })
}

/// Whether the tensor is read-only (ndx never writes it, and refuses it as an out
/// tensor; exports carry READ_ONLY).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_tensor_is_read_only(
    tensor: *const ndx_tensor_t,
    out: *mut bool,
) -> *mut ndx_error_t {
    boundary_out("ndx_tensor_is_read_only", out, false, || {
        borrow(tensor, "tensor")?.read_only()
    })
}

/// The name of a dtype ("float32", "bfloat16", ...), or NULL for a value that is not
/// an `ndx_dtype_t`. The string is static.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_dtype_name(dtype: i32) -> *const c_char {
    boundary_value(
        "ndx_dtype_name",
        |_| std::ptr::null(),
        || DType::from_raw(dtype).map_or(std::ptr::null(), |d| d.c_name().as_ptr()),
    )
}

/// Adds a reference to `batch`. Fails with NDX_ERROR_VALUE for NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_retain(batch: *const ndx_batch_t) -> *mut ndx_error_t {
    boundary("ndx_batch_retain", || {
        std::mem::forget(clone_arc(batch, "batch")?);
        Ok(())
    })
}

/// Drops a reference to `batch`; the last one frees it (samples still referenced
/// elsewhere stay alive). NULL is a no-op. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_release(batch: *const ndx_batch_t) {
    boundary_value("ndx_batch_release", |_| (), || release(batch))
}

/// The number of samples (at least 1). For a pending batch, see `ndx_batch_t`.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_size(batch: *const ndx_batch_t, out: *mut usize) -> *mut ndx_error_t {
    boundary_out("ndx_batch_size", out, 0, || borrow(batch, "batch")?.len())
}

/// Sample `index` as a new tensor reference (release it). It shares the sample's
/// memory and keeps it alive: an imported sample's deleter runs once the batch and
/// every such tensor are released. A pending batch is waited for first (failing with
/// its invocation's error when that failed); then NDX_ERROR_INDEX when `index` is out
/// of range. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_sample(
    batch: *const ndx_batch_t,
    index: usize,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_batch_sample", out, std::ptr::null_mut(), || {
        let sample = borrow(batch, "batch")?.resolve()?.sample(index)?.clone();
        Ok(into_handle(Arc::new(TensorRef::ready(sample))))
    })
}

/// Whether every sample has the same shape. For a pending batch, see `ndx_batch_t`.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_is_uniform(
    batch: *const ndx_batch_t,
    out: *mut bool,
) -> *mut ndx_error_t {
    boundary_out("ndx_batch_is_uniform", out, false, || {
        borrow(batch, "batch")?.is_uniform()
    })
}

/// The samples' element type (an `ndx_dtype_t` value). For a pending batch, see
/// `ndx_batch_t`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_dtype(batch: *const ndx_batch_t, out: *mut i32) -> *mut ndx_error_t {
    boundary_out("ndx_batch_dtype", out, 0, || {
        Ok(borrow(batch, "batch")?.dtype()? as i32)
    })
}

/// The samples' number of dimensions. For a pending batch, see `ndx_batch_t`.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_ndim(batch: *const ndx_batch_t, out: *mut i32) -> *mut ndx_error_t {
    boundary_out("ndx_batch_ndim", out, 0, || {
        Ok(borrow(batch, "batch")?.ndim()? as i32)
    })
}

/// The samples' device. For a pending batch, see `ndx_batch_t`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_device(
    batch: *const ndx_batch_t,
    out: *mut DLDevice,
) -> *mut ndx_error_t {
    boundary_out(
        "ndx_batch_device",
        out,
        crate::tensor::Device::CPU.to_dl(),
        || Ok(borrow(batch, "batch")?.device()?.to_dl()),
    )
}

/// The samples' layout ("" when none), borrowed from the batch. For a pending batch,
/// see `ndx_batch_t`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_layout(
    batch: *const ndx_batch_t,
    out: *mut *const c_char,
) -> *mut ndx_error_t {
    boundary_out("ndx_batch_layout", out, std::ptr::null(), || {
        Ok(borrow(batch, "batch")?.c_layout()?.as_ptr())
    })
}

/// Stacks a uniform batch into one new compact host tensor with a leading batch
/// dimension (layout "N" + the samples' layout, when they have one). A ragged batch
/// fails with NDX_ERROR_VALUE naming the first sample whose shape differs and both
/// shapes; so does a batch in device memory (kDLCUDA: copy it to the host first, with
/// the `to_host` operator), naming the sample and its device. 0-d samples stack into
/// a 1-d tensor of `ndx_batch_size` elements, samples with no elements into a tensor
/// with none; samples of `NDX_MAX_NDIM` dimensions fail with NDX_ERROR_VALUE (the
/// stack would have one more). The result is a writable copy that does not keep the
/// samples alive. A pending batch is waited for first (failing with its invocation's
/// error when that failed). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_batch_to_tensor(
    batch: *const ndx_batch_t,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_batch_to_tensor", out, std::ptr::null_mut(), || {
        let stacked = borrow(batch, "batch")?.resolve()?.to_tensor()?;
        Ok(into_handle(Arc::new(TensorRef::ready(Arc::new(stacked)))))
    })
}
