//! The execution engine from Rust: every eval mode against every kind of failure,
//! with the error's kind, message, operator, sequence number, enqueue line and cause
//! chain; callbacks, cancellation, teardown, evaluation, worker threads, concurrency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndx::error::{Error, ErrorKind};
use ndx::exec::{
    ArgValue, Args, Backend, BatchRef, CallSite, CapturePolicy, Context, Data, EvalMode, Input,
    Node, Settings, Status, new_context, output_tensor,
};
use ndx::ops::{HostKernel, Kernel, OpDef};
use ndx::tensor::{Batch, DType, Tensor};

const MODES: [EvalMode; 4] = [
    EvalMode::SyncCpu,
    EvalMode::SyncFull,
    EvalMode::Deferred,
    EvalMode::Eager,
];

fn context(mode: EvalMode, capture: CapturePolicy) -> Context {
    new_context(
        Settings {
            mode,
            capture,
            ..Settings::default()
        },
        2,
    )
}

fn i32s(values: &[i32], shape: &[i64]) -> Input {
    Input::host(values, shape).expect("tensor")
}

fn out(node: &Arc<Node>) -> Input {
    Input::Tensor(Arc::new(output_tensor(node, 0).expect("output 0")))
}

fn values_i64(node: &Arc<Node>) -> Vec<i64> {
    let t = output_tensor(node, 0).unwrap();
    let bytes = t.resolve().expect("ok").to_bytes().unwrap();
    bytes
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn values_i32(node: &Arc<Node>) -> Vec<i32> {
    let t = output_tensor(node, 0).unwrap();
    let bytes = t.resolve().expect("ok").to_bytes().unwrap();
    bytes
        .chunks(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// The failure a future ends with (waiting for it).
fn failure(node: &Arc<Node>) -> Error {
    node.wait(None).expect("wait");
    match node.result() {
        Some(Err(e)) => e.clone(),
        _ => panic!("'{}' #{} did not fail", node.op_name(), node.seq()),
    }
}

/// Frame 0 is this file at `line`.
fn assert_site(e: &Error, line: u32) {
    let f = e
        .frames()
        .first()
        .unwrap_or_else(|| panic!("no frames: {}", e.traceback()));
    assert!(
        f.file().unwrap_or("").ends_with("tests/engine_api.rs"),
        "{:?}\n{}",
        f.file(),
        e.traceback()
    );
    assert_eq!(f.line(), line, "{}", e.traceback());
}

struct HostFail;
impl HostKernel for HostFail {
    fn run(&self, _: &[Arc<Tensor>], _: &Args, _: usize) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        Err(Error::new(ErrorKind::Runtime, "host failed").with_cause(Error::index("root cause")))
    }
}

struct HostSleep(Duration);
impl HostKernel for HostSleep {
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        _: &Args,
        _: usize,
    ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        std::thread::sleep(self.0);
        Ok(vec![inputs[0].clone()])
    }
}

/// Records the thread it runs on.
struct HostThread(Arc<Mutex<Vec<std::thread::ThreadId>>>);
impl HostKernel for HostThread {
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        _: &Args,
        _: usize,
    ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        self.0.lock().unwrap().push(std::thread::current().id());
        Ok(vec![inputs[0].clone()])
    }
}

