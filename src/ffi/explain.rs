//! The explain report from C: a snapshot of what a context evaluated, read through
//! accessors or as JSON text.

use std::ffi::c_char;

use super::error::write_text;
use super::handle::borrow;
use super::{boundary, boundary_out, boundary_value, ndx_context_t, ndx_error_t, write_sized};
use crate::debug::explain::{Explain, Flush};
use crate::error::{Error, Result};

/// A snapshot of a context's explain counters (`ndx_context_explain`). An owned value:
/// free it with `ndx_explain_free`. Reading it from several threads is safe.
pub struct ndx_explain_t {
    _private: [u8; 0],
}

/// Why deferred work ran: the reason of a graph, and of a graph break. Values are
/// never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_flush_reason_t {
    /// `ndx_context_evaluate`.
    NDX_FLUSH_EVALUATE = 1,
    /// `ndx_future_wait`.
    NDX_FLUSH_WAIT = 2,
    /// `ndx_future_poll`.
    NDX_FLUSH_POLL = 3,
    /// Reading a pending tensor's data (`ndx_tensor_copy_to`, a batch's samples): a
    /// graph break.
    NDX_FLUSH_DATA_READ = 4,
    /// Exporting a pending tensor through DLPack: a graph break.
    NDX_FLUSH_EXPORT = 5,
    /// An EAGER or SYNC invocation consumed a deferred value: a graph break.
    NDX_FLUSH_CONSUMER = 6,
    /// Metadata only running could tell (a host operator's output shape): a graph
    /// break.
    NDX_FLUSH_METADATA = 7,
}

/// The totals of an explain snapshot (`ndx_explain_summary`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ndx_explain_summary_t {
    /// Set by the caller to `sizeof(ndx_explain_summary_t)`.
    pub struct_size: usize,
    /// Graphs evaluated: each flush of deferred work is one.
    pub graphs: u64,
    /// Graph breaks: flushes forced before results were asked for.
    pub breaks: u64,
    /// Invocations enqueued (the sum of the four per-mode counts).
    pub ops: u64,
    /// Deferred invocations run inside the recorded graphs (the sum of their `ops`).
    pub graph_ops: u64,
    /// Invocations enqueued in SYNC_CPU mode.
    pub sync_cpu: u64,
    /// Invocations enqueued in SYNC_FULL mode.
    pub sync_full: u64,
    /// Invocations enqueued in DEFERRED mode.
    pub deferred: u64,
    /// Invocations enqueued in EAGER mode.
    pub eager: u64,
    /// Check flags raised (every policy; folded ones counted each time).
    pub checks_raised: u64,
}

/// One evaluated graph (`ndx_explain_graph`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ndx_explain_graph_t {
    /// Set by the caller to `sizeof(ndx_explain_graph_t)`.
    pub struct_size: usize,
    /// An `ndx_flush_reason_t`.
    pub reason: i32,
    /// Deferred invocations it ran.
    pub ops: u64,
    /// Nanoseconds from its submission to the completion of its last invocation;
    /// -1 while some of it still runs.
    pub time_ns: i64,
    /// The sequence number of the first deferred invocation it ran: the one whose
    /// value was needed (for `evaluate`, the earliest recorded one).
    pub seq: u64,
}

/// One graph break (`ndx_explain_break`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ndx_graph_break_t {
    /// Set by the caller to `sizeof(ndx_graph_break_t)`.
    pub struct_size: usize,
    /// An `ndx_flush_reason_t` (DATA_READ, EXPORT, CONSUMER or METADATA).
    pub reason: i32,
    /// Index of the graph it flushed (for `ndx_explain_graph`).
    pub graph: usize,
    /// The sequence number of the invocation whose value was needed.
    pub seq: u64,
    /// Innermost frame of the site that forced it: file (NULL when unknown),
    /// borrowed from the snapshot.
    pub file: *const c_char,
    /// Its 1-based line (0: unknown).
    pub line: u32,
    /// Its function (NULL when unknown), borrowed from the snapshot.
    pub function: *const c_char,
}

fn explain_ref<'a>(ex: *const ndx_explain_t) -> Result<&'a Explain> {
    // SAFETY: a non-NULL explain pointer was made by `ndx_context_explain` and lives
    // until `ndx_explain_free` (API contract).
    unsafe { ex.cast::<Explain>().as_ref() }
        .ok_or_else(|| Error::value("argument 'explain' is NULL"))
}

/// A snapshot of what `ctx` evaluated so far: graphs, graph breaks with their reason
/// and site, invocations per mode, check flags. Free it with `ndx_explain_free`.
/// Only the first 4096 graphs (and the breaks among them) are kept in detail; the
/// totals count all. Break sites are symbolised when first read.
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_explain(
    ctx: *const ndx_context_t,
    out: *mut *mut ndx_explain_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_context_explain", out, std::ptr::null_mut(), || {
        let ex = borrow(ctx, "ctx")?.explain();
        Ok(Box::into_raw(Box::new(ex)).cast())
    })
}

/// Frees a snapshot (NULL is a no-op).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_free(explain: *mut ndx_explain_t) {
    boundary_value(
        "ndx_explain_free",
        |_| (),
        || {
            if !explain.is_null() {
                // SAFETY: made by `Box::into_raw` in `ndx_context_explain`; freed once.
                drop(unsafe { Box::from_raw(explain.cast::<Explain>()) });
            }
        },
    )
}

