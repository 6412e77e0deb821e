//! Error flags from Rust: the check operators and the built-in categories, in every
//! policy and in EAGER and DEFERRED mode; flags reported in enqueue order with their
//! sites, counts and first indices; cascades told apart from causes; folding of a
//! check in a loop; the capacity bound; OFF doing no flag work.

use std::sync::Arc;

use ndx::checks::{self, Policy};
use ndx::error::{Error, ErrorKind, Frame, FrameOrigin};
use ndx::exec::{
    ArgValue, Args, BatchRef, CallSite, CapturePolicy, Context, EvalMode, Input, Node, Settings,
    TensorRef, new_context, output_tensor,
};
use ndx::tensor::{Batch, DType, Tensor};

fn context(mode: EvalMode, policy: Policy, categories: u32) -> Context {
    new_context(
        Settings {
            mode,
            capture: CapturePolicy::Native,
            checks: checks::Settings {
                policy,
                categories,
                capacity: checks::DEFAULT_CAPACITY,
            },
            ..Settings::default()
        },
        2,
    )
}

fn tensor<T: bytemuck::Pod>(dtype: DType, values: &[T], shape: &[i64]) -> Arc<Tensor> {
    Arc::new(
        Tensor::new_host(dtype, shape, Default::default(), |b| {
            b.copy_from_slice(bytemuck::cast_slice(values));
            Ok(())
        })
        .expect("tensor"),
    )
}

fn input(t: Arc<Tensor>) -> Input {
    Input::Tensor(Arc::new(TensorRef::ready(t)))
}

fn f32s(values: &[f32]) -> Input {
    input(tensor(DType::F32, values, &[values.len() as i64]))
}

fn i32s(values: &[i32]) -> Input {
    input(tensor(DType::I32, values, &[values.len() as i64]))
}

fn bools(values: &[bool]) -> Input {
    let bytes: Vec<u8> = values.iter().map(|&b| u8::from(b)).collect();
    input(tensor(DType::Bool, &bytes, &[values.len() as i64]))
}

fn out(node: &Arc<Node>) -> Input {
    Input::Tensor(Arc::new(output_tensor(node, 0).expect("output 0")))
}

fn values<T: bytemuck::Pod>(node: &Arc<Node>) -> Vec<T> {
    let t = output_tensor(node, 0).unwrap();
    bytemuck::pod_collect_to_vec(&t.resolve().expect("ok").to_bytes().unwrap())
}

fn args(entries: &[(&str, ArgValue)]) -> Args {
    entries
        .iter()
        .fold(Args::new(), |a, (n, v)| a.with(n, v.clone()))
}

fn msg(text: &str) -> Args {
    args(&[(
        "message",
        ArgValue::Str(std::ffi::CString::new(text).unwrap()),
    )])
}

fn here() -> CallSite {
    CallSite::default()
}

fn line_of(e: &Error) -> u32 {
    let f = e.frames().first().expect("frames");
    assert!(
        f.file().unwrap_or("").ends_with("tests/checks_api.rs"),
        "{:?}",
        f.file()
    );
    f.line()
}

/// The check group `ctx.evaluate()` reports.
fn group(ctx: &Context) -> Error {
    let e = ctx.evaluate().expect_err("flags were raised");
    assert_eq!(e.kind(), ErrorKind::Check, "{}", e.traceback());
    e
}