fn host_op(ctx: &Context, name: &str, kernel: Arc<dyn HostKernel>) {
    ctx.registry()
        .register(OpDef {
            name: name.into(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![],
            infer: None,
            kernel: Kernel::Host(kernel),
        })
        .expect("register");
}

fn here() -> CallSite {
    CallSite::default()
}

/// Enqueues `op` in the context's mode (call-time errors fail the test).
fn call(ctx: &Context, op: &str, inputs: Vec<Input>) -> Arc<Node> {
    ctx.invoke(op, inputs, Args::new(), None, here())
        .expect("enqueue")
}

/// Enqueues `op` in `mode`.
fn call_in(ctx: &Context, op: &str, inputs: Vec<Input>, mode: EvalMode) -> Arc<Node> {
    ctx.invoke(op, inputs, Args::new(), Some(mode), here())
        .expect("enqueue")
}

#[test]
fn kernel_error_in_every_mode() {
    for mode in MODES {
        let ctx = context(mode, CapturePolicy::Native);
        let (a, b) = (i32s(&[1, 2, 3], &[3]), i32s(&[1, 0, 1], &[3]));
        let r = ctx.invoke("div", vec![a, b], Args::new(), None, here());
        let line = line!() - 1;
        let f = r.expect("enqueue");
        if mode.is_sync() {
            assert_eq!(
                f.poll(),
                Status::Failed,
                "{mode:?}: already failed at return"
            );
        }
        let e = failure(&f);
        assert_eq!(e.kind(), ErrorKind::Value, "{mode:?}");
        assert_eq!(e.message(), "integer division by zero (output element 1)");
        assert_eq!((e.op(), e.sequence()), (Some("div"), Some(1)));
        assert!(
            e.cause().is_none(),
            "the kernel's error itself, not a second link"
        );
        assert_site(&e, line);
        assert!(
            ctx.evaluate().is_ok(),
            "observed failures are not reported again"
        );
    }
}

#[test]
fn injected_runtime_error_in_every_mode() {
    for mode in MODES {
        let ctx = context(mode, CapturePolicy::Off);
        ctx.update(|s| s.backend = Backend::parse("inject_runtime_error:add").unwrap());
        let (a, b) = (i32s(&[1], &[1]), i32s(&[2], &[1]));
        let r = ctx.invoke("add", vec![a.clone(), b.clone()], Args::new(), None, here());
        let line = line!() - 1;
        let f = r.expect("enqueue");
        let e = failure(&f);
        assert_eq!(e.kind(), ErrorKind::Runtime);
        assert!(
            e.message()
                .contains("injected runtime error in operator 'add'"),
            "{e}"
        );
        assert_eq!(e.op(), Some("add"));
        assert_site(&e, line);
        // An operator the backend does not name passes untouched.
        let m = call(&ctx, "mul", vec![a, b]);
        assert_eq!(values_i32(&m), [2]);
    }
}

#[test]
fn injected_compile_error_fails_at_invoke_in_every_mode() {
    for mode in MODES {
        let ctx = context(mode, CapturePolicy::Native);
        ctx.update(|s| s.backend = Backend::parse("inject_compile_error:sum").unwrap());
        let r = ctx.invoke("sum", vec![i32s(&[1], &[1])], Args::new(), None, here());
        let line = line!() - 1;
        let e = r.err().expect("fails at enqueue");
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert!(
            e.message()
                .contains("injected compile error in operator 'sum'"),
            "{e}"
        );
        assert_site(&e, line);
    }
}

#[test]
fn dependency_failure_two_levels_deep_chains_every_site() {
    for mode in MODES {
        let ctx = context(mode, CapturePolicy::Native);
        let (a, z, one) = (
            i32s(&[4, 5], &[2]),
            i32s(&[0, 1], &[2]),
            i32s(&[1, 1], &[2]),
        );
        let r = ctx.invoke("div", vec![a, z], Args::new(), None, here());
        let l1 = line!() - 1;
        let f1 = r.unwrap();
        let r = ctx.invoke("add", vec![out(&f1), one], Args::new(), None, here());
        let l2 = line!() - 1;
        let f2 = r.unwrap();
        let r = ctx.invoke("sum", vec![out(&f2)], Args::new(), None, here());
        let l3 = line!() - 1;
        let f3 = r.unwrap();
        let e = failure(&f3);
        let chain: Vec<&Error> = e.chain().collect();
        assert_eq!(chain.len(), 3, "{}", e.traceback());
        assert_eq!(e.kind(), ErrorKind::Value, "the upstream kind");
        assert_eq!(
            e.message(),
            "input 0 of 'sum' (#3) failed: it is the output of 'add' (#2), which failed"
        );
        assert_eq!((chain[0].op(), chain[0].sequence()), (Some("sum"), Some(3)));
        assert_eq!((chain[1].op(), chain[1].sequence()), (Some("add"), Some(2)));
        assert_eq!((chain[2].op(), chain[2].sequence()), (Some("div"), Some(1)));
        assert!(chain[2].message().starts_with("integer division by zero"));
        assert_site(chain[0], l3);
        assert_site(chain[1], l2);
        assert_site(chain[2], l1);
        let text = e.traceback();
        let (p1, p3) = (
            text.find("ValueError: integer division").unwrap(),
            text.find("input 0 of 'sum'").unwrap(),
        );
        assert!(p1 < p3, "root cause first:\n{text}");
        assert!(
            ctx.evaluate().is_ok(),
            "observing the last link observes the chain ({mode:?})"
        );
    }
}

/// A failure passed down a pipeline of N dependent invocations makes N links in all:
/// each dependent's error shares the chain behind it with its input's error instead
/// of copying it (a copy per link made N²/2 links: gigabytes for a few thousand ops).
#[test]
fn a_failure_passed_down_a_long_pipeline_shares_the_chain_behind_it() {
    const DEPTH: usize = 64;
    for mode in [EvalMode::Deferred, EvalMode::Eager] {
        let ctx = context(mode, CapturePolicy::Off);
        let mut nodes = vec![call(&ctx, "div", vec![i32s(&[4], &[1]), i32s(&[0], &[1])])];
        for _ in 0..DEPTH {
            let prev = out(nodes.last().unwrap());
            nodes.push(call(&ctx, "add", vec![prev, i32s(&[1], &[1])]));
        }
        nodes.last().unwrap().wait(None).expect("wait");
        let errors: Vec<&Error> = nodes
            .iter()
            .map(|n| match n.result() {
                Some(Err(e)) => e,
                _ => panic!("#{} did not fail", n.seq()),
            })
            .collect();
        let last = errors[DEPTH];
        assert_eq!(last.chain().count(), DEPTH + 1, "{}", last.traceback());
        for k in 2..=DEPTH {
            let behind_k = errors[k].cause().and_then(Error::cause).unwrap();
            let behind_prev = errors[k - 1].cause().unwrap();
            assert!(
                std::ptr::eq(behind_k, behind_prev),
                "#{}'s chain is a copy of #{}'s ({mode:?})",
                k + 1,
                k
            );
        }
        assert_eq!(last.chain().last().unwrap().op(), Some("div"));
    }
}

#[test]
fn host_op_error_keeps_its_own_cause_and_gets_the_enqueue_site() {
    for mode in MODES {
        let ctx = context(mode, CapturePolicy::Native);
        host_op(&ctx, "fails", Arc::new(HostFail));
        let r = ctx.invoke("fails", vec![i32s(&[1], &[1])], Args::new(), None, here());
        let line = line!() - 1;
        let f = r.unwrap();
        let e = failure(&f);
        assert_eq!((e.kind(), e.message()), (ErrorKind::Runtime, "host failed"));
        assert_eq!((e.op(), e.sequence()), (Some("fails"), Some(1)));
        assert_site(&e, line);
        let cause = e.cause().expect("its own cause");
        assert_eq!(
            (cause.kind(), cause.message()),
            (ErrorKind::Index, "root cause")
        );
    }
}

#[test]
fn timeout_leaves_the_future_valid() {
    for mode in [EvalMode::Deferred, EvalMode::Eager] {
        let ctx = context(mode, CapturePolicy::Off);
        host_op(
            &ctx,
            "slow",
            Arc::new(HostSleep(Duration::from_millis(200))),
        );
        let f = call(&ctx, "slow", vec![i32s(&[7], &[1])]);
        let e = f.wait(Some(Duration::from_millis(1))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.message().contains("did not complete within"), "{e}");
        assert_eq!(f.poll(), Status::Pending);
        f.wait(None).expect("completes later");
        assert_eq!(values_i32(&f), [7]);
    }
    // SYNC modes complete before invoke returns: a timeout cannot happen.
    for mode in [EvalMode::SyncCpu, EvalMode::SyncFull] {
        let ctx = context(mode, CapturePolicy::Off);
        host_op(&ctx, "slow", Arc::new(HostSleep(Duration::from_millis(20))));
        let f = call(&ctx, "slow", vec![i32s(&[7], &[1])]);
        assert_eq!(f.poll(), Status::Ready);
        assert!(f.wait(Some(Duration::from_millis(0))).is_ok());
    }
}

#[test]
fn noexcept_wraps_execution_failures_only() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    ctx.update(|s| s.backend = Backend::NoExcept);
    let f = call(&ctx, "div", vec![i32s(&[1], &[1]), i32s(&[0], &[1])]);
    let e = failure(&f);
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::Backend, "unexpected error when running div")
    );
    let cause = e.cause().expect("original as cause");
    assert_eq!(cause.kind(), ErrorKind::Value);
    assert_eq!(cause.op(), Some("div"));
    // A per-sample invocation (a batch input) is wrapped too.
    let samples = (0..2)
        .map(|_| match i32s(&[1], &[1]) {
            Input::Tensor(t) => t.resolve().expect("ready").clone(),
            Input::Batch(_) => unreachable!(),
        })
        .collect();
    let batch = Input::Batch(Arc::new(BatchRef::ready(Arc::new(
        Batch::new(samples).expect("batch"),
    ))));
    let f = call(&ctx, "div", vec![batch, i32s(&[0], &[1])]);
    let e = failure(&f);
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::Backend, "unexpected error when running div")
    );
    assert_eq!(e.cause().map(Error::kind), Some(ErrorKind::Value));
    // Call-time errors are not execution failures: unchanged.
    let e = ctx
        .invoke("nope", vec![], Args::new(), None, here())
        .err()
        .unwrap();
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::Value, "unknown operator 'nope'")
    );
}

#[test]
fn accuracy_injection_adds_one() {
    let ctx = context(EvalMode::SyncCpu, CapturePolicy::Off);
    ctx.update(|s| s.backend = Backend::parse("inject_accuracy_error:add").unwrap());
    let f = call(
        &ctx,
        "add",
        vec![i32s(&[1, 2], &[2]), i32s(&[10, 20], &[2])],
    );
    assert_eq!(values_i32(&f), [12, 23]);
}

