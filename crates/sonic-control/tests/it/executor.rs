//! The executor without a network: the control plane (HTTP API, SQLite, a local-directory store)
//! runs jobs on in-memory agents ([`MemoryAgents`]), which end every run at once with the report a
//! test scripts. What is checked is what the executor sends where, and in which order.
//!
//! Every party runs in the test's runtime, so it runs on a paused clock: the backoffs, polls
//! and deadlines are waited out at once and in order. The harness's own limit on waiting for a
//! job is on the real clock (`Cluster::ended`), so a job that never ends still fails the test.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sonic_api::agent::{OutputFile, RunReport, RunRequest, RunStatus};
use sonic_api::control::{JobStatus, JobSummary};
use sonic_control::exec::agents::{MemoryAgents, succeeded};
use sonic_control::store::AgentSlot;

use crate::support::Cluster;

const CATALOG: &str = r#"
vm_types:
  - { name: m5.large, vcpus: 2, memory_mb: 8192, network_mbps: 750, usd_per_hour: 0.107 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

/// gen -> mid (3 instances, broadcast) -> sink (gather).
const DAG: &str = r#"
name: fan
functions:
  - { name: gen, image: i, command: [x], timeout: 30s }
  - { name: mid, image: i, command: [x], instances: 3, timeout: 30s }
  - { name: sink, image: i, command: [x], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

/// A report that wrote one file for every route of the request.
fn wrote(req: &RunRequest) -> RunReport {
    let mut r = succeeded(req);
    r.outputs = req
        .outputs
        .iter()
        .map(|o| OutputFile {
            file_path: format!("{}/{}/{}/out", req.function, req.instance, o.to),
            to: o.to.clone(),
            name: "out".into(),
            size: 1,
            checksum: String::new(),
            key: o.upload_prefix.as_ref().map(|p| format!("{p}/out")),
            upload_seconds: None,
            in_memory: o.memory,
            spilled: None,
        })
        .collect();
    r
}

fn failed(req: &RunRequest, why: &str) -> RunReport {
    let mut r = succeeded(req);
    r.status = RunStatus::Failed;
    r.error = Some(why.into());
    r
}

/// Two m5.large agents in memory (`m-1`, `m-2`) answering as `behaviour` says, registered with
/// no network figure; the executor retrying after 1 ms, polling every 1 ms instead of being
/// pushed reports, giving an agent 200 ms to answer its health check; `DAG` applied; a job ends
/// within 60 s.
async fn plane(
    behaviour: impl Fn(&AgentSlot, &RunRequest) -> RunReport + Send + Sync + 'static,
) -> Cluster {
    let c = Cluster::builder()
        .agents(&[("m-1", "m5.large"), ("m-2", "m5.large")])
        .memory_agents(Arc::new(MemoryAgents::new(behaviour)))
        .catalog(Some(CATALOG))
        .tune(|jobs| {
            jobs.backoff = Duration::from_millis(1);
            jobs.push_reports = false;
            jobs.poll_interval = Duration::from_millis(1);
            jobs.health_timeout = Duration::from_millis(200);
        })
        .tune_agents(|agent| agent.network_mbps = None)
        .wait_deadline(Duration::from_secs(60))
        .start()
        .await;
    c.apply(DAG).await;
    c
}

impl Cluster {
    /// Submits a `remote` job of the DAG and waits for its end.
    async fn run_remote(&self) -> (Value, JobSummary) {
        self.run(json!({"dag": "fan", "policy": "remote"})).await
    }
}

/// The position in the sent log of the last request of `function`, and of its first.
fn span(sent: &[(String, RunRequest)], function: &str) -> (usize, usize) {
    let at: Vec<usize> = sent
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| r.function == function)
        .map(|(i, _)| i)
        .collect();
    (at[0], at[at.len() - 1])
}

#[tokio::test(start_paused = true)]
async fn a_job_runs_on_in_memory_agents_retrying_a_failed_attempt() {
    let p = plane(|_, req| {
        if req.function == "mid" && req.instance == 1 && req.attempt == 1 {
            failed(req, "flaky")
        } else {
            wrote(req)
        }
    })
    .await;
    let (v, s) = p.run_remote().await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let sent = p.memory().sent();
    // gen once, mid 3 instances + 1 retry, sink once.
    assert_eq!(sent.len(), 6, "{sent:#?}");
    let (_, gen_last) = span(&sent, "gen");
    let (mid_first, mid_last) = span(&sent, "mid");
    let (sink_first, _) = span(&sent, "sink");
    assert!(gen_last < mid_first && mid_last < sink_first, "{sent:#?}");
    let ids: std::collections::BTreeSet<String> = sent.iter().map(|(_, r)| r.run_id()).collect();
    assert_eq!(ids.len(), sent.len(), "a run id was sent twice");
    let retried = s
        .functions
        .iter()
        .find(|f| f.name == "mid" && f.instance == 1)
        .expect("mid 1");
    assert_eq!(retried.attempts, 2);
    // The sink reads all three mids' files.
    let sink = &sent.last().expect("sink").1;
    assert_eq!(sink.inputs.len(), 3, "{sink:#?}");
}

/// Each agent fetches a stage's `direct` and `remote` inputs once, in one request, before the
/// stage's runs there read them (the model's fetch at the stage's start): one fetch per agent
/// and stage, each file once, every input a run reads on the agent among them.
#[tokio::test(start_paused = true)]
async fn each_agent_fetches_a_stages_inputs_once_before_its_runs() {
    use sonic_api::agent::FileSource;
    for policy in ["remote", "direct"] {
        let p = plane(|_, req| wrote(req)).await;
        let (v, s) = p.run(json!({"dag": "fan", "policy": policy})).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        let (sent, fetched) = (p.memory().sent(), p.memory().fetched());
        let mut wanted = std::collections::BTreeSet::new();
        for (agent, req) in &sent {
            for input in &req.inputs {
                if !matches!(input.source, FileSource::VmStorage { .. }) {
                    wanted.insert((agent.clone(), req.function.clone()));
                    assert!(
                        fetched
                            .iter()
                            .any(|(a, f)| a == agent && f.files.contains(&input.source)),
                        "{policy}: {} {} reads {:?} on {agent}, which no fetch there brought: {fetched:#?}",
                        req.function,
                        req.instance,
                        input.source
                    );
                }
            }
        }
        // mid on the agents its 3 instances run on, sink on its one.
        assert_eq!(fetched.len(), wanted.len(), "{policy}: {fetched:#?}");
        // The summary has each fetch, on its agent, for its stage, before that stage's runs
        // there were sent (a dilated cluster's accounting counts it as agent time).
        let in_summary: std::collections::BTreeSet<(String, String)> = s
            .fetches
            .iter()
            .map(|f| (f.agent.clone(), f.function.clone()))
            .collect();
        assert_eq!(in_summary, wanted, "{policy}: {v}");
        for f in &s.fetches {
            assert!(f.started_s <= f.ended_s, "{f:?}");
            let first_sent = s
                .functions
                .iter()
                .filter(|r| r.name == f.function && r.agent == f.agent)
                .filter_map(|r| r.started_s)
                .fold(f64::INFINITY, f64::min);
            assert!(
                f.ended_s <= first_sent + 1e-9,
                "{policy}: {f:?} ended after a run was sent: {v}"
            );
        }
        assert!(wanted.len() >= 2, "{policy}: {wanted:?}");
        for (_, f) in &fetched {
            assert_eq!(f.job_id, s.job_id);
            for (i, x) in f.files.iter().enumerate() {
                assert!(!f.files[..i].contains(x), "{policy}: fetched twice: {f:#?}");
            }
            let direct = f
                .files
                .iter()
                .all(|x| matches!(x, FileSource::Direct { .. }));
            assert_eq!(direct, policy == "direct", "{f:#?}");
        }
    }
}

/// A function's `retries:` in its DAG file overrides the control plane's policy (3 attempts):
/// `patient` retries its exits 4 times and succeeds at its 5th attempt; `picky` retries only
/// timeouts, so its exit fails the job at its first attempt, saying so.
#[tokio::test(start_paused = true)]
async fn a_functions_retries_decide_what_is_tried_again() {
    let p = plane(|_, req| match (req.function.as_str(), req.attempt) {
        ("patient", 1..=4) | ("picky", _) => failed(req, "flaky"),
        _ => wrote(req),
    })
    .await;
    p.apply(
        "name: retried\nfunctions:\n  - { name: patient, image: i, command: [x], timeout: 30s, retries: { limit: 4, backoff: 1ms } }\n  - { name: picky, image: i, command: [x], timeout: 30s, retries: { on: [timeout] } }\nedges:\n  - { from: patient, to: picky, kind: one }\n",
    )
    .await;
    let (v, s) = p.run(json!({"dag": "retried", "policy": "remote"})).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("function picky instance 0 failed after 1 attempt (its retries do not cover `error` failures): failed"),
        "{v}"
    );
    assert_eq!(s.failure, Some(sonic_core::machine::Failure::Exit));
    let attempts = |function: &str| -> Vec<u32> {
        p.memory()
            .sent()
            .iter()
            .filter(|(_, r)| r.function == function)
            .map(|(_, r)| r.attempt)
            .collect()
    };
    assert_eq!(attempts("patient"), vec![1, 2, 3, 4, 5]);
    assert_eq!(attempts("picky"), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn an_instance_failing_every_attempt_fails_the_job_and_starts_nothing_after_it() {
    let p = plane(|_, req| {
        if req.function == "mid" && req.instance == 2 {
            failed(req, "always")
        } else {
            wrote(req)
        }
    })
    .await;
    let (v, s) = p.run_remote().await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("function mid instance 2 failed after 3 attempts")
            && error.contains("always"),
        "{v}"
    );
    // The kind of failure travels with it: the lambda's own (it exited with an error).
    assert_eq!(v["failure"], "exit", "{v}");
    assert_eq!(s.failure, Some(sonic_core::machine::Failure::Exit));
    let sent = p.memory().sent();
    assert!(sent.iter().all(|(_, r)| r.function != "sink"), "{sent:#?}");
    let attempts: Vec<u32> = sent
        .iter()
        .filter(|(_, r)| r.function == "mid" && r.instance == 2)
        .map(|(_, r)| r.attempt)
        .collect();
    assert_eq!(attempts, vec![1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_lost_agent_makes_the_job_run_again_without_it() {
    let p = plane(|_, req| wrote(req)).await;
    p.memory().set_down("m-2", true);
    let (v, s) = p.run_remote().await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let sent = p.memory().sent();
    // The second execution sends everything to m-1 (the down agent records nothing).
    assert!(sent.iter().all(|(a, _)| a == "m-1"), "{sent:#?}");
    assert!(
        sent.iter().any(|(_, r)| r.execution == 2),
        "no second execution: {sent:#?}"
    );
    assert!(
        s.functions.iter().all(|f| f.agent == "m-1"),
        "{:#?}",
        s.functions
    );
    // The abandoned execution's work was paid for: the job's cost is more than what the last
    // execution held its one VM for (m-1, an m5.large, from the first start to the last end).
    let start = s
        .functions
        .iter()
        .filter_map(|r| r.started_s)
        .fold(f64::MAX, f64::min);
    let end = s
        .functions
        .iter()
        .filter_map(|r| r.ended_s)
        .fold(0.0, f64::max);
    let last = (end - start) * 0.107 / 3600.0;
    assert!(
        s.cost_usd > last * 1.000_001,
        "cost {} counts only the last execution ({last})",
        s.cost_usd
    );
}

/// Idempotent submission (interfaces.md §7): a second `POST /v1/jobs` of a DAG with the same
/// `Idempotency-Key` answers 200 with the first job, whatever its state, and starts nothing;
/// submissions racing with one key make one job; another key or another DAG makes a new one;
/// a bad key is a 400 that stores nothing.
#[tokio::test(start_paused = true)]
async fn a_repeated_submission_with_its_key_returns_the_first_job() {
    let p = plane(|_, req| wrote(req)).await;
    p.apply("name: other\nfunctions:\n  - { name: only, image: i, command: [x], timeout: 30s }\n")
        .await;
    let post = |dag: &'static str, key: &'static str| {
        p.http
            .post(p.url_for("/v1/jobs"))
            .bearer_auth(crate::support::TOKEN)
            .header("Idempotency-Key", key)
            .json(&json!({"dag": dag, "policy": "remote"}))
            .send()
    };
    let answer = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let v: Value = r.json().await.expect("json");
        (
            status,
            v["job_id"].as_str().unwrap_or_default().to_owned(),
            v,
        )
    };
    let (status, first, _) = answer(post("fan", "nightly-2026-11-28").await.expect("post")).await;
    assert_eq!(status, 202);
    let s = p.wait(&first).await;
    assert_eq!(s.status, JobStatus::Succeeded);
    let sent = p.memory().sent().len();
    let (status, again, v) = answer(post("fan", "nightly-2026-11-28").await.expect("post")).await;
    assert_eq!((status, again.as_str()), (200, first.as_str()), "{v}");
    assert_eq!(v["status"], "succeeded", "its current state: {v}");
    assert_eq!(p.memory().sent().len(), sent, "nothing started");

    // Racing submissions with a new key: one job.
    let (a, b) = tokio::join!(post("fan", "race"), post("fan", "race"));
    let (sa, ja, _) = answer(a.expect("post")).await;
    let (sb, jb, _) = answer(b.expect("post")).await;
    assert_eq!(ja, jb);
    let mut statuses = [sa, sb];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 202]);

    // Another key, another DAG: new jobs.
    let (status, other_key, _) =
        answer(post("fan", "nightly-2026-11-29").await.expect("post")).await;
    assert_eq!(status, 202);
    let (status, other_dag, _) =
        answer(post("other", "nightly-2026-11-28").await.expect("post")).await;
    assert_eq!(status, 202);
    let ids = [&first, &ja, &other_key, &other_dag];
    let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), 4, "{ids:?}");

    let job_count = || async {
        let v: Value = p
            .http
            .get(p.url_for("/v1/jobs"))
            .bearer_auth(crate::support::TOKEN)
            .send()
            .await
            .expect("jobs")
            .json()
            .await
            .expect("json");
        v["jobs"].as_array().map(Vec::len)
    };
    let jobs_before = job_count().await;
    let long = "k".repeat(256);
    for bad in ["has space", "", long.as_str(), "tab\tkey"] {
        let r = p
            .http
            .post(p.url_for("/v1/jobs"))
            .bearer_auth(crate::support::TOKEN)
            .header("Idempotency-Key", bad)
            .json(&json!({"dag": "fan", "policy": "remote"}))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 400, "{bad:?}");
    }
    let jobs_after = job_count().await;
    assert_eq!(jobs_after, jobs_before, "a bad key adds no job");
    for id in [ja, other_key, other_dag] {
        p.wait(&id).await;
    }
}

