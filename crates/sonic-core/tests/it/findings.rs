//! The SONIC paper's qualitative findings (§2, Fig. 2 and Fig. 6), on the fixtures in
//! `tests/fixtures/plan/` that `ofctl plan`'s tests also use: no single data-passing method wins;
//! vm-storage at fanout 1, direct at fanout 3 with one trainer per VM, remote at fanout 12 on a
//! 750 Mbit/s NIC, and a direct/remote crossover that moves up on a faster NIC.

use std::path::{Path, PathBuf};

use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::model::{Method, PlanProblem};
use sonic_core::params::Params;
use sonic_core::planner::{Plan, PlanError, Policy, plan};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/plan")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn problem_with(params: &Params, catalog: &str) -> PlanProblem {
    let dag = Dag::from_yaml("lightgbm.dag.yaml", &read("lightgbm.dag.yaml")).expect("DAG fixture");
    let catalog = Catalog::from_yaml(&read(catalog)).expect("catalog fixture");
    PlanProblem::from_dag(&dag, params, catalog, dag.bounds).expect("problem")
}

fn problem(params: &str, catalog: &str) -> PlanProblem {
    problem_with(
        &Params::from_yaml(&read(params)).expect("params fixture"),
        catalog,
    )
}

fn method(plan: &Plan, from: &str, to: &str) -> Method {
    plan.edges
        .iter()
        .find(|e| e.from == from && e.to == to)
        .map(|e| e.method)
        .expect("edge")
}

/// The k3 parameters with `k` trainers (and `k` models gathered).
fn with_fanout(k: u32) -> Params {
    let mut p = Params::from_yaml(&read("lightgbm-k3.params.yaml")).expect("params fixture");
    let per_model = p.edge_bytes("train", "combine").expect("gather bytes").0 / 3;
    p.functions.get_mut("train").expect("train").instances = k;
    for e in &mut p.edges {
        if e.from == "train" {
            e.bytes.0 = per_model * u64::from(k);
        }
    }
    p
}

#[test]
fn fanout_1_runs_the_trainer_where_the_data_is() {
    let out = plan(
        &problem("lightgbm-k1.params.yaml", "catalog-750.yaml"),
        Policy::Sonic,
    )
    .unwrap();
    assert_eq!(method(&out.best, "pca", "train"), Method::VmStorage);
    let train = out
        .best
        .stages
        .iter()
        .find(|s| s.function == "train")
        .unwrap();
    let pca = out
        .best
        .stages
        .iter()
        .find(|s| s.function == "pca")
        .unwrap();
    assert_eq!(
        (train.vm_type.as_str(), train.vms),
        (pca.vm_type.as_str(), pca.vms)
    );
    // The resource manager may veto vm-storage: the second best does without it there.
    let second = out.second_best.expect("a second-best plan");
    assert_ne!(method(&second, "pca", "train"), Method::VmStorage);
    assert!(second.predicted.perf_per_dollar <= out.best.predicted.perf_per_dollar);
}

#[test]
fn fanout_3_one_trainer_per_vm_copies_vm_to_vm() {
    let pb = problem("lightgbm-k3.params.yaml", "catalog-750.yaml");
    // Two 5 GB trainers do not fit one 8 GiB VM: vm-storage would serialize them.
    let m5 = pb
        .catalog()
        .vm_types
        .iter()
        .position(|v| v.name == "m5.large")
        .unwrap();
    assert_eq!(pb.max_concurrent(pb.stage_index("train").unwrap(), m5), 1);
    let out = plan(&pb, Policy::Sonic).unwrap();
    assert_eq!(method(&out.best, "pca", "train"), Method::Direct);
    // The other methods, as the table shows them, are worse for the whole job.
    let train = out.table.iter().find(|d| d.function == "train").unwrap();
    for alt in train
        .methods
        .iter()
        .filter(|m| m.from == "pca" && !m.chosen)
    {
        let p = alt.perf_per_dollar.expect("both alternatives are feasible");
        assert!(p < out.best.predicted.perf_per_dollar, "{alt:?}");
    }
}

#[test]
fn fanout_12_on_a_750_mbit_nic_goes_through_the_store() {
    let out = plan(
        &problem("lightgbm-k12.params.yaml", "catalog-750.yaml"),
        Policy::Sonic,
    )
    .unwrap();
    assert_eq!(method(&out.best, "pca", "train"), Method::Remote);
    // The sender's NIC is the bottleneck of direct: 12 copies of 600 MB at 93.75 MB/s.
    let train = out.table.iter().find(|d| d.function == "train").unwrap();
    let direct = train
        .methods
        .iter()
        .find(|m| m.from == "pca" && m.method == Method::Direct)
        .unwrap();
    let remote = out
        .best
        .edges
        .iter()
        .find(|e| e.from == "pca")
        .unwrap()
        .predicted_s;
    assert!(direct.edge_s.unwrap() > 12.0 * 600e6 / 93.75e6 - 1e-6);
    assert!(remote < direct.edge_s.unwrap());
}