#[test]
fn results_shapes_and_call_time_validation() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let a = i32s(&[1, 2, 3, 4, 5, 6], &[2, 3]);
    let s = ctx
        .invoke(
            "sum",
            vec![a.clone()],
            Args::new().with("axes", ArgValue::Ints(vec![1])),
            None,
            here(),
        )
        .unwrap();
    // Metadata without running.
    let t = output_tensor(&s, 0).unwrap();
    assert_eq!(
        (t.dtype().unwrap(), t.shape().unwrap().to_vec()),
        (DType::I64, vec![2])
    );
    assert!(
        !s.is_done(),
        "asking for metadata does not run a deferred invocation"
    );
    assert_eq!(values_i64(&s), [6, 15]);
    let c = ctx
        .invoke(
            "cast",
            vec![a.clone()],
            Args::new().with("dtype", ArgValue::DType(DType::F32)),
            None,
            here(),
        )
        .unwrap();
    let bytes = output_tensor(&c, 0)
        .unwrap()
        .resolve()
        .unwrap()
        .to_bytes()
        .unwrap();
    let floats: Vec<f32> = bytes
        .chunks(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let err = |op: &str, inputs: Vec<Input>, args: Args| {
        ctx.invoke(op, inputs, args, None, here()).err().unwrap()
    };
    let e = err("add", vec![a.clone()], Args::new());
    assert!(
        e.message()
            .contains("operator 'add': expected 2 inputs, got 1"),
        "{e}"
    );
    let e = err(
        "sum",
        vec![a.clone()],
        Args::new().with("axis", ArgValue::Int(0)),
    );
    // The schema's messages name the operator once.
    assert_eq!(
        e.message(),
        "operator 'sum' has no argument 'axis' (it takes: axes, keepdims)"
    );
    let e = err(
        "sum",
        vec![a.clone()],
        Args::new().with("keepdims", ArgValue::Int(1)),
    );
    assert_eq!(e.kind(), ErrorKind::Type);
    assert_eq!(
        e.message(),
        "operator 'sum': argument 'keepdims' is an int, expected a bool"
    );
    // A type that also takes other forms names them: "expected a float" refused a
    // string for pad's value, which an int would have satisfied.
    for (op, name, given, expected) in [
        (
            "sum",
            "axes",
            ArgValue::Float(1.0),
            "an int array or an int",
        ),
        ("pad", "value", ArgValue::Bool(true), "a float or an int"),
        (
            "clamp",
            "lo",
            ArgValue::Str(c"0".into()),
            "a float or an int",
        ),
        (
            "normalize",
            "mean",
            ArgValue::Bool(false),
            "a float array (or a float, an int or an int array)",
        ),
    ] {
        let e = err(op, vec![a.clone()], Args::new().with(name, given));
        assert_eq!(e.kind(), ErrorKind::Type);
        assert!(
            e.message().ends_with(&format!("expected {expected}")),
            "{op}: {e}"
        );
    }
    let e = err(
        "sum",
        vec![a.clone()],
        Args::new().with("axes", ArgValue::Ints(vec![2])),
    );
    assert_eq!(e.kind(), ErrorKind::Index);
    assert!(
        e.message()
            .contains("axis 2 is out of range for a tensor of ndim 2"),
        "{e}"
    );
    let e = err("add", vec![a.clone(), i32s(&[1, 2], &[2])], Args::new());
    assert!(
        e.message()
            .contains("shapes [2, 3] and [2] cannot be broadcast"),
        "{e}"
    );
    let e = err("cast", vec![a], Args::new());
    assert_eq!(
        e.message(),
        "operator 'cast' needs argument 'dtype' (dtype)"
    );
}

#[test]
fn deferred_runs_on_evaluate_and_reports_unobserved_failures_once() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let ok = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
    let bad = call(&ctx, "div", vec![i32s(&[1], &[1]), i32s(&[0], &[1])]);
    let bad_seq = bad.seq();
    drop(bad); // releasing a future never cancels its work
    assert!(!ok.is_done());
    let e = ctx.evaluate().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert_eq!(e.message(), "1 invocation failed without being observed");
    assert_eq!(e.related().len(), 1);
    assert_eq!(e.related()[0].sequence(), Some(bad_seq));
    assert!(ok.is_done());
    assert!(ctx.evaluate().is_ok(), "reported exactly once");
}

#[test]
fn evaluate_does_not_report_what_the_caller_cancelled() {
    // Whoever cancelled an invocation knows its outcome: evaluate reported it as an
    // unobserved failure. What failed because of it is still reported.
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let lone = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
    assert!(lone.cancel("test"));
    drop(lone);
    assert!(
        ctx.evaluate().is_ok(),
        "a cancelled invocation is not reported"
    );

    let first = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
    let next = call(&ctx, "mul", vec![out(&first), i32s(&[2], &[1])]);
    let next_seq = next.seq();
    assert!(first.cancel("test"));
    drop((first, next));
    let e = ctx.evaluate().unwrap_err();
    assert_eq!(e.message(), "1 invocation failed without being observed");
    assert_eq!(e.related().len(), 1);
    let dependent = &e.related()[0];
    assert_eq!(dependent.sequence(), Some(next_seq));
    assert_eq!(dependent.kind(), ErrorKind::Cancelled);
    let cause = dependent
        .cause()
        .expect("the cancelled invocation as cause");
    assert!(
        cause
            .message()
            .contains("was cancelled before it ran: test")
    );
}

#[test]
fn evaluate_reports_unobserved_failures_in_enqueue_order() {
    // Independent failures complete in any order on the workers; evaluate lists them
    // as they were enqueued, like the check group.
    for mode in [EvalMode::Deferred, EvalMode::Eager] {
        let ctx = context(mode, CapturePolicy::Off);
        let seqs: Vec<u64> = (0..8)
            .map(|k| {
                let f = call(&ctx, "div", vec![i32s(&[k], &[1]), i32s(&[0], &[1])]);
                f.seq()
            })
            .collect();
        let e = ctx.evaluate().unwrap_err();
        let got: Vec<u64> = e.related().iter().filter_map(|r| r.sequence()).collect();
        assert_eq!(got, seqs, "{mode:?}");
    }
}

#[test]
fn poll_hands_deferred_work_to_the_workers() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
    assert_eq!(f.poll(), Status::Pending);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.poll() == Status::Pending {
        assert!(
            std::time::Instant::now() < deadline,
            "poll must start the work"
        );
        std::thread::yield_now();
    }
    assert_eq!(f.poll(), Status::Ready);
}

#[test]
fn eager_work_runs_on_a_worker_thread_never_inline() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let seen = Arc::new(Mutex::new(Vec::new()));
    host_op(&ctx, "whereami", Arc::new(HostThread(seen.clone())));
    for _ in 0..20 {
        let f = call(&ctx, "whereami", vec![i32s(&[1], &[1])]);
        f.wait(None).unwrap();
    }
    let me = std::thread::current().id();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 20);
    assert!(seen.iter().all(|t| *t != me), "EAGER ran inline");
    // SYNC runs on the calling thread.
    let ctx = context(EvalMode::SyncCpu, CapturePolicy::Off);
    let inline = Arc::new(Mutex::new(Vec::new()));
    host_op(&ctx, "whereami", Arc::new(HostThread(inline.clone())));
    call(&ctx, "whereami", vec![i32s(&[1], &[1])]);
    assert_eq!(*inline.lock().unwrap(), [me]);
}

