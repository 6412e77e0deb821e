//! Which invocation a CUDA fault belongs to. A kernel that faults (an illegal address,
//! say) is reported by the driver at some later call — a sync, an event query — and
//! from then on every call of the context fails ("sticky"). So after each invocation's
//! work ndx enqueues `cuStreamWriteValue64` of a tag into pinned host memory: when a
//! fault surfaces, the tag there names the last invocation whose work completed, and
//! the fault belongs to the first one enqueued after it — what `CUDA_LAUNCH_BLOCKING=1`
//! tells, without synchronising every launch.
//!
//! That holds only if an invocation's work and its tag are contiguous on the stream.
//! Workers enqueue concurrently (EAGER), so an invocation enqueues holding its
//! device's turn ([`Progress::turn`]): otherwise a kernel of another invocation could
//! land between its work and its tag, and a fault there would be blamed on it. The
//! invocation enters the ledger when its turn starts, and writes its tag when the turn
//! ends even if it failed, so work that never completes is always its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use parking_lot::{Mutex, MutexGuard};

use super::device::{DeviceState, check};
use crate::error::Site;
use crate::error::{Error, ErrorKind, Result};

/// An invocation whose stream work may not have completed.
struct InFlight {
    tag: u64,
    op: String,
    seq: u64,
    site: Arc<Site>,
}

/// One device's progress word and the invocations in flight on ndx's stream.
pub struct Progress {
    /// Pinned host memory the stream writes tags into (`None`: the driver refused
    /// stream memory operations, so faults cannot be attributed).
    word: Option<Word>,
    next: AtomicU64,
    ledger: Mutex<Ledger>,
    /// Set when the driver refused a tag write: the word no longer tells progress.
    refused: std::sync::atomic::AtomicBool,
    /// Held while one invocation enqueues its work and its tag.
    turn: Mutex<()>,
}

struct Word {
    host: *mut u64,
    dptr: u64,
}

// SAFETY: the pinned word is only read (volatile) by the host and written by the
// device; the pointer is valid for the life of the process (never freed).
unsafe impl Send for Word {}
// SAFETY: see `Send`.
unsafe impl Sync for Word {}

/// In-flight invocations remembered at most (older ones are forgotten: their work has
/// long completed in any pipeline this deep).
const MAX_INFLIGHT: usize = 4096;

/// The invocations enqueued and not yet seen completed, in tag (= stream) order.
#[derive(Default)]
struct Ledger {
    inflight: VecDeque<InFlight>,
    /// The op and sequence number of the last invocation seen completed.
    last_done: Option<(String, u64)>,
    /// The highest tag forgotten before its work was seen completed (0: none): a fault
    /// before it has no invocation left to be blamed on.
    forgotten: u64,
}

impl Ledger {
    /// Remembers `f`, enqueued after every invocation remembered; `done` is the tag
    /// of the last completed work. Beyond [`MAX_INFLIGHT`] the oldest is forgotten.
    fn push(&mut self, f: InFlight, done: u64) {
        if self.inflight.len() == MAX_INFLIGHT
            && let Some(old) = self.inflight.pop_front()
            && old.tag > done
        {
            self.forgotten = self.forgotten.max(old.tag);
        }
        self.inflight.push_back(f);
    }

    /// Forgets the invocations whose work completed (tags up to `done`).
    fn retire(&mut self, done: u64) {
        let mut last = None;
        while self.inflight.front().is_some_and(|f| f.tag <= done) {
            last = self.inflight.pop_front();
        }
        if let Some(f) = last {
            self.last_done = Some((f.op, f.seq));
        }
    }

    /// The invocation a fault belongs to when the work up to tag `done` completed:
    /// the first after it, and the last completed one ("none yet" when none was).
    /// `None` when it cannot be told: none is in flight, or it was forgotten.
    fn blame(&self, done: u64) -> Option<(&InFlight, String)> {
        if done < self.forgotten {
            return None;
        }
        let culprit = self.inflight.iter().find(|f| f.tag > done)?;
        let last = self
            .inflight
            .iter()
            .rev()
            .find(|f| f.tag <= done)
            .map(|f| (f.op.as_str(), f.seq))
            .or_else(|| self.last_done.as_ref().map(|(op, seq)| (op.as_str(), *seq)))
            .map_or_else(
                || "none yet".to_string(),
                |(op, seq)| format!("'{op}' (#{seq})"),
            );
        Some((culprit, last))
    }
}

