//! CUDA discovery and the errors of CUDA requests, through the C ABI. These run on
//! every machine: where no driver is present (CI) they check the "no driver" answers,
//! where one is they check the device-range answers.

mod common;

use common::*;
use dlpark::ffi::DLDeviceType;
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

fn driver_reason() -> Option<&'static str> {
    ndx::cuda::driver_absent_reason()
}

/// Returns from the calling test, saying why, where no CUDA driver is present.
macro_rules! skip_without_driver {
    () => {
        if let Some(why) = driver_reason() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// The tests of this file run on threads of one process and share device 0's pool.
/// Each holds this lock shared; the test that counts the pool's allocations holds it
/// alone, so no other test's allocations land between its rounds.
static DEVICE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared_device() -> std::sync::RwLockReadGuard<'static, ()> {
    DEVICE.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive_device() -> std::sync::RwLockWriteGuard<'static, ()> {
    DEVICE.write().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn device_count_and_check_agree() {
    let _device = shared_device();
    let n = ndx_cuda_device_count();
    assert!(n >= 0);
    match driver_reason() {
        Some(why) => {
            eprintln!("no usable CUDA driver here ({why}): checking the refusals");
            assert_eq!(n, 0);
            expect_err(ndx_cuda_device_check(0), NDX_ERROR_CUDA, why);
        }
        None => {
            ok(ndx_cuda_device_check(n - 1));
            let plural = if n == 1 { "device" } else { "devices" };
            expect_err(
                ndx_cuda_device_check(n + 2),
                NDX_ERROR_CUDA,
                &format!("device {} does not exist, {n} {plural} present", n + 2),
            );
        }
    }
    expect_err(ndx_cuda_device_check(-1), NDX_ERROR_CUDA, "");
}

#[test]
fn a_child_forked_after_cuda_was_set_up_does_not_use_it() {
    let _device = shared_device();
    // Needs a device: the driver is set up here, then the process forks. CUDA does not
    // support a fork after cuInit: the child sees no device, and says why.
    skip_without_driver!();
    assert!(ndx_cuda_device_count() > 0);
    // SAFETY: the child calls only two ndx functions and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let count = ndx_cuda_device_count();
        let refused = take_error(ndx_cuda_device_check(0)).is_some_and(|(kind, msg)| {
            kind == NDX_ERROR_CUDA as i32
                && msg.starts_with("CUDA was initialised before this process forked")
        });
        // SAFETY: leaving the child without running the harness's exit code.
        unsafe { libc::_exit(if count == 0 && refused { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our child's pid and a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child saw a device or no reason (status {status})"
    );
    // The parent keeps its devices.
    assert!(ndx_cuda_device_count() > 0);
    ok(ndx_cuda_device_check(0));
}

#[test]
fn without_a_driver_the_reason_is_the_missing_library() {
    let _device = shared_device();
    // CI has no libcuda: the message names it. (Elsewhere the other test covers it.)
    if let Some(why) = driver_reason()
        && std::env::var("NDX_CUDA_DISABLE").is_err()
    {
        assert!(
            why == "no CUDA driver found: libcuda.so could not be loaded"
                || why.starts_with("the CUDA driver was found but cuInit failed"),
            "{why}"
        );
    }
}

#[test]
fn computing_on_a_cuda_tensor_of_a_missing_device_fails_at_invoke() {
    let _device = shared_device();
    let mut spec = Spec::f32s(&[1.0, 2.0], &[2]);
    spec.device.device_type = DLDeviceType::CUDA;
    spec.device.device_id = 9;
    let (m, count) = spec.versioned();
    let mut t = std::ptr::null_mut();
    let e = ndx_tensor_from_dlpack_versioned(m, std::ptr::null(), &mut t);
    if driver_reason().is_none() {
        // With a driver, the import itself orders after the producer's stream on
        // device 9, which does not exist: refused there, the tensor left with its owner.
        let n = ndx_cuda_device_count();
        expect_err(
            e,
            NDX_ERROR_CUDA,
            &format!("tensor: device 9 does not exist, {n} device"),
        );
        assert!(t.is_null());
        assert_eq!(calls(&count), 0);
        drop_versioned(m);
        return;
    }
    ok(e);
    let ctx = Ctx::new(0);
    let (kind, msg) = invoke(&ctx, c"add", &[t, t], &[]).expect_err("refused at invoke");
    assert_eq!(kind, NDX_ERROR_CUDA as i32, "{msg}");
    let why = driver_reason().unwrap_or_default();
    let want = format!("operator 'add': input 0 lives in CUDA memory (kDLCUDA:9), but {why}");
    assert!(msg.starts_with(&want), "{msg}\nexpected: {want}");
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
}

fn import_opts(stream: usize) -> ndx_import_options_t {
    ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: std::ptr::null(),
        read_only: false,
        stream: stream as *mut std::ffi::c_void,
    }
}

const NO_SYNC: usize = usize::MAX;

#[test]
fn the_stream_is_ignored_for_host_memory() {
    let _device = shared_device();
    // A garbage stream value: host memory is never ordered, so it is never touched.
    let (m, count) = Spec::f32s(&[1.0, 2.0, 3.0], &[3]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        &import_opts(0x1234),
        &mut t,
    ));
    assert_eq!(values_f32(t), [1.0, 2.0, 3.0]);
    let mut out = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned_stream(
        t,
        0x1234 as *mut std::ffi::c_void,
        &mut out,
    ));
    assert!(!out.is_null());
    // SAFETY: a live export; its deleter is called once below.
    unsafe {
        let dl = &(*out).dl_tensor;
        assert_eq!(*dl.data.cast::<f32>().add(2), 3.0);
        ((*out).deleter.expect("deleter"))(out);
    }
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
}

#[test]
fn callers_of_the_shorter_options_struct_get_the_default_stream() {
    let _device = shared_device();
    let mut o = import_opts(0xdead_beef);
    o.struct_size = std::mem::offset_of!(ndx_import_options_t, stream);
    o.read_only = true;
    let (m, count) = Spec::f32s(&[4.0], &[1]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &o, &mut t));
    let mut ro = false;
    ok(ndx_tensor_is_read_only(t, &mut ro));
    assert!(ro, "the fields the shorter struct has are read");
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    o.struct_size -= 1;
    let (m, _count) = Spec::f32s(&[4.0], &[1]).versioned();
    expect_err(
        ndx_tensor_from_dlpack_versioned(m, &o, &mut t),
        NDX_ERROR_VALUE,
        &format!("opts->struct_size is {}", o.struct_size),
    );
    drop_versioned(m);
}

#[test]
fn cuda_imports_and_exports_with_streams() {
    let _device = shared_device();
    // Device 0 with the legacy default stream: without a driver nothing can be
    // pending, so the tensor is metadata; with one, an event is recorded on stream 0.
    // The data pointer is never dereferenced either way.
    let mut spec = Spec::f32s(&[1.0, 2.0], &[2]);
    spec.device.device_type = DLDeviceType::CUDA;
    let (m, count) = spec.versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &import_opts(0), &mut t));
    for stream in [0, NO_SYNC] {
        let mut out = std::ptr::null_mut();
        ok(ndx_tensor_to_dlpack_versioned_stream(
            t,
            stream as *mut std::ffi::c_void,
            &mut out,
        ));
        // SAFETY: a live export, released once.
        unsafe {
            assert_eq!((*out).dl_tensor.device.device_type, DLDeviceType::CUDA);
            ((*out).deleter.expect("deleter"))(out);
        }
    }
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    // A bulk import with one stream: one ordering for every sample.
    let specs: Vec<_> = (0..3)
        .map(|i| {
            let mut s = Spec::f32s(&[i as f32], &[1]);
            s.device.device_type = DLDeviceType::CUDA;
            s.versioned()
        })
        .collect();
    let ptrs: Vec<_> = specs.iter().map(|(m, _)| *m).collect();
    ndx_batch_release(import_batch(&ptrs, &import_opts(0)));
    for (_, c) in &specs {
        assert_eq!(calls(c), 1);
    }
}

