//! The completion thread of each device: EAGER and DEFERRED invocations hand it the
//! wait for their launched work, so no worker blocks on the GPU while it runs, and the
//! worker is free to launch the next invocation at once.
//!
//! One thread per device runs the finishing jobs in the order they were handed in.
//! Work on ndx's stream of a device completes in launch order, so waiting for each
//! job's event in turn costs nothing the GPU would not take anyway, and an invocation
//! always finishes after the invocations launched before it (whose outputs it may
//! read). The thread never runs a user's code: a job that completes a future hands its
//! callbacks to the workers (see [`on_completion_thread`]).

use std::cell::Cell;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use super::DeviceState;

/// A finishing job: waits for its work and completes its invocation.
pub type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    static ON_COMPLETION: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is a device's completion thread (which must not run a
/// user's callbacks or block on anything but its device).
pub fn on_completion_thread() -> bool {
    ON_COMPLETION.with(Cell::get)
}

/// One device's completion thread: where jobs go, and how many were handed in and
/// have finished.
struct Queue {
    /// `None`: the thread could not be started.
    tx: Mutex<Option<Sender<Job>>>,
    progress: Arc<Progress>,
}

/// How many jobs were handed in and have finished, shared with the thread.
#[derive(Default)]
struct Progress {
    counts: Mutex<(u64, u64)>,
    finished: Condvar,
}

fn queue(device: &DeviceState) -> &'static Queue {
    static ALL: OnceLock<Vec<OnceLock<Queue>>> = OnceLock::new();
    let id = device.id();
    super::per_device(&ALL, device, || {
        let progress = Arc::new(Progress::default());
        Queue {
            tx: Mutex::new(start(id, progress.clone())),
            progress,
        }
    })
}

/// Queues `job` on the completion thread of `device` (started on first use). A job
/// that cannot be queued (the thread could not be started) runs here instead.
pub fn submit(device: &DeviceState, job: Job) {
    let q = queue(device);
    let job = {
        let tx = q.tx.lock();
        match tx.as_ref() {
            Some(tx) => {
                q.progress.counts.lock().0 += 1;
                match tx.send(job) {
                    Ok(()) => return,
                    Err(back) => {
                        q.progress.counts.lock().0 -= 1;
                        back.0
                    }
                }
            }
            None => job,
        }
    };
    job();
}

/// Waits until every job handed to `device`'s completion thread before this call has
/// finished (their invocations completed and their inputs released), as an allocation
/// that found the device full does before it tries again. Says whether it waited;
/// never waits on the completion thread itself.
pub fn drain(device: &DeviceState) -> bool {
    if on_completion_thread() {
        return false;
    }
    let p = &queue(device).progress;
    let mut counts = p.counts.lock();
    let target = counts.0;
    if counts.1 >= target {
        return false;
    }
    while counts.1 < target {
        p.finished.wait(&mut counts);
    }
    true
}

/// Starts the completion thread of device `id`; `None` if the system refused a thread.
fn start(id: i32, progress: Arc<Progress>) -> Option<Sender<Job>> {
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name(format!("ndx-cuda-done-{id}"))
        .spawn(move || {
            ON_COMPLETION.with(|c| c.set(true));
            while let Ok(job) = rx.recv() {
                // A job completes its invocation even when it panics (it catches the
                // panic itself); this only keeps the thread alive for the next one.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                progress.counts.lock().1 += 1;
                progress.finished.notify_all();
            }
        })
        .ok()
        .map(|_| tx)
}
