//! `fork()` after ndx ran, through the C API: in the child, new contexts work in every
//! eval mode with kernels split across the pool (ndx makes the child a pool of its
//! own); a context made before the fork refuses every call (NDX_ERROR_VALUE naming the
//! argument) and its release waits for nothing; a DEFERRED future that had not run
//! reads as failed (NDX_ERROR_RUNTIME saying why) and its pending output is refused as
//! an input. The parent goes on as before.
//!
//! Alone in its test binary: the child of a multi-threaded test harness could find a
//! harness lock held, so the child only calls ndx and reports through a pipe. A child
//! that hangs is killed after a minute and the test fails.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

const N: usize = 1 << 20; // large enough to be split across the pool

fn mode(m: ndx_eval_mode_t) -> i32 {
    m as i32
}

/// `op(x, x)` on `ctx`, waited for, as values; or the error.
fn run(ctx: &Ctx, op: &std::ffi::CStr, x: &T) -> Result<Vec<f32>, (i32, String)> {
    let f = invoke_with(
        ctx,
        op,
        &[x.input(), x.input()],
        std::ptr::null(),
        &invoke_options(0, &[]),
    )
    .map_err(|e| take_error(e).unwrap())?;
    let e = ndx_future_wait(f, -1);
    if let Some(err) = take_error(e) {
        ndx_future_release(f);
        return Err(err);
    }
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut t));
    ndx_future_release(f);
    let t = T(t);
    Ok(values_f32(t.0))
}

/// What the child found wrong, one line each (empty: nothing).
fn child(parent: &Ctx, pending: *mut ndx_future_t, x: &T, a: &[f32]) -> Vec<String> {
    let mut wrong = Vec::new();
    let sums: Vec<f32> = a.iter().map(|v| v + v).collect();
    for m in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_SYNC_FULL,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
    ] {
        let ctx = Ctx::new(mode(m));
        match run(&ctx, c"add", x) {
            Ok(v) if v == sums => {}
            Ok(_) => wrong.push(format!("{m:?}: wrong values")),
            Err(e) => wrong.push(format!("{m:?}: {e:?}")),
        }
    }
    let stale = "argument 'ctx': the context was created before this process forked";
    let lost = "('mul') had not completed when the process forked; it never completes";
    let status = ndx_future_poll(pending);
    if status != ndx_future_status_t::NDX_FUTURE_FAILED as i32 {
        wrong.push(format!("poll: {status}, not FAILED"));
    }
    let mut out = std::ptr::null_mut();
    let errors = [
        (
            "invoke",
            run(parent, c"add", x).err(),
            NDX_ERROR_VALUE,
            stale,
        ),
        (
            "evaluate",
            take_error(ndx_context_evaluate(parent.0)),
            NDX_ERROR_VALUE,
            stale,
        ),
        (
            "wait",
            take_error(ndx_future_wait(pending, -1)),
            NDX_ERROR_RUNTIME,
            lost,
        ),
        (
            "tensor",
            take_error(ndx_future_tensor(pending, 0, &mut out)),
            NDX_ERROR_RUNTIME,
            lost,
        ),
    ];
    for (what, got, kind, frag) in errors {
        match got {
            Some((k, msg)) if k == kind as i32 && msg.contains(frag) => {}
            other => wrong.push(format!(
                "{what}: {other:?}, expected {kind:?} with {frag:?}"
            )),
        }
    }
    wrong
}

#[test]
fn a_forked_child_gets_a_pool_and_refuses_what_it_inherited() {
    let a: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 * 0.5).collect();
    let x = T::copy(&a, ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32, &[N as i64]);
    let parent = Ctx::new(mode(ndx_eval_mode_t::NDX_EVAL_EAGER));
    assert!(
        run(&parent, c"add", &x).is_ok(),
        "the pool ran work before the fork"
    );
    let deferred = invoke_options(mode(ndx_eval_mode_t::NDX_EVAL_DEFERRED), &[]);
    let pending = invoke_with(
        &parent,
        c"mul",
        &[x.input(), x.input()],
        std::ptr::null(),
        &deferred,
    )
    .expect("deferred mul");

    let mut fds = [0; 2];
    // SAFETY: a valid two-int array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child calls only ndx and write/_exit, never returning into the
    // harness; the parent closes the ends it does not use.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            child(&parent, pending, &x, &a).join("\n")
        }))
        .unwrap_or_else(|_| "the child panicked".into());
        let code = i32::from(!report.is_empty());
        // SAFETY: writing our own bytes to our pipe, then leaving without running the
        // harness's exit code.
        unsafe {
            libc::write(fds[1], report.as_ptr().cast(), report.len());
            libc::_exit(code);
        }
    }
    // SAFETY: our pipe's write end, unused here.
    unsafe { libc::close(fds[1]) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: our child's pid and a valid status out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child hung (killed after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut report = vec![0u8; 1 << 16];
    // SAFETY: reading into our buffer from our pipe, then closing it.
    let n = unsafe {
        let n = libc::read(fds[0], report.as_mut_ptr().cast(), report.len());
        libc::close(fds[0]);
        n
    };
    let report = String::from_utf8_lossy(&report[..n.max(0) as usize]).into_owned();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child found:\n{report}"
    );

    // The parent goes on: its deferred work runs as if nothing happened.
    ok(ndx_future_wait(pending, -1));
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(pending, 0, &mut t));
    let t = T(t);
    let squares: Vec<f32> = a.iter().map(|v| v * v).collect();
    assert_eq!(values_f32(t.0), squares);
    ndx_future_release(pending);
}