#[test]
fn a_sample_on_another_device_is_named_and_nothing_is_taken() {
    let _device = shared_device();
    let specs: Vec<_> = (0..3)
        .map(|i| {
            let mut s = Spec::f32s(&[i as f32], &[1]);
            s.device.device_type = DLDeviceType::CUDA;
            s.device.device_id = if i == 2 { 1 } else { 0 };
            s.versioned()
        })
        .collect();
    let ptrs: Vec<_> = specs.iter().map(|(m, _)| *m).collect();
    let mut b = std::ptr::null_mut();
    expect_err(
        ndx_batch_from_dlpack_versioned(ptrs.as_ptr(), 3, &import_opts(0), &mut b),
        NDX_ERROR_VALUE,
        "tensors[2]",
    );
    assert!(b.is_null());
    for (m, c) in &specs {
        assert_eq!(calls(c), 0);
        drop_versioned(*m);
    }
}

#[test]
fn exporting_null_names_the_argument() {
    let _device = shared_device();
    let mut out = std::ptr::null_mut();
    expect_err(
        ndx_tensor_to_dlpack_versioned_stream(std::ptr::null(), std::ptr::null_mut(), &mut out),
        NDX_ERROR_VALUE,
        "argument 'tensor' is NULL",
    );
    assert!(out.is_null());
}

#[test]
fn every_kernel_loads_on_device_0() {
    let _device = shared_device();
    // Needs a GPU: the driver JIT-compiles the embedded PTX for it.
    skip_without_driver!();
    let dev = ndx::cuda::device(0).expect("device 0");
    let mut n = 0;
    for (module, _) in ndx::cuda::module::MODULES {
        for name in ndx::cuda::module::entries(module) {
            ndx::cuda::module::function(dev, module, name)
                .unwrap_or_else(|e| panic!("{module}.ptx: {name}: {}", e.message()));
            n += 1;
        }
    }
    assert!(n > 100, "{n} kernels");
    let e = ndx::cuda::module::function(dev, "binary", "ndx_no_such_kernel").unwrap_err();
    assert!(
        e.message()
            .contains("'ndx_no_such_kernel' is not in binary.ptx")
    );
}

#[test]
fn the_device_pool_reuses_blocks_and_names_sizes_on_exhaustion() {
    let _device = shared_device();
    // Needs a GPU.
    skip_without_driver!();
    let dev = ndx::cuda::device(0).expect("device 0");
    let mut pool = ndx::cuda::alloc::pool(dev).lock();
    let before = pool.stats();
    let b = pool.alloc(3 << 20, "kDLCUDA:0").expect("3 MiB");
    assert_ne!(b.ptr, 0);
    pool.free(b.ptr, b.bytes, Vec::new());
    let again = pool.alloc(3 << 20, "kDLCUDA:0").expect("3 MiB again");
    assert_eq!(again.ptr, b.ptr, "the cached block is reused");
    pool.free(again.ptr, again.bytes, Vec::new());
    assert_eq!(pool.stats().backend_allocs, before.backend_allocs + 1);
    let e = pool.alloc(1 << 50, "kDLCUDA:0").unwrap_err();
    assert_eq!(e.kind(), ndx::error::ErrorKind::Memory);
    assert!(
        e.message()
            .starts_with("CUDA out of memory on kDLCUDA:0: asked for 1024.00 TiB"),
        "{}",
        e.message()
    );
}

#[test]
fn a_kernel_runs_end_to_end_on_device_0() {
    let _device = shared_device();
    // Needs a GPU: pool memory, copies and a launch of ndx_add_f32 and its broadcast
    // form on ndx's stream, checked against the CPU, at two grid sizes.
    use ndx::cuda::launch::{Arg, Bcast2, copy_to_device, copy_to_host, launch, launch_grid};
    skip_without_driver!();
    let dev = ndx::cuda::device(0).expect("device 0");
    let n = 100_003usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 / (1.0 + i as f32)).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let mut pool = ndx::cuda::alloc::pool(dev).lock();
    let [da, db, dout] = [0; 3].map(|_| pool.alloc(n * 4, "kDLCUDA:0").expect("alloc"));
    drop(pool);
    copy_to_device(dev, da.ptr, &bytes(&a)).unwrap();
    copy_to_device(dev, db.ptr, &bytes(&b)).unwrap();
    let f = ndx::cuda::module::function(dev, "binary", "ndx_add_f32").unwrap();
    let args = [
        Arg::Ptr(dout.ptr),
        Arg::Ptr(da.ptr),
        Arg::Ptr(db.ptr),
        Arg::U64(n as u64),
        Arg::Ptr(0),
        Arg::Ptr(0),
    ];
    let mut got = vec![0u8; n * 4];
    for grid in [None, Some(3)] {
        match grid {
            None => launch(dev, f, n as u64, &args).unwrap(),
            Some(g) => launch_grid(dev, f, g, n as u64, &args).unwrap(),
        }
        copy_to_host(dev, &mut got, dout.ptr).unwrap();
        for i in (0..n).step_by(997) {
            let v = f32::from_ne_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(v, a[i] + b[i], "element {i}, grid {grid:?}");
        }
    }
    // Broadcasting: out[i, j] = a[j] + b[i] over a 2 x 3 view of the same buffers.
    let mut p = Bcast2 {
        ndim: 2,
        ..Default::default()
    };
    p.shape[..2].copy_from_slice(&[2, 3]);
    p.a_strides[..2].copy_from_slice(&[0, 1]);
    p.b_strides[..2].copy_from_slice(&[1, 0]);
    let fb = ndx::cuda::module::function(dev, "binary", "ndx_add_f32_bcast").unwrap();
    launch(
        dev,
        fb,
        6,
        &[
            Arg::Ptr(dout.ptr),
            Arg::Ptr(da.ptr),
            Arg::Ptr(db.ptr),
            Arg::U64(6),
            Arg::Bcast2(p),
            Arg::Ptr(0),
            Arg::Ptr(0),
        ],
    )
    .unwrap();
    let mut six = [0u8; 24];
    copy_to_host(dev, &mut six, dout.ptr).unwrap();
    for (k, got) in six.chunks_exact(4).enumerate() {
        let (i, j) = (k / 3, k % 3);
        let v = f32::from_ne_bytes(got.try_into().unwrap());
        assert_eq!(v, a[j] + b[i], "[{i}, {j}]");
    }
    let mut pool = ndx::cuda::alloc::pool(dev).lock();
    for blk in [da, db, dout] {
        pool.free(blk.ptr, blk.bytes, Vec::new());
    }
}

/// `op` on `inputs` with integer arguments `args` (a future, or the error).
fn invoke(
    ctx: &Ctx,
    op: &std::ffi::CStr,
    inputs: &[*const ndx_tensor_t],
    args: &[(&std::ffi::CStr, i64)],
) -> Result<*mut ndx_future_t, (i32, String)> {
    let mut a = std::ptr::null_mut();
    ok(ndx_args_new(&mut a));
    for (name, v) in args {
        ok(ndx_args_set_int(a, name.as_ptr(), *v));
    }
    let inputs: Vec<ndx_input_t> = inputs
        .iter()
        .map(|&tensor| ndx_input_t {
            tensor,
            batch: std::ptr::null(),
        })
        .collect();
    let r = invoke_with(ctx, op, &inputs, a, &ndx_invoke_options_t::default());
    ndx_args_free(a);
    r.map_err(|e| take_error(e).expect("an error"))
}

