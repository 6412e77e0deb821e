//! Repro documents from Rust: a real kernel failure's document carries the op,
//! arguments, inputs (with bytes within the cap), mode, backend, version, site and
//! error; replaying it fails the same way; capped documents say why they cannot run.

use std::sync::Arc;

use ndx::debug::repro;
use ndx::error::{Error, ErrorKind};
use ndx::exec::{
    ArgValue, Args, CallSite, Context, EvalMode, Input, Node, Settings, TensorRef, new_context,
};
use ndx::tensor::DType;

fn context(mode: EvalMode, repro_max_bytes: u64) -> Context {
    new_context(
        Settings {
            mode,
            repro_max_bytes,
            ..Settings::default()
        },
        2,
    )
}

fn i32s(values: &[i32], shape: &[i64]) -> Input {
    Input::host(values, shape).unwrap()
}

fn failure(node: &Arc<Node>) -> Error {
    node.wait(None).unwrap();
    match node.result() {
        Some(Err(e)) => e.clone(),
        _ => panic!("did not fail"),
    }
}

#[test]
fn a_kernel_failure_carries_a_document_that_replays_to_the_same_error() {
    let ctx = context(EvalMode::Eager, repro::DEFAULT_MAX_BYTES);
    let (a, b) = (i32s(&[7, 8, 9, 10], &[2, 2]), i32s(&[1, 0], &[2]));
    let here = CallSite::default();
    let r = ctx.invoke("floordiv", vec![a, b], Args::new(), None, here);
    let line = line!() - 1;
    let e = failure(&r.unwrap());
    let doc: serde_json::Value = serde_json::from_str(e.repro().expect("a document")).unwrap();
    assert_eq!(doc["op"], "floordiv");
    assert_eq!(doc["mode"], "eager");
    assert_eq!(doc["backend"], "default");
    assert_eq!(doc["ndx_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["inputs"][0]["shape"], serde_json::json!([2, 2]));
    assert_eq!(doc["inputs"][1]["dtype"], "int32");
    assert_eq!(doc["inputs"][1]["bytes"], "0100000000000000");
    assert_eq!(doc["bytes_included"], true);
    assert_eq!(doc["error"]["kind"], "ValueError");
    assert_eq!(
        doc["error"]["message"],
        "integer division by zero (output element 1)"
    );
    assert!(
        doc["site"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("tests/repro_api.rs")
    );
    assert_eq!(doc["site"][0]["line"], line);

    // A dependent's error finds the document in its cause chain.
    let replay = repro::parse(e.repro().unwrap()).unwrap();
    assert_eq!(
        (replay.op.as_str(), replay.mode),
        ("floordiv", EvalMode::Eager)
    );
    let inputs = replay
        .inputs
        .into_iter()
        .map(|t| Input::Tensor(Arc::new(TensorRef::ready(t))))
        .collect();
    let other = context(EvalMode::SyncCpu, 0);
    let again = other
        .invoke(
            &replay.op,
            inputs,
            replay.args,
            Some(replay.mode),
            CallSite::default(),
        )
        .unwrap();
    let e2 = failure(&again);
    assert_eq!((e2.kind(), e2.message()), (e.kind(), e.message()));
    assert!(
        e2.repro().is_some(),
        "the replay's failure has its own document"
    );
}

#[test]
fn arguments_round_trip_and_the_cap_leaves_the_bytes_out() {
    let ctx = context(EvalMode::SyncCpu, 4);
    let (a, b) = (i32s(&[1, 2], &[2]), i32s(&[0, 0], &[2]));
    let r = ctx.invoke("div", vec![a, b], Args::new(), None, CallSite::default());
    let e = failure(&r.unwrap());
    assert_eq!(e.kind(), ErrorKind::Value);
    let text = e.repro().unwrap();
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        doc["bytes_included"], false,
        "16 input bytes exceed the cap of 4"
    );
    assert!(doc["inputs"][0]["bytes"].is_null());
    let err = repro::parse(text)
        .err()
        .expect("cannot replay without bytes");
    assert!(err.message().contains("inputs[0] has no bytes"), "{err}");
    // Typed arguments survive the trip, NaN and infinities included.
    let args = Args::new()
        .with("a", ArgValue::Floats(vec![f64::NAN, f64::INFINITY, -1.5]))
        .with("b", ArgValue::DType(DType::BF16))
        .with("c", ArgValue::Str(c"x".into()))
        .with("d", ArgValue::Bool(true));
    let ctx = context(EvalMode::SyncCpu, 1 << 10);
    let (a, b) = (i32s(&[1], &[1]), i32s(&[0], &[1]));
    let r = ctx.invoke("div", vec![a, b], Args::new(), None, CallSite::default());
    let e = failure(&r.unwrap());
    let mut doc: serde_json::Value = serde_json::from_str(e.repro().unwrap()).unwrap();
    let arg_doc: serde_json::Value = serde_json::from_str(&repro::document(
        &repro::Invocation {
            op: "div",
            args: &args,
            inputs: &[],
            sample: None,
            mode: EvalMode::Deferred,
            backend: "default".into(),
            site: e.site().unwrap(),
        },
        &e,
        0,
    ))
    .unwrap();
    doc["args"] = arg_doc["args"].clone();
    let back = repro::parse(&doc.to_string()).unwrap();
    match back.args.get("a") {
        Some(ArgValue::Floats(v)) => {
            assert!(v[0].is_nan() && v[1] == f64::INFINITY && v[2] == -1.5)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(back.args.get("b"), Some(&ArgValue::DType(DType::BF16)));
    assert_eq!(back.args.get("c"), Some(&ArgValue::Str(c"x".into())));
    assert_eq!(back.args.get("d"), Some(&ArgValue::Bool(true)));
    let bad = repro::parse("{\"ndx_repro\": 9}").err().unwrap();
    assert!(bad.message().contains("format 9 is not supported"), "{bad}");
}

/// A bad input shape is named as the document's field, not as an "output".
#[test]
fn a_bad_input_shape_names_the_document_field() {
    let doc = |shape: &str| {
        format!(
            "{{\"ndx_repro\": 1, \"op\": \"neg\", \"args\": [], \"mode\": \"sync_cpu\", \
             \"inputs\": [{{\"dtype\": \"int8\", \"shape\": {shape}, \"bytes\": \"00\"}}]}}"
        )
    };
    let e = repro::parse(&doc("[-1, 3]")).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Value);
    assert_eq!(
        e.message(),
        "repro document: inputs[0].shape[0] is -1, expected a non-negative size (shape [-1, 3])"
    );
    let e = repro::parse(&doc("[4611686018427387904, 4]"))
        .err()
        .unwrap();
    assert!(
        e.message()
            .starts_with("repro document: inputs[0]: shape [4611686018427387904, 4]"),
        "{e}"
    );
}
