//! The engine's C entry points called from Rust: the caller frame read from the entry
//! point's frame record, explicit locations, host frame providers and policy order.

mod common;

use std::ffi::{CStr, c_char, c_void};

use common::{cstr, frame, ok};
use ndx::ffi::*;

fn frames(e: *const ndx_error_t) -> Vec<(String, String, u32, ndx_frame_origin_t)> {
    (0..ndx_error_frame_count(e))
        .map(|i| {
            let f = frame(e, i);
            let s = |p: *const c_char| if p.is_null() { String::new() } else { cstr(p) };
            (s(f.function), s(f.file), f.line, f.origin)
        })
        .collect()
}

fn context(policy: ndx_capture_policy_t) -> *mut ndx_context_t {
    let opts = ndx_context_options_t {
        eval_mode: ndx_eval_mode_t::NDX_EVAL_EAGER as i32,
        capture_policy: policy as i32,
        backend: c"inject_runtime_error:add".as_ptr(),
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    ctx
}

fn scalar() -> *mut ndx_tensor_t {
    let v = [1.0f32];
    common::host_tensor(&v, ndx_dtype_t::NDX_DTYPE_FLOAT32, &[])
}

/// Invokes the failing `add` and returns its error.
fn failing_add(
    ctx: *mut ndx_context_t,
    opts: *const ndx_invoke_options_t,
) -> (*mut ndx_error_t, u32) {
    let t = scalar();
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
    let mut f = std::ptr::null_mut();
    let line = line!() + 1;
    ok(ndx_invoke(
        ctx,
        c"add".as_ptr(),
        ins.as_ptr(),
        2,
        std::ptr::null(),
        opts,
        &mut f,
    ));
    let e = ndx_future_wait(f, -1);
    assert!(!e.is_null());
    ndx_future_release(f);
    ndx_tensor_release(t);
    (e, line)
}

#[test]
fn the_caller_frame_alone_names_the_invoking_line() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let (e, line) = failing_add(ctx, std::ptr::null());
    let fr = frames(e);
    assert_eq!(fr.len(), 1, "{fr:?}");
    assert!(fr[0].0.ends_with("failing_add"), "{fr:?}");
    assert!(fr[0].1.ends_with("tests/engine_ffi.rs"), "{fr:?}");
    assert_eq!(
        (fr[0].2, fr[0].3),
        (line, ndx_frame_origin_t::NDX_FRAME_NATIVE)
    );
    assert_eq!(cstr(ndx_error_op(e)), "add");
    ndx_error_free(e);
    ndx_context_release(ctx);
}

#[test]
fn an_explicit_location_replaces_the_native_caller_frame() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_NATIVE);
    let opts = ndx_invoke_options_t {
        location: ndx_location_t {
            file: c"app.py".as_ptr(),
            line: 41,
            function: c"main".as_ptr(),
        },
        ..Default::default()
    };
    let (e, _) = failing_add(ctx, &opts);
    let fr = frames(e);
    assert_eq!(
        fr[0],
        (
            "main".into(),
            "app.py".into(),
            41,
            ndx_frame_origin_t::NDX_FRAME_HOST
        )
    );
    assert!(
        fr[1]
            .0
            .ends_with("an_explicit_location_replaces_the_native_caller_frame"),
        "{fr:?}"
    );
    ndx_error_free(e);
    ndx_context_release(ctx);
}

unsafe extern "C" fn provider(user: *mut c_void, out: *mut ndx_host_frame_t, cap: usize) -> usize {
    let calls = user.cast::<usize>();
    // SAFETY: the test's counter and `cap` writable frames.
    unsafe {
        *calls += 1;
        let frames = [
            (c"inner", c"script.py", 7u32),
            (c"outer", c"script.py", 3u32),
        ];
        let n = frames.len().min(cap);
        for (i, (f, file, line)) in frames.iter().take(n).enumerate() {
            *out.add(i) = ndx_host_frame_t {
                function: f.as_ptr(),
                file: file.as_ptr(),
                line: *line,
            };
        }
        n
    }
}

/// A context of `policy` (see `context`) whose frame provider is `provider`, counting
/// its calls in `calls`.
fn provided_context(policy: ndx_capture_policy_t, calls: &mut usize) -> *mut ndx_context_t {
    let ctx = context(policy);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(provider),
        (calls as *mut usize).cast(),
        None,
    ));
    ctx
}

/// `provider`'s innermost frame, as `frames` lists it.
fn inner_frame() -> (String, String, u32, ndx_frame_origin_t) {
    (
        "inner".into(),
        "script.py".into(),
        7,
        ndx_frame_origin_t::NDX_FRAME_HOST,
    )
}

#[test]
fn host_frames_come_from_the_provider_in_policy_order() {
    let mut calls = 0usize;
    for policy in [
        ndx_capture_policy_t::NDX_CAPTURE_HOST,
        ndx_capture_policy_t::NDX_CAPTURE_ALL,
    ] {
        let ctx = provided_context(policy, &mut calls);
        let (e, _) = failing_add(ctx, std::ptr::null());
        let fr = frames(e);
        assert_eq!(fr[0], inner_frame());
        assert_eq!(
            fr[1],
            (
                "outer".into(),
                "script.py".into(),
                3,
                ndx_frame_origin_t::NDX_FRAME_HOST
            )
        );
        match policy {
            ndx_capture_policy_t::NDX_CAPTURE_HOST => assert_eq!(fr.len(), 2, "{fr:?}"),
            _ => {
                assert!(fr.len() > 2 && fr[2].0.ends_with("failing_add"), "{fr:?}");
                assert_eq!(fr[2].3, ndx_frame_origin_t::NDX_FRAME_NATIVE);
            }
        }
        ndx_error_free(e);
        ndx_context_release(ctx);
    }
    assert_eq!(calls, 2, "called once per invocation");
}

/// Invocations refused while ndx_invoke reads its inputs, arguments or options (before
/// the operator runs any inference) name the caller as the policy says, like every
/// other call-time error: under HOST, the provider's frames, not ndx's native ones.
#[test]
fn unreadable_invocations_carry_the_providers_frames() {
    let mut calls = 0usize;
    for policy in [
        ndx_capture_policy_t::NDX_CAPTURE_HOST,
        ndx_capture_policy_t::NDX_CAPTURE_ALL,
    ] {
        let ctx = provided_context(policy, &mut calls);
        let t = scalar();
        let null_input = [
            ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            },
            ndx_input_t {
                tensor: std::ptr::null_mut(),
                batch: std::ptr::null(),
            },
        ];
        let bad_mode = ndx_invoke_options_t {
            mode: 99,
            ..Default::default()
        };
        let refusals: [(*const ndx_input_t, *const ndx_invoke_options_t, &str); 2] = [
            (null_input.as_ptr(), std::ptr::null(), "inputs[1]"),
            (null_input.as_ptr(), &bad_mode, "opts->mode"),
        ];
        for (k, (ins, opts, fragment)) in refusals.into_iter().enumerate() {
            let n = if k == 0 { 2 } else { 1 };
            let mut f = std::ptr::null_mut();
            let e = ndx_invoke(ctx, c"add".as_ptr(), ins, n, std::ptr::null(), opts, &mut f);
            assert!(f.is_null());
            assert!(
                cstr(ndx_error_message(e)).contains(fragment),
                "{}",
                cstr(ndx_error_message(e))
            );
            let fr = frames(e);
            assert_eq!(fr[0], inner_frame(), "{policy:?}: {fragment}");
            match policy {
                ndx_capture_policy_t::NDX_CAPTURE_HOST => assert_eq!(fr.len(), 2, "{fr:?}"),
                _ => assert!(
                    fr[2..].iter().any(|f| f
                        .0
                        .ends_with("unreadable_invocations_carry_the_providers_frames")),
                    "{fr:?}"
                ),
            }
            ndx_error_free(e);
        }
        ndx_tensor_release(t);
        ndx_context_release(ctx);
    }
    assert_eq!(calls, 4, "called once per refused invocation");
}

/// A repro document refused by `ndx_repro_run` (malformed, or naming an operator the
/// context lacks) names the host caller under HOST capture, as ndx_invoke's refusals do.
#[test]
fn refused_repro_documents_carry_the_providers_frames() {
    let mut calls = 0usize;
    let ctx = provided_context(ndx_capture_policy_t::NDX_CAPTURE_HOST, &mut calls);
    let unknown_op = c"{\"ndx_repro\": 1, \"op\": \"my_host_op\", \"args\": [], \"mode\": \"sync_cpu\", \"inputs\": []}";
    for (doc, fragment) in [
        (c"not json", "not valid JSON"),
        (
            unknown_op,
            "operator 'my_host_op' is unknown on this context",
        ),
    ] {
        let mut f = std::ptr::null_mut();
        let e = ndx_repro_run(ctx, doc.as_ptr(), &mut f);
        assert!(f.is_null());
        assert!(
            cstr(ndx_error_message(e)).contains(fragment),
            "{}",
            cstr(ndx_error_message(e))
        );
        let fr = frames(e);
        assert_eq!(fr.len(), 2, "{fr:?}");
        assert_eq!(fr[0], inner_frame());
        ndx_error_free(e);
    }
    assert_eq!(calls, 2);
    ndx_context_release(ctx);
}

static LAST_CAPACITY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn capacity_probe(_: *mut c_void, _: *mut ndx_host_frame_t, cap: usize) -> usize {
    LAST_CAPACITY.store(cap, std::sync::atomic::Ordering::SeqCst);
    0
}

#[test]
fn the_provider_is_asked_for_the_current_depth() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_HOST);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(capacity_probe),
        std::ptr::null_mut(),
        None,
    ));
    for depth in [16u32, 4, 40] {
        if depth != 16 {
            ok(ndx_context_set_capture_policy(
                ctx,
                ndx_capture_policy_t::NDX_CAPTURE_HOST as i32,
                depth,
            ));
        }
        let (e, _) = failing_add(ctx, std::ptr::null());
        ndx_error_free(e);
        assert_eq!(
            LAST_CAPACITY.load(std::sync::atomic::Ordering::SeqCst),
            depth as usize
        );
    }
    ndx_context_release(ctx);
}

/// Writes one frame and returns `(size_t)-1`, as a provider reporting an error might.
unsafe extern "C" fn overcounting(_: *mut c_void, out: *mut ndx_host_frame_t, cap: usize) -> usize {
    if cap > 0 {
        // SAFETY: `cap` writable frames.
        unsafe {
            *out = ndx_host_frame_t {
                function: c"py_fn".as_ptr(),
                file: c"x.py".as_ptr(),
                line: 3,
            }
        };
    }
    usize::MAX
}

/// A provider returning more frames than it was given room for broke its contract: the
/// invocation records no host frames (not `capacity` blank ones).
#[test]
fn a_provider_returning_more_than_its_capacity_gives_no_host_frames() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_ALL);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(overcounting),
        std::ptr::null_mut(),
        None,
    ));
    let (e, _) = failing_add(ctx, std::ptr::null());
    let fr = frames(e);
    assert!(
        fr.iter()
            .all(|f| f.3 == ndx_frame_origin_t::NDX_FRAME_NATIVE),
        "{fr:?}"
    );
    assert!(fr[0].0.ends_with("failing_add"), "{fr:?}");
    ndx_error_free(e);
    ndx_context_release(ctx);
}

static REENTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A `user_free` that calls back into the context it was registered on (its `user`).
unsafe extern "C" fn user_free_reenters(user: *mut c_void) {
    let e = ndx_context_set_capture_policy(
        user.cast_const().cast(),
        ndx_capture_policy_t::NDX_CAPTURE_ALL as i32,
        0,
    );
    if e.is_null() {
        REENTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    ndx_error_free(e);
}

/// Replacing a frame provider runs the old one's `user_free` after the context's
/// settings are unlocked: one that calls into the same context completes (it
/// deadlocked on the settings lock).
#[test]
fn a_replaced_providers_user_free_may_call_into_its_context() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_HOST);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(capacity_probe),
        ctx.cast(),
        Some(user_free_reenters),
    ));
    let shared = ctx as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ctx = shared as *const ndx_context_t;
        let e = ndx_context_set_frame_provider(ctx, None, std::ptr::null_mut(), None);
        tx.send(e.is_null()).unwrap();
        ndx_error_free(e);
    });
    let removed = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("removing the provider returns: its user_free called into the context");
    assert!(removed);
    assert_eq!(REENTERED.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The re-entrant call took effect: ALL records the native frames outwards of the
    // caller, where HOST without a provider records the caller frame alone.
    let (e, _) = failing_add(ctx, std::ptr::null());
    assert!(ndx_error_frame_count(e) > 1, "{}", ndx_error_frame_count(e));
    ndx_error_free(e);
    ndx_context_release(ctx);
}

static DEPTH_PROBE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn depth_probe(_: *mut c_void, f: *mut ndx_host_frame_t, cap: usize) -> usize {
    DEPTH_PROBE.store(cap, std::sync::atomic::Ordering::SeqCst);
    if cap > 0 {
        // SAFETY: ndx gives `cap` writable frames.
        unsafe {
            *f = ndx_host_frame_t {
                function: c"py_fn".as_ptr(),
                file: c"x.py".as_ptr(),
                line: 3,
            };
        }
        1
    } else {
        0
    }
}

