//! Opaque handles and how they map to Rust values.
//!
//! Data handles are `Arc`s handed to C as raw pointers: `retain` adds a reference,
//! `release` drops one, and every handle an entry point returns is a new reference.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec::{BatchRef, Context, Node, TensorRef};

/// A tensor: one n-dimensional array, or the pending output of an invocation (usable
/// as an input at once; reading its data waits for it). Reference counted, immutable,
/// thread-safe.
pub struct ndx_tensor_t {
    _private: [u8; 0],
}

/// A batch: an ordered list of samples sharing dtype, ndim and device (shapes may
/// differ), or the pending output of an invocation (usable as an input at once).
/// `ndx_batch_size` answers every pending batch without running anything (a
/// per-sample invocation makes as many samples as its input batches have). The other
/// metadata accessors (`ndx_batch_dtype`, `_ndim`, `_device`, `_layout`, `_is_uniform`)
/// answer a built-in operator's pending output without running it; a host operator's
/// output, whose metadata only running tells, they run and wait for, failing with its
/// error when it failed — as reading samples (`ndx_batch_sample`,
/// `ndx_batch_to_tensor`) of any pending batch does. Reference counted, immutable,
/// thread-safe.
pub struct ndx_batch_t {
    _private: [u8; 0],
}

/// A context: defaults for invocations (eval mode, capture policy, backend), host
/// operators, and the bookkeeping of its work. Reference counted, thread-safe: one
/// context may be used from many threads at once.
pub struct ndx_context_t {
    _private: [u8; 0],
}

/// The future of one invocation: poll it, wait on it, get a callback, read its
/// outputs. Reference counted, thread-safe.
pub struct ndx_future_t {
    _private: [u8; 0],
}

/// A C handle type backed by `Arc<Target>`.
pub(crate) trait ArcHandle {
    type Target;
    /// Whether the value can be used in this process (given as argument `arg`).
    fn usable(_value: &Self::Target, _arg: &str) -> Result<()> {
        Ok(())
    }
}

impl ArcHandle for ndx_tensor_t {
    type Target = TensorRef;
}

impl ArcHandle for ndx_batch_t {
    type Target = BatchRef;
}

/// The `Arc` counts the C references; together they are one public [`Context`]
/// reference, whose drop releases the context on the thread of the last
/// `ndx_context_release`.
impl ArcHandle for ndx_context_t {
    type Target = Context;
    /// Not one made before this process forked.
    fn usable(ctx: &Context, arg: &str) -> Result<()> {
        if ctx.stale() {
            return Err(crate::exec::fork::stale_context(arg));
        }
        Ok(())
    }
}

impl ArcHandle for ndx_future_t {
    type Target = Node;
    /// Not one that had not completed when this process forked: it reads as failed.
    fn usable(node: &Node, _arg: &str) -> Result<()> {
        if node.lost_in_fork() {
            return Err(node.lost_error());
        }
        Ok(())
    }
}

/// Hands a new reference to C.
pub(crate) fn into_handle<H: ArcHandle>(value: Arc<H::Target>) -> *mut H {
    Arc::into_raw(value).cast_mut().cast()
}

/// Borrows the value behind a handle for the duration of a call.
pub(crate) fn borrow<'a, H: ArcHandle>(handle: *const H, arg: &str) -> Result<&'a H::Target> {
    if handle.is_null() {
        return Err(Error::value(format!("argument '{arg}' is NULL")));
    }
    // SAFETY: a non-NULL handle was made by `into_handle` and the caller holds a
    // reference for the duration of the call (API contract).
    let value = unsafe { &*handle.cast::<H::Target>() };
    H::usable(value, arg)?;
    Ok(value)
}

/// A new `Arc` reference to the value behind a handle.
pub(crate) fn clone_arc<H: ArcHandle>(handle: *const H, arg: &str) -> Result<Arc<H::Target>> {
    borrow::<H>(handle, arg)?;
    let ptr = handle.cast::<H::Target>();
    // SAFETY: `ptr` came from `Arc::into_raw` and is alive (checked non-NULL above;
    // the caller holds a reference), so incrementing and re-wrapping is sound.
    unsafe {
        Arc::increment_strong_count(ptr);
        Ok(Arc::from_raw(ptr))
    }
}

/// Drops one reference; NULL is a no-op.
pub(crate) fn release<H: ArcHandle>(handle: *const H) {
    if !handle.is_null() {
        // SAFETY: the caller gives up one reference made by `into_handle`.
        drop(unsafe { Arc::from_raw(handle.cast::<H::Target>()) });
    }
}
