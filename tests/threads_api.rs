//! One context used from several threads at once through the C API (`ndx::ffi`):
//! futures waited on, polled and given callbacks on threads other than the one that
//! made them, in every eval mode; the context released by one thread while others
//! still hold (and wait on) its pending work, also in process-events mode and while
//! another thread registers a callback; check flags raised from several threads
//! reported once, in enqueue order, each with its own call site (explicit or native);
//! cancels, waits and evaluations racing. Inputs come from DLPack producers whose
//! deleters are counted: each must run exactly once.
//!
//! Every wait is bounded, so a deadlock fails the test instead of hanging it.

mod common;

use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;

use common::*;
use dlpark::ffi::DLManagedTensorVersioned;
use ndx::ffi::*;

const SYNC_CPU: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
const SYNC_FULL: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_FULL as i32;
const DEFERRED: i32 = ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32;
const EAGER: i32 = ndx_eval_mode_t::NDX_EVAL_EAGER as i32;
const MODES: [i32; 4] = [SYNC_CPU, SYNC_FULL, DEFERRED, EAGER];

const READY: i32 = ndx_future_status_t::NDX_FUTURE_READY as i32;
const FAILED: i32 = ndx_future_status_t::NDX_FUTURE_FAILED as i32;
const PENDING: i32 = ndx_future_status_t::NDX_FUTURE_PENDING as i32;

/// How long a test waits for any one thing before calling it a deadlock.
const WAIT_NS: i64 = 20_000_000_000;

/// A handle moved to another thread (the handles are thread-safe; raw pointers are
/// not `Send` to the compiler).
struct Handle<T>(*mut T);
impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
// SAFETY: ndx handles are reference counted and thread-safe (the C API contract).
unsafe impl<T> Send for Handle<T> {}

/// An int32 tensor imported from a counting DLPack producer.
fn import_i32(values: &[i32]) -> (*mut ndx_tensor_t, Count) {
    let mut spec = Spec::f32s(&[], &[values.len() as i64]);
    spec.data = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    spec.dtype = i32_dtype();
    let (m, count): (*mut DLManagedTensorVersioned, Count) = spec.versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    ));
    (t, count)
}

fn values_i32(t: *const ndx_tensor_t) -> Vec<i32> {
    let mut n = 0usize;
    ok(ndx_tensor_numel(t, &mut n));
    let mut out = vec![0i32; n];
    ok(ndx_tensor_copy_to(
        t,
        out.as_mut_ptr().cast::<c_void>(),
        n * 4,
    ));
    out
}

fn tensor_in(t: *const ndx_tensor_t) -> ndx_input_t {
    ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }
}

/// Invoke options in `mode` with an explicit caller location (`line`).
fn located(mode: i32, file: &CString, function: &CString, line: u32) -> ndx_invoke_options_t {
    ndx_invoke_options_t {
        location: ndx_location_t {
            file: file.as_ptr(),
            line,
            function: function.as_ptr(),
        },
        ..invoke_options(mode, &[])
    }
}

/// The line of frame 0 of `e` (the explicit location it was enqueued with).
fn site_line(e: *const ndx_error_t) -> u32 {
    assert!(ndx_error_frame_count(e) > 0, "an error without frames");
    frame(e, 0).line
}

