//! The error object through the C API, called from Rust: kinds, ownership of causes,
//! clone, traceback text, and native capture sites that point at the caller.

mod common;

use common::{cstr, expect_err, frame};
use ndx::error::{Error, ErrorKind, Site};
use ndx::ffi::*;

fn format(e: *const ndx_error_t) -> String {
    let need = ndx_error_format(e, std::ptr::null_mut(), 0);
    let mut buf = vec![0 as std::ffi::c_char; need + 1];
    assert_eq!(ndx_error_format(e, buf.as_mut_ptr(), buf.len()), need);
    cstr(buf.as_ptr())
}

#[inline(never)]
fn make_error_here() -> (*mut ndx_error_t, u32) {
    let line = line!() + 1;
    let e = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_RUNTIME as i32,
        c"made here".as_ptr(),
        std::ptr::null_mut(),
    );
    (std::hint::black_box(e), line)
}

#[test]
fn frame_zero_of_a_native_capture_is_the_calling_line() {
    let (e, line) = make_error_here();
    assert!(ndx_error_frame_count(e) >= 2, "{}", format(e));
    let f0 = frame(e, 0);
    assert_eq!(f0.origin, ndx_frame_origin_t::NDX_FRAME_NATIVE);
    assert_ne!(f0.ip, 0);
    assert!(
        cstr(f0.function).ends_with("make_error_here"),
        "{}",
        cstr(f0.function)
    );
    assert!(
        cstr(f0.file).ends_with("tests/error_api.rs"),
        "{}",
        cstr(f0.file)
    );
    assert_eq!(f0.line, line);
    let f1 = frame(e, 1);
    assert!(
        cstr(f1.function).ends_with("frame_zero_of_a_native_capture_is_the_calling_line"),
        "{}",
        cstr(f1.function)
    );
    let text = format(e);
    assert!(
        text.starts_with("Traceback (most recent call last):\n"),
        "{text}"
    );
    // Outermost first: the test function's line comes before make_error_here's.
    let outer = text.find("frame_zero_of_a_native").expect("outer frame");
    let inner = text.find(&format!("line {line},")).expect("inner frame");
    assert!(outer < inner, "{text}");
    assert!(text.ends_with("RuntimeError: made here\n"), "{text}");
    ndx_error_free(e);
}

#[test]
fn a_failed_call_points_at_its_caller() {
    let mut n = 0i32;
    let line = line!() + 1;
    let e = ndx_tensor_ndim(std::ptr::null(), &mut n);
    let f0 = frame(e, 0);
    assert!(
        cstr(f0.function).ends_with("a_failed_call_points_at_its_caller"),
        "{}",
        cstr(f0.function)
    );
    assert_eq!(f0.line, line);
    expect_err(
        e,
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'tensor' is NULL",
    );
}

#[test]
fn core_capture_from_rust_trims_ndx_frames_by_name() {
    let line = line!() + 1;
    let site = Site::capture_native(4);
    let f0 = &site.frames()[0];
    assert!(
        f0.function()
            .unwrap_or("")
            .ends_with("core_capture_from_rust_trims_ndx_frames_by_name"),
        "{:?}",
        f0.function()
    );
    assert_eq!(f0.line(), line);
    assert!(site.frames().len() <= 4);
}

#[test]
fn new_takes_ownership_of_the_cause_and_clone_is_independent() {
    let root = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_VALUE as i32,
        c"root".as_ptr(),
        std::ptr::null_mut(),
    );
    let outer = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_RUNTIME as i32,
        c"outer".as_ptr(),
        root,
    );
    let copy = ndx_error_clone(outer);
    ndx_error_free(outer);
    let cause = ndx_error_cause(copy);
    assert_eq!(cstr(ndx_error_message(cause)), "root");
    assert_eq!(
        ndx_error_kind(cause),
        ndx_error_kind_t::NDX_ERROR_VALUE as i32
    );
    assert!(ndx_error_cause(cause).is_null());
    let text = format(copy);
    let root_at = text.find("ValueError: root").expect("root");
    let sep = text
        .find("The above exception was the direct cause of the following exception:")
        .expect("separator");
    let outer_at = text.find("RuntimeError: outer").expect("outer");
    assert!(root_at < sep && sep < outer_at, "{text}");
    ndx_error_free(copy);
}