#[test]
fn two_failing_checks_are_reported_in_enqueue_order_with_their_sites() {
    for mode in [EvalMode::Eager, EvalMode::Deferred, EvalMode::SyncCpu] {
        let ctx = context(mode, Policy::Collect, checks::ALL);
        let x = f32s(&[1.0, f32::NAN, 3.0, f32::INFINITY]);
        let r = ctx.invoke("check_finite", vec![x], Args::new(), None, here());
        let l1 = line!() - 1;
        let f1 = r.unwrap();
        let range = args(&[("lo", ArgValue::Float(0.0)), ("hi", ArgValue::Float(2.0))]);
        let y = out(&f1);
        let r = ctx.invoke("check_range", vec![y], range, None, here());
        let l2 = line!() - 1;
        let f2 = r.unwrap();
        let ok = ctx.invoke(
            "check",
            vec![bools(&[true, true])],
            msg("fine"),
            None,
            here(),
        );
        let f3 = ok.unwrap();
        // The computation went on: the values pass through unchanged.
        let v = values::<f32>(&f2);
        assert!(v[0] == 1.0 && v[1].is_nan() && v[2] == 3.0 && v[3].is_infinite());
        f3.wait(None).unwrap();
        let e = group(&ctx);
        assert_eq!(e.message(), "2 checks failed (in enqueue order)");
        let r = e.related();
        assert_eq!(r.len(), 2, "{mode:?}");
        assert_eq!(
            (r[0].op(), r[0].sequence()),
            (Some("check_finite"), Some(1))
        );
        assert_eq!((r[1].op(), r[1].sequence()), (Some("check_range"), Some(2)));
        assert_eq!(r[0].kind(), ErrorKind::Check);
        assert_eq!(
            r[0].message(),
            "USER check failed: 2 of 4 elements not finite (first at flat index 1)"
        );
        assert!(
            r[1].message().starts_with(
                "USER check failed: 3 of 4 elements outside [0, 2] (first at flat index 1)"
            ),
            "{}",
            r[1].message()
        );
        assert_eq!((line_of(&r[0]), line_of(&r[1])), (l1, l2), "{mode:?}");
        let i0 = r[0].check_info().unwrap();
        assert_eq!(
            (i0.category, i0.first_index, i0.count),
            (checks::USER, 1, 2)
        );
        assert_eq!((i0.occurrences, i0.sample, i0.consequence_of), (1, -1, 0));
        // The range check ran on data its upstream check flagged.
        assert_eq!(r[1].check_info().unwrap().consequence_of, 1);
        assert!(
            r[1].message()
                .ends_with("a consequence of the flag raised by #1")
        );
        assert!(ctx.evaluate().is_ok(), "flags are reported once");
    }
}

#[test]
fn check_operators_pass_their_input_through_unchanged() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::ALL);
    let t = tensor(DType::F32, &[1f32, 2.0], &[2]);
    let f = ctx
        .invoke(
            "check_finite",
            vec![input(t.clone())],
            Args::new(),
            None,
            here(),
        )
        .unwrap();
    let o = output_tensor(&f, 0).unwrap();
    let o = o.resolve().unwrap();
    assert!(Arc::ptr_eq(o.storage(), t.storage()), "same memory");
    assert_eq!(o.shape(), t.shape());
    assert!(ctx.evaluate().is_ok());
}

#[test]
fn off_policy_does_no_flag_work() {
    let ctx = context(EvalMode::SyncCpu, Policy::Off, checks::ALL);
    let f = ctx
        .invoke(
            "check",
            vec![bools(&[false])],
            msg("never looked at"),
            None,
            here(),
        )
        .unwrap();
    assert_eq!(values::<u8>(&f), [0]);
    let g = ctx
        .invoke(
            "div",
            vec![f32s(&[1.0]), f32s(&[0.0])],
            Args::new(),
            None,
            here(),
        )
        .unwrap();
    assert_eq!(values::<f32>(&g), [f32::INFINITY]);
    assert!(ctx.evaluate().is_ok());
    assert!(ctx.take_check_errors().is_none());
    assert_eq!(ctx.check_counts(), (0, 0), "no kernel ran with checks on");
    // Turned on, the same work raises flags and is counted.
    ctx.set_checks(checks::Settings {
        policy: Policy::Collect,
        ..checks::Settings::default()
    });
    ctx.invoke(
        "check",
        vec![bools(&[false])],
        msg("looked at"),
        None,
        here(),
    )
    .unwrap();
    assert_eq!(ctx.check_counts(), (1, 1));
    assert_eq!(group(&ctx).related().len(), 1);
}

#[test]
fn fail_fast_fails_the_flagging_invocation_and_its_dependents() {
    for mode in [EvalMode::Eager, EvalMode::Deferred, EvalMode::SyncFull] {
        let ctx = context(mode, Policy::FailFast, checks::ALL);
        let (p, m) = (bools(&[true, false, false]), msg("mask must be set"));
        let r = ctx.invoke("check", vec![p], m, None, here());
        let line = line!() - 1;
        let f1 = r.unwrap();
        let f2 = ctx
            .invoke("logical_not", vec![out(&f1)], Args::new(), None, here())
            .unwrap();
        f2.wait(None).unwrap();
        let Some(Err(e)) = f2.result() else {
            panic!("{mode:?}: the dependent fails")
        };
        let root = e.chain().last().unwrap();
        assert_eq!(root.kind(), ErrorKind::Check);
        assert_eq!(
            root.message(),
            "USER check failed: mask must be set: 2 of 3 elements false (first at flat index 1)"
        );
        assert_eq!((root.op(), root.sequence()), (Some("check"), Some(1)));
        assert_eq!(line_of(root), line);
        assert_eq!(root.check_info().unwrap().count, 2);
        assert!(ctx.take_check_errors().is_none(), "nothing is collected");
    }
}