#[test]
fn to_device_refuses_a_missing_device_at_invoke_and_round_trips_on_a_present_one() {
    let _device = shared_device();
    let (m, count) = Spec::f32s(&[1.5, -2.0, 3.25], &[3]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    ));
    let ctx = Ctx::new(0);
    let n = i64::from(ndx_cuda_device_count());
    // A device past the count is refused at invoke, naming why.
    let (kind, msg) = invoke(&ctx, c"to_device", &[t], &[(c"device", n)]).unwrap_err();
    assert_eq!(kind, NDX_ERROR_CUDA as i32, "{msg}");
    let want = match driver_reason() {
        Some(why) => format!("operator 'to_device': {why}"),
        None => format!("operator 'to_device': device {n} does not exist, {n} device"),
    };
    assert!(msg.starts_with(&want), "{msg}\nexpected: {want}");
    let (kind, msg) = invoke(&ctx, c"to_device", &[t], &[(c"device", -1)]).unwrap_err();
    assert_eq!(kind, NDX_ERROR_VALUE as i32, "{msg}");
    assert!(
        msg.contains("'device' must be a CUDA device id (0 or more), got -1"),
        "{msg}"
    );
    if let Some(why) = driver_reason() {
        eprintln!("skipped the round trip: {why}");
    } else {
        // Host -> device -> add on the device -> host, through the C ABI.
        let up = invoke(&ctx, c"to_device", &[t], &[]).expect("to_device");
        let mut d = std::ptr::null_mut();
        ok(ndx_future_tensor(up, 0, &mut d));
        let mut dev = cpu();
        ok(ndx_tensor_device(d, &mut dev));
        assert_eq!((dev.device_type, dev.device_id), (DLDeviceType::CUDA, 0));
        let sum = invoke(&ctx, c"add", &[d, d], &[]).expect("add");
        let mut s = std::ptr::null_mut();
        ok(ndx_future_tensor(sum, 0, &mut s));
        let down = invoke(&ctx, c"to_host", &[s], &[]).expect("to_host");
        let mut h = std::ptr::null_mut();
        ok(ndx_future_tensor(down, 0, &mut h));
        assert_eq!(values_f32(h), [3.0, -4.0, 6.5]);
        for x in [d, s, h] {
            ndx_tensor_release(x);
        }
        for f in [up, sum, down] {
            ndx_future_release(f);
        }
    }
    ndx_tensor_release(t);
    drop(ctx);
    assert_eq!(calls(&count), 1);
}

#[test]
fn a_repeated_invocation_allocates_no_device_memory_in_steady_state() {
    let _device = exclusive_device();
    // Needs a device: outputs and temporaries come back to the pool and are reused.
    skip_without_driver!();
    let values: Vec<f32> = (0..5000).map(|i| i as f32).collect();
    let (m, count) = Spec::f32s(&values, &[50, 100]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    ));
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_FULL as i32);
    let up = invoke(&ctx, c"to_device", &[t], &[]).expect("to_device");
    let mut d = std::ptr::null_mut();
    ok(ndx_future_tensor(up, 0, &mut d));
    let dev = ndx::cuda::device(0).expect("device 0");
    let allocs = || ndx::cuda::alloc::pool(dev).lock().stats().backend_allocs;
    let mut seen = Vec::new();
    for _ in 0..6 {
        // A reduction (output and a partial-sums temporary), then its square.
        let f = invoke(&ctx, c"sum", &[d], &[]).expect("sum");
        let mut s = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 0, &mut s));
        let g = invoke(&ctx, c"mul", &[s, s], &[]).expect("mul");
        ok(ndx_future_wait(g, -1));
        ndx_tensor_release(s);
        ndx_future_release(f);
        ndx_future_release(g);
        seen.push(allocs());
    }
    assert!(
        seen[1..].iter().all(|&a| a == seen[1]),
        "cuMemAlloc calls after each round: {seen:?}"
    );
    ndx_tensor_release(d);
    ndx_future_release(up);
    ndx_tensor_release(t);
    drop(ctx);
    assert_eq!(calls(&count), 1);
}

#[test]
fn the_context_default_device_is_where_to_device_copies() {
    let _device = shared_device();
    let mut opts = ndx_context_options_t {
        cuda_device: -2,
        ..Default::default()
    };
    let mut ctx = std::ptr::null_mut();
    expect_err(
        ndx_context_new(&opts, &mut ctx),
        NDX_ERROR_VALUE,
        "opts->cuda_device is -2, not a CUDA device id (0 or more)",
    );
    assert!(ctx.is_null());
    let n = ndx_cuda_device_count();
    opts.cuda_device = n + 1;
    ok(ndx_context_new(&opts, &mut ctx));
    let ctx = Ctx(ctx);
    let (m, count) = Spec::f32s(&[1.0], &[1]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    ));
    let (kind, msg) = invoke(&ctx, c"to_device", &[t], &[]).unwrap_err();
    assert_eq!(kind, NDX_ERROR_CUDA as i32, "{msg}");
    let want = match driver_reason() {
        Some(why) => format!("operator 'to_device': {why}"),
        None => format!("operator 'to_device': device {} does not exist", n + 1),
    };
    assert!(msg.starts_with(&want), "{msg}\nexpected: {want}");
    ndx_tensor_release(t);
    drop(ctx);
    assert_eq!(calls(&count), 1);
}

#[test]
fn uploads_are_staged_through_a_bounded_set_of_pinned_blocks() {
    // Needs a device: host-to-device copies go through pinned blocks, in pieces, with
    // at most `staging::CAP` bytes pinned, and repeat uploads reuse the blocks.
    use ndx::cuda::launch::{copy_to_device, copy_to_host};
    use ndx::cuda::staging::{CAP, PIECE, staging};
    let _device = exclusive_device();
    skip_without_driver!();
    let dev = ndx::cuda::device(0).expect("device 0");
    // 2.5 pieces, and a small one that shares no block with them.
    let big: Vec<u8> = (0..PIECE * 5 / 2)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let small: Vec<u8> = (0..1000).map(|i| i as u8 ^ 0x5a).collect();
    let bytes = 10 * big.len() + small.len();
    let dst = ndx::cuda::alloc::take(dev, bytes).expect("device memory");
    let mut rounds = Vec::new();
    for round in 0..3 {
        // Ten big uploads back to back pin more than CAP if nothing were reused.
        for k in 0..10 {
            copy_to_device(dev, dst + (k * big.len()) as u64, &big).unwrap();
        }
        copy_to_device(dev, dst + (10 * big.len()) as u64, &small).unwrap();
        let mut got = vec![0u8; bytes];
        copy_to_host(dev, &mut got, dst).unwrap();
        for k in 0..10 {
            assert!(
                got[k * big.len()..(k + 1) * big.len()] == big[..],
                "upload {k} of round {round}"
            );
        }
        assert_eq!(got[10 * big.len()..], small[..], "round {round}");
        let s = staging(dev).stats();
        assert!(s.pinned <= CAP, "{s:?}");
        rounds.push(s);
    }
    // Every piece went through a pinned block; the later rounds allocated none.
    let last = rounds[2];
    assert_eq!(last.pageable, 0, "{last:?}");
    assert!(last.staged >= 3 * 31, "{last:?}");
    assert_eq!(rounds[1].allocated, last.allocated, "{rounds:?}");
    ndx::cuda::alloc::give_back(dev, dst, bytes, Vec::new());
}

/// The tensor of output 0 of `f` (a handle, pending or not).
fn out0(f: *mut ndx_future_t) -> *mut ndx_tensor_t {
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut t));
    t
}