#[test]
fn misuse_of_error_new_is_a_value_error_that_keeps_the_cause() {
    let cause = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_INDEX as i32,
        c"c".as_ptr(),
        std::ptr::null_mut(),
    );
    let e = ndx_error_new(99, c"x".as_ptr(), cause);
    assert_eq!(
        ndx_error_kind(ndx_error_cause(e)),
        ndx_error_kind_t::NDX_ERROR_INDEX as i32
    );
    expect_err(
        e,
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "kind 99 is not an ndx_error_kind_t value",
    );
    let e = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_RUNTIME as i32,
        std::ptr::null(),
        std::ptr::null_mut(),
    );
    expect_err(
        e,
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'message' is NULL",
    );
}

#[test]
fn kind_names_and_null_safety() {
    let names = [
        "ValueError",
        "TypeError",
        "IndexError",
        "RuntimeError",
        "MemoryError",
        "NotImplementedError",
        "CudaError",
        "TimeoutError",
        "CancelledError",
        "CheckError",
        "BackendError",
        "InternalError",
    ];
    for (i, name) in names.iter().enumerate() {
        assert_eq!(cstr(ndx_error_kind_name(i as i32 + 1)), *name);
        assert_eq!(
            ErrorKind::from_raw(i as i32 + 1).map(ErrorKind::name),
            Some(*name)
        );
    }
    assert!(ndx_error_kind_name(0).is_null());
    assert!(ndx_error_kind_name(13).is_null());
    assert_eq!(ndx_error_kind(std::ptr::null()), 0);
    assert!(ndx_error_message(std::ptr::null()).is_null());
    assert_eq!(ndx_error_frame_count(std::ptr::null()), 0);
    assert_eq!(
        ndx_error_format(std::ptr::null(), std::ptr::null_mut(), 0),
        0
    );
    assert!(ndx_error_clone(std::ptr::null()).is_null());
    ndx_error_free(std::ptr::null_mut());
}

/// Every text producer NUL-terminates its buffer when `cap > 0`, also when the text is
/// empty (a NULL object, an error without a repro document).
#[test]
fn text_producers_terminate_the_empty_text() {
    let no_doc = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_VALUE as i32,
        c"no document".as_ptr(),
        std::ptr::null_mut(),
    );
    type Producer<'a> = &'a dyn Fn(*mut std::ffi::c_char, usize) -> usize;
    let producers: [(&str, Producer); 4] = [
        ("ndx_error_format(NULL)", &|b, c| {
            ndx_error_format(std::ptr::null(), b, c)
        }),
        ("ndx_error_repro(NULL)", &|b, c| {
            ndx_error_repro(std::ptr::null(), b, c)
        }),
        ("ndx_error_repro(error without a document)", &|b, c| {
            ndx_error_repro(no_doc, b, c)
        }),
        ("ndx_explain_json(NULL)", &|b, c| {
            ndx_explain_json(std::ptr::null(), b, c)
        }),
    ];
    for (name, produce) in producers {
        let mut buf = [b'x' as std::ffi::c_char; 16];
        assert_eq!(produce(buf.as_mut_ptr(), buf.len()), 0, "{name}");
        assert_eq!(buf[0], 0, "{name}: the empty text is NUL-terminated");
        assert_eq!(
            buf[1], b'x' as std::ffi::c_char,
            "{name}: nothing more written"
        );
        assert_eq!(produce(std::ptr::null_mut(), 0), 0, "{name}");
    }
    ndx_error_free(no_doc);
}

