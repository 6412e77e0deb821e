//! `fork()`: what a forked child inherits of ndx, and what it does not.
//!
//! A child has one thread: the parent's ndx workers, CUDA completion threads and any
//! work they were running stay behind. So that a child neither hangs nor deadlocks:
//! - the worker pool is made again, on first use, in each process that forks off one
//!   that had it ([`crate::exec::pool`]), so new contexts work in the child;
//! - a context made before the fork refuses every call in the child (its release only
//!   drops the reference, waiting for nothing), and an invocation that had not
//!   completed reads as failed there: its work stayed with the parent;
//! - the process-wide locks (the host buffer cache, the symbol cache, the one around
//!   the stack unwinder) are taken around the fork, so the child never finds one held
//!   by a thread it does not have;
//! - CUDA initialised before the fork is not used in the child (the driver does not
//!   support that).
//!
//! The fork is seen through `pthread_atfork` handlers ([`crate::ffi::fork`]), registered
//! when the pool or the CUDA driver is first set up: before then there is nothing a
//! child could inherit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

use crate::error::{Error, ErrorKind};

/// A process-wide lock that is taken around a fork ([`crate::ffi::fork`]) and stays
/// sound in the child: std's futex-based mutex, whose waiters the kernel keeps, so a
/// child (which has none of them) releases it cleanly. A `parking_lot` mutex records
/// its waiters in a process-wide table the child inherits: releasing it there could
/// hand it to a parent's worker that was waiting at the fork, a thread the child does
/// not have, and it stayed held (a forked child hung in its first allocation).
/// Poisoning is ignored: the data it guards stays consistent across a panic.
pub(crate) struct ForkLock<T>(Mutex<T>);

impl<T> ForkLock<T> {
    pub(crate) const fn new(value: T) -> ForkLock<T> {
        ForkLock(Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it is free within `timeout`.
    #[cfg(test)]
    pub(crate) fn try_lock_for(&self, timeout: std::time::Duration) -> Option<MutexGuard<'_, T>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.0.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
    }
}

/// How many forks lie between the process that first registered the handlers and this
/// one (0 in that process).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// This process's fork generation.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Called in the child right after a fork (an atfork handler: async-signal-safe).
pub(crate) fn forked() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Registers the fork handlers, once per process.
pub(crate) fn watch() {
    static ONCE: Once = Once::new();
    ONCE.call_once(crate::ffi::fork::install);
}

/// The refusal of a context made before this process forked, given as `arg`.
pub(crate) fn stale_context(arg: &str) -> Error {
    Error::value(format!(
        "argument '{arg}': the context was created before this process forked; a forked \
         child cannot use it (its worker threads and its work in flight stayed with the \
         parent): create a new context in the child (tensors whose data exists can be \
         used there)"
    ))
}

/// The failure of invocation `seq` of `op`, not complete when this process forked.
pub(crate) fn stale_invocation(seq: u64, op: &str) -> Error {
    Error::new(
        ErrorKind::Runtime,
        format!(
            "invocation #{seq} ('{op}') had not completed when the process forked; it never \
             completes in the child (its work stayed with the parent)"
        ),
    )
}
