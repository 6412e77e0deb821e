//! The explain report from Rust: graphs per deferred flush with their ops and time,
//! breaks with their reason and forcing site, invocations per mode, check flags, and
//! JSON whose numbers agree with the accessors.

use std::sync::Arc;

use ndx::checks;
use ndx::debug::explain::Flush;
use ndx::exec::{
    Args, CallSite, CapturePolicy, Context, EvalMode, Input, Node, Settings, new_context,
    output_tensor,
};

fn context(mode: EvalMode) -> Context {
    new_context(
        Settings {
            mode,
            capture: CapturePolicy::Native,
            ..Settings::default()
        },
        2,
    )
}

fn f32s(values: &[f32]) -> Input {
    Input::host(values, &[values.len() as i64]).unwrap()
}

fn out(node: &Arc<Node>) -> Input {
    Input::Tensor(Arc::new(output_tensor(node, 0).unwrap()))
}

fn call(ctx: &Context, op: &str, inputs: Vec<Input>, mode: Option<EvalMode>) -> Arc<Node> {
    ctx.invoke(op, inputs, Args::new(), mode, CallSite::default())
        .unwrap()
}

#[test]
fn an_evaluate_is_one_graph_with_its_ops_and_time() {
    let ctx = context(EvalMode::Deferred);
    let a = call(&ctx, "add", vec![f32s(&[1.0]), f32s(&[2.0])], None);
    let b = call(&ctx, "mul", vec![out(&a), out(&a)], None);
    call(&ctx, "neg", vec![out(&b)], None);
    assert!(ctx.explain().graphs.is_empty(), "nothing ran yet");
    ctx.evaluate().unwrap();
    let ex = ctx.explain();
    assert_eq!(ex.graphs_total, 1);
    let g = &ex.graphs[0];
    assert_eq!((g.reason, g.ops, g.seq), (Flush::Evaluate, 3, 1));
    assert!(g.time_ns.is_some(), "complete graphs have a time");
    assert_eq!((ex.breaks_total, ex.ops(), ex.graph_ops), (0, 3, 3));
    assert_eq!(ex.by_mode, [0, 0, 3, 0]);
}

#[test]
fn data_reads_and_consumers_are_breaks_with_their_reason() {
    let ctx = context(EvalMode::Deferred);
    let a = call(&ctx, "add", vec![f32s(&[1.0]), f32s(&[2.0])], None);
    let b = call(&ctx, "neg", vec![out(&a)], None);
    // A SYNC invocation consuming the deferred value forces its graph.
    let (x, sync) = (out(&b), Some(EvalMode::SyncCpu));
    let r = ctx.invoke("abs", vec![x], Args::new(), sync, CallSite::default());
    let line = line!() - 1;
    r.unwrap();
    // Reading data of a new deferred invocation forces another.
    let c = call(&ctx, "sqrt", vec![f32s(&[4.0])], None);
    let v = output_tensor(&c, 0).unwrap();
    assert_eq!(v.resolve().unwrap().to_bytes().unwrap(), 2f32.to_ne_bytes());
    // A wait is asked for: a graph, not a break.
    let d = call(&ctx, "sqrt", vec![f32s(&[9.0])], None);
    d.wait(None).unwrap();
    let ex = ctx.explain();
    let reasons: Vec<(Flush, u64)> = ex.graphs.iter().map(|g| (g.reason, g.ops)).collect();
    assert_eq!(
        reasons,
        [(Flush::Consumer, 2), (Flush::DataRead, 1), (Flush::Wait, 1)]
    );
    assert_eq!(ex.breaks_total, 2);
    let b0 = &ex.breaks[0];
    assert_eq!(
        (b0.reason, b0.graph, b0.seq),
        (Flush::Consumer, 0, 2),
        "#2 was needed"
    );
    let f = &b0.site.frames()[0];
    assert!(f.file().unwrap().ends_with("tests/explain_api.rs"));
    assert_eq!(f.line(), line, "the consuming invocation's line");
    assert_eq!(
        (ex.breaks[1].reason, ex.breaks[1].graph),
        (Flush::DataRead, 1)
    );
    assert_eq!(ex.by_mode, [1, 0, 4, 0]);
}

#[test]
fn eager_and_sync_work_makes_no_graphs() {
    let ctx = context(EvalMode::Eager);
    let a = call(&ctx, "add", vec![f32s(&[1.0]), f32s(&[2.0])], None);
    call(&ctx, "neg", vec![out(&a)], Some(EvalMode::SyncFull));
    ctx.evaluate().unwrap();
    let ex = ctx.explain();
    assert_eq!((ex.graphs_total, ex.breaks_total), (0, 0));
    assert_eq!(ex.by_mode, [0, 1, 0, 1]);
}

#[test]
fn the_json_agrees_with_the_counters() {
    let ctx = context(EvalMode::Deferred);
    ctx.set_checks(checks::Settings {
        policy: checks::Policy::Collect,
        ..checks::Settings::default()
    });
    let a = call(&ctx, "check_finite", vec![f32s(&[f32::NAN, 1.0])], None);
    call(&ctx, "add", vec![out(&a), out(&a)], None);
    assert!(ctx.evaluate().is_err(), "the flag is reported");
    let ex = ctx.explain();
    let doc: serde_json::Value = serde_json::from_str(&ex.json()).unwrap();
    assert_eq!(doc["graphs_total"], 1);
    assert_eq!(doc["ops"], 2);
    assert_eq!(doc["graph_ops"], 2);
    assert_eq!(doc["invocations"]["deferred"], 2);
    assert_eq!(doc["checks_raised"], 1);
    assert_eq!(doc["graphs"][0]["reason"], "evaluate");
    assert_eq!(doc["graphs"][0]["ops"], 2);
    assert!(doc["graphs"][0]["time_ns"].as_u64().is_some());
    assert_eq!(doc["breaks"].as_array().unwrap().len(), 0);
}