unsafe extern "C" fn count_fired(user: *mut c_void, _f: *const ndx_future_t) {
    // SAFETY: `user` is a live `Callbacks` (freed by `count_freed` only).
    unsafe { &*user.cast::<Callbacks>() }
        .fired
        .fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn count_freed(user: *mut c_void) {
    // SAFETY: an `Arc<Callbacks>` reference made by `on_ready`, given up here once.
    let c = unsafe { Arc::from_raw(user.cast::<Callbacks>()) };
    c.freed.fetch_add(1, Ordering::SeqCst);
}

#[derive(Default)]
struct Callbacks {
    registered: AtomicUsize,
    fired: AtomicUsize,
    freed: AtomicUsize,
}

/// Registers a counting callback on `f` (its `user` is a reference to `c`).
fn on_ready(f: *const ndx_future_t, c: &Arc<Callbacks>) {
    let user = Arc::into_raw(c.clone()).cast_mut().cast::<c_void>();
    ok(ndx_future_on_ready(
        f,
        Some(count_fired),
        user,
        Some(count_freed),
    ));
    c.registered.fetch_add(1, Ordering::SeqCst);
}

/// Polls `f` until it completes (bounded); its final status.
fn poll_until_done(f: *const ndx_future_t) -> i32 {
    let end = std::time::Instant::now() + std::time::Duration::from_nanos(WAIT_NS as u64);
    loop {
        let st = ndx_future_poll(f);
        if st != PENDING || std::time::Instant::now() >= end {
            return st;
        }
        thread::yield_now();
    }
}

/// What a consumer thread expects of a future made on another thread.
struct Made {
    future: Handle<ndx_future_t>,
    /// `None`: it fails (a division by zero, or a sum of one) at `line`, caused
    /// (when `cause_line` is set) by the failure enqueued at that line.
    sum: Option<Vec<i32>>,
    line: u32,
    cause_line: Option<u32>,
}

/// Producers invoke in every eval mode (some invocations fail, some read the pending
/// output of the one before); consumers on other threads wait on, poll and register
/// callbacks on those futures: right values, errors with the op and the site of
/// their own enqueue, every callback once, nothing left unobserved, each producer
/// deleter once.
#[test]
fn futures_made_on_one_thread_complete_on_others_in_every_mode() {
    const PRODUCERS: usize = 2;
    const PER_PRODUCER: u32 = 120;
    let ctx = Ctx::new(EAGER);
    let (a, ca) = import_i32(&[7, -7, 9, 10]);
    let (b, cb) = import_i32(&[2, 2, 3, 5]);
    let (z, cz) = import_i32(&[2, 0, 3, 5]);
    let (ah, bh, zh, ch) = (Handle(a), Handle(b), Handle(z), Handle(ctx.0));
    let callbacks = Arc::new(Callbacks::default());
    let (tx, rx) = mpsc::channel::<Made>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let file = CString::new("producer.c").unwrap();
    let function = CString::new("produce").unwrap();

    let producers: Vec<_> = (0..PRODUCERS as u32)
        .map(|p| {
            let tx = tx.clone();
            let (file, function) = (file.clone(), function.clone());
            thread::spawn(move || {
                let (ctx, a, b, z) = (ch, ah, bh, zh);
                let ctx = Ctx(ctx.0);
                for i in 0..PER_PRODUCER {
                    let line = 10_000 * (p + 1) + 10 * i;
                    let mode = MODES[(i as usize + p as usize) % 4];
                    let next = MODES[(i as usize / 4 + p as usize) % 4];
                    let o1 = located(mode, &file, &function, line);
                    let o2 = located(next, &file, &function, line + 1);
                    let made = match i % 3 {
                        // add, then add of its (maybe pending) output and b.
                        0 => {
                            let f1 = invoke_with(
                                &ctx,
                                c"add",
                                &[tensor_in(a.0), tensor_in(b.0)],
                                std::ptr::null(),
                                &o1,
                            )
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                            let mut t = std::ptr::null_mut();
                            ok(ndx_future_tensor(f1, 0, &mut t));
                            let f2 = invoke_with(
                                &ctx,
                                c"add",
                                &[tensor_in(t), tensor_in(b.0)],
                                std::ptr::null(),
                                &o2,
                            )
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                            ndx_tensor_release(t);
                            ndx_future_release(f1);
                            Made {
                                future: Handle(f2),
                                sum: Some(vec![11, -3, 15, 20]),
                                line: line + 1,
                                cause_line: None,
                            }
                        }
                        // An integer division by zero.
                        1 => {
                            let f = invoke_with(
                                &ctx,
                                c"div",
                                &[tensor_in(a.0), tensor_in(z.0)],
                                std::ptr::null(),
                                &o1,
                            )
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                            Made {
                                future: Handle(f),
                                sum: None,
                                line,
                                cause_line: None,
                            }
                        }
                        // A sum of that: fails with the division as its cause.
                        _ => {
                            let f1 = invoke_with(
                                &ctx,
                                c"div",
                                &[tensor_in(a.0), tensor_in(z.0)],
                                std::ptr::null(),
                                &o1,
                            )
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                            let mut t = std::ptr::null_mut();
                            ok(ndx_future_tensor(f1, 0, &mut t));
                            let f2 =
                                invoke_with(&ctx, c"sum", &[tensor_in(t)], std::ptr::null(), &o2)
                                    .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                            ndx_tensor_release(t);
                            ndx_future_release(f1);
                            Made {
                                future: Handle(f2),
                                sum: None,
                                line: line + 1,
                                cause_line: Some(line),
                            }
                        }
                    };
                    tx.send(made).unwrap();
                }
                std::mem::forget(ctx); // the test's reference, released by the test
            })
        })
        .collect();
    drop(tx);

    let consumers: Vec<_> = (0..3usize)
        .map(|k| {
            let rx = rx.clone();
            let callbacks = callbacks.clone();
            thread::spawn(move || {
                let mut n = 0usize;
                loop {
                    let Ok(m) = rx.lock().unwrap().recv() else {
                        break;
                    };
                    let f = m.future.0;
                    on_ready(f, &callbacks);
                    let e = match (n + k) % 3 {
                        0 => ndx_future_wait(f, WAIT_NS),
                        1 => {
                            let st = poll_until_done(f);
                            assert_eq!(st, if m.sum.is_some() { READY } else { FAILED });
                            ndx_future_error(f)
                        }
                        _ => {
                            // Read the output: forces evaluation and waits.
                            let mut t = std::ptr::null_mut();
                            ok(ndx_future_tensor(f, 0, &mut t));
                            let mut v = [0i32; 4];
                            let e = ndx_tensor_copy_to(t, v.as_mut_ptr().cast(), 16);
                            ndx_tensor_release(t);
                            if e.is_null() {
                                assert_eq!(Some(v.to_vec()), m.sum);
                            } else {
                                ndx_error_free(e);
                            }
                            ndx_future_error(f)
                        }
                    };
                    match &m.sum {
                        Some(sum) => {
                            assert!(e.is_null(), "{:?}", take_error(e));
                            let mut t = std::ptr::null_mut();
                            ok(ndx_future_tensor(f, 0, &mut t));
                            assert_eq!(&values_i32(t), sum);
                            ndx_tensor_release(t);
                        }
                        None => {
                            assert!(!e.is_null(), "a failing invocation succeeded");
                            assert_ne!(
                                ndx_error_kind(e),
                                ndx_error_kind_t::NDX_ERROR_TIMEOUT as i32
                            );
                            assert_eq!(ndx_error_kind(e), ndx_error_kind_t::NDX_ERROR_VALUE as i32);
                            assert_eq!(site_line(e), m.line, "the failure's own site");
                            let cause = ndx_error_cause(e);
                            match m.cause_line {
                                Some(line) => {
                                    assert_eq!(cstr(ndx_error_op(e)), "sum");
                                    assert!(!cause.is_null());
                                    assert_eq!(cstr(ndx_error_op(cause)), "div");
                                    assert_eq!(site_line(cause), line, "the cause's own site");
                                }
                                None => assert_eq!(cstr(ndx_error_op(e)), "div"),
                            }
                            ndx_error_free(e);
                        }
                    }
                    // Complete now: the callback runs at once, on this thread.
                    let now = Arc::new(Callbacks::default());
                    on_ready(f, &now);
                    assert_eq!(now.fired.load(Ordering::SeqCst), 1);
                    assert_eq!(now.freed.load(Ordering::SeqCst), 1);
                    ndx_future_release(f);
                    n += 1;
                }
                n
            })
        })
        .collect();

    for p in producers {
        p.join().expect("producer");
    }
    let consumed: usize = consumers
        .into_iter()
        .map(|c| c.join().expect("consumer"))
        .sum();
    assert_eq!(consumed, PRODUCERS * PER_PRODUCER as usize);
    // Every failure was observed by a consumer: nothing is reported again.
    ok(ndx_context_evaluate(ctx.0));
    let registered = callbacks.registered.load(Ordering::SeqCst);
    assert_eq!(registered, consumed);
    assert_eq!(callbacks.fired.load(Ordering::SeqCst), registered);
    assert_eq!(callbacks.freed.load(Ordering::SeqCst), registered);
    drop(ctx);
    for (t, c) in [(a, &ca), (b, &cb), (z, &cz)] {
        ndx_tensor_release(t);
        assert_eq!(calls(c), 1, "the producer's deleter runs once");
    }
}

/// A host operator's kernel: output 0 is a copy of input 0 (4 int32).
unsafe extern "C" fn host_copy(
    _user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _n_inputs: usize,
    _args: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _n_outputs: usize,
) -> *mut ndx_error_t {
    let mut v = [0i32; 4];
    // SAFETY: one input and one output slot, as the schema says.
    let (input, output) = unsafe { (*inputs, &mut *outputs) };
    let e = ndx_tensor_copy_to(input, v.as_mut_ptr().cast(), 16);
    if !e.is_null() {
        return e;
    }
    let int32 = ndx_dtype_t::NDX_DTYPE_INT32 as i32;
    let shape = [4i64];
    let (data, shape) = (v.as_ptr().cast(), shape.as_ptr());
    ndx_tensor_from_host(
        data,
        int32,
        1,
        shape,
        std::ptr::null(),
        std::ptr::null(),
        output,
    )
}

/// A context in `mode` (process-events callbacks when `events`) with the host
/// operator "copy".
fn context_with_copy(mode: i32, events: bool) -> Ctx {
    let opts = ndx_context_options_t {
        eval_mode: mode,
        num_threads: 2,
        process_events_callbacks: events,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    let schema = common::schema(1, 1);
    let copy = c"copy".as_ptr();
    ok(ndx_register_op(
        ctx,
        copy,
        &schema,
        Some(host_copy),
        std::ptr::null_mut(),
        None,
    ));
    Ctx(ctx)
}

/// Rounds of: several threads enqueue chains in every eval mode (DEFERRED ones never
/// asked for, EAGER ones maybe still queued or running), built-in and host operators,
/// and register callbacks; then the main thread releases the context while those
/// threads wait on and poll their futures. Every other round runs callbacks and host
/// operators in process-events mode (inside the waits and the release). Every future
/// completes (no wait times out): READY with the right values, or cancelled by the
/// release; every callback fires once; each producer deleter runs once, after the
/// last reference.
#[test]
fn releasing_the_context_while_other_threads_wait_on_its_work() {
    const THREADS: usize = 3;
    const CHAIN: usize = 8;
    for round in 0..16usize {
        let events = round % 2 == 1;
        let ctx = context_with_copy(EAGER, events);
        let (a, ca) = import_i32(&[1, 2, 3, 4]);
        let (b, cb) = import_i32(&[10, 20, 30, 40]);
        let (ah, bh, ch) = (Handle(a), Handle(b), Handle(ctx.0));
        let callbacks = Arc::new(Callbacks::default());
        let enqueued = Arc::new(Barrier::new(THREADS + 1));
        let released = Arc::new(Barrier::new(THREADS + 1));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (callbacks, enqueued, released) =
                    (callbacks.clone(), enqueued.clone(), released.clone());
                thread::spawn(move || {
                    let (ch, ah, bh) = (ch, ah, bh);
                    let ctx = Ctx(ch.0);
                    // Chain k: a + b, then + b again CHAIN - 1 times, modes mixed.
                    let mut futures = Vec::new();
                    let mut input = ah.0;
                    let mut owned: Option<*mut ndx_tensor_t> = None;
                    // The number of adds up to each future.
                    let mut adds = Vec::new();
                    for k in 0..CHAIN {
                        let mode = MODES[(k + t + round / 2) % 4];
                        let copy = k % 3 == 2;
                        let (op, ins) = if copy {
                            (c"copy", vec![tensor_in(input)])
                        } else {
                            (c"add", vec![tensor_in(input), tensor_in(bh.0)])
                        };
                        let f = invoke_with(
                            &ctx,
                            op,
                            &ins,
                            std::ptr::null(),
                            &invoke_options(mode, &[]),
                        )
                        .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                        adds.push(adds.last().copied().unwrap_or(0) + i32::from(!copy));
                        if k % 3 == t % 3 {
                            on_ready(f, &callbacks);
                        }
                        let mut out = std::ptr::null_mut();
                        ok(ndx_future_tensor(f, 0, &mut out));
                        if let Some(o) = owned.replace(out) {
                            ndx_tensor_release(o);
                        }
                        input = out;
                        futures.push(f);
                    }
                    if let Some(o) = owned {
                        ndx_tensor_release(o);
                    }
                    std::mem::forget(ctx); // released by the main thread
                    enqueued.wait();
                    // Racing the release: waits on the even futures now, the rest after.
                    let settle = |k: usize, f: *mut ndx_future_t| {
                        let e = if k.is_multiple_of(2) {
                            ndx_future_wait(f, WAIT_NS)
                        } else {
                            let st = poll_until_done(f);
                            assert_ne!(st, PENDING, "round {round}: still pending");
                            ndx_future_error(f)
                        };
                        match take_error(e) {
                            None => {
                                let mut t = std::ptr::null_mut();
                                ok(ndx_future_tensor(f, 0, &mut t));
                                let n = adds[k];
                                assert_eq!(
                                    values_i32(t),
                                    [1 + 10 * n, 2 + 20 * n, 3 + 30 * n, 4 + 40 * n]
                                );
                                ndx_tensor_release(t);
                            }
                            // Cancelled by the release, or its input was.
                            Some((kind, msg)) => assert_eq!(
                                kind,
                                ndx_error_kind_t::NDX_ERROR_CANCELLED as i32,
                                "round {round}: {msg}"
                            ),
                        }
                    };
                    for (k, &f) in futures.iter().enumerate().filter(|(k, _)| k % 2 == 0) {
                        settle(k, f);
                    }
                    released.wait();
                    for (k, &f) in futures.iter().enumerate().filter(|(k, _)| k % 2 == 1) {
                        settle(k, f);
                    }
                    for f in futures {
                        ndx_future_release(f);
                    }
                })
            })
            .collect();
        enqueued.wait();
        drop(ctx);
        released.wait();
        for t in threads {
            t.join().expect("a thread failed");
        }
        let registered = callbacks.registered.load(Ordering::SeqCst);
        assert_eq!(callbacks.fired.load(Ordering::SeqCst), registered);
        assert_eq!(callbacks.freed.load(Ordering::SeqCst), registered);
        ndx_tensor_release(a);
        ndx_tensor_release(b);
        assert_eq!(
            (calls(&ca), calls(&cb)),
            (1, 1),
            "round {round}: deleter calls"
        );
    }
}

