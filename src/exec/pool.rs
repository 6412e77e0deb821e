//! The one process-wide worker pool every context shares, for invocations and for the
//! pieces of a large kernel alike.
//!
//! Its size comes from the first context that needs it (its `num_threads` option), else
//! `NDX_NUM_THREADS`, else the number of available cores. Workers live for the
//! process. No job blocks a worker on another worker: dependencies are counted (a node
//! is queued only when all its inputs are complete), and a kernel split into pieces
//! (`ops::par`) runs them with work stealing, so the thread that waits for a piece runs
//! pieces (or other queued work) itself. The pool is a rayon thread pool: rayon does
//! the stealing; the scheduling of invocations stays ndx's.

use std::cell::Cell;
use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

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

fn pool(requested: usize) -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let threads = if requested > 0 {
            requested
        } else {
            default_threads()
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("ndx-worker-{i}"))
            .start_handler(|_| ON_WORKER.with(|w| w.set(true)))
            .build()
            .expect("starting the ndx worker pool")
    })
}

/// Starts the pool (if not started) with `requested` threads (0: the default), and
/// says how many it has.
pub fn init(requested: usize) -> usize {
    pool(requested).current_num_threads()
}

/// Queues a job on the pool, first come first served. A panic in the job stops there
/// (reported on stderr): rayon would abort the process on it, and a panic must not
/// kill the host process.
pub fn submit(job: impl FnOnce() + Send + 'static) {
    pool(0).spawn_fifo(move || {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
            eprintln!(
                "ndx: internal error: a job on an ndx worker panicked: {}",
                panic_message(p.as_ref())
            );
        }
    });
}

/// The message a panic was raised with (empty when it is not text).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// Runs `f` inside the pool, so that parallel iterators in it use the pool's workers
/// (directly when called from a worker).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool(0).install(f)
}
