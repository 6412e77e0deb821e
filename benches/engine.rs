//! Engine overheads through the real C entry points, from one run (ratios only mean
//! something within a run: these machines are shared).
//!
//! `cargo bench --bench engine` — prints ns per operation for: deferred enqueue per
//! capture policy, eager enqueue→ready round trip, poll, and native capture against
//! `backtrace::Backtrace::new()` and `std::backtrace::Backtrace::force_capture()`.

use std::ffi::c_void;
use std::hint::black_box;
use std::time::Instant;

use ndx::ffi::*;

fn check(e: *mut ndx_error_t) {
    assert!(e.is_null(), "ndx call failed");
}

/// Median of `rounds` timings of `iters` runs of `f`, in ns per run.
fn time(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[rounds / 2]
}

fn context(mode: ndx_eval_mode_t, policy: ndx_capture_policy_t, depth: u32) -> *mut ndx_context_t {
    let opts = ndx_context_options_t {
        eval_mode: mode as i32,
        capture_policy: policy as i32,
        capture_depth: depth,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    check(ndx_context_new(&opts, &mut ctx));
    ctx
}

unsafe extern "C" fn provider(_: *mut c_void, out: *mut ndx_host_frame_t, cap: usize) -> usize {
    let frames = [
        (c"inner", c"script.py", 7u32),
        (c"outer", c"script.py", 3u32),
    ];
    let n = frames.len().min(cap);
    for (i, (f, file, line)) in frames.iter().take(n).enumerate() {
        // SAFETY: `cap` writable frames.
        unsafe {
            *out.add(i) = ndx_host_frame_t {
                function: f.as_ptr(),
                file: file.as_ptr(),
                line: *line,
            }
        };
    }
    n
}

#[inline(never)]
fn nested<R>(depth: usize, f: &mut impl FnMut() -> R) -> R {
    if depth == 0 {
        f()
    } else {
        black_box(nested(depth - 1, f))
    }
}

fn main() {
    let v = [1.0f32; 16];
    let shape = [16i64];
    let mut t = std::ptr::null_mut();
    check(ndx_tensor_from_host(
        v.as_ptr().cast(),
        ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
        1,
        shape.as_ptr(),
        std::ptr::null(),
        std::ptr::null(),
        &mut t,
    ));
    let ins = [
        ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        },
        ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        },
    ];
    let op = c"add".as_ptr();

    println!("ndx engine overheads (ns per operation, median of rounds; 16-element f32 add)");
    let mut deferred = Vec::new();
    for (name, policy, depth, with_provider) in [
        (
            "capture OFF (caller frame only)",
            ndx_capture_policy_t::NDX_CAPTURE_OFF,
            0,
            false,
        ),
        (
            "capture HOST (provider, 2 frames)",
            ndx_capture_policy_t::NDX_CAPTURE_HOST,
            0,
            true,
        ),
        (
            "capture NATIVE, 16 frames",
            ndx_capture_policy_t::NDX_CAPTURE_NATIVE,
            16,
            false,
        ),
    ] {
        let ctx = context(ndx_eval_mode_t::NDX_EVAL_DEFERRED, policy, depth);
        if with_provider {
            check(ndx_context_set_frame_provider(
                ctx,
                Some(provider),
                std::ptr::null_mut(),
                None,
            ));
        }
        let ns = time(21, 2000, || {
            let mut f = std::ptr::null_mut();
            nested(20, &mut || {
                check(ndx_invoke(
                    ctx,
                    op,
                    ins.as_ptr(),
                    2,
                    std::ptr::null(),
                    std::ptr::null(),
                    &mut f,
                ))
            });
            ndx_future_release(f);
        });
        // Drop the recorded work without running it (not timed).
        ndx_context_release(ctx);
        println!("  deferred enqueue, {name:<36} {ns:>9.0}");
        deferred.push(ns);
    }

    let sync = context(
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_capture_policy_t::NDX_CAPTURE_OFF,
        0,
    );
    let sync_ns = time(21, 2000, || {
        let mut f = std::ptr::null_mut();
        check(ndx_invoke(
            sync,
            op,
            ins.as_ptr(),
            2,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ));
        ndx_future_release(f);
    });
    ndx_context_release(sync);
    println!("  sync_cpu invoke (runs the 16-element add inline)  {sync_ns:>9.0}");

    let ctx = context(
        ndx_eval_mode_t::NDX_EVAL_EAGER,
        ndx_capture_policy_t::NDX_CAPTURE_OFF,
        0,
    );
    let eager = time(21, 500, || {
        let mut f = std::ptr::null_mut();
        check(ndx_invoke(
            ctx,
            op,
            ins.as_ptr(),
            2,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ));
        check(ndx_future_wait(f, -1));
        ndx_future_release(f);
    });
    println!("  eager enqueue -> ready (invoke + wait), capture OFF {eager:>9.0}");
    let mut f = std::ptr::null_mut();
    check(ndx_invoke(
        ctx,
        op,
        ins.as_ptr(),
        2,
        std::ptr::null(),
        std::ptr::null(),
        &mut f,
    ));
    check(ndx_future_wait(f, -1));
    let poll = time(21, 100_000, || {
        black_box(ndx_future_poll(black_box(f)));
    });
    println!("  poll (completed future)                           {poll:>9.1}");
    ndx_future_release(f);
    ndx_context_release(ctx);

    let ndx_capture = time(21, 200, || {
        black_box(nested(20, &mut || ndx::error::Site::capture_native(16)));
    });
    let bt = time(5, 20, || {
        black_box(nested(20, &mut || backtrace::Backtrace::new_unresolved()));
    });
    let bt_resolved = time(5, 3, || {
        black_box(nested(20, &mut || backtrace::Backtrace::new()));
    });
    let std_bt = time(5, 3, || {
        let _ = black_box(nested(20, &mut std::backtrace::Backtrace::force_capture));
    });
    println!("native capture, 16 frames, 20 frames deep (ns):");
    println!("  ndx Site::capture_native(16), lazy       {ndx_capture:>12.0}");
    println!(
        "  backtrace::Backtrace::new_unresolved()   {bt:>12.0}  ({:.1}x ndx)",
        bt / ndx_capture
    );
    println!(
        "  backtrace::Backtrace::new()              {bt_resolved:>12.0}  ({:.0}x ndx)",
        bt_resolved / ndx_capture
    );
    println!(
        "  std::backtrace::Backtrace::force_capture {std_bt:>12.0}  ({:.0}x ndx)",
        std_bt / ndx_capture
    );
    println!(
        "targets: deferred enqueue with caller frame <= 1000 ns (got {:.0}), eager round trip <= 10000 ns (got {eager:.0}), poll <= 50 ns (got {poll:.1})",
        deferred[0]
    );
    ndx_tensor_release(t);
}
