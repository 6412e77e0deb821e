//! The one error type of ndx: a kind, the original message, the site that asked for the
//! failing work, the chain of causes and, for groups, the related errors.

mod format;
pub(crate) mod site;

pub(crate) use site::EntryGuard;
pub use site::{DEFAULT_DEPTH, Frame, FrameOrigin, MAX_DEPTH, Site};

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

/// A byte count for messages: `1.50 GiB (1610612736 bytes)`, or `512 bytes`.
pub(crate) fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if unit == "bytes" {
        format!("{bytes} bytes")
    } else {
        format!("{v:.2} {unit} ({bytes} bytes)")
    }
}

/// What went wrong, named after the Python exception an embedder should raise.
///
/// The discriminants are the C ABI values (`NDX_ERROR_*`); they are never renumbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    /// A bad argument value (NULL pointer, negative size, unknown name).
    Value = 1,
    /// A value of the wrong type (dtype, argument type).
    Type = 2,
    /// An index out of range.
    Index = 3,
    /// A failure of the work itself that fits no other kind.
    Runtime = 4,
    /// Memory could not be allocated.
    Memory = 5,
    /// The operation exists but not for these inputs.
    NotImplemented = 6,
    /// A CUDA driver failure.
    Cuda = 7,
    /// A wait ran out of time.
    Timeout = 8,
    /// The work was cancelled before it ran.
    Cancelled = 9,
    /// One or more checks (error flags) failed.
    Check = 10,
    /// A debug backend reports a failure.
    Backend = 11,
    /// A bug in ndx (for example a caught panic).
    Internal = 12,
}

impl ErrorKind {
    /// Every kind, in ABI order.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::Value,
        ErrorKind::Type,
        ErrorKind::Index,
        ErrorKind::Runtime,
        ErrorKind::Memory,
        ErrorKind::NotImplemented,
        ErrorKind::Cuda,
        ErrorKind::Timeout,
        ErrorKind::Cancelled,
        ErrorKind::Check,
        ErrorKind::Backend,
        ErrorKind::Internal,
    ];

    /// The kind with ABI value `raw`, if there is one.
    pub fn from_raw(raw: i32) -> Option<ErrorKind> {
        ErrorKind::ALL.iter().copied().find(|k| *k as i32 == raw)
    }

    /// The Python-style exception name: `"ValueError"`, `"TypeError"`, ...
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("Error")
    }

    /// [`ErrorKind::name`] as a static C string.
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            ErrorKind::Value => c"ValueError",
            ErrorKind::Type => c"TypeError",
            ErrorKind::Index => c"IndexError",
            ErrorKind::Runtime => c"RuntimeError",
            ErrorKind::Memory => c"MemoryError",
            ErrorKind::NotImplemented => c"NotImplementedError",
            ErrorKind::Cuda => c"CudaError",
            ErrorKind::Timeout => c"TimeoutError",
            ErrorKind::Cancelled => c"CancelledError",
            ErrorKind::Check => c"CheckError",
            ErrorKind::Backend => c"BackendError",
            ErrorKind::Internal => c"InternalError",
        }
    }
}

/// An ndx error. An error never changes once made, so a clone shares what is costly
/// to copy — the site (resolved once) and the chain of causes — and copies the rest:
/// it is an independent owned value, as the C API promises (freeing one leaves the
/// other intact). Sharing the causes keeps a failure that travelled through N
/// dependent invocations at N links in all, where copying them would make N²/2.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: CString,
    site: Option<Arc<Site>>,
    cause: Option<Arc<Error>>,
    related: Vec<Error>,
    op: Option<CString>,
    sequence: Option<u64>,
    /// The batch sample whose run failed, plus one (per-sample invocations only): the
    /// niche keeps the error within clippy's `result_large_err` bound.
    sample: Option<std::num::NonZeroU64>,
    /// What a raised check flag reports (flag errors only).
    check: Option<Box<crate::checks::Info>>,
    /// A repro document of the failing invocation (invocation failures only), written
    /// when first read.
    repro: Option<Arc<crate::debug::repro::Document>>,
}

/// Shorthand for results that fail with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns host text into a C string: interior NUL bytes become U+FFFD.
pub(crate) fn to_cstring(text: impl Into<String>) -> CString {
    let text = text.into();
    match CString::new(text) {
        Ok(c) => c,
        Err(e) => {
            let bytes = e.into_vec();
            let replaced = String::from_utf8_lossy(&bytes).replace('\0', "\u{FFFD}");
            CString::new(replaced).unwrap_or_default()
        }
    }
}