/// A DAG's `deadline:` (interfaces.md §7): a job still running past it, counted from its
/// submission, is stopped and fails with a reason naming the deadline. Here `slow`'s run never
/// ends (its agent answers "running" whenever asked), so only the deadline ends the job; `fast`
/// before it ran. On the real clock: the deadline's time is what is tested, and a paused clock
/// would reach it while `fast` is still being sent.
#[tokio::test]
async fn a_job_past_its_deadline_fails_naming_it() {
    let p = plane(|_, req| {
        if req.function == "slow" {
            RunReport::new(req.run_id(), RunStatus::Running)
        } else {
            wrote(req)
        }
    })
    .await;
    p.apply(
        "name: late\ndeadline: 1s\nfunctions:\n  - { name: fast, image: i, command: [x], timeout: 60s }\n  - { name: slow, image: i, command: [x], timeout: 60s }\nedges:\n  - { from: fast, to: slow, kind: one }\n",
    )
    .await;
    let (v, s) = p.run(json!({"dag": "late", "policy": "remote"})).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("ran past its deadline of 1s"), "{v}");
    let sent = p.memory().sent();
    assert!(sent.iter().any(|(_, r)| r.function == "slow"), "{sent:#?}");
}

/// A lambda that cannot start (its command not found: the agent says `unrunnable`) is not tried
/// again: the job fails at its first attempt with the failure kind `unrunnable`.
#[tokio::test(start_paused = true)]
async fn a_lambda_that_cannot_start_is_not_retried() {
    let p = plane(|_, req| {
        if req.function == "mid" {
            let mut r = failed(
                req,
                "lambda exited with status 127: its command was not found",
            );
            r.status = RunStatus::Unrunnable;
            r.exit_code = Some(127);
            r
        } else {
            wrote(req)
        }
    })
    .await;
    let (v, s) = p.run_remote().await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    assert_eq!(v["failure"], "unrunnable", "{v}");
    let sent = p.memory().sent();
    let mid: Vec<u32> = sent
        .iter()
        .filter(|(_, r)| r.function == "mid")
        .map(|(_, r)| r.attempt)
        .collect();
    assert!(mid.iter().all(|&a| a == 1), "{mid:?}");
}