/// A capture depth above NDX_MAX_CAPTURE_DEPTH is refused (it once made ndx allocate
/// the depth up front and abort the process); the maximum itself works in every policy.
#[test]
fn capture_depth_is_bounded_by_ndx_max_capture_depth() {
    use ndx_capture_policy_t::*;
    let ctx = context(NDX_CAPTURE_HOST);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(depth_probe),
        std::ptr::null_mut(),
        None,
    ));
    for depth in [u32::MAX, NDX_MAX_CAPTURE_DEPTH + 1] {
        common::expect_err(
            ndx_context_set_capture_policy(ctx, NDX_CAPTURE_HOST as i32, depth),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            &format!("argument 'depth' is {depth}, expected at most 1024 (NDX_MAX_CAPTURE_DEPTH)"),
        );
    }
    // The refused calls changed nothing: the default depth.
    let (e, _) = failing_add(ctx, std::ptr::null());
    ndx_error_free(e);
    assert_eq!(DEPTH_PROBE.load(std::sync::atomic::Ordering::SeqCst), 16);
    for policy in [NDX_CAPTURE_HOST, NDX_CAPTURE_NATIVE, NDX_CAPTURE_ALL] {
        ok(ndx_context_set_capture_policy(
            ctx,
            policy as i32,
            NDX_MAX_CAPTURE_DEPTH,
        ));
        let (e, _) = failing_add(ctx, std::ptr::null());
        assert!(ndx_error_frame_count(e) >= 1, "{policy:?}");
        ndx_error_free(e);
    }
    assert_eq!(
        DEPTH_PROBE.load(std::sync::atomic::Ordering::SeqCst),
        NDX_MAX_CAPTURE_DEPTH as usize
    );
    ndx_context_release(ctx);

    let opts = ndx_context_options_t {
        capture_depth: u32::MAX,
        ..Default::default()
    };
    let mut ctx = 0x5a5a_usize as *mut ndx_context_t;
    common::expect_err(
        ndx_context_new(&opts, &mut ctx),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "opts->capture_depth is 4294967295, expected at most 1024 (NDX_MAX_CAPTURE_DEPTH)",
    );
    assert!(ctx.is_null());
}

/// Enums from C are validated, never trusted: an eval mode or a capture policy outside
/// its enum is NDX_ERROR_VALUE naming the argument, the value and the range, in the
/// setters (which then change nothing) and in the context options (no context is
/// made). A NULL future polls FAILED and its error names it; a NULL string value is
/// refused.
#[test]
fn unknown_modes_and_policies_are_refused_and_change_nothing() {
    let value = ndx_error_kind_t::NDX_ERROR_VALUE;
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    for bad in [0, 5, -1] {
        common::expect_err(
            ndx_context_set_eval_mode(ctx.0, bad),
            value,
            &format!("argument 'mode' is {bad}, not an ndx_eval_mode_t value (expected 1 to 4)"),
        );
        common::expect_err(
            ndx_context_set_capture_policy(ctx.0, bad, 0),
            value,
            &format!(
                "argument 'policy' is {bad}, not an ndx_capture_policy_t value (expected 1 to 4)"
            ),
        );
    }
    // Still SYNC_CPU: the invocation has completed when ndx_invoke returns.
    let t = common::T::copy(&[1f32], ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32, &[1]);
    let f = common::invoke_with(
        &ctx,
        c"neg",
        &[t.input()],
        std::ptr::null(),
        &common::invoke_options(0, &[]),
    )
    .unwrap();
    assert_eq!(
        ndx_future_poll(f),
        ndx_future_status_t::NDX_FUTURE_READY as i32
    );
    ndx_future_release(f);

    for (opts, says) in [
        (
            ndx_context_options_t {
                eval_mode: 9,
                ..Default::default()
            },
            "opts->eval_mode is 9, not an ndx_eval_mode_t value (expected 1 to 4)",
        ),
        (
            ndx_context_options_t {
                capture_policy: -2,
                ..Default::default()
            },
            "opts->capture_policy is -2, not an ndx_capture_policy_t value (expected 1 to 4)",
        ),
    ] {
        let mut made = 0x5a5a_usize as *mut ndx_context_t;
        common::expect_err(ndx_context_new(&opts, &mut made), value, says);
        assert!(made.is_null(), "no context");
    }

    assert_eq!(
        ndx_future_poll(std::ptr::null()),
        ndx_future_status_t::NDX_FUTURE_FAILED as i32
    );
    common::expect_err(
        ndx_future_error(std::ptr::null()),
        value,
        "argument 'future' is NULL",
    );
    let args = common::Args::new();
    common::expect_err(
        ndx_args_set_string(args.0, c"s".as_ptr(), std::ptr::null()),
        value,
        "argument 'value' is NULL",
    );
}

