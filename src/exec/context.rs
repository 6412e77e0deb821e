//! Contexts: the defaults of invocations (eval mode, capture policy, backend,
//! callbacks), the operator registry, and the bookkeeping that lets
//! `ndx_context_evaluate` run everything and report every unobserved failure.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

use super::args::Args;
use super::node::{Data, Input, Node, NodeSpec, OutMeta, as_callback, must_not_block};
use super::pool;
use super::value::{BatchRef, TensorRef};
use crate::debug::explain::{Flush, Why};
use crate::error::{Error, ErrorKind, Frame, Result, Site};
use crate::ops::{OpDef, Registry, TMeta};
use crate::tensor::{Device, DeviceKind, Tensor};

/// When an invocation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum EvalMode {
    /// On the calling thread before `invoke` returns (device work may still be queued).
    SyncCpu = 1,
    /// Like `SyncCpu`, and all device work finished before return.
    SyncFull = 2,
    /// Recorded; runs when a result is needed, on `evaluate`, or on the first poll.
    Deferred = 3,
    /// Submitted to the workers at once; `invoke` returns immediately.
    Eager = 4,
}

impl EvalMode {
    /// The mode with ABI value `raw`.
    pub fn from_raw(raw: i32) -> Option<EvalMode> {
        use EvalMode::*;
        [SyncCpu, SyncFull, Deferred, Eager]
            .into_iter()
            .find(|m| *m as i32 == raw)
    }
    /// Whether the work runs before `invoke` returns.
    pub fn is_sync(self) -> bool {
        matches!(self, EvalMode::SyncCpu | EvalMode::SyncFull)
    }
}

/// Which frames an invocation records beyond its caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum CapturePolicy {
    /// Only the caller frame (or the explicit location).
    Off = 1,
    /// The explicit location and the frame provider's host frames.
    Host = 2,
    /// Native frames up to the depth limit.
    Native = 3,
    /// Explicit location, host frames, then native frames.
    All = 4,
}

impl CapturePolicy {
    /// The policy with ABI value `raw`.
    pub fn from_raw(raw: i32) -> Option<CapturePolicy> {
        use CapturePolicy::*;
        [Off, Host, Native, All]
            .into_iter()
            .find(|m| *m as i32 == raw)
    }
}

/// How execution is done and failures reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Plain execution.
    Default,
    /// Every execution failure becomes `NDX_ERROR_BACKEND` with the original as cause.
    NoExcept,
    /// Every invocation's outputs are checked against the operator's schema (and its
    /// inputs for being left unchanged); a violation is `NDX_ERROR_BACKEND`.
    Debug,
    /// The operator fails at enqueue.
    InjectCompile(String),
    /// The operator fails during execution.
    InjectRuntime(String),
    /// The operator's outputs are silently perturbed (+1).
    InjectAccuracy(String),
}

impl Backend {
    /// The backend's name, as [`Backend::parse`] reads it.
    pub fn name(&self) -> String {
        match self {
            Backend::Default => "default".into(),
            Backend::NoExcept => "noexcept".into(),
            Backend::Debug => "debug".into(),
            Backend::InjectCompile(op) => format!("inject_compile_error:{op}"),
            Backend::InjectRuntime(op) => format!("inject_runtime_error:{op}"),
            Backend::InjectAccuracy(op) => format!("inject_accuracy_error:{op}"),
        }
    }

    /// The operator a fault-injection backend names.
    pub fn op(&self) -> Option<&str> {
        match self {
            Backend::InjectCompile(op)
            | Backend::InjectRuntime(op)
            | Backend::InjectAccuracy(op) => Some(op),
            _ => None,
        }
    }

    /// Refuses a fault-injection backend whose operator `registry` does not have (a
    /// misspelt name would otherwise inject nothing, and a test of error handling
    /// would pass without ever seeing an error).
    pub fn check_op(&self, registry: &Registry) -> Result<()> {
        let Some(op) = self.op() else {
            return Ok(());
        };
        if registry.get(op).is_some() {
            return Ok(());
        }
        let hint = registry
            .suggest(op)
            .map(|s| format!("; did you mean '{s}'?"))
            .unwrap_or_default();
        Err(Error::value(format!(
            "backend '{}' names operator '{op}', which is neither a built-in nor a host operator registered on this context{hint} (register a host operator with ndx_register_op before a backend names it)",
            self.name()
        )))
    }

    /// Parses a backend name.
    pub fn parse(name: &str) -> Result<Backend> {
        let fault = |prefix: &str| {
            name.strip_prefix(prefix)
                .filter(|op| !op.is_empty())
                .map(str::to_string)
        };
        Ok(match name {
            "default" => Backend::Default,
            "noexcept" => Backend::NoExcept,
            "debug" => Backend::Debug,
            _ => {
                if let Some(op) = fault("inject_compile_error:") {
                    Backend::InjectCompile(op)
                } else if let Some(op) = fault("inject_runtime_error:") {
                    Backend::InjectRuntime(op)
                } else if let Some(op) = fault("inject_accuracy_error:") {
                    Backend::InjectAccuracy(op)
                } else {
                    return Err(Error::value(format!(
                        "unknown backend '{name}'; expected default, noexcept, debug, inject_compile_error:OP, inject_runtime_error:OP or inject_accuracy_error:OP"
                    )));
                }
            }
        })
    }
}

/// Supplies up to `capacity` of the host language's frames at enqueue, innermost first.
pub type FrameProvider = Arc<dyn Fn(usize) -> Vec<Frame> + Send + Sync>;

thread_local! {
    /// Set while a frame provider runs on this thread.
    static IN_PROVIDER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `provider`'s frames, unless this thread is already inside a provider: an
/// invocation a provider makes (directly, or through host code it calls) records no
/// host frames instead of calling a provider again, which recursed without end.
fn provided_frames(provider: &FrameProvider, capacity: usize) -> Vec<Frame> {
    if IN_PROVIDER.with(|f| f.replace(true)) {
        return Vec::new();
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_PROVIDER.with(|f| f.set(false));
        }
    }
    let _leave = Leave;
    provider(capacity)
}