/// `GET /v1/jobs` filters by DAG and status (what `ofctl get jobs --dag --status --limit`
/// sends); an unknown status is a 400.
#[tokio::test(start_paused = true)]
async fn jobs_are_listed_by_dag_and_status() {
    let p = plane(|_, req| {
        if req.function == "bad" {
            failed(req, "no")
        } else {
            wrote(req)
        }
    })
    .await;
    p.apply("name: other\nfunctions:\n  - { name: bad, image: i, command: [x], timeout: 30s, retries: { limit: 0 } }\n")
        .await;
    let (_, ok) = p.run_remote().await;
    let (_, bad) = p.run(json!({"dag": "other", "policy": "remote"})).await;
    assert_eq!(
        (ok.status, bad.status),
        (JobStatus::Succeeded, JobStatus::Failed)
    );
    let p = &p;
    let list = |query: &'static str| async move {
        let r = p
            .http
            .get(p.url_for(&format!("/v1/jobs{query}")))
            .bearer_auth(crate::support::TOKEN)
            .send()
            .await
            .expect("jobs");
        let status = r.status().as_u16();
        let v: Value = r.json().await.expect("json");
        let ids: Vec<String> = v["jobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|j| j["job_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        (status, ids)
    };
    assert_eq!(
        list("?status=failed").await,
        (200, vec![bad.job_id.clone()])
    );
    assert_eq!(
        list("?status=succeeded&dag=fan").await,
        (200, vec![ok.job_id.clone()])
    );
    assert_eq!(list("?status=succeeded&dag=other").await, (200, vec![]));
    assert_eq!(list("?limit=1").await, (200, vec![bad.job_id.clone()]));
    assert_eq!(list("?status=done").await.0, 400);
}

