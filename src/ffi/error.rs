//! `ndx_error_t`: errors are owned values (NULL means success). Messages, frames,
//! causes and related errors are borrowed from the error that holds them.

use std::ffi::c_char;

use super::{boundary, boundary_value, host_str};
use crate::error::{Error, ErrorKind, FrameOrigin};

/// An error: kind, original message, capture-site frames, cause chain and related
/// errors. An owned value: free it with `ndx_error_free`; copy it with
/// `ndx_error_clone`. Not reference counted. Reading one error from several threads
/// is safe; freeing it while another thread reads it is not.
pub struct ndx_error_t {
    _private: [u8; 0],
}

/// Error kinds, named after the Python exceptions an embedder should raise
/// (`ndx_error_kind_name`). Values are never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_error_kind_t {
    /// A bad argument value ("ValueError").
    NDX_ERROR_VALUE = 1,
    /// A value of the wrong type, such as an unsupported dtype ("TypeError").
    NDX_ERROR_TYPE = 2,
    /// An index out of range ("IndexError").
    NDX_ERROR_INDEX = 3,
    /// A failure of the work itself ("RuntimeError").
    NDX_ERROR_RUNTIME = 4,
    /// Memory could not be allocated ("MemoryError").
    NDX_ERROR_MEMORY = 5,
    /// The operation is not available for these inputs ("NotImplementedError").
    NDX_ERROR_NOT_IMPLEMENTED = 6,
    /// A CUDA driver failure ("CudaError").
    NDX_ERROR_CUDA = 7,
    /// A wait ran out of time ("TimeoutError").
    NDX_ERROR_TIMEOUT = 8,
    /// Work was cancelled before it ran ("CancelledError").
    NDX_ERROR_CANCELLED = 9,
    /// One or more checks failed ("CheckError").
    NDX_ERROR_CHECK = 10,
    /// A debug backend reports a failure ("BackendError").
    NDX_ERROR_BACKEND = 11,
    /// A bug in ndx, such as a caught panic ("InternalError").
    NDX_ERROR_INTERNAL = 12,
}

impl From<ErrorKind> for ndx_error_kind_t {
    fn from(kind: ErrorKind) -> Self {
        use ndx_error_kind_t::*;
        match kind {
            ErrorKind::Value => NDX_ERROR_VALUE,
            ErrorKind::Type => NDX_ERROR_TYPE,
            ErrorKind::Index => NDX_ERROR_INDEX,
            ErrorKind::Runtime => NDX_ERROR_RUNTIME,
            ErrorKind::Memory => NDX_ERROR_MEMORY,
            ErrorKind::NotImplemented => NDX_ERROR_NOT_IMPLEMENTED,
            ErrorKind::Cuda => NDX_ERROR_CUDA,
            ErrorKind::Timeout => NDX_ERROR_TIMEOUT,
            ErrorKind::Cancelled => NDX_ERROR_CANCELLED,
            ErrorKind::Check => NDX_ERROR_CHECK,
            ErrorKind::Backend => NDX_ERROR_BACKEND,
            ErrorKind::Internal => NDX_ERROR_INTERNAL,
        }
    }
}

/// Who supplied a frame.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_frame_origin_t {
    /// A frame of the native stack (C, C++, Rust), captured by ndx.
    NDX_FRAME_NATIVE = 1,
    /// A frame supplied by the caller: a frame provider's host-language frame (a
    /// Python frame, say) or an explicit location (`NDX_HERE`).
    NDX_FRAME_HOST = 2,
}