#[test]
fn no_method_wins_everywhere() {
    let methods: Vec<Method> = [
        "lightgbm-k1.params.yaml",
        "lightgbm-k3.params.yaml",
        "lightgbm-k12.params.yaml",
    ]
    .iter()
    .map(|p| {
        method(
            &plan(&problem(p, "catalog-750.yaml"), Policy::Sonic)
                .unwrap()
                .best,
            "pca",
            "train",
        )
    })
    .collect();
    assert_eq!(
        methods,
        vec![Method::VmStorage, Method::Direct, Method::Remote]
    );
}

/// The smallest fanout at which the planner sends the broadcast through the store.
fn crossover(catalog: &str) -> u32 {
    (1..=40)
        .find(|&k| {
            method(
                &plan(&problem_with(&with_fanout(k), catalog), Policy::Sonic)
                    .expect("a plan")
                    .best,
                "pca",
                "train",
            ) == Method::Remote
        })
        .unwrap_or_else(|| panic!("{catalog}: no crossover up to fanout 40"))
}

#[test]
fn a_faster_nic_moves_the_crossover_up() {
    let slow = crossover("catalog-750.yaml");
    let fast = crossover("catalog-fast.yaml");
    assert!(
        slow < fast,
        "crossover at {slow} (750 Mbit/s) vs {fast} (faster NIC)"
    );
    // Below each crossover (and above fanout 1) the planner copies directly.
    for (catalog, k) in [("catalog-750.yaml", slow), ("catalog-fast.yaml", fast)] {
        for j in 2..k {
            let out = plan(&problem_with(&with_fanout(j), catalog), Policy::Sonic).unwrap();
            assert_eq!(
                method(&out.best, "pca", "train"),
                Method::Direct,
                "{catalog} fanout {j}"
            );
        }
    }
    eprintln!("crossover: fanout {slow} at 750 Mbit/s, {fast} on the faster NIC");
}

#[test]
fn baselines_are_what_they_say_and_never_beat_sonic() {
    for params in [
        "lightgbm-k1.params.yaml",
        "lightgbm-k3.params.yaml",
        "lightgbm-k12.params.yaml",
    ] {
        let pb = problem(params, "catalog-750.yaml");
        let best = plan(&pb, Policy::Sonic)
            .unwrap()
            .best
            .predicted
            .perf_per_dollar;
        for (policy, m) in [
            (Policy::Remote, Method::Remote),
            (Policy::Direct, Method::Direct),
            (Policy::Local, Method::VmStorage),
        ] {
            let out = plan(&pb, policy).unwrap();
            assert!(
                out.best.edges.iter().all(|e| e.method == m),
                "{policy}: {:?}",
                out.best.edges
            );
            assert!(
                out.best.predicted.perf_per_dollar <= best * (1.0 + 1e-12),
                "{policy} beats sonic on {params}"
            );
        }
        let local = plan(&pb, Policy::Local).unwrap().best;
        assert!(
            local
                .stages
                .iter()
                .all(|s| s.vms == 1 && s.vm_type == local.stages[0].vm_type)
        );
        let remote = plan(&pb, Policy::Remote).unwrap().best;
        assert!(remote.stages.iter().all(|s| s.per_vm == 1));
        // `memory` without a tier is `remote`; with one, every edge it holds goes through it,
        // on remote's VMs, and it never beats sonic either.
        let memory = plan(&pb, Policy::Memory).unwrap().best;
        assert_eq!(memory.edges, remote.edges);
        let with = PlanProblem::from_dag(
            &Dag::from_yaml("lightgbm.dag.yaml", &read("lightgbm.dag.yaml")).unwrap(),
            &Params::from_yaml(&read(params)).unwrap(),
            Catalog {
                memory_tier: Some(sonic_core::catalog::MemoryTier::default()),
                ..Catalog::from_yaml(&read("catalog-750.yaml")).unwrap()
            },
            Default::default(),
        )
        .unwrap();
        let memory = plan(&with, Policy::Memory).unwrap().best;
        assert!(
            memory.edges.iter().all(|e| e.method == Method::Memory),
            "{:?}",
            memory.edges
        );
        assert_eq!(memory.stages, remote.stages);
        let best = plan(&with, Policy::Sonic)
            .unwrap()
            .best
            .predicted
            .perf_per_dollar;
        assert!(memory.predicted.perf_per_dollar <= best * (1.0 + 1e-12));
    }
}

