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
use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

use parking_lot::Mutex;

use super::DeviceState;

/// A finishing job: waits for its work and completes its invocation.
pub type Job = Box<dyn FnOnce() + Send>;

/// Where jobs for one device's thread go (`None`: the thread could not be started).
type Queue = Mutex<Option<Sender<Job>>>;

thread_local! {
    static ON_COMPLETION: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is a device's completion thread (which must not run a
/// user's callbacks or block on anything but its device).
pub fn on_completion_thread() -> bool {
    ON_COMPLETION.with(Cell::get)
}

/// Queues `job` on the completion thread of `device` (started on first use). A job
/// that cannot be queued (the thread could not be started) runs here instead.
pub fn submit(device: &DeviceState, job: Job) {
    static ALL: OnceLock<Vec<OnceLock<Queue>>> = OnceLock::new();
    let id = device.id();
    let sender = super::per_device(&ALL, device, || Mutex::new(start(id)));
    let job = match sender.lock().as_ref() {
        Some(tx) => match tx.send(job) {
            Ok(()) => return,
            Err(back) => back.0,
        },
        None => job,
    };
    job();
}

/// Starts the completion thread of device `id`; `None` if the system refused a thread.
fn start(id: i32) -> Option<Sender<Job>> {
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name(format!("ndx-cuda-done-{id}"))
        .spawn(move || {
            ON_COMPLETION.with(|c| c.set(true));
            while let Ok(job) = rx.recv() {
                // A job completes its invocation even when it panics (it catches the
                // panic itself); this only keeps the thread alive for the next one.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })
        .ok()
        .map(|_| tx)
}
