//! Contexts, named arguments, invocations, futures, host operators and frame
//! providers.
//!
//! Threads: contexts and futures may be used from any thread. Callbacks (`on_ready`,
//! host operator kernels, frame providers) must not throw C++ exceptions or
//! `longjmp` across ndx. `fork()`: see `ndx_context_new` (and `exec::fork`).

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use super::handle::{borrow, clone_arc, into_handle, release};
use super::{
    Options, boundary, boundary_out, boundary_value, caller_return_address, error_into_raw,
    host_name, host_str, ndx_batch_t, ndx_context_t, ndx_error_t, ndx_future_t, ndx_tensor_t,
    out_param, read_options, size_check,
};
use crate::error::{Error, Frame, FrameOrigin, Result};
use crate::exec::{
    ArgType, ArgValue, Args, Backend, CallSite, CapturePolicy, Data, EvalMode, Input, Node,
    Settings, Status, TensorRef, new_context, output_batch, output_tensor,
};
use crate::ops::{Contract, HostKernel, Kernel, OpDef, OutDecl};
use crate::tensor::{DType, Tensor};

/// Eval modes: when an invocation runs. Values are never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_eval_mode_t {
    /// In `ndx_invoke_options_t.mode`: use the context's mode.
    NDX_EVAL_CONTEXT_DEFAULT = 0,
    /// Runs on the calling thread before `ndx_invoke` returns; the future is already
    /// READY or FAILED. CUDA work may still be queued on ndx's stream (its outputs are
    /// ordered after it; an invocation whose check flags must be read waits for it).
    NDX_EVAL_SYNC_CPU = 1,
    /// Like SYNC_CPU, and all device work is finished before return (ndx's stream of
    /// the device is synchronised). Identical to SYNC_CPU for host work.
    NDX_EVAL_SYNC_FULL = 2,
    /// Nothing runs at invoke: the invocation is recorded with its site, and runs when
    /// a result is needed (a wait, reading data, an export), on
    /// `ndx_context_evaluate`, or — without blocking — on the first poll.
    NDX_EVAL_DEFERRED = 3,
    /// Submitted to the worker threads at once; `ndx_invoke` returns immediately. The
    /// work never runs on the calling thread. The default. (As with DEFERRED, a future
    /// of CUDA work becomes READY once that work has completed on the device.)
    NDX_EVAL_EAGER = 4,
}

/// Which frames an invocation records. The caller frame (the line that called
/// `ndx_invoke`, or the explicit location) is always recorded, nearly for free.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_capture_policy_t {
    /// Only the caller frame.
    NDX_CAPTURE_OFF = 1,
    /// The explicit location and the frame provider's host frames (the native caller
    /// frame only when there are neither).
    NDX_CAPTURE_HOST = 2,
    /// Native frames up to the depth limit (deferred and eager invocations; SYNC ones
    /// record the caller frame). The default, with depth 16.
    NDX_CAPTURE_NATIVE = 3,
    /// Explicit location, then host frames, then native frames.
    NDX_CAPTURE_ALL = 4,
}

/// Future status.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_future_status_t {
    /// Not complete.
    NDX_FUTURE_PENDING = 0,
    /// Complete; outputs available.
    NDX_FUTURE_READY = 1,
    /// Complete; failed (`ndx_future_error`).
    NDX_FUTURE_FAILED = 2,
}

/// Argument types of host operator schemas. `ndx_invoke` converts a value given in
/// an accepted other form to the declared type in the copy the kernel gets, so the
/// kernel reads each argument with the getter of its declared type.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_arg_type_t {
    /// `ndx_args_set_int`.
    NDX_ARG_INT = 1,
    /// `ndx_args_set_float` (an int is accepted, converted).
    NDX_ARG_FLOAT = 2,
    /// `ndx_args_set_bool`.
    NDX_ARG_BOOL = 3,
    /// `ndx_args_set_string`.
    NDX_ARG_STRING = 4,
    /// `ndx_args_set_int_array` (a single int is accepted, as an array of one).
    NDX_ARG_INT_ARRAY = 5,
    /// `ndx_args_set_float_array` (a single float or int is accepted, as an array of
    /// one, and an int array, each int converted).
    NDX_ARG_FLOAT_ARRAY = 6,
    /// `ndx_args_set_dtype`.
    NDX_ARG_DTYPE = 7,
}

/// Flags of a host operator's schema (`ndx_op_schema_t.flags`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_op_flags_t {
    /// Outputs may share memory with inputs (a kernel that returns a view of its
    /// input). Without it, the `debug` backend reports an output that does.
    NDX_OP_OUTPUTS_MAY_ALIAS = 1,
}

/// Options for `ndx_context_new`. Set `struct_size = sizeof(ndx_context_options_t)`
/// and zero what you do not set: every zero/NULL field means its default.
#[repr(C)]
pub struct ndx_context_options_t {
    /// Set by the caller to `sizeof(ndx_context_options_t)`.
    pub struct_size: usize,
    /// An `ndx_eval_mode_t` (0: NDX_EVAL_EAGER).
    pub eval_mode: i32,
    /// An `ndx_capture_policy_t` (0: NDX_CAPTURE_NATIVE).
    pub capture_policy: i32,
    /// Capture depth (0: 16), at most `NDX_MAX_CAPTURE_DEPTH` (more is NDX_ERROR_VALUE):
    /// native return addresses recorded, and host frames asked of the frame provider.
    pub capture_depth: u32,
    /// Worker threads of the process-wide pool, used only by the first context that
    /// starts it (0: `NDX_NUM_THREADS`, else the number of cores), at most 4096 (more
    /// is NDX_ERROR_VALUE, also when the pool has started).
    pub num_threads: u32,
    /// Backend name (NULL: "default"); see `ndx_context_set_backend`. A new context
    /// has only the built-in operators, so fault injection into a host operator is set
    /// with `ndx_context_set_backend` after `ndx_register_op`.
    pub backend: *const c_char,
    /// When true, callbacks and host operators run only inside
    /// `ndx_context_process_events` or a wait on this context's futures, on that
    /// thread — for runtimes with a global lock (Python's GIL, Lua). The context
    /// holds what is queued (with its `user` data) until it runs or the context is
    /// released, so a queued callback whose `user` holds a reference to the context
    /// keeps it alive until someone runs the queue.
    pub process_events_callbacks: bool,
    /// An `ndx_check_policy_t` (0: NDX_CHECKS_OFF). Fields from here on were added
    /// in 0.1; a caller whose `struct_size` ends before them gets their defaults (a
    /// `struct_size` of the older struct's `sizeof`, whose padding this field
    /// overlays, included: those bytes are not read).
    pub check_policy: i32,
    /// Enabled check categories, a mask of `ndx_check_category_t` (0: NDX_CHECK_ALL).
    pub check_categories: u32,
    /// Distinct check flags kept between reports (0: 1024); later ones are dropped
    /// and counted.
    pub check_capacity: u32,
    /// Most input bytes a failing invocation's repro document carries (0: 1 MiB;
    /// negative: none, metadata only; unlike `ndx_context_set_repro_max_bytes`,
    /// where 0 means metadata only); see `ndx_error_repro`.
    pub repro_max_bytes: i64,
    /// The CUDA device `to_device` copies to when its `device` argument is not given
    /// (0: device 0). A negative id is NDX_ERROR_VALUE; whether the device exists is
    /// not checked here (contexts are made on machines without a GPU too):
    /// `to_device` refuses a device that does not exist at `ndx_invoke`.
    pub cuda_device: i32,
}

impl Default for ndx_context_options_t {
    /// Every field at its default, `struct_size` set (for Rust callers of the ABI).
    fn default() -> ndx_context_options_t {
        ndx_context_options_t {
            struct_size: std::mem::size_of::<ndx_context_options_t>(),
            eval_mode: 0,
            capture_policy: 0,
            capture_depth: 0,
            num_threads: 0,
            backend: std::ptr::null(),
            process_events_callbacks: false,
            check_policy: 0,
            check_categories: 0,
            check_capacity: 0,
            repro_max_bytes: 0,
            cuda_device: 0,
        }
    }
}

/// A source location, for `ndx_invoke_options_t.location`; `NDX_HERE` fills it.
/// `file == NULL` means none. Strings are copied.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ndx_location_t {
    /// Source file, or NULL for no location.
    pub file: *const c_char,
    /// 1-based line, 0 when unknown (so is a line above `INT32_MAX`: a negative line
    /// converted).
    pub line: u32,
    /// Function name, or NULL.
    pub function: *const c_char,
}