fn counter_callback(count: &Arc<AtomicUsize>) -> ndx::exec::Callback {
    let c = count.clone();
    Box::new(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    })
}

#[test]
fn on_ready_fires_exactly_once_in_every_order() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    host_op(&ctx, "slow", Arc::new(HostSleep(Duration::from_millis(30))));
    // Registered before completion.
    let before = Arc::new(AtomicUsize::new(0));
    let f = call(&ctx, "slow", vec![i32s(&[1], &[1])]);
    f.on_ready(counter_callback(&before));
    f.wait(None).unwrap();
    // Registered after completion: runs at once on this thread.
    let after = Arc::new(AtomicUsize::new(0));
    f.on_ready(counter_callback(&after));
    assert_eq!(after.load(Ordering::SeqCst), 1);
    // Future released before completion: the callback still fires.
    let released = Arc::new(AtomicUsize::new(0));
    let g = call(&ctx, "slow", vec![i32s(&[1], &[1])]);
    g.on_ready(counter_callback(&released));
    drop(g);
    // Failure, and cancellation.
    let failed = Arc::new(AtomicUsize::new(0));
    let h = call(&ctx, "div", vec![i32s(&[1], &[1]), i32s(&[0], &[1])]);
    h.on_ready(counter_callback(&failed));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let d = call_in(
        &ctx,
        "add",
        vec![i32s(&[1], &[1]), i32s(&[1], &[1])],
        EvalMode::Deferred,
    );
    d.on_ready(counter_callback(&cancelled));
    assert!(d.cancel("test"));
    assert!(!d.cancel("again"), "only once");
    assert_eq!(failure(&d).kind(), ErrorKind::Cancelled);
    let _ = ctx.evaluate();
    for (name, c) in [
        ("before", &before),
        ("after", &after),
        ("released", &released),
        ("failed", &failed),
        ("cancelled", &cancelled),
    ] {
        assert_eq!(c.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[test]
fn releasing_the_context_cancels_pending_work_and_fires_callbacks() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let counter = || Arc::new(AtomicUsize::new(0));
    let (started, done, released) = (counter(), counter(), counter());
    let slow = SlowCounted(Duration::from_millis(200), started.clone(), done, released);
    host_op(&ctx, "slow", Arc::new(slow));
    // Deferred work waiting for a running operator (on_ready hands it to the workers).
    let s = call_in(&ctx, "slow", vec![i32s(&[1], &[1])], EvalMode::Eager);
    spin_until("the operator starts", || {
        started.load(Ordering::SeqCst) == 1
    });
    let fired = Arc::new(AtomicUsize::new(0));
    let f1 = call(&ctx, "add", vec![out(&s), i32s(&[1], &[1])]);
    let f2 = call(&ctx, "sum", vec![out(&f1)]);
    f1.on_ready(counter_callback(&fired));
    f2.on_ready(counter_callback(&fired));
    drop(ctx);
    assert!(s.is_done(), "the running operator was waited for");
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    // Cancelled itself, or (when f1's cancellation released it to a worker first)
    // failed with f1's cancellation as its cause.
    let e = failure(&f2);
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    let released = |e: &Error| e.message().contains("its context was released");
    assert!(released(&e) || e.cause().is_some_and(released), "{e}");
}

#[test]
fn cancelled_input_fails_its_dependents_with_it_as_cause() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let f1 = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[1], &[1])]);
    let f2 = call(&ctx, "sum", vec![out(&f1)]);
    assert!(f1.cancel("test"));
    let e = failure(&f2);
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(e.cause().map(Error::kind), Some(ErrorKind::Cancelled));
}

#[test]
fn waiting_inside_a_callback_is_refused_not_a_deadlock() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[1], &[1])]);
    let g = call_in(
        &ctx,
        "add",
        vec![i32s(&[1], &[1]), i32s(&[1], &[1])],
        EvalMode::Deferred,
    );
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let g2 = g.clone();
    f.on_ready(Box::new(move |_| {
        *s.lock().unwrap() = Some(g2.wait(None).map_err(|e| e.message().to_string()));
    }));
    f.wait(None).unwrap();
    let got = loop {
        if let Some(v) = seen.lock().unwrap().take() {
            break v;
        }
        std::thread::yield_now();
    };
    let msg = got.expect_err("refused");
    assert!(msg.contains("would block an ndx worker"), "{msg}");
}

/// A SYNC invocation made inside a callback whose input is still pending would have
/// to wait for it on an ndx worker: it is refused at invoke (RUNTIME, naming both
/// invocations) instead of blocking the pool, and the pending input is left to run
/// later.
#[test]
fn a_sync_invocation_inside_a_callback_on_a_pending_input_fails_not_blocks() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[1], &[1])]);
    let g = call_in(&ctx, "neg", vec![i32s(&[5], &[1])], EvalMode::Deferred);
    let seen = Arc::new(Mutex::new(None));
    let (s, inner, pending) = (seen.clone(), ctx.clone(), g.clone());
    f.on_ready(Box::new(move |_| {
        let r = inner
            .invoke(
                "abs",
                vec![out(&pending)],
                Args::new(),
                Some(EvalMode::SyncCpu),
                here(),
            )
            .map(|_| ())
            .map_err(|e| (e.kind(), e.message().to_string()));
        *s.lock().unwrap() = Some(r);
    }));
    f.wait(None).unwrap();
    let got = loop {
        if let Some(v) = seen.lock().unwrap().take() {
            break v;
        }
        std::thread::yield_now();
    };
    let (kind, msg) = got.expect_err("refused to block");
    assert_eq!(kind, ErrorKind::Runtime, "{msg}");
    assert!(
        msg.contains(&format!(
            "a SYNC invocation of 'abs' waiting for its input from invocation #{} from \
             inside an ndx callback or host operator would block an ndx worker",
            g.seq()
        )),
        "{msg}"
    );
    // The DEFERRED input was not run by the refusal; it runs when asked for.
    assert_eq!(g.poll(), Status::Pending);
    g.wait(None).unwrap();
    assert_eq!(values_i32(&g), [-5]);
}

#[test]
fn batch_inputs_run_per_sample() {
    use ndx::exec::BatchRef;
    use ndx::tensor::Batch;
    let ctx = context(EvalMode::SyncCpu, CapturePolicy::Off);
    let sample = |v: &[i32], shape: &[i64]| {
        Arc::new(
            Tensor::new_host(DType::I32, shape, Default::default(), |b| {
                b.copy_from_slice(bytemuck::cast_slice(v));
                Ok(())
            })
            .unwrap(),
        )
    };
    let batch = Batch::new(vec![sample(&[1, 2], &[2]), sample(&[3, 4, 5], &[3])]).unwrap();
    let input = Input::Batch(Arc::new(BatchRef::ready(Arc::new(batch))));
    let f = call(&ctx, "sum", vec![input]);
    let Some(Ok(outs)) = f.result() else {
        panic!("ok")
    };
    let Data::Batch(b) = &outs[0] else {
        panic!("batch out")
    };
    let sums: Vec<i64> = b
        .samples()
        .iter()
        .map(|s| i64::from_ne_bytes(s.to_bytes().unwrap().try_into().unwrap()))
        .collect();
    assert_eq!(sums, [3, 12]);
}

