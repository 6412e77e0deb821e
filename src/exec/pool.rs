//! The one process-wide worker pool every context shares.
//!
//! Its size comes from the first context that needs it (its `num_threads` option), else
//! `NDX_NUM_THREADS`, else the number of available cores. Workers live for the
//! process; jobs never block a worker on another worker (dependencies are counted, and
//! a node is queued only when all its inputs are complete).

use std::cell::Cell;
use std::sync::OnceLock;

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, unbounded};

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Pool {
    sender: Sender<Job>,
    threads: usize,
}

static POOL: OnceLock<Pool> = OnceLock::new();

thread_local! {
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is an ndx worker.
pub fn on_worker() -> bool {
    ON_WORKER.with(Cell::get)
}

fn default_threads() -> usize {
    std::env::var("NDX_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

fn pool(requested: usize) -> &'static Pool {
    POOL.get_or_init(|| {
        let threads = if requested > 0 {
            requested
        } else {
            default_threads()
        };
        let (sender, receiver) = unbounded::<Job>();
        for i in 0..threads {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("ndx-worker-{i}"))
                .spawn(move || {
                    ON_WORKER.with(|w| w.set(true));
                    while let Some(job) = next_job(&receiver) {
                        job();
                    }
                })
                .expect("spawning an ndx worker thread");
        }
        Pool { sender, threads }
    })
}

/// How long an idle worker keeps looking for work before it sleeps: waking a
/// sleeping thread costs tens of microseconds, which would dominate small invocations.
const SPIN: Duration = Duration::from_micros(50);

fn next_job(receiver: &Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + SPIN;
    loop {
        match receiver.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() < until => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return receiver.recv().ok(),
        }
    }
}

/// Starts the pool (if not started) with `requested` threads (0: the default).
pub fn init(requested: usize) -> usize {
    pool(requested).threads
}

/// Queues a job on the pool.
pub fn submit(job: impl FnOnce() + Send + 'static) {
    // The receiving side lives as long as the workers, which live for the process.
    let _ = pool(0).sender.send(Box::new(job));
}
