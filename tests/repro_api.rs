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

/// `ndx_repro_run` on `doc` (a SYNC_CPU context): the call-time error's kind and
/// message, or None when it ran.
fn replay_error(doc: &str) -> Option<(i32, String)> {
    use ndx::ffi::*;
    let mut ctx = std::ptr::null_mut();
    assert!(ndx_context_new(std::ptr::null(), &mut ctx).is_null());
    let json = std::ffi::CString::new(doc).unwrap();
    let mut f = std::ptr::null_mut();
    let e = ndx_repro_run(ctx, json.as_ptr(), &mut f);
    let result = (!e.is_null()).then(|| {
        assert!(f.is_null(), "no future on failure");
        // SAFETY: a live error's message is a valid C string.
        let msg = unsafe { std::ffi::CStr::from_ptr(ndx_error_message(e)) };
        (ndx_error_kind(e), msg.to_string_lossy().into_owned())
    });
    ndx_error_free(e);
    ndx_future_release(f);
    ndx_context_release(ctx);
    result
}

fn one_input_doc(op: &str, input: &str) -> String {
    format!(
        "{{\"ndx_repro\": 1, \"op\": \"{op}\", \"args\": [], \"mode\": \"sync_cpu\", \
         \"inputs\": [{input}]}}"
    )
}

/// A document from a bug report is hostile: its inputs get the limits of a tensor
/// imported from C (NDX_MAX_NDIM dimensions, a layout of one ASCII letter per
/// dimension), each refused naming the document's field rather than an "output".
#[test]
fn replayed_inputs_get_the_limits_of_an_imported_tensor() {
    let value = ndx::ffi::ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    let ones = |n: usize| format!("[{}]", vec!["1"; n].join(", "));
    // 70 dimensions: `sum` reduces them to a scalar, so no output would catch them.
    let doc = one_input_doc(
        "sum",
        &format!(
            "{{\"dtype\": \"int8\", \"shape\": {}, \"bytes\": \"07\"}}",
            ones(70)
        ),
    );
    assert_eq!(
        replay_error(&doc),
        Some((
            value,
            "repro document: inputs[0].shape has 70 dimensions, expected at most 64 \
             (NDX_MAX_NDIM)"
                .into()
        ))
    );
    // The most an imported tensor may have still replays.
    let doc = one_input_doc(
        "sum",
        &format!(
            "{{\"dtype\": \"int8\", \"shape\": {}, \"bytes\": \"07\"}}",
            ones(64)
        ),
    );
    assert_eq!(replay_error(&doc), None);
    let layout = |l: &str| {
        one_input_doc(
            "neg",
            &format!(
                "{{\"dtype\": \"int8\", \"shape\": [1, 1], \"layout\": {l}, \"bytes\": \"07\"}}"
            ),
        )
    };
    for (l, why) in [
        (
            "\"HWC\"",
            "layout \"HWC\" has 3 letters but the tensor has ndim 2",
        ),
        ("\"HH\"", "layout \"HH\" names dimension 'H' twice"),
        ("\"H W\"", "layout \"H W\" must consist of ASCII letters"),
    ] {
        let (kind, msg) = replay_error(&layout(l)).expect("refused");
        assert_eq!(kind, value, "{msg}");
        assert!(
            msg.starts_with(&format!("repro document: inputs[0]: {why}")),
            "{msg}"
        );
    }
    assert_eq!(
        replay_error(&layout("5")),
        Some((
            value,
            "repro document: inputs[0].layout is not a string".into()
        ))
    );
    assert_eq!(replay_error(&layout("\"HW\"")), None);
    assert_eq!(replay_error(&layout("null")), None);
}

/// The declared size is checked against the bytes a document carries before anything
/// is allocated: a petabyte declared with one byte of data is a ValueError naming the
/// field, not an attempt to allocate it (a MemoryError about "the output").
#[test]
fn a_huge_declared_size_with_little_data_allocates_nothing() {
    let value = ndx::ffi::ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    let doc = |shape: &str, bytes: &str| {
        one_input_doc(
            "neg",
            &format!("{{\"dtype\": \"int16\", \"shape\": {shape}, \"bytes\": {bytes}}}"),
        )
    };
    assert_eq!(
        replay_error(&doc("[1125899906842624]", "\"0100\"")),
        Some((
            value,
            "repro document: inputs[0].bytes has 4 hexadecimal digits, expected \
             4503599627370496: two per byte of its 2251799813685248-byte data (dtype int16, \
             shape [1125899906842624])"
                .into()
        ))
    );
    let (kind, msg) = replay_error(&doc("[2]", "\"0100\"")).expect("too short");
    assert_eq!(kind, value);
    assert!(
        msg.contains("has 4 hexadecimal digits, expected 8"),
        "{msg}"
    );
    let (kind, msg) = replay_error(&doc("[1]", "\"01zz\"")).expect("not hex");
    assert_eq!(
        (kind, msg.as_str()),
        (value, "repro document: inputs[0].bytes is not hexadecimal")
    );
    // Bytes of the wrong type are not mistaken for bytes a cap left out.
    assert_eq!(
        replay_error(&doc("[1]", "5")),
        Some((
            value,
            "repro document: inputs[0].bytes is not a string of hexadecimal digits".into()
        ))
    );
    let (_, msg) = replay_error(&doc("[1]", "null")).expect("capped");
    assert!(
        msg.contains("inputs[0] has no bytes: the context that wrote it capped"),
        "{msg}"
    );
    assert_eq!(replay_error(&doc("[1]", "\"0100\"")), None);
}