#[test]
fn a_check_in_a_loop_is_folded_with_its_counts() {
    let ctx = context(EvalMode::Eager, Policy::Collect, checks::ALL);
    let mut line = 0;
    for i in 0..10 {
        let pred = bools(&[i % 2 == 0, false]);
        let r = ctx.invoke("check", vec![pred], msg("in a loop"), None, here());
        line = line!() - 1;
        r.unwrap();
    }
    let e = group(&ctx);
    assert_eq!(e.related().len(), 1, "{}", e.traceback());
    let f = &e.related()[0];
    let info = f.check_info().unwrap();
    assert_eq!((info.occurrences, info.count), (10, 15));
    assert_eq!(f.sequence(), Some(1), "the first occurrence");
    assert_eq!(line_of(f), line);
    assert!(
        f.message()
            .contains("raised 10 times at this site (first by #1): 15 failing elements in all"),
        "{}",
        f.message()
    );
}

#[test]
fn flags_beyond_the_capacity_are_dropped_and_counted_exactly() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::ALL);
    ctx.set_checks(checks::Settings {
        policy: Policy::Collect,
        categories: checks::ALL,
        capacity: 2,
    });
    // Five distinct sites (explicit locations, as NDX_HERE gives them).
    for line in 1..=5 {
        let at = CallSite {
            location: Some(Frame::new(
                None,
                Some("app.c"),
                line,
                0,
                0,
                FrameOrigin::Host,
            )),
            caller_ip: None,
        };
        ctx.invoke("check", vec![bools(&[false])], msg("m"), None, at)
            .unwrap();
    }
    let e = group(&ctx);
    assert_eq!(e.related().len(), 2);
    assert_eq!(
        e.related()[1].frames()[0].line(),
        2,
        "the first two are kept"
    );
    assert!(
        e.message().contains("3 more flags were dropped"),
        "{}",
        e.message()
    );
    assert_eq!(ctx.check_counts().0, 5);
}

#[test]
fn integer_division_by_zero_is_a_flag_with_div_and_an_error_without() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::DIV);
    for op in ["div", "floordiv", "mod"] {
        let f = ctx
            .invoke(
                op,
                vec![i32s(&[7, 8, 9]), i32s(&[2, 0, 0])],
                Args::new(),
                None,
                here(),
            )
            .unwrap();
        assert_eq!(values::<i32>(&f)[1..], [0, 0], "{op}: zero divisors give 0");
    }
    let e = group(&ctx);
    assert_eq!(e.related().len(), 3);
    for r in e.related() {
        let info = r.check_info().unwrap();
        assert_eq!(
            (info.category, info.first_index, info.count),
            (checks::DIV, 1, 2)
        );
        assert!(
            r.message()
                .starts_with("DIV check failed: 2 elements divided by zero")
        );
    }
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::NAN);
    let f = ctx
        .invoke(
            "div",
            vec![i32s(&[1]), i32s(&[0])],
            Args::new(),
            None,
            here(),
        )
        .unwrap();
    f.wait(None).unwrap();
    let Some(Err(e)) = f.result() else { panic!() };
    assert_eq!(e.kind(), ErrorKind::Value);
}

