//! The cluster-wide resource manager on a real cluster in this process (process sandbox): two
//! planned jobs that each need every vCPU of an agent are queued one behind the other, never run
//! side by side; a diamond whose branches were priced on VMs of their own runs them on two
//! agents at once, in the order and on the VMs the simulator gives the same plan (both run the
//! job machine); on one agent it is planned again so that they take turns on one VM, or, where
//! no plan can (the `remote` baseline), shares the agent and says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{Cluster, DAG, base64, sized_input};
use serde_json::json;
use sonic_api::control::{JobMode, JobStatus, JobSummary};
use sonic_core::regression::Convergence;

/// A forced `local` baseline planned with the models: the whole job on one m5.xlarge, its 4
/// mids at once (4 of the agent's 4 slots). The mids sleep so that the first job still holds
/// the agent when the second is offered.
fn local_job(n: usize) -> serde_json::Value {
    json!({
        "dag": "fan",
        "policy": "local",
        "planned": true,
        "params": { "mids": 4, "mid.sleep_ms": 600 },
        "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_whose_plans_exceed_the_pool_are_queued_not_oversubscribed() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = Cluster::start(rule).await;
    c.apply(DAG).await;
    // Profiling (unplanned, each instance holding a slot of its agent): the models to plan with,
    // at the parameters the planned jobs run with (models are kept per parameter setting).
    for n in [30_000usize, 90_000, 150_000] {
        let id = c
            .submit(json!({
                "dag": "fan",
                "params": { "mids": 4, "mid.sleep_ms": 600 },
                "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
            }))
            .await;
        let s = c.wait(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    }

    let first = c.submit(local_job(60_000)).await;
    let second = c.submit(local_job(60_000)).await;
    let mut summaries: Vec<JobSummary> = Vec::new();
    for id in [&first, &second] {
        let s = c.wait(id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{id}: {:?}", s.error);
        assert_eq!(s.mode, JobMode::Planned);
        summaries.push(s);
    }
    for s in &summaries {
        let plan = s.plan.as_ref().expect("a planned job records its grant");
        for st in &plan.stages {
            assert_eq!(st.vm_type, "m5.xlarge", "{plan:?}");
            assert_eq!(st.agents, vec!["a-2".to_owned()], "{plan:?}");
        }
        let mid = plan
            .stages
            .iter()
            .find(|st| st.function == "mid")
            .expect("mid");
        assert_eq!(mid.concurrent, 4, "every slot of a-2: {plan:?}");
    }
    // Whichever was admitted second waited for the first to release a-2, and says so.
    let db = c.control().state.db.clone();
    let (a, b) = (first.clone(), second.clone());
    let (ra, rb) = db
        .run(move |db| Ok((db.get_job(&a)?, db.get_job(&b)?)))
        .await
        .expect("db");
    let (ra, rb) = (ra.expect("first"), rb.expect("second"));
    let (earlier, later, later_summary) = if ra.started_ms <= rb.started_ms {
        (&ra, &rb, &summaries[1])
    } else {
        (&rb, &ra, &summaries[0])
    };
    let ended = earlier.finished_ms.expect("ended");
    let started = later.started_ms.expect("started");
    assert!(
        started >= ended,
        "the later job started at {started} ms, before the earlier one ended at {ended} ms: they overlapped on a-2"
    );
    let notes = &later_summary.plan.as_ref().expect("plan").notes;
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("queued ") && n.ends_with("behind 1 job")),
        "{notes:?}"
    );
    // Nothing is held once both ended.
    let rt = c.control().state.jobs.clone().expect("runtime");
    let probe = sonic_control::store::AgentSlot {
        vcpus: None,
        id: "a-2".into(),
        url: String::new(),
        vm_type: "m5.xlarge".into(),
    };
    let mut held = Vec::new();
    for _ in 0..4 {
        let slot = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            rt.resources().slot("probe", &probe, 1024),
        )
        .await
        .expect("every slot of a-2 is free again");
        held.push(slot.expect("a slot"));
    }
    drop(held);
    c.stop().await;
}

/// a feeds b and c, which both feed d; b and c sleep so that running them one after the other
/// shows.
const DIAMOND: &str = r#"
name: diamond
description: two branches that run at once
functions:
  - { name: a, image: sonic-lambdas:latest, command: [synthetic, copy, --to, "b,c"], timeout: 30s }
  - { name: b, image: sonic-lambdas:latest, command: [synthetic, copy, --to, d], timeout: 30s }
  - { name: c, image: sonic-lambdas:latest, command: [synthetic, copy, --to, d], timeout: 30s }
  - { name: d, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: a, to: b, kind: one }
  - { from: a, to: c, kind: one }
  - { from: b, to: d, kind: one }
  - { from: c, to: d, kind: one }
"#;

/// The `remote` baseline planned: every stage on a VM of its own. With two m5.large agents the
/// pool grants b and c different agents, and the executor runs them at once (it used to put
/// both on one agent under one reservation of one slot, one after the other). The `direct`
/// baseline cannot run on two: d fetches from b and c, whose VMs are held until it has, three
/// VMs at once; the job fails saying so rather than run on one agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamonds_branches_priced_on_their_own_vms_run_at_once_on_two_agents() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = Cluster::builder()
        .convergence(rule)
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .start()
        .await;
    c.apply(DIAMOND).await;
    let params = json!({ "b.sleep_ms": 1500, "c.sleep_ms": 1500 });
    for n in [30_000usize, 90_000, 150_000] {
        let id = c
            .submit(json!({
                "dag": "diamond",
                "params": params,
                "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
            }))
            .await;
        let s = c.wait(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    }
    let id = c
        .submit(json!({
            "dag": "diamond",
            "policy": "direct",
            "planned": true,
            "params": params,
            "input": { "name": "data.bin", "base64": base64(&sized_input(60_000)) },
        }))
        .await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Failed);
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("the direct plan cannot run")
            && error.contains("fetches from over direct edges"),
        "{error}"
    );
    assert!(s.functions.is_empty(), "nothing ran: {:?}", s.functions);
    let id = c
        .submit(json!({
            "dag": "diamond",
            "policy": "remote",
            "planned": true,
            "params": params,
            "input": { "name": "data.bin", "base64": base64(&sized_input(60_000)) },
        }))
        .await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(s.mode, JobMode::Planned);
    let plan = s.plan.as_ref().expect("a planned job records its grant");
    let agents_of = |f: &str| {
        plan.stages
            .iter()
            .find(|st| st.function == f)
            .map(|st| st.agents.clone())
            .expect("stage")
    };
    assert_ne!(agents_of("b"), agents_of("c"), "{plan:?}");
    let run = |f: &str| {
        s.functions
            .iter()
            .find(|r| r.name == f)
            .cloned()
            .expect("run")
    };
    let (b, cc) = (run("b"), run("c"));
    assert_ne!(b.agent, cc.agent, "b and c ran where they were granted");
    let span = |r: &sonic_api::control::FunctionRun| {
        (r.started_s.expect("started"), r.ended_s.expect("ended"))
    };
    let ((b0, b1), (c0, c1)) = (span(&b), span(&cc));
    assert!(
        b0 < c1 && c0 < b1,
        "b ran {b0:.2}-{b1:.2} s and c {c0:.2}-{c1:.2} s: one after the other"
    );
    runs_as_simulated(&s);
    c.stop().await;
}

