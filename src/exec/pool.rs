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

use parking_lot::Mutex;

/// The pool of the process that made it first (fork generation 0).
static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// The pools of forked children, by fork generation (see [`super::fork`]): a child has
/// none of its parent's worker threads, so its first use makes a pool of its own, as
/// large. The parent's is left as it is, never dropped (its threads are not there to
/// join).
static CHILD_POOLS: Mutex<Vec<(u64, &'static rayon::ThreadPool)>> = Mutex::new(Vec::new());

thread_local! {
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is an ndx worker.
pub fn on_worker() -> bool {
    ON_WORKER.with(Cell::get)
}

/// The most worker threads a pool is started with: `ndx_context_options_t.num_threads`
/// above it is refused, an `NDX_NUM_THREADS` above it ignored like any other value
/// that is not a thread count. (A mistaken `-1` would otherwise start tens of
/// thousands of threads, for minutes, before the call returned.)
pub const MAX_THREADS: usize = 4096;

fn default_threads() -> usize {
    std::env::var("NDX_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0 && n <= MAX_THREADS)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

fn pool(requested: usize) -> &'static rayon::ThreadPool {
    let generation = super::fork::generation();
    if generation == 0 {
        return POOL.get_or_init(|| build(requested));
    }
    child_pool(generation, requested)
}

/// The pool of this forked child (fork generation `generation`), made on first use.
#[cold]
fn child_pool(generation: u64, requested: usize) -> &'static rayon::ThreadPool {
    let mut pools = CHILD_POOLS.lock();
    if let Some((_, p)) = pools.iter().find(|(g, _)| *g == generation) {
        return p;
    }
    // As large as the pool it replaces (the first one's, or the latest child's).
    let threads = pools
        .last()
        .map(|(_, p)| p.current_num_threads())
        .or_else(|| POOL.get().map(rayon::ThreadPool::current_num_threads))
        .unwrap_or(requested);
    let p: &'static rayon::ThreadPool = Box::leak(Box::new(build(threads)));
    pools.push((generation, p));
    p
}

fn build(requested: usize) -> rayon::ThreadPool {
    // From now on a fork must be seen: the child has none of these threads.
    super::fork::watch();
    let threads = if requested > 0 {
        requested.min(MAX_THREADS)
    } else {
        default_threads()
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("ndx-worker-{i}"))
        .start_handler(|_| ON_WORKER.with(|w| w.set(true)))
        .build()
        .expect("starting the ndx worker pool")
}

/// Starts the pool (if not started) with `requested` threads (0: the default), and
/// says how many it has.
pub fn init(requested: usize) -> usize {
    pool(requested).current_num_threads()
}

/// Queues a job on the pool, first come first served. A panic in the job stops there
/// (reported on stderr): rayon would abort the process on it, and a panic must not
/// kill the host process. The job starts with no out tensor lent to its allocations
/// (`tensor::dest`): a worker waiting for the pieces of a kernel runs queued jobs
/// itself, inside that kernel's lending, and one of them (another invocation's
/// callbacks, say) must not allocate in the kernel's out tensor.
pub fn submit(job: impl FnOnce() + Send + 'static) {
    pool(0).spawn_fifo(move || {
        let job = || crate::tensor::dest::with_lent(Vec::new(), job);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;

    use crate::tensor::{DType, Tensor, dest};

    /// A job that runs nested on a worker while an out tensor is lent there (a kernel
    /// waiting for its pieces runs queued jobs, and with them other invocations'
    /// callbacks) allocates its own memory, not the lent out tensor.
    #[test]
    fn a_job_run_while_an_out_tensor_is_lent_does_not_take_it() {
        let fresh = || Tensor::new_host(DType::F32, &[4], Default::default(), |_| Ok(())).unwrap();
        let out = Arc::new(fresh());
        // Until the job runs on the lending thread itself (an idle worker may steal it).
        for _ in 0..1000 {
            let (tx, rx) = mpsc::channel();
            let lent = out.clone();
            let nested = super::install(move || {
                let here = std::thread::current().id();
                dest::with_lent(vec![lent.clone()], || {
                    let out = lent;
                    super::submit(move || {
                        let t = fresh();
                        let took = Arc::ptr_eq(t.storage(), out.storage());
                        let _ = tx.send((std::thread::current().id(), took));
                    });
                    loop {
                        if let Ok((thread, took)) = rx.try_recv() {
                            return (thread == here).then_some(took);
                        }
                        rayon::yield_local();
                    }
                })
            });
            if let Some(took) = nested {
                assert!(!took, "the nested job took the lent out tensor");
                return;
            }
        }
        panic!("the job never ran on the lending worker");
    }
}