static USER_FREES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn count_user_free(_: *mut c_void) {
    USER_FREES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

unsafe extern "C" fn noop_kernel(
    _: *mut c_void,
    _: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    _: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    std::ptr::null_mut()
}

unsafe extern "C" fn noop_callback(_: *mut c_void, _: *const ndx_future_t) {}

/// `ndx_register_op` of `schema` as `name`, with a kernel that does nothing.
fn register_noop(
    ctx: *const ndx_context_t,
    name: &CStr,
    schema: &ndx_op_schema_t,
) -> *mut ndx_error_t {
    ndx_register_op(
        ctx,
        name.as_ptr(),
        schema,
        Some(noop_kernel),
        std::ptr::null_mut(),
        None,
    )
}

/// A one-input, one-output schema with `n_args` arguments.
fn one_in_one_out(
    n_args: usize,
    arg_names: *const *const c_char,
    arg_types: *const i32,
) -> ndx_op_schema_t {
    ndx_op_schema_t {
        n_args,
        arg_names,
        arg_types,
        ..common::schema(1, 1)
    }
}

/// Functions taking `user`/`user_free` own `user` in every case: `user_free` runs
/// exactly once, also when the call fails (before it returns).
#[test]
fn user_free_runs_once_when_the_registering_call_fails() {
    use std::sync::atomic::Ordering::SeqCst;
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let schema = one_in_one_out(0, std::ptr::null(), std::ptr::null());
    let user = 0x1234usize as *mut c_void;
    type Call<'a> = &'a dyn Fn() -> *mut ndx_error_t;
    let cases: [(&str, Call, &str); 4] = [
        (
            "on_ready(NULL future)",
            &|| {
                ndx_future_on_ready(
                    std::ptr::null(),
                    Some(noop_callback),
                    user,
                    Some(count_user_free),
                )
            },
            "argument 'future' is NULL",
        ),
        (
            "set_frame_provider(NULL ctx)",
            &|| {
                ndx_context_set_frame_provider(
                    std::ptr::null(),
                    Some(capacity_probe),
                    user,
                    Some(count_user_free),
                )
            },
            "argument 'ctx' is NULL",
        ),
        (
            "register_op(built-in name)",
            &|| {
                ndx_register_op(
                    ctx,
                    c"add".as_ptr(),
                    &schema,
                    Some(noop_kernel),
                    user,
                    Some(count_user_free),
                )
            },
            "is a built-in",
        ),
        (
            "register_op(NULL schema)",
            &|| {
                ndx_register_op(
                    ctx,
                    c"mine".as_ptr(),
                    std::ptr::null(),
                    Some(noop_kernel),
                    user,
                    Some(count_user_free),
                )
            },
            "argument 'schema' is NULL",
        ),
    ];
    for (name, call, fragment) in cases {
        USER_FREES.store(0, SeqCst);
        common::expect_err(call(), ndx_error_kind_t::NDX_ERROR_VALUE, fragment);
        assert_eq!(USER_FREES.load(SeqCst), 1, "{name}");
    }
    ndx_context_release(ctx);
    assert_eq!(USER_FREES.load(SeqCst), 1, "nothing more at release");
}

/// A too-small struct_size says what to set (sizeof, this header's) and the least
/// accepted; schema array errors name the schema's fields.
#[test]
fn struct_size_and_schema_errors_name_the_right_thing() {
    use std::mem::{offset_of, size_of};
    let expect = |what: &str, ty: &str, full: usize| {
        format!("{what}->struct_size is 0: set it to sizeof({ty}), which is {full} (at least ")
    };
    let io = ndx_import_options_t {
        struct_size: 0,
        layout: std::ptr::null(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let (v, mut t) = ([1.0f32], std::ptr::null_mut());
    common::expect_err(
        ndx_tensor_from_host(
            v.as_ptr().cast(),
            ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
            0,
            std::ptr::null(),
            std::ptr::null(),
            &io,
            &mut t,
        ),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        &format!(
            "{}{}, the fields of the oldest layout",
            expect(
                "opts",
                "ndx_import_options_t",
                size_of::<ndx_import_options_t>()
            ),
            offset_of!(ndx_import_options_t, stream)
        ),
    );
    let co = ndx_context_options_t {
        struct_size: 0,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    common::expect_err(
        ndx_context_new(&co, &mut ctx),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        &expect(
            "opts",
            "ndx_context_options_t",
            size_of::<ndx_context_options_t>(),
        ),
    );
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let io = ndx_invoke_options_t {
        struct_size: 0,
        ..Default::default()
    };
    let t = scalar();
    let ins = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let mut f = std::ptr::null_mut();
    common::expect_err(
        ndx_invoke(
            ctx,
            c"neg".as_ptr(),
            ins.as_ptr(),
            1,
            std::ptr::null(),
            &io,
            &mut f,
        ),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        &expect(
            "opts",
            "ndx_invoke_options_t",
            size_of::<ndx_invoke_options_t>(),
        ),
    );
    let mut schema = ndx_op_schema_t {
        struct_size: 0,
        ..one_in_one_out(2, std::ptr::null(), std::ptr::null())
    };
    let register = |s: &ndx_op_schema_t| register_noop(ctx, c"mine", s);
    common::expect_err(
        register(&schema),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        &expect("schema", "ndx_op_schema_t", size_of::<ndx_op_schema_t>()),
    );
    schema.struct_size = size_of::<ndx_op_schema_t>();
    common::expect_err(
        register(&schema),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "schema->arg_names is NULL but schema->n_args is 2",
    );
    let names = [c"a".as_ptr(), c"b".as_ptr()];
    schema.arg_names = names.as_ptr();
    common::expect_err(
        register(&schema),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "schema->arg_types is NULL but schema->n_args is 2",
    );
    ndx_tensor_release(t);
    ndx_context_release(ctx);
}

/// A schema whose argument names repeat is invalid: both indices are named.
/// A caller built against the header before the check fields passes that struct's
/// `sizeof`: on 64-bit targets it ends in padding bytes where `check_policy` is now,
/// which the caller never set. Whatever they hold, the context gets the default
/// checks (OFF), neither a refusal of the garbage nor a policy read from it.
#[test]
fn the_older_structs_padding_is_not_read_as_check_policy() {
    use std::mem::{align_of, offset_of};
    let old_end = offset_of!(ndx_context_options_t, check_policy);
    let old_size = old_end.next_multiple_of(align_of::<usize>());
    for garbage in [
        -1,
        0x0101_0101,
        ndx_check_policy_t::NDX_CHECKS_FAIL_FAST as i32,
    ] {
        let opts = ndx_context_options_t {
            struct_size: old_size,
            eval_mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
            check_policy: garbage,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        ok(ndx_context_new(&opts, &mut ctx));
        // A false predicate: OFF raises nothing and the check passes.
        let v = [0u8];
        let t = common::host_tensor(&v, ndx_dtype_t::NDX_DTYPE_BOOL, &[]);
        let f = invoke_one(
            ctx,
            c"check",
            ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            },
        );
        ok(ndx_future_error(f));
        assert!(ndx_context_take_check_errors(ctx).is_null(), "{garbage}");
        ok(ndx_context_evaluate(ctx));
        ndx_future_release(f);
        ndx_tensor_release(t);
        ndx_context_release(ctx);
    }
    // The full struct's check_policy is read and checked.
    let opts = ndx_context_options_t {
        check_policy: -1,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    common::expect_err(
        ndx_context_new(&opts, &mut ctx),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "opts->check_policy is -1, not an ndx_check_policy_t value",
    );
    assert!(ctx.is_null());
}

/// A worker count past any machine (a `-1` from C, say) is refused naming the field,
/// instead of starting tens of thousands of threads, for minutes, before returning.
#[test]
fn an_absurd_num_threads_is_refused() {
    // The pool exists already: this test cannot start it with the absurd count.
    let first = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    for n in [u32::MAX, 4097] {
        let opts = ndx_context_options_t {
            num_threads: n,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        common::expect_err(
            ndx_context_new(&opts, &mut ctx),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            &format!("opts->num_threads is {n}, expected at most 4096 (0: the default)"),
        );
        assert!(ctx.is_null());
    }
    let opts = ndx_context_options_t {
        num_threads: 4096,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    ndx_context_release(ctx);
    ndx_context_release(first);
}

/// `check_shape` refuses a pattern entry below -1 at `ndx_invoke`, naming the
/// argument, the entry's index and its value.
#[test]
fn a_bad_check_shape_pattern_entry_is_named_with_its_index() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let t = i32_tensor(&[1, 2, 3]);
    let ins = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    let pattern = [3i64, -1, -7];
    ok(ndx_args_set_int_array(
        args,
        c"pattern".as_ptr(),
        pattern.as_ptr(),
        pattern.len(),
    ));
    let mut f = std::ptr::null_mut();
    common::expect_err(
        ndx_invoke(
            ctx,
            c"check_shape".as_ptr(),
            ins.as_ptr(),
            1,
            args,
            std::ptr::null(),
            &mut f,
        ),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "operator 'check_shape': argument 'pattern' entry 2: pattern entries are sizes or -1 \
         (any), got -7",
    );
    assert!(f.is_null());
    ndx_args_free(args);
    ndx_tensor_release(t);
    ndx_context_release(ctx);
}

/// Sequence numbers are per context: a flag raised on data another context flagged
/// names no `consequence_of` (it would name an unrelated invocation of its own
/// context, here the flag itself), while one from the same context still does.
/// `ndx_invoke` of `op` on one input, without arguments or options: the future.
fn invoke_one(ctx: *const ndx_context_t, op: &CStr, input: ndx_input_t) -> *mut ndx_future_t {
    let mut f = std::ptr::null_mut();
    ok(ndx_invoke(
        ctx,
        op.as_ptr(),
        &input,
        1,
        std::ptr::null(),
        std::ptr::null(),
        &mut f,
    ));
    f
}

/// The group of the one flag `ctx` collected (to free), that flag, and its numbers.
fn the_one_flag(
    ctx: *mut ndx_context_t,
) -> (*mut ndx_error_t, *const ndx_error_t, ndx_check_info_t) {
    let g = ndx_context_take_check_errors(ctx);
    assert!(!g.is_null());
    assert_eq!(ndx_error_related_count(g), 1);
    let r = ndx_error_related(g, 0);
    (g, r, common::check_info(r))
}

#[test]
fn consequence_of_names_only_invocations_of_the_flags_context() {
    let new_ctx = || {
        let opts = ndx_context_options_t {
            eval_mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
            check_policy: ndx_check_policy_t::NDX_CHECKS_COLLECT as i32,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        ok(ndx_context_new(&opts, &mut ctx));
        ctx
    };
    let check_finite = |ctx, t| {
        let f = invoke_one(
            ctx,
            c"check_finite",
            ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            },
        );
        let mut out = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 0, &mut out));
        ndx_future_release(f);
        out
    };
    // (sequence, consequence_of) of the one flag a context collected.
    let flag = |ctx| {
        let (g, r, info) = the_one_flag(ctx);
        let seq = ndx_error_sequence(r);
        ndx_error_free(g);
        (seq, info.consequence_of)
    };
    let (a, b) = (new_ctx(), new_ctx());
    let v = [1.0f32, f32::INFINITY];
    let x = common::host_tensor(&v, ndx_dtype_t::NDX_DTYPE_FLOAT32, &[2i64]);
    let y = check_finite(a, x); // a's #1 flags
    let z = check_finite(b, y); // b's #1 flags the same data
    assert_eq!(flag(a), (1, 0));
    assert_eq!(flag(b), (1, 0), "not 'a consequence of #1', itself");
    let w = check_finite(b, z); // b's #2: downstream of b's #1
    assert_eq!(flag(b), (2, 1));
    for t in [x, y, z, w] {
        ndx_tensor_release(t);
    }
    ndx_context_release(a);
    ndx_context_release(b);
}

/// One batch invocation failing a check in two samples is one flag (one occurrence)
/// whose count sums both; its message, the first sample's, says so too instead of
/// reporting that sample's count alone.
#[test]
fn a_flag_folded_over_samples_says_its_total() {
    let opts = ndx_context_options_t {
        eval_mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
        check_policy: ndx_check_policy_t::NDX_CHECKS_COLLECT as i32,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    let (b, _counts) = common::f32_batch(&[
        (&[f32::NAN, 1.0], &[2]),
        (&[3.0], &[1]),
        (&[f32::INFINITY, f32::INFINITY, 2.0], &[3]),
    ]);
    let f = invoke_one(
        ctx,
        c"check_finite",
        ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        },
    );
    let (g, r, info) = the_one_flag(ctx);
    assert_eq!((info.count, info.occurrences, info.sample), (3, 1, 0));
    assert_eq!(
        common::cstr(ndx_error_message(r)),
        "USER check failed: 1 of 2 elements not finite in sample 0 (first at flat index 0); \
         raised 2 times by this invocation (per sample or output): 3 failing elements in all"
    );
    ndx_error_free(g);
    ndx_future_release(f);
    ndx_batch_release(b);
    ndx_context_release(ctx);
}

#[test]
fn a_schema_with_a_repeated_argument_name_is_refused() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let names = [c"a".as_ptr(), c"b".as_ptr(), c"a".as_ptr()];
    let types = [ndx_arg_type_t::NDX_ARG_INT as i32; 3];
    let mut schema = one_in_one_out(3, names.as_ptr(), types.as_ptr());
    let register = |s: &ndx_op_schema_t| register_noop(ctx, c"dup", s);
    common::expect_err(
        register(&schema),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "schema->arg_names[0] and schema->arg_names[2] are both \"a\": argument names must be \
         distinct",
    );
    // Distinct names register (the failed call did not take the name).
    schema.n_args = 2;
    ok(register(&schema));
    ndx_context_release(ctx);
}

/// "Errors of invocations that failed while running carry one [repro document]": an
/// injected runtime failure too.
#[test]
fn an_injected_runtime_error_carries_a_repro_document() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let (e, _) = failing_add(ctx, std::ptr::null());
    let n = ndx_error_repro(e, std::ptr::null_mut(), 0);
    assert!(n > 0, "no repro document");
    let mut buf = vec![0u8; n + 1];
    assert_eq!(ndx_error_repro(e, buf.as_mut_ptr().cast(), n + 1), n);
    let doc = String::from_utf8_lossy(&buf[..n]).into_owned();
    for fragment in [
        "\"op\": \"add\"",
        "inject_runtime_error:add",
        "injected runtime error in operator 'add'",
    ] {
        assert!(doc.contains(fragment), "{doc} lacks {fragment}");
    }
    ndx_error_free(e);
    ndx_context_release(ctx);
}

/// Array lengths whose byte size passes `isize::MAX` (no array is that long) and
/// misaligned arrays are refused with NDX_ERROR_VALUE: they reached
/// `std::slice::from_raw_parts`, whose precondition check aborted the process.
#[test]
fn array_lengths_past_the_address_space_and_misaligned_arrays_are_refused() {
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    let ints = [3i64, -1, 0];
    let floats = [0.5f64, 1.5];
    let err = |e: *mut ndx_error_t, fragment: &str| {
        let (kind, msg) = common::take_error(e).expect("an error");
        assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        assert!(msg.contains(fragment), "{msg:?} lacks {fragment:?}");
    };
    for n in [usize::MAX, usize::MAX / 8 + 1, 1 << 60] {
        err(
            ndx_args_set_int_array(args, c"axes".as_ptr(), ints.as_ptr(), n),
            &format!("argument 'values': n is {n}, and {n} entries of 8 bytes exceed"),
        );
        err(
            ndx_args_set_float_array(args, c"mean".as_ptr(), floats.as_ptr(), n),
            "exceed the address space",
        );
    }
    // One byte into the array: not aligned for int64 or double.
    let odd = ints.as_ptr().cast::<u8>().wrapping_add(1);
    err(
        ndx_args_set_int_array(args, c"axes".as_ptr(), odd.cast(), 1),
        "is not aligned to 8 bytes",
    );
    err(
        ndx_args_set_float_array(args, c"mean".as_ptr(), odd.cast(), 1),
        "is not aligned to 8 bytes",
    );
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(std::ptr::null(), &mut ctx));
    let inputs = [ndx_input_t {
        tensor: std::ptr::null(),
        batch: std::ptr::null(),
    }];
    let mut f = std::ptr::null_mut();
    err(
        ndx_invoke(
            ctx,
            c"sum".as_ptr(),
            inputs.as_ptr(),
            usize::MAX,
            args,
            std::ptr::null(),
            &mut f,
        ),
        "argument 'inputs': n_inputs is 18446744073709551615, and",
    );
    assert!(f.is_null());
    let outputs = [ndx_output_t {
        tensor: std::ptr::null(),
        batch: std::ptr::null(),
    }];
    let opts = ndx_invoke_options_t {
        outputs: outputs.as_ptr(),
        n_outputs: usize::MAX / 2,
        ..Default::default()
    };
    let scalar = scalar();
    let one = [ndx_input_t {
        tensor: scalar,
        batch: std::ptr::null(),
    }];
    err(
        ndx_invoke(
            ctx,
            c"sum".as_ptr(),
            one.as_ptr(),
            1,
            std::ptr::null(),
            &opts,
            &mut f,
        ),
        "opts->outputs: opts->n_outputs is",
    );
    ndx_tensor_release(scalar);
    ndx_context_release(ctx);
    ndx_args_free(args);
}

/// The same for the tensor and batch entry points: a `cap` of SIZE_MAX ("enough")
/// copies the tensor; batch imports of SIZE_MAX samples and misaligned shape arrays
/// are NDX_ERROR_VALUE. Each reached `std::slice::from_raw_parts` and aborted.
#[test]
fn copy_caps_batch_counts_and_shape_arrays_past_the_limits() {
    let t = scalar();
    let mut v = [0f32; 2];
    ok(ndx_tensor_copy_to(t, v.as_mut_ptr().cast(), usize::MAX));
    assert_eq!(v, [1.0, 0.0]);
    ndx_tensor_release(t);
    let err = |e: *mut ndx_error_t, fragment: &str| {
        let (kind, msg) = common::take_error(e).expect("an error");
        assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        assert!(msg.contains(fragment), "{msg:?} lacks {fragment:?}");
    };
    let none = [std::ptr::null_mut(); 2];
    let legacy = [std::ptr::null_mut(); 2];
    let mut b = std::ptr::null_mut();
    for n in [usize::MAX, usize::MAX / 8 + 1] {
        err(
            ndx_batch_from_dlpack_versioned(none.as_ptr(), n, std::ptr::null(), &mut b),
            &format!("argument 'n' is {n}: {n} pointers exceed the address space"),
        );
        err(
            ndx_batch_from_dlpack(legacy.as_ptr(), n, std::ptr::null(), &mut b),
            "pointers exceed the address space",
        );
    }
    let words = [2i64, 1, 0];
    let odd = words.as_ptr().cast::<u8>().wrapping_add(4).cast::<i64>();
    let data = [0f32; 4];
    let mut t = std::ptr::null_mut();
    err(
        ndx_tensor_from_host(
            data.as_ptr().cast(),
            ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
            1,
            odd,
            std::ptr::null(),
            std::ptr::null(),
            &mut t,
        ),
        "argument 'shape' (",
    );
    err(
        ndx_tensor_from_host(
            data.as_ptr().cast(),
            ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
            1,
            words.as_ptr(),
            odd,
            std::ptr::null(),
            &mut t,
        ),
        "argument 'strides' (",
    );
    assert!(t.is_null());
}

#[test]
fn args_round_trip_through_the_builder_and_getters() {
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    let floats = [0.5f64, 1.5];
    let ints = [3i64, -1];
    ok(ndx_args_set_float_array(
        args,
        c"mean".as_ptr(),
        floats.as_ptr(),
        2,
    ));
    ok(ndx_args_set_int_array(
        args,
        c"axes".as_ptr(),
        ints.as_ptr(),
        2,
    ));
    ok(ndx_args_set_string(
        args,
        c"mode".as_ptr(),
        c"linear".as_ptr(),
    ));
    ok(ndx_args_set_int(args, c"n".as_ptr(), 7));
    ok(ndx_args_set_int(args, c"n".as_ptr(), 8)); // replaces
    let (mut fp, mut n) = (std::ptr::null(), 0usize);
    ok(ndx_args_get_float_array(
        args,
        c"mean".as_ptr(),
        &mut fp,
        &mut n,
    ));
    // SAFETY: borrowed from the live builder.
    assert_eq!(unsafe { std::slice::from_raw_parts(fp, n) }, floats);
    let mut ip = std::ptr::null();
    ok(ndx_args_get_int_array(
        args,
        c"axes".as_ptr(),
        &mut ip,
        &mut n,
    ));
    // SAFETY: as above.
    assert_eq!(unsafe { std::slice::from_raw_parts(ip, n) }, ints);
    let mut s = std::ptr::null();
    ok(ndx_args_get_string(args, c"mode".as_ptr(), &mut s));
    assert_eq!(cstr(s), "linear");
    let mut v = 0i64;
    ok(ndx_args_get_int(args, c"n".as_ptr(), &mut v));
    assert_eq!(v, 8);
    common::expect_err(
        ndx_args_get_float_array(args, c"axes".as_ptr(), &mut fp, &mut n),
        ndx_error_kind_t::NDX_ERROR_TYPE,
        "argument 'axes' is an int array, not a float array",
    );
    // A non-NULL out-param is reset even when the other one is NULL.
    let mut stale_i = 0x5a5a_usize as *const i64;
    common::expect_err(
        ndx_args_get_int_array(args, c"axes".as_ptr(), &mut stale_i, std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'n' is NULL",
    );
    assert!(stale_i.is_null(), "int array: values reset");
    let mut stale_f = 0x5a5a_usize as *const f64;
    common::expect_err(
        ndx_args_get_float_array(args, c"mean".as_ptr(), &mut stale_f, std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'n' is NULL",
    );
    assert!(stale_f.is_null(), "float array: values reset");
    n = 99;
    common::expect_err(
        ndx_args_get_int_array(args, c"axes".as_ptr(), std::ptr::null_mut(), &mut n),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'values' is NULL",
    );
    assert_eq!(n, 0, "n reset");
    common::expect_err(
        ndx_args_get_int(args, c"missing".as_ptr(), &mut v),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "no argument 'missing' was given",
    );
    ndx_args_free(args);
}

/// Each `ndx_input_t` holds exactly one of a tensor and a batch: an entry with
/// neither or both is NDX_ERROR_VALUE naming its index, no future is made, and the
/// caller keeps both handles.
#[test]
fn an_input_entry_with_neither_or_both_handles_is_refused() {
    let ctx = common::Ctx::new(0);
    let t = common::T::copy(&[1f32, 2.], ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32, &[2]);
    let (b, counts) = common::f32_batch(&[(&[3., 4.], &[2])]);
    let entry =
        |tensor: *const ndx_tensor_t, batch: *const ndx_batch_t| ndx_input_t { tensor, batch };
    for (second, says) in [
        (
            entry(std::ptr::null(), std::ptr::null()),
            "inputs[1] has neither a tensor nor a batch",
        ),
        (
            entry(t.0, b),
            "inputs[1] has both a tensor and a batch; set exactly one",
        ),
    ] {
        let inputs = [t.input(), second];
        let mut f = 0x5a5a_usize as *mut ndx_future_t;
        common::expect_err(
            ndx_invoke(
                ctx.0,
                c"add".as_ptr(),
                inputs.as_ptr(),
                2,
                std::ptr::null(),
                std::ptr::null(),
                &mut f,
            ),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            says,
        );
        assert!(f.is_null(), "no future");
    }
    // Both handles are still the caller's: they work, and release once.
    let f = common::invoke_with(
        &ctx,
        c"add",
        &[t.input(), entry(std::ptr::null(), b)],
        std::ptr::null(),
        &common::invoke_options(0, &[]),
    )
    .unwrap();
    ok(ndx_future_wait(f, -1));
    ndx_future_release(f);
    ndx_batch_release(b);
    drop(ctx);
    assert_eq!(common::calls(&counts[0]), 1);
}

/// The getters of every argument type, as a host operator's kernel reads its
/// arguments: each returns what was set (a float getter converts an int), and one of
/// another type is NDX_ERROR_TYPE naming the argument and both types, with the
/// out-param cleared.
#[test]
fn args_getters_of_each_type_read_their_own_and_refuse_the_others() {
    let args = common::Args::new().int(c"n", -3).string(c"s", c"text");
    ok(ndx_args_set_bool(args.0, c"flag".as_ptr(), true));
    ok(ndx_args_set_float(args.0, c"x".as_ptr(), 0.25));
    ok(ndx_args_set_dtype(
        args.0,
        c"dt".as_ptr(),
        ndx_dtype_t::NDX_DTYPE_BFLOAT16 as i32,
    ));
    let mut b = false;
    ok(ndx_args_get_bool(args.0, c"flag".as_ptr(), &mut b));
    assert!(b);
    let mut d = 0i32;
    ok(ndx_args_get_dtype(args.0, c"dt".as_ptr(), &mut d));
    assert_eq!(d, ndx_dtype_t::NDX_DTYPE_BFLOAT16 as i32);
    let mut x = 0f64;
    ok(ndx_args_get_float(args.0, c"x".as_ptr(), &mut x));
    assert_eq!(x, 0.25);
    ok(ndx_args_get_float(args.0, c"n".as_ptr(), &mut x));
    assert_eq!(x, -3.0, "an int argument read as a float converts");

    let ty = ndx_error_kind_t::NDX_ERROR_TYPE;
    b = true;
    common::expect_err(
        ndx_args_get_bool(args.0, c"n".as_ptr(), &mut b),
        ty,
        "argument 'n' is an int, not a bool",
    );
    assert!(!b, "bool cleared");
    d = 7;
    common::expect_err(
        ndx_args_get_dtype(args.0, c"s".as_ptr(), &mut d),
        ty,
        "argument 's' is a string, not a dtype",
    );
    assert_eq!(d, 0, "dtype cleared");
    x = 1.0;
    common::expect_err(
        ndx_args_get_float(args.0, c"flag".as_ptr(), &mut x),
        ty,
        "argument 'flag' is a bool, not a float",
    );
    assert_eq!(x, 0.0, "float cleared");
    let mut v = 5i64;
    common::expect_err(
        ndx_args_get_int(args.0, c"x".as_ptr(), &mut v),
        ty,
        "argument 'x' is a float, not an int",
    );
    assert_eq!(v, 0, "int cleared");
    let mut s = c"stale".as_ptr();
    common::expect_err(
        ndx_args_get_string(args.0, c"dt".as_ptr(), &mut s),
        ty,
        "argument 'dt' is a dtype, not a string",
    );
    assert!(s.is_null(), "string cleared");
    let (mut ip, mut n) = (std::ptr::null(), 9usize);
    common::expect_err(
        ndx_args_get_int_array(args.0, c"n".as_ptr(), &mut ip, &mut n),
        ty,
        "argument 'n' is an int, not an int array",
    );
    assert_eq!((ip, n), (std::ptr::null(), 0), "array cleared");
    common::expect_err(
        ndx_args_get_bool(args.0, c"missing".as_ptr(), &mut b),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "no argument 'missing' was given",
    );
    common::expect_err(
        ndx_args_get_dtype(args.0, c"dt".as_ptr(), std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'out' is NULL",
    );
}

static PROVIDER_FREED_ON: std::sync::Mutex<Vec<std::thread::ThreadId>> =
    std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn no_frames(_: *mut c_void, _: *mut ndx_host_frame_t, _: usize) -> usize {
    0
}

unsafe extern "C" fn record_free_thread(_: *mut c_void) {
    PROVIDER_FREED_ON
        .lock()
        .unwrap()
        .push(std::thread::current().id());
}

/// The frame provider's `user_free` runs in the last `ndx_context_release`, on its
/// thread, after EAGER work on the workers: not later, on a worker that let go of the
/// context last (a Python interpreter that is finalizing ends such a thread with
/// pthread_exit, which aborted the process inside ndx). The race this closes was
/// seen on the emulated driver (tests/python/test_cuda_emulated.py); here the check
/// is that the call has happened, once, on this thread, when the release returns.
#[test]
fn the_providers_user_free_runs_in_the_release_on_its_thread() {
    for _ in 0..200 {
        PROVIDER_FREED_ON.lock().unwrap().clear();
        let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_HOST);
        ok(ndx_context_set_frame_provider(
            ctx,
            Some(no_frames),
            std::ptr::null_mut(),
            Some(record_free_thread),
        ));
        let (e, _) = failing_add(ctx, std::ptr::null());
        ndx_error_free(e);
        ndx_context_release(ctx);
        assert_eq!(
            *PROVIDER_FREED_ON.lock().unwrap(),
            [std::thread::current().id()],
            "user_free ran once, in the release, on this thread"
        );
    }
}

/// A host kernel that returns its input as output 0 without `ndx_tensor_retain`.
unsafe extern "C" fn pass_input_unretained(
    _: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: one input, one output slot (the schema's).
    unsafe { *outputs = (*inputs).cast_mut() };
    std::ptr::null_mut()
}

/// A host kernel that puts one new tensor (one reference) in both its output slots.
unsafe extern "C" fn one_tensor_in_two_slots(
    _: *mut c_void,
    _: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    let t = scalar();
    // SAFETY: two output slots (the schema's).
    unsafe {
        *outputs = t;
        *outputs.add(1) = t;
    }
    std::ptr::null_mut()
}

/// Invokes `neg` of a host kernel's one input on its context (`user`) in `mode`.
///
/// # Safety
/// `inputs` holds the kernel's one input.
unsafe fn kernel_invokes_neg(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    mode: ndx_eval_mode_t,
) -> Result<*mut ndx_future_t, *mut ndx_error_t> {
    let opts = ndx_invoke_options_t {
        mode: mode as i32,
        ..Default::default()
    };
    let input = ndx_input_t {
        // SAFETY: one input (the caller's contract).
        tensor: unsafe { *inputs },
        batch: std::ptr::null(),
    };
    let mut f = std::ptr::null_mut();
    let e = ndx_invoke(
        user.cast(),
        c"neg".as_ptr(),
        &input,
        1,
        std::ptr::null(),
        &opts,
        &mut f,
    );
    if e.is_null() { Ok(f) } else { Err(e) }
}

/// A host kernel that returns the pending output of a DEFERRED `neg` it invoked on
/// its context (`user`).
unsafe extern "C" fn return_pending_output(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: one input (the schema's).
    let f = match unsafe { kernel_invokes_neg(user, inputs, ndx_eval_mode_t::NDX_EVAL_DEFERRED) } {
        Ok(f) => f,
        Err(e) => return e,
    };
    let e = ndx_future_tensor(f, 0, outputs);
    ndx_future_release(f);
    e
}

/// A host kernel that invokes an EAGER `neg` on its context (`user`), polls it until
/// it completed (for at most 10 s) and returns its output.
unsafe extern "C" fn return_completed_eager_output(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: one input (the schema's).
    let f = match unsafe { kernel_invokes_neg(user, inputs, ndx_eval_mode_t::NDX_EVAL_EAGER) } {
        Ok(f) => f,
        Err(e) => return e,
    };
    let start = std::time::Instant::now();
    while ndx_future_poll(f) == ndx_future_status_t::NDX_FUTURE_PENDING as i32
        && start.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let e = ndx_future_tensor(f, 0, outputs);
    ndx_future_release(f);
    e
}

/// The output of an EAGER invocation a host kernel made is refused as its output even
/// when that invocation has completed by the time the kernel returns: whether it has is
/// a matter of timing, so the same kernel failed in one run and passed in the next
/// (and always failed with a DEFERRED invocation). Now it fails alike in every run and
/// in every mode of the host operator's invocation.
#[test]
fn a_kernels_output_from_its_own_eager_invocation_is_refused_complete_or_not() {
    for mode in 1..=4 {
        let ctx = common::Ctx::new(mode);
        ok(ndx_register_op(
            ctx.0,
            c"eager_inside".as_ptr(),
            &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
            Some(return_completed_eager_output),
            ctx.0.cast(),
            None,
        ));
        let t = scalar();
        let f = invoke_one(
            ctx.0,
            c"eager_inside",
            ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            },
        );
        let e = ndx_future_wait(f, -1);
        ndx_future_release(f);
        common::expect_err(
            e,
            ndx_error_kind_t::NDX_ERROR_BACKEND,
            "host operator 'eager_inside' returned as outputs[0] the output of 'neg' (#2), \
             which it invoked in NDX_EVAL_EAGER (complete or not when it returned); a \
             kernel's outputs must hold data (invoke with NDX_EVAL_SYNC_CPU inside a kernel)",
        );
        assert_eq!(common::values_f32(t), [1.0], "mode {mode}");
        ndx_tensor_release(t);
        ok(ndx_context_evaluate(ctx.0));
    }
}

/// A host kernel's outputs that break its contract where ndx can tell fail the
/// invocation with an error that says what went wrong, in every mode: an input
/// returned without a reference of its own (which freed it under the output:
/// a use after free), one tensor in two slots with one reference, the pending output
/// of an invocation (which read as a refused wait).
#[test]
fn host_kernel_outputs_short_of_references_or_pending_fail_clearly() {
    for mode in 1..=4 {
        let ctx = common::Ctx::new(mode);
        let schema = |n_outputs| ndx_op_schema_t {
            n_outputs,
            ..one_in_one_out(0, std::ptr::null(), std::ptr::null())
        };
        let register = |name: &CStr, n_outputs, kernel: ndx_kernel_fn_t| {
            ok(ndx_register_op(
                ctx.0,
                name.as_ptr(),
                &schema(n_outputs),
                kernel,
                ctx.0.cast(),
                None,
            ))
        };
        register(c"unretained", 1, Some(pass_input_unretained));
        register(c"two_slots", 2, Some(one_tensor_in_two_slots));
        register(c"pending", 1, Some(return_pending_output));
        let t = scalar();
        let run = |op: &CStr| {
            let f = invoke_one(
                ctx.0,
                op,
                ndx_input_t {
                    tensor: t,
                    batch: std::ptr::null(),
                },
            );
            let e = ndx_future_wait(f, -1);
            ndx_future_release(f);
            e
        };
        common::expect_err(
            run(c"unretained"),
            ndx_error_kind_t::NDX_ERROR_BACKEND,
            "host operator 'unretained' returned inputs[0] as outputs[0] without a reference \
             of its own (call ndx_tensor_retain on an input it returns)",
        );
        common::expect_err(
            run(c"two_slots"),
            ndx_error_kind_t::NDX_ERROR_BACKEND,
            "host operator 'two_slots' put one tensor in outputs[0], outputs[1] with 1 \
             reference for them",
        );
        common::expect_err(
            run(c"pending"),
            ndx_error_kind_t::NDX_ERROR_BACKEND,
            "host operator 'pending' returned as outputs[0] the output of 'neg' (#",
        );
        // The caller's tensor is intact.
        assert_eq!(common::values_f32(t), [1.0], "mode {mode}");
        ndx_tensor_release(t);
        // The DEFERRED `neg`s, never asked for, run here.
        ok(ndx_context_evaluate(ctx.0));
    }
}

/// A NULL out-param is refused with an error naming it as the header does:
/// `ndx_future_cancel`'s is `cancelled` (its error said 'out'), and the invocation is
/// left as it was; an optional one (`ndx_context_process_events`'s `n_run`) is
/// cleared when the call fails.
#[test]
fn a_null_out_param_is_named_as_the_header_names_it() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32);
    let t = scalar();
    let f = invoke_one(
        ctx.0,
        c"neg",
        ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        },
    );
    common::expect_err(
        ndx_future_cancel(f, std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'cancelled' is NULL",
    );
    common::expect_err(
        ndx_future_output_count(f, std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'out' is NULL",
    );
    ok(ndx_future_wait(f, -1));
    assert_eq!(common::values_f32(t), [1.0]);
    ndx_future_release(f);
    ndx_tensor_release(t);
    // An optional out-param is cleared when the call fails: it kept the caller's value.
    let mut n_run = 99usize;
    common::expect_err(
        ndx_context_process_events(std::ptr::null(), &mut n_run),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'ctx' is NULL",
    );
    assert_eq!(n_run, 0, "n_run cleared on error");
}

/// `n_inputs` is an exact count: SIZE_MAX - 1, which marks ndx's whole-batch operators,
/// is refused like SIZE_MAX (it registered an operator that took any number of inputs).
#[test]
fn a_schema_with_a_reserved_input_count_is_refused() {
    let ctx = common::Ctx::new(0);
    for (n_inputs, says) in [
        (
            usize::MAX,
            "schema->n_inputs is SIZE_MAX: give the exact number of inputs",
        ),
        (
            usize::MAX - 1,
            "schema->n_inputs is SIZE_MAX - 1: give the exact number of inputs",
        ),
    ] {
        let schema = ndx_op_schema_t {
            n_inputs,
            ..one_in_one_out(0, std::ptr::null(), std::ptr::null())
        };
        common::expect_err(
            register_noop(ctx.0, c"reserved", &schema),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            says,
        );
    }
    // The name stayed free: an exact count registers.
    let schema = ndx_op_schema_t {
        n_inputs: usize::MAX - 2,
        ..one_in_one_out(0, std::ptr::null(), std::ptr::null())
    };
    ok(register_noop(ctx.0, c"reserved", &schema));
}

/// A schema with no outputs, or with an argument type outside `ndx_arg_type_t`, is
/// NDX_ERROR_VALUE naming the field (an enum from C is validated, never trusted), and
/// the name stays free for a valid schema.
#[test]
fn a_schema_with_no_outputs_or_an_unknown_argument_type_is_refused() {
    let ctx = common::Ctx::new(0);
    let schema = ndx_op_schema_t {
        n_outputs: 0,
        ..one_in_one_out(0, std::ptr::null(), std::ptr::null())
    };
    common::expect_err(
        register_noop(ctx.0, c"mine", &schema),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "schema->n_outputs is 0: an operator needs at least one output",
    );
    let names = [c"a".as_ptr(), c"b".as_ptr()];
    for (bad, says) in [
        (0, "schema->arg_types[1] is 0, not an ndx_arg_type_t value"),
        (8, "schema->arg_types[1] is 8, not an ndx_arg_type_t value"),
        (
            -1,
            "schema->arg_types[1] is -1, not an ndx_arg_type_t value",
        ),
    ] {
        let types = [ndx_arg_type_t::NDX_ARG_INT as i32, bad];
        common::expect_err(
            register_noop(
                ctx.0,
                c"mine",
                &one_in_one_out(2, names.as_ptr(), types.as_ptr()),
            ),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            says,
        );
    }
    let types = [
        ndx_arg_type_t::NDX_ARG_INT as i32,
        ndx_arg_type_t::NDX_ARG_DTYPE as i32,
    ];
    ok(register_noop(
        ctx.0,
        c"mine",
        &one_in_one_out(2, names.as_ptr(), types.as_ptr()),
    ));
}

fn i32_tensor(values: &[i32]) -> *mut ndx_tensor_t {
    common::host_tensor(values, ndx_dtype_t::NDX_DTYPE_INT32, &[values.len() as i64])
}

/// A host kernel that divides its input by zeros with a SYNC `div` on the context
/// `user`, returning that invocation's error or output.
unsafe extern "C" fn divide_by_zero_in(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    let zeros = i32_tensor(&[0, 0, 0]);
    let ins = [
        ndx_input_t {
            // SAFETY: one input (the schema's).
            tensor: unsafe { *inputs },
            batch: std::ptr::null(),
        },
        ndx_input_t {
            tensor: zeros,
            batch: std::ptr::null(),
        },
    ];
    let opts = ndx_invoke_options_t {
        mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
        ..Default::default()
    };
    let mut f = std::ptr::null_mut();
    let mut e = ndx_invoke(
        user.cast(),
        c"div".as_ptr(),
        ins.as_ptr(),
        2,
        std::ptr::null(),
        &opts,
        &mut f,
    );
    ndx_tensor_release(zeros);
    if e.is_null() {
        e = ndx_future_error(f);
        if e.is_null() {
            e = ndx_future_tensor(f, 0, outputs);
        }
    }
    ndx_future_release(f);
    e
}

/// An invocation keeps the checks of its own context when it runs inside another's
/// kernel: a SYNC `div` by zero on a context without checks, from a host operator of
/// a context that collects DIV flags, fails with its VALUE error (it raised a flag
/// that was taken for the host operator's, and returned a result), and the
/// collecting context has nothing to report; the other way round, the inner
/// invocation's flag goes to its own context, not the host operator's.
#[test]
fn an_invocation_inside_a_host_kernel_keeps_its_own_contexts_checks() {
    let with_checks = |mode: i32, policy: ndx_check_policy_t| {
        let opts = ndx_context_options_t {
            eval_mode: mode,
            check_policy: policy as i32,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        ok(ndx_context_new(&opts, &mut ctx));
        ctx
    };
    for mode in 1..=4 {
        for inner_collects in [false, true] {
            let (outer_policy, inner_policy) = if inner_collects {
                (
                    ndx_check_policy_t::NDX_CHECKS_OFF,
                    ndx_check_policy_t::NDX_CHECKS_COLLECT,
                )
            } else {
                (
                    ndx_check_policy_t::NDX_CHECKS_COLLECT,
                    ndx_check_policy_t::NDX_CHECKS_OFF,
                )
            };
            let outer = with_checks(mode, outer_policy);
            let inner = with_checks(ndx_eval_mode_t::NDX_EVAL_EAGER as i32, inner_policy);
            ok(ndx_register_op(
                outer,
                c"divide_there".as_ptr(),
                &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
                Some(divide_by_zero_in),
                inner.cast(),
                None,
            ));
            let t = i32_tensor(&[1, 2, 3]);
            let f = invoke_one(
                outer,
                c"divide_there",
                ndx_input_t {
                    tensor: t,
                    batch: std::ptr::null(),
                },
            );
            let e = ndx_future_wait(f, -1);
            if inner_collects {
                ok(e);
                ok(ndx_context_evaluate(outer));
                common::expect_err(
                    ndx_context_evaluate(inner),
                    ndx_error_kind_t::NDX_ERROR_CHECK,
                    "1 check failed",
                );
            } else {
                common::expect_err(
                    e,
                    ndx_error_kind_t::NDX_ERROR_VALUE,
                    "integer division by zero",
                );
                ok(ndx_context_evaluate(outer));
                ok(ndx_context_evaluate(inner));
            }
            ndx_future_release(f);
            ndx_tensor_release(t);
            ndx_context_release(outer);
            ndx_context_release(inner);
        }
    }
}

/// A host kernel returning a float32 scalar on its first call and an int32 one after.
unsafe extern "C" fn float_then_int(
    user: *mut c_void,
    _: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: `user` is the test's call counter, alive for the invocation.
    let calls = unsafe { &*user.cast::<std::sync::atomic::AtomicUsize>() };
    if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
        // SAFETY: one output slot (the schema's).
        unsafe { *outputs = scalar() };
    } else {
        // SAFETY: as above.
        unsafe { *outputs = i32_tensor(&[7]) };
    }
    std::ptr::null_mut()
}

/// The per-sample runs of a host operator on a batch whose outputs differ in dtype fail
/// with an error that names the runs' output (it read like a complaint about the input
/// batch: "samples[1]: dtype is int32, expected float32 like samples[0]").
#[test]
fn per_sample_outputs_that_make_no_batch_are_named_as_outputs() {
    for mode in 1..=4 {
        let ctx = common::Ctx::new(mode);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        ok(ndx_register_op(
            ctx.0,
            c"mixed".as_ptr(),
            &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
            Some(float_then_int),
            std::ptr::from_ref(&calls).cast_mut().cast(),
            None,
        ));
        let (b, _counts) = common::f32_batch(&[(&[1.0], &[1]), (&[2.0], &[1])]);
        let f = invoke_one(
            ctx.0,
            c"mixed",
            ndx_input_t {
                tensor: std::ptr::null(),
                batch: b,
            },
        );
        common::expect_err(
            ndx_future_wait(f, -1),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            "output 0 of the per-sample runs makes no batch: samples[1]: dtype is int32, \
             expected float32 like samples[0]",
        );
        ndx_future_release(f);
        ndx_batch_release(b);
    }
}

/// A host kernel that returns its input (retained) as output 0.
unsafe extern "C" fn pass_input(
    _: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: one input, one output slot (the schema's).
    let input = unsafe { *inputs };
    let e = ndx_tensor_retain(input);
    if e.is_null() {
        // SAFETY: as above.
        unsafe { *outputs = input.cast_mut() };
    }
    e
}

/// What a callback found reading a pending output: the errors of a data read and of a
/// dtype query, as (kind, message).
type Reads = std::sync::Mutex<Vec<(i32, String)>>;

struct PendingRead {
    output: *const ndx_tensor_t,
    reads: Reads,
}

unsafe extern "C" fn read_pending_output(user: *mut c_void, _: *const ndx_future_t) {
    // SAFETY: the test's PendingRead, alive until the callback has run.
    let p = unsafe { &*user.cast::<PendingRead>() };
    let mut buf = [0f32; 1];
    let copied = ndx_tensor_copy_to(p.output, buf.as_mut_ptr().cast(), 4);
    let mut dtype = 0;
    let asked = ndx_tensor_dtype(p.output, &mut dtype);
    let mut reads = p.reads.lock().unwrap();
    reads.extend(common::take_error(copied));
    reads.extend(common::take_error(asked));
}

/// A read refused inside a callback says what it was: reading data, or metadata that
/// only running a host operator tells — not "waiting on invocation", which the
/// callback never called.
#[test]
fn reads_refused_inside_a_callback_say_what_would_have_waited() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32);
    ok(ndx_register_op(
        ctx.0,
        c"host_copy".as_ptr(),
        &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
        Some(pass_input),
        std::ptr::null_mut(),
        None,
    ));
    let t = scalar();
    let input = ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    };
    let invoke = |op: &CStr, mode: ndx_eval_mode_t| {
        let opts = ndx_invoke_options_t {
            mode: mode as i32,
            ..Default::default()
        };
        let mut f = std::ptr::null_mut();
        ok(ndx_invoke(
            ctx.0,
            op.as_ptr(),
            &input,
            1,
            std::ptr::null(),
            &opts,
            &mut f,
        ));
        f
    };
    // Recorded, never asked for while the callback runs.
    let (neg, host) = (
        invoke(c"neg", ndx_eval_mode_t::NDX_EVAL_DEFERRED),
        invoke(c"host_copy", ndx_eval_mode_t::NDX_EVAL_DEFERRED),
    );
    let done = invoke(c"neg", ndx_eval_mode_t::NDX_EVAL_SYNC_CPU);
    for (f, expected) in [
        (
            neg,
            "reading the data of an output of invocation #1 ('neg'), which has not completed, \
             waits for it; waiting from inside an ndx callback",
        ),
        (
            host,
            "the dtype and shape of an output of invocation #2 ('host_copy'), a host operator \
             that infers none, are known once it has run; waiting for it from inside an ndx \
             callback",
        ),
    ] {
        let mut output = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 0, &mut output));
        let read = PendingRead {
            output,
            reads: Reads::default(),
        };
        // Complete already: the callback runs here and now.
        ok(ndx_future_on_ready(
            done,
            Some(read_pending_output),
            std::ptr::from_ref(&read).cast_mut().cast(),
            None,
        ));
        let reads = read.reads.into_inner().unwrap();
        let runtime = ndx_error_kind_t::NDX_ERROR_RUNTIME as i32;
        assert!(
            reads
                .iter()
                .any(|(k, m)| *k == runtime && m.contains(expected)),
            "{reads:?} has no {expected:?}"
        );
        ndx_tensor_release(output);
        ndx_future_release(f);
    }
    ndx_future_release(done);
    ndx_tensor_release(t);
    ok(ndx_context_evaluate(ctx.0));
}