/// Per-invocation options. Set `struct_size = sizeof(ndx_invoke_options_t)`, and fill
/// it with designated initializers (`{.struct_size = sizeof o, .location = NDX_HERE}`)
/// or after a `memset` to 0, so fields added later start zeroed (their defaults).
#[repr(C)]
pub struct ndx_invoke_options_t {
    /// Set by the caller to `sizeof(ndx_invoke_options_t)`.
    pub struct_size: usize,
    /// The caller's location (`NDX_HERE`); when given, it is frame 0 of the site and
    /// replaces the native caller frame.
    pub location: ndx_location_t,
    /// An `ndx_eval_mode_t` overriding the context's (0: the context's).
    pub mode: i32,
    /// Out tensors, or NULL: `n_outputs` entries, one per output of the operator, that
    /// the work writes its results into instead of new memory (see `ndx_output_t`).
    /// Fields from here on were added in 0.1; a caller whose `struct_size` ends
    /// before them passes no out tensors.
    pub outputs: *const ndx_output_t,
    /// The number of entries in `outputs`: 0, or the operator's output count.
    pub n_outputs: usize,
}

/// One out tensor of an invocation (`ndx_invoke_options_t.outputs`): a `tensor` for a
/// tensor output, a `batch` for the batch output of a per-sample invocation, or
/// neither to let ndx allocate that output. It must be writable host memory (not
/// read-only) of exactly the output's dtype and shape (per sample for a batch), whose
/// strides give each index its own element; it may be strided, and it may be an input
/// of the same invocation (the result is then computed aside and copied in). Out
/// tensors must hold data: a still-pending output of another invocation is refused.
/// That is looked at when `ndx_invoke` runs: the output of an EAGER invocation that
/// nothing waited for is refused or accepted by whether its work happens to have
/// completed by then, so wait for it (`ndx_future_wait`) before passing it here.
/// An out batch must have as many samples as the invocation's input batches, checked
/// at `ndx_invoke` also for a host operator (whose outputs' dtype and shape are known,
/// and checked, only once it has run: a mismatch there fails its future).
/// An invocation on CUDA tensors, whose outputs live in device memory, takes none
/// (NDX_ERROR_NOT_IMPLEMENTED at `ndx_invoke`): copy its output with `to_host`.
///
/// The work writes into it when it runs (at once in the SYNC modes, later in EAGER and
/// DEFERRED): do not read, write or pass it to other invocations until the future
/// completes; use `ndx_future_tensor` of this invocation to chain, which orders the
/// reader after the write. The future's output is a view of the out tensor. ndx holds
/// a reference to it until then; the caller keeps its own. When the invocation fails
/// while running (an integer division by zero, say), the out tensor may have been
/// partly written (the elements, or the batch samples, computed before the failure),
/// alike in every mode.
#[repr(C)]
pub struct ndx_output_t {
    /// An out tensor, or NULL.
    pub tensor: *const ndx_tensor_t,
    /// An out batch, or NULL.
    pub batch: *const ndx_batch_t,
}

/// One input of an invocation: exactly one of `tensor` and `batch` is non-NULL.
/// Either may be the pending output of another invocation.
#[repr(C)]
pub struct ndx_input_t {
    /// A tensor, or NULL.
    pub tensor: *const ndx_tensor_t,
    /// A batch, or NULL.
    pub batch: *const ndx_batch_t,
}

/// One host-language frame, as a frame provider reports it. Strings need only live
/// until the provider returns (ndx copies them).
#[repr(C)]
pub struct ndx_host_frame_t {
    /// Function name, or NULL.
    pub function: *const c_char,
    /// File, or NULL.
    pub file: *const c_char,
    /// 1-based line, 0 when unknown (so is a line above `INT32_MAX`: a negative line
    /// converted).
    pub line: u32,
}

/// A frame provider: writes up to `capacity` frames of the host language's current
/// stack into `frames`, innermost first, and returns how many it wrote. Called during
/// `ndx_invoke` (and `ndx_repro_run`) when the capture policy is HOST or ALL, in every
/// eval mode, before the operator is looked up (so also for an invocation refused at
/// call time), on the thread making that call: an ndx worker when a host operator or
/// callback invokes, and on several threads at once when they invoke concurrently.
/// `capacity` is the context's capture depth at that moment (at least 1). A return
/// above `capacity` (an error code, say) is taken as a failure: the invocation records
/// no host frames; NULL strings are unknown names, and strings that are not UTF-8 are
/// copied with the invalid bytes replaced.
///
/// It may call ndx, on its own context too. An invocation it makes (directly or through
/// code it calls) does not call a provider again: it records no host frames (the native
/// caller frame instead). It may replace or remove itself (see
/// `ndx_context_set_frame_provider` for when `user_free` then runs) and release the last
/// reference to its context: the invocation in progress still returns its future, SYNC
/// work runs, and DEFERRED or EAGER work is cancelled like any not started at a release.
pub type ndx_frame_provider_t = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        frames: *mut ndx_host_frame_t,
        capacity: usize,
    ) -> usize,
>;

/// Frees a `user` pointer given with a callback, when ndx no longer needs it. Every
/// function taking `user` and `user_free` takes ownership of `user` in every case:
/// `user_free(user)` (if not NULL) is called exactly once, also when that function
/// fails (then before it returns).
pub type ndx_user_free_t = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// Called once when a future completes, with the future borrowed for the call.
pub type ndx_future_callback_t =
    Option<unsafe extern "C" fn(user: *mut c_void, future: *const ndx_future_t)>;

/// A host operator's kernel: reads `inputs` (borrowed for the call; NULL when
/// `n_inputs` is 0) and `args` (never NULL; borrowed for the call: read it with the
/// `ndx_args_get_*` of each argument's declared type, never change or free it), fills
/// every
/// `outputs[i]` with a new tensor reference (e.g. from `ndx_tensor_from_host`, or
/// `ndx_tensor_retain` of an input it returns), and returns NULL, or an error (e.g.
/// from `ndx_error_new`, perhaps with its own cause) that surfaces like any failure,
/// with the invocation's site. Outputs must hold data (an invocation inside a kernel:
/// NDX_EVAL_SYNC_CPU). Where ndx can see the contract broken — an input returned
/// without a reference of its own, one tensor in several slots with too few
/// references, the output of a pending invocation, the output of a DEFERRED or EAGER
/// invocation the kernel made (on this thread), complete or not by the time it
/// returns, so the same kernel fails alike whatever the timing — the invocation fails
/// with NDX_ERROR_BACKEND saying so.
pub type ndx_kernel_fn_t = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        inputs: *const *const ndx_tensor_t,
        n_inputs: usize,
        args: *const ndx_args_t,
        outputs: *mut *mut ndx_tensor_t,
        n_outputs: usize,
    ) -> *mut ndx_error_t,
>;

/// A host operator's schema. Set `struct_size = sizeof(ndx_op_schema_t)`. Arguments
/// listed here are optional and checked by name and type at `ndx_invoke`.
#[repr(C)]
pub struct ndx_op_schema_t {
    /// Set by the caller to `sizeof(ndx_op_schema_t)`.
    pub struct_size: usize,
    /// Exact number of inputs.
    pub n_inputs: usize,
    /// Exact number of outputs (at least 1).
    pub n_outputs: usize,
    /// Number of named arguments.
    pub n_args: usize,
    /// `n_args` argument names (copied; distinct, UTF-8).
    pub arg_names: *const *const c_char,
    /// `n_args` `ndx_arg_type_t` values.
    pub arg_types: *const i32,
    /// NULL, or `n_outputs` `ndx_dtype_t` values the kernel promises (-1: any).
    /// Checked by the `debug` backend. (Fields from here on are optional: a
    /// `struct_size` that ends before them means none.)
    pub output_dtypes: *const i32,
    /// NULL, or `n_outputs` ranks the kernel promises (-1: any); `debug` checks them.
    pub output_ndims: *const i32,
    /// NULL, or `n_outputs` layout strings the kernel promises (a NULL entry: any);
    /// `debug` checks them.
    pub output_layouts: *const *const c_char,
    /// `ndx_op_flags_t` bits.
    pub flags: u32,
}

/// Named arguments for `ndx_invoke`: an owned builder (`ndx_args_new`,
/// `ndx_args_free`). Not thread-safe while being changed; `ndx_invoke` copies it, so
/// it may be changed or freed as soon as `ndx_invoke` returns, also while the
/// invocation's work is pending (DEFERRED, EAGER). Names are UTF-8 (other bytes are
/// NDX_ERROR_VALUE); a name holds one value of one type: setting it again, with any
/// type, replaces the value (and ends what getters borrowed from the old one). Names
/// and types are checked by `ndx_invoke` against the operator's schema: an unknown name
/// is NDX_ERROR_VALUE listing the names the operator takes; a wrong type is
/// NDX_ERROR_TYPE naming the argument, its type and the expected one.
pub struct ndx_args_t {
    _private: [u8; 0],
}