/// One frame of an error's capture site. Set `struct_size = sizeof(ndx_frame_t)`
/// before calling `ndx_error_frame`; fields may be appended in later versions, and ndx
/// writes only the fields that fit in `struct_size`.
#[repr(C)]
pub struct ndx_frame_t {
    /// Set by the caller to `sizeof(ndx_frame_t)`.
    pub struct_size: usize,
    /// The function name (demangled), or NULL when unknown. Borrowed from the error.
    pub function: *const c_char,
    /// The source file as recorded in the debug information, or NULL when unknown.
    /// Borrowed from the error.
    pub file: *const c_char,
    /// 1-based line, 0 when unknown.
    pub line: u32,
    /// 1-based column, 0 when unknown.
    pub column: u32,
    /// The native return address of the frame, 0 for host frames.
    pub ip: usize,
    /// Who supplied the frame.
    pub origin: ndx_frame_origin_t,
}

pub(crate) fn error_into_raw(e: Error) -> *mut ndx_error_t {
    Box::into_raw(Box::new(e)).cast()
}

pub(crate) fn error_ref<'a>(e: *const ndx_error_t) -> Option<&'a Error> {
    // SAFETY: a non-NULL error pointer was made by `error_into_raw` (or borrowed from
    // one) and stays valid until the caller frees its owner (API contract).
    unsafe { e.cast::<Error>().as_ref() }
}

fn as_c(e: &Error) -> *const ndx_error_t {
    (e as *const Error).cast()
}

/// The kind of `error` (an `ndx_error_kind_t` value), or 0 when `error` is NULL
/// (no error).
///
/// Thread-safe; borrows `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_kind(error: *const ndx_error_t) -> i32 {
    boundary_value(
        "ndx_error_kind",
        |_| ndx_error_kind_t::NDX_ERROR_INTERNAL as i32,
        || error_ref(error).map_or(0, |e| ndx_error_kind_t::from(e.kind()) as i32),
    )
}

/// The exception name of an error kind: "ValueError", "TypeError", "IndexError",
/// "RuntimeError", "MemoryError", "NotImplementedError", "CudaError", "TimeoutError",
/// "CancelledError", "CheckError", "BackendError", "InternalError"; NULL for a value
/// that is not a kind.
///
/// Thread-safe; the string is static.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_kind_name(kind: i32) -> *const c_char {
    boundary_value(
        "ndx_error_kind_name",
        |_| std::ptr::null(),
        || ErrorKind::from_raw(kind).map_or(std::ptr::null(), |k| k.c_name().as_ptr()),
    )
}

/// The original message of `error`, unchanged; NULL when `error` is NULL.
///
/// The string is borrowed from `error` and lives until it is freed.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_message(error: *const ndx_error_t) -> *const c_char {
    boundary_value(
        "ndx_error_message",
        |_| std::ptr::null(),
        || error_ref(error).map_or(std::ptr::null(), |e| e.c_message().as_ptr()),
    )
}

/// Number of frames of the site that asked for the failing work (0 when there is no
/// site or `error` is NULL). The first call symbolises the frames (milliseconds the
/// first time in a process); later calls are cheap.
///
/// Thread-safe; borrows `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_frame_count(error: *const ndx_error_t) -> usize {
    boundary_value(
        "ndx_error_frame_count",
        |_| 0,
        || error_ref(error).map_or(0, |e| e.frames().len()),
    )
}

