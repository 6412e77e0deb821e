//! The `pthread_atfork` handlers behind [`crate::exec::fork`].
//!
//! Before a fork, the forking thread takes the process-wide locks another thread could
//! be holding (the host buffer cache, the symbol cache, then the one around the stack
//! unwinder); after it, parent and child
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
    // Held across the fork, in this order; released in the reverse order. No path takes
    // one of them while holding another.
    let cache = crate::tensor::storage::cache_lock().lock();
    let symbols = crate::error::site::symbols_lock().lock();
    let unwinder = crate::error::site::unwinder_lock().lock();
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.push(Box::new(cache));
        h.push(Box::new(symbols));
        h.push(Box::new(unwinder));
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

    /// Forks: the child runs `body` under a 10 s alarm (a hang ends it) and leaves with
    /// `_exit`, 0 when `body` returned true. Returns the child's wait status.
    fn in_child(body: impl FnOnce() -> bool) -> i32 {
        // SAFETY: the child runs `body` on its one thread and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: a plain libc call in the child.
            unsafe { libc::alarm(10) };
            let good = body();
            // SAFETY: leaving the child without running the harness's exit code.
            unsafe { libc::_exit(i32::from(!good)) };
        }
        let mut status = 0;
        // SAFETY: our child's pid and a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    fn exited_cleanly(status: i32) -> bool {
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }

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
            let status = in_child(|| {
                let wait = Duration::from_secs(2);
                crate::tensor::storage::cache_lock()
                    .try_lock_for(wait)
                    .is_some()
                    && crate::error::site::symbols_lock()
                        .try_lock_for(wait)
                        .is_some()
            });
            if !exited_cleanly(status) {
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
            let status = in_child(|| {
                if which == 0 {
                    crate::tensor::storage::cache_lock()
                        .try_lock_for(Duration::from_secs(2))
                        .is_some()
                } else {
                    crate::error::site::symbols_lock()
                        .try_lock_for(Duration::from_secs(2))
                        .is_some()
                }
            });
            holder.join().unwrap();
            assert!(
                exited_cleanly(status),
                "lock {which} was still held in the child (status {status})"
            );
        }
    }

    /// Runs `body` in a child forked while another thread is inside `hold`, which takes
    /// a lock and, holding it, calls the function it is given (which returns after the
    /// fork).
    fn fork_while_held(
        hold: impl FnOnce(Box<dyn FnOnce() + Send>) + Send + 'static,
        body: impl FnOnce() -> bool,
    ) -> i32 {
        let (locked_tx, locked_rx) = mpsc::channel();
        let (forked_tx, forked_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            hold(Box::new(move || {
                locked_tx.send(()).unwrap();
                let _ = forked_rx.recv();
            }))
        });
        locked_rx.recv().unwrap();
        let status = in_child(body);
        forked_tx.send(()).unwrap();
        holder.join().unwrap();
        status
    }

    fn assert_child_ok(status: i32) {
        assert!(
            exited_cleanly(status),
            "the child hung or failed (status {status:#x})"
        );
    }

    /// A host tensor of one int32.
    fn one_i32(v: i32) -> std::sync::Arc<crate::tensor::Tensor> {
        let t = crate::tensor::Tensor::new_host(
            crate::tensor::DType::I32,
            &[1],
            Default::default(),
            |b| {
                b.copy_from_slice(&v.to_ne_bytes());
                Ok(())
            },
        );
        std::sync::Arc::new(t.unwrap())
    }

    /// Runs `body` in a child forked while another thread holds `t`'s event lock.
    fn fork_while_event_lock_held(
        t: &std::sync::Arc<crate::tensor::Tensor>,
        body: impl FnOnce() -> bool,
    ) -> i32 {
        let held = t.clone();
        fork_while_held(
            move |forked| {
                let _held = held.storage().hold_event_lock();
                forked();
            },
            body,
        )
    }

    fn sync_cpu_context() -> crate::exec::Context {
        let settings = crate::exec::Settings {
            mode: crate::exec::EvalMode::SyncCpu,
            ..crate::exec::Settings::default()
        };
        crate::exec::new_context(settings, 2)
    }

    /// A child forked while a parent thread held the state lock of an invocation that
    /// had completed (another thread invoking a consumer of it, say) uses its outputs as
    /// inputs, SYNC and EAGER: nothing there waits for that lock, which stays held in
    /// the child by a thread it does not have (the child hung in `ndx_invoke`).
    #[test]
    fn a_child_forked_while_a_complete_invocation_was_locked_uses_its_outputs() {
        use crate::exec::{Args, CallSite, EvalMode, Input, output_tensor};
        use std::sync::Arc;
        crate::exec::fork::watch();
        let ctx = sync_cpu_context();
        let one = || Input::host(&[1i32], &[1]).unwrap();
        let done = ctx
            .invoke(
                "add",
                vec![one(), one()],
                Args::new(),
                None,
                CallSite::default(),
            )
            .unwrap();
        assert!(done.is_done());
        let held = done.clone();
        let status = fork_while_held(
            move |forked| {
                let _held = held.hold_state_lock();
                forked();
            },
            || {
                let ctx = sync_cpu_context();
                let input = || Input::Tensor(Arc::new(output_tensor(&done, 0).unwrap()));
                [EvalMode::SyncCpu, EvalMode::Eager]
                    .into_iter()
                    .all(|mode| {
                        ctx.invoke(
                            "add",
                            vec![input(), one()],
                            Args::new(),
                            Some(mode),
                            CallSite::default(),
                        )
                        .is_ok_and(|n| {
                            n.wait(Some(Duration::from_secs(5))).is_ok()
                                && matches!(n.result(), Some(Ok(_)))
                        })
                    })
            },
        );
        assert_child_ok(status);
    }

    /// A child forked while a parent thread held a host tensor's event lock (a kernel
    /// reading that tensor looked at its event) runs kernels on that tensor: plain host
    /// memory has no event to wait for, and its lock, held in the child by a thread the
    /// child does not have, is not taken (the child hung in the kernel's run).
    #[test]
    fn a_child_forked_while_a_host_tensors_event_lock_was_held_reads_it() {
        use crate::exec::{Args, CallSite, Input, TensorRef};
        use std::sync::Arc;
        crate::exec::fork::watch();
        let t = one_i32(5);
        let status = fork_while_event_lock_held(&t, || {
            let input = || Input::Tensor(Arc::new(TensorRef::ready(t.clone())));
            sync_cpu_context()
                .invoke(
                    "add",
                    vec![input(), input()],
                    Args::new(),
                    None,
                    CallSite::default(),
                )
                .is_ok_and(|n| matches!(n.result(), Some(Ok(_))))
        });
        assert_child_ok(status);
    }

    /// A child forked while a parent thread held a host tensor's event lock (another
    /// thread exporting it through DLPack looked at its event) exports that tensor:
    /// plain host memory has no event to order a consumer after, and its lock, held in
    /// the child by a thread the child does not have, is not taken (the child hung in
    /// `ndx_tensor_to_dlpack_versioned`).
    #[test]
    fn a_child_forked_while_a_host_tensors_event_lock_was_held_exports_it() {
        use crate::exec::TensorRef;
        use std::sync::Arc;
        crate::exec::fork::watch();
        let t = one_i32(7);
        let status = fork_while_event_lock_held(&t, || {
            let handle = crate::ffi::handle::into_handle::<crate::ffi::ndx_tensor_t>(Arc::new(
                TensorRef::ready(t.clone()),
            ));
            let mut out = std::ptr::null_mut();
            let e = crate::ffi::tensor::ndx_tensor_to_dlpack_versioned(handle, &mut out);
            let good = e.is_null() && !out.is_null() && {
                // SAFETY: an export ndx just made: its data is one i32, and its
                // deleter is called once.
                unsafe {
                    let value = *(*out).dl_tensor.data.cast::<i32>();
                    ((*out).deleter.unwrap())(out);
                    value == 7
                }
            };
            crate::ffi::tensor::ndx_tensor_release(handle);
            good
        });
        assert_child_ok(status);
    }

    /// A child forked while a parent thread was symbolising a call site's frames (an
    /// error's frames read on another thread) reads that site's frames: the site's cell
    /// is not being initialised while the slow symbolisation runs, only when its result
    /// is stored (the child waited forever for the parent thread to finish it).
    #[test]
    fn a_child_forked_while_a_site_was_being_symbolised_reads_its_frames() {
        use std::sync::Arc;
        crate::exec::fork::watch();
        let site = Arc::new(crate::error::Site::capture_native(
            crate::error::site::DEFAULT_DEPTH,
        ));
        let held = site.clone();
        let status = fork_while_held(
            move |forked| {
                held.run_in_next_resolve(forked);
                let _ = held.frames();
            },
            || !site.frames().is_empty(),
        );
        assert_child_ok(status);
    }

    /// A child forked while a parent thread was writing a failure's repro document (its
    /// first read, which symbolises the site) reads that document: it is written with
    /// no lock held, and its cell only stores it (the child waited forever for the
    /// parent thread to finish writing it).
    #[test]
    fn a_child_forked_while_a_repro_was_being_written_reads_it() {
        use crate::exec::{Args, CallSite, EvalMode, Input};
        crate::exec::fork::watch();
        let ctx = crate::exec::new_context(
            crate::exec::Settings {
                mode: EvalMode::Eager,
                ..crate::exec::Settings::default()
            },
            2,
        );
        let i32s = |v: &[i32]| Input::host(v, &[v.len() as i64]).unwrap();
        let node = ctx
            .invoke(
                "floordiv",
                vec![i32s(&[7, 8]), i32s(&[1, 0])],
                Args::new(),
                None,
                CallSite::default(),
            )
            .unwrap();
        node.wait(Some(Duration::from_secs(10))).unwrap();
        let Some(Err(e)) = node.result() else {
            panic!("floordiv by zero did not fail");
        };
        let e = e.clone();
        let site = e.site().expect("a site").clone();
        let held = e.clone();
        let status = fork_while_held(
            move |forked| {
                site.run_in_next_resolve(forked);
                let _ = held.repro();
            },
            || e.repro().is_some_and(|t| t.contains("floordiv")),
        );
        assert_child_ok(status);
    }

    /// A child forked while another thread was walking its stack for a call site (an
    /// `ndx_invoke` on another thread) captures sites: the fork waits for the walk to
    /// end. The `backtrace` crate's own lock stayed held in the child by a thread it
    /// does not have, and the child's first `ndx_invoke` hung (found as a test that
    /// failed one run in three while other tests invoked).
    #[test]
    fn a_child_forked_during_another_threads_stack_walk_captures_sites() {
        use crate::exec::{Args, CallSite, Input};
        crate::exec::fork::watch();
        let (walking, wait_walking) = mpsc::channel();
        let walker = std::thread::spawn(move || {
            let _unwinder = crate::error::site::unwinder_lock().lock();
            let mut walking = Some(walking);
            backtrace::trace(|_| {
                if let Some(w) = walking.take() {
                    w.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                }
                false
            });
        });
        wait_walking.recv().unwrap();
        let status = in_child(|| {
            let one = || Input::host(&[1i32], &[1]).unwrap();
            sync_cpu_context()
                .invoke(
                    "add",
                    vec![one(), one()],
                    Args::new(),
                    None,
                    CallSite::default(),
                )
                .is_ok_and(|n| matches!(n.result(), Some(Ok(_))) && !n.site().frames().is_empty())
        });
        walker.join().unwrap();
        assert_child_ok(status);
    }
}
