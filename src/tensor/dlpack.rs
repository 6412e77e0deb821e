//! DLPack import (zero-copy, ownership taken only on success) and export (zero-copy,
//! the deleter keeps ndx's storage alive).
//!
//! Ownership rules, as the C API documents them:
//! - an import that fails leaves every tensor with the caller, except tensors whose
//!   DLPack major version this build does not know: the DLPack specification asks the
//!   consumer to call their deleter, so ndx does, and the error names them;
//! - a bulk import validates every sample before it takes any;
//! - the producer's deleter runs exactly once, when the last ndx reference goes.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
    DLPackVersion, DLTensor,
};

use super::{
    Batch, DType, Device, Geometry, ImportOptions, MAX_NDIM, Storage, Tensor, check_same_metadata,
    describe_dl_dtype, validate_geometry, validate_layout,
};
use crate::error::{Error, Result};

/// Validated metadata of one producer tensor, read before anything is taken.
struct Meta {
    dtype: DType,
    device: Device,
    shape: Vec<i64>,
    geometry: Geometry,
    byte_offset: u64,
    layout: CString,
}

/// Reads and validates a `DLTensor`; `what` names it in errors.
///
/// # Safety
/// `dl.shape` and `dl.strides`, when non-NULL, must point to `dl.ndim` readable values
/// (checked against `MAX_NDIM` first, so a garbage ndim is refused before any read).
unsafe fn inspect(dl: &DLTensor, what: &str, opts: &ImportOptions) -> Result<Meta> {
    if dl.ndim < 0 || dl.ndim > MAX_NDIM {
        return Err(Error::value(format!(
            "{what}: ndim is {}, expected 0 to {MAX_NDIM}",
            dl.ndim
        )));
    }
    let ndim = dl.ndim as usize;
    let dtype = DType::from_dl(dl.dtype).ok_or_else(|| {
        Error::type_error(format!(
            "{what}: dtype {} is not supported; ndx supports bool, int8/16/32/64, uint8/16/32/64, float16, bfloat16, float32 and float64 with 1 lane",
            describe_dl_dtype(dl.dtype)
        ))
    })?;
    let device = Device::from_dl(dl.device, what)?;
    // `slice::from_raw_parts` needs aligned arrays (debug builds abort otherwise).
    for (p, name) in [(dl.shape, "shape"), (dl.strides, "strides")] {
        if ndim > 0 && !p.is_null() && !p.is_aligned() {
            return Err(Error::value(format!(
                "{what}: {name} ({p:p}) is not aligned to 8 bytes"
            )));
        }
    }
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else if dl.shape.is_null() {
        return Err(Error::value(format!(
            "{what}: shape is NULL but ndim is {ndim}"
        )));
    } else {
        // SAFETY: the producer promises `ndim` shape entries; ndim is in range and the
        // array aligned.
        unsafe { std::slice::from_raw_parts(dl.shape, ndim) }.to_vec()
    };
    let strides: Option<Vec<i64>> = if ndim == 0 || dl.strides.is_null() {
        None
    } else {
        // SAFETY: as for shape.
        Some(unsafe { std::slice::from_raw_parts(dl.strides, ndim) }.to_vec())
    };
    let geometry = validate_geometry(
        what,
        dl.data as usize,
        &shape,
        strides.as_deref(),
        dtype.itemsize(),
        dl.byte_offset,
    )?;
    let layout = validate_layout(opts.layout.as_deref().unwrap_or(""), ndim, what)?;
    Ok(Meta {
        dtype,
        device,
        shape,
        geometry,
        byte_offset: dl.byte_offset,
        layout,
    })
}

fn tensor_from_meta(storage: Storage, meta: Meta, read_only: bool) -> Tensor {
    Tensor::from_parts(
        Arc::new(storage),
        meta.dtype,
        meta.shape,
        meta.geometry,
        meta.byte_offset,
        meta.layout,
        read_only,
    )
}

fn unknown_major(version: DLPackVersion) -> bool {
    version.major != DLPACK_MAJOR_VERSION
}