#[test]
fn frame_accessor_checks_its_arguments() {
    let (e, _) = make_error_here();
    let mut f = frame(e, 0);
    f.struct_size = 8;
    expect_err(
        ndx_error_frame(e, 0, &mut f),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "struct_size is 8",
    );
    f.struct_size = std::mem::size_of::<ndx_frame_t>();
    let n = ndx_error_frame_count(e);
    expect_err(
        ndx_error_frame(e, n, &mut f),
        ndx_error_kind_t::NDX_ERROR_INDEX,
        &format!("frame index {n} is out of range"),
    );
    expect_err(
        ndx_error_frame(e, 0, std::ptr::null_mut()),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'out' is NULL",
    );
    ndx_error_free(e);
}

#[test]
fn format_truncates_like_snprintf() {
    let e = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_VALUE as i32,
        c"0123456789".as_ptr(),
        std::ptr::null_mut(),
    );
    let full = format(e);
    let mut buf = [0x7f as std::ffi::c_char; 8];
    assert_eq!(ndx_error_format(e, buf.as_mut_ptr(), buf.len()), full.len());
    assert_eq!(cstr(buf.as_ptr()), full[..7]);
    ndx_error_free(e);
}

/// A cut inside a multi-byte character backs off to the character's start: the text
/// the caller reads stays valid UTF-8.
#[test]
fn format_cuts_text_on_a_whole_character() {
    let e = ndx_error_new(
        ndx_error_kind_t::NDX_ERROR_VALUE as i32,
        c"caf\u{e9} \u{1f600}!".as_ptr(),
        std::ptr::null_mut(),
    );
    let full = format(e);
    for (ch, at) in [
        ('\u{e9}', 1),
        ('\u{1f600}', 1),
        ('\u{1f600}', 2),
        ('\u{1f600}', 3),
    ] {
        let start = full.find(ch).unwrap();
        let mut buf = vec![0x7f as std::ffi::c_char; start + at + 1];
        assert_eq!(ndx_error_format(e, buf.as_mut_ptr(), buf.len()), full.len());
        // SAFETY: ndx_error_format NUL-terminated the buffer (cap > 0).
        let bytes = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_bytes();
        assert_eq!(
            std::str::from_utf8(bytes).expect("valid UTF-8"),
            &full[..start],
            "cap {} cuts {ch:?} after {at} of its bytes",
            buf.len()
        );
    }
    ndx_error_free(e);
}

#[test]
fn related_errors_are_reachable_and_formatted() {
    let group = Error::new(ErrorKind::Check, "2 checks failed")
        .with_related([Error::value("first"), Error::index("second")]);
    let raw = Box::into_raw(Box::new(group)).cast::<ndx_error_t>();
    assert_eq!(ndx_error_related_count(raw), 2);
    assert_eq!(cstr(ndx_error_message(ndx_error_related(raw, 1))), "second");
    assert!(ndx_error_related(raw, 2).is_null());
    assert!(format(raw).contains("| IndexError: second"));
    ndx_error_free(raw);
}

/// Host code may chain `ndx_error_new` as deep as it likes: a chain of 100 000 links is
/// walked, cloned and freed on a 256 KiB stack (freeing or cloning it one stack frame
/// per link overflowed the stack and killed the process).
#[test]
fn a_very_long_cause_chain_is_cloned_and_freed_without_recursion() {
    const LINKS: usize = 100_000;
    let run = || {
        let mut e: *mut ndx_error_t = std::ptr::null_mut();
        for i in 0..LINKS {
            let msg = std::ffi::CString::new(format!("link {i}")).unwrap();
            e = ndx_error_new(ndx_error_kind_t::NDX_ERROR_VALUE as i32, msg.as_ptr(), e);
        }
        let copy = ndx_error_clone(e);
        ndx_error_free(e);
        let mut n = 0;
        let mut link: *const ndx_error_t = copy;
        let mut last = String::new();
        while !link.is_null() {
            n += 1;
            last = cstr(ndx_error_message(link));
            link = ndx_error_cause(link);
        }
        assert_eq!((n, last.as_str()), (LINKS, "link 0"));
        ndx_error_free(copy);
    };
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(run)
        .unwrap()
        .join()
        .expect("the chain is freed without overflowing the stack");
}