/// A job's functions and logs come in the DAG's (topological) order, not the names', each
/// function's instances in order; a job says when it was submitted, started and ended.
#[tokio::test(start_paused = true)]
async fn a_jobs_functions_and_logs_are_in_the_dags_order_and_it_has_its_times() {
    let p = plane(|_, req| wrote(req)).await;
    p.apply("name: zyx\nfunctions:\n  - { name: zeta, image: i, command: [x], timeout: 30s }\n  - { name: mu, image: i, command: [x], instances: 2, timeout: 30s }\n  - { name: alpha, image: i, command: [x], timeout: 30s }\nedges:\n  - { from: zeta, to: mu, kind: broadcast }\n  - { from: mu, to: alpha, kind: gather }\n")
        .await;
    let (v, s) = p.run(json!({"dag": "zyx", "policy": "remote"})).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let order: Vec<(&str, u32)> = s
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f.instance))
        .collect();
    assert_eq!(
        order,
        [("zeta", 0), ("mu", 0), ("mu", 1), ("alpha", 0)],
        "{v}"
    );
    let logs = p.get_json(&format!("/v1/jobs/{}/logs", s.job_id)).await;
    let logged: Vec<(&str, u64)> = logs["logs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| Some((l["function"].as_str()?, l["instance"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        logged,
        [("zeta", 0), ("mu", 0), ("mu", 1), ("alpha", 0)],
        "{logs}"
    );
    let (Some(submitted), Some(started), Some(ended)) = (s.submitted_ms, s.started_ms, s.ended_ms)
    else {
        panic!("a job without its times: {v}");
    };
    assert!(submitted <= started && started <= ended, "{v}");
    for k in ["submitted_ms", "started_ms", "ended_ms"] {
        assert!(v[k].is_i64(), "{k} in {v}");
    }
}

