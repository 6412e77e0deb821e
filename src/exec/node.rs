//! An invocation: what to run, where it was asked for, and its future. A node runs
//! once every input it depends on is complete; its result is set exactly once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::args::Args;
use super::context::{Backend, ContextInner, EvalMode, JobHold};
use super::pool;
use super::value::{BatchRef, TensorRef};
use crate::checks;
use crate::debug::explain::{Flush, Why};
use crate::error::{Error, ErrorKind, Result, Site};
use crate::ops::{Kernel, OpDef, TMeta, kernels};
use crate::tensor::{Batch, Device, Tensor};

/// A computed output.
#[derive(Clone)]
pub enum Data {
    /// A tensor.
    Tensor(Arc<Tensor>),
    /// A batch.
    Batch(Arc<Batch>),
}

/// An input of an invocation.
#[derive(Clone)]
pub enum Input {
    /// A tensor (maybe pending).
    Tensor(Arc<TensorRef>),
    /// A batch (maybe pending).
    Batch(Arc<BatchRef>),
}

impl Input {
    /// A ready input: a new compact host tensor of shape `shape` holding `values` (as
    /// many as the shape has elements), of the dtype of `T`.
    pub fn host<T: crate::ops::kernels::Elem>(values: &[T], shape: &[i64]) -> Result<Input> {
        let t = crate::ops::kernels::make_overwritten(shape, "", |out: &mut [T]| {
            if out.len() != values.len() {
                return Err(Error::value(format!(
                    "shape {shape:?} holds {} elements, {} values were given",
                    out.len(),
                    values.len()
                )));
            }
            out.copy_from_slice(values);
            Ok(())
        })?;
        Ok(Input::Tensor(Arc::new(TensorRef::ready(Arc::new(t)))))
    }

    /// The invocation making it, while it is pending.
    pub(crate) fn producer(&self) -> Option<&Arc<Node>> {
        match self {
            Input::Tensor(t) => t.producer(),
            Input::Batch(b) => b.producer(),
        }
    }

    /// Where the data lives, when known without running anything.
    pub(crate) fn device(&self) -> Option<Device> {
        match self {
            Input::Tensor(t) => match t.ready_data() {
                Some(Ok(t)) => Some(t.device()),
                _ => t.producer().and_then(|n| n.out_device()),
            },
            Input::Batch(b) => match b.ready_data() {
                Some(Ok(b)) => Some(b.device()),
                _ => b.producer().and_then(|n| n.out_device()),
            },
        }
    }
}

/// What an output will be, as inferred at enqueue (`None`: known only after running).
#[derive(Clone, Debug)]
pub enum OutMeta {
    /// A tensor.
    Tensor(Option<TMeta>),
    /// A batch, per sample.
    Batch(Option<Vec<TMeta>>),
}

/// A callback run once when a node completes.
pub type Callback = Box<dyn FnOnce(&Arc<Node>) + Send>;

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Deferred: recorded, not yet asked for.
    Recorded,
    /// Asked for; waiting for inputs.
    Waiting,
    /// Ready to run; queued.
    Queued,
    /// Running.
    Running,
    /// Complete (the result is set).
    Done,
}

struct State {
    phase: Phase,
    deps_left: usize,
    dependents: Vec<Arc<Node>>,
    callbacks: Vec<Callback>,
}

/// Future status, as `ndx_future_poll` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not complete.
    Pending,
    /// Complete, outputs available.
    Ready,
    /// Complete, failed.
    Failed,
}

/// How long a waiter looks for completion before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

