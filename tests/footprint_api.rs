//! What the engine keeps per unit of work, counted by a global allocator that tracks
//! the bytes alive: sizes that grow with the number of invocations must stay small per
//! invocation. (Its own test binary: the allocator counts every thread of it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use ndx::exec::{Args, Backend, CallSite, CapturePolicy, EvalMode, Input, Settings, new_context};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: a block this allocator returned for `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: a block this allocator returned for `layout`, as realloc requires.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A failure nobody observed stays in its context until `evaluate` reports it, with
/// its error and repro document: a loop of failing invocations keeps all of them. Its
/// document's content used to be kept as parsed JSON, about 3.9 KB for two 4-byte
/// inputs (5.5 KB per failure in all, as counted here); it is kept as plain fields and
/// written as JSON when read (1.6 KB per failure in all).
#[test]
fn an_unobserved_failure_keeps_a_few_kilobytes() {
    const FAILURES: usize = 2000;
    let ctx = new_context(
        Settings {
            mode: EvalMode::Eager,
            capture: CapturePolicy::Off,
            backend: Backend::parse("inject_runtime_error:sub").unwrap(),
            ..Settings::default()
        },
        2,
    );
    let x = Input::host(&[1i32], &[1]).unwrap();
    let fail = || {
        ctx.invoke(
            "sub",
            vec![x.clone(), x.clone()],
            Args::new(),
            None,
            CallSite::default(),
        )
        .expect("enqueue")
    };
    // What the first failure sets up once (workers, tables) is not counted.
    fail().wait(None).unwrap();
    assert!(ctx.evaluate().is_err());
    let before = LIVE.load(Ordering::SeqCst);
    let nodes: Vec<_> = (0..FAILURES).map(|_| fail()).collect();
    for n in &nodes {
        n.wait(None).unwrap();
    }
    drop(nodes);
    let per_failure = (LIVE.load(Ordering::SeqCst) - before) / FAILURES as isize;
    let e = ctx.evaluate().expect_err("the failures");
    assert_eq!(e.related().len(), FAILURES);
    assert!(
        e.related()[0]
            .repro()
            .is_some_and(|d| d.contains("\"op\": \"sub\"")),
        "the document is still written when read"
    );
    assert!(
        per_failure < 3000,
        "{per_failure} bytes kept per unobserved failure"
    );
    drop(e);
    drop(ctx);
}