/// Context settings (all changeable after creation).
#[derive(Clone)]
pub struct Settings {
    /// Default eval mode.
    pub mode: EvalMode,
    /// Capture policy.
    pub capture: CapturePolicy,
    /// Deepest capture: native return addresses (inlined functions can make one of
    /// them several frames) and host frames asked of the provider.
    pub depth: usize,
    /// Backend.
    pub backend: Backend,
    /// Callbacks (and host operators) run only inside `process_events` or a wait.
    pub events_mode: bool,
    /// Host frame provider.
    pub provider: Option<FrameProvider>,
    /// Error-flag checks: policy, categories, capacity.
    pub checks: crate::checks::Settings,
    /// Most input bytes a failing invocation's repro document carries (0: none).
    pub repro_max_bytes: u64,
    /// The device `to_device` copies to when not told.
    pub cuda_device: i32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            mode: EvalMode::Eager,
            capture: CapturePolicy::Native,
            depth: crate::error::DEFAULT_DEPTH,
            backend: Backend::Default,
            events_mode: false,
            provider: None,
            checks: crate::checks::Settings::default(),
            repro_max_bytes: crate::debug::repro::DEFAULT_MAX_BYTES,
            cuda_device: 0,
        }
    }
}

/// Where the invoking call came from, as the entry point saw it.
#[derive(Default)]
pub struct CallSite {
    /// An explicit location (`NDX_HERE`): replaces the native caller frame.
    pub location: Option<Frame>,
    /// The return address into the caller, when the entry point could read it.
    pub caller_ip: Option<usize>,
}

#[derive(Default)]
struct Tracker {
    /// Every node not complete yet (recorded, waiting, queued, running).
    pending: HashMap<u64, Arc<Node>>,
    /// Deferred nodes not submitted yet, in enqueue order.
    recorded: Vec<Arc<Node>>,
    /// Failed nodes not yet reported by `evaluate`.
    failed: Vec<Arc<Node>>,
}

/// A callback or host operator queued for process-events.
pub(crate) type Event = Box<dyn FnOnce() + Send>;

/// A context's shared state. Work in flight holds it too (`Arc` clones): only the
/// public references ([`Context`]) decide when the context is released.
pub struct ContextInner {
    /// Public references ([`Context`] values) alive; the last one gone releases it.
    handles: AtomicUsize,
    /// Set once no thread will run this context's queued callbacks any more (it was
    /// released): in process-events mode, callbacks of work completing later are
    /// dropped uncalled, never run on the worker that completes it.
    closed: AtomicBool,
    settings: Mutex<Arc<Settings>>,
    registry: Registry,
    seq: AtomicU64,
    tracker: Mutex<Tracker>,
    idle: Condvar,
    events: Mutex<VecDeque<Event>>,
    /// Jobs on workers and completion threads that hold an invocation of this context
    /// ([`JobHold`]); a release that waits waits for them to let go.
    jobs: Mutex<usize>,
    jobs_done: Condvar,
    /// Raised check flags waiting to be reported (COLLECT).
    flags: Mutex<crate::checks::Collector>,
    /// Check flags raised since creation (every policy).
    flags_raised: AtomicU64,
    /// Kernel runs that had checks enabled.
    checked_runs: AtomicU64,
    /// The explain counters.
    stats: Mutex<crate::debug::explain::Stats>,
    /// The fork generation of the process that made it ([`super::fork`]).
    generation: u64,
}

/// A public reference to a context (behind `ndx_context_t`). Cloning adds one; when
/// the last one goes, the context is released on the thread that drops it: what has
/// not started is cancelled, what is running is waited for (unless that thread is a
/// worker, a callback or a host operator, where it does not wait) and the callbacks
/// queued for process-events run. Internal references held by work in flight never
/// release it, so whichever thread drops the last of those does not decide.
pub struct Context {
    inner: Arc<ContextInner>,
}

impl Clone for Context {
    fn clone(&self) -> Context {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Context {
            inner: self.inner.clone(),
        }
    }
}

impl std::ops::Deref for Context {
    type Target = Arc<ContextInner>;
    fn deref(&self) -> &Arc<ContextInner> {
        &self.inner
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.release();
        }
    }
}

/// Creates a context; `threads` sizes the shared pool if it does not exist yet.
pub fn new_context(settings: Settings, threads: usize) -> Context {
    pool::init(threads);
    let inner = Arc::new(ContextInner {
        handles: AtomicUsize::new(1),
        closed: AtomicBool::new(false),
        settings: Mutex::new(Arc::new(settings.clone())),
        registry: Registry::new(),
        seq: AtomicU64::new(0),
        tracker: Mutex::new(Tracker::default()),
        idle: Condvar::new(),
        flags: Mutex::new(crate::checks::Collector::new(settings.checks.capacity)),
        flags_raised: AtomicU64::new(0),
        checked_runs: AtomicU64::new(0),
        stats: Mutex::new(Default::default()),
        events: Mutex::new(VecDeque::new()),
        jobs: Mutex::new(0),
        jobs_done: Condvar::new(),
        generation: super::fork::generation(),
    });
    Context { inner }
}

/// A job queued on a worker or a device's completion thread that holds an invocation
/// of a context: dropped after the job's own reference to the invocation, so a
/// release that waits for running work also waits until no worker still holds what
/// that work held (out tensors, results; dropping the last reference calls a
/// producer's deleter), and no deleter runs on a worker after it returned.
pub(crate) struct JobHold(Arc<ContextInner>);

impl Drop for JobHold {
    fn drop(&mut self) {
        let mut n = self.0.jobs.lock();
        *n -= 1;
        if *n == 0 {
            self.0.jobs_done.notify_all();
        }
    }
}

impl ContextInner {
    /// Counts a job that holds one of this context's invocations until it drops the
    /// hold.
    pub(crate) fn hold_job(self: &Arc<Self>) -> JobHold {
        *self.jobs.lock() += 1;
        JobHold(self.clone())
    }