/// A user pointer and its optional free function, released once.
struct UserData {
    user: *mut c_void,
    free: ndx_user_free_t,
}

// SAFETY: the C API documents that `user` pointers given with callbacks are used from
// ndx worker threads; the embedder promises they may be.
unsafe impl Send for UserData {}
// SAFETY: as for Send.
unsafe impl Sync for UserData {}

impl Drop for UserData {
    fn drop(&mut self) {
        if let Some(free) = self.free {
            // SAFETY: the embedder's free function, called once with its pointer.
            unsafe { free(self.user) }
        }
    }
}

impl Options for ndx_context_options_t {
    fn zeroed() -> Self {
        ndx_context_options_t {
            struct_size: 0,
            ..Default::default()
        }
    }
}

impl Options for ndx_invoke_options_t {
    fn zeroed() -> Self {
        ndx_invoke_options_t {
            struct_size: 0,
            ..Default::default()
        }
    }
}

impl Default for ndx_invoke_options_t {
    /// No location, the context's mode, no out tensors; `struct_size` set (for Rust
    /// callers of the ABI).
    fn default() -> ndx_invoke_options_t {
        ndx_invoke_options_t {
            struct_size: std::mem::size_of::<ndx_invoke_options_t>(),
            location: ndx_location_t {
                file: std::ptr::null(),
                line: 0,
                function: std::ptr::null(),
            },
            mode: 0,
            outputs: std::ptr::null(),
            n_outputs: 0,
        }
    }
}

fn eval_mode(raw: i32, arg: &str) -> Result<EvalMode> {
    EvalMode::from_raw(raw).ok_or_else(|| {
        Error::value(format!(
            "{arg} is {raw}, not an ndx_eval_mode_t value (expected 1 to 4)"
        ))
    })
}

/// The largest capture depth accepted by `ndx_context_set_capture_policy` and
/// `ndx_context_options_t.capture_depth`.
pub const NDX_MAX_CAPTURE_DEPTH: u32 = 1024;
const _: () = assert!(NDX_MAX_CAPTURE_DEPTH as usize == crate::error::MAX_DEPTH);

/// A capture depth from C: at most [`NDX_MAX_CAPTURE_DEPTH`].
fn capture_depth(depth: u32, arg: &str) -> Result<usize> {
    if depth > NDX_MAX_CAPTURE_DEPTH {
        return Err(Error::value(format!(
            "{arg} is {depth}, expected at most {NDX_MAX_CAPTURE_DEPTH} (NDX_MAX_CAPTURE_DEPTH)"
        )));
    }
    Ok(depth as usize)
}

fn capture_policy(raw: i32, arg: &str) -> Result<CapturePolicy> {
    CapturePolicy::from_raw(raw).ok_or_else(|| {
        Error::value(format!(
            "{arg} is {raw}, not an ndx_capture_policy_t value (expected 1 to 4)"
        ))
    })
}

/// A new context. `opts` may be NULL (all defaults: EAGER, NATIVE capture of 16
/// frames, backend "default", callbacks on worker threads). Thread-safe.
///
/// `fork()`: a child has none of its parent's threads. New contexts work in the child
/// (its first use starts worker threads of its own). A context made before the fork
/// belongs to the parent: in the child every call on it is NDX_ERROR_VALUE, except
/// `ndx_context_release`, which waits for nothing there. An invocation that had not
/// completed at the fork reads as failed in the child (poll FAILED, wait and reads
/// NDX_ERROR_RUNTIME), and its pending outputs are refused as inputs; tensors whose
/// data existed are usable anywhere. CUDA initialised before the fork is not usable in
/// the child (NDX_ERROR_CUDA saying so).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_new(
    opts: *const ndx_context_options_t,
    out: *mut *mut ndx_context_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_context_new", out, std::ptr::null_mut(), || {
        let mut settings = Settings::default();
        let mut threads = 0;
        if !opts.is_null() {
            // Callers built against the header before the check fields pass less: the
            // size of that struct, whose last field was `process_events_callbacks`. It
            // is rounded up to the struct's alignment, so on 64-bit targets it ends in
            // padding bytes where `check_policy` is now: bytes the caller never set.
            const OLD_END: usize = std::mem::offset_of!(ndx_context_options_t, check_policy);
            const OLD_SIZE: usize = OLD_END.next_multiple_of(std::mem::align_of::<usize>());
            let mut o = read_options(opts, OLD_END)?;
            if o.struct_size <= OLD_SIZE {
                o.check_policy = 0;
            }
            if o.repro_max_bytes != 0 {
                settings.repro_max_bytes = u64::try_from(o.repro_max_bytes).unwrap_or(0);
            }
            if o.cuda_device < 0 {
                return Err(Error::value(format!(
                    "opts->cuda_device is {}, not a CUDA device id (0 or more)",
                    o.cuda_device
                )));
            }
            settings.cuda_device = o.cuda_device;
            if o.check_policy != 0 || o.check_categories != 0 || o.check_capacity != 0 {
                let policy = if o.check_policy == 0 {
                    crate::checks::Policy::Off as i32
                } else {
                    o.check_policy
                };
                settings.checks = super::checks::check_settings(
                    policy,
                    o.check_categories,
                    o.check_capacity,
                    ["opts->check_policy", "opts->check_categories"],
                )?;
            }
            if o.eval_mode != 0 {
                settings.mode = eval_mode(o.eval_mode, "opts->eval_mode")?;
            }
            if o.capture_policy != 0 {
                settings.capture = capture_policy(o.capture_policy, "opts->capture_policy")?;
            }
            if o.capture_depth != 0 {
                settings.depth = capture_depth(o.capture_depth, "opts->capture_depth")?;
            }
            if !o.backend.is_null() {
                let backend = Backend::parse(&host_str(o.backend, "opts->backend")?)?;
                // A new context has only the built-ins.
                backend.check_op(&crate::ops::Registry::new())?;
                settings.backend = backend;
            }
            settings.events_mode = o.process_events_callbacks;
            threads = o.num_threads as usize;
            if threads > crate::exec::pool::MAX_THREADS {
                return Err(Error::value(format!(
                    "opts->num_threads is {threads}, expected at most {} (0: the default)",
                    crate::exec::pool::MAX_THREADS
                )));
            }
        }
        Ok(into_handle(Arc::new(new_context(settings, threads))))
    })
}

/// Adds a reference to `ctx`. NDX_ERROR_VALUE for NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_retain(ctx: *const ndx_context_t) -> *mut ndx_error_t {
    boundary("ndx_context_retain", || {
        std::mem::forget(clone_arc(ctx, "ctx")?);
        Ok(())
    })
}

/// Drops a reference to `ctx`. The last one cancels work that has not started (its
/// futures fail with NDX_ERROR_CANCELLED and their callbacks still fire once), waits
/// for work that is running and until the workers let go of what its work held, so no
/// deleter of a tensor that work held runs on a worker after it returns (unless
/// called from a callback or host operator, where it does not wait), and runs
/// callbacks still queued for process-events. From a callback
/// run by `ndx_context_process_events`, `ndx_context_evaluate` or a wait (process-events
/// mode), the release happens when that call returns, on its thread. In the
/// process-events mode callbacks never run on an ndx worker: a release that does not
/// wait drops the callbacks of work completing after it uncalled (their `user_free`
/// still runs), and one made on an ndx worker (say, from a callback of another
/// context) drops those still queued too. Futures and tensors keep working after
/// their context is gone. In a child forked after the context was made, the release
/// only drops the reference (see `ndx_context_new`). NULL is a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_release(ctx: *const ndx_context_t) {
    boundary_value("ndx_context_release", |_| (), || release(ctx))
}

/// Sets the default eval mode (an `ndx_eval_mode_t`, 1 to 4). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_eval_mode(
    ctx: *const ndx_context_t,
    mode: i32,
) -> *mut ndx_error_t {
    boundary("ndx_context_set_eval_mode", || {
        let mode = eval_mode(mode, "argument 'mode'")?;
        borrow(ctx, "ctx")?.update(|s| s.mode = mode);
        Ok(())
    })
}

/// Sets the capture policy (an `ndx_capture_policy_t`, 1 to 4) and the capture depth
/// (`depth` 0 keeps the current one): the most native return addresses recorded (an
/// inlined function can turn one into several frames) and the `capacity` a frame
/// provider is given. Another `policy` value, or a `depth` above
/// `NDX_MAX_CAPTURE_DEPTH` (1024), is NDX_ERROR_VALUE and changes nothing. Invocations
/// already made keep what they recorded. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_capture_policy(
    ctx: *const ndx_context_t,
    policy: i32,
    depth: u32,
) -> *mut ndx_error_t {
    boundary("ndx_context_set_capture_policy", || {
        let policy = capture_policy(policy, "argument 'policy'")?;
        let depth = capture_depth(depth, "argument 'depth'")?;
        borrow(ctx, "ctx")?.update(|s| {
            s.capture = policy;
            if depth > 0 {
                s.depth = depth;
            }
        });
        Ok(())
    })
}

