//! Capture sites: where an invocation (or an error) was asked for.
//!
//! Capture is cheap and symbolisation is lazy: at capture time only raw instruction
//! pointers are recorded; names, files and lines are looked up the first time someone
//! asks for the frames, then cached in the site. Each address is looked up once per
//! process (a bounded cache shared by all sites): the sites of a long chain of
//! failures captured at the same lines share their return addresses.
//!
//! Frames inside ndx are dropped precisely with a stack marker: every C entry point
//! (see `crate::ffi::boundary`) records the address of a local of its own frame in a
//! thread-local before it calls into the core. While unwinding, every frame whose
//! stack pointer is at or below that marker runs inside the entry point (its own frame
//! included); the first frame above it is the caller's: frame 0. Rust callers of the
//! core API, who have no entry point, are trimmed by symbol name instead when the
//! frames are resolved.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, OnceLock};

use crate::exec::fork::ForkLock;

use super::to_cstring;

/// Who supplied a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum FrameOrigin {
    /// Captured from the native stack (C, C++, Rust, ...).
    Native = 1,
    /// Supplied by the embedder (a host language's own frames).
    Host = 2,
}

/// One resolved frame.
#[derive(Debug, Clone)]
pub struct Frame {
    function: Option<CString>,
    file: Option<CString>,
    line: u32,
    column: u32,
    ip: usize,
    origin: FrameOrigin,
}

impl Frame {
    /// A frame from its parts (host frames, explicit locations, tests).
    pub fn new(
        function: Option<&str>,
        file: Option<&str>,
        line: u32,
        column: u32,
        ip: usize,
        origin: FrameOrigin,
    ) -> Frame {
        Frame {
            function: function.map(to_cstring),
            file: file.map(to_cstring),
            line,
            column,
            ip,
            origin,
        }
    }

    /// The function name, demangled, without Rust's hash suffix.
    pub fn function(&self) -> Option<&str> {
        self.function.as_deref().and_then(|c| c.to_str().ok())
    }
    /// The source file, as recorded in the debug information.
    pub fn file(&self) -> Option<&str> {
        self.file.as_deref().and_then(|c| c.to_str().ok())
    }
    /// The function name as a C string borrowed from the frame.
    pub fn c_function(&self) -> Option<&CStr> {
        self.function.as_deref()
    }
    /// The file as a C string borrowed from the frame.
    pub fn c_file(&self) -> Option<&CStr> {
        self.file.as_deref()
    }
    /// 1-based line, 0 when unknown.
    pub fn line(&self) -> u32 {
        self.line
    }
    /// 1-based column, 0 when unknown.
    pub fn column(&self) -> u32 {
        self.column
    }
    /// The instruction pointer (return address) of a native frame, 0 for host frames.
    pub fn ip(&self) -> usize {
        self.ip
    }
    /// Who supplied the frame.
    pub fn origin(&self) -> FrameOrigin {
        self.origin
    }
}

/// Frames captured beyond the requested depth when no entry marker is set, so that
/// trimming ndx's own frames by name still leaves `depth` frames of the caller.
const NAME_TRIM_SLACK: usize = 12;

/// The default number of native frames recorded for errors raised by a C entry point.
pub const DEFAULT_DEPTH: usize = 16;

/// The largest capture depth the C API accepts (`NDX_MAX_CAPTURE_DEPTH`).
pub const MAX_DEPTH: usize = 1024;

thread_local! {
    static ENTRY_MARKER: Cell<usize> = const { Cell::new(0) };
}

/// Restores the previous entry marker when an entry point returns (entry points nest
/// when a callback calls back into ndx).
pub(crate) struct EntryGuard {
    previous: usize,
}

impl EntryGuard {
    /// Records `marker` — the address of a local in the entry point's own frame.
    #[inline(always)]
    pub(crate) fn enter(marker: usize) -> EntryGuard {
        let previous = ENTRY_MARKER.with(|m| m.replace(marker));
        EntryGuard { previous }
    }
}

impl Drop for EntryGuard {
    #[inline(always)]
    fn drop(&mut self) {
        let previous = self.previous;
        ENTRY_MARKER.with(|m| m.set(previous));
    }
}