thread_local! {
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` marked as callback/host-operator code (where blocking waits are refused).
/// The mark is lifted also when `f` unwinds (a Rust host kernel or callback that
/// panicked): the thread stayed marked, and every later wait on it was refused.
pub(crate) fn as_callback<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0;
            let _ = IN_CALLBACK.try_with(|c| c.set(previous));
        }
    }
    let _restore = Restore(IN_CALLBACK.with(|c| c.replace(true)));
    f()
}

thread_local! {
    /// While a host kernel runs on this thread (`in_kernel_scope`): the DEFERRED and
    /// EAGER invocations it made, directly or through code it called.
    static KERNEL_ASYNC: RefCell<Option<Vec<Weak<Node>>>> = const { RefCell::new(None) };
}

/// Runs a host kernel `f` and returns, with its result, the DEFERRED and EAGER
/// invocations made on this thread while it ran (not those of a host kernel it ran
/// inline through a SYNC invocation: each kernel has its own scope). Whether such an
/// invocation has completed by the time the kernel returns is a matter of timing, so
/// its outputs are refused as the kernel's outputs complete or not, in every mode.
pub(crate) fn in_kernel_scope<R>(f: impl FnOnce() -> R) -> (R, Vec<Weak<Node>>) {
    let previous = KERNEL_ASYNC.with(|k| k.replace(Some(Vec::new())));
    // Restores the enclosing scope also when `f` unwinds.
    struct Restore(Option<Option<Vec<Weak<Node>>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(previous) = self.0.take() {
                KERNEL_ASYNC.with(|k| k.replace(previous));
            }
        }
    }
    let mut restore = Restore(Some(previous));
    let r = f();
    let made = KERNEL_ASYNC
        .with(|k| k.replace(restore.0.take().flatten()))
        .unwrap_or_default();
    (r, made)
}

/// Notes a DEFERRED or EAGER invocation for the host kernel running on this thread,
/// if any (see `in_kernel_scope`).
pub(crate) fn note_async_invocation(node: &Arc<Node>) {
    KERNEL_ASYNC.with(|k| {
        if let Some(made) = k.borrow_mut().as_mut() {
            made.push(Arc::downgrade(node));
        }
    });
}

/// A completion callback bound to its future, ready to run.
type Ready = Box<dyn FnOnce()>;

thread_local! {
    /// While a callback registered on a complete future runs on this thread: the
    /// callbacks registered on complete futures meanwhile, to run once it returns.
    static LATER: RefCell<Option<VecDeque<Ready>>> = const { RefCell::new(None) };
}

/// Runs a callback registered on a complete future, on this thread. One registered so
/// while another runs here runs after that one returns, not inside it: a callback that
/// invokes the next step of a loop and registers itself on it, complete already (a
/// SYNC invocation), would otherwise nest one level deeper per step and overflow the
/// stack. (Callbacks run at completion are not deferred: whoever waits for a
/// completion's callbacks to have returned, as a context's release does, can count on
/// them.)
fn run_callback(cb: Ready) {
    let first = LATER.with(|later| {
        let mut later = later.borrow_mut();
        match later.as_mut() {
            Some(queue) => {
                queue.push_back(cb);
                None
            }
            None => {
                *later = Some(VecDeque::new());
                Some(cb)
            }
        }
    });
    let Some(first) = first else { return };
    // Ends the loop even when a callback unwinds: what it left queued is dropped
    // uncalled (their user data freed), and later callbacks start a new loop.
    struct Loop;
    impl Drop for Loop {
        fn drop(&mut self) {
            let left = LATER.with(|later| later.borrow_mut().take());
            drop(left);
        }
    }
    let _loop = Loop;
    as_callback(first);
    while let Some(cb) = LATER.with(|later| later.borrow_mut().as_mut()?.pop_front()) {
        as_callback(cb);
    }
}

/// Whether a blocking wait here could deadlock the pool (a worker, a callback, a host
/// operator) or a device's completion thread (which must not wait for the jobs queued
/// behind the one it runs, say when the last handle to a context drops there).
pub(crate) fn must_not_block() -> bool {
    pool::on_worker()
        || IN_CALLBACK.with(Cell::get)
        || crate::cuda::completion::on_completion_thread()
}

fn no_blocking_error(what: &str) -> Error {
    Error::new(
        ErrorKind::Runtime,
        format!(
            "{what} from inside an ndx callback or host operator would block an ndx worker and may deadlock; \
             use ndx_future_on_ready or ndx_future_poll instead"
        ),
    )
}

/// A hash of a host tensor's bytes (0 for device memory), for the `debug` backend.
fn fingerprint(t: &Tensor) -> Result<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if t.device().kind == crate::tensor::DeviceKind::Cuda {
        // Copied to the host after the work before it on ndx's stream: hashed before
        // a run, it is the input the kernels read; after, what they left there.
        crate::cuda::ops::view_bytes(t)?.hash(&mut h);
    } else {
        match t.compact_bytes() {
            Ok(b) => b.hash(&mut h),
            Err(_) => return Ok(0),
        }
    }
    Ok(h.finish())
}

/// Checks each kernel output that has an out tensor against it, for operators that
/// could not infer their outputs: same dtype and shape, unless the kernel wrote it in
/// place already.
fn check_fit(outs: &[Arc<Tensor>], dests: &[Option<Arc<Tensor>>]) -> Result<()> {
    for (k, (t, d)) in outs.iter().zip(dests).enumerate() {
        let Some(d) = d else { continue };
        if !same_view(t, d) && (t.dtype() != d.dtype() || t.shape() != d.shape()) {
            return Err(Error::value(format!(
                "output {k} is {} {}, but its out tensor is {} {}",
                t.dtype().name(),
                crate::tensor::dims(t.shape()),
                d.dtype().name(),
                crate::tensor::dims(d.shape())
            )));
        }
    }
    Ok(())
}

/// Puts kernel outputs into their out tensors (pairs of an output and its out tensor,
/// if any, fitting as [`check_fit`] says): one the kernel wrote in place already is
/// that view; another is copied in and the result is the out view with the output's
/// layout. Every output is read before any out tensor is written, so an output that
/// lives in another's out tensor (a host kernel that made its outputs in another
/// order, an output passing through an input that is another's out tensor) is not
/// overwritten before it is copied.
fn place(pairs: Vec<(Arc<Tensor>, Option<Arc<Tensor>>)>) -> Result<Vec<Arc<Tensor>>> {
    let copied =
        |t: &Tensor, d: &Option<Arc<Tensor>>| d.as_ref().filter(|d| !same_view(t, d)).cloned();
    let targets: Vec<Arc<Tensor>> = pairs.iter().filter_map(|(t, d)| copied(t, d)).collect();
    if !targets.is_empty() {
        let sources = pairs
            .iter()
            .map(|(t, d)| match copied(t, d) {
                None => Ok(None),
                Some(_) if targets.iter().any(|x| t.overlaps(x)) => {
                    t.to_bytes().map(|b| Some(std::borrow::Cow::Owned(b)))
                }
                Some(_) => t.compact_bytes().map(Some),
            })
            .collect::<Result<Vec<_>>>()?;
        for ((t, d), bytes) in pairs.iter().zip(&sources) {
            if let (Some(d), Some(bytes)) = (copied(t, d), bytes) {
                d.write_compact(bytes)?;
            }
        }
    }
    Ok(pairs
        .into_iter()
        .map(|(t, d)| match copied(&t, &d) {
            Some(d) => Arc::new((*d).clone().with_layout(t.c_layout().to_owned())),
            None => t,
        })
        .collect())
}

/// Whether an out tensor of one sample of a per-sample run shares memory with an
/// input that another sample reads (`inputs`: each input's host extent, with its
/// sample, or `None` for a tensor every sample reads; `dests`: each out tensor's
/// extent and sample). Running the samples one after another would then overwrite
/// that input before it is read.
fn crosses_samples(
    mut inputs: Vec<((usize, usize), Option<usize>)>,
    dests: &[((usize, usize), usize)],
    n: usize,
) -> bool {
    inputs.sort_unstable_by_key(|((start, _), _)| *start);
    // The furthest end among the inputs up to each one, to stop the walk back early.
    let reach: Vec<usize> = inputs
        .iter()
        .scan(0, |m, ((_, end), _)| {
            *m = (*m).max(*end);
            Some(*m)
        })
        .collect();
    dests.iter().any(|&((start, end), s)| {
        let below = inputs.partition_point(|((a, _), _)| *a < end);
        (0..below).rev().take_while(|&j| reach[j] > start).any(|j| {
            let ((_, e), sample) = inputs[j];
            e > start && sample.map_or(n > 1, |r| r != s)
        })
    })
}

/// Whether two tensors are the same view of the same storage.
fn same_view(a: &Tensor, b: &Tensor) -> bool {
    Arc::ptr_eq(a.storage(), b.storage())
        && a.byte_offset() == b.byte_offset()
        && a.shape() == b.shape()
        && a.strides() == b.strides()
        && a.dtype() == b.dtype()
}

/// An invocation and its future.
pub struct Node {
    seq: u64,
    op: Arc<OpDef>,
    args: Args,
    site: Arc<Site>,
    mode: EvalMode,
    backend: Backend,
    events: bool,
    checks: checks::Settings,
    repro_max_bytes: u64,
    /// The latest invocation of this node's context at or upstream of this one that
    /// raised a check flag (0: none), set when it completes.
    taint: AtomicU64,
    /// The explain graph this invocation was flushed in, plus one (0: none).
    graph: AtomicU64,
    ctx: Weak<ContextInner>,
    out_meta: Vec<OutMeta>,
    /// Where the outputs will live, when known at enqueue.
    out_device: Option<Device>,
    batch_len: Option<usize>,
    /// Caller-given out tensors, one entry per output when any (`None`: allocate).
    outputs: Vec<Option<Data>>,
    inputs: Mutex<Vec<Input>>,
    state: Mutex<State>,
    cond: Condvar,
    result: OnceLock<Result<Vec<Data>>>,
    /// Set by the first completion (the run or a cancellation), before the result.
    completing: AtomicBool,
    /// Set once the callbacks run at completion have returned.
    finished: AtomicBool,
    observed: AtomicBool,
    failed_inputs: Mutex<Vec<Arc<Node>>>,
    /// GPU work this run launched and left for the device's completion thread.
    device_work: Mutex<Vec<DeviceWork>>,
    /// The outputs once the GPU work making them is enqueued (before it completes).
    launched: OnceLock<Vec<Data>>,
    /// Whether this invocation may run as soon as its producers' GPU work is enqueued
    /// rather than complete: it runs on the same device's stream, which orders it
    /// after that work ([`is_stream_consumer`]).
    stream_consumer: bool,
    /// The fork generation of the process that made it ([`super::fork`]).
    generation: u64,
}

/// Whether an invocation of `spec` is a stream consumer: EAGER or DEFERRED, a
/// built-in operator launched on a CUDA device, its inputs all tensors or batches on
/// that device (as known at enqueue), no out tensors, not `to_host` (which reads into
/// host memory at once). Its producers' failures are then found when it completes, on
/// the same completion thread, after theirs.
fn is_stream_consumer(spec: &NodeSpec) -> bool {
    let Some(device) = spec
        .out_device
        .filter(|d| d.kind == crate::tensor::DeviceKind::Cuda)
    else {
        return false;
    };
    matches!(spec.mode, EvalMode::Eager | EvalMode::Deferred)
        && matches!(spec.op.kernel, Kernel::Builtin(_))
        && spec.op.name != "to_host"
        && spec.outputs.is_empty()
        && !spec.inputs.is_empty()
        && spec.inputs.iter().all(|i| i.device() == Some(device))
}

/// Launched GPU work of one (per-sample) run, waited for off the worker.
struct DeviceWork {
    pending: crate::cuda::ops::Pending,
    /// Its inputs, for the repro document of a failure found at the wait.
    tensors: Vec<Arc<Tensor>>,
    sample: Option<usize>,
}

/// What a node needs at creation.
pub(crate) struct NodeSpec {
    pub seq: u64,
    pub op: Arc<OpDef>,
    pub args: Args,
    pub site: Arc<Site>,
    pub mode: EvalMode,
    pub backend: Backend,
    pub events: bool,
    pub checks: checks::Settings,
    pub repro_max_bytes: u64,
    pub ctx: Weak<ContextInner>,
    pub out_meta: Vec<OutMeta>,
    pub out_device: Option<Device>,
    pub batch_len: Option<usize>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<Option<Data>>,
}

/// Lets go of the chain of failed upstream invocations one at a time: a failure passed
/// down a long dependent pipeline makes each invocation hold the one that failed it,
/// and dropping that chain recursively (one stack frame per link) would overflow the
/// stack of whichever thread let go last.
impl Drop for Node {
    fn drop(&mut self) {
        let mut chain = std::mem::take(self.failed_inputs.get_mut());
        while let Some(up) = chain.pop() {
            // One still held elsewhere is its holder's to drop.
            if let Some(mut up) = Arc::into_inner(up) {
                chain.append(up.failed_inputs.get_mut());
            }
        }
    }
}

impl Node {
    /// A recorded node, registered as a dependent of its pending inputs.
    pub(crate) fn new(spec: NodeSpec) -> Arc<Node> {
        let stream_consumer = is_stream_consumer(&spec);
        let node = Arc::new(Node {
            seq: spec.seq,
            op: spec.op,
            args: spec.args,
            site: spec.site,
            mode: spec.mode,
            backend: spec.backend,
            events: spec.events,
            checks: spec.checks,
            repro_max_bytes: spec.repro_max_bytes,
            taint: AtomicU64::new(0),
            graph: AtomicU64::new(0),
            ctx: spec.ctx,
            out_meta: spec.out_meta,
            out_device: spec.out_device,
            batch_len: spec.batch_len,
            outputs: spec.outputs,
            inputs: Mutex::new(Vec::new()),
            state: Mutex::new(State {
                phase: Phase::Recorded,
                deps_left: 0,
                dependents: Vec::new(),
                callbacks: Vec::new(),
            }),
            cond: Condvar::new(),
            result: OnceLock::new(),
            completing: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            observed: AtomicBool::new(false),
            failed_inputs: Mutex::new(Vec::new()),
            device_work: Mutex::new(Vec::new()),
            launched: OnceLock::new(),
            stream_consumer,
            generation: super::fork::generation(),
        });
        for input in &spec.inputs {
            // A complete producer is not locked (nothing to wait for): in a child
            // forked while a parent thread held its lock, no one would let go of it.
            if let Some(up) = input.producer().filter(|up| !up.is_done()) {
                let mut s = up.state.lock();
                // A stream consumer reads outputs already launched without waiting.
                let launched = node.stream_consumer && up.launched.get().is_some();
                if s.phase != Phase::Done && !launched {
                    // Count the dependency before the upstream can see it: it may
                    // complete (and decrement) as soon as its lock is released.
                    node.state.lock().deps_left += 1;
                    s.dependents.push(node.clone());
                }
            }
        }
        *node.inputs.lock() = spec.inputs;
        node
    }

    /// The invocation's sequence number in its context.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// The operator name.
    pub fn op_name(&self) -> &str {
        &self.op.name
    }
    /// The eval mode it was enqueued with.
    pub fn mode(&self) -> EvalMode {
        self.mode
    }
    /// The enqueue site.
    pub fn site(&self) -> &Arc<Site> {
        &self.site
    }
    /// Inferred output metadata.
    pub fn out_meta(&self) -> &[OutMeta] {
        &self.out_meta
    }
    /// The number of samples of a per-sample invocation's batch outputs, known at
    /// enqueue (`None`: not a per-sample invocation, or an input failed before its
    /// length was known).
    pub(crate) fn batch_len(&self) -> Option<usize> {
        self.batch_len.filter(|&n| n > 0)
    }
    /// Where the outputs will live, when known at enqueue (`None`: ask the data).
    pub fn out_device(&self) -> Option<Device> {
        self.out_device
    }

    /// Output `i` once the GPU work making it is enqueued, for stream consumers.
    pub(crate) fn launched_output(&self, i: usize) -> Option<&Data> {
        self.launched.get()?.get(i)
    }

    /// Whether the invocation has completed.
    pub fn is_done(&self) -> bool {
        self.result.get().is_some()
    }

    /// Holds its state lock (for tests of a fork while another thread holds it).
    #[cfg(test)]
    pub(crate) fn hold_state_lock(&self) -> impl Sized + '_ {
        self.state.lock()
    }

    /// Whether it had not completed when this process forked off the one that made
    /// it: it never completes here ([`super::fork`]).
    pub fn lost_in_fork(&self) -> bool {
        self.generation != super::fork::generation() && !self.is_done()
    }

    /// The failure a lost invocation reads as ([`Node::lost_in_fork`]).
    pub fn lost_error(&self) -> Error {
        super::fork::stale_invocation(self.seq, &self.op.name)
    }
    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.state.lock().phase
    }

    /// Marks this failure (and the failures it was caused by) as reported to the user.
    pub fn mark_observed(&self) {
        if !self.observed.swap(true, Ordering::AcqRel) {
            for up in self.failed_inputs.lock().iter() {
                up.mark_observed();
            }
        }
    }
    /// Whether the failure was reported to the user.
    pub fn observed(&self) -> bool {
        self.observed.load(Ordering::Acquire)
    }

    /// The result if complete, for internal lookups: a failure found here does not
    /// count as observed (see [`Node::result`]).
    pub(crate) fn outcome(&self) -> Option<&Result<Vec<Data>>> {
        self.result.get()
    }

    /// The result if complete, handed to the user: a failure counts as observed (and
    /// is not reported again by `evaluate`).
    pub fn result(&self) -> Option<&Result<Vec<Data>>> {
        let r = self.result.get()?;
        if r.is_err() {
            self.mark_observed();
        }
        Some(r)
    }

    /// Non-blocking status; a deferred node is handed to the workers.
    pub fn poll(self: &Arc<Self>) -> Status {
        match self.result.get() {
            Some(Ok(_)) => Status::Ready,
            Some(Err(_)) => {
                self.mark_observed();
                Status::Failed
            }
            None => {
                self.submit_as(Why::new(Flush::Poll));
                Status::Pending
            }
        }
    }

    /// Waits until complete or `timeout` passes (`None`: forever). Submits deferred
    /// work. Refused from callbacks and host operators.
    pub fn wait(self: &Arc<Self>, timeout: Option<Duration>) -> Result<()> {
        self.wait_as(timeout, Why::new(Flush::Wait))
    }

    /// [`Node::wait`], recording `why` if it flushes deferred work.
    pub fn wait_as(self: &Arc<Self>, timeout: Option<Duration>, why: Why) -> Result<()> {
        if self.is_done() {
            return Ok(());
        }
        if self.lost_in_fork() {
            return Err(self.lost_error());
        }
        if must_not_block() {
            // Says what waited: a read of data or metadata is not a call to wait.
            let what = match why.reason {
                Flush::DataRead | Flush::Export => format!(
                    "reading the data of an output of invocation #{} ('{}'), which has not \
                     completed, waits for it; waiting",
                    self.seq, self.op.name
                ),
                Flush::Metadata => format!(
                    "the dtype and shape of an output of invocation #{} ('{}'), a host \
                     operator that infers none, are known once it has run; waiting for it",
                    self.seq, self.op.name
                ),
                _ => format!("waiting on invocation #{} ('{}')", self.seq, self.op.name),
            };
            return Err(no_blocking_error(&what));
        }
        self.submit_as(why);
        let deadline = timeout.map(|t| Instant::now() + t);
        // Small invocations finish within microseconds: look before going to sleep,
        // as a sleeping thread takes tens of microseconds to wake.
        let spin_until = Instant::now() + SPIN.min(timeout.unwrap_or(SPIN));
        while !self.is_done() && Instant::now() < spin_until {
            std::thread::yield_now();
        }
        if self.is_done() {
            return Ok(());
        }
        // In process-events mode this thread runs the queued callbacks, holding a
        // public reference meanwhile: a callback that releases the last other one
        // leaves the release to the end of this wait, on this thread.
        let ctx = if self.events {
            self.ctx.upgrade().and_then(|c| c.handle())
        } else {
            None
        };
        let mut state = self.state.lock();
        while state.phase != Phase::Done {
            // In process-events mode the waiting thread runs the queued callbacks and
            // host operators itself, so it wakes up regularly to look for them.
            let slice = if ctx.is_some() {
                Some(Duration::from_millis(1))
            } else {
                None
            };
            let until = match (deadline, slice) {
                (Some(d), Some(s)) => Some(d.min(Instant::now() + s)),
                (Some(d), None) => Some(d),
                (None, Some(s)) => Some(Instant::now() + s),
                (None, None) => None,
            };
            match until {
                Some(u) => {
                    self.cond.wait_until(&mut state, u);
                }
                None => self.cond.wait(&mut state),
            }
            if state.phase == Phase::Done {
                break;
            }
            // Time is looked at before running queued work, which may take long and
            // is not started once time ran out.
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "invocation #{} ('{}') did not complete within {:?}; the future stays valid",
                        self.seq,
                        self.op.name,
                        timeout.unwrap_or_default()
                    ),
                ));
            }
            if let Some(ctx) = &ctx {
                drop(state);
                ctx.run_events_until(deadline);
                state = self.state.lock();
            }
        }
        Ok(())
    }

    /// The outputs, forcing evaluation (recorded as `why`) and waiting; the error
    /// when it failed.
    pub fn force_as(self: &Arc<Self>, why: Why) -> Result<&Vec<Data>> {
        self.wait_as(None, why)?;
        match self.result() {
            Some(Ok(outputs)) => Ok(outputs),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::internal("a completed invocation has no result")),
        }
    }

    /// Hands a recorded node (and the recorded nodes it depends on) to the workers;
    /// a flush of deferred work counts as a graph asked for by a poll.
    pub fn submit(self: &Arc<Self>) {
        self.submit_as(Why::new(Flush::Poll));
    }

    /// [`Node::submit`], recording `why` if it flushes deferred work.
    pub fn submit_as(self: &Arc<Self>, why: Why) {
        Node::submit_all(std::slice::from_ref(self), why);
    }

    /// Hands recorded nodes (and the recorded nodes they depend on) to the workers as
    /// one graph; the deferred ones among them are counted in the explain report.
    /// Each node is tracked by its own context: a graph may pull in producers recorded
    /// in another context, which are counted there, in a graph of that context.
    pub(crate) fn submit_all(nodes: &[Arc<Node>], why: Why) {
        // The contexts met so far, each with its explain graph (opened on its first
        // deferred node; `Some(None)` once the records are full).
        let mut contexts: Vec<(Arc<ContextInner>, Option<Option<usize>>)> = Vec::new();
        let mut stack: Vec<Arc<Node>> = nodes.iter().rev().cloned().collect();
        while let Some(node) = stack.pop() {
            if node.lost_in_fork() {
                continue; // its context's bookkeeping stayed with the parent
            }
            if node.is_done() {
                // Nothing to submit, nor upstream of it; not locked (see `Node::new`).
                continue;
            }
            let ready = {
                let mut s = node.state.lock();
                if s.phase != Phase::Recorded {
                    continue;
                }
                // Tracked before it can run: once Waiting, an upstream completing on a
                // worker may run and complete it before this thread goes on.
                if let Some(ctx) = node.ctx.upgrade() {
                    let k = match contexts.iter().position(|(c, _)| Arc::ptr_eq(c, &ctx)) {
                        Some(k) => k,
                        None => {
                            contexts.push((ctx, None));
                            contexts.len() - 1
                        }
                    };
                    let (ctx, graph) = &mut contexts[k];
                    ctx.node_started(&node);
                    if node.mode == EvalMode::Deferred {
                        let id = *graph.get_or_insert_with(|| ctx.open_graph(&why, node.seq));
                        if let Some(id) = id {
                            node.graph.store(id as u64 + 1, Ordering::Release);
                        }
                        ctx.graph_add(id);
                    }
                }
                s.phase = if s.deps_left == 0 {
                    Phase::Queued
                } else {
                    Phase::Waiting
                };
                s.phase == Phase::Queued
            };
            for input in node.inputs.lock().iter() {
                if let Some(up) = input.producer() {
                    stack.push(up.clone());
                }
            }
            if ready {
                node.dispatch();
            }
        }
        for (ctx, graph) in contexts {
            if let Some(Some(id)) = graph {
                ctx.graph_done(id);
            }
        }
    }

    /// The explain graph this invocation ran in, if any.
    pub(crate) fn graph(&self) -> Option<usize> {
        (self.graph.load(Ordering::Acquire) as usize).checked_sub(1)
    }

    /// Submits the node's producers and waits for them (SYNC modes).
    pub(crate) fn wait_for_inputs(self: &Arc<Self>) -> Result<()> {
        let producers: Vec<Arc<Node>> = self
            .inputs
            .lock()
            .iter()
            .filter_map(|i| i.producer().cloned())
            .collect();
        for up in &producers {
            if !up.is_done() {
                if must_not_block() {
                    return Err(no_blocking_error(&format!(
                        "a SYNC invocation of '{}' waiting for its input from invocation #{}",
                        self.op.name,
                        up.seq()
                    )));
                }
                up.submit_as(Why {
                    reason: Flush::Consumer,
                    site: Some(self.site.clone()),
                });
                up.wait(None)?;
            }
        }
        Ok(())
    }

    /// Runs the node on the calling thread (SYNC modes), once its inputs are complete.
    pub(crate) fn run_inline(self: &Arc<Self>) {
        {
            let mut s = self.state.lock();
            s.phase = Phase::Queued;
            s.deps_left = 0;
        }
        if let Some(ctx) = self.ctx.upgrade() {
            ctx.node_started(self);
        }
        self.execute();
    }

    /// Counts a job about to hold this node on a worker or completion thread (see
    /// [`JobHold`]); nothing when its context is gone.
    fn hold_job(&self) -> Option<JobHold> {
        self.ctx.upgrade().map(|c| c.hold_job())
    }

    fn dispatch(self: &Arc<Self>) {
        let node = self.clone();
        let host_op = matches!(self.op.kernel, Kernel::Host(_));
        if self.events
            && host_op
            && let Some(ctx) = self.ctx.upgrade()
        {
            // Refused once the context is closed: no thread would run it any more.
            if ctx.push_event(Box::new(move || node.execute())).is_err() {
                self.cancel("its context was released");
            }
            return;
        }
        let hold = self.hold_job();
        pool::submit(move || {
            // A panic outside the kernel (caught in `execute`) still completes the
            // node, so no one waits for it forever.
            if let Err(p) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.execute()))
            {
                node.complete(Err(node.panic_error("running", p)));
            }
            drop(node);
            drop(hold);
        });
    }

    fn dependency_done(self: &Arc<Self>) {
        let ready = {
            let mut s = self.state.lock();
            s.deps_left = s.deps_left.saturating_sub(1);
            if s.deps_left == 0 && s.phase == Phase::Waiting {
                s.phase = Phase::Queued;
                true
            } else {
                false
            }
        };
        if ready {
            self.dispatch();
        }
    }

    /// Runs a queued node (on a worker, inline, or in process-events) and completes it,
    /// or, when it left GPU work to wait for, hands the completion to the device's
    /// completion thread.
    pub(crate) fn execute(self: &Arc<Self>) {
        {
            let mut s = self.state.lock();
            if s.phase != Phase::Queued {
                return; // cancelled meanwhile
            }
            s.phase = Phase::Running;
        }
        let inputs = std::mem::take(&mut *self.inputs.lock());
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.compute(&inputs)))
                .unwrap_or_else(|p| Err(self.panic_error("running", p)));
        let work = std::mem::take(&mut *self.device_work.lock());
        // A stream consumer that read outputs of work still running learns whether
        // that work failed only once it completes, on the completion thread.
        let finisher = match work.first() {
            Some(w) => Some(w.pending.device()),
            None if self.stream_consumer => inputs
                .iter()
                .filter(|i| i.producer().is_some_and(|p| !p.is_done()))
                .find_map(|i| crate::cuda::device(i.device()?.id).ok()),
            None => None,
        };
        let Some(device) = finisher else {
            let outcome = outcome
                .and_then(|(data, raised)| self.settle_flags(&inputs, raised).map(|()| data));
            drop(inputs);
            self.complete(self.enrich(outcome));
            return;
        };
        let launched = match &outcome {
            Ok((data, _)) if !work.is_empty() => Some(data.clone()),
            _ => None,
        };
        let node = self.clone();
        let hold = self.hold_job();
        crate::cuda::completion::submit(
            device,
            Box::new(move || {
                node.finish_device(inputs, outcome, work);
                drop(node);
                drop(hold);
            }),
        );
        if let Some(data) = launched {
            self.release_stream_consumers(data);
        }
    }

    /// Makes the outputs of enqueued GPU work readable by stream consumers and lets
    /// the waiting ones run: they enqueue after this work on the same stream. Called
    /// after the completion job is queued, so theirs comes after it.
    fn release_stream_consumers(self: &Arc<Self>, data: Vec<Data>) {
        let _ = self.launched.set(data);
        let early: Vec<Arc<Node>> = {
            let mut s = self.state.lock();
            if s.phase == Phase::Done {
                return; // completed meanwhile: every dependent was released
            }
            let (early, rest) = std::mem::take(&mut s.dependents)
                .into_iter()
                .partition(|d| d.stream_consumer);
            s.dependents = rest;
            early
        };
        for d in early {
            d.dependency_done();
        }
    }

    /// Waits for the GPU work a run launched (on the device's completion thread),
    /// raises its flags and completes the node.
    fn finish_device(
        self: &Arc<Self>,
        inputs: Vec<Input>,
        outcome: Result<(Vec<Data>, Vec<checks::Raised>)>,
        work: Vec<DeviceWork>,
    ) {
        let active = self.checks.active();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.upstream_failure(&inputs)?;
            let (data, mut raised) = outcome?;
            for w in work {
                let DeviceWork {
                    pending,
                    tensors,
                    sample,
                } = w;
                let (r, scoped) = checks::run_scoped(active, || pending.finish());
                r.map_err(|e| self.backend_wrap(self.with_repro(e, &tensors, sample)))?;
                raised.extend(scoped.raised.into_iter().map(|mut f| {
                    f.sample = sample;
                    f
                }));
            }
            self.settle_flags(&inputs, raised)?;
            Ok(data)
        }))
        .unwrap_or_else(|p| Err(self.panic_error("finishing", p)));
        drop(inputs);
        self.complete(self.enrich(outcome));
    }

    /// The failure of a producer this node read before it completed (a stream
    /// consumer's), as this node's own error. Producers on the device complete first:
    /// their completion jobs were queued before this node ran.
    fn upstream_failure(&self, inputs: &[Input]) -> Result<()> {
        for (i, input) in inputs.iter().enumerate() {
            let Some(up) = input.producer() else { continue };
            match up.outcome() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(self.dependency_error(i, up, e)),
                None => {
                    return Err(Error::internal(format!(
                        "input {i} of '{}' (#{}) was not complete when it finished",
                        self.op.name, self.seq
                    )));
                }
            }
        }
        Ok(())
    }

    /// A panic caught while `doing` this node's work, as an INTERNAL error.
    fn panic_error(&self, doing: &str, p: Box<dyn std::any::Any + Send>) -> Error {
        let msg = pool::panic_message(p.as_ref());
        Error::internal(format!("panic while {doing} '{}': {msg}", self.op.name))
    }

    /// A failure of this node, with its op, sequence number and enqueue site.
    fn enrich(&self, outcome: Result<Vec<Data>>) -> Result<Vec<Data>> {
        outcome.map_err(|e| {
            e.with_op(&self.op.name, self.seq)
                .with_site(self.site.clone())
        })
    }

    /// The upstream failure of input `i`, as this node's own error. The upstream
    /// failure travels on as its cause: it is reported with this one (observing this
    /// one observes it), not on its own.
    fn dependency_error(&self, i: usize, up: &Arc<Node>, upstream: &Error) -> Error {
        self.failed_inputs.lock().push(up.clone());
        up.mark_observed();
        Error::new(
            upstream.kind(),
            format!(
                "input {i} of '{}' (#{}) failed: it is the output of '{}' (#{}), which failed",
                self.op.name,
                self.seq,
                up.op_name(),
                up.seq()
            ),
        )
        .with_cause(upstream.clone())
    }

    /// Runs the kernel(s): the outputs and the flags raised on the host.
    fn compute(&self, inputs: &[Input]) -> Result<(Vec<Data>, Vec<checks::Raised>)> {
        // Inputs: every producer is complete now (or, for a stream consumer, its GPU
        // work is enqueued on the stream this node runs on).
        enum In<'a> {
            T(&'a Arc<Tensor>),
            B(&'a Arc<Batch>),
        }
        let mut ready = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.iter().enumerate() {
            let data = match input {
                Input::Tensor(t) => t
                    .ready_data()
                    .or_else(|| self.stream_consumer.then(|| t.launched_data().map(Ok))?)
                    .map(|r| r.map(In::T)),
                Input::Batch(b) => b
                    .ready_data()
                    .or_else(|| self.stream_consumer.then(|| b.launched_data().map(Ok))?)
                    .map(|r| r.map(In::B)),
            };
            match data {
                Some(Ok(d)) => ready.push(d),
                Some(Err(upstream)) => {
                    let up = input.producer().cloned().ok_or_else(|| upstream.clone())?;
                    return Err(self.dependency_error(i, &up, &upstream));
                }
                None => {
                    return Err(Error::internal(format!(
                        "input {i} of '{}' is not complete",
                        self.op.name
                    )));
                }
            }
        }
        let active = self.checks.active();
        let mut raised: Vec<checks::Raised> = Vec::new();
        // Runs the kernel on one set of inputs (sample `sample` of a per-sample run):
        // its outputs placed in their out tensors, or with `later`, the outputs and
        // their out tensors to place once every sample has run (nothing lent).
        type Pairs = Vec<(Arc<Tensor>, Option<Arc<Tensor>>)>;
        // A host kernel's allocations are tensors the embedder makes (a copy each):
        // lent out tensors would be taken by whichever comes first of the dtype and
        // shape — another output, which then stayed a view of that out tensor and was
        // overwritten by its own output, or a tensor the kernel keeps.
        let host = matches!(self.op.kernel, Kernel::Host(_));
        let mut run = |tensors: Vec<Arc<Tensor>>, sample: Option<usize>, later: bool| {
            let dests = self.destinations(sample)?;
            let lent = dests
                .iter()
                .flatten()
                .filter(|d| {
                    // A misaligned one is computed aside and copied in, byte by byte.
                    !later
                        && !host
                        && d.is_compact()
                        && d.is_aligned()
                        && !tensors.iter().any(|t| t.overlaps(d))
                })
                .cloned()
                .collect();
            let outs = crate::tensor::dest::with_lent(lent, || {
                if active == 0 {
                    checks::run_unscoped(|| self.run_kernel(&tensors, sample))
                } else {
                    if let Some(ctx) = self.ctx.upgrade() {
                        ctx.count_checked_run();
                    }
                    let (outs, outcome) =
                        checks::run_scoped(active, || self.run_kernel(&tensors, sample));
                    raised.extend(outcome.raised.into_iter().map(|mut r| {
                        r.sample = sample;
                        r
                    }));
                    outs
                }
            });
            outs.and_then(|outs| {
                check_fit(&outs, &dests)?;
                let pairs: Pairs = if dests.is_empty() {
                    outs.into_iter().map(|t| (t, None)).collect()
                } else {
                    outs.into_iter().zip(dests).collect()
                };
                if later {
                    Ok(pairs)
                } else {
                    place(pairs).map(|o| o.into_iter().map(|t| (t, None)).collect())
                }
            })
            .map_err(|e| self.with_repro(e, &tensors, sample))
        };
        let result = match self.batch_len {
            None => {
                // A batch here is taken whole: its samples are the kernel's inputs.
                let tensors = ready
                    .iter()
                    .flat_map(|d| match d {
                        In::T(t) => std::slice::from_ref(*t),
                        In::B(b) => b.samples(),
                    })
                    .cloned()
                    .collect();
                run(tensors, None, false)
                    .map(|outs| outs.into_iter().map(|(t, _)| Data::Tensor(t)).collect())
            }
            // A closure, so a failing sample goes through `backend_wrap` below too.
            Some(n) => (|| -> Result<Vec<Data>> {
                // When a sample's out tensor is another sample's input, every sample
                // runs before anything is written.
                let later = !self.outputs.is_empty() && {
                    let inputs = ready
                        .iter()
                        .flat_map(|d| match d {
                            In::T(t) => vec![(t.host_extent(), None)],
                            In::B(b) => (b.samples().iter())
                                .enumerate()
                                .map(|(s, t)| (t.host_extent(), Some(s)))
                                .collect(),
                        })
                        .filter_map(|(e, s)| Some((e?, s)))
                        .collect();
                    let mut dests = Vec::new();
                    for s in 0..n {
                        for d in self.destinations(Some(s))?.iter().flatten() {
                            dests.extend(d.host_extent().map(|e| (e, s)));
                        }
                    }
                    crosses_samples(inputs, &dests, n)
                };
                let mut per_output: Vec<Vec<Arc<Tensor>>> =
                    vec![Vec::with_capacity(n); self.op.n_outputs];
                let mut unplaced = Vec::new();
                for s in 0..n {
                    let tensors = ready
                        .iter()
                        .map(|d| match d {
                            In::T(t) => Ok((*t).clone()),
                            In::B(b) => b.sample(s).cloned(),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let outs = run(tensors, Some(s), later)?;
                    if later {
                        unplaced.extend(outs);
                        continue;
                    }
                    for (k, (t, _)) in outs.into_iter().enumerate() {
                        per_output[k].push(t);
                    }
                }
                if later {
                    let k = self.op.n_outputs.max(1);
                    for (i, t) in place(unplaced)?.into_iter().enumerate() {
                        per_output[i % k].push(t);
                    }
                }
                per_output
                    .into_iter()
                    .enumerate()
                    .map(|(k, samples)| {
                        Batch::new(samples)
                            .map(|b| Data::Batch(Arc::new(b)))
                            .map_err(|e| {
                                // Names the runs' output, not an input batch.
                                Error::new(
                                    e.kind(),
                                    format!(
                                        "output {k} of the per-sample runs makes no batch: {}",
                                        e.message()
                                    ),
                                )
                            })
                    })
                    .collect()
            })(),
        };
        let result = result.map_err(|e| self.backend_wrap(e))?;
        Ok((result, raised))
    }

    /// The caller's out tensor for tensor output `index`, if it gave one.
    pub(crate) fn out_tensor(&self, index: usize) -> Option<&Arc<Tensor>> {
        match self.outputs.get(index) {
            Some(Some(Data::Tensor(t))) => Some(t),
            _ => None,
        }
    }

    /// The out tensors of one run: of the whole invocation, or of batch sample `s`.
    fn destinations(&self, sample: Option<usize>) -> Result<Vec<Option<Arc<Tensor>>>> {
        self.outputs
            .iter()
            .map(|o| match (o, sample) {
                (None, _) => Ok(None),
                (Some(Data::Tensor(t)), _) => Ok(Some(t.clone())),
                (Some(Data::Batch(b)), Some(s)) => b.sample(s).cloned().map(Some),
                (Some(Data::Batch(_)), None) => Err(Error::internal(
                    "a batch out tensor for a tensor output passed the checks",
                )),
            })
            .collect()
    }

    /// Attaches the repro document of this failing call to its error and, for one
    /// run of a per-sample invocation, the failing batch sample (`ndx_error_sample`).
    fn with_repro(&self, e: Error, inputs: &[Arc<Tensor>], sample: Option<usize>) -> Error {
        let e = match sample {
            Some(s) => e.with_sample(s),
            None => e,
        };
        // Symbolises nothing: the site's frames are resolved when the document is read.
        let doc = crate::debug::repro::Document::new(
            &crate::debug::repro::Invocation {
                op: &self.op.name,
                args: &self.args,
                inputs,
                sample,
                mode: self.mode,
                backend: self.backend.name(),
                site: &self.site,
            },
            &e,
            self.repro_max_bytes,
        );
        e.with_repro(doc)
    }

    /// Runs the kernel once (per sample for batches), with the `debug` backend's
    /// checks, the accuracy fault and, when NAN is checked and the kernel did not fuse
    /// it, a pass over the outputs for non-finite values made from finite inputs.
    fn run_kernel(
        &self,
        tensors: &[Arc<Tensor>],
        sample: Option<usize>,
    ) -> Result<Vec<Arc<Tensor>>> {
        // Host-accessible CUDA memory (managed) is read by the host below (CPU kernels,
        // host operators, `to_device`'s upload): first its producer's stream must have
        // reached the import's event.
        for (i, t) in tensors.iter().enumerate() {
            t.storage().wait_host_readable().map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "input {i} ({}): waiting for its producer's stream: {}",
                        t.device(),
                        e.message()
                    ),
                )
            })?;
        }
        // Fails where a kernel would, so the error carries the repro document too.
        if let Backend::InjectRuntime(op) = &self.backend
            && *op == self.op.name
        {
            return Err(Error::new(
                ErrorKind::Runtime,
                format!(
                    "injected runtime error in operator '{op}' (backend inject_runtime_error:{op})"
                ),
            ));
        }
        let debug = self.backend == Backend::Debug;
        let before = if debug {
            tensors
                .iter()
                .map(|t| fingerprint(t))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        if self.op.name == "to_device"
            || tensors
                .iter()
                .any(|t| t.device().kind == crate::tensor::DeviceKind::Cuda)
        {
            let outs = self.run_cuda(tensors, sample)?;
            if debug {
                // Checked once the work has run (the inputs' bytes are read after it
                // on ndx's stream); a violation fails the node, whose launched work
                // (EAGER, DEFERRED) is then left unread.
                self.debug_check(tensors, &before, &outs)?;
            }
            return Ok(outs);
        }
        let mut outs = match &self.op.kernel {
            Kernel::Builtin(f) => {
                let refs: Vec<&Tensor> = tensors.iter().map(|t| t.as_ref()).collect();
                f(&refs, &self.args)?
                    .into_iter()
                    .map(Arc::new)
                    .collect::<Vec<_>>()
            }
            Kernel::Host(h) => as_callback(|| h.run(tensors, &self.args, self.op.n_outputs))?,
        };
        // A host operator's outputs get the pass too: nothing inside it watched NAN.
        if checks::nan_unhandled() {
            crate::ops::check::flag_new_non_finite(tensors, &outs);
        }
        if let Backend::InjectAccuracy(op) = &self.backend
            && *op == self.op.name
        {
            outs = outs
                .iter()
                .map(|t| kernels::add_one(t).map(Arc::new))
                .collect::<Result<_>>()?;
        }
        if debug {
            self.debug_check(tensors, &before, &outs)?;
        }
        Ok(outs)
    }

    /// Runs the operator on CUDA inputs through the launchers of `src/cuda/ops.rs`.
    /// SYNC_CPU returns once the work is enqueued (unless its flags must be read);
    /// SYNC_FULL when the whole stream has completed. EAGER and DEFERRED return once
    /// the work is enqueued too, leaving the wait for it to the device's completion
    /// thread, which completes the node (see [`Node::execute`]).
    fn run_cuda(&self, tensors: &[Arc<Tensor>], sample: Option<usize>) -> Result<Vec<Arc<Tensor>>> {
        let metas: Vec<TMeta> = tensors.iter().map(|t| TMeta::of(t)).collect();
        let refs: Vec<&TMeta> = metas.iter().collect();
        let outs = match &self.op.infer {
            Some(infer) => infer(&refs, &self.args)?,
            None => {
                return Err(Error::new(
                    ErrorKind::NotImplemented,
                    format!(
                        "operator '{}' has no CUDA kernel (inputs on the GPU)",
                        self.op.name
                    ),
                ));
            }
        };
        let inv = crate::cuda::ops::Invocation {
            op: &self.op.name,
            seq: self.seq,
            site: &self.site,
            wait: self.mode != EvalMode::SyncCpu,
            whole_stream: self.mode == EvalMode::SyncFull,
            defer: matches!(self.mode, EvalMode::Eager | EvalMode::Deferred),
            perturb: matches!(&self.backend, Backend::InjectAccuracy(op) if *op == self.op.name),
        };
        let launched = crate::cuda::ops::run(&inv, tensors, &self.args, &outs)?;
        if let Some(pending) = launched.pending {
            self.device_work.lock().push(DeviceWork {
                pending,
                tensors: tensors.to_vec(),
                sample,
            });
        }
        Ok(launched.outs)
    }

    /// Ties the flags the kernel raised to this invocation: FAIL_FAST fails it with
    /// the first; COLLECT hands them to the context. Sets the node's taint either way.
    fn settle_flags(&self, inputs: &[Input], raised: Vec<checks::Raised>) -> Result<()> {
        let upstream = inputs
            .iter()
            .filter_map(|i| i.producer())
            // Sequence numbers are per context: another context's would name an
            // unrelated invocation of this one (or this very one).
            .filter(|p| Weak::ptr_eq(&p.ctx, &self.ctx))
            .map(|p| p.taint.load(Ordering::Acquire))
            .max()
            .unwrap_or(0);
        if raised.is_empty() {
            self.taint.store(upstream, Ordering::Release);
            return Ok(());
        }
        self.taint.store(self.seq, Ordering::Release);
        let flags = raised.into_iter().map(|raised| checks::Flag {
            seq: self.seq,
            op: self.op.name.clone(),
            site: self.site.clone(),
            raised,
            occurrences: 1,
            folded: 1,
            last_seq: self.seq,
            consequence_of: upstream,
        });
        let ctx = self.ctx.upgrade();
        if let Some(ctx) = &ctx {
            ctx.count_flags(flags.len() as u64);
        }
        if self.checks.policy == checks::Policy::FailFast {
            let mut flags = flags;
            return match flags.next() {
                // An execution failure like a kernel's: with the run's repro document,
                // and wrapped by the `noexcept` backend.
                Some(first) => {
                    let sample = first.raised.sample;
                    let e = self.with_repro(first.to_error(), &run_inputs(inputs, sample), sample);
                    Err(self.backend_wrap(e))
                }
                None => Ok(()),
            };
        }
        if let Some(ctx) = ctx {
            ctx.collect_flags(flags);
        }
        Ok(())
    }

    /// The `debug` backend's checks of one (per-sample) call: outputs against the
    /// schema (a built-in's inferred metadata, a host operator's declared promises),
    /// inputs unchanged (`before`: their [`fingerprint`]s), outputs not sharing an
    /// input's memory (host or CUDA device addresses).
    fn debug_check(
        &self,
        inputs: &[Arc<Tensor>],
        before: &[u64],
        outs: &[Arc<Tensor>],
    ) -> Result<()> {
        let op = &self.op.name;
        let fail = |what: String| {
            Err(Error::new(
                ErrorKind::Backend,
                format!("debug backend: operator '{op}' {what}"),
            ))
        };
        if outs.len() != self.op.n_outputs {
            return fail(format!(
                "produced {} outputs, its schema declares {}",
                outs.len(),
                self.op.n_outputs
            ));
        }
        let builtin = matches!(self.op.kernel, Kernel::Builtin(_));
        let (decls, may_alias) = match &self.op.kernel {
            Kernel::Builtin(_) => {
                let metas: Vec<TMeta> = inputs.iter().map(|t| TMeta::of(t)).collect();
                let refs: Vec<&TMeta> = metas.iter().collect();
                let inferred = match &self.op.infer {
                    Some(infer) => infer(&refs, &self.args)?,
                    None => Vec::new(),
                };
                let decls = inferred
                    .into_iter()
                    .map(|m| (Some(m.dtype), Some(m.shape), Some(m.layout)))
                    .collect::<Vec<_>>();
                (decls, false)
            }
            Kernel::Host(h) => {
                let c = h.contract();
                let decls = c
                    .outputs
                    .into_iter()
                    .map(|d| (d.dtype, d.ndim.map(|n| vec![-1; n]), d.layout))
                    .collect();
                (decls, c.may_alias)
            }
        };
        let mut decls = decls.into_iter();
        for (i, out) in outs.iter().enumerate() {
            // Undeclared outputs are only checked for aliasing.
            let (dtype, shape, layout) = decls.next().unwrap_or((None, None, None));
            if let Some(d) = dtype
                && out.dtype() != d
            {
                return fail(format!(
                    "output {i} has dtype {}, its schema declares {}",
                    out.dtype().name(),
                    d.name()
                ));
            }
            if let Some(shape) = shape {
                // A rank-only promise is a shape of -1s.
                let ok = out.ndim() == shape.len()
                    && out
                        .shape()
                        .iter()
                        .zip(&shape)
                        .all(|(&a, &b)| b == -1 || a == b);
                if !ok {
                    let declared = if shape.iter().all(|&d| d == -1) {
                        format!("rank {}", shape.len())
                    } else {
                        format!("shape {}", crate::tensor::dims(&shape))
                    };
                    return fail(format!(
                        "output {i} has shape {}, its schema declares {declared}",
                        crate::tensor::dims(out.shape())
                    ));
                }
            }
            if let Some(layout) = layout
                && out.layout() != layout
            {
                return fail(format!(
                    "output {i} has layout \"{}\", its schema declares \"{layout}\"",
                    out.layout()
                ));
            }
            if !may_alias {
                // A built-in may pass an input through as it is (the check operators).
                let aliased = inputs
                    .iter()
                    .position(|t| t.overlaps(out) && !(builtin && same_view(t, out)));
                if let Some(k) = aliased {
                    return fail(format!(
                        "output {i} shares memory with input {k}; a schema without NDX_OP_OUTPUTS_MAY_ALIAS promises new memory"
                    ));
                }
            }
        }
        for (k, (t, &h)) in inputs.iter().zip(before).enumerate() {
            if fingerprint(t)? != h {
                let ro = if t.read_only() { "read-only " } else { "" };
                return fail(format!(
                    "wrote into its {ro}input {k} (shape {}, dtype {}): inputs are never written",
                    crate::tensor::dims(t.shape()),
                    t.dtype().name()
                ));
            }
        }
        Ok(())
    }

    /// The `noexcept` backend turns every execution failure into a BACKEND error.
    fn backend_wrap(&self, e: Error) -> Error {
        match self.backend {
            Backend::NoExcept => {
                let sample = e.sample();
                let wrapped = Error::new(
                    ErrorKind::Backend,
                    format!("unexpected error when running {}", self.op.name),
                )
                .with_cause(
                    e.with_op(&self.op.name, self.seq)
                        .with_site(self.site.clone()),
                );
                match sample {
                    Some(s) => wrapped.with_sample(s),
                    None => wrapped,
                }
            }
            _ => e,
        }
    }

    /// Sets the result, wakes waiters, releases dependents and runs callbacks.
    pub(crate) fn complete(self: &Arc<Self>, outcome: Result<Vec<Data>>) {
        let failed = outcome.is_err();
        if self.completing.swap(true, Ordering::AcqRel) {
            return; // completed already (cancelled)
        }
        let ctx = self.ctx.upgrade();
        // The explain graph's time, before the result: whoever sees this invocation
        // READY sees its graph's time too, when it was the graph's last.
        if let (Some(ctx), Some(id)) = (&ctx, self.graph()) {
            ctx.graph_done(id);
        }
        let _ = self.result.set(outcome);
        let (dependents, callbacks) = {
            let mut s = self.state.lock();
            s.phase = Phase::Done;
            (
                std::mem::take(&mut s.dependents),
                std::mem::take(&mut s.callbacks),
            )
        };
        self.cond.notify_all();
        for d in dependents {
            d.dependency_done();
        }
        let callbacks_empty = callbacks.is_empty();
        let node = self.clone();
        let rest = move || {
            for cb in callbacks {
                node.fire(cb, ctx.as_ref());
            }
            if let Some(ctx) = ctx {
                ctx.node_done(&node, failed);
            }
            let _state = node.state.lock();
            node.finished.store(true, Ordering::Release);
            node.cond.notify_all();
        };
        // A device's completion thread runs no user code: callbacks run on a worker,
        // and teardown waits for them as for any other (`wait_finished`). Without
        // callbacks the rest runs here, so the node lets go of what it holds at once
        // (an allocation waiting in `completion::drain` counts on that).
        if !callbacks_empty && crate::cuda::completion::on_completion_thread() {
            let hold = self.hold_job();
            pool::submit(move || {
                rest();
                drop(hold);
            });
        } else {
            rest();
        }
    }

    /// Waits until the node is complete and the callbacks run at its completion have
    /// returned (context teardown).
    pub(crate) fn wait_finished(&self) {
        let mut state = self.state.lock();
        while !self.finished.load(Ordering::Acquire) {
            self.cond.wait(&mut state);
        }
    }

    /// Runs (or queues, in process-events mode) a callback at completion.
    fn fire(self: &Arc<Self>, cb: Callback, ctx: Option<&Arc<ContextInner>>) {
        let node = self.clone();
        match ctx {
            // Refused when its context was released without waiting for this work: no
            // thread will process its events any more, and a process-events callback
            // never runs on the thread completing the work. Dropped uncalled (its
            // user_free runs).
            Some(ctx) if self.events => drop(ctx.push_event(Box::new(move || cb(&node)))),
            _ if self.events => drop(cb),
            // A callback that panics stops there, reported on stderr: unwinding out of
            // the completion left the invocation unfinished (its later callbacks not
            // run, a release or `evaluate` waiting for it forever).
            _ => {
                let run = std::panic::AssertUnwindSafe(|| as_callback(|| cb(&node)));
                if let Err(p) = std::panic::catch_unwind(run) {
                    eprintln!(
                        "ndx: a completion callback of invocation #{} ('{}') panicked: {}",
                        self.seq,
                        self.op.name,
                        pool::panic_message(p.as_ref())
                    );
                }
            }
        }
    }

    /// Registers `cb` to run once on completion; at once (on this thread) when done,
    /// or, from inside another callback run so, once that one returns
    /// ([`run_callback`]).
    /// A deferred node is handed to the workers (recorded as a poll's flush): a
    /// callback waits for nothing else.
    pub fn on_ready(self: &Arc<Self>, cb: Callback) {
        // Complete: not locked (see `Node::new`).
        let registered = if self.is_done() {
            Some(cb)
        } else {
            let mut s = self.state.lock();
            // The result is set just before the phase turns Done: once it is set (as
            // a wait that returned has seen), the callback runs here and now.
            if s.phase != Phase::Done && self.result.get().is_none() {
                s.callbacks.push(cb);
                None
            } else {
                Some(cb)
            }
        };
        let Some(cb) = registered else {
            self.submit_as(Why::new(Flush::Poll));
            return;
        };
        // Complete: queued for process-events while someone processes them, else (its
        // context released, or the queue refusing it as the release closes it) run at
        // once on the registering thread.
        let node = self.clone();
        match self.ctx.upgrade() {
            Some(ctx) if self.events => {
                if let Err(cb) = ctx.push_event(Box::new(move || cb(&node))) {
                    run_callback(cb);
                }
            }
            _ => run_callback(Box::new(move || cb(&node))),
        }
    }

    /// Cancels the node if it has not started: it fails with `NDX_ERROR_CANCELLED`.
    /// That failure counts as observed, since whoever cancelled it knows the outcome:
    /// `evaluate` does not report it (invocations that fail with it as their cause
    /// are reported, as their work did not happen either).
    pub fn cancel(self: &Arc<Self>, why: &str) -> bool {
        if self.is_done() {
            return false; // not locked (see `Node::new`)
        }
        {
            let mut s = self.state.lock();
            if !matches!(s.phase, Phase::Recorded | Phase::Waiting | Phase::Queued) {
                return false;
            }
            s.phase = Phase::Running; // nobody else may start it now
        }
        let e = Error::new(
            ErrorKind::Cancelled,
            format!(
                "invocation #{} ('{}') was cancelled before it ran: {why}",
                self.seq, self.op.name
            ),
        )
        .with_op(&self.op.name, self.seq)
        .with_site(self.site.clone());
        self.inputs.lock().clear();
        self.mark_observed();
        self.complete(Err(e));
        true
    }
}

/// The tensors a completed run read: the whole invocation's inputs (a batch's samples
/// all), or those of batch sample `s` (a tensor input is every sample's).
fn run_inputs(inputs: &[Input], sample: Option<usize>) -> Vec<Arc<Tensor>> {
    let mut tensors = Vec::new();
    for input in inputs {
        match input {
            Input::Tensor(t) => {
                if let Some(Ok(t)) = t.ready_data().or_else(|| t.launched_data().map(Ok)) {
                    tensors.push(t.clone());
                }
            }
            Input::Batch(b) => {
                if let Some(Ok(b)) = b.ready_data().or_else(|| b.launched_data().map(Ok)) {
                    match sample {
                        Some(s) => tensors.extend(b.sample(s).ok().cloned()),
                        None => tensors.extend(b.samples().iter().cloned()),
                    }
                }
            }
        }
    }
    tensors
}