/// Releases `managed` through its deleter and fails when its DLPack major version is
/// not one this build reads, as the DLPack specification requires. Entry points call
/// this before checking anything else, so such a tensor is released whatever else is
/// wrong with the call. NULL passes.
///
/// # Safety
/// `managed` must be NULL or a valid producer tensor the caller owns.
pub unsafe fn release_if_unknown_version(managed: *mut DLManagedTensorVersioned) -> Result<()> {
    if managed.is_null() {
        return Ok(());
    }
    // SAFETY: non-NULL and owned by the caller; the version field is readable in
    // every major version.
    let version = unsafe { (*managed).version };
    if unknown_major(version) {
        // SAFETY: the specification's one allowed access to an unknown major version.
        unsafe { release_versioned(managed) };
        return Err(Error::value(format!(
            "tensor: DLPack major version {} is not supported (this build reads {DLPACK_MAJOR_VERSION}); its deleter has been called, as the DLPack specification requires",
            version.major
        )));
    }
    Ok(())
}

/// Names the import in a CUDA ordering failure ("tensor (kDLCUDA:0): ...").
fn in_import(what: &str, e: Error) -> Error {
    Error::new(e.kind(), format!("{what}: {}", e.message()))
}

/// Imports one versioned tensor.
///
/// # Safety
/// `managed` must be NULL or a valid producer tensor the caller owns.
pub unsafe fn import_versioned(
    managed: *mut DLManagedTensorVersioned,
    opts: &ImportOptions,
) -> Result<Tensor> {
    if managed.is_null() {
        return Err(Error::value("argument 'tensor' is NULL"));
    }
    // SAFETY: as the caller promises.
    unsafe { release_if_unknown_version(managed) }?;
    // SAFETY: a known version, so the layout is ours; the caller owns it.
    let m = unsafe { &*managed };
    // SAFETY: shape/strides per the producer's contract.
    let meta = unsafe { inspect(&m.dl_tensor, "tensor", opts) }?;
    let ready = crate::cuda::order_after_producer(meta.device, opts.stream)
        .map_err(|e| in_import("tensor", e))?;
    let read_only = m.flags.contains(DlpackFlags::READ_ONLY);
    let is_copied = m.flags.contains(DlpackFlags::IS_COPIED);
    // SAFETY: validated; ownership passes to the storage now that nothing can fail.
    let storage = unsafe {
        Storage::from_versioned(
            managed,
            meta.geometry.lo,
            meta.geometry.len,
            meta.device,
            read_only,
            is_copied,
        )
    };
    storage.set_ready_event(ready);
    Ok(tensor_from_meta(storage, meta, opts.read_only))
}

/// Imports one legacy tensor.
///
/// # Safety
/// `managed` must be NULL or a valid producer tensor the caller owns.
pub unsafe fn import_legacy(managed: *mut DLManagedTensor, opts: &ImportOptions) -> Result<Tensor> {
    if managed.is_null() {
        return Err(Error::value("argument 'tensor' is NULL"));
    }
    // SAFETY: non-NULL and owned by the caller.
    let m = unsafe { &*managed };
    // SAFETY: shape/strides per the producer's contract.
    let meta = unsafe { inspect(&m.dl_tensor, "tensor", opts) }?;
    let ready = crate::cuda::order_after_producer(meta.device, opts.stream)
        .map_err(|e| in_import("tensor", e))?;
    // SAFETY: validated; ownership passes to the storage now that nothing can fail.
    let storage = unsafe {
        Storage::from_legacy(
            managed,
            meta.geometry.lo,
            meta.geometry.len,
            meta.device,
            false,
        )
    };
    storage.set_ready_event(ready);
    Ok(tensor_from_meta(storage, meta, opts.read_only))
}

/// Validates a bulk import's samples against each other, before any is taken.
fn check_agreement(metas: &[Meta]) -> Result<()> {
    let first = &metas[0];
    for (i, m) in metas.iter().enumerate().skip(1) {
        check_same_metadata(
            i,
            (m.dtype, m.shape.len(), m.device),
            (first.dtype, first.shape.len(), first.device),
        )
        .map_err(|e| Error::value(e.message().replacen("samples[", "tensors[", 2)))?;
    }
    Ok(())
}

fn check_bulk_args<T>(tensors: *const *mut T, n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::value(
            "argument 'n' is 0: a batch needs at least one sample",
        ));
    }
    if tensors.is_null() {
        return Err(Error::value(format!(
            "argument 'tensors' is NULL (n = {n})"
        )));
    }
    check_array(tensors, n)
}