/// Where something was asked for: an optional explicit location, host frames, and raw
/// native instruction pointers (innermost first) resolved to [`Frame`]s on first use.
pub struct Site {
    location: Option<Frame>,
    host: Vec<Frame>,
    show_native: bool,
    ips: Box<[usize]>,
    /// Frames kept after resolution (only when trimming by name needed slack).
    depth: usize,
    trim_by_name: bool,
    resolved: OnceLock<Vec<Frame>>,
    /// How many times the frames were symbolised (tests of laziness).
    #[cfg(test)]
    resolutions: std::sync::atomic::AtomicUsize,
    /// Run inside the next symbolisation (tests of a fork during one).
    #[cfg(test)]
    in_resolve: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Site {
    /// Captures up to `depth` native frames of the caller. Costs an unwind (a few
    /// microseconds for 16 frames); resolves nothing.
    #[inline(never)]
    pub fn capture_native(depth: usize) -> Site {
        let marker = ENTRY_MARKER.with(Cell::get);
        let trim_by_name = marker == 0;
        let limit = if trim_by_name {
            depth.saturating_add(NAME_TRIM_SLACK)
        } else {
            depth
        };
        // Grows as frames come: the depth is a limit, not an expected size.
        let mut ips = Vec::with_capacity(limit.min(DEFAULT_DEPTH + NAME_TRIM_SLACK));
        let mut inside = !trim_by_name;
        if limit > 0 {
            let _unwinder = UNWINDER.lock();
            backtrace::trace(|frame| {
                // `sp` is the frame's stack pointer: at or below the marker while the
                // frame runs inside the entry point (the entry point's own frame
                // included, as the marker is one of its locals).
                let sp = frame.sp() as usize;
                if inside && sp != 0 && sp <= marker {
                    return true;
                }
                inside = false;
                let ip = frame.ip() as usize;
                if ip == 0 {
                    return false; // the end of the stack
                }
                ips.push(ip);
                ips.len() < limit
            });
        }
        Site::native(ips, depth, trim_by_name)
    }

    fn native(ips: Vec<usize>, depth: usize, trim_by_name: bool) -> Site {
        Site {
            location: None,
            host: Vec::new(),
            show_native: true,
            ips: ips.into_boxed_slice(),
            depth,
            trim_by_name,
            resolved: OnceLock::new(),
            #[cfg(test)]
            resolutions: Default::default(),
            #[cfg(test)]
            in_resolve: Default::default(),
        }
    }

    /// A site from return addresses already known (innermost first), such as the one
    /// an entry point reads from its own frame.
    pub fn from_ips(ips: Vec<usize>) -> Site {
        let depth = ips.len();
        Site::native(ips, depth, false)
    }

    /// Adds an explicit location (it replaces the innermost native frame: the native
    /// caller frame it describes better) and host frames, innermost first; native
    /// frames follow them only when `show_native`.
    pub fn with_frames(
        mut self,
        location: Option<Frame>,
        host: Vec<Frame>,
        show_native: bool,
    ) -> Site {
        self.location = location;
        self.host = host;
        self.show_native = show_native;
        self
    }

    /// A hash that is equal for the same call site reached the same way (explicit
    /// location, innermost host frame, return addresses), for folding repeated flags.
    pub fn key(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in self.location.iter().chain(self.host.first()) {
            (f.file(), f.line(), f.function()).hash(&mut h);
        }
        self.ips.hash(&mut h);
        h.finish()
    }

    /// The raw instruction pointers, innermost first.
    pub fn ips(&self) -> &[usize] {
        &self.ips
    }

    /// The frames, innermost first; symbolised on the first call and cached.
    pub fn frames(&self) -> &[Frame] {
        if let Some(frames) = self.resolved.get() {
            return frames;
        }
        // Symbolised before, not inside, the cell's initialisation, which only stores
        // the frames: a child forked while a parent thread was symbolising (for
        // milliseconds) would otherwise find the cell being initialised by a thread it
        // does not have, and wait for it forever. Two threads asking at once may both
        // symbolise; the first to store wins, and both frames are the same.
        let frames = self.resolve();
        self.resolved.get_or_init(|| frames)
    }

    /// Runs `f` inside the next symbolisation of this site (tests of a fork during one).
    #[cfg(test)]
    pub(crate) fn run_in_next_resolve(&self, f: Box<dyn FnOnce() + Send>) {
        *self.in_resolve.lock().unwrap() = Some(f);
    }

    /// How many times this site's frames were symbolised (0 until someone asks).
    #[cfg(test)]
    pub(crate) fn resolutions(&self) -> usize {
        self.resolutions.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn resolve(&self) -> Vec<Frame> {
        #[cfg(test)]
        self.resolutions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        #[cfg(test)]
        {
            let f = self.in_resolve.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        let mut frames: Vec<Frame> = self.location.iter().chain(&self.host).cloned().collect();
        if self.show_native {
            let skip = usize::from(self.location.is_some());
            frames.extend(self.resolve_native(skip));
        }
        frames
    }

    fn resolve_native(&self, skip: usize) -> Vec<Frame> {
        let mut frames = Vec::with_capacity(self.ips.len());
        let mut leading = true;
        let symbols: Vec<Arc<[Frame]>> = self
            .ips
            .iter()
            .skip(skip)
            .map(|&ip| symbolise(ip))
            .collect();
        // Trimming by name, everything inward of ndx's first frame is the unwinder's
        // (whose inlined frames have no path in their names in a build with line
        // tables only); without an ndx frame, the names alone decide.
        let all = || symbols.iter().flat_map(|s| s.iter());
        let unwinder = if self.trim_by_name {
            all().position(is_ndx).unwrap_or(0)
        } else {
            0
        };
        for frame in all().skip(unwinder) {
            if leading && is_internal(frame, self.trim_by_name) {
                continue;
            }
            leading = false;
            // Outward of the caller, ndx's own frames are its machinery that ran the
            // caller's code (a callback's or host kernel's trampoline, the worker):
            // left out, as the runtime's are.
            if !is_runtime(frame) && !is_ndx(frame) {
                frames.push(frame.clone());
            }
        }
        if self.trim_by_name {
            frames.truncate(self.depth);
        }
        frames
    }
}

/// The most addresses the process-wide symbol cache holds; when full, it is emptied
/// (simple, and a process that fills it is looking up new addresses anyway).
const SYMBOL_CACHE_CAPACITY: usize = 16 * 1024;

/// The frames each return address resolved to (several where calls were inlined),
/// shared by every site: symbolising one address costs milliseconds (tens of them in a
/// debug build, where the unwinder's own small cache of parsed objects keeps being
/// evicted by stacks that cross more than a few shared objects). Keyed by address
/// alone: a library unloaded and another loaded at the same addresses would be named
/// after the first (ndx never unloads code; language runtimes keep their extension
/// modules loaded). A B-tree rather than a hash table: what it holds at exit is
/// reachable from the static through pointers to the start of each block, so leak
/// checkers (valgrind) report it as still reachable, not as possibly lost.
static SYMBOLS: ForkLock<BTreeMap<usize, Arc<[Frame]>>> = ForkLock::new(BTreeMap::new());

/// The symbol cache's lock (taken around a fork: `ffi::fork`).
pub(crate) fn symbols_lock() -> &'static ForkLock<BTreeMap<usize, Arc<[Frame]>>> {
    &SYMBOLS
}

/// Held around every call into the `backtrace` crate (a capture's walk of the stack, a
/// lookup of an address), and around a fork (`ffi::fork`): that crate serialises its
/// calls with a lock of its own, which a child forked while another thread was inside
/// one found held by a thread it does not have, so its first capture hung.
static UNWINDER: ForkLock<()> = ForkLock::new(());

/// The lock around calls into the `backtrace` crate (taken around a fork: `ffi::fork`).
pub(crate) fn unwinder_lock() -> &'static ForkLock<()> {
    &UNWINDER
}

#[cfg(test)]
thread_local! {
    /// Addresses this thread looked up in the debug information (cache misses).
    static LOOKUPS: Cell<usize> = const { Cell::new(0) };
}

/// The frames of return address `ip`, innermost (inlined) first: from the cache, or
/// looked up (without holding the cache's lock) and remembered.
fn symbolise(ip: usize) -> Arc<[Frame]> {
    if let Some(hit) = SYMBOLS.lock().get(&ip) {
        return hit.clone();
    }
    #[cfg(test)]
    LOOKUPS.with(|n| n.set(n.get() + 1));
    let mut symbols = Vec::new();
    let unwinder = UNWINDER.lock();
    backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
        let function = sym.name().map(|n| format!("{n:#}"));
        let file = sym.filename().map(|p| p.to_string_lossy().into_owned());
        symbols.push(Frame::new(
            function.as_deref(),
            file.as_deref(),
            sym.lineno().unwrap_or(0),
            sym.colno().unwrap_or(0),
            ip,
            FrameOrigin::Native,
        ));
    });
    drop(unwinder);
    if symbols.is_empty() {
        symbols.push(Frame::new(None, None, 0, 0, ip, FrameOrigin::Native));
    }
    let symbols: Arc<[Frame]> = symbols.into();
    let mut cache = SYMBOLS.lock();
    if cache.len() >= SYMBOL_CACHE_CAPACITY {
        cache.clear();
    }
    cache.insert(ip, symbols.clone());
    symbols
}

