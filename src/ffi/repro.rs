//! Repro documents from C: the document of a failed invocation, its replay, and the
//! cap on the input bytes it carries.

use std::ffi::c_char;

use super::error::{error_ref, write_text};
use super::handle::{borrow, clone_arc, into_handle};
use super::{
    boundary, boundary_out, boundary_value, caller_return_address, host_str, ndx_context_t,
    ndx_error_t, ndx_future_t,
};
use crate::debug::repro;
use crate::error::Error;
use crate::exec::{CallSite, Input, TensorRef};

/// Writes the repro document of `err` into `buf` (snprintf-like: at most `cap` bytes,
/// always NUL-terminated when `cap > 0`) and returns the length the full text needs;
/// 0 (and the empty text) when `err` is NULL or it and its cause chain have none. Errors of invocations that failed
/// while running carry one (an invocation failed by its input's failure finds it in
/// its cause chain): a JSON object with `op`, `args` (name, type, value), `inputs`
/// (dtype, shape, strides, layout, device, read_only, and `bytes` in hexadecimal, or
/// null beyond the context's `repro_max_bytes`), `sample` (the failing batch sample),
/// `mode`, `backend`, `ndx_version`, `site` (frames, innermost first) and `error`
/// (kind and message). Save it with a bug report; `ndx_repro_run` replays it.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_repro(err: *const ndx_error_t, buf: *mut c_char, cap: usize) -> usize {
    boundary_value(
        "ndx_error_repro",
        |_| write_text("", buf, cap),
        || {
            let doc = error_ref(err).and_then(|e| e.repro()).unwrap_or_default();
            write_text(doc, buf, cap)
        },
    )
}

/// Replays a repro document on `ctx`: rebuilds the inputs from their bytes (compact
/// host tensors) and invokes the operator with the recorded arguments in the recorded
/// eval mode, on the context's backend; `*out` is the new invocation's future, which
/// fails as the original did when the failure reproduces. A document without input
/// bytes, or malformed (a key repeated in one object included), is NDX_ERROR_VALUE
/// naming what is wrong; its inputs are held to
/// the limits of an imported tensor (at most NDX_MAX_NDIM dimensions, a layout of one
/// ASCII letter per dimension) and must carry exactly the bytes their dtype and shape
/// need, checked before anything is allocated. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_repro_run(
    ctx: *const ndx_context_t,
    json: *const c_char,
    out: *mut *mut ndx_future_t,
) -> *mut ndx_error_t {
    let caller_ip = caller_return_address();
    boundary_out("ndx_repro_run", out, std::ptr::null_mut(), || {
        let ctx = clone_arc(ctx, "ctx")?;
        let call = || CallSite {
            location: None,
            caller_ip,
        };
        let replay = (|| {
            let replay = repro::parse(&host_str(json, "json")?)?;
            if ctx.registry().get(&replay.op).is_none() {
                return Err(Error::value(format!(
                    "the repro document's operator '{}' is unknown on this context: a host \
                     operator must be registered (ndx_register_op) before its failures replay",
                    replay.op
                )));
            }
            Ok(replay)
        })()
        // A document refused names the caller as an invocation's errors do.
        .map_err(|e| ctx.refused_at(e, call()))?;
        let inputs = replay
            .inputs
            .into_iter()
            .map(|t| Input::Tensor(std::sync::Arc::new(TensorRef::ready(t))))
            .collect();
        let node = ctx.invoke(&replay.op, inputs, replay.args, Some(replay.mode), call())?;
        Ok(into_handle(node))
    })
}

/// Sets the most input bytes (all inputs together) a repro document of this context's
/// later failures carries: 0 records metadata only; the default is 1 MiB.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_repro_max_bytes(
    ctx: *const ndx_context_t,
    max_bytes: u64,
) -> *mut ndx_error_t {
    boundary("ndx_context_set_repro_max_bytes", || {
        borrow(ctx, "ctx")?.update(|s| s.repro_max_bytes = max_bytes);
        Ok(())
    })
}