/// An argument set twice is refused naming both entries (a reader of the file would
/// see one value and the replay use another), and a document listing 100,000
/// arguments is read in one pass: each name was searched for among the earlier ones,
/// so that document took a minute (quadratic) before the operator refused its first.
#[test]
fn arguments_are_distinct_and_many_are_read_in_one_pass() {
    let value = ndx::ffi::ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    let doc = |args: &str| {
        format!(
            "{{\"ndx_repro\": 1, \"op\": \"sum\", \"args\": [{args}], \"mode\": \"sync_cpu\", \
             \"inputs\": [{{\"dtype\": \"int8\", \"shape\": [2], \"bytes\": \"0102\"}}]}}"
        )
    };
    let axes = |v: i64| format!("{{\"name\": \"axes\", \"type\": \"ints\", \"value\": [{v}]}}");
    let keep = "{\"name\": \"keepdims\", \"type\": \"bool\", \"value\": true}";
    assert_eq!(
        replay_error(&doc(&format!("{}, {keep}, {}", axes(0), axes(5)))),
        Some((
            value,
            "repro document: args[2] sets 'axes' again (args[0] set it first)".into()
        ))
    );
    assert_eq!(replay_error(&doc(&format!("{}, {keep}", axes(0)))), None);
    let many: Vec<String> = (0..100_000)
        .map(|i| format!("{{\"name\": \"a{i}\", \"type\": \"int\", \"value\": {i}}}"))
        .collect();
    assert_eq!(
        replay_error(&doc(&many.join(", "))),
        Some((
            value,
            "operator 'sum' has no argument 'a0' (it takes: axes, keepdims)".into()
        ))
    );
}

/// What a replay refuses says how to get it right: a host operator is registered
/// first, and a float is a number or one of the spellings the writer uses.
#[test]
fn replay_errors_say_what_would_be_accepted() {
    let value = ndx::ffi::ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    let input = "{\"dtype\": \"float32\", \"shape\": [1], \"bytes\": \"0000c07f\"}";
    assert_eq!(
        replay_error(&one_input_doc("my_host_op", input)),
        Some((
            value,
            "the repro document's operator 'my_host_op' is unknown on this context: a host \
             operator must be registered (ndx_register_op) before its failures replay"
                .into()
        ))
    );
    let doc = |value: &str| {
        format!(
            "{{\"ndx_repro\": 1, \"op\": \"clamp\", \"args\": [{{\"name\": \"lo\", \
             \"type\": \"float\", \"value\": {value}}}], \"mode\": \"sync_cpu\", \
             \"inputs\": [{input}]}}"
        )
    };
    assert_eq!(
        replay_error(&doc("\"NaN\"")),
        Some((
            value,
            "repro document: args[0] ('lo') has a value that is not float (numbers, or \
             \"nan\", \"inf\" and \"-inf\")"
                .into()
        ))
    );
    assert_eq!(replay_error(&doc("\"-inf\"")), None);
    // An argument type or a dtype name the reader does not know is named.
    let typed = |ty: &str, value: &str| {
        format!(
            "{{\"ndx_repro\": 1, \"op\": \"cast\", \"args\": [{{\"name\": \"dtype\", \
             \"type\": \"{ty}\", \"value\": {value}}}], \"mode\": \"sync_cpu\", \
             \"inputs\": [{input}]}}"
        )
    };
    assert_eq!(
        replay_error(&typed("complex", "\"float64\"")),
        Some((
            value,
            "repro document: args[0] has unknown type 'complex'".into()
        ))
    );
    assert_eq!(
        replay_error(&typed("dtype", "\"float128\"")),
        Some((
            value,
            "repro document: args[0]: unknown dtype 'float128'".into()
        ))
    );
    assert_eq!(replay_error(&typed("dtype", "\"float64\"")), None);
}

/// An object naming a key twice is refused, naming the key: the JSON reader kept the
/// last silently, so a document with two "op"s replayed whichever came second.
#[test]
fn replay_refuses_a_repeated_key() {
    let value = ndx::ffi::ndx_error_kind_t::NDX_ERROR_VALUE as i32;
    let input = "{\"dtype\": \"float32\", \"shape\": [1], \"bytes\": \"0000c07f\"}";
    let clean = one_input_doc("neg", input);
    assert_eq!(replay_error(&clean), None);
    let twice_op = clean.replacen("\"op\": \"neg\"", "\"op\": \"sqrt\", \"op\": \"neg\"", 1);
    let twice_dtype = clean.replacen("\"dtype\"", "\"dtype\": \"int8\", \"dtype\"", 1);
    for (doc, key) in [(twice_op, "op"), (twice_dtype, "dtype")] {
        assert_ne!(doc, clean);
        let (kind, message) = replay_error(&doc).expect("refused");
        assert_eq!(kind, value);
        assert!(
            message.starts_with(&format!(
                "repro document: key \"{key}\" appears twice in one object at line 1"
            )),
            "{message}"
        );
    }
}