/// A host kernel of no inputs: fails unless `inputs` is NULL, else makes a scalar.
unsafe extern "C" fn no_inputs(
    _: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    n_inputs: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    if n_inputs != 0 || !inputs.is_null() {
        let m = format!("inputs is {inputs:p} for {n_inputs} inputs\0");
        return ndx_error_new(
            ndx_error_kind_t::NDX_ERROR_VALUE as i32,
            m.as_ptr().cast(),
            std::ptr::null_mut(),
        );
    }
    // SAFETY: one output slot (the schema's).
    unsafe { *outputs = scalar() };
    std::ptr::null_mut()
}

/// A host operator of no inputs gets `inputs` NULL (it got a dangling non-NULL
/// pointer), in every mode.
#[test]
fn a_host_kernel_of_no_inputs_gets_null_inputs() {
    for mode in 1..=4 {
        let ctx = common::Ctx::new(mode);
        let schema = ndx_op_schema_t {
            n_inputs: 0,
            ..one_in_one_out(0, std::ptr::null(), std::ptr::null())
        };
        ok(ndx_register_op(
            ctx.0,
            c"source".as_ptr(),
            &schema,
            Some(no_inputs),
            std::ptr::null_mut(),
            None,
        ));
        let mut f = std::ptr::null_mut();
        ok(ndx_invoke(
            ctx.0,
            c"source".as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ));
        ok(ndx_future_wait(f, -1));
        let mut t = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 0, &mut t));
        assert_eq!(common::values_f32(t), [1.0], "mode {mode}");
        ndx_tensor_release(t);
        ndx_future_release(f);
    }
}