/// Sets the backend for later invocations: "default"; "noexcept" (every execution
/// failure becomes NDX_ERROR_BACKEND "unexpected error when running OP" with the
/// original as cause, check failures included; an invocation that fails because an
/// input failed is not wrapped again: its own "input N of 'OP' (#S) failed" link takes
/// the kind of its cause, NDX_ERROR_BACKEND, where the default backend gives it the
/// original's kind; alike in every eval mode); "debug" (every invocation is checked
/// after it ran: each output's dtype, shape/rank and layout against the schema — a
/// built-in's inferred metadata, a host operator's `output_dtypes`/`output_ndims`/`output_layouts` — no
/// output sharing an input's memory (host or device addresses) unless the schema has
/// NDX_OP_OUTPUTS_MAY_ALIAS, and every input's bytes unchanged; a violation fails the
/// invocation with NDX_ERROR_BACKEND "debug backend: operator 'OP' ..." at its site;
/// costs a hash of the inputs per call. Invocations on CUDA tensors are checked alike:
/// their device inputs are copied to the host on ndx's stream before and after the
/// run, so each such run waits for its GPU work, in every eval mode); and fault
/// injection for testing error handling:
/// "inject_compile_error:OP" (invocations of OP fail at `ndx_invoke`),
/// "inject_runtime_error:OP" (they fail during execution),
/// "inject_accuracy_error:OP" (their outputs are silently increased by 1). OP must be
/// a built-in or a host operator already registered on `ctx`: any other name is
/// NDX_ERROR_VALUE naming it (with the nearest operator name when one is close), so a
/// misspelt OP cannot leave a test of error handling running without its fault. On
/// failure the previous backend stays. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_backend(
    ctx: *const ndx_context_t,
    name: *const c_char,
) -> *mut ndx_error_t {
    boundary("ndx_context_set_backend", || {
        let backend = Backend::parse(&host_str(name, "name")?)?;
        let ctx = borrow(ctx, "ctx")?;
        backend.check_op(ctx.registry())?;
        ctx.update(|s| s.backend = backend);
        Ok(())
    })
}

/// Registers the host language's frame provider (NULL `provider` removes it). It is
/// called on the invoking thread during `ndx_invoke` when the capture policy is HOST
/// or ALL (see `ndx_frame_provider_t`: which thread, re-entry). Registering one does
/// not change the policy: under the default, NATIVE, it is never called, so a host
/// language that wants its own lines in errors also sets HOST or ALL
/// (`ndx_context_set_capture_policy`). Invocations already made keep the frames they
/// recorded; pending work never calls the provider.
/// `user_free(user)` (if not NULL) is called exactly once, after the last call of
/// `provider`: when the provider is replaced or removed, or the context is released (on
/// the thread of the last `ndx_context_release`, when that release waits for the
/// context's work; else when the context is freed) — or, when an `ndx_invoke` that
/// began before is still running then (on another thread, or on this one from inside
/// the provider or a SYNC invocation's host operator), when the last such call
/// returns, on its thread; at once when `provider` is NULL; and also when this call
/// fails (before it returns).
/// Run for a replaced or removed provider, `user_free` may call ndx, on this context
/// too. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_frame_provider(
    ctx: *const ndx_context_t,
    provider: ndx_frame_provider_t,
    user: *mut c_void,
    user_free: ndx_user_free_t,
) -> *mut ndx_error_t {
    let data = UserData {
        user,
        free: user_free,
    };
    boundary("ndx_context_set_frame_provider", || {
        let ctx = borrow(ctx, "ctx")?;
        let provider = provider.map(|f| {
            let p: crate::exec::FrameProvider =
                Arc::new(move |capacity| host_frames(f, &data, capacity));
            p
        });
        ctx.update(|s| s.provider = provider);
        Ok(())
    })
}

/// A line from the host: one above `INT32_MAX` is a negative "unknown" line (-1)
/// converted to `uint32_t`, not a line of a file, and reads as 0 (unknown).
fn host_line(line: u32) -> u32 {
    if line > i32::MAX as u32 { 0 } else { line }
}

fn host_frames(
    f: unsafe extern "C" fn(*mut c_void, *mut ndx_host_frame_t, usize) -> usize,
    data: &UserData,
    capacity: usize,
) -> Vec<Frame> {
    // The C API refuses larger depths; a Rust caller's setting is bounded here too.
    let capacity = capacity.min(crate::error::MAX_DEPTH);
    let mut buf: Vec<ndx_host_frame_t> = (0..capacity)
        .map(|_| ndx_host_frame_t {
            function: std::ptr::null(),
            file: std::ptr::null(),
            line: 0,
        })
        .collect();
    // SAFETY: the embedder's provider, given `capacity` writable frames.
    let n = unsafe { f(data.user, buf.as_mut_ptr(), capacity) };
    if n > capacity {
        return Vec::new(); // a broken count: none of the frames can be trusted
    }
    let text = |p: *const c_char| {
        // SAFETY: non-NULL strings the provider wrote, valid until it returned (now).
        (!p.is_null()).then(|| {
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    };
    buf[..n]
        .iter()
        .map(|h| {
            Frame::new(
                text(h.function).as_deref(),
                text(h.file).as_deref(),
                host_line(h.line),
                0,
                0,
                FrameOrigin::Host,
            )
        })
        .collect()
}

/// Runs all deferred work of `ctx`, waits for all its in-flight work, and returns
/// NULL, or one NDX_ERROR_RUNTIME error whose related errors are every failure no one
/// has observed yet (through a poll, wait, `ndx_future_error` or reading data) — each
/// reported once. Refused (NDX_ERROR_RUNTIME) from callbacks and host operators.
/// A callback it runs (process-events mode) may release the last reference to `ctx`:
/// the context is then released when this call returns, on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_evaluate(ctx: *const ndx_context_t) -> *mut ndx_error_t {
    // A reference of its own: a callback run here may release the caller's last one.
    boundary("ndx_context_evaluate", || clone_arc(ctx, "ctx")?.evaluate())
}

/// Runs the callbacks and host operators queued for this context (process-events
/// mode) on the calling thread and stores how many ran in `*n_run` (may be NULL; 0
/// when this call fails).
/// A callback it runs may release the last reference to `ctx`: the rest of the queue
/// still runs, and the context is released when this call returns, on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_process_events(
    ctx: *const ndx_context_t,
    n_run: *mut usize,
) -> *mut ndx_error_t {
    // Zero on error too: an out-param is never left with the caller's stale value.
    super::clear_out(n_run, 0);
    boundary("ndx_context_process_events", || {
        // A reference of its own: a callback run here may release the caller's last one.
        let n = clone_arc(ctx, "ctx")?.run_events();
        if !n_run.is_null() {
            // SAFETY: non-NULL out-param.
            unsafe { n_run.write(n) };
        }
        Ok(())
    })
}

/// A new, empty argument builder; free it with `ndx_args_free`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_new(out: *mut *mut ndx_args_t) -> *mut ndx_error_t {
    boundary_out("ndx_args_new", out, std::ptr::null_mut(), || {
        Ok(Box::into_raw(Box::new(Args::new())).cast())
    })
}

/// Frees an argument builder. NULL is a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_free(args: *mut ndx_args_t) {
    boundary_value(
        "ndx_args_free",
        |_| (),
        || {
            if !args.is_null() {
                // SAFETY: made by ndx_args_new and freed once by the caller.
                drop(unsafe { Box::from_raw(args.cast::<Args>()) });
            }
        },
    )
}

fn args_mut<'a>(args: *mut ndx_args_t) -> Result<&'a mut Args> {
    // SAFETY: non-NULL builders come from ndx_args_new; the caller does not share them
    // while changing them (documented).
    unsafe { args.cast::<Args>().as_mut() }.ok_or_else(|| Error::value("argument 'args' is NULL"))
}

fn args_ref<'a>(args: *const ndx_args_t) -> Result<&'a Args> {
    // SAFETY: as for args_mut, read-only.
    unsafe { args.cast::<Args>().as_ref() }.ok_or_else(|| Error::value("argument 'args' is NULL"))
}

fn set_arg(
    args: *mut ndx_args_t,
    name: *const c_char,
    value: impl FnOnce() -> Result<ArgValue>,
) -> Result<()> {
    let name = host_name(name, "name")?;
    let value = value()?;
    args_mut(args)?.set(&name, value);
    Ok(())
}