/// What `std::slice::from_raw_parts` requires of the caller's non-NULL array of `n`
/// pointers (debug builds abort otherwise): a byte size within `isize::MAX`, and
/// alignment.
fn check_array<T>(tensors: *const *mut T, n: usize) -> Result<()> {
    let item = std::mem::size_of::<*mut T>();
    if n.checked_mul(item).is_none_or(|b| b > isize::MAX as usize) {
        return Err(Error::value(format!(
            "argument 'n' is {n}: {n} pointers exceed the address space"
        )));
    }
    if !tensors.is_aligned() {
        return Err(Error::value(format!(
            "argument 'tensors' ({tensors:p}) is not aligned to {item} bytes"
        )));
    }
    Ok(())
}

/// Refuses a bulk import that lists the same tensor twice (its deleter would run
/// twice): names the first such pair of indices. O(n log n), in a buffer each thread
/// keeps: an allocation per import, freed at once, made glibc trim and refault its
/// heap, which cost a 1024-sample import a fifth of its time.
fn check_distinct<T>(ptrs: &[*mut T]) -> Result<()> {
    thread_local! {
        static SORTED: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let repeated = SORTED.with_borrow_mut(|sorted| {
        sorted.clear();
        sorted.extend(ptrs.iter().filter(|p| !p.is_null()).map(|&p| p as usize));
        sorted.sort_unstable();
        let repeated = sorted.windows(2).any(|w| w[0] == w[1]);
        if sorted.capacity() > 1 << 16 {
            *sorted = Vec::new(); // a huge import does not pin its buffer
        }
        repeated
    });
    if !repeated {
        return Ok(());
    }
    // The failure path: each repeated pointer's first two indices; the lowest pair.
    let mut first = std::collections::HashMap::new();
    let mut pairs = Vec::new();
    for (j, &p) in ptrs.iter().enumerate().filter(|(_, p)| !p.is_null()) {
        match first.entry(p as usize) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((j, false));
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let (i, paired) = o.get_mut();
                if !*paired {
                    *paired = true;
                    pairs.push((*i, j));
                }
            }
        }
    }
    let (i, j) = pairs.into_iter().min().unwrap_or((0, 0));
    Err(Error::value(format!(
        "tensors[{i}] and tensors[{j}] are the same tensor ({:#x}): each sample must be a \
         distinct DLPack tensor (ndx calls each deleter once); nothing was imported, no \
         deleter was called and every tensor still belongs to the caller",
        ptrs[i] as usize
    )))
}

fn null_sample(i: usize, n: usize) -> Error {
    Error::value(format!(
        "tensors[{i}] is NULL (n = {n}); nothing was imported and every tensor still belongs to the caller"
    ))
}

fn keep_ownership_note(e: Error) -> Error {
    Error::value(format!(
        "{}; nothing was imported and every tensor still belongs to the caller",
        e.message()
    ))
    .with_kind_of(&e)
}

impl Error {
    /// The same message with `other`'s kind (validation errors keep their kind).
    fn with_kind_of(self, other: &Error) -> Error {
        Error::new(other.kind(), self.message())
    }
}

/// Releases every sample whose DLPack major version this build does not read (the
/// specification requires it) and fails naming them; every other sample stays with
/// the caller. Entry points call this before checking anything else. A NULL array or
/// `n == 0` passes (the import reports those). The same tensor listed twice is refused
/// first, before any deleter runs.
///
/// # Safety
/// `tensors` must be NULL or point to `n` entries, each NULL or a valid producer
/// tensor the caller owns.
pub unsafe fn release_unknown_versions(
    tensors: *const *mut DLManagedTensorVersioned,
    n: usize,
) -> Result<()> {
    if tensors.is_null() || n == 0 {
        return Ok(());
    }
    check_array(tensors, n)?;
    // SAFETY: the caller promises `n` entries.
    let ptrs = unsafe { std::slice::from_raw_parts(tensors, n) };
    check_distinct(ptrs)?;
    let mut unknown = Vec::new();
    for (i, &p) in ptrs.iter().enumerate() {
        // SAFETY: non-NULL entries are valid producer tensors; version is readable.
        if !p.is_null() && unknown_major(unsafe { (*p).version }) {
            // SAFETY: as above.
            unknown.push((i, unsafe { (*p).version.major }));
        }
    }
    if !unknown.is_empty() {
        for &(i, _) in &unknown {
            // SAFETY: the specification's one allowed access to an unknown version.
            unsafe { release_versioned(ptrs[i]) };
        }
        let list: Vec<String> = unknown
            .iter()
            .map(|(i, major)| format!("tensors[{i}] (major {major})"))
            .collect();
        return Err(Error::value(format!(
            "DLPack major version not supported (this build reads {DLPACK_MAJOR_VERSION}): {}; their deleters have been called, as the DLPack specification requires; every other tensor still belongs to the caller",
            list.join(", ")
        )));
    }
    Ok(())
}