#[test]
fn many_threads_share_one_context_without_losing_errors() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let failures = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let ctx = ctx.clone();
            let failures = failures.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let mode = MODES[(i + t) % 4];
                    let divisor = if i % 7 == 0 { 0 } else { 1 };
                    let f = ctx
                        .invoke(
                            "div",
                            vec![i32s(&[8], &[1]), i32s(&[divisor], &[1])],
                            Args::new(),
                            Some(mode),
                            here(),
                        )
                        .unwrap();
                    match i % 3 {
                        0 => {
                            if f.wait(None).is_ok() && matches!(f.result(), Some(Err(_))) {
                                failures.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        1 => {
                            while f.poll() == Status::Pending {
                                std::thread::yield_now();
                            }
                        }
                        _ => drop(f), // reported by evaluate if it failed
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let expected_failures = 4 * (0..100).filter(|i| i % 7 == 0).count();
    let reported = ctx.evaluate().err().map_or(0, |e| e.related().len());
    // Failures observed by wait or poll plus those evaluate reports: all of them.
    let polled = 4 * (0..100).filter(|i| i % 7 == 0 && i % 3 == 1).count();
    assert_eq!(
        failures.load(Ordering::SeqCst) + polled + reported,
        expected_failures
    );
}

#[test]
fn process_events_mode_runs_callbacks_and_host_ops_only_on_the_asking_thread() {
    let ctx = new_context(
        Settings {
            mode: EvalMode::Eager,
            capture: CapturePolicy::Off,
            events_mode: true,
            ..Settings::default()
        },
        2,
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    host_op(&ctx, "whereami", Arc::new(HostThread(seen.clone())));
    let fired = Arc::new(AtomicUsize::new(0));
    // A built-in runs on the workers; its callback waits for process_events.
    let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[1], &[1])]);
    f.on_ready(counter_callback(&fired));
    while !f.is_done() {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(fired.load(Ordering::SeqCst), 0, "not before process_events");
    assert_eq!(ctx.run_events(), 1);
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    // A host operator waits for process_events too, and runs on this thread.
    let h = call(&ctx, "whereami", vec![i32s(&[1], &[1])]);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!h.is_done(), "host op ran outside process_events");
    assert_eq!(ctx.run_events(), 1);
    assert!(h.is_done());
    // A wait processes events itself.
    let h2 = call(&ctx, "whereami", vec![i32s(&[2], &[1])]);
    h2.wait(None).unwrap();
    let me = std::thread::current().id();
    assert_eq!(*seen.lock().unwrap(), [me, me]);
}

/// Regression: a child enqueued while its parent completed on a worker used to lose
/// the parent's wake-up and stay pending forever.
#[test]
fn chains_enqueued_while_parents_complete_all_run() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let parent = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
                    call(&ctx, "add", vec![out(&parent), i32s(&[3], &[1])]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let c = ctx.clone();
    std::thread::spawn(move || tx.send(c.evaluate().is_ok()).unwrap());
    let ok = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("evaluate hung: a chained invocation never ran");
    assert!(ok);
}

/// Returns its input and promises `contract` about it.
struct HostPromises(ndx::ops::Contract);
impl HostKernel for HostPromises {
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        _: &Args,
        _: usize,
    ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        Ok(vec![inputs[0].clone()])
    }
    fn contract(&self) -> ndx::ops::Contract {
        self.0.clone()
    }
}

#[test]
fn debug_backend_reports_broken_promises_at_the_enqueue_site() {
    use ndx::ops::{Contract, OutDecl};
    let int64 = Contract {
        outputs: vec![OutDecl {
            dtype: Some(DType::I64),
            ..OutDecl::default()
        }],
        may_alias: true,
    };
    let aliasing = Contract::default();
    let honest = Contract {
        outputs: vec![OutDecl {
            dtype: Some(DType::I32),
            ndim: Some(1),
            layout: None,
        }],
        may_alias: true,
    };
    for mode in MODES {
        for debug in [false, true] {
            let ctx = context(mode, CapturePolicy::Off);
            if debug {
                ctx.update(|s| s.backend = Backend::parse("debug").unwrap());
            }
            host_op(&ctx, "says_int64", Arc::new(HostPromises(int64.clone())));
            host_op(&ctx, "aliases", Arc::new(HostPromises(aliasing.clone())));
            host_op(&ctx, "honest", Arc::new(HostPromises(honest.clone())));
            let input = vec![i32s(&[1], &[1])];
            let r = ctx.invoke("says_int64", input, Args::new(), None, here());
            let line = line!() - 1;
            let f = r.unwrap();
            if debug {
                let e = failure(&f);
                assert_eq!(e.kind(), ErrorKind::Backend, "{mode:?}");
                assert_eq!(
                    e.message(),
                    "debug backend: operator 'says_int64' output 0 has dtype int32, its schema declares int64"
                );
                assert_eq!((e.op(), e.sequence()), (Some("says_int64"), Some(1)));
                assert_site(&e, line);
                let e = failure(&call(&ctx, "aliases", vec![i32s(&[1], &[1])]));
                assert!(
                    e.message().contains("output 0 shares memory with input 0"),
                    "{e}"
                );
            } else {
                f.wait(None).expect("the default backend trusts the kernel");
                call(&ctx, "aliases", vec![i32s(&[1], &[1])])
                    .wait(None)
                    .unwrap();
            }
            call(&ctx, "honest", vec![i32s(&[1], &[1])])
                .wait(None)
                .unwrap();
        }
    }
}

/// Runs `f` on another thread and returns its value; fails the test when it has not
/// returned within 20 s (a hang).
fn within_20s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} did not return within 20 s"))
}

#[test]
fn a_graph_spanning_two_contexts_is_tracked_by_each_context() {
    for consumer in [EvalMode::Deferred, EvalMode::Eager] {
        // With more graphs than explain keeps in detail, no graph id is stored, and
        // what was left to see was the pending set of the wrong context.
        for earlier_graphs in [0, ndx::debug::explain::MAX_RECORDS + 1] {
            let a = context(EvalMode::Deferred, CapturePolicy::Off);
            let b = context(EvalMode::Deferred, CapturePolicy::Off);
            let x = i32s(&[1, 2, 3, 4], &[4]);
            for _ in 0..earlier_graphs {
                call(&a, "neg", vec![x.clone()]).poll();
            }
            a.evaluate().unwrap();
            let fb = call(&b, "add", vec![x.clone(), x.clone()]);
            let fa = call_in(&a, "add", vec![out(&fb), x.clone()], consumer);
            let (a2, fa2) = (a.clone(), fa.clone());
            within_20s("wait and evaluate in the consumer's context", move || {
                fa2.wait(None).unwrap();
                a2.evaluate().unwrap();
            });
            assert_eq!(values_i32(&fa), [3, 6, 9, 12]);
            assert!(fb.is_done());
            // B's invocation ran in a graph of B, A's (when deferred) in one of A.
            let eb = b.explain();
            assert_eq!(eb.graphs_total, 1, "{consumer:?}");
            assert_eq!(eb.graphs[0].ops, 1);
            assert!(eb.graphs[0].time_ns.is_some(), "B's graph completed");
            let ea = a.explain();
            let deferred_in_a = u64::from(consumer == EvalMode::Deferred);
            assert_eq!(ea.graphs_total, earlier_graphs as u64 + deferred_in_a);
            assert_eq!(ea.graph_ops, earlier_graphs as u64 + deferred_in_a);
            if consumer == EvalMode::Deferred && earlier_graphs == 0 {
                assert_eq!(ea.graphs[0].ops, 1);
                assert!(ea.graphs[0].time_ns.is_some(), "A's graph completed");
            }
            let b2 = b.clone();
            within_20s("evaluate in the producer's context", move || b2.evaluate()).unwrap();
        }
    }
}