impl Error {
    /// A new error with no site, cause or related errors.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: to_cstring(message),
            site: None,
            cause: None,
            related: Vec::new(),
            op: None,
            sequence: None,
            sample: None,
            check: None,
            repro: None,
        }
    }

    /// `NDX_ERROR_VALUE` with `message`.
    pub fn value(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Value, message)
    }

    /// `NDX_ERROR_TYPE` with `message`.
    pub fn type_error(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Type, message)
    }

    /// `NDX_ERROR_INDEX` with `message`.
    pub fn index(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Index, message)
    }

    /// `NDX_ERROR_INTERNAL` with `message`.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    /// Sets the capture site (replacing any).
    pub fn with_site(mut self, site: Arc<Site>) -> Error {
        self.site = Some(site);
        self
    }

    /// Sets the direct cause (replacing any).
    pub fn with_cause(mut self, cause: Error) -> Error {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// Appends related errors (an error made of several, like an ExceptionGroup).
    pub fn with_related(mut self, related: impl IntoIterator<Item = Error>) -> Error {
        self.related.extend(related);
        self
    }

    /// Records the operator and the invocation's sequence number.
    pub fn with_op(mut self, op: &str, sequence: u64) -> Error {
        self.op = Some(to_cstring(op));
        self.sequence = Some(sequence);
        self
    }

    /// Records the batch sample whose run of a per-sample invocation failed.
    pub fn with_sample(mut self, sample: usize) -> Error {
        self.sample = std::num::NonZeroU64::new((sample as u64).wrapping_add(1));
        self
    }

    /// Records the operator a call-time error is about (no invocation, so no sequence
    /// number).
    pub fn with_op_name(mut self, op: &str) -> Error {
        self.op = Some(to_cstring(op));
        self
    }

    /// The kind.
    /// Attaches what a raised check flag reports.
    pub fn with_check(mut self, info: crate::checks::Info) -> Error {
        self.check = Some(Box::new(info));
        self
    }

    /// Attaches a repro document of the failing invocation: JSON text, or a
    /// [`Document`](crate::debug::repro::Document) whose site is symbolised when first
    /// read.
    pub fn with_repro(mut self, document: impl Into<crate::debug::repro::Document>) -> Error {
        self.repro = Some(Arc::new(document.into()));
        self
    }

    /// The repro document of this error or, failing that, of the first link of its
    /// cause chain that has one (the invocation that failed first). Written, its site
    /// symbolised, on the first call (clones share it).
    pub fn repro(&self) -> Option<&str> {
        self.chain()
            .find_map(|e| e.repro.as_deref())
            .map(crate::debug::repro::Document::text)
    }

    /// The check flag's report, for errors that are raised flags.
    pub fn check_info(&self) -> Option<&crate::checks::Info> {
        self.check.as_deref()
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The original message, unchanged (interior NULs replaced).
    pub fn message(&self) -> &str {
        self.message.to_str().unwrap_or("")
    }

    /// The message as a C string borrowed from the error.
    pub fn c_message(&self) -> &std::ffi::CStr {
        &self.message
    }

    /// The capture site, if one was recorded.
    pub fn site(&self) -> Option<&Arc<Site>> {
        self.site.as_ref()
    }

    /// The frames of the capture site, innermost first (resolved on first use).
    pub fn frames(&self) -> &[Frame] {
        self.site.as_deref().map(Site::frames).unwrap_or(&[])
    }

    /// The direct cause.
    pub fn cause(&self) -> Option<&Error> {
        self.cause.as_deref()
    }

    /// The related errors.
    pub fn related(&self) -> &[Error] {
        &self.related
    }

    /// The operator name, when the error came from an invocation.
    pub fn op(&self) -> Option<&str> {
        self.op.as_deref().and_then(|c| c.to_str().ok())
    }

    /// The operator name as a C string borrowed from the error.
    pub fn c_op(&self) -> Option<&std::ffi::CStr> {
        self.op.as_deref()
    }

    /// The invocation's sequence number, when the error came from an invocation.
    pub fn sequence(&self) -> Option<u64> {
        self.sequence
    }

    /// The batch sample whose run failed, when the error came from one run of a
    /// per-sample invocation (an input was a batch).
    pub fn sample(&self) -> Option<usize> {
        self.sample.map(|s| (s.get() - 1) as usize)
    }

    /// The chain: this error, its cause, the cause's cause, ...
    pub fn chain(&self) -> impl Iterator<Item = &Error> {
        std::iter::successors(Some(self), |e| e.cause())
    }

    /// The whole chain as a Python-style traceback (see [`format`]).
    pub fn traceback(&self) -> String {
        format::traceback(self)
    }
}

/// Drops the chain one link at a time: a chain thousands of links long (a failure
/// passed down a long dependent pipeline, or host code chaining `ndx_error_new` in a
/// loop) would otherwise be dropped recursively, one stack frame per link, and
/// overflow the stack.
impl Drop for Error {
    fn drop(&mut self) {
        let mut next = self.cause.take();
        while let Some(link) = next {
            // A link still shared with another error is that error's to drop.
            next = Arc::into_inner(link).and_then(|mut e| e.cause.take());
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message())
            .field("op", &self.op())
            .field("sequence", &self.sequence)
            // The causes' texts, not their Debug: that would recurse once per link.
            .field(
                "causes",
                &self
                    .chain()
                    .skip(1)
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>(),
            )
            .field("related", &self.related.len())
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_abi_values() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as i32, i as i32 + 1);
            assert_eq!(ErrorKind::from_raw(*k as i32), Some(*k));
        }
        assert_eq!(ErrorKind::from_raw(0), None);
        assert_eq!(ErrorKind::from_raw(13), None);
        assert_eq!(ErrorKind::Value.name(), "ValueError");
        assert_eq!(ErrorKind::NotImplemented.name(), "NotImplementedError");
    }

    #[test]
    fn interior_nul_is_replaced_not_fatal() {
        let e = Error::value("a\0b");
        assert_eq!(e.message(), "a\u{FFFD}b");
    }

    #[test]
    fn clone_is_deep_and_chain_walks_causes() {
        let root = Error::value("root");
        let e = Error::new(ErrorKind::Runtime, "outer")
            .with_cause(root)
            .with_op("div", 7);
        let c = e.clone();
        drop(e);
        let msgs: Vec<_> = c.chain().map(|e| e.message().to_string()).collect();
        assert_eq!(msgs, ["outer", "root"]);
        assert_eq!(c.op(), Some("div"));
        assert_eq!(c.sequence(), Some(7));
    }
}
