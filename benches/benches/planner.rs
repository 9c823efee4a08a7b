//! Planning time: `plan(problem, Policy::Sonic)` end to end (the best plan, the second-best plan
//! without its vm-storage edges, and the explanation table), as `ofctl plan` calls it.
//!
//! `cargo bench -p sonic-benches --bench planner [-- --quick]`
//! - `chain/<stages>/<fanout>`: chains of 2 to 8 stages on the 4 default VM types: one sender,
//!   a broadcast into `fanout` instances, `one` edges between fanout stages, a gather into one
//!   last stage (the LightGBM shape, lengthened). Target: under 1 ms for 8 stages, fanout 1,000.
//! - `bounded-chain`: 4 stages, fanout 100, a latency bound below the unbounded optimum's
//!   latency, which sends the search to the label DP.
//! - `diamond/<fanout>`: a fork and a join (the label DP over frontiers).
//! - `evaluate`: one prediction of an 8-stage plan, the unit of every search.
//! - `budget/<problem>/<budget>`: pathological problems under the control plane's default
//!   budget (`sonic_control::learn::default_budget`: 2 s, 256 MiB) and under `plan`'s (no
//!   time limit, 1 GiB): a diamond of four fanout-1,000 stages joined by `one` edges, and one
//!   stage gathering 16 stages of fanout 4. Each case first prints whether its plan is exact,
//!   the limit that stopped it and its Perf/$ (stderr).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sonic_core::catalog::Catalog;
use sonic_core::dag::{Bounds, EdgeKind};
use sonic_core::model::{EdgeSpec, PlanProblem, Stage};
use sonic_core::planner::{Budget, Policy, baseline, plan, plan_within};

fn stage(i: usize, k: u32) -> Stage {
    Stage {
        parallel: 0.0,
        name: format!("s{i}"),
        memory_mb: 1500.0 + 300.0 * i as f64,
        cold_s: 5.0 + i as f64,
        hot_s: 4.0 + 0.5 * i as f64,
        instances: k,
        overhead_s: 0.0,
        overhead_hot_s: None,
        start_s: 0.0,
    }
}

fn edge(a: usize, b: usize, kind: EdgeKind, bytes: f64) -> EdgeSpec {
    EdgeSpec {
        from: format!("s{a}"),
        to: format!("s{b}"),
        kind,
        bytes,
    }
}

/// `n` stages: s0 (1) -broadcast-> s1..s(n-2) (k, `one` edges) -gather-> s(n-1) (1); for n = 2,
/// s0 -broadcast-> s1 (k).
fn chain(n: usize, k: u32, bounds: Bounds) -> PlanProblem {
    let stages = (0..n)
        .map(|i| {
            stage(
                i,
                if i == 0 || (n > 2 && i == n - 1) {
                    1
                } else {
                    k
                },
            )
        })
        .collect();
    let edges = (0..n - 1)
        .map(|i| {
            let kind = match i {
                0 => EdgeKind::Broadcast,
                _ if i == n - 2 => EdgeKind::Gather,
                _ => EdgeKind::One,
            };
            edge(i, i + 1, kind, 5e8)
        })
        .collect();
    PlanProblem::new(stages, edges, Catalog::default(), bounds).expect("valid chain")
}

fn diamond(k: u32) -> PlanProblem {
    let stages = vec![stage(0, 1), stage(1, k), stage(2, k), stage(3, 1)];
    let edges = vec![
        edge(0, 1, EdgeKind::Broadcast, 3e8),
        edge(0, 2, EdgeKind::Scatter, 3e8),
        edge(1, 3, EdgeKind::Gather, 1e8),
        edge(2, 3, EdgeKind::Gather, 1e8),
    ];
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid diamond")
}

/// Four stages of fanout `k` joined by `one` edges: a fork and a join.
fn one_diamond(k: u32) -> PlanProblem {
    let stages = (0..4).map(|i| stage(i, k)).collect();
    let edges = vec![
        edge(0, 1, EdgeKind::One, 3e8),
        edge(0, 2, EdgeKind::One, 3e8),
        edge(1, 3, EdgeKind::One, 1e8),
        edge(2, 3, EdgeKind::One, 1e8),
    ];
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid diamond")
}

/// One stage gathering `inputs` stages of fanout `k`.
fn join(inputs: usize, k: u32) -> PlanProblem {
    let mut stages: Vec<Stage> = (0..inputs).map(|i| stage(i % 8, k)).collect();
    for (i, s) in stages.iter_mut().enumerate() {
        s.name = format!("s{i}");
    }
    stages.push(Stage {
        name: format!("s{inputs}"),
        ..stage(0, 1)
    });
    let edges = (0..inputs)
        .map(|i| edge(i, inputs, EdgeKind::Gather, 1e8))
        .collect();
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid join")
}

fn budgets(c: &mut Criterion) {
    let control = sonic_control::learn::default_budget();
    let mut g = c.benchmark_group("budget");
    g.sample_size(10);
    for (name, pb) in [
        ("diamond-1000", one_diamond(1000)),
        ("join-16", join(16, 4)),
    ] {
        for (label, budget) in [("control", control), ("plan", Budget::default())] {
            let started = std::time::Instant::now();
            match plan_within(&pb, Policy::Sonic, budget, &started) {
                Ok(o) => eprintln!(
                    "budget/{name}/{label}: {:.2} s, exact {}, stopped {}, perf/$ {:.4e}",
                    started.elapsed().as_secs_f64(),
                    o.exact,
                    o.stopped
                        .map_or_else(|| "-".to_owned(), |s| s.limit.to_string()),
                    o.best.predicted.perf_per_dollar
                ),
                Err(e) => eprintln!("budget/{name}/{label}: {e}"),
            }
            g.bench_with_input(BenchmarkId::new(name, label), &pb, |b, pb| {
                b.iter(|| {
                    let started = std::time::Instant::now();
                    plan_within(black_box(pb), Policy::Sonic, budget, &started)
                })
            });
        }
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("chain");
    for n in [2usize, 4, 8] {
        for k in [1u32, 10, 100, 1000] {
            let pb = chain(n, k, Bounds::default());
            g.bench_with_input(BenchmarkId::new(format!("{n}"), k), &pb, |b, pb| {
                b.iter(|| plan(black_box(pb), Policy::Sonic).expect("a plan"))
            });
        }
    }
    g.finish();

    let free = chain(4, 100, Bounds::default());
    let optimum = plan(&free, Policy::Sonic).expect("a plan").best.predicted;
    let bounded = free
        .with_bounds(Bounds {
            max_latency_s: Some(optimum.latency_s * 0.97),
            max_cost_usd: None,
        })
        .expect("bounds");
    c.bench_function("bounded-chain", |b| {
        b.iter(|| plan(black_box(&bounded), Policy::Sonic))
    });

    let mut g = c.benchmark_group("diamond");
    for k in [4u32, 10, 30] {
        let pb = diamond(k);
        g.bench_with_input(BenchmarkId::from_parameter(k), &pb, |b, pb| {
            b.iter(|| plan(black_box(pb), Policy::Sonic).expect("a plan"))
        });
    }
    g.finish();

    let pb = chain(8, 1000, Bounds::default());
    let a = baseline(&pb, Policy::Remote);
    c.bench_function("evaluate", |b| {
        b.iter(|| pb.evaluate(black_box(&a)).expect("feasible"))
    });
}

criterion_group! {
    name = planner;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_group! {
    name = planner_budget;
    config = Criterion::default().warm_up_time(Duration::from_millis(1)).measurement_time(Duration::from_secs(1));
    targets = budgets
}
criterion_main!(planner, planner_budget);