    /// A new public reference, unless the context was released already.
    pub(crate) fn handle(self: &Arc<Self>) -> Option<Context> {
        let mut n = self.handles.load(Ordering::Acquire);
        loop {
            if n == 0 {
                return None;
            }
            match self
                .handles
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Context {
                        inner: self.clone(),
                    });
                }
                Err(now) => n = now,
            }
        }
    }

    /// The current settings (a snapshot; changes make a new one).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.lock().clone()
    }
    /// Changes the settings for later invocations.
    pub fn update(&self, f: impl FnOnce(&mut Settings)) {
        let previous = {
            let mut guard = self.settings.lock();
            let mut next = Settings::clone(&guard);
            f(&mut next);
            std::mem::replace(&mut *guard, Arc::new(next))
        };
        // Dropped after the lock: the last reference to a replaced frame provider runs
        // its `user_free`, which may call back into ndx on this context.
        drop(previous);
    }
    /// Changes the check settings for later invocations (flags already collected
    /// stay until reported).
    pub fn set_checks(&self, checks: crate::checks::Settings) {
        self.flags.lock().set_capacity(checks.capacity);
        self.update(|s| s.checks = checks);
    }

    /// Every collected check flag as one `NDX_ERROR_CHECK` error (flags in enqueue
    /// order), `None` when none is waiting. Does not wait for running work.
    pub fn take_check_errors(&self) -> Option<Error> {
        self.flags.lock().take()
    }

    /// `(flags raised, kernel runs with checks enabled)` since the context was made.
    pub fn check_counts(&self) -> (u64, u64) {
        (
            self.flags_raised.load(Ordering::Relaxed),
            self.checked_runs.load(Ordering::Relaxed),
        )
    }

    /// What this context evaluated so far (`ndx_context_explain`).
    pub fn explain(&self) -> crate::debug::explain::Explain {
        self.stats.lock().snapshot(self.check_counts().0)
    }

    pub(crate) fn open_graph(&self, why: &crate::debug::explain::Why, seq: u64) -> Option<usize> {
        self.stats.lock().open(why, seq)
    }

    pub(crate) fn graph_add(&self, id: Option<usize>) {
        self.stats.lock().add(id);
    }

    pub(crate) fn graph_done(&self, id: usize) {
        self.stats.lock().done(id);
    }

    pub(crate) fn count_flags(&self, n: u64) {
        self.flags_raised.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn count_checked_run(&self) {
        self.checked_runs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn collect_flags(&self, flags: impl IntoIterator<Item = crate::checks::Flag>) {
        let mut c = self.flags.lock();
        for f in flags {
            c.add(f);
        }
    }

    /// The host operator registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records where an invocation was asked for, per the capture policy.
    #[inline(always)]
    fn capture(settings: &Settings, mode: EvalMode, call: CallSite) -> Site {
        let host = match (settings.capture, &settings.provider) {
            (CapturePolicy::Host | CapturePolicy::All, Some(p)) => {
                provided_frames(p, settings.depth.max(1))
            }
            _ => Vec::new(),
        };
        let deep = matches!(settings.capture, CapturePolicy::Native | CapturePolicy::All)
            && !mode.is_sync();
        let show_native = match settings.capture {
            CapturePolicy::Host => host.is_empty() && call.location.is_none(),
            _ => true,
        };
        let native = if deep {
            Site::capture_native(settings.depth)
        } else {
            match call.caller_ip {
                Some(ip) => Site::from_ips(vec![ip]),
                None => Site::capture_native(1),
            }
        };
        native.with_frames(call.location, host, show_native)
    }

    /// `e`, refused before an invocation existed (its inputs, arguments or options
    /// were unreadable), with the site this context's capture policy records for an
    /// invocation made from `call`: under HOST or ALL the frame provider's frames, so
    /// a host language's caller is named there too. An error that has a site keeps it.
    pub fn refused_at(&self, e: Error, call: CallSite) -> Error {
        if e.site().is_some() {
            return e;
        }
        let settings = self.settings();
        let site = Self::capture(&settings, settings.mode, call);
        e.with_site(Arc::new(site))
    }

    /// Enqueues `op` on `inputs` per the mode: call-time errors (unknown op, arguments,
    /// input metadata, injected compile errors) fail here; execution errors live in
    /// the returned node.
    #[inline(always)]
    pub fn invoke(
        self: &Arc<Self>,
        op: &str,
        inputs: Vec<Input>,
        args: Args,
        mode: Option<EvalMode>,
        call: CallSite,
    ) -> Result<Arc<Node>> {
        self.invoke_into(op, inputs, args, mode, call, Vec::new())
    }

    /// [`ContextInner::invoke`] writing into caller-given out tensors: `outputs` is
    /// empty or holds one entry per output of the operator (`None`: ndx allocates that
    /// one). Each given one must be writable host memory of the output's dtype and shape
    /// (a batch of as many samples, each matching, for a batch output); the work writes
    /// its result there and the future's output is a view of it. Mismatches fail here
    /// when the operator infers its outputs, else at execution.
    #[inline(always)]
    pub fn invoke_into(
        self: &Arc<Self>,
        op: &str,
        inputs: Vec<Input>,
        args: Args,
        mode: Option<EvalMode>,
        call: CallSite,
        outputs: Vec<Option<Data>>,
    ) -> Result<Arc<Node>> {
        let settings = self.settings();
        let mode = mode.unwrap_or(settings.mode);
        let site = Arc::new(Self::capture(&settings, mode, call));
        let def = self.registry.get(op).ok_or_else(|| {
            let hint = self
                .registry
                .suggest(op)
                .map(|s| format!("; did you mean '{s}'?"))
                .unwrap_or_default();
            Error::value(format!("unknown operator '{op}'{hint}")).with_site(site.clone())
        })?;
        let fail = |e: Error| e.with_op_name(&def.name).with_site(site.clone());
        if let Some((i, up)) = inputs.iter().enumerate().find_map(|(i, input)| {
            input
                .producer()
                .filter(|up| up.lost_in_fork())
                .map(|up| (i, up))
        }) {
            return Err(fail(Error::value(format!(
                "input {i}: {}",
                up.lost_error().message()
            ))));
        }
        // The context's default device for `to_device`.
        let args = if def.name == "to_device" && args.get("device").is_none() {
            args.with(
                "device",
                crate::exec::args::ArgValue::Int(settings.cuda_device.into()),
            )
        } else {
            args
        };
        if let crate::exec::Backend::InjectCompile(target) = &settings.backend
            && *target == def.name
        {
            return Err(fail(Error::new(
                ErrorKind::Backend,
                format!(
                    "injected compile error in operator '{op}' (backend inject_compile_error:{op})"
                ),
            )));
        }
        // Host kernels read each argument with the getter of its declared type;
        // built-ins accept the other forms themselves, and keep an int given for a
        // float bound exact.
        let args = if matches!(def.kernel, crate::ops::Kernel::Host(_)) {
            def.conform_args(args)
        } else {
            args
        };
        let (out_meta, batch_len) = match infer(&def, &inputs, &args) {
            Ok(inferred) => inferred,
            // Inferring the outputs asked a pending input for its metadata, which ran
            // its producer (a host operator infers none), and that failed: an execution
            // failure, so it fails this invocation in its future, with the producer's
            // error as cause, in every mode — not ndx_invoke, which returned it as a
            // call-time error of this operator ("operator 'neg': host failed", no
            // cause, the producer's op, sequence, site and sample lost).
            Err(e) if from_failed_producer(&inputs, &e) => unknown_outputs(&def, &inputs),
            Err(e) => return Err(fail(crate::ops::of_operator(op, &e))),
        };
        let out_device = output_device(&def, &inputs, &args);
        check_outputs(&out_meta, &outputs, out_device, batch_len)
            .map_err(|e| fail(crate::ops::of_operator(op, &e)))?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let node = Node::new(NodeSpec {
            out_device,
            seq,
            op: def,
            args,
            site,
            mode,
            backend: settings.backend.clone(),
            events: settings.events_mode,
            checks: settings.checks,
            repro_max_bytes: settings.repro_max_bytes,
            ctx: Arc::downgrade(self),
            out_meta,
            batch_len,
            inputs,
            outputs,
        });
        self.stats.lock().invoked(mode);
        if matches!(mode, EvalMode::Deferred | EvalMode::Eager) {
            super::node::note_async_invocation(&node);
        }
        match mode {
            EvalMode::Deferred => self.tracker.lock().recorded.push(node.clone()),
            EvalMode::Eager => node.submit_as(Why {
                reason: Flush::Consumer,
                site: Some(node.site().clone()),
            }),
            EvalMode::SyncCpu | EvalMode::SyncFull => {
                node.wait_for_inputs()?;
                node.run_inline();
            }
        }
        Ok(node)
    }

    pub(crate) fn node_started(&self, node: &Arc<Node>) {
        self.tracker.lock().pending.insert(node.seq(), node.clone());
    }

    pub(crate) fn node_done(&self, node: &Arc<Node>, failed: bool) {
        let mut t = self.tracker.lock();
        t.pending.remove(&node.seq());
        if failed {
            t.failed.push(node.clone());
        }
        if t.pending.is_empty() {
            self.idle.notify_all();
        }
    }

    /// Queues a callback or host operator for process-events; gives it back when the
    /// context is closed (checked under the queue's lock, which the release closes it
    /// under: a queued event is always run or dropped by someone).
    pub(crate) fn push_event(&self, event: Event) -> std::result::Result<(), Event> {
        let mut queue = self.events.lock();
        if self.closed() {
            return Err(event);
        }
        queue.push_back(event);
        Ok(())
    }

    /// Whether no thread will run queued callbacks any more (released).
    /// Whether it was made before this process forked: it cannot be used here
    /// ([`super::fork`]).
    pub fn stale(&self) -> bool {
        self.generation != super::fork::generation()
    }

    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs the queued callbacks and host operators (process-events mode); returns
    /// how many ran.
    pub fn run_events(&self) -> usize {
        self.run_events_until(None)
    }

    /// [`ContextInner::run_events`], starting none once `deadline` has passed.
    pub(crate) fn run_events_until(&self, deadline: Option<std::time::Instant>) -> usize {
        let mut n = 0;
        loop {
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return n;
            }
            let Some(event) = self.events.lock().pop_front() else {
                return n;
            };
            as_callback(event);
            n += 1;
        }
    }

    /// Runs all deferred work, waits for all in-flight work, and returns every failure
    /// nobody has observed as related errors of one error (NULL when none).
    pub fn evaluate(&self) -> Result<()> {
        if must_not_block() {
            return Err(Error::new(
                ErrorKind::Runtime,
                "ndx_context_evaluate from inside an ndx callback or host operator would deadlock",
            ));
        }
        let recorded = std::mem::take(&mut self.tracker.lock().recorded);
        Node::submit_all(&recorded, Why::new(Flush::Evaluate));
        let events = self.settings.lock().events_mode;
        loop {
            if events {
                self.run_events();
            }
            let mut t = self.tracker.lock();
            if t.pending.is_empty() {
                break;
            }
            let slice = std::time::Duration::from_millis(if events { 1 } else { 50 });
            self.idle.wait_for(&mut t, slice);
        }
        if events {
            self.run_events();
        }
        let mut failed = std::mem::take(&mut self.tracker.lock().failed);
        // In enqueue order, as the check group is: not in the order they completed.
        failed.sort_by_key(|n| n.seq());
        let unobserved: Vec<Error> = failed
            .iter()
            .filter(|n| !n.observed())
            .filter_map(|n| {
                n.mark_observed();
                n.result().and_then(|r| r.as_ref().err().cloned())
            })
            .collect();
        let checks = self.take_check_errors();
        if unobserved.is_empty() {
            return checks.map_or(Ok(()), Err);
        }
        Err(Error::new(
            ErrorKind::Runtime,
            format!(
                "{} invocation{} failed without being observed{}",
                unobserved.len(),
                if unobserved.len() == 1 { "" } else { "s" },
                if checks.is_some() {
                    "; the last related error is the group of raised check flags"
                } else {
                    ""
                }
            ),
        )
        .with_related(unobserved.into_iter().chain(checks)))
    }
}