/// The snapshot's totals into `*out` (`out->struct_size` set by the caller). On
/// failure with a usable `out` (non-NULL, `struct_size` large enough) every field
/// after `struct_size` is zeroed; so for `ndx_explain_graph` and `ndx_explain_break`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_summary(
    explain: *const ndx_explain_t,
    out: *mut ndx_explain_summary_t,
) -> *mut ndx_error_t {
    boundary("ndx_explain_summary", || {
        write_sized(out, "ndx_explain_summary_t", |struct_size| {
            let ex = explain_ref(explain)?;
            let m = ex.by_mode;
            Ok(ndx_explain_summary_t {
                struct_size,
                graphs: ex.graphs_total,
                breaks: ex.breaks_total,
                ops: ex.ops(),
                graph_ops: ex.graph_ops,
                sync_cpu: m[0],
                sync_full: m[1],
                deferred: m[2],
                eager: m[3],
                checks_raised: ex.checks_raised,
            })
        })
    })
}

/// The number of graph records in the snapshot (0 for NULL).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_graph_count(explain: *const ndx_explain_t) -> usize {
    boundary_value(
        "ndx_explain_graph_count",
        |_| 0,
        || explain_ref(explain).map_or(0, |e| e.graphs.len()),
    )
}

/// Graph record `index` (in evaluation order) into `*out`; NDX_ERROR_INDEX when out
/// of range.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_graph(
    explain: *const ndx_explain_t,
    index: usize,
    out: *mut ndx_explain_graph_t,
) -> *mut ndx_error_t {
    boundary("ndx_explain_graph", || {
        write_sized(out, "ndx_explain_graph_t", |struct_size| {
            let ex = explain_ref(explain)?;
            let g = ex.graphs.get(index).ok_or_else(|| {
                Error::index(format!(
                    "graph index {index} is out of range: the snapshot has {} graph{}",
                    ex.graphs.len(),
                    if ex.graphs.len() == 1 { "" } else { "s" }
                ))
            })?;
            Ok(ndx_explain_graph_t {
                struct_size,
                reason: reason_abi(g.reason) as i32,
                ops: g.ops,
                time_ns: g.time_ns.map_or(-1, |t| t as i64),
                seq: g.seq,
            })
        })
    })
}

/// The number of graph break records in the snapshot (0 for NULL).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_break_count(explain: *const ndx_explain_t) -> usize {
    boundary_value(
        "ndx_explain_break_count",
        |_| 0,
        || explain_ref(explain).map_or(0, |e| e.breaks.len()),
    )
}

/// Graph break `index` (in order) into `*out`, its strings borrowed from the
/// snapshot; NDX_ERROR_INDEX when out of range.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_break(
    explain: *const ndx_explain_t,
    index: usize,
    out: *mut ndx_graph_break_t,
) -> *mut ndx_error_t {
    boundary("ndx_explain_break", || {
        write_sized(out, "ndx_graph_break_t", |struct_size| {
            let ex = explain_ref(explain)?;
            let b = ex.breaks.get(index).ok_or_else(|| {
                Error::index(format!(
                    "break index {index} is out of range: the snapshot has {} break{}",
                    ex.breaks.len(),
                    if ex.breaks.len() == 1 { "" } else { "s" }
                ))
            })?;
            let f = b.site.frames().first();
            Ok(ndx_graph_break_t {
                struct_size,
                reason: reason_abi(b.reason) as i32,
                graph: b.graph,
                seq: b.seq,
                file: f
                    .and_then(|f| f.c_file())
                    .map_or(std::ptr::null(), |c| c.as_ptr()),
                line: f.map_or(0, |f| f.line()),
                function: f
                    .and_then(|f| f.c_function())
                    .map_or(std::ptr::null(), |c| c.as_ptr()),
            })
        })
    })
}

/// The snapshot as JSON text into `buf` (snprintf-like: at most `cap` bytes, always
/// NUL-terminated when `cap > 0`; returns the length the full text needs). Keys:
/// `graphs_total`, `breaks_total`, `ops`, `graph_ops`, `invocations` (per mode),
/// `checks_raised`, `graphs` (reason, ops, time_ns, seq) and `breaks` (graph, reason,
/// seq, file, line, function). A graph still running has `time_ns` -1. NULL `explain`
/// gives the empty text (0).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_explain_json(
    explain: *const ndx_explain_t,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    boundary_value(
        "ndx_explain_json",
        |_| write_text("", buf, cap),
        || {
            let text = explain_ref(explain).map_or_else(|_| String::new(), |e| e.json());
            write_text(&text, buf, cap)
        },
    )
}

/// The ABI value of a flush reason (an exhaustive match: the two enums cannot drift).
fn reason_abi(f: Flush) -> ndx_flush_reason_t {
    match f {
        Flush::Evaluate => ndx_flush_reason_t::NDX_FLUSH_EVALUATE,
        Flush::Wait => ndx_flush_reason_t::NDX_FLUSH_WAIT,
        Flush::Poll => ndx_flush_reason_t::NDX_FLUSH_POLL,
        Flush::DataRead => ndx_flush_reason_t::NDX_FLUSH_DATA_READ,
        Flush::Export => ndx_flush_reason_t::NDX_FLUSH_EXPORT,
        Flush::Consumer => ndx_flush_reason_t::NDX_FLUSH_CONSUMER,
        Flush::Metadata => ndx_flush_reason_t::NDX_FLUSH_METADATA,
    }
}