/// Frame `index` of the capture site. Frame 0 is the innermost: the line that called
/// into ndx (for an invocation, the line that called `ndx_invoke`; for an error made
/// with `ndx_error_new` or a failed call, the caller of that function); higher
/// indices walk outwards to `main`. Frames inside ndx and the Rust runtime are left
/// out. `ndx_error_format` prints them the other way round, like Python.
///
/// `out->struct_size` must be set; the strings in `*out` are borrowed from `error`.
/// Fails with NDX_ERROR_VALUE for NULL arguments or a `struct_size` that is too small,
/// and NDX_ERROR_INDEX when `index >= ndx_error_frame_count(error)`; on failure with a
/// usable `out` (non-NULL, `struct_size` large enough) every field after `struct_size`
/// is zeroed (NULL strings, line 0), never left as it was.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_frame(
    error: *const ndx_error_t,
    index: usize,
    out: *mut ndx_frame_t,
) -> *mut ndx_error_t {
    boundary("ndx_error_frame", || {
        super::write_sized(out, "ndx_frame_t", |struct_size| {
            let e = error_ref(error).ok_or_else(|| Error::value("argument 'error' is NULL"))?;
            let frames = e.frames();
            let f = frames.get(index).ok_or_else(|| {
                Error::index(format!(
                    "frame index {index} is out of range: the error has {} frame{}",
                    frames.len(),
                    if frames.len() == 1 { "" } else { "s" }
                ))
            })?;
            Ok(ndx_frame_t {
                struct_size,
                function: f.c_function().map_or(std::ptr::null(), |c| c.as_ptr()),
                file: f.c_file().map_or(std::ptr::null(), |c| c.as_ptr()),
                line: f.line(),
                column: f.column(),
                ip: f.ip(),
                origin: match f.origin() {
                    FrameOrigin::Native => ndx_frame_origin_t::NDX_FRAME_NATIVE,
                    FrameOrigin::Host => ndx_frame_origin_t::NDX_FRAME_HOST,
                },
            })
        })
    })
}

/// The direct cause of `error`, or NULL. Borrowed: valid as long as `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_cause(error: *const ndx_error_t) -> *const ndx_error_t {
    boundary_value(
        "ndx_error_cause",
        |_| std::ptr::null(),
        || {
            error_ref(error)
                .and_then(Error::cause)
                .map_or(std::ptr::null(), as_c)
        },
    )
}

/// Number of related errors (an error made of several, like Python's
/// ExceptionGroup); 0 when none or `error` is NULL.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_related_count(error: *const ndx_error_t) -> usize {
    boundary_value(
        "ndx_error_related_count",
        |_| 0,
        || error_ref(error).map_or(0, |e| e.related().len()),
    )
}

/// Related error `index`, or NULL when out of range. Borrowed: valid as long as
/// `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_related(error: *const ndx_error_t, index: usize) -> *const ndx_error_t {
    boundary_value(
        "ndx_error_related",
        |_| std::ptr::null(),
        || {
            error_ref(error)
                .and_then(|e| e.related().get(index))
                .map_or(std::ptr::null(), as_c)
        },
    )
}

/// The operator whose invocation failed, or NULL when the error did not come from an
/// invocation. Borrowed: valid as long as `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_op(error: *const ndx_error_t) -> *const c_char {
    boundary_value(
        "ndx_error_op",
        |_| std::ptr::null(),
        || {
            error_ref(error)
                .and_then(Error::c_op)
                .map_or(std::ptr::null(), |c| c.as_ptr())
        },
    )
}

/// The sequence number (1, 2, ... per context) of the invocation that failed, or 0
/// when the error did not come from an invocation.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_sequence(error: *const ndx_error_t) -> u64 {
    boundary_value(
        "ndx_error_sequence",
        |_| 0,
        || error_ref(error).and_then(Error::sequence).unwrap_or(0),
    )
}

/// The batch sample whose run failed, when the error is the failure of one run of a
/// per-sample invocation (an input was a batch: the operator ran once per sample), or
/// -1 (also for NULL). A check flag raised on a sample carries it too. The message is
/// the kernel's own, unchanged; the traceback of `ndx_error_format` names the sample
/// ("in invocation #3 of operator 'div', batch sample 7"). Under the `noexcept`
/// backend the BACKEND error and its cause both carry it; an invocation that failed
/// because such an input failed has it on that cause link, not on its own. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_sample(error: *const ndx_error_t) -> i64 {
    boundary_value(
        "ndx_error_sample",
        |_| -1,
        || {
            error_ref(error)
                .and_then(Error::sample)
                .map_or(-1, |s| s as i64)
        },
    )
}