#[test]
fn chains_of_gpu_invocations_are_pipelined_and_fail_with_their_producers() {
    let _device = shared_device();
    // Needs a device: EAGER and DEFERRED consumers run as soon as their producers'
    // work is enqueued; the values must still be those of the chain, in order.
    skip_without_driver!();
    let (m, count) = Spec::f32s(&[1.5, -2.0, 3.25], &[3]).versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    ));
    let (bad_m, bad_count) = Spec::f32s(&[1.0, f32::NAN, 2.0], &[3]).versioned();
    let mut bad = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        bad_m,
        std::ptr::null(),
        &mut bad,
    ));
    for mode in [4, 3] {
        let ctx = Ctx::new(mode);
        let up = invoke(&ctx, c"to_device", &[t], &[]).expect("to_device");
        let d = out0(up);
        // x + x, then + x twenty times: 22 x.
        let mut futures = vec![up, invoke(&ctx, c"add", &[d, d], &[]).expect("add")];
        let mut tensors = vec![d];
        for _ in 0..20 {
            let prev = out0(*futures.last().unwrap());
            tensors.push(prev);
            futures.push(invoke(&ctx, c"add", &[prev, d], &[]).expect("add"));
        }
        let last = out0(*futures.last().unwrap());
        let down = invoke(&ctx, c"to_host", &[last], &[]).expect("to_host");
        let h = out0(down);
        assert_eq!(values_f32(h), [33.0, -44.0, 71.5], "mode {mode}");
        tensors.extend([last, h]);
        futures.push(down);

        // A failing FAIL_FAST check fails the consumer enqueued behind it, as its cause.
        ok(ndx_context_set_checks(
            ctx.0,
            ndx_check_policy_t::NDX_CHECKS_FAIL_FAST as i32,
            ndx_check_category_t::NDX_CHECK_USER as u32,
            0,
        ));
        let bad_up = invoke(&ctx, c"to_device", &[bad], &[]).expect("to_device");
        let b = out0(bad_up);
        let checked = invoke(&ctx, c"check_finite", &[b], &[]).expect("check_finite");
        let k = out0(checked);
        let sum = invoke(&ctx, c"add", &[k, k], &[]).expect("add");
        let (kind, msg) = take_error(ndx_future_wait(sum, -1)).expect("the add fails");
        assert_eq!(kind, NDX_ERROR_CHECK as i32, "{msg}");
        assert!(
            msg.contains("failed: it is the output of 'check_finite'"),
            "mode {mode}: {msg}"
        );
        expect_err(
            ndx_future_wait(checked, -1),
            NDX_ERROR_CHECK,
            "1 of 3 elements not finite",
        );
        tensors.extend([b, k]);
        futures.extend([bad_up, checked, sum]);
        for x in tensors {
            ndx_tensor_release(x);
        }
        for f in futures {
            ndx_future_release(f);
        }
    }
    ndx_tensor_release(t);
    ndx_tensor_release(bad);
    assert_eq!(calls(&count), 1);
    assert_eq!(calls(&bad_count), 1);
}

/// Output 0 of `f`, a batch.
fn batch0(f: *mut ndx_future_t) -> *mut ndx_batch_t {
    let mut b = std::ptr::null_mut();
    ok(ndx_future_batch(f, 0, &mut b));
    b
}

/// Invokes `op` on batches.
fn invoke_batches(
    ctx: &Ctx,
    op: &std::ffi::CStr,
    batches: &[*mut ndx_batch_t],
) -> *mut ndx_future_t {
    let inputs: Vec<ndx_input_t> = batches
        .iter()
        .map(|&batch| ndx_input_t {
            tensor: std::ptr::null(),
            batch,
        })
        .collect();
    invoke_with(
        ctx,
        op,
        &inputs,
        std::ptr::null(),
        &ndx_invoke_options_t::default(),
    )
    .unwrap_or_else(|e| panic!("{op:?}: {:?}", take_error(e)))
}

/// The values of sample `i` of `b` (on the host).
fn sample_f32(b: *const ndx_batch_t, i: usize) -> Vec<f32> {
    let mut t = std::ptr::null_mut();
    ok(ndx_batch_sample(b, i, &mut t));
    let v = values_f32(t);
    ndx_tensor_release(t);
    v
}

#[test]
fn batch_chains_on_a_gpu_are_pipelined_and_fail_with_their_producers() {
    let _device = shared_device();
    // Needs a device: an EAGER or DEFERRED batch invocation reads its producer's
    // launched samples and enqueues behind them, as a tensor invocation does.
    skip_without_driver!();
    let (x, x_counts) = f32_batch(&[
        (&[1.0, 2.0], &[2]),
        (&[3.0], &[1]),
        (&[-4.0, 0.5, 6.0], &[3]),
    ]);
    let (bad, bad_counts) = f32_batch(&[(&[1.0], &[1]), (&[f32::NAN, 2.0], &[2])]);
    for mode in [4, 3] {
        let ctx = Ctx::new(mode);
        let up = invoke_batches(&ctx, c"to_device", &[x]);
        let d = batch0(up);
        let sq = invoke_batches(&ctx, c"mul", &[d, d]);
        let s = batch0(sq);
        let sum = invoke_batches(&ctx, c"add", &[s, d]);
        let r = batch0(sum);
        let down = invoke_batches(&ctx, c"to_host", &[r]);
        let h = batch0(down);
        assert_eq!(sample_f32(h, 0), [2.0, 6.0], "mode {mode}");
        assert_eq!(sample_f32(h, 1), [12.0], "mode {mode}");
        assert_eq!(sample_f32(h, 2), [12.0, 0.75, 42.0], "mode {mode}");

        // A failing FAIL_FAST check over a batch fails the consumer behind it.
        ok(ndx_context_set_checks(
            ctx.0,
            ndx_check_policy_t::NDX_CHECKS_FAIL_FAST as i32,
            ndx_check_category_t::NDX_CHECK_USER as u32,
            0,
        ));
        let bad_up = invoke_batches(&ctx, c"to_device", &[bad]);
        let b = batch0(bad_up);
        let checked = invoke_batches(&ctx, c"check_finite", &[b]);
        let k = batch0(checked);
        let doubled = invoke_batches(&ctx, c"add", &[k, k]);
        let (kind, msg) = take_error(ndx_future_wait(doubled, -1)).expect("the add fails");
        assert_eq!(kind, NDX_ERROR_CHECK as i32, "{msg}");
        assert!(
            msg.contains("failed: it is the output of 'check_finite'"),
            "mode {mode}: {msg}"
        );
        expect_err(ndx_future_wait(checked, -1), NDX_ERROR_CHECK, "not finite");
        for f in [up, sq, sum, down, bad_up, checked, doubled] {
            ndx_future_release(f);
        }
        for batch in [d, s, r, h, b, k] {
            ndx_batch_release(batch);
        }
    }
    ndx_batch_release(x);
    ndx_batch_release(bad);
    for c in x_counts.iter().chain(&bad_counts) {
        assert_eq!(calls(c), 1);
    }
}

/// Reruns test `name` of this binary in a child process on the emulated driver's
/// asynchronous streams with kernels `delay_ms` late (read at `cuInit`, so only a new
/// process gets them; a real driver ignores them), with `child_var` set; fails with
/// the child's output unless its one test passed.
fn rerun_with_slow_kernels(name: &str, child_var: &str, delay_ms: u32) {
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(child_var, "1")
        .env("NDX_EMU_ASYNC", "1")
        .env("NDX_EMU_KERNEL_DELAY_MS", delay_ms.to_string())
        .output()
        .expect("rerun the test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn managed_memory_is_read_by_the_host_only_after_its_producers_stream() {
    let _device = shared_device();
    // Needs a device. kDLCUDAManaged memory is host-accessible, so ndx reads it on the
    // host (ndx_tensor_copy_to, CPU operators): imported with a producer's stream, it
    // must wait for that stream to reach the import's event first. The producer here is
    // ndx's own stream with an `add` still running (slow, asynchronous kernels of the
    // emulated driver), whose output is exported and imported back as managed memory.
    skip_without_driver!();
    const CHILD: &str = "NDX_TEST_MANAGED_CHILD";
    if std::env::var_os(CHILD).is_none() {
        rerun_with_slow_kernels(
            "managed_memory_is_read_by_the_host_only_after_its_producers_stream",
            CHILD,
            300,
        );
        return;
    }
    let values: Vec<f32> = (1..=256).map(|i| i as f32).collect();
    let doubled: Vec<f32> = values.iter().map(|v| 2.0 * v).collect();
    let (m, count) = Spec::f32s(&values, &[256]).versioned();
    let mut host = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut host,
    ));
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let up = invoke(&ctx, c"to_device", &[host], &[]).expect("to_device");
    let d = out0(up);
    let stream = ndx::cuda::device(0).expect("device 0").stream();
    // A managed tensor whose contents an `add` on ndx's stream is still writing.
    let pending_managed = || {
        let sum = invoke(&ctx, c"add", &[d, d], &[]).expect("add"); // SYNC_CPU: enqueued
        let s = out0(sum);
        let mut exported = std::ptr::null_mut();
        ok(ndx_tensor_to_dlpack_versioned_stream(
            s,
            NO_SYNC as *mut std::ffi::c_void,
            &mut exported,
        ));
        // SAFETY: a live export this test owns until the import below takes it.
        unsafe { (*exported).dl_tensor.device.device_type = DLDeviceType::CUDAMANAGED };
        let mut t = std::ptr::null_mut();
        ok(ndx_tensor_from_dlpack_versioned(
            exported,
            &import_opts(stream),
            &mut t,
        ));
        ndx_tensor_release(s);
        ndx_future_release(sum);
        t
    };
    // Read by ndx_tensor_copy_to.
    let t = pending_managed();
    assert_eq!(values_f32(t), doubled);
    ndx_tensor_release(t);
    // Read by a CPU operator (a managed input next to a host one runs on the host).
    let t = pending_managed();
    let f = invoke(&ctx, c"add", &[t, host], &[]).expect("add on the host");
    let r = out0(f);
    let tripled: Vec<f32> = values.iter().map(|v| 3.0 * v).collect();
    assert_eq!(values_f32(r), tripled);
    for x in [t, r, d, host] {
        ndx_tensor_release(x);
    }
    ndx_future_release(f);
    ndx_future_release(up);
    drop(ctx);
    assert_eq!(calls(&count), 1);
}