impl ContextInner {
    /// Releases the context (its last public reference went, on this thread): cancels
    /// what has not started and waits for what is running (unless this thread is a
    /// worker, a callback or a host operator, where it does not wait). Queued
    /// callbacks still run, here, except process-events ones on an ndx worker or a
    /// device's completion thread: those, and (in process-events mode) the callbacks
    /// of work that completes after a release that did not wait, are dropped uncalled.
    fn release(&self) {
        if self.stale() {
            // In a forked child: its work and the threads running it stayed with the
            // parent, so there is nothing to cancel or wait for here.
            self.closed.store(true, Ordering::Release);
            return;
        }
        let worker = pool::on_worker() || crate::cuda::completion::on_completion_thread();
        let events_mode = self.settings.lock().events_mode;
        if worker && events_mode {
            self.closed.store(true, Ordering::Release);
        }
        let mut pending: Vec<Arc<Node>> = {
            let mut t = self.tracker.lock();
            let recorded = std::mem::take(&mut t.recorded);
            t.pending.drain().map(|(_, n)| n).chain(recorded).collect()
        };
        // Cancel in enqueue order so upstream failures come first.
        pending.sort_by_key(|n| n.seq());
        pending.dedup_by_key(|n| n.seq());
        let mut running = Vec::new();
        for node in pending {
            if !node.cancel("its context was released") {
                running.push(node);
            }
        }
        if !must_not_block() {
            for node in running {
                node.wait_finished();
            }
            // The workers that ran (or would have run) its work let go of it.
            let mut jobs = self.jobs.lock();
            while *jobs > 0 {
                self.jobs_done.wait(&mut jobs);
            }
            drop(jobs);
            // Nothing of this context runs any more: host operators' user data can go,
            // and the frame provider's, here on the releasing thread. The context
            // itself may be freed later on a worker that held it last, and a host
            // language cannot always take a call there (a Python interpreter that is
            // finalizing ends such a thread with pthread_exit, which aborts the
            // process inside ndx).
            self.registry.release_host_data();
            self.update(|s| s.provider = None);
        }
        // Until the queue is empty: a callback may be queued while the queued ones run
        // (another thread registering one on a complete future). The queue closes
        // under its lock, so whatever is queued later is refused and run (or dropped)
        // by whoever queued it.
        let drop_queued = self.closed(); // process-events callbacks never run on a worker
        loop {
            let events: Vec<_> = {
                let mut queue = self.events.lock();
                if queue.is_empty() {
                    self.closed.store(true, Ordering::Release);
                    break;
                }
                queue.drain(..).collect()
            };
            if drop_queued {
                drop(events);
            } else {
                for event in events {
                    as_callback(event);
                }
            }
        }
    }
}