/// `n` values at `data`, an array argument named `what` whose length is named `n_name`
/// in messages. A length whose byte size passes `isize::MAX` (no array is that large)
/// or a misaligned `data` is refused: `std::slice::from_raw_parts` may not be called
/// on them (debug builds abort there).
fn slice_arg<'a, T>(data: *const T, n: usize, what: &str, n_name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Error::value(format!("{what} is NULL but {n_name} is {n}")));
    }
    let item = std::mem::size_of::<T>();
    if n.checked_mul(item).is_none_or(|b| b > isize::MAX as usize) {
        return Err(Error::value(format!(
            "{what}: {n_name} is {n}, and {n} entries of {item} bytes exceed the address space"
        )));
    }
    if !data.is_aligned() {
        return Err(Error::value(format!(
            "{what} ({data:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    // SAFETY: non-NULL, aligned, and a size that fits; the caller promises `n` values.
    Ok(unsafe { std::slice::from_raw_parts(data, n) })
}

/// Sets integer argument `name` (copied; replacing a previous value of any type).
/// NDX_ERROR_VALUE for a NULL `args` or `name`, or a `name` that is not UTF-8.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_int(
    args: *mut ndx_args_t,
    name: *const c_char,
    value: i64,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_int", || {
        set_arg(args, name, || Ok(ArgValue::Int(value)))
    })
}

/// Sets float argument `name`, like `ndx_args_set_int`. NaN and infinities are kept
/// as given: the operator decides (`clamp` refuses a NaN bound at `ndx_invoke`).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_float(
    args: *mut ndx_args_t,
    name: *const c_char,
    value: f64,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_float", || {
        set_arg(args, name, || Ok(ArgValue::Float(value)))
    })
}

/// Sets boolean argument `name`, like `ndx_args_set_int`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_bool(
    args: *mut ndx_args_t,
    name: *const c_char,
    value: bool,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_bool", || {
        set_arg(args, name, || Ok(ArgValue::Bool(value)))
    })
}

/// Sets string argument `name` to `value` (copied; invalid UTF-8 in `value` is
/// replaced by U+FFFD, which `ndx_args_get_string` then returns), like
/// `ndx_args_set_int`. NDX_ERROR_VALUE for a NULL `value`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_string(
    args: *mut ndx_args_t,
    name: *const c_char,
    value: *const c_char,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_string", || {
        set_arg(args, name, || {
            Ok(ArgValue::Str(crate::error::to_cstring(host_str(
                value, "value",
            )?)))
        })
    })
}

/// Sets integer-array argument `name` from `n` values (copied), like
/// `ndx_args_set_int`. `values` may be NULL when `n` is 0. NDX_ERROR_VALUE for a NULL
/// `values` with `n > 0`, an `n` whose byte size passes the address space, or a
/// `values` not aligned for `int64_t`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_int_array(
    args: *mut ndx_args_t,
    name: *const c_char,
    values: *const i64,
    n: usize,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_int_array", || {
        set_arg(args, name, || {
            Ok(ArgValue::Ints(
                slice_arg(values, n, "argument 'values'", "n")?.to_vec(),
            ))
        })
    })
}

/// Sets float-array argument `name` from `n` values (copied), like
/// `ndx_args_set_int_array`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_float_array(
    args: *mut ndx_args_t,
    name: *const c_char,
    values: *const f64,
    n: usize,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_float_array", || {
        set_arg(args, name, || {
            Ok(ArgValue::Floats(
                slice_arg(values, n, "argument 'values'", "n")?.to_vec(),
            ))
        })
    })
}

/// Sets dtype argument `name` (an `ndx_dtype_t`; another value is NDX_ERROR_VALUE),
/// like `ndx_args_set_int`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_set_dtype(
    args: *mut ndx_args_t,
    name: *const c_char,
    dtype: i32,
) -> *mut ndx_error_t {
    boundary("ndx_args_set_dtype", || {
        set_arg(args, name, || {
            DType::from_raw(dtype).map(ArgValue::DType).ok_or_else(|| {
                Error::value(format!(
                    "argument 'dtype' is {dtype}, not an ndx_dtype_t value (expected 1 to 13)"
                ))
            })
        })
    })
}

fn get_arg<'a>(args: *const ndx_args_t, name: *const c_char) -> Result<&'a ArgValue> {
    let name = host_name(name, "name")?;
    args_ref(args)?
        .get(&name)
        .ok_or_else(|| Error::value(format!("no argument '{name}' was given")))
}

fn wrong_type(name: *const c_char, want: ArgType, got: &ArgValue) -> Error {
    let name = host_str(name, "name").unwrap_or_default();
    Error::type_error(format!(
        "argument '{name}' is {}, not {}",
        got.arg_type().a(),
        want.a()
    ))
}

/// Reads integer argument `name` (NDX_ERROR_VALUE when absent, TYPE when not an int,
/// naming both types). Every getter clears its out-params first, and fails with
/// NDX_ERROR_VALUE for a NULL `args`, `name` or out-param and a `name` that is not
/// UTF-8.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_int(
    args: *const ndx_args_t,
    name: *const c_char,
    out: *mut i64,
) -> *mut ndx_error_t {
    boundary_out("ndx_args_get_int", out, 0, || match get_arg(args, name)? {
        ArgValue::Int(v) => Ok(*v),
        v => Err(wrong_type(name, ArgType::Int, v)),
    })
}

/// Reads float argument `name` (an int converts).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_float(
    args: *const ndx_args_t,
    name: *const c_char,
    out: *mut f64,
) -> *mut ndx_error_t {
    boundary_out("ndx_args_get_float", out, 0.0, || {
        match get_arg(args, name)? {
            ArgValue::Float(v) => Ok(*v),
            ArgValue::Int(v) => Ok(*v as f64),
            v => Err(wrong_type(name, ArgType::Float, v)),
        }
    })
}

/// Reads boolean argument `name`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_bool(
    args: *const ndx_args_t,
    name: *const c_char,
    out: *mut bool,
) -> *mut ndx_error_t {
    boundary_out("ndx_args_get_bool", out, false, || {
        match get_arg(args, name)? {
            ArgValue::Bool(v) => Ok(*v),
            v => Err(wrong_type(name, ArgType::Bool, v)),
        }
    })
}

/// Reads string argument `name`; the string is borrowed from `args`: valid until `args`
/// is freed or `name` is set again.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_string(
    args: *const ndx_args_t,
    name: *const c_char,
    out: *mut *const c_char,
) -> *mut ndx_error_t {
    boundary_out(
        "ndx_args_get_string",
        out,
        std::ptr::null(),
        || match get_arg(args, name)? {
            ArgValue::Str(s) => Ok(s.as_ptr()),
            v => Err(wrong_type(name, ArgType::Str, v)),
        },
    )
}

/// Reads dtype argument `name` (an `ndx_dtype_t`).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_dtype(
    args: *const ndx_args_t,
    name: *const c_char,
    out: *mut i32,
) -> *mut ndx_error_t {
    boundary_out("ndx_args_get_dtype", out, 0, || {
        match get_arg(args, name)? {
            ArgValue::DType(d) => Ok(*d as i32),
            v => Err(wrong_type(name, ArgType::DType, v)),
        }
    })
}

/// Reads integer-array argument `name`: `*values` (borrowed from `args`: valid until
/// `args` is freed or `name` is set again) and `*n`. For an empty array `*n` is 0 and
/// `*values` a non-NULL pointer that must not be read.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_int_array(
    args: *const ndx_args_t,
    name: *const c_char,
    values: *mut *const i64,
    n: *mut usize,
) -> *mut ndx_error_t {
    boundary("ndx_args_get_int_array", || {
        array_out(values, n, || match get_arg(args, name)? {
            ArgValue::Ints(v) => Ok(v.as_slice()),
            v => Err(wrong_type(name, ArgType::Ints, v)),
        })
    })
}

/// Reads float-array argument `name`: `*values` and `*n`, like
/// `ndx_args_get_int_array`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_args_get_float_array(
    args: *const ndx_args_t,
    name: *const c_char,
    values: *mut *const f64,
    n: *mut usize,
) -> *mut ndx_error_t {
    boundary("ndx_args_get_float_array", || {
        array_out(values, n, || match get_arg(args, name)? {
            ArgValue::Floats(v) => Ok(v.as_slice()),
            v => Err(wrong_type(name, ArgType::Floats, v)),
        })
    })
}