/// A host operator that sleeps for `.0`; counts its starts, ends and releases.
struct SlowCounted(
    Duration,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
);
impl HostKernel for SlowCounted {
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        _: &Args,
        _: usize,
    ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        self.1.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.0);
        self.2.fetch_add(1, Ordering::SeqCst);
        Ok(vec![inputs[0].clone()])
    }
    fn release(&self) {
        self.3.fetch_add(1, Ordering::SeqCst);
    }
}

fn spin_until(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropping_the_last_reference_joins_even_while_a_worker_holds_the_context() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let counter = || Arc::new(AtomicUsize::new(0));
    let (started, done, released) = (counter(), counter(), counter());
    host_op(
        &ctx,
        "slow",
        Arc::new(SlowCounted(
            Duration::from_millis(300),
            started.clone(),
            done.clone(),
            released.clone(),
        )),
    );
    // A callback that runs on a worker while the operator runs on another: completing
    // its future holds the context all the while.
    let x = call_in(&ctx, "neg", vec![i32s(&[1], &[1])], EvalMode::Deferred);
    let (cb_started, cb_done) = (counter(), counter());
    let (s, d) = (cb_started.clone(), cb_done.clone());
    x.on_ready(Box::new(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        d.fetch_add(1, Ordering::SeqCst);
    }));
    let slow = call(&ctx, "slow", vec![i32s(&[1], &[1])]);
    spin_until("the operator starts", || {
        started.load(Ordering::SeqCst) == 1
    });
    x.poll();
    spin_until("the callback starts", || {
        cb_started.load(Ordering::SeqCst) == 1
    });
    drop(ctx); // the only public reference
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "the running operator finished before the release returned"
    );
    assert_eq!(
        cb_done.load(Ordering::SeqCst),
        1,
        "the running callback finished before the release returned"
    );
    assert_eq!(
        released.load(Ordering::SeqCst),
        1,
        "the host operator's data was released by the release"
    );
    assert!(slow.is_done());
}

fn events_context() -> Context {
    new_context(
        Settings {
            mode: EvalMode::Eager,
            capture: CapturePolicy::Off,
            events_mode: true,
            ..Settings::default()
        },
        2,
    )
}

#[test]
fn a_callback_in_a_process_events_wait_dropping_the_last_reference_leaves_the_release_to_the_wait()
{
    let ctx = events_context();
    let counter = || Arc::new(AtomicUsize::new(0));
    let (started, done, released) = (counter(), counter(), counter());
    host_op(
        &ctx,
        "counted",
        Arc::new(SlowCounted(
            Duration::ZERO,
            started.clone(),
            done.clone(),
            released.clone(),
        )),
    );
    // The host operator runs inside the wait, then its callback, which drops the last
    // public reference.
    let h = call(&ctx, "counted", vec![i32s(&[1], &[1])]);
    let last = Arc::new(Mutex::new(Some(ctx)));
    let (l, fired_on) = (last.clone(), Arc::new(Mutex::new(None)));
    let f = fired_on.clone();
    h.on_ready(Box::new(move |_| {
        *f.lock().unwrap() = Some(std::thread::current().id());
        drop(l.lock().unwrap().take());
    }));
    h.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    assert!(
        last.lock().unwrap().is_none(),
        "the callback dropped the context"
    );
    assert_eq!(
        *fired_on.lock().unwrap(),
        Some(std::thread::current().id()),
        "the callback ran in the wait"
    );
    assert_eq!(
        released.load(Ordering::SeqCst),
        1,
        "the wait released the context (joining) when it returned"
    );
}

#[test]
fn a_failure_only_looked_up_internally_is_still_reported_by_evaluate() {
    // What its output went into next: an invocation refused at call time, a DEFERRED one
    // cancelled before it ran, or one that ran and failed with it as its cause.
    for consumer in ["refused at call time", "cancelled", "ran"] {
        let ctx = context(EvalMode::Eager, CapturePolicy::Off);
        let a = call(
            &ctx,
            "div",
            vec![i32s(&[1, 2, 3, 4], &[4]), i32s(&[1, 0, 3, 4], &[4])],
        );
        spin_until("the division completes", || a.is_done());
        match consumer {
            "refused at call time" => {
                let e = ctx
                    .invoke(
                        "add",
                        vec![out(&a), i32s(&[1, 2, 3], &[3])],
                        Args::new(),
                        None,
                        here(),
                    )
                    .err()
                    .expect("a shape mismatch at call time");
                assert!(e.message().contains("cannot be broadcast"), "{e}");
            }
            "cancelled" => {
                let c = call_in(&ctx, "neg", vec![out(&a)], EvalMode::Deferred);
                assert!(c.cancel("the test cancels it"));
            }
            _ => {
                let c = call(&ctx, "neg", vec![out(&a)]);
                c.wait(None).unwrap();
            }
        }
        let e = ctx.evaluate().expect_err(consumer);
        // A's failure is reported: on its own, or as the cause of the consumer's.
        let reports_a = e.related().iter().any(|r| {
            r.sequence() == Some(a.seq()) || r.cause().and_then(Error::sequence) == Some(a.seq())
        });
        assert!(reports_a, "{consumer}: {}", e.traceback());
        // A alone, or the consumer with A as its cause (a cancellation is not
        // reported: whoever cancelled it knows).
        assert_eq!(e.related().len(), 1, "{consumer}: {}", e.traceback());
        assert!(ctx.evaluate().is_ok(), "{consumer}: reported exactly once");
    }
}

/// Counts its drops (a callback's `user_free`).
struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A callback that records whether it ran on an ndx worker, owning a [`DropCount`].
fn where_callback(
    fired: &Arc<AtomicUsize>,
    on_worker: &Arc<AtomicUsize>,
    freed: &Arc<AtomicUsize>,
) -> ndx::exec::Callback {
    let (f, w, guard) = (fired.clone(), on_worker.clone(), DropCount(freed.clone()));
    Box::new(move |_| {
        let _guard = guard;
        f.fetch_add(1, Ordering::SeqCst);
        if ndx::exec::on_worker() {
            w.fetch_add(1, Ordering::SeqCst);
        }
    })
}