/// The progress tracker of `device` (pinned memory allocated on first use).
pub fn progress(device: &'static DeviceState) -> &'static Progress {
    static ALL: OnceLock<Vec<OnceLock<Progress>>> = OnceLock::new();
    super::per_device(&ALL, device, || Progress {
        word: pinned_word(device).ok(),
        next: AtomicU64::new(1),
        ledger: Mutex::new(Ledger::default()),
        refused: Default::default(),
        turn: Mutex::new(()),
    })
}

fn pinned_word(device: &DeviceState) -> Result<Word> {
    device.bind()?;
    // The symbol is looked up first: cudarc's loader panics on a missing one.
    // SAFETY: the library is loaded (a device exists); a lookup runs no code of it.
    let lib = unsafe { sys::culib() };
    // SAFETY: only the presence of the symbol is tested.
    if unsafe { lib.get::<*const ()>(b"cuStreamWriteValue64_v2\0") }.is_err() {
        return Err(Error::new(
            ErrorKind::Cuda,
            "the driver has no cuStreamWriteValue64_v2",
        ));
    }
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a current context and a valid out-pointer; 8 bytes, portable and mapped
    // into the device's address space. Never freed (kept for the process).
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(
            &mut host,
            8,
            sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
        )
    })?;
    let host = host.cast::<u64>();
    // SAFETY: 8 bytes of pinned host memory just allocated, aligned (the driver
    // returns page-aligned memory).
    unsafe { host.write_volatile(0) };
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: mapped pinned memory of this context and a valid out-pointer.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast(), 0)
    })?;
    Ok(Word { host, dptr })
}

/// The driver errors after which the context is unusable (sticky): a kernel faulted.
const STICKY: [&str; 11] = [
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_UNKNOWN",
];

/// Whether `e` is a CUDA error of a faulted context (see [`STICKY`]).
pub fn is_sticky(e: &Error) -> bool {
    e.kind() == ErrorKind::Cuda && STICKY.iter().any(|n| e.message().contains(n))
}

impl Progress {
    /// The device's stream to invocation `seq` of `op` until the returned [`Turn`]
    /// drops: hold it from the invocation's first stream operation through
    /// [`Turn::mark`], so no other invocation's work lands in between and tags are
    /// written in stream order. Only enqueuing happens under it.
    ///
    /// The invocation enters the ledger here, with the tag it will write, before any
    /// of its work is enqueued: a fault of that work may surface (at another thread's
    /// wait) before the invocation is done enqueueing, and must be blamed on it
    /// without waiting for its turn to end, which may itself wait for the device's
    /// completion thread (an allocation that finds the device full does).
    pub fn turn<'a>(
        &'a self,
        device: &'a DeviceState,
        op: &str,
        seq: u64,
        site: &Arc<Site>,
    ) -> Turn<'a> {
        let held = self.turn.lock();
        let tag = self.next.fetch_add(1, Ordering::Relaxed);
        if self.word.is_some() {
            let f = InFlight {
                tag,
                op: op.to_string(),
                seq,
                site: site.clone(),
            };
            self.ledger.lock().push(f, self.completed());
        }
        Turn {
            progress: self,
            device,
            tag,
            marked: false,
            _held: held,
        }
    }

    /// Enqueues the write of `tag` after the work enqueued so far.
    fn write_tag(&self, device: &DeviceState, tag: u64) {
        let Some(word) = &self.word else {
            return;
        };
        // SAFETY: ndx's live stream and the mapped address of the pinned word; flags 0
        // is a plain write once the preceding work on the stream has completed.
        let r = unsafe {
            sys::cuStreamWriteValue64_v2(device.stream() as sys::CUstream, word.dptr, tag, 0)
        };
        // A write refused for another reason than a fault (stream memory operations
        // unsupported, say) leaves the word stale for good: attribution stops, rather
        // than blaming whatever comes first. The fault itself still surfaces.
        if r != sys::CUresult::CUDA_SUCCESS
            && !is_sticky(&Error::new(ErrorKind::Cuda, super::describe(r)))
        {
            self.refused.store(true, Ordering::Relaxed);
        }
    }

    /// The tag of the last invocation whose work completed (0: none yet).
    pub fn completed(&self) -> u64 {
        match &self.word {
            // SAFETY: the pinned word lives for the process; the device writes it
            // whole (8-byte aligned), so a volatile read sees an old or a new tag.
            Some(w) => unsafe { w.host.read_volatile() },
            None => 0,
        }
    }

    /// Forgets the invocations whose work has completed.
    pub fn retire(&self) {
        let done = self.completed();
        self.ledger.lock().retire(done);
    }

    /// `e`, a CUDA error that surfaced while waiting, with the invocation whose work
    /// faulted as its cause (op, sequence number and enqueue site).
    pub fn attribute(&self, device: &DeviceState, e: Error) -> Error {
        let e = Error::new(
            ErrorKind::Cuda,
            format!(
                "{}; the CUDA context of kDLCUDA:{} is unusable from now on (a sticky fault)",
                e.message(),
                device.id()
            ),
        );
        if self.word.is_none() || self.refused.load(Ordering::Relaxed) {
            return e;
        }
        let done = self.completed();
        let ledger = self.ledger.lock();
        let Some((culprit, last)) = ledger.blame(done) else {
            return e;
        };
        e.with_cause(
            Error::new(
                ErrorKind::Cuda,
                format!(
                    "the fault is attributed to '{}' (#{}): the first work on ndx's stream after the last that completed ({last})",
                    culprit.op, culprit.seq
                ),
            )
            .with_op(&culprit.op, culprit.seq)
            .with_site(culprit.site.clone()),
        )
    }
}