/// The same diamond on a pool of one m5.large agent. Sonic's plan gives b and c VMs of their own
/// (they run at once); the pool can never hold them apart, so the job is re-planned within one
/// VM, where the only plans run b and c on a's VM one after the other (vm-storage), and runs
/// that. The `remote` baseline has no such plan (every stage on a VM of its own): it runs with
/// b and c sharing the agent, and its notes say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_the_pool_cannot_hold_apart_are_planned_again_or_said_to_share() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = Cluster::builder()
        .convergence(rule)
        .agents(&[("a-1", "m5.large")])
        .start()
        .await;
    c.apply(DIAMOND).await;
    let params = json!({ "b.sleep_ms": 300, "c.sleep_ms": 300 });
    for n in [30_000usize, 90_000, 150_000] {
        let id = c
            .submit(json!({
                "dag": "diamond",
                "params": params,
                "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
            }))
            .await;
        let s = c.wait(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    }
    // Sonic plans once the models converged; a baseline is planned when asked to be.
    let submit = |policy: &str| {
        let mut job = json!({
            "dag": "diamond",
            "policy": policy,
            "params": params,
            "input": { "name": "data.bin", "base64": base64(&sized_input(60_000)) },
        });
        if policy != "sonic" {
            job["planned"] = json!(true);
        }
        job
    };
    let s = c.wait(&c.submit(submit("sonic")).await).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(s.mode, JobMode::Planned);
    let plan = s.plan.as_ref().expect("a planned job records its grant");
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("re-planned for at most 1 m5.large")),
        "{:?}",
        plan.notes
    );
    let method = |s: &JobSummary, to: &str| {
        s.edges
            .iter()
            .find(|e| e.from == "a" && e.to == to)
            .map(|e| e.method)
            .expect("edge")
    };
    for to in ["b", "c"] {
        assert_eq!(
            method(&s, to),
            sonic_core::model::Method::VmStorage,
            "b and c continue on a's VM: {:?}",
            s.edges
        );
    }
    assert!(!plan.notes.iter().any(|n| n.starts_with("no plan fits")));

    let s = c.wait(&c.submit(submit("remote")).await).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    let plan = s.plan.as_ref().expect("plan");
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("no plan fits 1 m5.large")
                && n.contains("b, c hold 2 m5.large VMs at the same time")),
        "{:?}",
        plan.notes
    );
    c.stop().await;
}