/// Threads raise check flags (COLLECT) on one context in every eval mode, each
/// invocation with its own explicit location: the group reported at the end holds
/// every flag once, in enqueue order (ascending sequence numbers, each thread's in
/// the order it enqueued them), each with the site it was enqueued at; a second
/// report has nothing left. Then all threads raise from one site, in one mode (a check
/// in a loop): one flag, counting every invocation, with the first one's sequence
/// number.
#[test]
fn check_flags_from_several_threads_come_in_enqueue_order_with_their_sites() {
    const THREADS: u32 = 4;
    const EACH: u32 = 30;
    const N: u64 = (THREADS * EACH) as u64;
    let ctx = Ctx::new(EAGER);
    ok(ndx_context_set_checks(
        ctx.0,
        ndx_check_policy_t::NDX_CHECKS_COLLECT as i32,
        0,
        0,
    ));
    let values: Vec<u8> = [1.0f32, f32::NAN, 3.0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let mut spec = Spec::f32s(&[], &[3]);
    spec.data = values;
    let (m, count) = spec.versioned();
    let mut x = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut x,
    ));
    let (xh, ch) = (Handle(x), Handle(ctx.0));
    // `same_site`: every invocation at loop.c:77 in check_in_a_loop.
    let raise_on_threads = |same_site: bool| {
        let start = Arc::new(Barrier::new(THREADS as usize));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let start = start.clone();
                thread::spawn(move || {
                    let (ch, xh) = (ch, xh);
                    let ctx = Ctx(ch.0);
                    let (file, function) = if same_site {
                        ("loop.c".to_string(), "check_in_a_loop".to_string())
                    } else {
                        (format!("thread{t}.c"), format!("check_on_thread_{t}"))
                    };
                    let (file, function) =
                        (CString::new(file).unwrap(), CString::new(function).unwrap());
                    start.wait();
                    for i in 0..EACH {
                        // A site is the same when reached the same way: one mode
                        // (the SYNC ones record the caller frame alone).
                        let mode = if same_site {
                            EAGER
                        } else {
                            MODES[((i + t) % 4) as usize]
                        };
                        let line = if same_site { 77 } else { 1000 * (t + 1) + i };
                        let o = located(mode, &file, &function, line);
                        let f = invoke_with(
                            &ctx,
                            c"check_finite",
                            &[tensor_in(xh.0)],
                            std::ptr::null(),
                            &o,
                        )
                        .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                        // A flag does not fail the invocation.
                        if mode != DEFERRED {
                            assert_ne!(ndx_future_poll(f), FAILED);
                        }
                        ndx_future_release(f);
                    }
                    std::mem::forget(ctx);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a thread failed");
        }
    };
    raise_on_threads(false);
    let e = ndx_context_evaluate(ctx.0);
    assert!(!e.is_null(), "the flags were not reported");
    assert_eq!(ndx_error_kind(e), ndx_error_kind_t::NDX_ERROR_CHECK as i32);
    let n = ndx_error_related_count(e);
    assert_eq!(n as u64, N, "{}", cstr(ndx_error_message(e)));
    let mut last_seq = 0u64;
    let mut last_line = [0u32; THREADS as usize];
    for i in 0..n {
        let r = ndx_error_related(e, i);
        assert_eq!(ndx_error_kind(r), ndx_error_kind_t::NDX_ERROR_CHECK as i32);
        assert_eq!(cstr(ndx_error_op(r)), "check_finite");
        let seq = ndx_error_sequence(r);
        assert!(seq > last_seq, "flag {i}: sequence {seq} after {last_seq}");
        last_seq = seq;
        let f = frame(r, 0);
        let t = f.line / 1000 - 1;
        assert!(t < THREADS, "flag {i}: line {}", f.line);
        assert_eq!(cstr(f.file), format!("thread{t}.c"));
        assert_eq!(cstr(f.function), format!("check_on_thread_{t}"));
        assert!(
            f.line > last_line[t as usize],
            "flag {i}: thread {t}'s flags out of order"
        );
        last_line[t as usize] = f.line;
    }
    assert_eq!(last_seq, N, "one sequence number per invocation");
    ndx_error_free(e);
    ok(ndx_context_evaluate(ctx.0));

    raise_on_threads(true);
    let e = ndx_context_evaluate(ctx.0);
    assert!(!e.is_null(), "the folded flag was not reported");
    assert_eq!(
        ndx_error_related_count(e),
        1,
        "{}",
        cstr(ndx_error_message(e))
    );
    let r = ndx_error_related(e, 0);
    let info = common::check_info(r);
    assert_eq!((info.occurrences, info.count, info.first_index), (N, N, 1));
    assert_eq!(
        ndx_error_sequence(r),
        N + 1,
        "the first invocation of the loop"
    );
    let f = frame(r, 0);
    assert_eq!((cstr(f.file), f.line), ("loop.c".to_string(), 77));
    ndx_error_free(e);
    ok(ndx_context_evaluate(ctx.0));
    drop(ctx);
    ndx_tensor_release(x);
    assert_eq!(calls(&count), 1);
}