/// Writes a borrowed array and its length to two out-params (cleared first).
fn array_out<'a, T: 'a>(
    values: *mut *const T,
    n: *mut usize,
    get: impl FnOnce() -> Result<&'a [T]>,
) -> Result<()> {
    // Each non-NULL out-param is cleared first, even when the other is NULL, so they
    // are never left with stale values.
    if !values.is_null() {
        // SAFETY: a non-NULL out-param the caller gives for writing.
        unsafe { values.write(std::ptr::null()) };
    }
    if !n.is_null() {
        // SAFETY: as above.
        unsafe { n.write(0) };
    }
    if values.is_null() {
        return Err(Error::value("argument 'values' is NULL"));
    }
    if n.is_null() {
        return Err(Error::value("argument 'n' is NULL"));
    }
    let v = get()?;
    // SAFETY: as above.
    unsafe {
        values.write(v.as_ptr());
        n.write(v.len());
    }
    Ok(())
}

fn input_list(inputs: *const ndx_input_t, n: usize) -> Result<Vec<Input>> {
    let entries = slice_arg(inputs, n, "argument 'inputs'", "n_inputs")?;
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| match (e.tensor.is_null(), e.batch.is_null()) {
            (false, true) => Ok(Input::Tensor(clone_arc(e.tensor, "inputs[].tensor")?)),
            (true, false) => Ok(Input::Batch(clone_arc(e.batch, "inputs[].batch")?)),
            (true, true) => Err(Error::value(format!(
                "inputs[{i}] has neither a tensor nor a batch"
            ))),
            (false, false) => Err(Error::value(format!(
                "inputs[{i}] has both a tensor and a batch; set exactly one"
            ))),
        })
        .collect()
}

/// The out tensors of `ndx_invoke_options_t`, which must hold data.
fn output_list(outputs: *const ndx_output_t, n: usize) -> Result<Vec<Option<Data>>> {
    let entries = slice_arg(outputs, n, "opts->outputs", "opts->n_outputs")?;
    let pending = |i: usize, node: Option<&Arc<Node>>, e: Option<&Error>| {
        let (op, seq) = node.map_or(("?", 0), |n| (n.op_name(), n.seq()));
        Error::value(match e {
            None => format!(
                "opts->outputs[{i}] is the output of '{op}' (#{seq}), which is still pending; an out tensor must hold data (wait for it first)"
            ),
            Some(e) => format!(
                "opts->outputs[{i}] is the output of '{op}' (#{seq}), which failed: {}",
                e.message()
            ),
        })
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| match (e.tensor.is_null(), e.batch.is_null()) {
            (true, true) => Ok(None),
            (false, true) => {
                let t = clone_arc(e.tensor, "opts->outputs[].tensor")?;
                match t.ready_data() {
                    Some(Ok(data)) => Ok(Some(Data::Tensor(data.clone()))),
                    Some(Err(err)) => Err(pending(i, t.producer(), Some(&err))),
                    None => Err(pending(i, t.producer(), None)),
                }
            }
            (true, false) => {
                let b = clone_arc(e.batch, "opts->outputs[].batch")?;
                match b.ready_data() {
                    Some(Ok(data)) => Ok(Some(Data::Batch(data.clone()))),
                    Some(Err(err)) => Err(pending(i, b.producer(), Some(&err))),
                    None => Err(pending(i, b.producer(), None)),
                }
            }
            (false, false) => Err(Error::value(format!(
                "opts->outputs[{i}] has both a tensor and a batch; set at most one"
            ))),
        })
        .collect()
}

fn location(loc: &ndx_location_t) -> Option<Frame> {
    if loc.file.is_null() {
        return None;
    }
    let text = |p: *const c_char| {
        // SAFETY: non-NULL C strings from the caller, copied now.
        (!p.is_null()).then(|| {
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    };
    Some(Frame::new(
        text(loc.function).as_deref(),
        text(loc.file).as_deref(),
        host_line(loc.line),
        0,
        0,
        FrameOrigin::Host,
    ))
}

/// Invokes operator `op` on `n_inputs` inputs with named `args` (NULL: none) and
/// options `opts` (NULL: the context's mode, no explicit location, no out tensors);
/// `*out` receives the invocation's future. With out tensors (`opts->outputs`) the
/// results are written into them (see `ndx_output_t`).
///
/// `args` is copied (see `ndx_args_t`). Returns an error only for call-time failures,
/// in every mode: NULL or unknown arguments, an unknown operator (or an `op` that is not
/// UTF-8) or argument, a wrong argument type or input count,
/// input metadata the operator rejects (dtype, shape), an out tensor that does not fit
/// its output, an injected compile error.
/// Failures of the work itself (a kernel error, a failed input) are in the future —
/// already FAILED on return in the SYNC modes. That includes an input from a host
/// operator (which infers no metadata) that fails when this call runs it to learn the
/// dtype and shape a built-in operator needs: the invocation fails in its future with
/// that failure as cause. Every invocation records where it was
/// called from (see `ndx_capture_policy_t`), and its errors carry those frames — its
/// call-time errors too, once `ctx` is valid (a NULL `ctx` or `out` gives native frames).
/// Inputs are borrowed by pending work: do not write into imported buffers until the
/// futures that read them have completed. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_invoke(
    ctx: *const ndx_context_t,
    op: *const c_char,
    inputs: *const ndx_input_t,
    n_inputs: usize,
    args: *const ndx_args_t,
    opts: *const ndx_invoke_options_t,
    out: *mut *mut ndx_future_t,
) -> *mut ndx_error_t {
    let caller_ip = caller_return_address();
    boundary_out("ndx_invoke", out, std::ptr::null_mut(), || {
        let ctx = clone_arc(ctx, "ctx")?;
        let mut call = CallSite {
            location: None,
            caller_ip,
        };
        let parsed = (|| {
            let op = host_name(op, "op")?;
            let inputs = input_list(inputs, n_inputs)?;
            let args = if args.is_null() {
                Args::new()
            } else {
                args_ref(args)?.clone()
            };
            let mut mode = None;
            let mut outputs = Vec::new();
            if !opts.is_null() {
                // Callers built against the header before the out tensors pass less.
                let o = read_options(opts, std::mem::offset_of!(ndx_invoke_options_t, outputs))?;
                call.location = location(&o.location);
                if o.mode != 0 {
                    mode = Some(eval_mode(o.mode, "opts->mode")?);
                }
                outputs = output_list(o.outputs, o.n_outputs)?;
            }
            Ok((op, inputs, args, mode, outputs))
        })();
        let (op, inputs, args, mode, outputs) = match parsed {
            Ok(parsed) => parsed,
            // Refused before the invocation records its site: record it now, so the
            // error names the caller as an invocation's would.
            Err(e) => return Err(ctx.refused_at(e, call)),
        };
        let node = ctx.invoke_into(&op, inputs, args, mode, call, outputs)?;
        Ok(into_handle(node))
    })
}

/// The status of `future`, without blocking: NDX_FUTURE_PENDING, READY or FAILED
/// (FAILED also for a NULL future). The first poll of a DEFERRED invocation hands its
/// graph to the workers. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_poll(future: *const ndx_future_t) -> i32 {
    boundary_value(
        "ndx_future_poll",
        |_| ndx_future_status_t::NDX_FUTURE_FAILED as i32,
        || {
            let Ok(node) = clone_arc(future, "future") else {
                return ndx_future_status_t::NDX_FUTURE_FAILED as i32;
            };
            (match node.poll() {
                Status::Pending => ndx_future_status_t::NDX_FUTURE_PENDING,
                Status::Ready => ndx_future_status_t::NDX_FUTURE_READY,
                Status::Failed => ndx_future_status_t::NDX_FUTURE_FAILED,
            }) as i32
        },
    )
}

/// Waits until `future` completes or `timeout_ns` nanoseconds pass (negative: no
/// limit). Returns NULL when it completed successfully, a new copy of its error when
/// it failed, and NDX_ERROR_TIMEOUT when time ran out (the future stays valid).
/// DEFERRED work is submitted first. Waiting from inside a callback or host operator
/// on a future that has not completed returns NDX_ERROR_RUNTIME instead of
/// deadlocking (on a complete one, such as the callback's own, it returns as above).
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_wait(
    future: *const ndx_future_t,
    timeout_ns: i64,
) -> *mut ndx_error_t {
    boundary("ndx_future_wait", || {
        let node = clone_arc(future, "future")?;
        let timeout = (timeout_ns >= 0).then(|| Duration::from_nanos(timeout_ns as u64));
        node.wait(timeout)?;
        match node.result() {
            Some(Err(e)) => Err(e.clone()),
            _ => Ok(()),
        }
    })
}

/// A new copy of the future's error when it FAILED, else NULL (pending or ready).
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_error(future: *const ndx_future_t) -> *mut ndx_error_t {
    boundary_value("ndx_future_error", error_into_raw, || {
        match borrow(future, "future") {
            Ok(node) => match node.result() {
                Some(Err(e)) => error_into_raw(e.clone()),
                _ => std::ptr::null_mut(),
            },
            Err(e) => error_into_raw(e),
        }
    })
}