#[test]
fn process_events_callbacks_never_run_on_a_worker_when_the_context_is_released() {
    let counter = || Arc::new(AtomicUsize::new(0));
    // Released by this thread while a big add runs on a worker: its callback runs
    // here, during the release.
    let big: Vec<i32> = vec![1; 1 << 22];
    let (fired, on_worker, freed) = (counter(), counter(), counter());
    for _ in 0..5 {
        let ctx = events_context();
        let f = call(
            &ctx,
            "add",
            vec![i32s(&big, &[1 << 22]), i32s(&big, &[1 << 22])],
        );
        f.on_ready(where_callback(&fired, &on_worker, &freed));
        drop(f);
        std::thread::sleep(Duration::from_millis(2));
        drop(ctx);
    }
    assert_eq!(
        fired.load(Ordering::SeqCst),
        5,
        "each ran during its release"
    );
    assert_eq!(on_worker.load(Ordering::SeqCst), 0, "none on a worker");
    assert_eq!(freed.load(Ordering::SeqCst), 5);

    // Released from a callback of another context, on a worker: the queued callback
    // is dropped uncalled there (its user data freed), not run on the worker.
    let (fired, on_worker, freed) = (counter(), counter(), counter());
    let ctx = events_context();
    let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[1], &[1])]);
    spin_until("the add completes", || f.is_done());
    f.on_ready(where_callback(&fired, &on_worker, &freed)); // queued for process_events
    let other = context(EvalMode::Eager, CapturePolicy::Off);
    let g = call_in(&other, "neg", vec![i32s(&[1], &[1])], EvalMode::Deferred);
    let released_on_worker = counter();
    let (last, r) = (Arc::new(Mutex::new(Some(ctx))), released_on_worker.clone());
    let l = last.clone();
    g.on_ready(Box::new(move |_| {
        if ndx::exec::on_worker() {
            r.fetch_add(1, Ordering::SeqCst);
        }
        drop(l.lock().unwrap().take()); // the last reference
    }));
    g.poll(); // runs it on a worker, with its callback
    spin_until("the other context's callback releases it", || {
        last.lock().unwrap().is_none()
    });
    spin_until("the queued callback is let go", || {
        freed.load(Ordering::SeqCst) == 1
    });
    assert_eq!(
        released_on_worker.load(Ordering::SeqCst),
        1,
        "released on a worker"
    );
    assert_eq!(fired.load(Ordering::SeqCst), 0, "dropped uncalled");
    assert_eq!(on_worker.load(Ordering::SeqCst), 0);
}

#[test]
fn process_events_waits_keep_their_timeout_and_start_no_work_after_it() {
    let ctx = events_context();
    let counter = || Arc::new(AtomicUsize::new(0));
    let (started, done, released) = (counter(), counter(), counter());
    let slow = |ms| {
        Arc::new(SlowCounted(
            Duration::from_millis(ms),
            started.clone(),
            done.clone(),
            released.clone(),
        ))
    };
    host_op(&ctx, "slow", slow(300));
    host_op(&ctx, "quick", slow(0));
    // A host operator waits for process-events; a wait of 0 does not run it.
    let h = call(&ctx, "slow", vec![i32s(&[1], &[1])]);
    let t0 = std::time::Instant::now();
    let e = h.wait(Some(Duration::ZERO)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("did not complete within"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(200),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(started.load(Ordering::SeqCst), 0, "nothing started");
    // Waiting 50 ms for an operator queued behind the slow one: the slow one starts
    // (time was left), the quick one does not once the time ran out.
    let q = call(&ctx, "quick", vec![i32s(&[1], &[1])]);
    let e = q.wait(Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert_eq!(done.load(Ordering::SeqCst), 1, "the slow one ran");
    assert!(
        !q.is_done(),
        "the quick one was not started after the time ran out"
    );
    q.wait(None).unwrap();
    assert!(h.is_done() && q.is_done());
}

#[test]
fn on_ready_hands_deferred_work_to_the_workers() {
    let ctx = context(EvalMode::Deferred, CapturePolicy::Off);
    let fired = Arc::new(AtomicUsize::new(0));
    let f1 = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
    let f2 = call(&ctx, "neg", vec![out(&f1)]);
    f2.on_ready(counter_callback(&fired));
    // No poll, wait or evaluate: the callback alone runs the graph.
    spin_until("the callback fires", || fired.load(Ordering::SeqCst) == 1);
    assert!(f1.is_done() && f2.is_done());
    assert_eq!(values_i32(&f2), [-3]);
    let x = ctx.explain();
    assert_eq!(x.graphs_total, 1);
    assert_eq!(x.graphs[0].ops, 2);
    assert_eq!(x.graphs[0].reason, ndx::debug::explain::Flush::Poll);
}

#[test]
fn a_host_input_takes_as_many_values_as_its_shape_holds() {
    let Err(e) = Input::host(&[1i32, 2, 3], &[2, 2]) else {
        panic!("three values for a 2 x 2 shape were taken")
    };
    assert_eq!(
        e.message(),
        "shape [2, 2] holds 4 elements, 3 values were given"
    );
    let Input::Tensor(t) = Input::host(&[1.5f32, -2.0], &[2, 1]).unwrap() else {
        panic!("not a tensor")
    };
    let t = t.resolve().unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::F32, &[2i64, 1][..]));
    assert_eq!(
        t.compact_bytes().unwrap().as_ref(),
        bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0])
    );
}

/// A failure passed down a long dependent chain: each invocation holds the one whose
/// failure failed it, so dropping the chain used to recurse once per link and
/// overflow the stack (a crash, on whichever thread let go last: this test's, with
/// its 2 MiB stack, or a worker). Every mode; the context released with the chain
/// unobserved, or after the last failure was read, or the chain released first.
#[test]
fn a_failure_down_a_chain_of_many_invocations_is_dropped_without_recursion() {
    const LINKS: usize = 50_000;
    for mode in MODES {
        for order in 0..3 {
            let ctx = context(mode, CapturePolicy::Off);
            ctx.update(|s| s.backend = Backend::parse("inject_runtime_error:sub").unwrap());
            let x = i32s(&[1, 2], &[2]);
            let mut last = call(&ctx, "sub", vec![x.clone(), x.clone()]);
            for _ in 0..LINKS {
                last = call(&ctx, "add", vec![out(&last), x.clone()]);
            }
            if order == 1 {
                let e = failure(&last);
                assert_eq!(e.kind(), ErrorKind::Runtime, "{mode:?}");
                assert_eq!(e.chain().count(), LINKS + 1, "{mode:?}");
                let root = e.chain().last().unwrap();
                assert!(
                    root.message()
                        .contains("injected runtime error in operator 'sub'")
                );
            }
            if order == 2 {
                last.wait(None).unwrap();
                drop(last);
                drop(ctx);
            } else {
                drop(ctx);
                drop(last);
            }
        }
    }
}