#[test]
fn bounds_are_met_or_refused_with_what_is_achievable() {
    let pb = problem("lightgbm-k3.params.yaml", "catalog-750.yaml");
    let free = plan(&pb, Policy::Sonic).unwrap().best.predicted;
    // A latency bound below the unbounded optimum's latency: a faster, dearer plan.
    let bounds = sonic_core::dag::Bounds {
        max_latency_s: Some(free.latency_s * 0.95),
        max_cost_usd: None,
    };
    match plan(&pb.with_bounds(bounds).unwrap(), Policy::Sonic) {
        Ok(out) => {
            assert!(out.best.predicted.latency_s <= free.latency_s * 0.95);
            assert!(out.best.predicted.perf_per_dollar <= free.perf_per_dollar);
        }
        Err(PlanError::Latency { best_s, .. }) => assert!(best_s > free.latency_s * 0.95),
        Err(e) => panic!("{e}"),
    }
    let bounds = sonic_core::dag::Bounds {
        max_latency_s: Some(1.0),
        max_cost_usd: None,
    };
    let err = plan(&pb.with_bounds(bounds).unwrap(), Policy::Sonic).unwrap_err();
    assert!(
        matches!(err, PlanError::Latency { best_s, .. } if best_s > 1.0),
        "{err}"
    );
    assert!(err.to_string().contains("latency bound"));
    let bounds = sonic_core::dag::Bounds {
        max_latency_s: None,
        max_cost_usd: Some(1e-9),
    };
    let err = plan(&pb.with_bounds(bounds).unwrap(), Policy::Sonic).unwrap_err();
    assert!(matches!(err, PlanError::Cost { .. }), "{err}");
}

#[test]
fn a_function_too_big_for_every_vm_is_named() {
    let mut p = Params::from_yaml(&read("lightgbm-k3.params.yaml")).unwrap();
    p.functions.get_mut("train").unwrap().memory_mb = 900_000.0;
    let dag = Dag::from_yaml("lightgbm.dag.yaml", &read("lightgbm.dag.yaml")).unwrap();
    let err = PlanProblem::from_dag(
        &dag,
        &p,
        Catalog::from_yaml(&read("catalog-750.yaml")).unwrap(),
        dag.bounds,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("train") && err.contains("900000"), "{err}");
}

/// The memory tier (the default one: an ElastiCache-like node of 13 GiB at 750 Mbit/s) on a
/// DAG with a small and a large intermediate into one join: `memory` for the small one, which
/// waits for the long branch (under `direct` its sender's VMs would be held meanwhile, under
/// `remote` every file pays a request); `direct` for the large gather, which the tier would carry
/// twice (up, then down) at its node's rate.
#[test]
fn the_memory_tier_carries_the_small_intermediate_not_the_large() {
    use sonic_core::catalog::MemoryTier;
    use sonic_core::dag::{Bounds, EdgeKind};
    use sonic_core::model::{EdgeSpec, Stage};
    let stage = |name: &str, cold: f64, k: u32| Stage {
        parallel: 0.0,
        name: name.into(),
        memory_mb: 1500.0,
        cold_s: cold,
        hot_s: cold * 0.8,
        instances: k,
        overhead_s: 0.0,
        overhead_hot_s: None,
        start_s: 0.0,
    };
    let edge = |from: &str, to: &str, kind, bytes: f64| EdgeSpec {
        from: from.into(),
        to: to.into(),
        kind,
        bytes,
    };
    let problem = |memory_tier| {
        PlanProblem::new(
            vec![
                stage("split", 1.0, 1),
                stage("train", 30.0, 16),
                stage("stats", 1.0, 16),
                stage("merge", 0.5, 1),
            ],
            vec![
                edge("split", "train", EdgeKind::Scatter, 16e6),
                edge("split", "stats", EdgeKind::Scatter, 16e6),
                edge("train", "merge", EdgeKind::Gather, 2e9),
                edge("stats", "merge", EdgeKind::Gather, 16e6),
            ],
            Catalog {
                memory_tier,
                ..Catalog::default()
            },
            Bounds::default(),
        )
        .expect("problem")
    };
    let with = plan(&problem(Some(MemoryTier::default())), Policy::Sonic).expect("plan");
    let methods: Vec<_> = [
        ("split", "train"),
        ("split", "stats"),
        ("train", "merge"),
        ("stats", "merge"),
    ]
    .iter()
    .map(|&(a, b)| method(&with.best, a, b))
    .collect();
    assert_eq!(methods[3], Method::Memory, "{methods:?}");
    assert!(
        matches!(methods[2], Method::Direct | Method::Remote),
        "{methods:?}"
    );
    // Without a tier the same DAG is planned without it, and no better.
    let without = plan(&problem(None), Policy::Sonic).expect("plan");
    assert!(
        without
            .best
            .edges
            .iter()
            .all(|e| e.method != Method::Memory)
    );
    assert!(without.best.predicted.perf_per_dollar <= with.best.predicted.perf_per_dollar);
}
