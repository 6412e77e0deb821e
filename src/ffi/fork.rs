//! The `pthread_atfork` handlers behind [`crate::exec::fork`].
//!
//! Before a fork, the forking thread takes the process-wide locks another thread could
//! be holding (the host buffer cache, then the symbol cache); after it, parent and child
//! let them go, so the child never inherits one held by a thread it does not have. The
//! child also counts the fork, which retires the parent's pool, contexts and pending work
//! there.

use std::any::Any;
use std::cell::RefCell;

/// Registers the handlers. A failure (no memory for the registration) leaves a forked
/// child as before: it must not use ndx.
pub(crate) fn install() {
    // SAFETY: three `extern "C" fn()` handlers that live for the process; registration
    // only records them.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        eprintln!("ndx: pthread_atfork failed ({r}); a forked child must not use ndx");
    }
}

thread_local! {
    /// The guards `prepare` took on the forking thread, let go of by `parent` and
    /// `child` (the child's one thread is that thread's copy).
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn prepare() {
    // Held across the fork, in this order; released in the reverse order.
    let cache = crate::tensor::storage::cache_lock().lock();
    let symbols = crate::error::site::symbols_lock().lock();
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.push(Box::new(cache));
        h.push(Box::new(symbols));
    });
}

fn unlock() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        while let Some(guard) = h.pop() {
            drop(guard);
        }
    });
}

extern "C" fn parent() {
    unlock();
}

extern "C" fn child() {
    unlock();
    crate::exec::fork::forked();
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    /// Forks while other threads keep taking a process-wide lock, so that some wait on
    /// it when the fork happens: the child finds it free. With a `parking_lot` mutex,
    /// releasing it in the child could hand it to one of those waiters, a thread the
    /// child does not have, and it stayed held (found hanging a Python child).
    #[test]
    fn a_fork_while_threads_wait_on_the_locks_leaves_them_free_in_the_child() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        crate::exec::fork::watch();
        let stop = Arc::new(AtomicBool::new(false));
        let hammers: Vec<_> = (0..3)
            .map(|k| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if k % 2 == 0 {
                            let _g = crate::tensor::storage::cache_lock().lock();
                            std::hint::spin_loop();
                        } else {
                            let _g = crate::error::site::symbols_lock().lock();
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let mut stuck = 0;
        for _ in 0..200 {
            // SAFETY: the child only tries the locks and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                let wait = Duration::from_secs(2);
                let free = crate::tensor::storage::cache_lock()
                    .try_lock_for(wait)
                    .is_some()
                    && crate::error::site::symbols_lock()
                        .try_lock_for(wait)
                        .is_some();
                // SAFETY: leaving the child without running the harness's exit code.
                unsafe { libc::_exit(i32::from(!free)) };
            }
            let mut status = 0;
            // SAFETY: our child's pid and a valid out-pointer.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                stuck += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for h in hammers {
            h.join().unwrap();
        }
        assert_eq!(stuck, 0, "children that found a lock held, of 200");
    }

    /// A fork while another thread holds a process-wide lock leaves it free in the
    /// child: the fork waits for the holder to let go, and the child can take the lock.
    /// Without the handlers the child finds it held by a thread it does not have.
    #[test]
    fn a_fork_waits_for_held_locks_and_the_child_finds_them_free() {
        crate::exec::fork::watch();
        for which in 0..2 {
            let (taken, wait_taken) = mpsc::channel();
            let holder = std::thread::spawn(move || {
                let _cache;
                let _symbols;
                if which == 0 {
                    _cache = crate::tensor::storage::cache_lock().lock();
                } else {
                    _symbols = crate::error::site::symbols_lock().lock();
                }
                taken.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
            });
            wait_taken.recv().unwrap();
            // SAFETY: the child only tries the lock and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                let free = if which == 0 {
                    crate::tensor::storage::cache_lock()
                        .try_lock_for(Duration::from_secs(2))
                        .is_some()
                } else {
                    crate::error::site::symbols_lock()
                        .try_lock_for(Duration::from_secs(2))
                        .is_some()
                };
                // SAFETY: leaving the child without running the harness's exit code.
                unsafe { libc::_exit(i32::from(!free)) };
            }
            let mut status = 0;
            // SAFETY: our child's pid and a valid out-pointer.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            holder.join().unwrap();
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "lock {which} was still held in the child (status {status})"
            );
        }
    }
}