/// Imports `n` versioned tensors as one batch.
///
/// # Safety
/// As for [`release_unknown_versions`].
pub unsafe fn import_batch_versioned(
    tensors: *const *mut DLManagedTensorVersioned,
    n: usize,
    opts: &ImportOptions,
) -> Result<Batch> {
    check_bulk_args(tensors, n)?;
    // Pass 1: versions (released as the spec requires).
    // SAFETY: as the caller promises.
    unsafe { release_unknown_versions(tensors, n) }?;
    // SAFETY: the caller promises `n` entries.
    let ptrs = unsafe { std::slice::from_raw_parts(tensors, n) };
    // Pass 2: every sample's metadata, then their agreement.
    let mut metas = Vec::with_capacity(n);
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            return Err(null_sample(i, n));
        }
        // SAFETY: non-NULL, known version, owned by the caller.
        let dl = unsafe { &(*p).dl_tensor };
        // SAFETY: shape/strides per the producer's contract.
        metas.push(
            unsafe { inspect(dl, &format!("tensors[{i}]"), opts) }.map_err(keep_ownership_note)?,
        );
    }
    check_agreement(&metas).map_err(keep_ownership_note)?;
    let ready = crate::cuda::order_after_producer(metas[0].device, opts.stream)
        .map_err(|e| keep_ownership_note(in_import("tensors", e)))?;
    // Pass 3: nothing can fail any more; take them all.
    let samples = ptrs
        .iter()
        .zip(metas)
        .map(|(&p, meta)| {
            // SAFETY: validated above; owned by the caller until now.
            let flags = unsafe { (*p).flags };
            let read_only = flags.contains(DlpackFlags::READ_ONLY);
            let is_copied = flags.contains(DlpackFlags::IS_COPIED);
            // SAFETY: validated; ownership passes to the storage.
            let storage = unsafe {
                Storage::from_versioned(
                    p,
                    meta.geometry.lo,
                    meta.geometry.len,
                    meta.device,
                    read_only,
                    is_copied,
                )
            };
            storage.set_ready_event(ready.clone());
            Arc::new(tensor_from_meta(storage, meta, opts.read_only))
        })
        .collect();
    Batch::new(samples)
}

/// Imports `n` legacy tensors as one batch.
///
/// # Safety
/// As for [`import_batch_versioned`].
pub unsafe fn import_batch_legacy(
    tensors: *const *mut DLManagedTensor,
    n: usize,
    opts: &ImportOptions,
) -> Result<Batch> {
    check_bulk_args(tensors, n)?;
    // SAFETY: the caller promises `n` entries.
    let ptrs = unsafe { std::slice::from_raw_parts(tensors, n) };
    check_distinct(ptrs)?;
    let mut metas = Vec::with_capacity(n);
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            return Err(null_sample(i, n));
        }
        // SAFETY: non-NULL, owned by the caller.
        let dl = unsafe { &(*p).dl_tensor };
        // SAFETY: shape/strides per the producer's contract.
        metas.push(
            unsafe { inspect(dl, &format!("tensors[{i}]"), opts) }.map_err(keep_ownership_note)?,
        );
    }
    check_agreement(&metas).map_err(keep_ownership_note)?;
    let ready = crate::cuda::order_after_producer(metas[0].device, opts.stream)
        .map_err(|e| keep_ownership_note(in_import("tensors", e)))?;
    let samples = ptrs
        .iter()
        .zip(metas)
        .map(|(&p, meta)| {
            // SAFETY: validated; ownership passes to the storage.
            let storage = unsafe {
                Storage::from_legacy(p, meta.geometry.lo, meta.geometry.len, meta.device, false)
            };
            storage.set_ready_event(ready.clone());
            Arc::new(tensor_from_meta(storage, meta, opts.read_only))
        })
        .collect();
    Batch::new(samples)
}

/// Calls a versioned tensor's deleter (if any).
///
/// # Safety
/// `managed` must be a producer tensor the caller owns; it is gone afterwards.
unsafe fn release_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: `deleter` sits at the same offset in every major version.
    if let Some(deleter) = unsafe { (*managed).deleter } {
        // SAFETY: the producer's deleter, called once.
        unsafe { deleter(managed) }
    }
}