/// Right-sizing is learned from runs on different numbers of cores: every other profiling job
/// gives a stage's instances two CPUs where each agent has two vCPUs per instance of it there
/// (`gen` and `sink`, one instance each, on m5.large agents of two vCPUs; not `mid`, two of
/// whose three land on one agent), the others one; a forced baseline keeps one. What each run
/// was given is in the summary and the sample the models learn from.
#[tokio::test(start_paused = true)]
async fn profiling_gives_every_other_job_two_cpus_where_the_agents_have_them() {
    let p = plane(|_, req| RunReport {
        peak_memory_mb: Some(64.0),
        ..wrote(req)
    })
    .await;
    let cpus = |s: &JobSummary, f: &str| -> Vec<Option<f64>> {
        s.functions
            .iter()
            .filter(|r| r.name == f)
            .map(|r| r.cpus)
            .collect()
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (v, s) = p.run(json!({"dag": "fan"})).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        assert_eq!(s.mode, sonic_api::control::JobMode::Profiling, "{v}");
        seen.push((cpus(&s, "gen"), cpus(&s, "mid"), cpus(&s, "sink")));
    }
    let one = |n: usize| vec![Some(1.0); n];
    let two = |n: usize| vec![Some(2.0); n];
    assert_eq!(
        seen,
        [
            (one(1), one(3), one(1)),
            (two(1), one(3), two(1)),
            (one(1), one(3), one(1)),
        ]
    );
    // What the agents were asked for.
    let sent = p.memory().sent();
    let gens: Vec<f64> = sent
        .iter()
        .filter(|(_, r)| r.function == "gen")
        .map(|(_, r)| r.cpus)
        .collect();
    assert_eq!(gens, [1.0, 2.0, 1.0]);
    // The samples say it: the models learn the times on the cores they were measured on.
    let samples = p.get_json("/v1/dags/fan/models").await["samples"].clone();
    let cores: Vec<Value> = samples
        .as_array()
        .expect("samples")
        .iter()
        .map(|s| s["measured"]["functions"]["gen"]["cores"].clone())
        .collect();
    assert_eq!(cores, [json!(1.0), json!(2.0), json!(1.0)], "{samples}");
    // A forced baseline measures the baseline: one CPU each, whatever the parity.
    let (v, s) = p.run_remote().await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(cpus(&s, "gen"), one(1), "{v}");
    // A planned job gives what its plan says. `remote` planned puts each lambda on a VM of
    // its own (two vCPUs each); the pool's two agents re-plan `mid`, three lambdas, onto two
    // VMs running two at once (one vCPU each).
    let (v, s) = p
        .run(json!({"dag": "fan", "policy": "remote", "planned": true}))
        .await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let stages = v["plan"]["report"]["stages"].as_array().expect("stages");
    for st in stages {
        let f = st["function"].as_str().expect("function");
        let n = cpus(&s, f).len();
        assert_eq!(cpus(&s, f), vec![st["cores"].as_f64(); n], "{f}: {v}");
    }
    assert_eq!(
        (cpus(&s, "gen"), cpus(&s, "mid"), cpus(&s, "sink")),
        (two(1), one(3), two(1)),
        "{v}"
    );
    p.stop().await;
}