struct Waits {
    pending: *const ndx_future_t,
    seen: std::sync::Mutex<Vec<Option<(i32, String)>>>,
}

unsafe extern "C" fn wait_in_callback(user: *mut c_void, own: *const ndx_future_t) {
    // SAFETY: the test's Waits, alive until the callback has run.
    let w = unsafe { &*user.cast::<Waits>() };
    let mut seen = w.seen.lock().unwrap();
    seen.push(common::take_error(ndx_future_wait(own, -1)));
    seen.push(common::take_error(ndx_future_wait(w.pending, -1)));
}

/// As the header says: inside a callback a wait on a complete future (its own)
/// returns its outcome — NULL when READY, a copy of its error when FAILED — and a wait
/// on one not complete returns NDX_ERROR_RUNTIME.
#[test]
fn a_callback_may_wait_on_a_complete_future_but_not_for_work() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32);
    let (x, zero) = (i32_tensor(&[4]), i32_tensor(&[0]));
    let invoke = |op: &CStr, b: *const ndx_tensor_t, mode: ndx_eval_mode_t| {
        let ins = [x, b].map(|tensor| ndx_input_t {
            tensor,
            batch: std::ptr::null(),
        });
        let opts = ndx_invoke_options_t {
            mode: mode as i32,
            ..Default::default()
        };
        let mut f = std::ptr::null_mut();
        ok(ndx_invoke(
            ctx.0,
            op.as_ptr(),
            ins.as_ptr(),
            2,
            std::ptr::null(),
            &opts,
            &mut f,
        ));
        f
    };
    let pending = invoke(c"add", x, ndx_eval_mode_t::NDX_EVAL_DEFERRED);
    let ready = invoke(c"add", x, ndx_eval_mode_t::NDX_EVAL_SYNC_CPU);
    let failed = invoke(c"div", zero, ndx_eval_mode_t::NDX_EVAL_SYNC_CPU);
    for (own, want) in [
        (ready, None),
        (
            failed,
            Some((
                ndx_error_kind_t::NDX_ERROR_VALUE as i32,
                "integer division by zero",
            )),
        ),
    ] {
        let w = Waits {
            pending,
            seen: Default::default(),
        };
        ok(ndx_future_on_ready(
            own,
            Some(wait_in_callback),
            std::ptr::from_ref(&w).cast_mut().cast(),
            None,
        ));
        let seen = w.seen.into_inner().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        match (&seen[0], want) {
            (None, None) => {}
            (Some((k, m)), Some((kind, fragment))) if *k == kind && m.contains(fragment) => {}
            (got, _) => panic!("own wait: {got:?}, expected {want:?}"),
        }
        let (k, m) = seen[1].clone().expect("a wait for work is refused");
        assert_eq!(k, ndx_error_kind_t::NDX_ERROR_RUNTIME as i32, "{m}");
        assert!(m.contains("from inside an ndx callback"), "{m}");
    }
    for f in [pending, ready, failed] {
        ndx_future_release(f);
    }
    ndx_tensor_release(x);
    ndx_tensor_release(zero);
    ok(ndx_context_evaluate(ctx.0));
}