#[test]
fn nan_and_div_flags_in_the_fused_loops_and_the_separate_pass() {
    let ctx = context(EvalMode::Eager, Policy::Collect, checks::NAN | checks::DIV);
    let big = f32s(&[3e38, 1.0, 3e38, 2.0]);
    let (a, b) = (big.clone(), big.clone());
    let r = ctx.invoke("add", vec![a, b], Args::new(), None, here());
    let l_add = line!() - 1;
    let add = r.unwrap();
    let (a, b) = (f32s(&[1.0, 2.0, 0.0]), f32s(&[1.0, 0.0, 0.0]));
    let r = ctx.invoke("div", vec![a, b], Args::new(), None, here());
    let l_div = line!() - 1;
    r.unwrap();
    let a = f32s(&[1.0, -1.0, f32::NAN]);
    let r = ctx.invoke("log", vec![a], Args::new(), None, here());
    let l_log = line!() - 1;
    r.unwrap();
    let r = ctx.invoke("sum", vec![big], Args::new(), None, here());
    let l_sum = line!() - 1;
    r.unwrap();
    // NaN in, NaN out: not a new NaN.
    ctx.invoke(
        "add",
        vec![f32s(&[f32::NAN]), f32s(&[1.0])],
        Args::new(),
        None,
        here(),
    )
    .unwrap();
    assert!(values::<f32>(&add)[0].is_infinite());
    let e = group(&ctx);
    let got: Vec<(u32, u32, u64, u64)> = e
        .related()
        .iter()
        .map(|r| {
            let i = r.check_info().unwrap();
            (line_of(r), i.category, i.first_index, i.count)
        })
        .collect();
    assert_eq!(
        got,
        [
            (l_add, checks::NAN, 0, 2),
            (l_div, checks::NAN, 1, 2),
            (l_div, checks::DIV, 1, 2),
            (l_log, checks::NAN, 1, 1),
            (l_sum, checks::NAN, 0, 1),
        ],
        "{}",
        e.traceback()
    );
}

#[test]
fn large_inputs_are_counted_exactly_across_parallel_pieces() {
    let ctx = context(EvalMode::Eager, Policy::Collect, checks::NAN);
    let n = 1 << 20;
    let mut a = vec![1f32; n];
    for i in (1000..n).step_by(4096) {
        a[i] = 3e38;
    }
    let expected = (1000..n).step_by(4096).count() as u64;
    let x = input(tensor(DType::F32, &a, &[n as i64]));
    ctx.invoke("mul", vec![x.clone(), x], Args::new(), None, here())
        .unwrap();
    let e = group(&ctx);
    let info = e.related()[0].check_info().unwrap();
    assert_eq!((info.first_index, info.count), (1000, expected));
}

#[test]
fn promoted_inputs_raise_the_flags_of_their_converted_values() {
    // float32 with int32 computes in float64 (no overflow where float32 would have
    // one), converted run by run in the fused loop: the same flags, counts and first
    // indices as with the inputs cast first, also across parallel pieces.
    let ctx = context(EvalMode::Eager, Policy::Collect, checks::NAN | checks::DIV);
    let n = 1 << 20;
    let mut a = vec![1f32; n];
    let mut b = vec![1i32; n];
    for i in (1000..n).step_by(4096) {
        b[i] = 0;
    }
    a[7] = 3e38;
    a[8] = f32::NAN;
    b[8] = 0;
    let zeros = (1000..n).step_by(4096).count() as u64;
    let (x, y) = (
        input(tensor(DType::F32, &a, &[n as i64])),
        input(tensor(DType::I32, &b, &[n as i64])),
    );
    let r = ctx.invoke("div", vec![x.clone(), y.clone()], Args::new(), None, here());
    let l_div = line!() - 1;
    let q = r.unwrap();
    // float32 times float32 overflows; float32 times int32 computes in float64 and
    // does not (nor is NaN times 0 a new NaN).
    let r = ctx.invoke("mul", vec![x.clone(), x.clone()], Args::new(), None, here());
    let l_mul = line!() - 1;
    r.unwrap();
    ctx.invoke("mul", vec![x, y], Args::new(), None, here())
        .unwrap();
    let d = values::<f64>(&q);
    assert_eq!(d.len(), n);
    assert!(d[1000].is_infinite() && d[8].is_nan());
    assert_eq!(d[7], f64::from(3e38f32));
    let e = group(&ctx);
    let got: Vec<(u32, u32, u64, u64)> = e
        .related()
        .iter()
        .map(|r| {
            let i = r.check_info().unwrap();
            (line_of(r), i.category, i.first_index, i.count)
        })
        .collect();
    // Element 8 (NaN / 0) is NaN from a NaN: a division by zero, not a new NaN.
    assert_eq!(
        got,
        [
            (l_div, checks::NAN, 1000, zeros),
            (l_div, checks::DIV, 8, zeros + 1),
            (l_mul, checks::NAN, 7, 1),
        ],
        "{}",
        e.traceback()
    );
}

#[test]
fn out_of_range_slices_are_index_flags_and_still_clamp() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::INDEX);
    let a = args(&[
        ("start", ArgValue::Ints(vec![1])),
        ("end", ArgValue::Ints(vec![10])),
    ]);
    let f = ctx
        .invoke("slice", vec![i32s(&[1, 2, 3])], a, None, here())
        .unwrap();
    assert_eq!(values::<i32>(&f), [2, 3]);
    let e = group(&ctx);
    let r = &e.related()[0];
    assert_eq!(
        r.message(),
        "INDEX check failed: slice end 10 out of range for axis 0 of size 3 (clamped) (first at axis 0)"
    );
}