/// Runs the plan job `s` ran through the simulator (alone, on a cluster of the plan's VM types,
/// with parameters of the diamond's shape: times do not matter here) and checks that the
/// system and the simulator opened the stages in the same order (which stage started only after
/// which ended) and ran every instance on the same VM of its stage's plan.
fn runs_as_simulated(s: &JobSummary) {
    use sonic_core::catalog::Catalog;
    use sonic_core::params::{EdgeParams, FunctionParams, Params};
    use sonic_sim::{Cluster as SimCluster, EdgeShape, JobSpec, PlanShape, SimConfig, StageShape};
    use std::collections::{BTreeMap, BTreeSet};

    let plan = s.plan.as_ref().expect("a plan");
    let shape = PlanShape {
        stages: plan
            .stages
            .iter()
            .map(|st| StageShape {
                function: st.function.clone(),
                vm_type: st.vm_type.clone(),
                vms: st.agents.len() as u32,
                concurrent: st.concurrent,
            })
            .collect(),
        edges: s
            .edges
            .iter()
            .map(|e| EdgeShape {
                from: e.from.clone(),
                to: e.to.clone(),
                method: e.method,
            })
            .collect(),
    };
    let dag = sonic_core::dag::Dag::from_yaml("diamond.yaml", DIAMOND).unwrap();
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for st in &shape.stages {
        *counts.entry(st.vm_type.clone()).or_default() += st.vms;
    }
    let instances = |f: &str| s.functions.iter().filter(|r| r.name == f).count() as u32;
    let params = Params {
        functions: dag
            .functions
            .iter()
            .map(|f| {
                let t = if f.name == "b" || f.name == "c" {
                    1.5
                } else {
                    0.2
                };
                (
                    f.name.clone(),
                    FunctionParams {
                        parallel: 0.0,
                        memory_mb: 128.0,
                        cold_s: t + 0.1,
                        hot_s: t,
                        instances: instances(&f.name),
                        overhead_s: 0.0,
                        overhead_hot_s: None,
                        start_s: 0.0,
                        cold_dist: None,
                        hot_dist: None,
                    },
                )
            })
            .collect(),
        edges: dag
            .edges
            .iter()
            .map(|e| EdgeParams {
                from: dag.functions[e.from].name.clone(),
                to: dag.functions[e.to].name.clone(),
                bytes: sonic_core::units::ByteSize(60_000),
            })
            .collect(),
    };
    let cluster =
        SimCluster::new(&Catalog::default(), &counts.into_iter().collect::<Vec<_>>()).unwrap();
    let job = JobSpec {
        name: "diamond".into(),
        dag: std::sync::Arc::new(dag.clone()),
        params,
        predicted: None,
        arrival_s: 0.0,
        policy: s.policy,
        bounds: dag.bounds,
    };
    let sim = sonic_sim::validate_plan(&cluster, &job, &shape, &SimConfig::default())
        .unwrap()
        .job;
    // Which stage started only once which had ended, in each.
    let after = |spans: &BTreeMap<String, (f64, f64)>, slack: f64| -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (x, &(_, x_end)) in spans {
            for (y, &(y_start, _)) in spans {
                if x != y && y_start >= x_end - slack {
                    out.insert((x.clone(), y.clone()));
                }
            }
        }
        out
    };
    let mut system: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for r in &s.functions {
        let (a, b) = (r.started_s.expect("started"), r.ended_s.expect("ended"));
        let e = system.entry(r.name.clone()).or_insert((a, b));
        *e = (e.0.min(a), e.1.max(b));
    }
    let simulated: BTreeMap<String, (f64, f64)> = sim
        .stages
        .iter()
        .map(|st| (st.function.clone(), (st.start_s, st.end_s)))
        .collect();
    // The system's times are in milliseconds.
    assert_eq!(
        after(&system, 1e-3),
        after(&simulated, 0.0),
        "system {system:?}, simulated {simulated:?}"
    );
    // Every instance on the same VM of its stage's plan.
    for st in &plan.stages {
        let sim_stage = sim
            .stages
            .iter()
            .find(|x| x.function == st.function)
            .expect("simulated stage");
        let mut ran: Vec<(u32, u32)> = s
            .functions
            .iter()
            .filter(|r| r.name == st.function)
            .map(|r| {
                let vm = st
                    .agents
                    .iter()
                    .position(|a| *a == r.agent)
                    .expect("a granted agent");
                (r.instance, vm as u32)
            })
            .collect();
        ran.sort_unstable();
        let simulated: Vec<(u32, u32)> = (0u32..).zip(sim_stage.instance_vms.clone()).collect();
        assert_eq!(ran, simulated, "{}", st.function);
    }
}
