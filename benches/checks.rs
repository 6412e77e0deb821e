//! The cost of error flags on a 10-op elementwise float32 pipeline (4M elements, every
//! op on its fused loop), from one run: checks OFF against COLLECT with every category
//! on. Build with `--features no-checks` for the reference where checks are compiled
//! out; OFF should be within noise of it, COLLECT at most 10 % slower.
//!
//! `cargo bench --bench checks` and `cargo bench --bench checks --features no-checks`.

use std::sync::Arc;
use std::time::Instant;

use ndx::checks::{self, Policy};
use ndx::exec::{Args, CallSite, Context, EvalMode, Input, Settings, new_context, output_tensor};

const N: usize = 1 << 22;

fn input(values: &[f32]) -> Input {
    Input::host(values, &[values.len() as i64]).unwrap()
}

/// The pipeline: operator, and whether it takes `y` as its second input.
const STEPS: [(&str, bool); 10] = [
    ("add", true),
    ("mul", true),
    ("sub", true),
    ("maximum", true),
    ("minimum", true),
    ("div", true),
    ("abs", false),
    ("sqrt", false),
    ("neg", false),
    ("relu", false),
];

/// Runs the pipeline once (SYNC_CPU: each op on the calling thread and the pool) and
/// returns the last output's first value.
fn pipeline(ctx: &Context, x: &Input, y: &Input) -> f32 {
    let mut cur = x.clone();
    for (op, binary) in STEPS {
        let inputs = if binary {
            vec![cur, y.clone()]
        } else {
            vec![cur]
        };
        let node = ctx
            .invoke(op, inputs, Args::new(), None, CallSite::default())
            .expect("invoke");
        cur = Input::Tensor(Arc::new(output_tensor(&node, 0).unwrap()));
    }
    let Input::Tensor(t) = cur else {
        unreachable!()
    };
    let bytes = t.resolve().unwrap().to_bytes().unwrap();
    f32::from_ne_bytes(bytes[..4].try_into().unwrap())
}

/// Median milliseconds of `rounds` runs.
fn time(ctx: &Context, x: &Input, y: &Input, rounds: usize) -> f64 {
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(pipeline(ctx, x, y));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[rounds / 2]
}

fn main() {
    let xs: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 * 0.01 + 1.0).collect();
    let ys: Vec<f32> = (0..N).map(|i| (i % 7) as f32 * 0.5 + 1.0).collect();
    let (x, y) = (input(&xs), input(&ys));
    let ctx = |policy| {
        new_context(
            Settings {
                mode: EvalMode::SyncCpu,
                checks: checks::Settings {
                    policy,
                    ..checks::Settings::default()
                },
                ..Settings::default()
            },
            0,
        )
    };
    let (off, collect) = (ctx(Policy::Off), ctx(Policy::Collect));
    // Warm up the buffer cache and the pool.
    time(&off, &x, &y, 3);
    time(&collect, &x, &y, 3);
    let rounds = 21;
    // Interleaved so that both see the same machine load.
    let mut t_off = Vec::new();
    let mut t_collect = Vec::new();
    for _ in 0..3 {
        t_off.push(time(&off, &x, &y, rounds));
        t_collect.push(time(&collect, &x, &y, rounds));
    }
    t_off.sort_by(f64::total_cmp);
    t_collect.sort_by(f64::total_cmp);
    let (o, c) = (t_off[1], t_collect[1]);
    let build = if cfg!(feature = "no-checks") {
        "checks compiled out (--features no-checks)"
    } else {
        "default build"
    };
    println!("10-op float32 pipeline, {N} elements, SYNC_CPU; {build}");
    println!("  checks OFF             {o:8.2} ms");
    println!("  checks COLLECT (all)   {c:8.2} ms   ({:.3}x OFF)", c / o);
    assert!(
        collect.take_check_errors().is_none(),
        "the pipeline raises no flag"
    );
    println!("  per op (median of {rounds}, ms): OFF / COLLECT");
    for (op, binary) in STEPS {
        let one = |ctx: &Context| {
            let mut samples: Vec<f64> = (0..rounds)
                .map(|_| {
                    let inputs = if binary {
                        vec![x.clone(), y.clone()]
                    } else {
                        vec![x.clone()]
                    };
                    let t = Instant::now();
                    let node = ctx
                        .invoke(op, inputs, Args::new(), None, CallSite::default())
                        .expect("invoke");
                    let e = t.elapsed().as_secs_f64() * 1e3;
                    drop(node);
                    e
                })
                .collect();
            samples.sort_by(f64::total_cmp);
            samples[rounds / 2]
        };
        let (a, b) = (one(&off), one(&collect));
        println!("    {op:8} {a:7.3} / {b:7.3}  ({:.2}x)", b / a);
    }
}