/// Writes the whole chain as a Python-style traceback into `buf` (at most `cap`
/// bytes, always NUL-terminated when `cap > 0`) and returns the length the full text
/// needs, without the NUL — like `snprintf`: call with `cap = 0` to size a buffer.
/// The root cause comes first; links are joined by "The above exception was the
/// direct cause of the following exception:"; each link's frames print outermost
/// first ("most recent call last"). A chain of more than 64 links (a failure passed
/// down a long pipeline) prints the 32 links nearest its root cause and the 32
/// outermost, with a line saying how many it left out (`ndx_error_cause` walks them
/// all). Related errors print nested, as Python prints an exception group: the first
/// 15, then a line counting the rest (`ndx_error_related` reads them all). A NULL
/// `error` gives the empty text (returns 0,
/// and writes the NUL when `cap > 0`).
///
/// Thread-safe; borrows `error`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_format(
    error: *const ndx_error_t,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    boundary_value(
        "ndx_error_format",
        |_| write_text("", buf, cap),
        || {
            let text = error_ref(error).map_or_else(String::new, |e| e.traceback());
            write_text(&text, buf, cap)
        },
    )
}

/// snprintf-like copy of `text` into a C buffer; returns the full length. A cut text
/// ends on a character boundary, so what the caller reads is valid UTF-8.
pub(crate) fn write_text(text: &str, buf: *mut c_char, cap: usize) -> usize {
    if !buf.is_null() && cap > 0 {
        let mut n = text.len().min(cap - 1);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: the caller gives `cap` writable bytes at `buf`; we write n + 1 <= cap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// A new error for host code (custom operators, embedders): `kind` (an
/// `ndx_error_kind_t` value), `message` (copied; invalid UTF-8 is replaced) and an
/// optional `cause`, whose ownership passes to the new error in every case. The new
/// error's site is the caller of `ndx_error_new` (up to 16 native frames).
///
/// Never returns NULL: when `kind` is not a kind or `message` is NULL, the result is
/// an NDX_ERROR_VALUE error saying so (still carrying `cause`). Free the result with
/// `ndx_error_free`. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_new(
    kind: i32,
    message: *const c_char,
    cause: *mut ndx_error_t,
) -> *mut ndx_error_t {
    // Take the cause first so it is owned (and freed) on every path.
    let cause = (!cause.is_null()).then(|| {
        // SAFETY: a non-NULL error made by ndx, whose ownership the caller gives up.
        *unsafe { Box::from_raw(cause.cast::<Error>()) }
    });
    boundary("ndx_error_new", || {
        let made = match (ErrorKind::from_raw(kind), host_str(message, "message")) {
            (Some(kind), Ok(msg)) => Error::new(kind, msg),
            (None, _) => Error::value(format!(
                "ndx_error_new: kind {kind} is not an ndx_error_kind_t value (expected 1 to {})",
                ErrorKind::ALL.len()
            )),
            (Some(_), Err(e)) => Error::value(format!("ndx_error_new: {}", e.message())),
        };
        Err(match cause {
            Some(c) => made.with_cause(c),
            None => made,
        })
    })
}

/// An independent owned copy of `error` (its chain and related errors included);
/// NULL for NULL. Thread-safe; free the copy with `ndx_error_free`.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_clone(error: *const ndx_error_t) -> *mut ndx_error_t {
    boundary_value(
        "ndx_error_clone",
        |_| std::ptr::null_mut(),
        || error_ref(error).map_or(std::ptr::null_mut(), |e| error_into_raw(e.clone())),
    )
}

/// Frees an error returned by ndx (with its causes and related errors). NULL is a
/// no-op. Never pass a borrowed error (from `ndx_error_cause`/`ndx_error_related`).
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_free(error: *mut ndx_error_t) {
    boundary_value(
        "ndx_error_free",
        |_| (),
        || {
            if !error.is_null() {
                // SAFETY: an owned error made by `error_into_raw`, freed once by the caller.
                drop(unsafe { Box::from_raw(error.cast::<Error>()) });
            }
        },
    )
}