#[test]
fn check_shape_and_argument_validation() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::USER);
    let x = input(tensor(DType::I32, &[0i32; 6], &[2, 3]));
    let p = |v: Vec<i64>| args(&[("pattern", ArgValue::Ints(v))]);
    ctx.invoke("check_shape", vec![x.clone()], p(vec![-1, 3]), None, here())
        .unwrap();
    ctx.invoke("check_shape", vec![x.clone()], p(vec![2, 4]), None, here())
        .unwrap();
    let e = group(&ctx);
    assert_eq!(e.related().len(), 1);
    assert_eq!(
        e.related()[0].message(),
        "USER check failed: shape [2, 3] does not match the pattern [2, 4] (-1: any size) (first at axis 1)"
    );
    let bad = ctx.invoke(
        "check_range",
        vec![x.clone()],
        args(&[("lo", ArgValue::Float(2.0)), ("hi", ArgValue::Float(1.0))]),
        None,
        here(),
    );
    let e = bad.err().expect("refused at enqueue");
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(
        e.message().contains("needs lo <= hi, got lo=2 and hi=1"),
        "{e}"
    );
    let e = ctx
        .invoke("check", vec![x], msg("not bool"), None, here())
        .err()
        .expect("refused at enqueue");
    assert_eq!(e.kind(), ErrorKind::Type);
}

#[test]
fn check_range_compares_int64_and_uint64_exactly() {
    // 2^53 + 1 is not a double: through f64 it became 2^53 and passed hi = 2^53.
    let big = (1i64 << 53) + 1;
    let cases: Vec<(Input, Args, &str)> = vec![
        (
            input(tensor(DType::I64, &[big, 1 << 53, -big], &[3])),
            args(&[
                ("lo", ArgValue::Float(-9007199254740992.0)),
                ("hi", ArgValue::Float(9007199254740992.0)),
            ]),
            "2 of 3 elements outside [-9007199254740992, 9007199254740992] (first at flat index 0)",
        ),
        (
            // Integer bounds stay exact: lo = 2^53 + 1 admits 2^53 + 1 only.
            input(tensor(DType::I64, &[big, 1 << 53, i64::MAX], &[3])),
            args(&[("lo", ArgValue::Int(big)), ("hi", ArgValue::Int(big))]),
            "2 of 3 elements outside [9007199254740993, 9007199254740993] (first at flat index 1)",
        ),
        (
            input(tensor(DType::U64, &[u64::MAX, u64::MAX - 1, 1 << 53], &[3])),
            args(&[("hi", ArgValue::Int(i64::MAX))]),
            "2 of 3 elements outside [-inf, 9223372036854775807] (first at flat index 0)",
        ),
        (
            // 2^64 as a float: u64::MAX is below it.
            input(tensor(DType::U64, &[u64::MAX, 0, (1 << 53) + 1], &[3])),
            args(&[
                ("lo", ArgValue::Float(0.5)),
                ("hi", ArgValue::Float(18446744073709551616.0)),
            ]),
            "1 of 3 elements outside [0.5, 18446744073709552000] (first at flat index 1)",
        ),
    ];
    for (x, range, want) in cases {
        let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::ALL);
        ctx.invoke("check_range", vec![x], range, None, here())
            .unwrap()
            .wait(None)
            .unwrap();
        let e = group(&ctx);
        assert_eq!(e.related().len(), 1, "{want}");
        assert_eq!(
            e.related()[0].message(),
            format!("USER check failed: {want}")
        );
    }
    // lo > hi is decided exactly too.
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::ALL);
    let x = input(tensor(DType::I64, &[0i64], &[1]));
    let reversed = args(&[
        ("lo", ArgValue::Int(big)),
        ("hi", ArgValue::Float(9007199254740992.0)),
    ]);
    let e = ctx
        .invoke("check_range", vec![x], reversed, None, here())
        .err()
        .expect("refused at enqueue");
    assert_eq!(e.kind(), ErrorKind::Value);
    assert!(
        e.message()
            .contains("needs lo <= hi, got lo=9007199254740993 and hi=9007199254740992"),
        "{e}"
    );
}