/// Checks inputs against the schema and infers the outputs' metadata.
fn infer(def: &OpDef, inputs: &[Input], args: &Args) -> Result<(Vec<OutMeta>, Option<usize>)> {
    if def.n_inputs == crate::ops::SAMPLES {
        return infer_samples(def, inputs, args);
    }
    if def.n_inputs == crate::ops::VARIADIC {
        if inputs.is_empty() {
            return Err(Error::value("expected at least 1 input, got 0"));
        }
    } else if inputs.len() != def.n_inputs {
        return Err(Error::value(format!(
            "expected {} input{}, got {}",
            def.n_inputs,
            if def.n_inputs == 1 { "" } else { "s" },
            inputs.len()
        )));
    }
    def.validate_args(args)?;
    // Batch inputs make a per-sample invocation; they must agree in length.
    let mut batch_len = None;
    for (i, input) in inputs.iter().enumerate() {
        if let Input::Batch(b) = input {
            let n = b.len()?;
            match batch_len {
                None => batch_len = Some((i, n)),
                Some((j, m)) if m != n => {
                    return Err(Error::value(format!(
                        "input {i} is a batch of {n} samples but input {j} has {m}"
                    )));
                }
                _ => {}
            }
        }
    }
    cuda_check(def, inputs, args)?;
    let Some(infer) = &def.infer else {
        let unknown = (0..def.n_outputs)
            .map(|_| {
                if batch_len.is_some() {
                    OutMeta::Batch(None)
                } else {
                    OutMeta::Tensor(None)
                }
            })
            .collect();
        return Ok((unknown, batch_len.map(|(_, n)| n)));
    };
    match batch_len {
        None => {
            let refs = inputs
                .iter()
                .map(|i| match i {
                    Input::Tensor(t) => t.meta(),
                    Input::Batch(_) => unreachable!("no batch inputs here"),
                })
                .collect::<Result<Vec<&TMeta>>>()?;
            let outs = infer(&refs, args)?;
            check_out_ndims(&outs)?;
            Ok((
                outs.into_iter().map(|m| OutMeta::Tensor(Some(m))).collect(),
                None,
            ))
        }
        Some((_, n)) => {
            let per_input = inputs
                .iter()
                .map(|i| match i {
                    Input::Tensor(t) => t.meta().map(|m| vec![m.clone(); n]),
                    Input::Batch(b) => b.sample_meta(),
                })
                .collect::<Result<Vec<Vec<TMeta>>>>()?;
            let mut outs: Vec<Vec<TMeta>> = vec![Vec::with_capacity(n); def.n_outputs];
            for s in 0..n {
                let refs: Vec<&TMeta> = per_input.iter().map(|v| &v[s]).collect();
                let o = infer(&refs, args)
                    .and_then(|o| check_out_ndims(&o).map(|()| o))
                    .map_err(|e| Error::new(e.kind(), format!("sample {s}: {}", e.message())))?;
                for (k, m) in o.into_iter().enumerate() {
                    outs[k].push(m);
                }
            }
            Ok((
                outs.into_iter().map(|m| OutMeta::Batch(Some(m))).collect(),
                Some(n),
            ))
        }
    }
}