/// A sized out-struct (`ndx_frame_t`, the explain records) is never left stale on
/// failure: once `out` and its `struct_size` are usable, every field after
/// `struct_size` reads zero when the call fails (a NULL handle, an index out of
/// range), as the header's "out-params are NULL/0 on error" promises.
#[test]
fn sized_out_params_are_zeroed_on_failure() {
    let (e, _) = make_error_here();
    let mut f = frame(e, 0);
    assert!(!f.function.is_null() && f.ip != 0, "frame 0 is filled");
    let n = ndx_error_frame_count(e);
    expect_err(
        ndx_error_frame(e, n, &mut f),
        ndx_error_kind_t::NDX_ERROR_INDEX,
        &format!("frame index {n} is out of range"),
    );
    assert_eq!(f.struct_size, std::mem::size_of::<ndx_frame_t>());
    assert!(
        f.function.is_null() && f.file.is_null(),
        "stale strings kept"
    );
    assert_eq!((f.line, f.column, f.ip), (0, 0, 0), "stale numbers kept");
    let mut f = frame(e, 0);
    expect_err(
        ndx_error_frame(std::ptr::null(), 0, &mut f),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "argument 'error' is NULL",
    );
    assert!(
        f.function.is_null() && f.ip == 0,
        "stale frame after a NULL error"
    );
    ndx_error_free(e);

    let mut ctx: *mut ndx_context_t = std::ptr::null_mut();
    assert!(ndx_context_new(std::ptr::null(), &mut ctx).is_null());
    let mut ex: *mut ndx_explain_t = std::ptr::null_mut();
    assert!(ndx_context_explain(ctx, &mut ex).is_null());
    let stale = 7u64;
    let mut s = ndx_explain_summary_t {
        struct_size: std::mem::size_of::<ndx_explain_summary_t>(),
        graphs: stale,
        breaks: stale,
        ops: stale,
        graph_ops: stale,
        sync_cpu: stale,
        sync_full: stale,
        deferred: stale,
        eager: stale,
        checks_raised: stale,
    };
    expect_err(
        ndx_explain_summary(std::ptr::null(), &mut s),
        ndx_error_kind_t::NDX_ERROR_VALUE,
        "NULL",
    );
    assert_eq!(
        [
            s.graphs,
            s.breaks,
            s.ops,
            s.graph_ops,
            s.eager,
            s.checks_raised
        ],
        [0; 6],
        "stale summary"
    );
    let mut g = ndx_explain_graph_t {
        struct_size: std::mem::size_of::<ndx_explain_graph_t>(),
        reason: 3,
        ops: stale,
        time_ns: 7,
        seq: stale,
    };
    expect_err(
        ndx_explain_graph(ex, 0, &mut g),
        ndx_error_kind_t::NDX_ERROR_INDEX,
        "graph index 0 is out of range",
    );
    assert_eq!(
        (g.reason, g.ops, g.time_ns, g.seq),
        (0, 0, 0, 0),
        "stale graph"
    );
    let mut b = ndx_graph_break_t {
        struct_size: std::mem::size_of::<ndx_graph_break_t>(),
        reason: 3,
        graph: 7,
        seq: stale,
        file: c"stale.c".as_ptr(),
        line: 7,
        function: c"stale".as_ptr(),
    };
    expect_err(
        ndx_explain_break(ex, 0, &mut b),
        ndx_error_kind_t::NDX_ERROR_INDEX,
        "break index 0 is out of range",
    );
    assert!(
        b.file.is_null() && b.function.is_null(),
        "stale break strings"
    );
    assert_eq!(
        (b.reason, b.graph, b.seq, b.line),
        (0, 0, 0, 0),
        "stale break"
    );
    ndx_explain_free(ex);
    ndx_context_release(ctx);
}
