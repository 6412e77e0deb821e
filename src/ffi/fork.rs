//! The `pthread_atfork` handlers behind [`crate::exec::fork`].
//!
//! Before a fork, the forking thread takes the process-wide locks another thread could
//! be holding (the host buffer cache, then the symbol cache); after it, parent and child
//! let them go, so the child never inherits one held by a thread it does not have. The
//! child also counts the fork, which retires the parent's pool, contexts and pending work
//! there.

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

extern "C" fn prepare() {
    // Held across the fork: the guards are forgotten and the locks released by hand
    // in `parent` and `child`, in the reverse order.
    std::mem::forget(crate::tensor::storage::cache_lock().lock());
    std::mem::forget(crate::error::site::symbols_lock().lock());
}

fn unlock() {
    // SAFETY: `prepare` took both locks on this thread and forgot the guards; this
    // thread (in the parent), or the one thread of the child, is their holder.
    unsafe {
        crate::error::site::symbols_lock().force_unlock();
        crate::tensor::storage::cache_lock().force_unlock();
    }
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