/// Whether `e` is the failure of an input's producer (asked for its metadata), not a
/// misuse: a call-time error has no invocation sequence number.
fn from_failed_producer(inputs: &[Input], e: &Error) -> bool {
    e.sequence().is_some()
        && inputs.iter().filter_map(Input::producer).any(|up| {
            matches!(up.outcome(), Some(Err(u))
                if u.sequence() == e.sequence() && u.op() == e.op() && u.message() == e.message())
        })
}

/// The outputs of an invocation whose input failed before its metadata was known: one
/// of unknown metadata per output, batches for a per-sample invocation. The node fails
/// on that input before it runs anything, so the batch length is never read.
fn unknown_outputs(def: &OpDef, inputs: &[Input]) -> (Vec<OutMeta>, Option<usize>) {
    let per_sample =
        def.n_inputs != crate::ops::SAMPLES && inputs.iter().any(|i| matches!(i, Input::Batch(_)));
    let outs = (0..def.n_outputs)
        .map(|_| {
            if per_sample {
                OutMeta::Batch(None)
            } else {
                OutMeta::Tensor(None)
            }
        })
        .collect();
    (outs, per_sample.then_some(0))
}

/// Refuses inferred outputs of more than `MAX_NDIM` dimensions (an `expand_dims` or
/// `reshape` too far), which could not be exported and imported again.
fn check_out_ndims(outs: &[TMeta]) -> Result<()> {
    for (k, m) in outs.iter().enumerate() {
        crate::tensor::check_ndim(&format!("output {k}"), &m.shape)?;
    }
    Ok(())
}

/// Refuses at enqueue what the CUDA launchers would refuse, for the inputs whose data
/// is known now (the outputs of pending work are checked when it runs): inputs on a
/// device that is absent, on several devices or mixed with host memory, and operators
/// or dtypes without a CUDA kernel.
fn cuda_check(def: &OpDef, inputs: &[Input], args: &Args) -> Result<()> {
    let devices: Vec<Option<Device>> = inputs.iter().map(Input::device).collect();
    let Some((first, device)) = crate::cuda::ops::common_device(&def.name, &devices)? else {
        return Ok(());
    };
    crate::cuda::require_device(i64::from(device.id)).map_err(|e| {
        Error::new(
            ErrorKind::Cuda,
            format!(
                "input {first} lives in CUDA memory ({device}), but {}",
                e.message()
            ),
        )
    })?;
    // Metadata known without running anything (a batch by its first sample).
    let mut metas = Vec::with_capacity(inputs.len());
    for input in inputs {
        let m = match input {
            Input::Tensor(t) => t.known_meta().cloned(),
            Input::Batch(b) => b.known_sample_meta().and_then(|m| m.first().cloned()),
        };
        match m {
            Some(m) => metas.push(m),
            None => return Ok(()),
        }
    }
    let refs: Vec<&TMeta> = metas.iter().collect();
    crate::cuda::ops::supported(&def.name, &refs, args, device)
}

/// Where an invocation's outputs will live, when its inputs tell at enqueue: on the
/// CUDA device of its inputs, or the target of `to_device`; host memory when every
/// input is (plain) host memory; `None` when some input's device is not known yet.
fn output_device(def: &OpDef, inputs: &[Input], args: &Args) -> Option<Device> {
    match def.name.as_str() {
        "to_device" => {
            return crate::ops::device::target_device(args)
                .ok()
                .map(|id| Device {
                    kind: DeviceKind::Cuda,
                    id,
                });
        }
        "to_host"
            if inputs
                .first()
                .and_then(Input::device)
                .is_some_and(|d| d.kind == DeviceKind::Cuda) =>
        {
            return Some(Device::CPU);
        }
        _ => {}
    }
    let mut all_cpu = true;
    for input in inputs {
        let d = input.device()?;
        if d.kind == DeviceKind::Cuda {
            return Some(d);
        }
        all_cpu &= d == Device::CPU;
    }
    all_cpu.then_some(Device::CPU)
}

/// [`infer`] for an operator that takes a batch's samples at once: one batch, or one
/// or more tensors standing for its samples.
fn infer_samples(
    def: &OpDef,
    inputs: &[Input],
    args: &Args,
) -> Result<(Vec<OutMeta>, Option<usize>)> {
    def.validate_args(args)?;
    let metas: Vec<TMeta> = match inputs {
        [] => {
            return Err(Error::value(
                "expected a batch or at least 1 tensor, got no input",
            ));
        }
        [Input::Batch(b)] => b.sample_meta()?,
        _ => inputs
            .iter()
            .enumerate()
            .map(|(i, input)| match input {
                Input::Tensor(t) => t.meta().cloned(),
                Input::Batch(_) => Err(Error::type_error(format!(
                    "input {i} is a batch; give one batch, or tensors as its samples"
                ))),
            })
            .collect::<Result<_>>()?,
    };
    cuda_check(def, inputs, args)?;
    let outs = match &def.infer {
        Some(infer) => {
            let outs = infer(&metas.iter().collect::<Vec<_>>(), args)?;
            check_out_ndims(&outs)?;
            outs.into_iter().map(|m| OutMeta::Tensor(Some(m))).collect()
        }
        None => (0..def.n_outputs).map(|_| OutMeta::Tensor(None)).collect(),
    };
    Ok((outs, None))
}