#[test]
fn an_out_tensor_for_an_invocation_on_the_device_is_refused_at_invoke() {
    let _device = shared_device();
    // Needs a device: the outputs of an invocation on CUDA tensors live in device
    // memory, so a (host) out tensor cannot take them; ndx_invoke says so, in every
    // mode, and nothing is written. `to_host`, whose output is host memory, takes one.
    skip_without_driver!();
    let (m, count) = Spec::f32s(&[1.0, 2.0, 3.0], &[3]).versioned();
    let mut host = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut host,
    ));
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
    ] {
        let ctx = Ctx::new(mode as i32);
        let up = invoke(&ctx, c"to_device", &[host], &[]).expect("to_device");
        let d = out0(up);
        let mut sink = [0f32; 3];
        let mut o = std::ptr::null_mut();
        let shape = [3i64];
        ok(ndx_tensor_wrap_host(
            sink.as_mut_ptr().cast(),
            ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32,
            1,
            shape.as_ptr(),
            std::ptr::null(),
            None,
            std::ptr::null_mut(),
            std::ptr::null(),
            &mut o,
        ));
        let outs = [ndx_output_t {
            tensor: o,
            batch: std::ptr::null(),
        }];
        let opts = ndx_invoke_options_t {
            outputs: outs.as_ptr(),
            n_outputs: 1,
            ..Default::default()
        };
        let inputs = [d, d].map(|tensor| ndx_input_t {
            tensor,
            batch: std::ptr::null(),
        });
        let e = invoke_with(&ctx, c"add", &inputs, std::ptr::null(), &opts)
            .expect_err("refused at invoke");
        expect_err(
            e,
            NDX_ERROR_NOT_IMPLEMENTED,
            "operator 'add': outputs[0] is given, but the invocation runs on kDLCUDA:0 and \
             out tensors take host results only; leave it NULL and copy the output with \
             'to_host'",
        );
        // to_host writes into it.
        let f = invoke_with(&ctx, c"to_host", &inputs[..1], std::ptr::null(), &opts)
            .unwrap_or_else(|e| panic!("{:?}", take_error(e)));
        ok(ndx_future_wait(f, -1));
        assert_eq!(sink, [1.0, 2.0, 3.0], "{mode:?}");
        ndx_future_release(f);
        ndx_tensor_release(o);
        ndx_tensor_release(d);
        ndx_future_release(up);
    }
    ndx_tensor_release(host);
    assert_eq!(calls(&count), 1);
}

/// The stream the probe deleter queries: 0 for ndx's own stream of device 0, else a
/// test's consumer stream (a raw `CUstream`). Each test using the probe runs alone in a
/// child process, so one set of these serves them all.
static PROBED_STREAM: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// What that stream was doing when the probe deleter ran: -1 not run yet, 1 idle (every
/// enqueued work done), 0 still busy.
static STREAM_IDLE_AT_DELETE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// The deleter the probe replaced (a producer's, or ndx's of an export).
static PROBED_DELETER: std::sync::OnceLock<
    unsafe extern "C" fn(*mut dlpark::ffi::DLManagedTensorVersioned),
> = std::sync::OnceLock::new();

/// A deleter that notes whether the probed stream still has work, then calls the one
/// it replaced.
unsafe extern "C" fn probe_deleter(m: *mut dlpark::ffi::DLManagedTensorVersioned) {
    let device = ndx::cuda::device(0).expect("device 0");
    device.bind().expect("bind");
    let stream = match PROBED_STREAM.load(std::sync::atomic::Ordering::SeqCst) {
        0 => device.stream() as usize,
        s => s,
    };
    // SAFETY: a live stream (ndx's or the test's), queried with its context current.
    let r = unsafe { cudarc::driver::sys::cuStreamQuery(stream as _) };
    let idle = r == cudarc::driver::sys::CUresult::CUDA_SUCCESS;
    STREAM_IDLE_AT_DELETE.store(i32::from(idle), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the replaced deleter, called once with its tensor.
    unsafe { PROBED_DELETER.get().expect("saved")(m) }
}

#[test]
fn an_import_read_by_an_invocation_that_failed_part_way_is_released_after_its_work() {
    let _device = shared_device();
    // Needs a device. `add` of imported uint8 and float32 first casts the import on the
    // device, then asks for an output too large for any device (1 TiB): it fails with
    // NDX_ERROR_MEMORY while the cast kernel reading the import may still be queued
    // (slow asynchronous kernels of the emulated driver). The producer's deleter may
    // free the memory, so it must run only once that kernel is done.
    skip_without_driver!();
    const CHILD: &str = "NDX_TEST_PART_WAY_CHILD";
    if std::env::var_os(CHILD).is_none() {
        rerun_with_slow_kernels(
            "an_import_read_by_an_invocation_that_failed_part_way_is_released_after_its_work",
            CHILD,
            // Longer than the debug build takes from the cast's launch to the release.
            3000,
        );
        return;
    }
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let host_tensor = |spec: Spec| {
        let (m, count) = spec.versioned();
        let mut t = std::ptr::null_mut();
        ok(ndx_tensor_from_dlpack_versioned(
            m,
            std::ptr::null(),
            &mut t,
        ));
        (t, count)
    };
    // The producer's memory: 1 MiB of uint8 [1 << 20, 1], exported by ndx itself.
    let mut bytes = Spec::f32s(&[], &[0]);
    bytes.data = vec![7u8; 1 << 20];
    bytes.dtype = dlpark::ffi::DLDataType {
        code: dlpark::ffi::DLDataTypeCode::UINT,
        bits: 8,
        lanes: 1,
    };
    bytes.shape = vec![1 << 20, 1];
    let (h, hc) = host_tensor(bytes);
    let up = invoke(&ctx, c"to_device", &[h], &[]).expect("to_device");
    let d = out0(up);
    let mut exported = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned_stream(
        d,
        NO_SYNC as *mut std::ffi::c_void,
        &mut exported,
    ));
    // SAFETY: a live export this test owns until the import below takes it.
    unsafe {
        let _ = PROBED_DELETER.set((*exported).deleter.expect("deleter"));
        (*exported).deleter = Some(probe_deleter);
    }
    let mut a = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        exported,
        &import_opts(NO_SYNC),
        &mut a,
    ));
    let (bh, bc) = host_tensor(Spec::f32s(&vec![1.0; 1 << 18], &[1, 1 << 18]));
    let bup = invoke(&ctx, c"to_device", &[bh], &[]).expect("to_device");
    let b = out0(bup);
    let f = invoke(&ctx, c"add", &[a, b], &[]).expect("enqueued");
    let (kind, msg) = take_error(ndx_future_wait(f, -1)).expect("out of memory");
    assert_eq!(kind, NDX_ERROR_MEMORY as i32, "{msg}");
    assert!(msg.contains("CUDA out of memory on kDLCUDA:0"), "{msg}");
    ndx_tensor_release(a); // the last reference: the producer's deleter runs
    assert_eq!(
        STREAM_IDLE_AT_DELETE.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the deleter ran while the cast kernel reading the memory was still queued"
    );
    ndx_future_release(f);
    for t in [d, b, h, bh] {
        ndx_tensor_release(t);
    }
    for f in [up, bup] {
        ndx_future_release(f);
    }
    drop(ctx);
    assert_eq!((calls(&hc), calls(&bc)), (1, 1));
}