/// What the callbacks of the release test share with the thread that registers.
#[derive(Default)]
struct Handshake {
    /// The first callback is running (inside `ndx_context_release`).
    running: std::sync::atomic::AtomicBool,
    /// The other thread has registered its callback.
    registered: std::sync::atomic::AtomicBool,
    late: Callbacks,
}

/// Waits (bounded) until `flag` is set.
fn wait_for(flag: &std::sync::atomic::AtomicBool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !flag.load(Ordering::SeqCst) {
        if std::time::Instant::now() >= end {
            return false;
        }
        thread::yield_now();
    }
    true
}

unsafe extern "C" fn first_callback(user: *mut c_void, _f: *const ndx_future_t) {
    // SAFETY: the test's `Handshake`, alive until the test ends.
    let h = unsafe { &*user.cast::<Handshake>() };
    h.running.store(true, Ordering::SeqCst);
    wait_for(&h.registered);
}

unsafe extern "C" fn late_fired(user: *mut c_void, _f: *const ndx_future_t) {
    // SAFETY: as above.
    let h = unsafe { &*user.cast::<Handshake>() };
    h.late.fired.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn late_freed(user: *mut c_void) {
    // SAFETY: as above.
    let h = unsafe { &*user.cast::<Handshake>() };
    h.late.freed.fetch_add(1, Ordering::SeqCst);
}

/// Process-events mode: the releasing thread runs the callbacks still queued; one of
/// them runs while another thread registers a callback on a completed future of the
/// same context. That callback still runs, exactly once (on the releasing thread or
/// at once on the registering one), and is not dropped uncalled with the queue.
#[test]
fn a_callback_registered_while_the_release_runs_the_queued_ones_still_runs() {
    let opts = ndx_context_options_t {
        eval_mode: SYNC_CPU,
        process_events_callbacks: true,
        ..Default::default()
    };
    let mut raw = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut raw));
    let ctx = Ctx(raw);
    let (a, ca) = import_i32(&[1, 2, 3, 4]);
    let add = |ctx: &Ctx| {
        invoke_with(
            ctx,
            c"add",
            &[tensor_in(a), tensor_in(a)],
            std::ptr::null(),
            &invoke_options(0, &[]),
        )
        .unwrap_or_else(|e| panic!("{:?}", take_error(e)))
    };
    let (f1, f2) = (add(&ctx), add(&ctx));
    let h = Arc::new(Handshake::default());
    let user = Arc::as_ptr(&h).cast_mut().cast::<c_void>();
    // Complete, so queued for process-events: run by the release.
    ok(ndx_future_on_ready(f1, Some(first_callback), user, None));
    let f2h = Handle(f2);
    let h2 = h.clone();
    let other = thread::spawn(move || {
        let f2h = f2h;
        assert!(wait_for(&h2.running), "the queued callback never ran");
        let user = Arc::as_ptr(&h2).cast_mut().cast::<c_void>();
        ok(ndx_future_on_ready(
            f2h.0,
            Some(late_fired),
            user,
            Some(late_freed),
        ));
        h2.registered.store(true, Ordering::SeqCst);
    });
    drop(ctx); // runs `first_callback`, which waits for the registration
    other.join().expect("the registering thread");
    assert_eq!(
        h.late.fired.load(Ordering::SeqCst),
        1,
        "the late callback's calls"
    );
    assert_eq!(
        h.late.freed.load(Ordering::SeqCst),
        1,
        "the late callback's user_free"
    );
    ndx_future_release(f1);
    ndx_future_release(f2);
    ndx_tensor_release(a);
    assert_eq!(calls(&ca), 1);
}