/// A fault-injection backend naming an operator the context does not have is refused
/// (a misspelt name used to inject nothing, so a test of error handling passed without
/// ever seeing its fault), with the nearest name as a hint; the previous backend stays.
/// A host operator can be named once it is registered. An unknown operator at
/// `ndx_invoke` gets the same hint.
#[test]
fn a_backend_naming_an_unknown_operator_is_refused_with_a_hint() {
    let value = ndx_error_kind_t::NDX_ERROR_VALUE;
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    common::expect_err(
        ndx_context_set_backend(ctx, c"inject_runtime_error:ad".as_ptr()),
        value,
        "backend 'inject_runtime_error:ad' names operator 'ad', which is neither a built-in \
         nor a host operator registered on this context; did you mean 'add'?",
    );
    // Still the context's `inject_runtime_error:add`.
    let (e, _) = failing_add(ctx, std::ptr::null());
    assert!(
        common::take_error(e)
            .unwrap()
            .1
            .contains("injected runtime error in operator 'add'")
    );
    // A host operator: refused before it is registered, injected after.
    let schema = one_in_one_out(0, std::ptr::null(), std::ptr::null());
    common::expect_err(
        ndx_context_set_backend(ctx, c"inject_compile_error:my_noop".as_ptr()),
        value,
        "register a host operator with ndx_register_op before a backend names it",
    );
    ok(register_noop(ctx, c"my_noop", &schema));
    ok(ndx_context_set_backend(
        ctx,
        c"inject_compile_error:my_noop".as_ptr(),
    ));
    let t = scalar();
    let input = ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    };
    let mut f = std::ptr::null_mut();
    common::expect_err(
        ndx_invoke(
            ctx,
            c"my_noop".as_ptr(),
            &input,
            1,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ),
        ndx_error_kind_t::NDX_ERROR_BACKEND,
        "injected compile error in operator 'my_noop'",
    );
    // An unknown operator at invoke: the hint covers host operators too.
    common::expect_err(
        ndx_invoke(
            ctx,
            c"my_nop".as_ptr(),
            &input,
            1,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ),
        value,
        "unknown operator 'my_nop'; did you mean 'my_noop'?",
    );
    // Nothing near: no hint.
    let (_, msg) = common::take_error(ndx_invoke(
        ctx,
        c"zzzzzzzz".as_ptr(),
        &input,
        1,
        std::ptr::null(),
        std::ptr::null(),
        &mut f,
    ))
    .unwrap();
    assert_eq!(msg, "unknown operator 'zzzzzzzz'");
    ndx_tensor_release(t);
    ndx_context_release(ctx);
    // The context option: a new context has only the built-ins.
    for (name, fragment) in [
        (c"inject_accuracy_error:summ", "did you mean 'sum'?"),
        (c"inject_accuracy_error:my_noop", "names operator 'my_noop'"),
    ] {
        let opts = ndx_context_options_t {
            backend: name.as_ptr(),
            ..Default::default()
        };
        let mut c = std::ptr::null_mut();
        common::expect_err(ndx_context_new(&opts, &mut c), value, fragment);
        assert!(c.is_null());
    }
}

/// A host kernel whose output is [1, NaN, inf] float32, whatever its input.
unsafe extern "C" fn non_finite_kernel(
    _: *mut c_void,
    _: *const *const ndx_tensor_t,
    _: usize,
    _: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    let v = [1.0f32, f32::NAN, f32::INFINITY];
    // SAFETY: ndx passes one writable output slot (the schema's one output).
    ndx_tensor_from_host(
        v.as_ptr().cast(),
        ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
        1,
        [3i64].as_ptr(),
        std::ptr::null(),
        std::ptr::null(),
        unsafe { &mut *outputs },
    )
}

/// NDX_CHECK_NAN covers host operators as it covers built-ins (their outputs used to
/// go unscanned): NaN or infinities made from finite inputs raise one flag naming the
/// operator; from non-finite inputs, or with the category off, nothing is raised.
#[test]
fn a_host_operator_making_nan_from_finite_inputs_raises_a_nan_flag() {
    let cases: [(f32, u32, usize); 3] = [
        (1.0, ndx_check_category_t::NDX_CHECK_ALL as u32, 1),
        (f32::NAN, ndx_check_category_t::NDX_CHECK_ALL as u32, 0),
        (1.0, ndx_check_category_t::NDX_CHECK_USER as u32, 0),
    ];
    for (x, categories, flags) in cases {
        let opts = ndx_context_options_t {
            eval_mode: ndx_eval_mode_t::NDX_EVAL_EAGER as i32,
            check_policy: ndx_check_policy_t::NDX_CHECKS_COLLECT as i32,
            check_categories: categories,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        ok(ndx_context_new(&opts, &mut ctx));
        let schema = one_in_one_out(0, std::ptr::null(), std::ptr::null());
        ok(ndx_register_op(
            ctx,
            c"make_nan".as_ptr(),
            &schema,
            Some(non_finite_kernel),
            std::ptr::null_mut(),
            None,
        ));
        let t = common::host_tensor(&[x], ndx_dtype_t::NDX_DTYPE_FLOAT32, &[]);
        let f = invoke_one(
            ctx,
            c"make_nan",
            ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            },
        );
        ok(ndx_future_wait(f, -1));
        let g = ndx_context_take_check_errors(ctx);
        let got = if g.is_null() {
            0
        } else {
            ndx_error_related_count(g)
        };
        assert_eq!(got, flags, "input {x}, categories {categories}");
        if flags == 1 {
            let r = ndx_error_related(g, 0);
            assert_eq!(cstr(ndx_error_op(r)), "make_nan");
            let msg = cstr(ndx_error_message(r));
            assert!(
                msg.contains("output 0 has 2 NaN or infinite elements from finite inputs"),
                "{msg}"
            );
        }
        ndx_error_free(g);
        ndx_future_release(f);
        ndx_tensor_release(t);
        ndx_context_release(ctx);
    }
}

/// `clamp` of `values` (int64) with `lo` and `hi` (None: not given), SYNC: the
/// result's values or the call-time error.
fn clamp_i64(values: &[i64], lo: Option<f64>, hi: Option<f64>) -> Result<Vec<i64>, (i32, String)> {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let shape = [values.len() as i64];
    let t = common::host_tensor(values, ndx_dtype_t::NDX_DTYPE_INT64, &shape);
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    for (name, v) in [(c"lo", lo), (c"hi", hi)] {
        if let Some(v) = v {
            ok(ndx_args_set_float(args, name.as_ptr(), v));
        }
    }
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let got = common::invoke_with(&ctx, c"clamp", &input, args, &Default::default());
    ndx_args_free(args);
    ndx_tensor_release(t);
    let f = got.map_err(|e| common::take_error(e).expect("an error"))?;
    ok(ndx_future_wait(f, -1));
    let mut out = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut out));
    let mut v = vec![0i64; values.len()];
    ok(ndx_tensor_copy_to(out, v.as_mut_ptr().cast(), v.len() * 8));
    ndx_tensor_release(out);
    ndx_future_release(f);
    Ok(v)
}

/// A NaN bound compares false with everything: `clamp` of integers turned it into 0
/// (the cast of NaN), so `lo = NaN` silently raised every negative value to 0 and
/// `hi = NaN` lowered every positive one to 0; floats were left unbounded. It is
/// NDX_ERROR_VALUE at `ndx_invoke`, naming the argument, like reversed bounds.
#[test]
fn a_nan_clamp_bound_is_refused_at_invoke() {
    let v = [-5i64, -1, 0, 1, 5, 100];
    let value = ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    for (lo, hi, name) in [
        (Some(f64::NAN), None, "lo"),
        (None, Some(f64::NAN), "hi"),
        (Some(-1.0), Some(-f64::NAN), "hi"),
    ] {
        let (kind, msg) = clamp_i64(&v, lo, hi).expect_err("refused");
        assert_eq!(kind, value, "{msg}");
        assert_eq!(
            msg,
            format!(
                "operator 'clamp': argument '{name}' is NaN, not a bound (leave it out for no bound)"
            )
        );
    }
    // Infinite bounds are bounds: -inf and +inf bound nothing.
    assert_eq!(
        clamp_i64(&v, Some(f64::NEG_INFINITY), Some(f64::INFINITY)),
        Ok(v.to_vec())
    );
    assert_eq!(
        clamp_i64(&v, Some(-1.5), Some(4.5)),
        Ok(vec![-1, -1, 0, 1, 4, 4])
    );
}

/// For integers `lo` rounds up and `hi` down; bounds with no integer between them
/// (0.5 and 0.7) clamped every value to the rounded `hi` (all 0). They are
/// NDX_ERROR_VALUE at `ndx_invoke`, giving both rounded bounds.
#[test]
fn integer_clamp_bounds_with_no_integer_between_them_are_refused() {
    let v = [-5i64, -1, 0, 1, 5, 100];
    let (kind, msg) = clamp_i64(&v, Some(0.5), Some(0.7)).expect_err("refused");
    assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
    assert_eq!(
        msg,
        "operator 'clamp': clamp bounds lo = 0.5 and hi = 0.7 hold no integer: for int64 inputs lo rounds up to 1 and hi down to 0"
    );
    // One integer between them is enough.
    assert_eq!(clamp_i64(&v, Some(0.5), Some(1.0)), Ok(vec![1; 6]));
    assert_eq!(clamp_i64(&v, Some(0.5), Some(1.7)), Ok(vec![1; 6]));
}

/// What `reentrant_provider` saw: its context, how often it ran, and the frames of
/// the invocation it made itself.
struct Reentry {
    ctx: *mut ndx_context_t,
    calls: usize,
    nested: Option<Vec<(String, String, u32, ndx_frame_origin_t)>>,
}

/// A provider that invokes on its own context (as host code it calls might), at most 8
/// times deep so that the test ends without the fix too.
unsafe extern "C" fn reentrant_provider(
    user: *mut c_void,
    out: *mut ndx_host_frame_t,
    cap: usize,
) -> usize {
    // SAFETY: the test's state, alive during the invocation.
    let r = unsafe { &mut *user.cast::<Reentry>() };
    r.calls += 1;
    if r.calls < 8 {
        let t = scalar();
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
        let mut f = std::ptr::null_mut();
        ok(ndx_invoke(
            r.ctx,
            c"add".as_ptr(),
            ins.as_ptr(),
            2,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ));
        let e = ndx_future_wait(f, -1);
        if r.nested.is_none() {
            r.nested = Some(frames(e));
        }
        ndx_error_free(e);
        ndx_future_release(f);
        ndx_tensor_release(t);
    }
    if cap > 0 {
        // SAFETY: `cap` writable frames.
        unsafe {
            *out = ndx_host_frame_t {
                function: c"py_fn".as_ptr(),
                file: c"x.py".as_ptr(),
                line: 3,
            }
        };
    }
    cap.min(1)
}

/// A frame provider that invokes on its context (directly or through host code) was
/// called again by that invocation, and again by the next: without end, until the
/// stack overflowed and the process aborted. An invocation made inside a provider now
/// records no host frames (its native caller frame instead): the provider runs once.
#[test]
fn an_invocation_inside_the_frame_provider_does_not_call_it_again() {
    for policy in [
        ndx_capture_policy_t::NDX_CAPTURE_HOST,
        ndx_capture_policy_t::NDX_CAPTURE_ALL,
    ] {
        let ctx = context(policy);
        let mut r = Reentry {
            ctx,
            calls: 0,
            nested: None,
        };
        ok(ndx_context_set_frame_provider(
            ctx,
            Some(reentrant_provider),
            (&raw mut r).cast(),
            None,
        ));
        let (e, _) = failing_add(ctx, std::ptr::null());
        assert_eq!(r.calls, 1, "the provider ran once ({policy:?})");
        let outer = frames(e);
        assert_eq!(
            outer[0],
            (
                "py_fn".into(),
                "x.py".into(),
                3,
                ndx_frame_origin_t::NDX_FRAME_HOST
            )
        );
        let nested = r
            .nested
            .take()
            .expect("the nested invocation failed as injected");
        assert!(
            nested
                .iter()
                .all(|f| f.3 == ndx_frame_origin_t::NDX_FRAME_NATIVE),
            "{nested:?}"
        );
        assert!(nested[0].0.ends_with("reentrant_provider"), "{nested:?}");
        ndx_error_free(e);
        ndx_context_release(ctx);
        // The guard is left: the next invocation on this thread calls a provider again.
    }
}

/// Names are keys: replacing their invalid UTF-8 made distinct names equal. Argument
/// "\xff" and argument "\xfe" were one argument (setting one replaced the other, and
/// reading "\xfd" returned it); two such schema names were "both \"\u{fffd}\""; and
/// `ndx_invoke` of operator "\xfe" ran the host operator registered as "\xff". Names
/// that are not UTF-8 are now NDX_ERROR_VALUE, naming the argument and the byte.
#[test]
fn names_that_are_not_utf8_are_refused_not_merged() {
    let value = ndx_error_kind_t::NDX_ERROR_VALUE;
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    let (ff, fe) = (c"\xff".as_ptr(), c"a\xfe".as_ptr());
    common::expect_err(
        ndx_args_set_int(args, ff, 1),
        value,
        "argument 'name' (\"\\xff\") is not valid UTF-8: byte 0xff at offset 0; names must be UTF-8",
    );
    common::expect_err(
        ndx_args_set_float_array(args, fe, std::ptr::null(), 0),
        value,
        "argument 'name' (\"a\\xfe\") is not valid UTF-8: byte 0xfe at offset 1",
    );
    // U+FFFD itself is a valid name, and no invalid name reads it.
    ok(ndx_args_set_int(args, c"\u{fffd}".as_ptr(), 7));
    let mut v = -1i64;
    common::expect_err(ndx_args_get_int(args, ff, &mut v), value, "not valid UTF-8");
    assert_eq!(v, 0, "the out-param is cleared");
    ok(ndx_args_get_int(args, c"\u{fffd}".as_ptr(), &mut v));
    assert_eq!(v, 7);

    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_OFF);
    let types = [ndx_arg_type_t::NDX_ARG_INT as i32; 2];
    let names = [c"\xff".as_ptr(), c"\xfe".as_ptr()];
    let schema = one_in_one_out(2, names.as_ptr(), types.as_ptr());
    common::expect_err(
        register_noop(ctx, c"op", &schema),
        value,
        "argument 'schema->arg_names[0]' (\"\\xff\") is not valid UTF-8",
    );
    let none = one_in_one_out(0, std::ptr::null(), std::ptr::null());
    common::expect_err(
        register_noop(ctx, c"op\xff", &none),
        value,
        "argument 'name' (\"op\\xff\") is not valid UTF-8: byte 0xff at offset 2",
    );
    // What was refused registered nothing: "op\u{fffd}" is free.
    ok(register_noop(ctx, c"op\u{fffd}", &none));
    let t = scalar();
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let mut f = std::ptr::null_mut();
    common::expect_err(
        ndx_invoke(
            ctx,
            c"op\xfe".as_ptr(),
            input.as_ptr(),
            1,
            std::ptr::null(),
            std::ptr::null(),
            &mut f,
        ),
        value,
        "argument 'op' (\"op\\xfe\") is not valid UTF-8",
    );
    assert!(f.is_null());
    ndx_tensor_release(t);
    ndx_context_release(ctx);
    ndx_args_free(args);
}