/// Frames of ndx itself (and of the unwinder) at the inner end of a capture taken
/// without an entry marker (a Rust caller of the core API). With a marker, ndx's
/// frames were never recorded, so a user function named `ndx_...` is kept.
fn is_internal(frame: &Frame, trim_by_name: bool) -> bool {
    let Some(name) = frame.function() else {
        return false;
    };
    (trim_by_name
        && (is_ndx(frame)
            || ["backtrace::", "<backtrace::"]
                .iter()
                .any(|p| name.starts_with(p))))
        || is_runtime(frame)
}

/// Frames of ndx's Rust code: by path in the name (a C caller's function named
/// `ndx_...` is not one), or, where the name has no path (a function inlined in a
/// build with line tables only), by ndx's source directory.
fn is_ndx(frame: &Frame) -> bool {
    frame
        .function()
        .is_some_and(|name| name.starts_with("ndx::") || name.starts_with("<ndx::"))
        || frame
            .file()
            .is_some_and(|f| f.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src/")))
}

/// Whether `file` is a source of the crates [`is_runtime`] names: `std`, `core` and
/// `alloc` (as rustc records them: `/rustc/<commit>/library/core/...`) or the worker
/// pool's.
fn is_runtime_source(file: &str) -> bool {
    (file.starts_with("/rustc/")
        && ["/library/std/", "/library/core/", "/library/alloc/"]
            .iter()
            .any(|l| file.contains(l)))
        || file.contains("/rayon-core-")
}

/// Frames of the Rust runtime and standard library, of the worker pool (rayon), and
/// the C runtime's process and thread start-up: never the user's code, and noise in a
/// traceback.
fn is_runtime(frame: &Frame) -> bool {
    let Some(name) = frame.function() else {
        return false;
    };
    const PREFIXES: [&str; 10] = [
        "std::",
        "<std::",
        "core::",
        "<core::",
        "alloc::",
        "<alloc::",
        "__rust",
        "rust_",
        "rayon_core::",
        "<rayon_core::",
    ];
    const START_UP: [&str; 6] = [
        "_start",
        "__libc_start_main",
        "__libc_start_main_impl",
        "__libc_start_call_main",
        "start_thread",
        "clone3",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || START_UP.contains(&name)
        || frame.file().is_some_and(is_runtime_source)
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("ips", &self.ips.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a name has no path (inlined frames in a build with line tables only), the
    /// file tells ndx's and the runtime's frames from the caller's.
    #[test]
    fn frames_without_a_path_in_their_name_are_told_apart_by_their_file() {
        // Names as a build with line tables only gives inlined frames.
        let at = |name: &str, file: &str| {
            Frame::new(Some(name), Some(file), 7, 0, 0, FrameOrigin::Native)
        };
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src/exec/context.rs");
        assert!(is_ndx(&at("invoke", src)));
        assert!(is_internal(&at("invoke", src), true));
        let core = "/rustc/0123abcd/library/core/src/ops/function.rs";
        assert!(is_runtime(&at("call_once<fn()>", core)));
        let pool = "/home/u/.cargo/registry/src/x/rayon-core-1.13.0/src/job.rs";
        assert!(is_runtime(&at("execute", pool)));
        // The caller's own frames, in C or Rust, are neither.
        for user in [
            at("invoke", "/home/u/app/src/main.c"),
            at("ndx_invoke_all", "/home/u/app/tests/t.rs"),
            at("run", "/rustc_app/library/std/run.rs"),
            at("run_test", "/rustc/0123abcd/library/test/src/lib.rs"),
        ] {
            assert!(!is_ndx(&user) && !is_runtime(&user), "{user:?}");
            assert!(!is_internal(&user, true), "{user:?}");
        }
    }

    /// The depth is a limit, not a size to allocate: an absurd one captures the stack
    /// as it is.
    #[test]
    fn capture_native_does_not_preallocate_the_depth() {
        for depth in [usize::MAX, usize::MAX / 8] {
            let site = Site::capture_native(depth);
            assert!(!site.ips.is_empty());
            assert!(site.ips.len() < 10_000, "{}", site.ips.len());
        }
    }

    /// Sites captured at the same line share their return addresses: the second one
    /// is symbolised from the cache, with the same frames, looking nothing up.
    #[test]
    fn an_address_is_looked_up_once_per_process() {
        let sites: Vec<Site> = (0..2)
            .map(|_| Site::capture_native(DEFAULT_DEPTH))
            .collect();
        assert_eq!(sites[0].ips(), sites[1].ips());
        let lookups = || LOOKUPS.with(Cell::get);
        let before = lookups();
        let first = sites[0].frames();
        let looked_up = lookups() - before;
        assert!(
            looked_up > 0,
            "this test's own addresses were never looked up before"
        );
        let second = sites[1].frames();
        assert_eq!(
            lookups() - before,
            looked_up,
            "the second site looked up addresses the first one resolved"
        );
        let parts = |frames: &[Frame]| {
            frames
                .iter()
                .map(|f| {
                    (
                        f.function().map(str::to_owned),
                        f.file().map(str::to_owned),
                        f.line(),
                        f.column(),
                        f.ip(),
                        f.origin(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert!(!first.is_empty());
        assert_eq!(parts(first), parts(second));
    }
}