/// The values of an int64 tensor (host memory).
fn values_i64(t: *const ndx_tensor_t) -> Vec<i64> {
    let mut n = 0usize;
    ok(ndx_tensor_numel(t, &mut n));
    let mut v = vec![0i64; n];
    ok(ndx_tensor_copy_to(t, v.as_mut_ptr().cast(), n * 8));
    v
}

#[test]
fn the_accuracy_fault_perturbs_outputs_computed_on_the_device() {
    let _device = shared_device();
    // Needs a device. `inject_accuracy_error:OP` adds 1 to OP's outputs; on CUDA
    // tensors as on host ones (float32, an int64 sum of int32, and to_host itself).
    skip_without_driver!();
    let (m, count) = Spec::f32s(&[1.0, 2.0, 3.0], &[3]).versioned();
    let mut host = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut host,
    ));
    let mut ints = Spec::f32s(&[], &[0]);
    ints.data = [5i32, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    ints.dtype = i32_dtype();
    ints.shape = vec![3];
    let (mi, ci) = ints.versioned();
    let mut host_i = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        mi,
        std::ptr::null(),
        &mut host_i,
    ));
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
    ] {
        let ctx = Ctx::new(mode as i32);
        let run = |backend: &std::ffi::CStr, op: &std::ffi::CStr, x: *const ndx_tensor_t| {
            ok(ndx_context_set_backend(ctx.0, backend.as_ptr()));
            let up = invoke(&ctx, c"to_device", &[x], &[]).expect("to_device");
            let d = out0(up);
            let inputs: Vec<*const ndx_tensor_t> = if op == c"add" { vec![d, d] } else { vec![d] };
            let f = invoke(&ctx, op, &inputs, &[]).expect("invoke");
            let y = out0(f);
            let (g, r) = if op == c"to_host" {
                (std::ptr::null_mut(), y)
            } else {
                let g = invoke(&ctx, c"to_host", &[y], &[]).expect("to_host");
                (g, out0(g))
            };
            ok(ndx_future_wait(f, -1));
            ndx_tensor_release(d);
            if y != r {
                ndx_tensor_release(y);
            }
            for f in [up, f, g] {
                ndx_future_release(f);
            }
            r
        };
        let r = run(c"inject_accuracy_error:add", c"add", host);
        assert_eq!(values_f32(r), [3.0, 5.0, 7.0], "{mode:?}");
        ndx_tensor_release(r);
        let r = run(c"inject_accuracy_error:sum", c"sum", host_i);
        assert_eq!(values_i64(r), [19], "{mode:?}");
        ndx_tensor_release(r);
        let r = run(c"inject_accuracy_error:to_host", c"to_host", host);
        assert_eq!(values_f32(r), [2.0, 3.0, 4.0], "{mode:?}");
        ndx_tensor_release(r);
        // Another operator's outputs are left alone.
        let r = run(c"inject_accuracy_error:mul", c"add", host);
        assert_eq!(values_f32(r), [2.0, 4.0, 6.0], "{mode:?}");
        ndx_tensor_release(r);
    }
    ndx_tensor_release(host);
    ndx_tensor_release(host_i);
    assert_eq!((calls(&count), calls(&ci)), (1, 1));
}

#[test]
fn batch_to_tensor_on_device_samples_is_refused_at_invoke() {
    let _device = shared_device();
    // Needs a device. Stacking has no CUDA kernel: device samples are refused at
    // ndx_invoke (they used to be accepted and fail when the host kernel ran), and a
    // device sample among host ones names the host one to move.
    skip_without_driver!();
    let (m, count) = Spec::f32s(&[1.0, 2.0], &[2]).versioned();
    let mut h = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut h,
    ));
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
    ] {
        let ctx = Ctx::new(mode as i32);
        let up = invoke(&ctx, c"to_device", &[h], &[]).expect("to_device");
        let d = out0(up);
        let (kind, msg) = invoke(&ctx, c"batch_to_tensor", &[d, d], &[]).unwrap_err();
        assert_eq!(kind, NDX_ERROR_NOT_IMPLEMENTED as i32, "{mode:?}: {msg}");
        assert_eq!(
            msg,
            "operator 'batch_to_tensor': no CUDA kernel for float32 on kDLCUDA:0"
        );
        let (kind, msg) = invoke(&ctx, c"batch_to_tensor", &[d, h], &[]).unwrap_err();
        assert_eq!(kind, NDX_ERROR_VALUE as i32, "{mode:?}: {msg}");
        assert!(msg.contains("input 1 is in host memory"), "{msg}");
        ndx_tensor_release(d);
        ndx_future_release(up);
    }
    ndx_tensor_release(h);
    assert_eq!(calls(&count), 1);
}

#[test]
fn a_missing_kernel_for_a_promoted_dtype_names_the_inputs_dtypes() {
    let _device = shared_device();
    // Needs a device. int32 + float32 promotes to float64, which has no CUDA kernel:
    // the refusal names float64 and where it came from, not only a dtype the caller
    // never passed.
    skip_without_driver!();
    let (m, count) = Spec::f32s(&[1.0, 2.0], &[2]).versioned();
    let mut f = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut f,
    ));
    let mut ints = Spec::f32s(&[], &[0]);
    ints.data = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    ints.dtype = i32_dtype();
    ints.shape = vec![2];
    let (mi, ci) = ints.versioned();
    let mut i = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        mi,
        std::ptr::null(),
        &mut i,
    ));
    let ctx = Ctx::new(0);
    let (uf, ui) = (
        invoke(&ctx, c"to_device", &[f], &[]).expect("to_device"),
        invoke(&ctx, c"to_device", &[i], &[]).expect("to_device"),
    );
    let (df, di) = (out0(uf), out0(ui));
    let (kind, msg) = invoke(&ctx, c"add", &[di, df], &[]).unwrap_err();
    assert_eq!(kind, NDX_ERROR_NOT_IMPLEMENTED as i32, "{msg}");
    assert_eq!(
        msg,
        "operator 'add': no CUDA kernel for float64 on kDLCUDA:0 (int32 and float32 promote to it)"
    );
    for t in [df, di, f, i] {
        ndx_tensor_release(t);
    }
    for u in [uf, ui] {
        ndx_future_release(u);
    }
    drop(ctx);
    assert_eq!((calls(&count), calls(&ci)), (1, 1));
}

/// Whether device 0 is the emulated driver of tests/cuda_emu (whose kernels can be
/// made late; a real GPU runs these tests' kernels in microseconds).
fn emulated() -> bool {
    use cudarc::driver::sys;
    let mut name = [0 as std::ffi::c_char; 64];
    // SAFETY: the driver is initialised (a device was found); a valid buffer and length.
    let r = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 64, 0) };
    // SAFETY: on success the driver wrote a NUL-terminated name into the buffer.
    r == sys::CUresult::CUDA_SUCCESS
        && unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_bytes() == b"ndx emulated GPU"
}

/// How `exported_memory_is_reused_only_after_the_consumers_queued_work` exports, and
/// on which stream its consumer reads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Consumer {
    /// `ndx_tensor_to_dlpack_versioned_stream` with the consumer's own stream.
    OwnStream,
    /// `ndx_tensor_to_dlpack_versioned`: the legacy default stream.
    Versioned,
    /// `ndx_tensor_to_dlpack` (legacy DLPack): the legacy default stream.
    Legacy,
    /// The consumer's own stream, destroyed before the deleter runs: no event can be
    /// recorded there, and the deleter synchronises the context instead.
    DestroyedStream,
    /// `NDX_STREAM_NO_SYNC`, the deleter called too early (against the contract): the
    /// negative control, which sees the overwrite.
    NoSyncTooEarly,
}