/// What `typed_reader` read with the getter of each declared type, or the error.
type Read = std::sync::Mutex<Vec<Result<String, String>>>;

/// A host kernel reading `ia` (int array), `fa` (float array) and `f` (float), each
/// with the getter of its declared type; its output is its input.
unsafe extern "C" fn typed_reader(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    _: usize,
    args: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _: usize,
) -> *mut ndx_error_t {
    // SAFETY: the test's record, alive during the invocation.
    let read = unsafe { &*user.cast::<Read>() };
    let text = |e: *mut ndx_error_t| common::take_error(e).map(|(_, m)| m);
    let (mut ip, mut fp, mut n, mut f) = (std::ptr::null(), std::ptr::null(), 0usize, 0f64);
    let mut got = read.lock().unwrap();
    got.push(
        match text(ndx_args_get_int_array(
            args,
            c"ia".as_ptr(),
            &mut ip,
            &mut n,
        )) {
            // SAFETY: `n` values borrowed from the live args.
            None => Ok(format!("{:?}", unsafe {
                std::slice::from_raw_parts(ip, n)
            })),
            Some(m) => Err(m),
        },
    );
    got.push(
        match text(ndx_args_get_float_array(
            args,
            c"fa".as_ptr(),
            &mut fp,
            &mut n,
        )) {
            // SAFETY: as above.
            None => Ok(format!("{:?}", unsafe {
                std::slice::from_raw_parts(fp, n)
            })),
            Some(m) => Err(m),
        },
    );
    got.push(
        match text(ndx_args_get_float(args, c"f".as_ptr(), &mut f)) {
            None => Ok(format!("{f:?}")),
            Some(m) => Err(m),
        },
    );
    // SAFETY: one input and one output slot (the schema's).
    unsafe {
        let input = *inputs;
        ok(ndx_tensor_retain(input));
        *outputs = input.cast_mut();
    }
    std::ptr::null_mut()
}

/// The schema's NDX_ARG_INT_ARRAY accepts a single int and NDX_ARG_FLOAT_ARRAY a
/// single float or int, but the kernel got them as given: its
/// `ndx_args_get_int_array` failed "argument 'ia' is an int, not an int array", so an
/// invocation `ndx_invoke` accepted failed in the kernel. The kernel's copy now holds
/// the declared types.
#[test]
fn a_host_kernel_reads_arguments_given_in_an_accepted_form_as_its_declared_type() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let names = [c"ia".as_ptr(), c"fa".as_ptr(), c"f".as_ptr()];
    let types = [
        ndx_arg_type_t::NDX_ARG_INT_ARRAY as i32,
        ndx_arg_type_t::NDX_ARG_FLOAT_ARRAY as i32,
        ndx_arg_type_t::NDX_ARG_FLOAT as i32,
    ];
    let mut schema = one_in_one_out(3, names.as_ptr(), types.as_ptr());
    schema.flags = ndx_op_flags_t::NDX_OP_OUTPUTS_MAY_ALIAS as u32;
    let read: Read = Default::default();
    ok(ndx_register_op(
        ctx.0,
        c"typed".as_ptr(),
        &schema,
        Some(typed_reader),
        std::ptr::from_ref(&read).cast_mut().cast(),
        None,
    ));
    let t = scalar();
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let run = |set: &dyn Fn(*mut ndx_args_t)| {
        let mut args = std::ptr::null_mut();
        ok(ndx_args_new(&mut args));
        set(args);
        let f = common::invoke_with(&ctx, c"typed", &input, args, &Default::default())
            .unwrap_or_else(|e| panic!("{:?}", common::take_error(e)));
        ndx_args_free(args);
        ok(ndx_future_wait(f, -1));
        ndx_future_release(f);
        std::mem::take(&mut *read.lock().unwrap())
    };
    let ints = |args| {
        ok(ndx_args_set_int(args, c"ia".as_ptr(), 3));
        ok(ndx_args_set_int(args, c"fa".as_ptr(), -2));
        ok(ndx_args_set_int(args, c"f".as_ptr(), 5));
    };
    assert_eq!(
        run(&ints),
        [Ok("[3]".into()), Ok("[-2.0]".into()), Ok("5.0".into())]
    );
    let float = |args| ok(ndx_args_set_float(args, c"fa".as_ptr(), 0.25));
    let got = run(&float);
    assert_eq!(got[1], Ok("[0.25]".into()));
    // Arrays given as arrays stay as they are.
    let arrays = |args| {
        ok(ndx_args_set_int_array(
            args,
            c"ia".as_ptr(),
            [1i64, 2].as_ptr(),
            2,
        ));
        ok(ndx_args_set_float_array(
            args,
            c"fa".as_ptr(),
            [0.5f64].as_ptr(),
            1,
        ));
    };
    let got = run(&arrays);
    assert_eq!(got[..2], [Ok("[1, 2]".into()), Ok("[0.5]".into())]);
    // An int array for a float array is converted too (it was refused at `ndx_invoke`:
    // "argument 'fa' is an int array, expected a float array").
    let int_array = |args| {
        ok(ndx_args_set_int_array(
            args,
            c"fa".as_ptr(),
            [3i64, -1].as_ptr(),
            2,
        ))
    };
    let got = run(&int_array);
    assert_eq!(got[1], Ok("[3.0, -1.0]".into()));
    ndx_tensor_release(t);
}

/// `slice` with start, end, step and axes of different lengths said "got 2, 1, 2 and
/// 2": counts for a step and axes that were never given (their defaults). It names
/// each count with its argument, and only those given.
#[test]
fn slice_length_mismatches_count_only_the_arguments_given() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let t = scalar();
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    ok(ndx_args_set_int_array(
        args,
        c"start".as_ptr(),
        [0i64, 0].as_ptr(),
        2,
    ));
    ok(ndx_args_set_int_array(
        args,
        c"end".as_ptr(),
        [1i64].as_ptr(),
        1,
    ));
    let refused = |fragment: &str| {
        let e = common::invoke_with(&ctx, c"slice", &input, args, &Default::default())
            .expect_err("refused");
        common::expect_err(e, ndx_error_kind_t::NDX_ERROR_VALUE, fragment);
    };
    refused(
        "operator 'slice': start, end, step and axes must have one entry per sliced axis; \
         got 2 in start, 1 in end",
    );
    ok(ndx_args_set_int_array(
        args,
        c"step".as_ptr(),
        [1i64; 3].as_ptr(),
        3,
    ));
    refused("must have one entry per sliced axis; got 2 in start, 1 in end, 3 in step");
    ndx_args_free(args);
    ndx_tensor_release(t);
}

/// A negative size in `reshape`'s shape and a negative `pad` width were refused as
/// "reshape: dimension -2 is negative in shape [24, -2]" and "pad: width -1 is
/// negative": neither named the argument's entry nor what it may be. They name the
/// argument, the index (for pad, which side of which axis), the value and the range.
#[test]
fn negative_shape_and_pad_entries_name_the_argument_index_and_range() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let t = common::host_tensor(&[0f32; 6], ndx_dtype_t::NDX_DTYPE_FLOAT32, &[2, 3]);
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let refused = |op: &CStr, name: &CStr, values: &[i64], fragment: &str| {
        let mut args = std::ptr::null_mut();
        ok(ndx_args_new(&mut args));
        ok(ndx_args_set_int_array(
            args,
            name.as_ptr(),
            values.as_ptr(),
            values.len(),
        ));
        let e =
            common::invoke_with(&ctx, op, &input, args, &Default::default()).expect_err("refused");
        common::expect_err(e, ndx_error_kind_t::NDX_ERROR_VALUE, fragment);
        ndx_args_free(args);
    };
    refused(
        c"reshape",
        c"shape",
        &[6, -2],
        "operator 'reshape': argument 'shape' [6, -2] has -2 at index 1; expected a size >= 0, or -1 for \
         the one size to infer",
    );
    refused(
        c"pad",
        c"widths",
        &[0, 1, 2, -1],
        "operator 'pad': argument 'widths' [0, 1, 2, -1] has -1 at index 3 (the width after axis 1); \
         expected a width >= 0",
    );
    refused(
        c"pad",
        c"widths",
        &[-5, 0, 0, 0],
        "has -5 at index 0 (the width before axis 0)",
    );
    // slice's step 0 said "slice: step for axis 1 is 0".
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    for (name, v) in [(c"start", [0i64, 0]), (c"end", [1, 1]), (c"step", [1, 0])] {
        ok(ndx_args_set_int_array(args, name.as_ptr(), v.as_ptr(), 2));
    }
    let e = common::invoke_with(&ctx, c"slice", &input, args, &Default::default())
        .expect_err("refused");
    common::expect_err(
        e,
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "operator 'slice': argument 'step' [1, 0] has 0 at index 1 (the step along axis 1); expected a \
         non-zero step",
    );
    ndx_args_free(args);
    ndx_tensor_release(t);
}

/// `max` / `argmax` over no element said only "zero-size reduction: operator 'max' has
/// no identity for an empty set of elements", naming neither the axes nor the shape.
/// It names both (the work fails, as documented, when it runs).
#[test]
fn an_empty_reduction_names_its_axes_and_shape() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let t = common::host_tensor(&[0f32; 0], ndx_dtype_t::NDX_DTYPE_FLOAT32, &[2, 0]);
    let input = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let fails = |op: &CStr, set: &dyn Fn(*mut ndx_args_t), fragment: &str| {
        let mut args = std::ptr::null_mut();
        ok(ndx_args_new(&mut args));
        set(args);
        let f = common::invoke_with(&ctx, op, &input, args, &Default::default())
            .unwrap_or_else(|e| panic!("{:?}", common::take_error(e)));
        common::expect_err(
            ndx_future_wait(f, -1),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            fragment,
        );
        ndx_future_release(f);
        ndx_args_free(args);
    };
    fails(
        c"max",
        &|a| {
            ok(ndx_args_set_int_array(
                a,
                c"axes".as_ptr(),
                [-1i64].as_ptr(),
                1,
            ))
        },
        "zero-size reduction: operator 'max' has no identity for an empty set of elements \
         (it reduces axes [1] of shape [2, 0]: 0 elements, expected at least 1)",
    );
    fails(
        c"min",
        &|_| {},
        "(it reduces every axis of shape [2, 0]: 0 elements",
    );
    fails(
        c"argmax",
        &|a| ok(ndx_args_set_int(a, c"axis".as_ptr(), 1)),
        "operator 'argmax' has no identity for an empty set of elements (it reduces axis 1 \
         of shape [2, 0]: 0 elements, expected at least 1)",
    );
    fails(
        c"argmin",
        &|_| {},
        "(it reduces the flattened tensor of shape [2, 0]: 0 elements",
    );
    ndx_tensor_release(t);
}

/// Writes one frame whose line is -1 (a host's "unknown") converted to `uint32_t`.
unsafe extern "C" fn minus_one_line(
    _: *mut c_void,
    out: *mut ndx_host_frame_t,
    cap: usize,
) -> usize {
    if cap == 0 {
        return 0;
    }
    // SAFETY: `cap` writable frames.
    unsafe {
        *out = ndx_host_frame_t {
            function: c"py_fn".as_ptr(),
            file: c"x.py".as_ptr(),
            line: -1i32 as u32,
        }
    };
    1
}

/// A host's "unknown" line -1, converted to `uint32_t`, read as line 4294967295 of the
/// file ("File \"x.py\", line 4294967295"); from a provider or an explicit location,
/// a line above INT32_MAX is 0 (unknown) now.
#[test]
fn a_negative_host_line_reads_as_unknown() {
    let ctx = context(ndx_capture_policy_t::NDX_CAPTURE_HOST);
    ok(ndx_context_set_frame_provider(
        ctx,
        Some(minus_one_line),
        std::ptr::null_mut(),
        None,
    ));
    let (e, _) = failing_add(ctx, std::ptr::null());
    let fr = frames(e);
    assert_eq!(
        fr[0],
        (
            "py_fn".into(),
            "x.py".into(),
            0,
            ndx_frame_origin_t::NDX_FRAME_HOST
        )
    );
    ndx_error_free(e);
    ok(ndx_context_set_frame_provider(
        ctx,
        None,
        std::ptr::null_mut(),
        None,
    ));
    for (line, want) in [
        (u32::MAX, 0),
        (i32::MAX as u32 + 1, 0),
        (i32::MAX as u32, i32::MAX as u32),
    ] {
        let opts = ndx_invoke_options_t {
            struct_size: std::mem::size_of::<ndx_invoke_options_t>(),
            location: ndx_location_t {
                file: c"app.lua".as_ptr(),
                line,
                function: c"main".as_ptr(),
            },
            ..Default::default()
        };
        let (e, _) = failing_add(ctx, &opts);
        assert_eq!(frame(e, 0).line, want, "line {line}");
        ndx_error_free(e);
    }
    ndx_context_release(ctx);
}

/// `ndx_invoke` copies its arguments: changing and freeing them while a DEFERRED or
/// EAGER invocation is pending changes nothing about it.
#[test]
fn args_changed_or_freed_after_invoke_do_not_reach_pending_work() {
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
    ] {
        let ctx = common::Ctx::new(mode as i32);
        let data = [1i32, 2, 3, 10, 20, 30];
        let shape = [2i64, 3];
        let t = common::host_tensor(&data, ndx_dtype_t::NDX_DTYPE_INT32, &shape);
        let mut args = std::ptr::null_mut();
        ok(ndx_args_new(&mut args));
        ok(ndx_args_set_int_array(
            args,
            c"axes".as_ptr(),
            [0i64].as_ptr(),
            1,
        ));
        let input = [ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        }];
        let f = common::invoke_with(&ctx, c"sum", &input, args, &Default::default())
            .unwrap_or_else(|e| panic!("{:?}", common::take_error(e)));
        ok(ndx_args_set_int_array(
            args,
            c"axes".as_ptr(),
            [1i64].as_ptr(),
            1,
        ));
        ok(ndx_args_set_string(
            args,
            c"keepdims".as_ptr(),
            c"changed".as_ptr(),
        ));
        ndx_args_free(args);
        ok(ndx_future_wait(f, -1));
        let mut out = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 0, &mut out));
        let mut sums = [0i64; 3];
        ok(ndx_tensor_copy_to(out, sums.as_mut_ptr().cast(), 24));
        assert_eq!(sums, [11, 22, 33], "{mode:?}");
        assert_eq!(common::shape_of(out), [3]);
        ndx_tensor_release(out);
        ndx_future_release(f);
        ndx_tensor_release(t);
    }
}