/// Invokes the failing `add` (fault injection) on `t` in `mode`: the future, and the
/// line of the call.
#[inline(never)]
fn failing_add_here(
    ctx: *mut ndx_context_t,
    t: *const ndx_tensor_t,
    mode: i32,
) -> (*mut ndx_future_t, u32) {
    let ins = [tensor_in(t), tensor_in(t)];
    let opts = invoke_options(mode, &[]);
    let mut f = std::ptr::null_mut();
    let line = line!() + 1;
    ok(ndx_invoke(
        ctx,
        c"add".as_ptr(),
        ins.as_ptr(),
        2,
        std::ptr::null(),
        &opts,
        &mut f,
    ));
    (f, line)
}

/// The same from another function, so the two sites differ.
#[inline(never)]
fn failing_add_there(
    ctx: *mut ndx_context_t,
    t: *const ndx_tensor_t,
    mode: i32,
) -> (*mut ndx_future_t, u32) {
    let ins = [tensor_in(t), tensor_in(t)];
    let opts = invoke_options(mode, &[]);
    let mut f = std::ptr::null_mut();
    let line = line!() + 1;
    ok(ndx_invoke(
        ctx,
        c"add".as_ptr(),
        ins.as_ptr(),
        2,
        std::ptr::null(),
        &opts,
        &mut f,
    ));
    (f, line)
}

