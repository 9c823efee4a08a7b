//! Planning under a budget: pathological problems (a stage with 16 inputs, a diamond of large
//! fanouts, a long chain) planned with tiny budgets come back quickly with the best plan known,
//! marked not exact with the limit that stopped the search, or with a clear budget error; with
//! an ample budget the same problems stay exact. Every limit here is deterministic (candidates,
//! memory, or a fake clock that advances as it is read): no test looks at the wall clock.

use std::cell::Cell;
use std::time::Duration;

use sonic_core::catalog::Catalog;
use sonic_core::dag::{Bounds, EdgeKind};
use sonic_core::model::{EdgeSpec, Method, PlanProblem, Stage};
use sonic_core::planner::{
    Budget, Limit, PlanError, PlanOutcome, Policy, StoppedSearch, baseline, plan, plan_within,
};

fn stage(i: usize, k: u32) -> Stage {
    Stage {
        parallel: 0.0,
        name: format!("s{i}"),
        memory_mb: 1500.0 + 300.0 * (i % 8) as f64,
        cold_s: 5.0 + (i % 8) as f64,
        hot_s: 4.0 + 0.5 * (i % 8) as f64,
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

/// `inputs` stages of fanout `k` gathered by one stage: its frontier holds every sender, and
/// its methods are 2^inputs combinations per label.
fn wide_join(inputs: usize, k: u32) -> PlanProblem {
    let mut stages: Vec<Stage> = (0..inputs).map(|i| stage(i, k)).collect();
    stages.push(stage(inputs, 1));
    let edges = (0..inputs)
        .map(|i| edge(i, inputs, EdgeKind::Gather, 1e8))
        .collect();
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid join")
}

/// Four stages of fanout `k` joined by `one` edges, a fork and a join (docs/model.md: about a
/// second for k = 1,000 with no budget).
fn diamond(k: u32) -> PlanProblem {
    let stages = (0..4).map(|i| stage(i, k)).collect();
    let edges = vec![
        edge(0, 1, EdgeKind::One, 3e8),
        edge(0, 2, EdgeKind::One, 3e8),
        edge(1, 3, EdgeKind::One, 1e8),
        edge(2, 3, EdgeKind::One, 1e8),
    ];
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid diamond")
}

/// A chain of `n` stages of fanout `k` (the hull search).
fn chain(n: usize, k: u32) -> PlanProblem {
    let stages = (0..n).map(|i| stage(i, k)).collect();
    let edges = (0..n - 1)
        .map(|i| edge(i, i + 1, EdgeKind::One, 5e8))
        .collect();
    PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("valid chain")
}

fn expansions(max: u64) -> Budget {
    Budget {
        max_expansions: Some(max),
        ..Budget::UNLIMITED
    }
}

fn within(pb: &PlanProblem, budget: Budget) -> Result<PlanOutcome, PlanError> {
    plan_within(pb, Policy::Sonic, budget, &|| Duration::ZERO)
}

fn product(o: &PlanOutcome) -> f64 {
    o.best.predicted.latency_s * o.best.predicted.cost_usd
}

/// A cut plan is a real plan of the problem, at least as good as the baselines.
fn sound(pb: &PlanProblem, o: &PlanOutcome) {
    let a = o.best.assignment(pb).expect("the plan names the problem");
    let p = pb.evaluate(&a).expect("the plan is feasible");
    assert!((p.latency_s * p.cost_usd - product(o)).abs() <= 1e-9 * product(o));
    for policy in [Policy::Remote, Policy::Direct] {
        let b = pb.evaluate(&baseline(pb, policy)).expect("baseline");
        assert!(
            product(o) <= b.latency_s * b.cost_usd,
            "no worse than {policy}"
        );
    }
    assert_eq!(o.table.len(), pb.stages().len(), "the plan is explained");
}

#[test]
fn a_stage_with_16_inputs_under_a_small_budget_returns_the_best_plan_known() {
    let pb = wide_join(16, 4);
    let out = within(&pb, expansions(20_000)).expect("a plan");
    assert!(!out.exact);
    let stopped = out.stopped.expect("stopped");
    assert_eq!(stopped.limit, Limit::Expansions { max: 20_000 });
    assert_eq!(stopped.search, StoppedSearch::Best);
    sound(&pb, &out);
    let report = serde_json::to_value(out.report("join", Policy::Sonic, 1)).expect("json");
    assert_eq!(report["exact"], false);
    assert_eq!(report["stopped"]["limit"], "expansions");
    assert_eq!(report["stopped"]["search"], "best");
}

#[test]
fn the_memory_limit_stops_a_search_whose_labels_grow() {
    let pb = wide_join(16, 4);
    let out = within(
        &pb,
        Budget {
            max_memory_bytes: Some(1 << 20),
            ..Budget::UNLIMITED
        },
    )
    .expect("a plan");
    assert!(!out.exact);
    assert_eq!(
        out.stopped.map(|s| s.limit),
        Some(Limit::Memory { bytes: 1 << 20 })
    );
    sound(&pb, &out);
}

#[test]
fn the_time_limit_is_read_from_the_clock_passed_in() {
    // A clock that advances a millisecond each time it is read: the search stops after a
    // known number of reads, whatever the machine.
    let reads = Cell::new(0u64);
    let clock = || {
        reads.set(reads.get() + 1);
        Duration::from_millis(reads.get())
    };
    let pb = diamond(1000);
    let budget = Budget {
        time: Some(Duration::from_millis(5)),
        ..Budget::default()
    };
    let out = plan_within(&pb, Policy::Sonic, budget, &clock).expect("a plan");
    assert!(!out.exact);
    assert_eq!(out.stopped.map(|s| s.limit), Some(Limit::Time { ms: 5 }));
    assert_eq!(reads.get(), 5, "the clock is not read after the limit");
    sound(&pb, &out);
}

#[test]
fn the_budget_is_checked_inside_each_search() {
    // One candidate is not enough for any search to finish: the label search (diamond, join)
    // and the hull search (chain) all stop inside, and answer with a plan they knew before.
    for pb in [diamond(1000), wide_join(3, 10), chain(6, 200)] {
        let out = within(&pb, expansions(1)).expect("a plan");
        assert!(!out.exact);
        assert_eq!(
            out.stopped.map(|s| (s.limit, s.search)),
            Some((Limit::Expansions { max: 1 }, StoppedSearch::Best))
        );
        sound(&pb, &out);
        assert!(
            out.table
                .iter()
                .flat_map(|d| &d.options)
                .any(|o| o.note.contains("stopped at its budget")),
            "the table says what was not reached"
        );
    }
}

#[test]
fn an_ample_budget_keeps_plans_exact() {
    for pb in [diamond(30), wide_join(3, 10), chain(6, 200)] {
        let free = plan(&pb, Policy::Sonic).expect("a plan");
        assert!(free.exact && free.stopped.is_none());
        let unlimited = within(&pb, Budget::UNLIMITED).expect("a plan");
        let generous = within(&pb, expansions(1 << 40)).expect("a plan");
        for o in [&unlimited, &generous] {
            assert!(o.exact && o.stopped.is_none());
            assert_eq!(o.best, free.best);
            assert_eq!(o.second_best, free.second_best);
        }
        // A cut plan is never better than the exact one.
        let cut = within(&pb, expansions(100)).expect("a plan");
        assert!(product(&cut) >= product(&free) * (1.0 - 1e-12));
    }
}

#[test]
fn a_budget_that_ends_between_the_searches_cuts_only_the_second_best() {
    // The label search counts one candidate per evaluated step (the table's `evaluated`): a
    // budget of exactly that lets the best plan's search finish and stops the second one's.
    let pb = diamond(6);
    let free = plan(&pb, Policy::Sonic).expect("a plan");
    assert!(
        free.best
            .edges
            .iter()
            .any(|e| e.method == Method::VmStorage),
        "the best plan uses vm-storage, so a second-best search runs"
    );
    let first: u64 = free.table.iter().map(|d| d.evaluated).sum();
    let out = within(&pb, expansions(first)).expect("a plan");
    assert!(out.exact, "the best plan's search ended within the budget");
    assert_eq!(out.best, free.best);
    assert_eq!(
        out.stopped.map(|s| (s.limit, s.search)),
        Some((Limit::Expansions { max: first }, StoppedSearch::SecondBest))
    );
    let second = out.second_best.expect("the best without vm-storage known");
    assert!(second.edges.iter().all(|e| e.method != Method::VmStorage));
}

#[test]
fn no_plan_within_the_bounds_before_the_limit_is_a_budget_error() {
    // Bounds at the optimum itself: no baseline meets them, so a search cut at once knows no
    // plan to answer with.
    let pb = diamond(30);
    let opt = plan(&pb, Policy::Sonic).expect("a plan").best.predicted;
    let bounded = pb
        .with_bounds(Bounds {
            max_latency_s: Some(opt.latency_s * (1.0 + 1e-9)),
            max_cost_usd: Some(opt.cost_usd * (1.0 + 1e-9)),
        })
        .expect("bounds");
    assert!(plan(&bounded, Policy::Sonic).expect("exact").exact);
    let err = within(&bounded, expansions(1)).expect_err("no plan known");
    match &err {
        PlanError::Budget {
            limit,
            stages,
            edges,
            ..
        } => {
            assert_eq!(*limit, Limit::Expansions { max: 1 });
            assert_eq!((*stages, *edges), (4, 4));
        }
        other => panic!("not a budget error: {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("planning stopped at the limit of 1 candidates evaluated before finding a plan that meets the bounds (4 stages, 4 edges"),
        "{msg}"
    );
}

#[test]
fn baselines_are_exact_whatever_the_budget() {
    let pb = wide_join(16, 4);
    for policy in [Policy::Remote, Policy::Direct, Policy::Local] {
        let out = plan_within(&pb, policy, expansions(0), &|| Duration::ZERO).expect("a plan");
        assert!(out.exact && out.stopped.is_none());
    }
}