/// A host kernel failing with "negative input" on a negative float32 scalar, else
/// returning its input.
unsafe extern "C" fn fail_on_negative(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    n: usize,
    args: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    n_out: usize,
) -> *mut ndx_error_t {
    let mut v = 0f32;
    // SAFETY: one input (the schema's).
    let e = ndx_tensor_copy_to(unsafe { *inputs }, (&raw mut v).cast(), 4);
    if !e.is_null() {
        return e;
    }
    if v < 0.0 {
        return ndx_error_new(
            ndx_error_kind_t::NDX_ERROR_VALUE as i32,
            c"negative input".as_ptr(),
            std::ptr::null_mut(),
        );
    }
    // SAFETY: forwarded as received.
    unsafe { pass_input(user, inputs, n, args, outputs, n_out) }
}

/// The whole traceback `ndx_error_format` writes.
fn formatted(e: *const ndx_error_t) -> String {
    let n = ndx_error_format(e, std::ptr::null_mut(), 0);
    let mut buf = vec![0u8; n + 1];
    ndx_error_format(e, buf.as_mut_ptr().cast(), buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The failure of one run of a per-sample invocation says which sample failed
/// (`ndx_error_sample` and the traceback), in every mode and under `noexcept`; the
/// message stays the kernel's own. Before, nothing named the sample: a batch of a
/// thousand images failing with "negative input" left the caller to find which.
#[test]
fn the_failure_of_a_per_sample_run_names_its_sample() {
    for backend in [c"default", c"noexcept"] {
        for mode in 1..=4 {
            let ctx = common::Ctx::new(mode);
            ok(ndx_context_set_backend(ctx.0, backend.as_ptr()));
            ok(ndx_register_op(
                ctx.0,
                c"nonneg".as_ptr(),
                &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
                Some(fail_on_negative),
                std::ptr::null_mut(),
                None,
            ));
            let (b, _counts) =
                common::f32_batch(&[(&[1.0], &[]), (&[2.0], &[]), (&[-3.0], &[]), (&[-4.0], &[])]);
            let f = invoke_one(
                ctx.0,
                c"nonneg",
                ndx_input_t {
                    tensor: std::ptr::null(),
                    batch: b,
                },
            );
            let e = ndx_future_wait(f, -1);
            assert!(!e.is_null(), "mode {mode}: the invocation failed");
            let kernel_error = if backend == c"noexcept" {
                assert_eq!(
                    ndx_error_kind(e),
                    ndx_error_kind_t::NDX_ERROR_BACKEND as i32
                );
                assert_eq!(ndx_error_sample(e), 2, "mode {mode}: the BACKEND error");
                ndx_error_cause(e)
            } else {
                e.cast_const()
            };
            assert_eq!(
                common::cstr(ndx_error_message(kernel_error)),
                "negative input"
            );
            assert_eq!(ndx_error_sample(kernel_error), 2, "mode {mode}");
            let text = formatted(e);
            assert!(
                text.contains("of operator 'nonneg', batch sample 2\n"),
                "mode {mode}: {text}"
            );
            ndx_error_free(e);
            ndx_future_release(f);
            // A tensor input: no sample.
            let t = scalar();
            let neg = [-1.0f32];
            let n = common::host_tensor(&neg, ndx_dtype_t::NDX_DTYPE_FLOAT32, &[]);
            let g = invoke_one(
                ctx.0,
                c"nonneg",
                ndx_input_t {
                    tensor: n,
                    batch: std::ptr::null(),
                },
            );
            let e = ndx_future_wait(g, -1);
            assert!(!e.is_null());
            assert_eq!(ndx_error_sample(e), -1, "mode {mode}: a tensor invocation");
            assert!(!formatted(e).contains("batch sample"));
            ndx_error_free(e);
            ndx_future_release(g);
            ndx_tensor_release(n);
            ndx_tensor_release(t);
            ndx_batch_release(b);
        }
    }
    assert_eq!(ndx_error_sample(std::ptr::null()), -1);
}

/// A per-sample check flag carries its sample as `ndx_error_sample` too, as its check
/// info and message do (FAIL_FAST: the invocation's error is the flag).
#[test]
fn a_per_sample_check_failure_names_its_sample() {
    let opts = ndx_context_options_t {
        eval_mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
        check_policy: ndx_check_policy_t::NDX_CHECKS_FAIL_FAST as i32,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    ok(ndx_context_new(&opts, &mut ctx));
    let (b, _counts) = common::f32_batch(&[(&[1.0], &[1]), (&[3.0, f32::NAN], &[2])]);
    let f = invoke_one(
        ctx,
        c"check_finite",
        ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        },
    );
    let e = ndx_future_wait(f, -1);
    assert_eq!(ndx_error_kind(e), ndx_error_kind_t::NDX_ERROR_CHECK as i32);
    assert_eq!(ndx_error_sample(e), 1);
    ndx_error_free(e);
    ndx_future_release(f);
    ndx_batch_release(b);
    ndx_context_release(ctx);
}

/// A built-in operator on the output of a host operator that failed: inferring the
/// built-in's outputs asks for that output's metadata, which runs the host operator
/// (it infers none). Its failure is an execution failure: it fails the built-in's
/// future with the host operator's error as cause, in every mode, for a tensor and a
/// batch alike. It came out of `ndx_invoke` as a call-time error of the built-in
/// ("operator 'neg': negative input", no cause: the host operator, its sequence
/// number and the failing sample lost).
#[test]
fn a_failed_host_output_fails_a_builtin_consumer_in_its_future() {
    for batch in [false, true] {
        for mode in 1..=4 {
            let ctx = common::Ctx::new(mode);
            ok(ndx_register_op(
                ctx.0,
                c"nonneg".as_ptr(),
                &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
                Some(fail_on_negative),
                std::ptr::null_mut(),
                None,
            ));
            let (b, _counts) = common::f32_batch(&[(&[1.0], &[]), (&[-2.0], &[])]);
            let t = common::T::copy(&[-2.0f32], ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32, &[]);
            let input = if batch {
                ndx_input_t {
                    tensor: std::ptr::null(),
                    batch: b,
                }
            } else {
                t.input()
            };
            let f = invoke_one(ctx.0, c"nonneg", input);
            let mut out_t = std::ptr::null_mut();
            let mut out_b = std::ptr::null_mut();
            let consumer_input = if batch {
                ok(ndx_future_batch(f, 0, &mut out_b));
                ndx_input_t {
                    tensor: std::ptr::null(),
                    batch: out_b,
                }
            } else {
                ok(ndx_future_tensor(f, 0, &mut out_t));
                ndx_input_t {
                    tensor: out_t,
                    batch: std::ptr::null(),
                }
            };
            let mut g = std::ptr::null_mut();
            let e = ndx_invoke(
                ctx.0,
                c"neg".as_ptr(),
                &consumer_input,
                1,
                std::ptr::null(),
                std::ptr::null(),
                &mut g,
            );
            assert!(
                e.is_null(),
                "mode {mode}, batch {batch}: out of ndx_invoke: {:?}",
                common::take_error(e)
            );
            let w = ndx_future_wait(g, -1);
            // The upstream's kind, as every dependency failure has.
            assert_eq!(ndx_error_kind(w), ndx_error_kind_t::NDX_ERROR_VALUE as i32);
            assert_eq!(
                common::cstr(ndx_error_message(w)),
                "input 0 of 'neg' (#2) failed: it is the output of 'nonneg' (#1), which failed"
            );
            assert_eq!(common::cstr(ndx_error_op(w)), "neg");
            let cause = ndx_error_cause(w);
            assert_eq!(common::cstr(ndx_error_message(cause)), "negative input");
            assert_eq!(common::cstr(ndx_error_op(cause)), "nonneg");
            assert_eq!(ndx_error_sequence(cause), 1);
            assert_eq!(ndx_error_sample(cause), if batch { 1 } else { -1 });
            ndx_error_free(w);
            ndx_future_release(g);
            ndx_future_release(f);
            ndx_tensor_release(out_t);
            ndx_batch_release(out_b);
            ndx_batch_release(b);
        }
    }
}

/// `ndx_future_batch` past the last output says how many there are, in good English
/// as `ndx_future_tensor` does (it said "'neg' has 1 outputs").
#[test]
fn a_batch_output_index_out_of_range_counts_the_outputs() {
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let (b, _counts) = common::f32_batch(&[(&[1.0], &[1]), (&[2.0], &[1])]);
    let f = invoke_one(
        ctx.0,
        c"neg",
        ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        },
    );
    let mut out = std::ptr::null_mut();
    let got = common::take_error(ndx_future_batch(f, 1, &mut out));
    assert_eq!(
        got,
        Some((
            ndx_error_kind_t::NDX_ERROR_INDEX as i32,
            "output index 1 is out of range: 'neg' has 1 output".to_string()
        ))
    );
    assert!(out.is_null());
    ndx_future_release(f);
    ndx_batch_release(b);
}

/// A host kernel counting its calls (`user`: an `AtomicUsize`) and returning its input.
unsafe extern "C" fn count_and_pass(
    user: *mut c_void,
    inputs: *const *const ndx_tensor_t,
    n: usize,
    args: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    n_out: usize,
) -> *mut ndx_error_t {
    // SAFETY: `user` is the test's counter, alive while the context is.
    let calls = unsafe { &*user.cast::<std::sync::atomic::AtomicUsize>() };
    calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: forwarded as received.
    unsafe { pass_input(user, inputs, n, args, outputs, n_out) }
}

/// A per-sample host operator's pending batch output knows its size at enqueue (as
/// many samples as the input batch), and a host operator chained on it does not run it
/// at `ndx_invoke` (DEFERRED), as for tensors. Both ran the upstream host operator:
/// the size was asked of its data.
#[test]
fn a_host_operators_pending_batch_knows_its_size_without_running() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let ctx = common::Ctx::new(ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32);
    let first = AtomicUsize::new(0);
    let second = AtomicUsize::new(0);
    for (name, calls) in [(c"first", &first), (c"second", &second)] {
        ok(ndx_register_op(
            ctx.0,
            name.as_ptr(),
            &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
            Some(count_and_pass),
            std::ptr::from_ref(calls).cast_mut().cast(),
            None,
        ));
    }
    let (b, counts) = common::f32_batch(&[(&[1.0], &[1]), (&[2.0], &[1]), (&[3.0], &[1])]);
    let f1 = invoke_one(
        ctx.0,
        c"first",
        ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        },
    );
    let mut b1 = std::ptr::null_mut();
    ok(ndx_future_batch(f1, 0, &mut b1));
    let mut n = 0;
    ok(ndx_batch_size(b1, &mut n));
    assert_eq!(
        (n, first.load(SeqCst)),
        (3, 0),
        "ndx_batch_size ran 'first'"
    );
    let f2 = invoke_one(
        ctx.0,
        c"second",
        ndx_input_t {
            tensor: std::ptr::null(),
            batch: b1,
        },
    );
    assert_eq!(first.load(SeqCst), 0, "ndx_invoke of 'second' ran 'first'");
    ok(ndx_future_wait(f2, -1));
    let mut b2 = std::ptr::null_mut();
    ok(ndx_future_batch(f2, 0, &mut b2));
    let mut n2 = 0;
    ok(ndx_batch_size(b2, &mut n2));
    assert_eq!((n2, first.load(SeqCst), second.load(SeqCst)), (3, 3, 3));
    for handle in [b1, b2, b] {
        ndx_batch_release(handle);
    }
    ndx_future_release(f1);
    ndx_future_release(f2);
    drop(ctx);
    assert!(counts.iter().all(|c| common::calls(c) == 1));
}

/// An out batch of the wrong number of samples for a per-sample host operator is
/// refused at `ndx_invoke`, naming the out batch, as for a built-in operator. It was
/// taken, and the invocation failed in its future with "sample index 3 is out of range
/// for a batch of 3 samples" (an INDEX error naming neither the out batch nor the
/// number of samples expected).
#[test]
fn a_host_operators_out_batch_of_the_wrong_length_is_refused_at_invoke() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    for mode in 1..=4 {
        let ctx = common::Ctx::new(mode);
        let calls = AtomicUsize::new(0);
        ok(ndx_register_op(
            ctx.0,
            c"pass".as_ptr(),
            &one_in_one_out(0, std::ptr::null(), std::ptr::null()),
            Some(count_and_pass),
            std::ptr::from_ref(&calls).cast_mut().cast(),
            None,
        ));
        let four: Vec<(&[f32], &[i64])> = vec![(&[1.0], &[1]); 4];
        let three: Vec<(&[f32], &[i64])> = vec![(&[0.0], &[1]); 3];
        let (b, _c1) = common::f32_batch(&four);
        let (ob, _c2) = common::f32_batch(&three);
        let outputs = [ndx_output_t {
            tensor: std::ptr::null(),
            batch: ob,
        }];
        let opts = common::invoke_options(0, &outputs);
        let input = ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        };
        let mut f = std::ptr::null_mut();
        common::expect_err(
            ndx_invoke(
                ctx.0,
                c"pass".as_ptr(),
                &input,
                1,
                std::ptr::null(),
                &opts,
                &mut f,
            ),
            ndx_error_kind_t::NDX_ERROR_VALUE,
            "operator 'pass': outputs[0] is a batch of 3 samples, expected 4",
        );
        assert!(f.is_null());
        assert_eq!(calls.load(SeqCst), 0, "mode {mode}: the kernel ran");
        for s in 0..3 {
            let mut t = std::ptr::null_mut();
            ok(ndx_batch_sample(ob, s, &mut t));
            assert_eq!(
                common::values_f32(t),
                [0.0],
                "mode {mode}: sample {s} written"
            );
            ndx_tensor_release(t);
        }
        ndx_batch_release(ob);
        ndx_batch_release(b);
    }
}