/// Native capture (no explicit location): failures enqueued on four threads from two
/// functions in every mode, observed on a fifth, each name its own invoking line and
/// function in frame 0.
#[test]
fn native_call_sites_survive_the_trip_to_another_thread() {
    let opts = ndx_context_options_t {
        eval_mode: EAGER,
        capture_policy: ndx_capture_policy_t::NDX_CAPTURE_NATIVE as i32,
        backend: c"inject_runtime_error:add".as_ptr(),
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    let ctx = Ctx(ctx);
    let (t, count) = import_i32(&[1, 2, 3, 4]);
    let (ch, th) = (Handle(ctx.0), Handle(t));
    let (tx, rx) = mpsc::channel::<(Handle<ndx_future_t>, &'static str, u32)>();
    let threads: Vec<_> = (0..4usize)
        .map(|k| {
            let tx = tx.clone();
            thread::spawn(move || {
                let (ch, th) = (ch, th);
                for i in 0..40 {
                    let mode = MODES[(i + k) % 4];
                    let (f, line, name) = if k % 2 == 0 {
                        let (f, line) = failing_add_here(ch.0, th.0, mode);
                        (f, line, "failing_add_here")
                    } else {
                        let (f, line) = failing_add_there(ch.0, th.0, mode);
                        (f, line, "failing_add_there")
                    };
                    tx.send((Handle(f), name, line)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let observer = thread::spawn(move || {
        let mut n = 0;
        for (f, name, line) in rx {
            let e = ndx_future_wait(f.0, WAIT_NS);
            assert!(!e.is_null(), "the injected failure");
            assert_eq!(cstr(ndx_error_op(e)), "add");
            assert_ne!(
                ndx_error_kind(e),
                ndx_error_kind_t::NDX_ERROR_TIMEOUT as i32
            );
            let fr = frame(e, 0);
            assert!(
                cstr(fr.function).ends_with(name),
                "{} for {name}",
                cstr(fr.function)
            );
            assert!(
                cstr(fr.file).ends_with("tests/threads_api.rs"),
                "{}",
                cstr(fr.file)
            );
            assert_eq!(fr.line, line, "{name}");
            ndx_error_free(e);
            ndx_future_release(f.0);
            n += 1;
        }
        n
    });
    for t in threads {
        t.join().expect("an invoking thread");
    }
    assert_eq!(observer.join().expect("the observer"), 160);
    ok(ndx_context_evaluate(ctx.0));
    drop(ctx);
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
}

/// Two threads enqueue chains (a division, by zero every third time, then a sum of
/// it) in DEFERRED, EAGER and SYNC_CPU mode; a third cancels every other future from
/// them, a fourth waits on each, while a fifth calls `ndx_context_evaluate` over and
/// over. Every wait ends (READY, the division's VALUE error, or CANCELLED), nothing
/// is INTERNAL, no failure is reported by two evaluations, and the producer deleters
/// run once.
#[test]
fn cancels_waits_and_evaluations_race_on_one_context() {
    for round in 0..10usize {
        let ctx = Ctx::new(EAGER);
        let (a, ca) = import_i32(&[7, -7, 9, 10]);
        let (z, cz) = import_i32(&[2, 0, 3, 5]);
        let (b, cb) = import_i32(&[2, 2, 3, 5]);
        let (ah, zh, bh, ch) = (Handle(a), Handle(z), Handle(b), Handle(ctx.0));
        let (to_cancel, cancels) = mpsc::channel::<Handle<ndx_future_t>>();
        let (to_wait, waits) = mpsc::channel::<Handle<ndx_future_t>>();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producers: Vec<_> = (0..2usize)
            .map(|p| {
                let to_cancel = to_cancel.clone();
                thread::spawn(move || {
                    let (ah, zh, bh, ch) = (ah, zh, bh, ch);
                    let ctx = Ctx(ch.0);
                    for i in 0..60usize {
                        let rhs = if i % 3 == 0 { zh.0 } else { bh.0 };
                        let o1 = invoke_options(MODES[[2, 3, 0][(i + p + round) % 3]], &[]);
                        let o2 = invoke_options(MODES[[3, 2, 0][(i + p) % 3]], &[]);
                        let ins = [tensor_in(ah.0), tensor_in(rhs)];
                        let f1 = invoke_with(&ctx, c"div", &ins, std::ptr::null(), &o1)
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                        let mut t = std::ptr::null_mut();
                        ok(ndx_future_tensor(f1, 0, &mut t));
                        let f2 = invoke_with(&ctx, c"sum", &[tensor_in(t)], std::ptr::null(), &o2)
                            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                        ndx_tensor_release(t);
                        to_cancel.send(Handle(f1)).unwrap();
                        to_cancel.send(Handle(f2)).unwrap();
                    }
                    std::mem::forget(ctx);
                })
            })
            .collect();
        drop(to_cancel);
        let canceller = thread::spawn(move || {
            for (k, f) in cancels.into_iter().enumerate() {
                if k % 2 == 1 {
                    let mut cancelled = false;
                    ok(ndx_future_cancel(f.0, &mut cancelled));
                }
                to_wait.send(f).unwrap();
            }
        });
        let waiter = thread::spawn(move || {
            for f in waits {
                if let Some((kind, msg)) = take_error(ndx_future_wait(f.0, WAIT_NS)) {
                    assert!(
                        kind == ndx_error_kind_t::NDX_ERROR_VALUE as i32
                            || kind == ndx_error_kind_t::NDX_ERROR_CANCELLED as i32,
                        "round {round}: kind {kind}: {msg}"
                    );
                }
                ndx_future_release(f.0);
            }
        });
        let stop = done.clone();
        let evaluator = thread::spawn(move || {
            let ch = ch;
            let mut reported = Vec::new();
            loop {
                let last = stop.load(Ordering::SeqCst);
                let e = ndx_context_evaluate(ch.0);
                if !e.is_null() {
                    assert_ne!(
                        ndx_error_kind(e),
                        ndx_error_kind_t::NDX_ERROR_INTERNAL as i32
                    );
                    for i in 0..ndx_error_related_count(e) {
                        reported.push(ndx_error_sequence(ndx_error_related(e, i)));
                    }
                    ndx_error_free(e);
                }
                if last {
                    return reported;
                }
            }
        });
        for p in producers {
            p.join().expect("a producer");
        }
        canceller.join().expect("the canceller");
        waiter.join().expect("the waiter");
        done.store(true, Ordering::SeqCst);
        let mut reported = evaluator.join().expect("the evaluator");
        let n = reported.len();
        reported.sort_unstable();
        reported.dedup();
        assert_eq!(reported.len(), n, "round {round}: a failure reported twice");
        ok(ndx_context_evaluate(ctx.0));
        drop(ctx);
        for (t, c) in [(a, &ca), (z, &cz), (b, &cb)] {
            ndx_tensor_release(t);
            assert_eq!(
                calls(c),
                1,
                "round {round}: the producer's deleter runs once"
            );
        }
    }
}

/// One step of a chain that callbacks drive on the workers (see
/// `chains_driven_by_callbacks_race_tiny_waits_and_the_context_release`).
struct Chain {
    /// A context reference of the chain's own, released by its last callback.
    ctx: Handle<ndx_context_t>,
    one: Handle<ndx_tensor_t>,
    zero: Handle<ndx_tensor_t>,
    /// The future this step's callback is registered on: a reference the chain owns,
    /// released inside that callback.
    own: Handle<ndx_future_t>,
    /// The step of `own` (its explicit line is `base + step`) and the value it makes.
    step: u32,
    value: i32,
    base: u32,
    /// Futures (a reference each) handed to the waiters, with the line they fail at
    /// (0: they succeed with the value given).
    waiters: mpsc::Sender<(Handle<ndx_future_t>, i32, u32)>,
    /// The line the last step failed at, as its error says, once the chain ends.
    done: mpsc::Sender<u32>,
}

const CHAIN_STEPS: u32 = 12;

fn chain_file() -> CString {
    CString::new("chain.c").unwrap()
}

/// Registers the step's callback on `chain.own`.
fn chain_on(chain: Chain) {
    let f = chain.own.0;
    let user = Box::into_raw(Box::new(std::sync::Mutex::new(Some(chain))));
    ok(ndx_future_on_ready(
        f,
        Some(chain_step),
        user.cast(),
        Some(chain_free),
    ));
}

unsafe extern "C" fn chain_free(user: *mut c_void) {
    // SAFETY: the box made by `chain_on`, freed once here.
    drop(unsafe { Box::from_raw(user.cast::<std::sync::Mutex<Option<Chain>>>()) });
}

/// A step completed: checks it, releases its future, invokes the next step (an add,
/// the last a division by zero) and registers itself there; the last step releases
/// the chain's context reference, often the context's last one, on a worker.
unsafe extern "C" fn chain_step(user: *mut c_void, f: *const ndx_future_t) {
    // SAFETY: the live box made by `chain_on`.
    let cell = unsafe { &*user.cast::<std::sync::Mutex<Option<Chain>>>() };
    let Some(mut chain) = cell.lock().unwrap().take() else {
        panic!("a callback ran twice");
    };
    assert_eq!(f, chain.own.0.cast_const(), "the callback's own future");
    let e = ndx_future_error(f);
    ndx_future_release(chain.own.0);
    if chain.step == CHAIN_STEPS {
        assert!(!e.is_null(), "the division by zero succeeded");
        let line = if ndx_error_kind(e) == ndx_error_kind_t::NDX_ERROR_CANCELLED as i32 {
            0
        } else {
            site_line(e)
        };
        ndx_error_free(e);
        ndx_context_release(chain.ctx.0);
        chain.done.send(line).unwrap();
        return;
    }
    if !e.is_null() {
        // Cancelled by the context's release: the chain ends here.
        assert_eq!(
            ndx_error_kind(e),
            ndx_error_kind_t::NDX_ERROR_CANCELLED as i32,
            "{:?}",
            take_error(e)
        );
        ndx_context_release(chain.ctx.0);
        chain.done.send(0).unwrap();
        return;
    }
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut t));
    assert_eq!(values_i32(t), [chain.value], "step {}", chain.step);
    let (file, function) = (chain_file(), CString::new("chain_step").unwrap());
    let step = chain.step + 1;
    let line = chain.base + step;
    let last = step == CHAIN_STEPS;
    let (op, second) = if last {
        (c"div", chain.zero.0)
    } else {
        (c"add", chain.one.0)
    };
    let ctx = Ctx(chain.ctx.0);
    let next = invoke_with(
        &ctx,
        op,
        &[tensor_in(t), tensor_in(second)],
        std::ptr::null(),
        &located(EAGER, &file, &function, line),
    );
    std::mem::forget(ctx);
    ndx_tensor_release(t);
    let next = match next {
        Ok(next) => next,
        Err(e) => panic!("{:?}", take_error(e)),
    };
    ok(ndx_future_retain(next));
    let value = chain.value + 1;
    // The waiters may be gone once the main thread has what it needs.
    let _ = chain
        .waiters
        .send((Handle(next), value, if last { line } else { 0 }));
    chain.own = Handle(next);
    chain.step = step;
    chain.value = value;
    chain_on(chain);
}

/// Several threads start chains on one EAGER context whose steps are invoked by the
/// previous step's callback on a worker, which also releases its own future there;
/// other threads wait on every step with tiny timeouts (racing its completion) and
/// check its outcome; the last step fails at its own explicit line; the main thread
/// releases its context reference at once, so the context's last release happens in
/// a chain's callback, on a worker, with other chains' work in flight. Every step
/// completes once with the right value (or CANCELLED), every failure names its own
/// line, every deleter runs once.
#[test]
fn chains_driven_by_callbacks_race_tiny_waits_and_the_context_release() {
    const CHAINS: u32 = 6;
    for round in 0..12u32 {
        let ctx = Ctx::new(EAGER);
        let (one, c1) = import_i32(&[1]);
        let (zero, c0) = import_i32(&[0]);
        let (wtx, wrx) = mpsc::channel::<(Handle<ndx_future_t>, i32, u32)>();
        let wrx = Arc::new(std::sync::Mutex::new(wrx));
        let (dtx, drx) = mpsc::channel();
        let waiters: Vec<_> = (0..3)
            .map(|k| {
                let wrx = wrx.clone();
                thread::spawn(move || {
                    let tiny = [0i64, 1, 1_000, 50_000][k % 4];
                    loop {
                        let Ok((f, value, fail_line)) = wrx.lock().unwrap().recv() else {
                            break;
                        };
                        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
                        let e = loop {
                            let e = ndx_future_wait(f.0, tiny);
                            if e.is_null()
                                || ndx_error_kind(e) != ndx_error_kind_t::NDX_ERROR_TIMEOUT as i32
                            {
                                break e;
                            }
                            ndx_error_free(e);
                            assert!(std::time::Instant::now() < end, "a step never completed");
                        };
                        if e.is_null() {
                            assert_eq!(fail_line, 0, "the division by zero succeeded");
                            let mut t = std::ptr::null_mut();
                            ok(ndx_future_tensor(f.0, 0, &mut t));
                            assert_eq!(values_i32(t), [value]);
                            ndx_tensor_release(t);
                        } else if ndx_error_kind(e) != ndx_error_kind_t::NDX_ERROR_CANCELLED as i32
                        {
                            assert_ne!(fail_line, 0, "{:?}", take_error(e));
                            assert_eq!(site_line(e), fail_line, "the failure's own line");
                            ndx_error_free(e);
                        } else {
                            ndx_error_free(e);
                        }
                        ndx_future_release(f.0);
                    }
                })
            })
            .collect();
        let starters: Vec<_> = (0..CHAINS)
            .map(|c| {
                let (ch, oh, zh) = (Handle(ctx.0), Handle(one), Handle(zero));
                let (wtx, dtx) = (wtx.clone(), dtx.clone());
                thread::spawn(move || {
                    ok(ndx_context_retain(ch.0));
                    let ctx = Ctx(ch.0);
                    let base = 1000 * (c + 1);
                    let (file, function) = (chain_file(), CString::new("start").unwrap());
                    let f = invoke_with(
                        &ctx,
                        c"add",
                        &[tensor_in(oh.0), tensor_in(oh.0)],
                        std::ptr::null(),
                        &located(EAGER, &file, &function, base),
                    )
                    .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
                    std::mem::forget(ctx); // the chain's reference
                    chain_on(Chain {
                        ctx: ch,
                        one: oh,
                        zero: zh,
                        own: Handle(f),
                        step: 0,
                        value: 2,
                        base,
                        waiters: wtx,
                        done: dtx,
                    });
                })
            })
            .collect();
        drop((wtx, dtx));
        for s in starters {
            s.join().expect("a starter failed");
        }
        if round % 2 == 0 {
            drop(ctx); // the chains hold the last references
        }
        let mut lines: Vec<u32> = (0..CHAINS)
            .map(|_| {
                drx.recv_timeout(std::time::Duration::from_secs(20))
                    .expect("a chain never ended")
            })
            .collect();
        lines.sort_unstable();
        if round % 2 == 1 {
            // No release raced the chains: each failed at its own last line.
            let want: Vec<u32> = (0..CHAINS).map(|c| 1000 * (c + 1) + CHAIN_STEPS).collect();
            assert_eq!(lines, want, "round {round}");
        }
        for w in waiters {
            w.join().expect("a waiter failed");
        }
        ndx_tensor_release(one);
        ndx_tensor_release(zero);
        assert_eq!(
            (calls(&c1), calls(&c0)),
            (1, 1),
            "round {round}: deleter calls"
        );
    }
}