#[test]
fn batch_flags_name_their_sample() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::USER);
    let s0 = tensor(DType::F32, &[1f32, 2.0], &[2]);
    let s1 = tensor(DType::F32, &[1f32, 2.0, f32::NAN], &[3]);
    let b = Batch::new(vec![s0, s1]).unwrap();
    let b = Input::Batch(Arc::new(BatchRef::ready(Arc::new(b))));
    ctx.invoke("check_finite", vec![b], Args::new(), None, here())
        .unwrap();
    let e = group(&ctx);
    let r = &e.related()[0];
    assert_eq!(r.check_info().unwrap().sample, 1);
    assert_eq!((r.check_info().unwrap().first_index), 2);
    assert!(
        r.message().contains("not finite in sample 1"),
        "{}",
        r.message()
    );
}

#[test]
fn a_fail_fast_batch_failure_documents_its_failing_sample() {
    // FAIL_FAST fails the invocation while running: its repro document, like a
    // kernel error's, holds the failing sample's inputs.
    let ctx = context(EvalMode::Eager, Policy::FailFast, checks::USER);
    let s0 = tensor(DType::F32, &[1f32, 2.0], &[2]);
    let s1 = tensor(DType::F32, &[5f32, f32::INFINITY], &[2]);
    let b = Batch::new(vec![s0, s1]).unwrap();
    let b = Input::Batch(Arc::new(BatchRef::ready(Arc::new(b))));
    let node = ctx
        .invoke("check_finite", vec![b], Args::new(), None, here())
        .unwrap();
    node.wait(None).unwrap();
    let Some(Err(e)) = node.result() else {
        panic!("did not fail")
    };
    let e = e.clone();
    assert_eq!(e.kind(), ErrorKind::Check);
    let doc: serde_json::Value = serde_json::from_str(e.repro().expect("a document")).unwrap();
    assert_eq!(doc["op"], "check_finite");
    assert_eq!(doc["sample"], 1);
    assert_eq!(doc["inputs"].as_array().unwrap().len(), 1);
    assert_eq!(doc["inputs"][0]["bytes"], "0000a0400000807f"); // 5.0, inf
    assert_eq!(doc["error"]["message"], e.message());
}

#[test]
fn evaluate_reports_failures_and_the_check_group_together() {
    let ctx = context(EvalMode::Eager, Policy::Collect, checks::USER);
    ctx.invoke("check", vec![bools(&[false])], msg("m"), None, here())
        .unwrap();
    ctx.invoke(
        "div",
        vec![i32s(&[1]), i32s(&[0])],
        Args::new(),
        None,
        here(),
    )
    .unwrap();
    let e = ctx.evaluate().expect_err("both");
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert!(
        e.message().contains("the last related error is the group"),
        "{e}"
    );
    let r = e.related();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].kind(), ErrorKind::Value);
    assert_eq!(r[1].kind(), ErrorKind::Check);
    assert_eq!(r[1].related().len(), 1);
}

#[test]
fn take_check_errors_reports_what_completed_and_clears_it() {
    let ctx = context(EvalMode::SyncCpu, Policy::Collect, checks::ALL);
    assert!(ctx.take_check_errors().is_none());
    ctx.invoke(
        "check",
        vec![bools(&[false, true])],
        msg("first"),
        None,
        here(),
    )
    .unwrap();
    let e = ctx.take_check_errors().expect("one flag");
    assert_eq!(e.related().len(), 1);
    assert!(ctx.take_check_errors().is_none());
    assert!(ctx.evaluate().is_ok());
}

#[test]
fn a_check_downstream_of_a_failed_invocation_fails_with_it_and_raises_nothing() {
    for mode in [EvalMode::Eager, EvalMode::Deferred] {
        let ctx = context(mode, Policy::Collect, checks::USER);
        let div = ctx
            .invoke(
                "div",
                vec![i32s(&[1]), i32s(&[0])],
                Args::new(),
                None,
                here(),
            )
            .unwrap();
        let chk = ctx
            .invoke("check_finite", vec![out(&div)], Args::new(), None, here())
            .unwrap();
        chk.wait(None).unwrap();
        let Some(Err(e)) = chk.result() else {
            panic!("{mode:?}: the check fails with its input")
        };
        assert_eq!(e.kind(), ErrorKind::Value);
        assert_eq!(e.cause().and_then(Error::op), Some("div"));
        assert!(ctx.take_check_errors().is_none(), "{mode:?}: no flag");
        assert_eq!(ctx.check_counts().0, 0);
    }
}