/// One invocation's turn on its device's stream ([`Progress::turn`]).
pub struct Turn<'a> {
    progress: &'a Progress,
    device: &'a DeviceState,
    tag: u64,
    marked: bool,
    _held: MutexGuard<'a, ()>,
}

impl Turn<'_> {
    /// Enqueues the write of the invocation's tag after the work it enqueued (once).
    pub fn mark(&mut self) {
        if !self.marked {
            self.marked = true;
            self.progress.write_tag(self.device, self.tag);
        }
    }
}

impl Drop for Turn<'_> {
    /// An invocation that failed while enqueueing still writes its tag: if nothing
    /// it enqueued faulted, the tag is written and it is never blamed for a later
    /// fault; if something did, the tag is never written and the fault is its.
    fn drop(&mut self) {
        self.mark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(tag: u64, op: &str) -> InFlight {
        InFlight {
            tag,
            op: op.to_string(),
            seq: tag + 10,
            site: Arc::new(Site::from_ips(Vec::new())),
        }
    }

    fn blamed(l: &Ledger, done: u64) -> Option<(String, u64, String)> {
        l.blame(done).map(|(c, last)| (c.op.clone(), c.seq, last))
    }

    #[test]
    fn a_fault_is_blamed_on_the_first_invocation_after_the_last_completed() {
        let mut l = Ledger::default();
        assert_eq!(blamed(&l, 0), None, "nothing in flight: no one to blame");
        l.push(f(1, "add"), 0);
        l.push(f(2, "mul"), 0);
        l.push(f(3, "sub"), 0);
        assert_eq!(blamed(&l, 0), Some(("add".into(), 11, "none yet".into())));
        assert_eq!(
            blamed(&l, 1),
            Some(("mul".into(), 12, "'add' (#11)".into()))
        );
        // Retired invocations are still named as the last completed.
        l.retire(2);
        assert_eq!(l.inflight.len(), 1);
        assert_eq!(
            blamed(&l, 2),
            Some(("sub".into(), 13, "'mul' (#12)".into()))
        );
        assert_eq!(blamed(&l, 3), None, "all completed: no culprit");
    }

    #[test]
    fn work_forgotten_before_it_completed_is_never_blamed_on_a_later_invocation() {
        let mut l = Ledger::default();
        let n = MAX_INFLIGHT as u64;
        for tag in 1..=n {
            l.push(f(tag, "add"), 0);
        }
        // Tag 1 is forgotten while its work is still running (done = 0).
        l.push(f(n + 1, "mul"), 0);
        assert_eq!(l.inflight.len(), MAX_INFLIGHT);
        assert_eq!(l.forgotten, 1);
        assert_eq!(
            blamed(&l, 0),
            None,
            "the fault may be tag 1's: blame no one"
        );
        assert_eq!(
            blamed(&l, 1).map(|b| b.1),
            Some(12),
            "tag 1 completed: tag 2"
        );
        // Forgetting work known complete loses nothing.
        l.push(f(n + 2, "sub"), n);
        assert_eq!(l.forgotten, 1);
        assert_eq!(
            blamed(&l, n).map(|b| (b.0, b.1)),
            Some(("mul".into(), n + 11))
        );
    }
}