/// An exported versioned tensor: the DLPack struct first, then what it points into.
#[repr(C)]
struct ExportedVersioned {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
    tensor: Arc<Tensor>,
    /// The consumer's stream (a raw `CUstream`, or `STREAM_NO_SYNC`).
    consumer_stream: usize,
}

/// An exported legacy tensor.
#[repr(C)]
struct ExportedLegacy {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    tensor: Arc<Tensor>,
    /// As for [`ExportedVersioned`].
    consumer_stream: usize,
}

/// What the deleter of an export does before ndx lets go of the tensor: CUDA memory
/// that the consumer used on `stream` may still be read by its queued work, so an
/// event recorded there now goes with the storage, and the memory is reused only
/// after it (see `crate::cuda::after_consumer`).
fn release_export(tensor: &Tensor, stream: usize) {
    let storage = tensor.storage();
    if let Some(event) = crate::cuda::after_consumer(storage.device(), stream) {
        storage.add_consumer_event(stream, event);
    }
}

fn dl_view(t: &Tensor, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    DLTensor {
        data: t.storage().data_ptr().cast::<c_void>(),
        device: t.device().to_dl(),
        ndim: t.ndim() as i32,
        dtype: t.dtype().to_dl(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: t.byte_offset(),
    }
}

/// Exports `tensor` as a versioned DLPack tensor (zero-copy) to a consumer working on
/// `consumer_stream` (a raw `CUstream`, 0 the legacy default stream, or
/// `STREAM_NO_SYNC`). The consumer must call its deleter exactly once; until then ndx
/// keeps the storage alive, and CUDA memory is reused only after the consumer's work
/// enqueued on that stream before the deleter ran.
pub fn export_versioned(
    tensor: Arc<Tensor>,
    consumer_stream: usize,
) -> *mut DLManagedTensorVersioned {
    let mut flags = DlpackFlags::empty();
    flags.set(DlpackFlags::READ_ONLY, tensor.read_only());
    flags.set(DlpackFlags::IS_COPIED, tensor.storage().is_copied());
    let mut shape = tensor.shape().to_vec();
    let mut strides = tensor.strides().to_vec();
    let dl_tensor = dl_view(&tensor, &mut shape, &mut strides);
    let exported = Box::new(ExportedVersioned {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR_VERSION,
                minor: DLPACK_MINOR_VERSION,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        },
        shape,
        strides,
        tensor,
        consumer_stream,
    });
    let raw = Box::into_raw(exported);
    // SAFETY: `raw` is a fresh, valid box; `managed` is its first field (repr(C)).
    unsafe {
        (*raw).managed.manager_ctx = raw.cast();
        &raw mut (*raw).managed
    }
}

/// Exports `tensor` as a legacy DLPack tensor; read-only tensors are refused because
/// the legacy form cannot say so. `consumer_stream` as for [`export_versioned`].
pub fn export_legacy(tensor: Arc<Tensor>, consumer_stream: usize) -> Result<*mut DLManagedTensor> {
    if tensor.read_only() {
        return Err(Error::value(
            "the tensor is read-only and the legacy DLManagedTensor has no read-only flag; export it with ndx_tensor_to_dlpack_versioned",
        ));
    }
    let mut shape = tensor.shape().to_vec();
    let mut strides = tensor.strides().to_vec();
    let dl_tensor = dl_view(&tensor, &mut shape, &mut strides);
    let exported = Box::new(ExportedLegacy {
        managed: DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape,
        strides,
        tensor,
        consumer_stream,
    });
    let raw = Box::into_raw(exported);
    // SAFETY: `raw` is a fresh, valid box; `managed` is its first field (repr(C)).
    unsafe {
        (*raw).managed.manager_ctx = raw.cast();
        Ok(&raw mut (*raw).managed)
    }
}

/// The deleter of versioned exports. Called by the consumer, once.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `manager_ctx` is the box made by `export_versioned`; the consumer calls
    // the deleter once, so the box is released once.
    let exported = unsafe { Box::from_raw((*managed).manager_ctx.cast::<ExportedVersioned>()) };
    release_export(&exported.tensor, exported.consumer_stream);
    drop(exported);
}

/// The deleter of legacy exports. Called by the consumer, once.
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as for `delete_versioned`.
    let exported = unsafe { Box::from_raw((*managed).manager_ctx.cast::<ExportedLegacy>()) };
    release_export(&exported.tensor, exported.consumer_stream);
    drop(exported);
}