#[test]
fn exported_memory_is_reused_only_after_the_consumers_queued_work() {
    let _device = shared_device();
    // Needs a device. A consumer of an exported CUDA tensor enqueues a kernel reading
    // it on its stream (1 s late, on the emulated driver's asynchronous streams) and
    // calls the deleter at once, as PyTorch does when its tensor dies. ndx's next
    // allocation of the size class reuses the block and uploads other values into it;
    // that upload must wait for the consumer's kernel, or the kernel reads them.
    skip_without_driver!();
    const CHILD: &str = "NDX_TEST_CONSUMER_REUSE_CHILD";
    if std::env::var_os(CHILD).is_none() {
        rerun_with_slow_kernels(
            "exported_memory_is_reused_only_after_the_consumers_queued_work",
            CHILD,
            1000,
        );
        return;
    }
    use cudarc::driver::sys;
    const N: usize = 256;
    let dev = ndx::cuda::device(0).expect("device 0");
    let add = ndx::cuda::module::function(dev, "binary", "ndx_add_f32").expect("ndx_add_f32");
    let emulated = emulated();
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_FULL as i32);
    let mut counts = Vec::new();
    let mut upload = |values: &[f32]| {
        let (m, count) = Spec::f32s(values, &[N as i64]).versioned();
        counts.push(count);
        let mut host = std::ptr::null_mut();
        ok(ndx_tensor_from_dlpack_versioned(
            m,
            std::ptr::null(),
            &mut host,
        ));
        let f = invoke(&ctx, c"to_device", &[host], &[]).expect("to_device");
        let d = out0(f);
        ndx_future_release(f);
        ndx_tensor_release(host);
        d
    };
    let data_ptr = |t: *const ndx_tensor_t| {
        let mut m = std::ptr::null_mut();
        ok(ndx_tensor_to_dlpack_versioned_stream(
            t,
            NO_SYNC as *mut std::ffi::c_void,
            &mut m,
        ));
        // SAFETY: a live export, released once (its consumer used nothing).
        unsafe {
            let p = (*m).dl_tensor.data as u64;
            ((*m).deleter.expect("deleter"))(m);
            p
        }
    };
    let original: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let other: Vec<f32> = (0..N).map(|i| 1000.0 + i as f32).collect();
    let twice = |v: &[f32]| v.iter().map(|x| 2.0 * x).collect::<Vec<f32>>();
    dev.bind().expect("bind");
    let mut sums: sys::CUdeviceptr = 0;
    // SAFETY: a current context and a valid out-pointer.
    assert_eq!(
        unsafe { sys::cuMemAlloc_v2(&mut sums, N * 4) },
        sys::CUresult::CUDA_SUCCESS
    );
    let mut cases = vec![Consumer::OwnStream, Consumer::Versioned, Consumer::Legacy];
    if emulated {
        // A real driver's answer for a destroyed stream's handle is undefined, and a
        // real GPU runs the consumer's kernel before ndx's upload: no overwrite to see.
        cases.extend([Consumer::DestroyedStream, Consumer::NoSyncTooEarly]);
    }
    for case in cases {
        let x = upload(&original);
        let mut stream: sys::CUstream = std::ptr::null_mut();
        if matches!(
            case,
            Consumer::OwnStream | Consumer::DestroyedStream | Consumer::NoSyncTooEarly
        ) {
            dev.bind().expect("bind");
            // SAFETY: a current context and a valid out-pointer.
            let r = unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
                )
            };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        }
        // The export; the deleter to call once the consumer's kernel is enqueued.
        let mut versioned = std::ptr::null_mut();
        let mut legacy = std::ptr::null_mut();
        match case {
            Consumer::OwnStream | Consumer::DestroyedStream => ok(
                ndx_tensor_to_dlpack_versioned_stream(x, stream.cast(), &mut versioned),
            ),
            Consumer::NoSyncTooEarly => ok(ndx_tensor_to_dlpack_versioned_stream(
                x,
                NO_SYNC as *mut std::ffi::c_void,
                &mut versioned,
            )),
            Consumer::Versioned => ok(ndx_tensor_to_dlpack_versioned(x, &mut versioned)),
            Consumer::Legacy => ok(ndx_tensor_to_dlpack(x, &mut legacy)),
        }
        ndx_tensor_release(x); // the export holds the memory now
        // SAFETY: live exports, each released once below.
        let p = unsafe {
            if versioned.is_null() {
                (*legacy).dl_tensor.data as u64
            } else {
                (*versioned).dl_tensor.data as u64
            }
        };
        // The consumer: sums = p + p, on its stream, late on the emulated driver.
        let mut params = [sums, p, p, N as u64, 0, 0];
        let mut ptrs: Vec<*mut std::ffi::c_void> =
            params.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        dev.bind().expect("bind");
        // SAFETY: ndx_add_f32 of ABI.md (out, a, b, n, check flags NULL), each parameter
        // a live u64 until the call returns; the stream is the consumer's (or 0).
        let r = unsafe {
            sys::cuLaunchKernel(
                add.raw(),
                1,
                1,
                1,
                256,
                1,
                1,
                0,
                stream,
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{case:?}");
        if case == Consumer::DestroyedStream {
            // SAFETY: the stream this test created, destroyed once.
            let r = unsafe { sys::cuStreamDestroy_v2(stream) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        }
        // SAFETY: the exports' own deleters, called once, with the kernel still queued.
        unsafe {
            if versioned.is_null() {
                ((*legacy).deleter.expect("deleter"))(legacy);
            } else {
                ((*versioned).deleter.expect("deleter"))(versioned);
            }
        }
        // ndx's next allocation of the class takes the block back and writes it.
        let y = upload(&other);
        assert_eq!(data_ptr(y), p, "{case:?}: the block is reused");
        dev.bind().expect("bind");
        // SAFETY: a live context; the consumer's kernel is done after this.
        assert_eq!(
            unsafe { sys::cuCtxSynchronize() },
            sys::CUresult::CUDA_SUCCESS
        );
        let mut got = vec![0f32; N];
        // SAFETY: `sums` holds N floats; `got` is a live buffer of N floats.
        let r = unsafe { sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), sums, N * 4) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        if case == Consumer::NoSyncTooEarly {
            assert_eq!(
                got,
                twice(&other),
                "the control: a deleter called before the consumer's work completed lets the memory be overwritten"
            );
        } else {
            assert_eq!(
                got,
                twice(&original),
                "{case:?}: the consumer's kernel read memory ndx had already reused"
            );
        }
        let back = invoke(&ctx, c"to_host", &[y], &[]).expect("to_host");
        let h = out0(back);
        assert_eq!(values_f32(h), other, "{case:?}");
        ndx_tensor_release(h);
        ndx_future_release(back);
        ndx_tensor_release(y);
        if matches!(case, Consumer::OwnStream | Consumer::NoSyncTooEarly) {
            // SAFETY: the stream this test created, destroyed once.
            assert_eq!(
                unsafe { sys::cuStreamDestroy_v2(stream) },
                sys::CUresult::CUDA_SUCCESS
            );
        }
    }
    dev.bind().expect("bind");
    // SAFETY: the buffer this test allocated, freed once, its kernels done.
    assert_eq!(
        unsafe { sys::cuMemFree_v2(sums) },
        sys::CUresult::CUDA_SUCCESS
    );
    drop(ctx);
    assert!(counts.iter().all(|c| calls(c) == 1));
}