/// Checks caller-given out tensors against the inferred outputs: their number, kind
/// (tensor or batch), dtype and shape, that they are writable host memory whose
/// elements do not overlap, and that no two share memory. `device` is where the
/// outputs will be made, when known: out tensors take host results only. `batch_len`
/// is a per-sample invocation's number of samples (0: unknown), which an out batch
/// must have also when the operator infers nothing else (a host operator's).
fn check_outputs(
    metas: &[OutMeta],
    outputs: &[Option<Data>],
    device: Option<Device>,
    batch_len: Option<usize>,
) -> Result<()> {
    if outputs.is_empty() {
        return Ok(());
    }
    if let Some(d) = device.filter(|d| !d.host_accessible())
        && let Some(i) = outputs.iter().position(Option::is_some)
    {
        return Err(Error::new(
            ErrorKind::NotImplemented,
            format!(
                "outputs[{i}] is given, but the invocation runs on {d} and out tensors take \
                 host results only; leave it NULL and copy the output with 'to_host'"
            ),
        ));
    }
    if outputs.len() != metas.len() {
        return Err(Error::value(format!(
            "{} out tensors given, but it has {} output{}",
            outputs.len(),
            metas.len(),
            if metas.len() == 1 { "" } else { "s" }
        )));
    }
    let mut all: Vec<(usize, &Tensor)> = Vec::new();
    for (i, (out, meta)) in outputs.iter().zip(metas).enumerate() {
        let Some(out) = out else { continue };
        match (out, meta) {
            (Data::Tensor(t), OutMeta::Tensor(m)) => {
                check_out_tensor(&format!("outputs[{i}]"), t, m.as_ref())?;
                all.push((i, t));
            }
            (Data::Batch(b), OutMeta::Batch(m)) => {
                let expected = m.as_ref().map(Vec::len).or(batch_len.filter(|&n| n > 0));
                if let Some(n) = expected
                    && n != b.len()
                {
                    return Err(Error::value(format!(
                        "outputs[{i}] is a batch of {} samples, expected {n}",
                        b.len()
                    )));
                }
                for (s, t) in b.samples().iter().enumerate() {
                    let want = m.as_ref().map(|m| &m[s]);
                    check_out_tensor(&format!("outputs[{i}] sample {s}"), t, want)?;
                    all.push((i, t));
                }
            }
            (Data::Tensor(_), OutMeta::Batch(_)) => {
                return Err(Error::type_error(format!(
                    "outputs[{i}] is a tensor, but output {i} is a batch (the invocation runs per sample)"
                )));
            }
            (Data::Batch(_), OutMeta::Tensor(_)) => {
                return Err(Error::type_error(format!(
                    "outputs[{i}] is a batch, but output {i} is a tensor"
                )));
            }
        }
    }
    let views: Vec<&Tensor> = all.iter().map(|&(_, t)| t).collect();
    if let Some((a, b)) = first_overlap(&views) {
        let (i, j) = (all[a].0, all[b].0);
        return Err(Error::value(if i == j {
            format!("two samples of outputs[{i}] share memory")
        } else {
            format!("outputs[{i}] and outputs[{j}] share memory")
        }));
    }
    Ok(())
}

/// The first pair `(a, b)`, `a < b`, of `views` that may share memory
/// ([`Tensor::overlaps`]) in the order of a pairwise scan (`a` smallest, then `b`), in
/// O(n log n) for the many samples of a batch. Within an address space, sorted by
/// start, a view overlaps an earlier one exactly when the largest end before it
/// passes its start, and a later one when the next one starts before its end. `a` is
/// the first view that overlaps any (its partners all come after it), `b` the first
/// after `a` that overlaps it.
fn first_overlap(views: &[&Tensor]) -> Option<(usize, usize)> {
    let extents: Vec<_> = views.iter().map(|t| t.extent()).collect();
    let mut spaces: HashMap<Option<Device>, Vec<(usize, usize, usize)>> = HashMap::new();
    for (v, e) in extents.iter().enumerate() {
        if let &Some((space, start, end)) = e {
            spaces.entry(space).or_default().push((start, end, v));
        }
    }
    let mut first: Option<usize> = None;
    for mut sorted in spaces.into_values() {
        sorted.sort_unstable();
        let mut max_end = 0;
        for (w, &(start, end, v)) in sorted.iter().enumerate() {
            let after = sorted.get(w + 1).is_some_and(|&(next, _, _)| next < end);
            if (w > 0 && max_end > start) || after {
                first = Some(first.map_or(v, |f| f.min(v)));
            }
            max_end = max_end.max(end);
        }
    }
    let a = first?;
    let (space, start, end) = extents[a]?;
    let b = (a + 1..views.len())
        .find(|&b| extents[b].is_some_and(|(s, bs, be)| s == space && bs < end && start < be))?;
    Some((a, b))
}

/// Checks one out tensor (or batch sample) named `what` against its expected metadata
/// (`None`: known only at execution).
fn check_out_tensor(what: &str, t: &Tensor, want: Option<&TMeta>) -> Result<()> {
    if !t.device().host_accessible() {
        return Err(Error::new(
            ErrorKind::NotImplemented,
            format!(
                "{what} lives in {} memory; this build writes host memory only",
                t.device()
            ),
        ));
    }
    if t.read_only() {
        return Err(Error::value(format!("{what} is read-only")));
    }
    if let Some(m) = want
        && (t.dtype() != m.dtype || t.shape() != m.shape.as_slice())
    {
        return Err(Error::value(format!(
            "{what} is {} {}, expected {} {}",
            t.dtype().name(),
            crate::tensor::dims(t.shape()),
            m.dtype.name(),
            crate::tensor::dims(&m.shape)
        )));
    }
    if t.may_overlap_itself() {
        return Err(Error::value(format!(
            "{what} has strides {} for shape {}, which give one element several indices; an out tensor needs a distinct element per index",
            crate::tensor::dims(t.strides()),
            crate::tensor::dims(t.shape())
        )));
    }
    Ok(())
}

/// The output handles of a node.
pub fn output_tensor(node: &Arc<Node>, index: usize) -> Result<TensorRef> {
    match node.out_meta().get(index) {
        Some(OutMeta::Tensor(meta)) => Ok(TensorRef::pending(node.clone(), index, meta.clone())),
        Some(OutMeta::Batch(_)) => Err(Error::type_error(format!(
            "output {index} of '{}' (#{}) is a batch; use ndx_future_batch",
            node.op_name(),
            node.seq()
        ))),
        None => Err(Error::index(format!(
            "output index {index} is out of range: '{}' has {} output{}",
            node.op_name(),
            node.out_meta().len(),
            if node.out_meta().len() == 1 { "" } else { "s" }
        ))),
    }
}