/// The number of outputs of the invocation.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_output_count(
    future: *const ndx_future_t,
    out: *mut usize,
) -> *mut ndx_error_t {
    boundary_out("ndx_future_output_count", out, 0, || {
        Ok(borrow(future, "future")?.out_meta().len())
    })
}

/// Output `index` as a new tensor reference, usable at once as an input of further
/// invocations even while pending; reading its data waits for it. Its dtype and shape
/// are known without running it (except for host operators). NDX_ERROR_TYPE when
/// the output is a batch, NDX_ERROR_INDEX when out of range.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_tensor(
    future: *const ndx_future_t,
    index: usize,
    out: *mut *mut ndx_tensor_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_future_tensor", out, std::ptr::null_mut(), || {
        let node = clone_arc(future, "future")?;
        Ok(into_handle(Arc::new(output_tensor(&node, index)?)))
    })
}

/// Output `index` as a new batch reference, usable at once as an input of further
/// invocations even while pending (see `ndx_batch_t` for its accessors). Outputs are
/// batches when an input of the invocation was a batch (the operator ran once per
/// sample; `batch_to_tensor`, which stacks one, makes a tensor). NDX_ERROR_TYPE when
/// the output is a tensor, NDX_ERROR_INDEX when out of range. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_batch(
    future: *const ndx_future_t,
    index: usize,
    out: *mut *mut ndx_batch_t,
) -> *mut ndx_error_t {
    boundary_out("ndx_future_batch", out, std::ptr::null_mut(), || {
        let node = clone_arc(future, "future")?;
        Ok(into_handle(Arc::new(output_batch(&node, index)?)))
    })
}

/// Calls `callback(user, future)` exactly once when the future completes: on the ndx
/// worker thread that completes it, at once on this thread if it is already complete
/// (but never more than one such callback deep: one registered on a complete future
/// inside another that runs so runs once that one returns, so a loop whose callbacks
/// each register its next step on a complete future runs flat), or — with `process_events_callbacks` — inside
/// `ndx_context_process_events` or a wait, never on a worker (so a process-events
/// callback is dropped uncalled when its context is released from a callback, a host
/// operator or a worker before it could run: see `ndx_context_release`). Then `user_free(user)` if not NULL: it is called
/// exactly once in every case, also when this call fails (before it returns; NULL
/// future or callback). The callback may call ndx (poll, read errors and outputs,
/// invoke, wait on a complete future such as its own) but must not wait for work:
/// waits there on a future not complete return NDX_ERROR_RUNTIME. Registering on a
/// DEFERRED future hands its graph to the workers, like a poll: a callback waits for
/// nothing else. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_on_ready(
    future: *const ndx_future_t,
    callback: ndx_future_callback_t,
    user: *mut c_void,
    user_free: ndx_user_free_t,
) -> *mut ndx_error_t {
    let data = UserData {
        user,
        free: user_free,
    };
    boundary("ndx_future_on_ready", || {
        let node = clone_arc(future, "future")?;
        let cb = callback.ok_or_else(|| Error::value("argument 'callback' is NULL"))?;
        node.on_ready(Box::new(move |n| {
            let raw = Arc::as_ptr(n).cast::<ndx_future_t>();
            // SAFETY: the embedder's callback, with the future borrowed for the call.
            unsafe { cb(data.user, raw) };
            drop(data);
        }));
        Ok(())
    })
}

/// Cancels the invocation if it has not started: it fails with NDX_ERROR_CANCELLED
/// (and invocations that use its outputs fail with it as their cause).
/// `*cancelled` says whether it was cancelled (false when running or done). A
/// cancelled invocation counts as observed: `ndx_context_evaluate` does not report
/// it, but does report the unobserved invocations that failed with it as cause.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_cancel(
    future: *const ndx_future_t,
    cancelled: *mut bool,
) -> *mut ndx_error_t {
    boundary("ndx_future_cancel", || {
        if cancelled.is_null() {
            return Err(Error::value("argument 'cancelled' is NULL"));
        }
        out_param(cancelled, false, || {
            Ok(clone_arc(future, "future")?.cancel("ndx_future_cancel was called"))
        })
    })
}

/// Adds a reference to `future`. NDX_ERROR_VALUE for NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_retain(future: *const ndx_future_t) -> *mut ndx_error_t {
    boundary("ndx_future_retain", || {
        std::mem::forget(clone_arc(future, "future")?);
        Ok(())
    })
}

/// Drops a reference to `future`. Releasing a pending future never cancels its work;
/// a failure nobody observed is reported by `ndx_context_evaluate`. NULL is a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_future_release(future: *const ndx_future_t) {
    boundary_value("ndx_future_release", |_| (), || release(future))
}

struct CKernel {
    f: unsafe extern "C" fn(
        *mut c_void,
        *const *const ndx_tensor_t,
        usize,
        *const ndx_args_t,
        *mut *mut ndx_tensor_t,
        usize,
    ) -> *mut ndx_error_t,
    /// `None` once released; read-locked for the duration of each call.
    data: parking_lot::RwLock<Option<UserData>>,
    name: String,
    contract: Contract,
}

/// The output promises of a full-size schema.
fn schema_contract(s: &ndx_op_schema_t) -> Result<Contract> {
    let n = s.n_outputs;
    // Each is optional (NULL: not declared), so never NULL here.
    let optional = |p: *const i32, what: &str| {
        (!p.is_null())
            .then(|| slice_arg(p, n, what, "schema->n_outputs"))
            .transpose()
    };
    let dtypes = optional(s.output_dtypes, "schema->output_dtypes")?;
    let ndims = optional(s.output_ndims, "schema->output_ndims")?;
    let layouts = (!s.output_layouts.is_null())
        .then(|| {
            slice_arg(
                s.output_layouts,
                n,
                "schema->output_layouts",
                "schema->n_outputs",
            )
        })
        .transpose()?;
    if s.flags & !(ndx_op_flags_t::NDX_OP_OUTPUTS_MAY_ALIAS as u32) != 0 {
        return Err(Error::value(format!(
            "schema->flags is {:#x}: unknown ndx_op_flags_t bits",
            s.flags
        )));
    }
    let outputs = (0..n)
        .map(|i| {
            let dtype = match dtypes.map(|d| d[i]) {
                None | Some(-1) => None,
                Some(raw) => Some(DType::from_raw(raw).ok_or_else(|| {
                    Error::value(format!(
                        "schema->output_dtypes[{i}] is {raw}, not an ndx_dtype_t value or -1"
                    ))
                })?),
            };
            let ndim = match ndims.map(|d| d[i]) {
                None | Some(-1) => None,
                Some(raw) if raw >= 0 => Some(raw as usize),
                Some(raw) => {
                    return Err(Error::value(format!(
                        "schema->output_ndims[{i}] is {raw}: a rank, or -1 for any"
                    )));
                }
            };
            let layout = match layouts.map(|l| l[i]) {
                Some(p) if !p.is_null() => Some(host_str(p, "schema->output_layouts[]")?),
                _ => None,
            };
            Ok(OutDecl {
                dtype,
                ndim,
                layout,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Contract {
        outputs,
        may_alias: s.flags & ndx_op_flags_t::NDX_OP_OUTPUTS_MAY_ALIAS as u32 != 0,
    })
}

impl HostKernel for CKernel {
    fn release(&self) {
        drop(self.data.write().take());
    }

    fn contract(&self) -> Contract {
        self.contract.clone()
    }

    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        args: &Args,
        n_outputs: usize,
    ) -> Result<Vec<Arc<Tensor>>> {
        let data = self.data.read();
        let Some(data) = data.as_ref() else {
            return Err(Error::new(
                crate::error::ErrorKind::Runtime,
                format!(
                    "host operator '{}' was released with its context",
                    self.name
                ),
            ));
        };
        let handles: Vec<*mut ndx_tensor_t> = inputs
            .iter()
            .map(|t| into_handle(Arc::new(TensorRef::ready(t.clone()))))
            .collect();
        let mut outputs: Vec<*mut ndx_tensor_t> = vec![std::ptr::null_mut(); n_outputs];
        let args_ptr = (args as *const Args).cast::<ndx_args_t>();
        // SAFETY: the embedder's kernel with borrowed inputs and writable output slots.
        let (err, made_async) = crate::exec::in_kernel_scope(|| unsafe {
            (self.f)(
                data.user,
                // NULL for no inputs, not a dangling non-NULL pointer.
                if handles.is_empty() {
                    std::ptr::null()
                } else {
                    handles.as_ptr().cast()
                },
                handles.len(),
                args_ptr,
                outputs.as_mut_ptr(),
                n_outputs,
            )
        });
        let short = self.short_references(&handles, &outputs);
        for h in handles {
            if !short.iter().any(|s| s.handle == h) {
                release(h.cast_const());
            }
        }
        // One too few references: every one that exists is let go of, none taken.
        for s in &short {
            for _ in 0..s.have {
                release(s.handle.cast_const());
            }
        }
        let taken: Vec<Option<Arc<TensorRef>>> = outputs
            .iter()
            .map(|&p| {
                (!p.is_null() && !short.iter().any(|s| s.handle == p)).then(|| {
                    // SAFETY: a new reference the kernel handed over.
                    unsafe { Arc::from_raw(p.cast_const().cast::<TensorRef>()) }
                })
            })
            .collect();
        if !err.is_null() {
            // SAFETY: an owned error the kernel returned.
            return Err(*unsafe { Box::from_raw(err.cast::<Error>()) });
        }
        if let Some(s) = short.first() {
            return Err(Error::new(
                crate::error::ErrorKind::Backend,
                s.message.clone(),
            ));
        }
        taken
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let t = t.ok_or_else(|| {
                    Error::new(
                        crate::error::ErrorKind::Backend,
                        format!(
                            "host operator '{}' returned no error but left outputs[{i}] NULL",
                            self.name
                        ),
                    )
                })?;
                // The output of a DEFERRED or EAGER invocation the kernel made is
                // refused even when it has completed by now: that is a matter of
                // timing, and the same kernel must fail alike in every run and mode.
                let made_here = |up: &Arc<crate::exec::Node>| {
                    made_async
                        .iter()
                        .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(up)))
                };
                if let Some(up) = t.producer().filter(|up| !up.is_done() || made_here(up)) {
                    let state = if made_here(up) {
                        let mode = match up.mode() {
                            crate::exec::EvalMode::Deferred => "NDX_EVAL_DEFERRED",
                            _ => "NDX_EVAL_EAGER",
                        };
                        format!("which it invoked in {mode} (complete or not when it returned)")
                    } else {
                        "which is still pending".to_string()
                    };
                    return Err(Error::new(
                        crate::error::ErrorKind::Backend,
                        format!(
                            "host operator '{}' returned as outputs[{i}] the output of '{}' \
                             (#{}), {state}; a kernel's outputs must hold data \
                             (invoke with NDX_EVAL_SYNC_CPU inside a kernel)",
                            self.name,
                            up.op_name(),
                            up.seq()
                        ),
                    ));
                }
                t.resolve().cloned()
            })
            .collect()
    }
}