#[test]
fn a_reexported_imports_producer_deleter_waits_for_the_consumer() {
    let _device = shared_device();
    // Needs a device. CUDA memory a producer lent to ndx is exported on to a consumer,
    // whose kernel reading it is still queued (1 s late on the emulated driver's
    // asynchronous streams) when it calls the deleter. ndx then holds no reference, so
    // it releases the import: the producer's deleter may free or reuse the memory, so
    // it must run only once the consumer's kernel is done.
    skip_without_driver!();
    const CHILD: &str = "NDX_TEST_REEXPORT_CHILD";
    if std::env::var_os(CHILD).is_none() {
        rerun_with_slow_kernels(
            "a_reexported_imports_producer_deleter_waits_for_the_consumer",
            CHILD,
            1000,
        );
        return;
    }
    use cudarc::driver::sys;
    const N: usize = 256;
    let dev = ndx::cuda::device(0).expect("device 0");
    let add = ndx::cuda::module::function(dev, "binary", "ndx_add_f32").expect("ndx_add_f32");
    let values: Vec<f32> = (0..N).map(|i| i as f32).collect();
    dev.bind().expect("bind");
    let (mut lent, mut sums): (sys::CUdeviceptr, sys::CUdeviceptr) = (0, 0);
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a current context, valid out-pointers, `values` holds N floats.
    unsafe {
        assert_eq!(
            sys::cuMemAlloc_v2(&mut lent, N * 4),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemAlloc_v2(&mut sums, N * 4),
            sys::CUresult::CUDA_SUCCESS
        );
        let r = sys::cuMemcpyHtoD_v2(lent, values.as_ptr().cast(), N * 4);
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint;
        assert_eq!(
            sys::cuStreamCreate(&mut stream, flags),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    PROBED_STREAM.store(stream as usize, std::sync::atomic::Ordering::SeqCst);
    // The producer's tensor: device memory `lent`, with the probe as its deleter.
    let mut spec = Spec::f32s(&values, &[N as i64]);
    spec.device.device_type = DLDeviceType::CUDA;
    let (m, count) = spec.versioned();
    // SAFETY: a live producer tensor this test owns until the import takes it.
    unsafe {
        (*m).dl_tensor.data = lent as *mut std::ffi::c_void;
        let _ = PROBED_DELETER.set((*m).deleter.expect("deleter"));
        (*m).deleter = Some(probe_deleter);
    }
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        &import_opts(NO_SYNC),
        &mut t,
    ));
    let mut out = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned_stream(
        t,
        stream.cast(),
        &mut out,
    ));
    ndx_tensor_release(t); // the export holds the import now
    let mut params = [sums, lent, lent, N as u64, 0, 0];
    let mut ptrs: Vec<*mut std::ffi::c_void> =
        params.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    dev.bind().expect("bind");
    // SAFETY: ndx_add_f32 of ABI.md (out, a, b, n, check flags NULL), each parameter a
    // live u64 until the call returns, on the test's stream.
    let r = unsafe {
        sys::cuLaunchKernel(
            add.raw(),
            1,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: the export's own deleter, called once, the kernel still queued.
    unsafe { ((*out).deleter.expect("deleter"))(out) };
    assert_eq!(calls(&count), 1, "the import is released");
    assert_eq!(
        STREAM_IDLE_AT_DELETE.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the producer's deleter ran while the consumer's kernel reading the memory was still queued"
    );
    let mut got = vec![0f32; N];
    dev.bind().expect("bind");
    // SAFETY: the test's stream, buffers of N floats, each freed once.
    unsafe {
        assert_eq!(
            sys::cuStreamSynchronize(stream),
            sys::CUresult::CUDA_SUCCESS
        );
        let r = sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), sums, N * 4);
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuStreamDestroy_v2(stream), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuMemFree_v2(sums), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuMemFree_v2(lent), sys::CUresult::CUDA_SUCCESS);
    }
    assert_eq!(got, values.iter().map(|v| 2.0 * v).collect::<Vec<f32>>());
}

/// Frame 0 of `e`: (file, line).
#[cfg(feature = "test-hooks")]
fn frame0(e: *const ndx_error_t) -> (String, u32) {
    let f = frame(e, 0);
    let file = (!f.file.is_null()).then(|| cstr(f.file));
    (file.unwrap_or_default(), f.line)
}

#[cfg(feature = "test-hooks")]
#[test]
fn the_debug_backend_checks_invocations_on_cuda_tensors() {
    // The fault hook is process-wide: no other test may run an operator meanwhile.
    let _device = exclusive_device();
    // Needs a device. The built-in CUDA kernels keep their promises, so the test hook
    // makes one run misbehave as a faulty kernel would; the `debug` backend must then
    // fail that invocation with NDX_ERROR_BACKEND at its enqueue site, in every mode,
    // while the default backend trusts it.
    skip_without_driver!();
    use ndx_test_cuda_fault_t::*;
    let values: Vec<f32> = (1..=8).map(|i| i as f32).collect();
    let (m, count) = Spec::f32s(&values, &[2, 4]).versioned();
    let mut host = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut host,
    ));
    let cases = [
        (
            c"add",
            NDX_TEST_CUDA_FAULT_WRITES_INPUT,
            "wrote into its input 0 (shape [2, 4], dtype float32): inputs are never written",
        ),
        (
            c"sum",
            NDX_TEST_CUDA_FAULT_ALIASES_INPUT,
            "output 0 shares memory with input 0; a schema without NDX_OP_OUTPUTS_MAY_ALIAS promises new memory",
        ),
        (
            c"add",
            NDX_TEST_CUDA_FAULT_WRONG_DTYPE,
            "output 0 has dtype int32, its schema declares float32",
        ),
        (
            c"add",
            NDX_TEST_CUDA_FAULT_WRONG_SHAPE,
            "output 0 has shape [8], its schema declares shape [2, 4]",
        ),
        (
            c"add",
            NDX_TEST_CUDA_FAULT_WRONG_LAYOUT,
            "output 0 has layout \"WW\", its schema declares \"\"",
        ),
    ];
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_SYNC_FULL,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
    ] {
        for debug in [false, true] {
            for (op, fault, fragment) in cases {
                let ctx = Ctx::new(mode as i32);
                if debug {
                    ok(ndx_context_set_backend(ctx.0, c"debug".as_ptr()));
                }
                let up = invoke(&ctx, c"to_device", &[host], &[]).expect("to_device");
                let d = out0(up);
                let inputs: Vec<ndx_input_t> = (0..if op == c"add" { 2 } else { 1 })
                    .map(|_| ndx_input_t {
                        tensor: d,
                        batch: std::ptr::null(),
                    })
                    .collect();
                ok(ndx_test_cuda_fault(op.as_ptr(), fault as i32));
                let line = line!() + 1;
                let opts = ndx_invoke_options_t {
                    location: ndx_location_t {
                        file: c"app.c".as_ptr(),
                        line,
                        function: c"main".as_ptr(),
                    },
                    ..Default::default()
                };
                let args = std::ptr::null();
                let f = invoke_with(&ctx, op, &inputs, args, &opts).expect("enqueued");
                let e = ndx_future_wait(f, -1);
                let what = format!("{mode:?}, debug {debug}, {fault:?}");
                if debug {
                    assert!(!e.is_null(), "{what}: the violation is reported");
                    assert_eq!(ndx_error_kind(e), NDX_ERROR_BACKEND as i32, "{what}");
                    // SAFETY: the live error's message and op are C strings.
                    let (msg, eop) = unsafe {
                        (
                            std::ffi::CStr::from_ptr(ndx_error_message(e)),
                            std::ffi::CStr::from_ptr(ndx_error_op(e)),
                        )
                    };
                    let want = format!(
                        "debug backend: operator '{}' {fragment}",
                        op.to_str().unwrap()
                    );
                    assert_eq!(msg.to_str().unwrap(), want, "{what}");
                    assert_eq!(eop, op, "{what}");
                    assert_eq!(
                        ndx_error_sequence(e),
                        2,
                        "{what}: the invocation's own number"
                    );
                    assert_eq!(frame0(e), ("app.c".to_string(), line), "{what}");
                    ndx_error_free(e);
                } else {
                    ok(e);
                }
                ndx_future_release(f);
                ndx_tensor_release(d);
                ndx_future_release(up);
                // The fault was used up: the next run is clean, and passes the checks
                // with the right values.
                let up = invoke(&ctx, c"to_device", &[host], &[]).expect("to_device");
                let d = out0(up);
                let f = invoke(&ctx, c"add", &[d, d], &[]).expect("add");
                let y = out0(f);
                let g = invoke(&ctx, c"to_host", &[y], &[]).expect("to_host");
                let r = out0(g);
                let doubled: Vec<f32> = values.iter().map(|v| 2.0 * v).collect();
                assert_eq!(values_f32(r), doubled, "{what}");
                for t in [d, y, r] {
                    ndx_tensor_release(t);
                }
                for f in [up, f, g] {
                    ndx_future_release(f);
                }
            }
        }
    }
    ndx_tensor_release(host);
    assert_eq!(calls(&count), 1);
}