/// Batch output `index` of a node.
pub fn output_batch(node: &Arc<Node>, index: usize) -> Result<BatchRef> {
    match node.out_meta().get(index) {
        Some(OutMeta::Batch(meta)) => Ok(BatchRef::pending(node.clone(), index, meta.clone())),
        Some(OutMeta::Tensor(_)) => Err(Error::type_error(format!(
            "output {index} of '{}' (#{}) is a tensor; use ndx_future_tensor",
            node.op_name(),
            node.seq()
        ))),
        None => Err(Error::index(format!(
            "output index {index} is out of range: '{}' has {} output{}",
            node.op_name(),
            node.out_meta().len(),
            if node.out_meta().len() == 1 { "" } else { "s" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::{Data, OutMeta, Settings, check_outputs, new_context};
    use crate::tensor::{Batch, DType, Tensor};

    /// A pairwise scan of the views of `outputs` (in order, samples in order) for the
    /// first two that share memory: the message `check_outputs` must give.
    fn pairwise(outputs: &[Option<Data>]) -> Option<String> {
        let mut all: Vec<(usize, &Tensor)> = Vec::new();
        for (i, out) in outputs.iter().enumerate() {
            match out {
                Some(Data::Tensor(t)) => all.push((i, t)),
                Some(Data::Batch(b)) => all.extend(b.samples().iter().map(|t| (i, &**t))),
                None => {}
            }
        }
        for (k, (i, a)) in all.iter().enumerate() {
            for (j, b) in &all[k + 1..] {
                if a.overlaps(b) {
                    return Some(if i == j {
                        format!("two samples of outputs[{i}] share memory")
                    } else {
                        format!("outputs[{i}] and outputs[{j}] share memory")
                    });
                }
            }
        }
        None
    }

    fn check(outputs: &[Option<Data>]) -> Option<String> {
        let metas: Vec<OutMeta> = outputs
            .iter()
            .map(|o| match o {
                Some(Data::Batch(_)) => OutMeta::Batch(None),
                _ => OutMeta::Tensor(None),
            })
            .collect();
        check_outputs(&metas, outputs, None, None)
            .err()
            .map(|e| e.message().to_string())
    }

    /// Out tensors and batch samples that share memory are found, and the pair named is
    /// the first one in order (as a pairwise scan finds it), among many samples in
    /// shuffled address order, where the views that overlap need not be neighbours in
    /// address order.
    #[test]
    fn outputs_that_share_memory_are_found_in_order_among_many_samples() {
        let buf = Tensor::new_host(DType::F32, &[1 << 14], CString::default(), |_| Ok(())).unwrap();
        let view = |origin: usize, len: usize| {
            Arc::new(buf.restride(vec![len as i64], vec![1], origin as i64))
        };
        let batch = |v: Vec<Arc<Tensor>>| Some(Data::Batch(Arc::new(Batch::new(v).unwrap())));
        // A view at position 0 inside a long one at the end, where a view between them
        // in address order (position 2) overlaps only the long one: the pair is
        // (0, last), outputs[0] and outputs[2], not outputs[1] and outputs[2].
        let outputs = [
            Some(Data::Tensor(view(50, 10))),
            batch(vec![view(200, 8), view(10, 10), view(300, 8)]),
            batch(
                (0..600)
                    .map(|s| view(1000 + 8 * s, 8))
                    .chain([view(0, 100)])
                    .collect(),
            ),
        ];
        assert_eq!(
            check(&outputs).as_deref(),
            Some("outputs[0] and outputs[2] share memory")
        );
        // Two samples of one batch.
        let outputs = [batch(
            (0..500)
                .map(|s| view(16 * (s * 7 % 500), 8))
                .chain([view(16 * 77 + 4, 8)])
                .collect(),
        )];
        assert_eq!(
            check(&outputs).as_deref(),
            Some("two samples of outputs[0] share memory")
        );
        // Many samples in a pseudo-random order of disjoint slots, some of them
        // lengthened over their next slots, and some empty.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let (mut overlapping, mut clean) = (0, 0);
        for case in 0..300 {
            let n = 2 + next(400);
            let mut slots: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                slots.swap(i, next(i + 1));
            }
            let long = if case % 3 == 0 { 0 } else { 1 + next(3) };
            let views: Vec<Arc<Tensor>> = slots
                .iter()
                .enumerate()
                .map(|(k, &slot)| {
                    let len = if k < long {
                        8 * (1 + next(6)) + next(8)
                    } else if next(20) == 0 {
                        0
                    } else {
                        1 + next(8)
                    };
                    view(16 * slot, len.min((1 << 14) - 16 * slot))
                })
                .collect();
            let cut = next(n);
            let mut rest = views;
            let tail = rest.split_off(cut.max(1));
            let outputs: Vec<Option<Data>> = if tail.is_empty() {
                vec![batch(rest)]
            } else if next(2) == 0 {
                vec![batch(rest), None, batch(tail)]
            } else {
                let mut outs = vec![Some(Data::Tensor(rest.remove(0)))];
                if !rest.is_empty() {
                    outs.push(batch(rest));
                }
                outs.push(batch(tail));
                outs
            };
            let want = pairwise(&outputs);
            match &want {
                Some(_) => overlapping += 1,
                None => clean += 1,
            }
            assert_eq!(check(&outputs), want, "case {case}");
        }
        assert!(overlapping > 50 && clean > 50, "{overlapping} {clean}");
    }

    /// Dropping the last public reference waits until every job holding one of the
    /// context's invocations let go of it: a job still finishing (its node, and what
    /// that holds, dropped just after) is not left to drop it after the release.
    #[test]
    fn a_release_waits_for_jobs_that_still_hold_its_work() {
        let ctx = new_context(Settings::default(), 1);
        let hold = ctx.hold_job();
        let let_go = Arc::new(AtomicBool::new(false));
        let job = {
            let let_go = let_go.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let_go.store(true, Ordering::SeqCst);
                drop(hold);
            })
        };
        drop(ctx);
        assert!(
            let_go.load(Ordering::SeqCst),
            "the release returned while a job still held the context's work"
        );
        job.join().unwrap();
    }
}