/// A loop driven by callbacks: each step's callback invokes the next step and
/// registers itself on it. In a SYNC mode the next step is complete before its
/// callback is registered, so that callback became due inside the running one: run
/// there, at once, each step nested one level deeper (a stack overflow after some
/// thousands of steps, on this thread's small stack). It runs once the running
/// callback returns instead: never more than one step deep.
#[test]
fn a_loop_of_callbacks_each_registering_the_next_runs_flat() {
    const STEPS: usize = 20_000;
    struct Steps {
        left: AtomicUsize,
        ran: AtomicUsize,
        depth: AtomicUsize,
        deepest: AtomicUsize,
    }
    fn step(ctx: Context, steps: Arc<Steps>) {
        let f = call(&ctx, "add", vec![i32s(&[1], &[1]), i32s(&[2], &[1])]);
        let s = steps.clone();
        f.on_ready(Box::new(move |_| {
            let depth = s.depth.fetch_add(1, Ordering::SeqCst) + 1;
            s.deepest.fetch_max(depth, Ordering::SeqCst);
            s.ran.fetch_add(1, Ordering::SeqCst);
            if s.left.fetch_sub(1, Ordering::SeqCst) > 1 {
                step(ctx, s.clone());
            }
            s.depth.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for mode in [EvalMode::SyncCpu, EvalMode::SyncFull] {
        let ctx = context(mode, CapturePolicy::Off);
        let steps = Arc::new(Steps {
            left: AtomicUsize::new(STEPS),
            ran: AtomicUsize::new(0),
            depth: AtomicUsize::new(0),
            deepest: AtomicUsize::new(0),
        });
        let s = steps.clone();
        let c = ctx.clone();
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || step(c, s))
            .unwrap()
            .join()
            .expect("the loop's thread");
        assert_eq!(steps.ran.load(Ordering::SeqCst), STEPS, "{mode:?}");
        assert_eq!(steps.deepest.load(Ordering::SeqCst), 1, "{mode:?}");
        ctx.evaluate().unwrap();
    }
}

/// Axes are checked for repeats and looked up in a table per axis, not by searching
/// the list of axes for each axis, which made `sum` and `squeeze` quadratic in the
/// rank and in the length of the axis list (80,000 axes: 3.2 s and 1.9 s in a release
/// build; 200,000 would take minutes). Ranks stop at `MAX_NDIM` now, but an axis list
/// may still be that long.
#[test]
fn reductions_and_squeezes_stay_linear_in_a_very_high_rank() {
    const RANK: usize = ndx::tensor::MAX_NDIM as usize;
    let ctx = context(EvalMode::SyncCpu, CapturePolicy::Off);
    let mut shape = vec![1i64; RANK];
    shape[RANK / 2] = 4;
    let with = |op: &str, input: Input, args: Args| {
        ctx.invoke(op, vec![input], args, None, here())
            .expect("enqueue")
    };
    let x = with(
        "reshape",
        i32s(&[1, 2, 3, 4], &[4]),
        Args::new().with("shape", ArgValue::Ints(shape.clone())),
    );
    let shape_of = |n: &Arc<Node>| {
        output_tensor(n, 0)
            .unwrap()
            .resolve()
            .expect("ok")
            .shape()
            .to_vec()
    };
    assert_eq!(shape_of(&x), shape);
    let all: Vec<i64> = (0..RANK as i64).collect();
    let total = with(
        "sum",
        out(&x),
        Args::new().with("axes", ArgValue::Ints(all.clone())),
    );
    assert_eq!(values_i64(&total), [10]);
    let mut kept = shape.clone();
    kept[RANK / 2] = 1;
    let keepdims = with(
        "sum",
        out(&x),
        Args::new()
            .with("axes", ArgValue::Ints(all.clone()))
            .with("keepdims", ArgValue::Bool(true)),
    );
    assert_eq!(shape_of(&keepdims), kept);
    let squeezed = with("squeeze", out(&x), Args::new());
    assert_eq!(values_i32(&squeezed), [1, 2, 3, 4]);
    let mut repeated = all;
    repeated.extend((0..200_000).map(|i| i % RANK as i64));
    let e = ctx
        .invoke(
            "sum",
            vec![out(&x)],
            Args::new().with("axes", ArgValue::Ints(repeated)),
            None,
            here(),
        )
        .err()
        .expect("a repeated axis");
    assert!(
        e.message().contains("axis 0 is repeated in axes"),
        "{:?}",
        e.kind()
    );
}

/// Runs once its gate opens (a bounded spin), passing its input through.
struct HostGate(Arc<std::sync::atomic::AtomicBool>);
impl HostKernel for HostGate {
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        _: &Args,
        _: usize,
    ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !self.0.load(Ordering::SeqCst) && std::time::Instant::now() < end {
            std::thread::yield_now();
        }
        Ok(vec![inputs[0].clone()])
    }
}

/// A completion callback that panics on the worker completing its invocation stops
/// there: the callbacks after it still run, once, and the invocation finishes, so
/// `evaluate` and the context's release return (they waited for it forever: the panic
/// left the completion half done).
#[test]
fn a_callback_that_panics_on_a_worker_leaves_the_others_and_the_context_working() {
    let ctx = context(EvalMode::Eager, CapturePolicy::Off);
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    host_op(&ctx, "gate", Arc::new(HostGate(gate.clone())));
    let f = call(&ctx, "gate", vec![i32s(&[7], &[1])]);
    let later = Arc::new(AtomicUsize::new(0));
    f.on_ready(Box::new(|_| {
        panic!("a callback panicked (expected by this test)")
    }));
    f.on_ready(counter_callback(&later));
    gate.store(true, Ordering::SeqCst);
    assert_eq!(values_i32(&f), [7]);
    let ctx = within_20s("evaluate after a callback panicked", move || {
        ctx.evaluate().expect("nothing failed");
        ctx
    });
    assert_eq!(later.load(Ordering::SeqCst), 1);
    within_20s("the release after a callback panicked", move || drop(ctx));
}

/// Panics that unwind out of user code run by ndx (a host operator run inline by a
/// SYNC invocation, a callback run at registration) do not leave the thread marked as
/// running user code: its later waits are not refused as waits from inside a callback.
#[test]
fn a_panic_in_user_code_run_inline_leaves_the_thread_free_to_wait() {
    struct Boom;
    impl HostKernel for Boom {
        fn run(
            &self,
            _: &[Arc<Tensor>],
            _: &Args,
            _: usize,
        ) -> ndx::error::Result<Vec<Arc<Tensor>>> {
            panic!("a host operator panicked (expected by this test)")
        }
    }
    let ctx = context(EvalMode::SyncCpu, CapturePolicy::Off);
    host_op(&ctx, "boom", Arc::new(Boom));
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(true));
    host_op(&ctx, "gate", Arc::new(HostGate(gate)));
    let b = call(&ctx, "boom", vec![i32s(&[1], &[1])]);
    assert_eq!(failure(&b).kind(), ErrorKind::Internal);
    let f = call_in(&ctx, "gate", vec![i32s(&[2], &[1])], EvalMode::Deferred);
    f.wait(Some(Duration::from_secs(20)))
        .expect("a wait after a host operator panicked inline");
    // A callback run at once on a complete future.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        f.on_ready(Box::new(|_| {
            panic!("a callback panicked (expected by this test)")
        }));
    }));
    assert!(panicked.is_err());
    let g = call_in(&ctx, "gate", vec![i32s(&[3], &[1])], EvalMode::Deferred);
    g.wait(Some(Duration::from_secs(20)))
        .expect("a wait after a callback panicked inline");
    assert_eq!(values_i32(&g), [3]);
}