/// A handle a host kernel put in its output slots with fewer references than it
/// handed over there (plus ndx's own, for an input handle): taking them all would free
/// it while still in use.
struct ShortReference {
    handle: *mut ndx_tensor_t,
    /// The references that exist.
    have: usize,
    message: String,
}

impl CKernel {
    /// The output handles the kernel did not give a reference each (an input returned
    /// without `ndx_tensor_retain`, one tensor in two slots with one reference), each
    /// once, first by output slot. Where the host kept more references elsewhere it
    /// goes unnoticed (nothing tells them apart).
    fn short_references(
        &self,
        inputs: &[*mut ndx_tensor_t],
        outputs: &[*mut ndx_tensor_t],
    ) -> Vec<ShortReference> {
        let mut short: Vec<ShortReference> = Vec::new();
        for (i, &p) in outputs.iter().enumerate() {
            if p.is_null() || short.iter().any(|s| s.handle == p) {
                continue;
            }
            let slots: Vec<usize> = (i..outputs.len()).filter(|&k| outputs[k] == p).collect();
            let input = inputs.iter().position(|&h| h == p);
            let needed = slots.len() + usize::from(input.is_some());
            // SAFETY: a handle the kernel returned, alive: it holds at least one
            // reference (its own or ndx's input reference); the count is only read.
            let have = Arc::strong_count(&std::mem::ManuallyDrop::new(unsafe {
                Arc::from_raw(p.cast_const().cast::<TensorRef>())
            }));
            if have >= needed {
                continue;
            }
            let what = match (input, slots.as_slice()) {
                (Some(k), [_]) => format!(
                    "returned inputs[{k}] as outputs[{i}] without a reference of its own \
                     (call ndx_tensor_retain on an input it returns)"
                ),
                (_, slots) => format!(
                    "put one tensor in {} with {} reference{} for them{}",
                    slots
                        .iter()
                        .map(|k| format!("outputs[{k}]"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    have - usize::from(input.is_some()),
                    if have - usize::from(input.is_some()) == 1 {
                        ""
                    } else {
                        "s"
                    },
                    match input {
                        Some(k) => format!(" (it is inputs[{k}])"),
                        None => String::new(),
                    }
                ),
            };
            short.push(ShortReference {
                handle: p,
                have,
                message: format!(
                    "host operator '{}' {what}: every output slot needs a new reference",
                    self.name
                ),
            });
        }
        short
    }
}

/// Registers host operator `name` on `ctx`: `kernel(user, ...)` computes it (see
/// `ndx_kernel_fn_t`) on a worker thread, or inside process-events. Its outputs are
/// tensors (batches when an input is a batch: the kernel runs once per sample), whose
/// metadata is known only after it ran. With the NDX_CHECK_NAN category on, its float
/// outputs are scanned like a built-in's: NaN or an infinity from finite float inputs
/// raises a flag at the invocation's site. `user_free(user)` runs once when the context
/// is released (after its running work finished), or later when the last invocation
/// of the operator is gone if the context was released from a callback or host
/// operator; it is called exactly once, also when this call fails (before it returns).
/// NDX_ERROR_VALUE when the name is taken or not UTF-8, or the schema is invalid
/// (argument names must be distinct and UTF-8).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_register_op(
    ctx: *const ndx_context_t,
    name: *const c_char,
    schema: *const ndx_op_schema_t,
    kernel: ndx_kernel_fn_t,
    user: *mut c_void,
    user_free: ndx_user_free_t,
) -> *mut ndx_error_t {
    let data = UserData {
        user,
        free: user_free,
    };
    boundary("ndx_register_op", || {
        let ctx = borrow(ctx, "ctx")?;
        let name = host_name(name, "name")?;
        let f = kernel.ok_or_else(|| Error::value("argument 'kernel' is NULL"))?;
        if schema.is_null() {
            return Err(Error::value("argument 'schema' is NULL"));
        }
        // SAFETY: non-NULL; struct_size is read first.
        let size = unsafe { (*schema).struct_size };
        // The output promises and flags came later: a schema may end before them.
        size_check(
            size,
            std::mem::offset_of!(ndx_op_schema_t, output_dtypes),
            std::mem::size_of::<ndx_op_schema_t>(),
            "schema",
            "ndx_op_schema_t",
        )?;
        let full = size >= std::mem::size_of::<ndx_op_schema_t>();
        // SAFETY: at least as large as the fields read below (`full` guards the rest).
        let s = unsafe { &*schema };
        // The two largest values mark ndx's own variadic and whole-batch operators: an
        // operator registered with one would take any number of inputs.
        if s.n_inputs >= crate::ops::SAMPLES {
            return Err(Error::value(format!(
                "schema->n_inputs is SIZE_MAX{}: give the exact number of inputs",
                match usize::MAX - s.n_inputs {
                    0 => String::new(),
                    k => format!(" - {k}"),
                }
            )));
        }
        if s.n_outputs == 0 {
            return Err(Error::value(
                "schema->n_outputs is 0: an operator needs at least one output",
            ));
        }
        let names = slice_arg(s.arg_names, s.n_args, "schema->arg_names", "schema->n_args")?;
        let types = slice_arg(s.arg_types, s.n_args, "schema->arg_types", "schema->n_args")?;
        let args = names
            .iter()
            .zip(types)
            .enumerate()
            .map(|(i, (&n, &t))| {
                Ok(crate::ops::ArgSpec {
                    name: host_name(n, &format!("schema->arg_names[{i}]"))?,
                    ty: ArgType::from_raw(t).ok_or_else(|| {
                        Error::value(format!(
                            "schema->arg_types[{i}] is {t}, not an ndx_arg_type_t value"
                        ))
                    })?,
                    required: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut seen = std::collections::HashMap::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            if let Some(first) = seen.insert(a.name.as_str(), i) {
                return Err(Error::value(format!(
                    "schema->arg_names[{first}] and schema->arg_names[{i}] are both \"{}\": \
                     argument names must be distinct",
                    a.name
                )));
            }
        }
        let contract = if full {
            schema_contract(s)?
        } else {
            Contract::default()
        };
        ctx.registry().register(OpDef {
            name: name.clone(),
            n_inputs: s.n_inputs,
            n_outputs: s.n_outputs,
            args,
            infer: None,
            kernel: Kernel::Host(Arc::new(CKernel {
                f,
                data: parking_lot::RwLock::new(Some(data)),
                name,
                contract,
            })),
        })
    })
}
