//! Jobs end to end: the control plane and two real agents in-process (process sandbox running the
//! `synthetic` lambda, one shared LocalStore), over HTTP on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{CATALOG, Cluster, FILE_KEY, TOKEN, base64, sized_input};
use serde_json::{Value, json};
use sonic_api::control::{
    DagModelsView, JobEvent, JobLogs, JobMode, JobPlan, JobStatus, JobSummary, PlanUsed,
};
use sonic_control::{ControlConfig, JobsConfig, Runtime, SystemClock, start_with_jobs};
use sonic_core::catalog::Catalog;
use sonic_core::regression::Convergence;
use sonic_storage::local::LocalStore;

/// gen copies the job input and broadcasts it to two mids, which copy it on; sink gathers both
/// and copies everything to `result/`: every result file must equal the input, byte for byte.
const DAG: &str = r#"
name: fan
params: { mids: 2 }
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: "{{ params.mids }}", timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

const FAILING: &str = r#"
name: broken
functions:
  - { name: ok, image: sonic-lambdas:latest, command: [synthetic, run, --to, bad, --output-bytes, "1000"], timeout: 30s }
  - { name: bad, image: sonic-lambdas:latest, command: [synthetic, run, --exit-code, "1"], timeout: 30s }
edges:
  - { from: ok, to: bad, kind: one }
"#;

/// Two m5.large agents that report no network of their own; executions on an executor of
/// their own (2 threads, as the daemon runs them); a job ends within 90 s.
async fn cluster_with(convergence: Convergence) -> Cluster {
    Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tune_agents(|a| a.network_mbps = None)
        .executor_threads(2)
        .convergence(convergence)
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await
}

async fn cluster() -> Cluster {
    cluster_with(Convergence::default()).await
}

impl Cluster {
    /// Submits a job: accepted (202) and queued, its id a job's.
    async fn queue(&self, body: Value) -> String {
        let r = self.post_job(body).await;
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("accepted");
        assert_eq!(v["status"], "queued");
        let id = v["job_id"].as_str().expect("job id").to_owned();
        assert!(id.starts_with("j-"), "{id}");
        id
    }
}

/// Every field of the summary of interfaces.md section 3.
fn assert_summary_shape(v: &Value) {
    for field in [
        "job_id",
        "dag",
        "status",
        "policy",
        "mode",
        "input_bytes",
        "latency_s",
        "cost_usd",
        "perf_per_dollar",
        "edges",
        "functions",
        "outputs",
    ] {
        assert!(v.get(field).is_some(), "summary lacks {field}: {v}");
    }
    for e in v["edges"].as_array().expect("edges") {
        for field in ["from", "to", "method", "bytes", "seconds"] {
            assert!(e.get(field).is_some(), "edge lacks {field}: {e}");
        }
    }
    for f in v["functions"].as_array().expect("functions") {
        for field in [
            "name",
            "instance",
            "agent",
            "vm_type",
            "cold",
            "seconds",
            "peak_memory_mb",
            "attempts",
        ] {
            assert!(f.get(field).is_some(), "function lacks {field}: {f}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_runs_under_every_policy_with_identical_results() {
    let c = cluster().await;
    c.apply(DAG).await;
    let input = sized_input(300_000);
    let mut results: Vec<Vec<(String, Vec<u8>)>> = Vec::new();
    for policy in ["remote", "direct", "local"] {
        let id = c
            .queue(json!({
                "dag": "fan",
                "policy": policy,
                "input": { "name": "data.bin", "base64": base64(&input) },
            }))
            .await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        assert_summary_shape(&v);
        assert_eq!(s.policy.as_str(), policy);
        assert_eq!(s.input_bytes, input.len() as u64);
        assert!(s.latency_s > 0.0);
        assert!(s.cost_usd > 0.0, "{policy}: cost from the catalog price");
        assert!(
            (s.perf_per_dollar - 1.0 / (s.latency_s * s.cost_usd)).abs() < 1e-6 * s.perf_per_dollar
        );
        // The store's requests: `remote` PUTs gen's file for the mids and the mids' two for
        // sink (3), and GETs the first on each agent with a mid (1 or 2) and the two on sink's
        // agent (2); the other policies make none. Every policy keeps files for a while.
        let r = Catalog::from_yaml(CATALOG).expect("catalog").remote_storage;
        let (put, get) = (r.put_usd_per_1k / 1e3, r.get_usd_per_1k / 1e3);
        if policy == "remote" {
            let least = 3.0 * put + 3.0 * get - 1e-12;
            let most = 3.0 * put + 4.0 * get + 1e-12;
            assert!(
                (least..=most).contains(&s.requests_usd),
                "{policy}: requests_usd {} not in [{least}, {most}]: {v}",
                s.requests_usd
            );
        } else {
            assert_eq!(s.requests_usd, 0.0, "{policy}: {v}");
        }
        assert!(
            s.storage_usd > 0.0,
            "{policy}: files kept cost something: {v}"
        );
        assert!(s.cost_usd > s.storage_usd + s.requests_usd, "{v}");
        // gen 1 + mid 2 + sink 1 instances, each once.
        assert_eq!(s.functions.len(), 4, "{v}");
        assert!(
            s.functions
                .iter()
                .all(|f| f.attempts == 1 && f.vm_type == "m5.large")
        );
        let method = match policy {
            "local" => "vm-storage",
            other => other,
        };
        assert_eq!(s.edges.len(), 2);
        for e in &s.edges {
            assert_eq!(e.method.as_str(), method, "{v}");
        }
        // Broadcast: each mid receives the whole input; gather: sink receives both copies.
        let n = input.len() as u64;
        assert_eq!(s.edges[0].bytes, 2 * n, "{v}");
        assert_eq!(s.edges[1].bytes, 2 * n, "{v}");
        let agents: std::collections::BTreeSet<&str> =
            s.functions.iter().map(|f| f.agent.as_str()).collect();
        if policy == "local" {
            assert_eq!(agents.len(), 1, "local runs on one agent: {v}");
        } else {
            assert_eq!(agents.len(), 2, "{policy} spreads over both agents: {v}");
        }
        assert_eq!(s.outputs.len(), 2, "{v}");
        let mut files = Vec::new();
        for out in &s.outputs {
            let key = out.strip_prefix("store://").expect("store url");
            assert!(key.starts_with(&format!("jobs/{id}/result/")), "{key}");
            let data = c.store().get_bytes(key).await.expect("result");
            assert_eq!(
                data.as_ref(),
                input.as_slice(),
                "{policy}: {key} differs from the input"
            );
            files.push((key.replace(&id, "JOB"), data.to_vec()));
        }
        results.push(files);
        // Only the results stay in the store; the agents forgot the job.
        let left = c.store().list(&format!("jobs/{id}/")).await.expect("list");
        assert_eq!(left.len(), 2, "intermediates left in the store: {left:?}");
        for a in &c.agents {
            let job = sonic_agent::files::JobId::parse(&id).expect("id");
            assert!(a.state.files.list(&job).expect("list").is_empty());
        }
        // A profiling sample was recorded.
        let samples = c.control().state.db.samples("fan").expect("samples");
        let sample = samples.iter().find(|x| x.job == id).expect("sample");
        assert_eq!(sample.input_bytes, n);
        assert_eq!(sample.measured["functions"]["mid"]["instances"], 2);
        // Every function's per-instance overhead was measured: what its instances took beyond
        // the lambda and the edges' data passing.
        for f in ["gen", "mid", "sink"] {
            let o = sample.measured["functions"][f]["overhead_s"].as_f64();
            assert!(o.is_some_and(|o| o >= 0.0), "{policy}: {f}: {o:?}");
        }
        // The model's edge bytes are what the sender wrote: the broadcast file once.
        assert_eq!(sample.measured["edges"][0]["bytes"], n);
        assert_eq!(sample.measured["edges"][1]["bytes"], 2 * n);
    }
    assert_eq!(results[0], results[1], "remote and direct results differ");
    assert_eq!(results[0], results[2], "remote and local results differ");

    let r: Value = c
        .http
        .get(format!("{}/v1/jobs", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(r["jobs"].as_array().expect("jobs").len(), 3);
    c.stop().await;
}

/// When instance `k` of `function` started and ended, in seconds from the job's start.
fn span(s: &JobSummary, function: &str, k: u32) -> (f64, f64) {
    let f = s
        .functions
        .iter()
        .find(|f| f.name == function && f.instance == k)
        .unwrap_or_else(|| panic!("no run of {function} {k}: {s:?}"));
    (f.started_s.expect("started_s"), f.ended_s.expect("ended_s"))
}

/// split sends the input to two branches that sleep, then join gathers both: the branches
/// depend on nothing but split, so they run at the same time.
const DIAMOND: &str = r#"
name: diamond
functions:
  - { name: split, image: sonic-lambdas:latest, command: [synthetic, copy, --to, "left,right"], timeout: 30s }
  - { name: left, image: sonic-lambdas:latest, command: [synthetic, copy, --to, join, --sleep-ms, "700"], timeout: 30s }
  - { name: right, image: sonic-lambdas:latest, command: [synthetic, copy, --to, join, --sleep-ms, "700"], timeout: 30s }
  - { name: join, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: split, to: left, kind: one }
  - { from: split, to: right, kind: one }
  - { from: left, to: join, kind: one }
  - { from: right, to: join, kind: one }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamonds_two_branches_overlap_in_time() {
    let c = cluster().await;
    c.apply(DIAMOND).await;
    let input = sized_input(300_000);
    for policy in ["remote", "direct", "local"] {
        let (v, s) = c.run_ok("diamond", Some(policy), &input).await;
        let [split, left, right, join] = ["split", "left", "right", "join"].map(|f| span(&s, f, 0));
        // Run one after the other, one branch would start after the other ended.
        assert!(
            left.0 < right.1 && right.0 < left.1,
            "{policy}: left {left:?} and right {right:?} did not overlap: {v}"
        );
        // Each stage still starts only after the stages it reads from ended.
        assert!(split.1 <= left.0 && split.1 <= right.0, "{policy}: {v}");
        assert!(left.1 <= join.0 && right.1 <= join.0, "{policy}: {v}");
        // join copied what both branches passed on: the input, twice.
        c.assert_copies(&s, 2, &input).await;
    }
    c.stop().await;
}

/// Two instances of `first`, the second much slower; `then` reads them over a `one` edge.
const PIPELINE: &str = r#"
name: pipeline
functions:
  - { name: first, image: sonic-lambdas:latest, command: [synthetic, copy, --to, then, --sleep-per-instance-ms, "1500"], instances: 2, timeout: 30s }
  - { name: then, image: sonic-lambdas:latest, command: [synthetic, copy, --to, last], instances: 2, timeout: 30s }
  - { name: last, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: first, to: then, kind: one }
  - { from: then, to: last, kind: gather }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_edge_starts_each_receiver_when_its_own_sender_ends() {
    let c = cluster().await;
    c.apply(PIPELINE).await;
    let input = sized_input(300_000);
    for policy in ["remote", "direct", "local"] {
        let (v, s) = c.run_ok("pipeline", Some(policy), &input).await;
        let span = |name: &str, k: u32| span(&s, name, k);
        // `then` 0 needs only `first` 0: it starts before the slow `first` 1 has ended...
        assert!(
            span("then", 0).0 < span("first", 1).1,
            "{policy}: then 0 waited for the whole first stage: {v}"
        );
        // ... and never before its own sender ended.
        for k in 0..2 {
            assert!(span("first", k).1 <= span("then", k).0, "{policy}: {v}");
        }
        // A gather waits for every sender.
        assert!(span("then", 1).1 <= span("last", 0).0, "{policy}: {v}");
        c.assert_copies(&s, 2, &input).await;
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lambda_fails_the_job_after_its_retries() {
    // What a failed job keeps for a retry goes after 300 ms here (a day by default).
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tune_agents(|a| a.network_mbps = None)
        .tune(|j| j.keep_failed = Duration::from_millis(300))
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await;
    c.apply(FAILING).await;
    let id = c
        .queue(json!({ "dag": "broken", "policy": "remote" }))
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    assert_summary_shape(&v);
    let error = s.error.expect("error");
    assert!(
        error.contains("function bad instance 0 failed after 3 attempts"),
        "{error}"
    );
    assert!(error.contains("exit code 1"), "{error}");
    // The stage before it ran and is in the summary.
    assert_eq!(s.functions.len(), 1, "{v}");
    assert!(s.outputs.is_empty());
    // No sample from a failed job.
    assert!(
        c.control()
            .state
            .db
            .samples("broken")
            .expect("samples")
            .is_empty()
    );
    // Its files were kept for a retry (ok's output is in the store), then swept: nothing of it
    // is left in the store, and it can no longer be retried.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = c.store().list(&format!("jobs/{id}/")).await.expect("list");
        let kept = c.control().state.db.job_execution(&id).expect("execution");
        if left.is_empty() && kept.is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "never swept: {left:?} {kept:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        c.control()
            .state
            .db
            .instance_runs(&id, 1)
            .expect("runs")
            .is_empty()
    );
    let r = c.retry(&id).await;
    assert_eq!(r.status(), 409);
    let body = r.text().await.expect("body");
    assert!(body.contains("what it kept was deleted"), "{body}");
    c.stop().await;
}

/// `ok` passes bytes to `bad`, which exits with the job's `exit_code`; `notify` runs only when a
/// job fails, printing the failure's context and its own environment.
const HOOKED: &str = r#"
name: hooked
params: { exit_code: 0 }
on_failure: notify
functions:
  - { name: ok, image: sonic-lambdas:latest, command: [synthetic, run, --to, bad, --output-bytes, "1000", --exit-code, "0"], timeout: 30s }
  - { name: bad, image: sonic-lambdas:latest, command: [synthetic, run], timeout: 30s, retries: { limit: 1, backoff: 1ms } }
  - name: notify
    image: sonic-lambdas:latest
    command: [sh, -c, 'cat "$SONIC_INPUT_DIR/input/failure.json"; echo; echo "MODE=$MODE"']
    env: { MODE: paged }
    timeout: 30s
edges:
  - { from: ok, to: bad, kind: one }
"#;

/// A DAG's `on_failure:` function (interfaces.md §7) runs once when a job fails, with the
/// failure's context (which function, which instance, what kind, the error), its log kept as the
/// job's; never when the job succeeds; and it is no stage of the DAG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_runs_its_on_failure_function_once_with_the_failure() {
    let c = cluster().await;
    c.apply(HOOKED).await;
    // Succeeded: no hook.
    let (v, s) = c.run(json!({ "dag": "hooked", "policy": "remote" })).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert!(
        s.on_failure.is_none() && v.get("on_failure").is_none(),
        "{v}"
    );
    let fine = s.job_id.clone();
    let (status, _) = c
        .get_json_status(&format!("/v1/jobs/{fine}/logs?function=notify"))
        .await;
    assert_eq!(status, 200, "notify is the DAG's, with no log yet");
    let logs: JobLogs = serde_json::from_value(
        c.get_json(&format!("/v1/jobs/{fine}/logs?function=notify"))
            .await,
    )
    .expect("logs");
    assert!(logs.logs.is_empty(), "{logs:?}");

    // Failed: the hook ran once, told what failed.
    let (v, s) = c
        .run(json!({ "dag": "hooked", "policy": "remote", "params": { "exit_code": 3 } }))
        .await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    let hook = s.on_failure.clone().expect("on_failure ran");
    assert_eq!(hook.function, "notify");
    assert!(hook.succeeded, "{v}");
    assert!(hook.error.is_none(), "{v}");
    assert!(["a-1", "a-2"].contains(&hook.agent.as_str()), "{v}");
    // It is not one of the job's stages.
    assert!(s.functions.iter().all(|f| f.name != "notify"), "{v}");
    assert!(
        s.error
            .as_deref()
            .is_some_and(|e| e.contains("function bad instance 0"))
    );
    let logs: JobLogs = serde_json::from_value(
        c.get_json(&format!("/v1/jobs/{}/logs?function=notify", s.job_id))
            .await,
    )
    .expect("logs");
    assert_eq!(logs.logs.len(), 1, "once: {logs:?}");
    let log = &logs.logs[0].log;
    // After the agent's own lines, the context, then the variable.
    let printed = &log[log.find('{').expect("the context")..];
    let context: Value =
        serde_json::from_str(printed.split("\nMODE=").next().expect("the context first"))
            .unwrap_or_else(|e| panic!("{e}: {log}"));
    assert_eq!(context["job_id"], s.job_id.as_str(), "{log}");
    assert_eq!(context["dag"], "hooked", "{log}");
    assert_eq!(context["function"], "bad", "{log}");
    assert_eq!(context["instance"], 0, "{log}");
    assert_eq!(context["kind"], "exit", "{log}");
    assert_eq!(context["params"]["exit_code"], 3, "{log}");
    assert!(
        context["error"]
            .as_str()
            .is_some_and(|e| e.contains("exit code 3")),
        "{log}"
    );
    assert!(log.contains("MODE=paged"), "its env: {log}");
    c.stop().await;
}

/// `show` prints its secrets (which the agent must hide) and writes them as its results (which
/// shows they reached it).
const SECRETIVE: &str = r#"
name: secretive
functions:
  - name: show
    image: sonic-lambdas:latest
    command: [sh, -c, 'echo "token is $API_TOKEN, file is $FROM_FILE, mode $MODE"; mkdir -p "$SONIC_OUTPUT_DIR/result"; printf %s "$API_TOKEN" > "$SONIC_OUTPUT_DIR/result/token"; printf %s "$FROM_FILE" > "$SONIC_OUTPUT_DIR/result/file"']
    env: { API_TOKEN: { secret: api-token }, FROM_FILE: { secret: mounted.key }, MODE: plain }
    timeout: 30s
"#;

impl Cluster {
    /// `PUT /v1/secrets/{name}` with `value`: its status.
    async fn put_secret(&self, name: &str, value: &[u8]) -> reqwest::StatusCode {
        self.http
            .put(self.url_for(&format!("/v1/secrets/{name}")))
            .bearer_auth(TOKEN)
            .body(value.to_vec())
            .send()
            .await
            .expect("PUT secret")
            .status()
    }

    /// `DELETE /v1/secrets/{name}`: its status.
    async fn delete_secret(&self, name: &str) -> reqwest::StatusCode {
        self.http
            .delete(self.url_for(&format!("/v1/secrets/{name}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("DELETE secret")
            .status()
    }
}

/// Secrets (interfaces.md §7, item 9): from the store (`PUT /v1/secrets/NAME`) and from the
/// control plane's secrets folder, they reach the runs of the functions that name them as
/// environment variables; never the DAG, the listing, the job's summary or its log (the agent
/// replaces them); a job naming one that is nowhere is refused at submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_their_runs_and_nothing_else() {
    const TOKEN_VALUE: &str = "tok-7f3a9c-very-secret";
    const FILE_VALUE: &str = "mounted-9b1e-value";
    let folder = tempfile::tempdir().expect("dir");
    std::fs::write(folder.path().join("mounted.key"), FILE_VALUE).expect("write");
    let dir = folder.path().to_path_buf();
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tune_agents(|a| a.network_mbps = None)
        .tune(move |j| j.secrets_dir = Some(dir.clone()))
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await;
    c.apply(SECRETIVE).await;
    // Not yet in the store: refused before anything is stored, naming it and the way to add it.
    let r = c
        .post_job(json!({ "dag": "secretive", "policy": "remote" }))
        .await;
    assert_eq!(r.status(), 400);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("no secret api-token") && body.contains("ofctl create secret"),
        "{body}"
    );
    // Bad names and values are refused.
    assert_eq!(c.put_secret(".hidden", b"x").await, 400);
    assert_eq!(c.put_secret("nul", b"a\0b").await, 400);
    assert_eq!(c.put_secret("empty", b"").await, 400);
    assert_eq!(c.put_secret("api-token", b"first").await, 204);
    assert_eq!(
        c.put_secret("api-token", TOKEN_VALUE.as_bytes()).await,
        204,
        "replaced"
    );

    let listed = c.get_json("/v1/secrets").await;
    let text = listed.to_string();
    assert!(
        !text.contains(TOKEN_VALUE) && !text.contains(FILE_VALUE),
        "{text}"
    );
    let names: Vec<(&str, &str, u64)> = listed["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("name"),
                s["source"].as_str().expect("source"),
                s["bytes"].as_u64().expect("bytes"),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("api-token", "store", TOKEN_VALUE.len() as u64),
            ("mounted.key", "file", FILE_VALUE.len() as u64)
        ]
    );

    let (v, s) = c
        .run(json!({ "dag": "secretive", "policy": "remote" }))
        .await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let results = c.results(&s).await;
    let got = |name: &str| {
        results
            .iter()
            .find(|(k, _)| k == name || k.ends_with(&format!("/{name}")))
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_else(|| panic!("no result {name}: {results:?}"))
    };
    assert_eq!(
        got("token"),
        TOKEN_VALUE,
        "the store's value reached the run"
    );
    assert_eq!(
        got("file"),
        FILE_VALUE,
        "the folder's value reached the run"
    );
    assert!(!v.to_string().contains(TOKEN_VALUE), "{v}");
    let logs = c.get_json(&format!("/v1/jobs/{}/logs", s.job_id)).await;
    let log = logs.to_string();
    assert!(
        log.contains("token is [secret API_TOKEN], file is [secret FROM_FILE], mode plain"),
        "{log}"
    );
    assert!(
        !log.contains(TOKEN_VALUE) && !log.contains(FILE_VALUE),
        "{log}"
    );
    let dag = c.get_json("/v1/dags/secretive").await.to_string();
    assert!(
        dag.contains("api-token") && !dag.contains(TOKEN_VALUE),
        "{dag}"
    );

    // Deleted from the store: jobs naming it are refused again; the folder's is not the API's.
    assert_eq!(c.delete_secret("api-token").await, 204);
    assert_eq!(c.delete_secret("api-token").await, 404);
    assert_eq!(c.delete_secret("mounted.key").await, 409);
    let r = c
        .post_job(json!({ "dag": "secretive", "policy": "remote" }))
        .await;
    assert_eq!(r.status(), 400);
    c.stop().await;
}

/// Applying a DAG asks the alive agents whether they can start its executables (images and
/// programs; the process sandbox here, so programs): what none can start is a warning in the
/// answer, naming the function, the agents and why; the DAG is applied all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_says_which_executables_the_agents_cannot_start() {
    let c = cluster().await;
    let fine = c.apply_answer(DAG).await;
    assert!(fine.get("warnings").is_none(), "{fine}");
    let v = c
        .apply_answer(
            "name: typo\non_failure: tell\nfunctions:\n  - { name: a, image: sonic-lambdas:latest, command: [synthetic, run] }\n  - { name: b, image: sonic-lambdas:latest, command: [no-such-program-4711, x] }\n  - { name: tell, image: sonic-lambdas:latest, command: [no-such-tell-4711] }\nedges:\n  - { from: a, to: b, kind: one }\n",
        )
        .await;
    assert_eq!(v["revision"], 1, "applied all the same: {v}");
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings: {v}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let b = warnings
        .iter()
        .find(|w| w.contains("function b "))
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(
        b.contains("no-such-program-4711")
            && b.contains("2 of 2 agents cannot start it")
            && b.contains("a-1")
            && b.contains("a-2")
            && b.contains("not found"),
        "{b}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("function tell ")),
        "the on_failure function is checked too: {warnings:?}"
    );
    c.stop().await;
}

/// A DAG's `input: required`: a submission without an input is refused before anything is
/// stored, saying how to give one; with one it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_input_is_required() {
    let c = cluster().await;
    c.apply("name: needy\ninput: required\nfunctions:\n  - { name: a, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }\n")
        .await;
    let r = c
        .post_job(json!({ "dag": "needy", "policy": "remote" }))
        .await;
    assert_eq!(r.status(), 400);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("DAG needy needs an input") && body.contains("--input FILE"),
        "{body}"
    );
    assert!(
        c.control()
            .state
            .db
            .list_jobs(Some("needy"), 10)
            .expect("jobs")
            .is_empty(),
        "nothing stored"
    );
    let (v, s) = c
        .run(json!({
            "dag": "needy",
            "policy": "remote",
            "input": { "name": "data.bin", "base64": base64(b"some input") },
        }))
        .await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    c.stop().await;
}

/// Results are served once a job succeeded, streamed; an ended job is deleted whole on request
/// (record, logs, results, input, files) while the sample it taught stays; a job still running
/// is refused; past `retain_jobs` a job goes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_deleted_on_request_or_past_their_retention() {
    let c = cluster().await;
    let input = sized_input(300_000);
    c.apply(&one_function("first")).await;
    let (v, s) = c.run_ok("again", Some("remote"), &input).await;
    let id = s.job_id.clone();
    let key = s.outputs[0]
        .rsplit_once("/result/")
        .expect("a result url")
        .1
        .to_owned();
    let r = c.get_path(&format!("/v1/jobs/{id}/results/{key}")).await;
    assert_eq!(r.status(), 200, "{v}");
    assert_eq!(
        r.headers()["content-length"].to_str().expect("length"),
        input.len().to_string()
    );
    assert_eq!(r.bytes().await.expect("body").as_ref(), input.as_slice());
    // A job that runs cannot be deleted, and has no results yet; cancelled, it has none.
    c.apply(
        "name: nap\nfunctions:\n  - { name: nap, image: sonic-lambdas:latest, command: [synthetic, run, --to, result, --output-bytes, \"10\", --sleep-ms, \"60000\"], timeout: 120s }\n",
    )
    .await;
    let running = c.queue(json!({ "dag": "nap", "policy": "remote" })).await;
    let r = c.delete_job(&running).await;
    assert_eq!(r.status(), 409);
    assert!(r.text().await.expect("body").contains("cancel it first"));
    let r = c
        .http
        .post(format!("{}/v1/jobs/{running}/cancel", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 202);
    let (v, ended) = c.ended(&running).await;
    assert_eq!(ended.status, JobStatus::Failed, "{v}");
    let r = c.get_path(&format!("/v1/jobs/{running}/results/out")).await;
    assert_eq!(r.status(), 409);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("only a succeeded job's results")
    );
    // Deleted: its record, logs, objects and rows go; the sample stays.
    for gone in [&id, &running] {
        let r = c.delete_job(gone).await;
        assert_eq!(r.status(), 204);
        assert_eq!(c.get_path(&format!("/v1/jobs/{gone}")).await.status(), 404);
        assert_eq!(
            c.get_path(&format!("/v1/jobs/{gone}/logs")).await.status(),
            404
        );
        assert!(
            c.store()
                .list(&format!("jobs/{gone}/"))
                .await
                .expect("list")
                .is_empty()
        );
        let db = &c.control().state.db;
        assert!(db.job_execution(gone).expect("execution").is_none());
        assert!(db.logs(gone, None).expect("logs").is_empty());
        assert_eq!(c.delete_job(gone).await.status(), 404);
    }
    assert!(
        c.control()
            .state
            .db
            .samples("again")
            .expect("samples")
            .iter()
            .any(|x| x.job == id),
        "the sample stays"
    );
    c.stop().await;

    // Retained a second: a job that ended goes by itself.
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large")])
        .tune_agents(|a| a.network_mbps = None)
        .tune(|j| j.retain_jobs = Some(Duration::from_secs(1)))
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await;
    c.apply(&one_function("first")).await;
    let (_, s) = c.run_ok("again", Some("remote"), &input).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.get_path(&format!("/v1/jobs/{}", s.job_id)).await;
        let left = c
            .store()
            .list(&format!("jobs/{}/", s.job_id))
            .await
            .expect("list");
        if r.status() == 404 && left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "never deleted: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.stop().await;
}

/// A lambda that runs out of memory is tried again with more (twice its limit, at most its
/// agent's VM type's memory), and succeeds: an unplanned job's runs get 1024 MB, this one
/// needs about 1400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_retry_gets_more_memory() {
    let c = cluster().await;
    c.apply(
        "name: hungry\nfunctions:\n  - { name: eat, image: sonic-lambdas:latest, command: [synthetic, run, --alloc-mb, \"1400\", --to, result, --output-bytes, \"10\"], timeout: 60s }\n",
    )
    .await;
    let id = c
        .queue(json!({ "dag": "hungry", "policy": "remote" }))
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(s.functions[0].attempts, 2, "{v}");
    let peak = s.functions[0].peak_memory_mb.expect("peak");
    assert!(peak > 1024.0, "it used more than its first limit: {v}");
    c.stop().await;
}

/// A cancelled job retried under its id, under every method: the instance that had succeeded
/// is restored, not run again (`reused` in the summary), the rest run; the results are a plain
/// run's; the job keeps its revision; a job that has not failed, or none, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_retried_reuses_what_succeeded() {
    let c = cluster().await;
    c.apply(SLOW).await;
    let input = sized_input(300_000);
    let running = |c: &Cluster| -> u32 {
        c.agents
            .iter()
            .map(|a| a.state.running.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    };
    for policy in ["remote", "direct", "local"] {
        let id = c
            .queue(json!({
                "dag": "slow",
                "policy": policy,
                "input": { "name": "data.bin", "base64": base64(&input) },
            }))
            .await;
        // Cancelled once gen has ended and both mids run.
        c.wait_mids_sent(&id).await;
        let r = c
            .http
            .post(format!("{}/v1/jobs/{id}/cancel", c.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("cancel");
        assert_eq!(r.status(), 202);
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Failed, "{policy}: {v}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while running(&c) > 0 {
            assert!(Instant::now() < deadline, "{policy}: the mids still run");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Applied meanwhile: the retry still runs the job's own revision.
        c.apply(&SLOW.replace("sink", "last")).await;
        let before = runs_ended(&c);
        let r = c.retry(&id).await;
        assert_eq!(r.status(), 202, "{policy}");
        let accepted: Value = r.json().await.expect("json");
        assert_eq!(
            (accepted["job_id"].as_str(), accepted["status"].as_str()),
            (Some(id.as_str()), Some("queued"))
        );
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        assert_eq!(s.error, None, "{policy}: {v}");
        let reused: Vec<(&str, bool)> = s
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f.reused))
            .collect();
        assert_eq!(
            reused,
            [
                ("gen", true),
                ("mid", false),
                ("mid", false),
                ("sink", false)
            ],
            "{policy}: {v}"
        );
        assert_eq!(v["functions"][0]["reused"], true, "{policy}: {v}");
        assert!(v["functions"][1].get("reused").is_none(), "{policy}: {v}");
        // gen did not run again: the agents ran the two mids and the sink.
        assert_eq!(runs_ended(&c) - before, 3, "{policy}: {v}");
        c.assert_copies(&s, 2, &input).await;
        // A retried job that reused instances is not a sample of the DAG.
        assert!(
            c.control()
                .state
                .db
                .samples("slow")
                .expect("samples")
                .iter()
                .all(|x| x.job != id),
            "{policy}"
        );
        // Succeeded: nothing to retry.
        let r = c.retry(&id).await;
        assert_eq!(r.status(), 409, "{policy}");
        assert!(r.text().await.expect("body").contains("is succeeded"));
        c.apply(SLOW).await;
    }
    let r = c.retry("j-0000000000000000").await;
    assert_eq!(r.status(), 404);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_are_refused() {
    let c = cluster().await;
    c.apply(DAG).await;
    let status = async |body: Value| c.post_job(body).await.status();
    assert_eq!(status(json!({ "dag": "nope" })).await, 404);
    assert_eq!(status(json!({ "dag": "fan", "policy": "fast" })).await, 400);
    assert_eq!(
        status(json!({ "dag": "fan", "params": { "mids": 0 } })).await,
        400
    );
    assert_eq!(
        status(json!({ "dag": "fan", "input": { "base64": "!!" } })).await,
        400
    );
    assert_eq!(
        status(json!({ "dag": "fan", "input": { "key": "no/such/object" } })).await,
        400
    );
    let missing = c
        .http
        .get(format!("{}/v1/jobs/j-0000", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("send");
    assert_eq!(missing.status(), 404);
    c.stop().await;
}

/// One function, named `function`, copying its input to the result.
fn one_function(function: &str) -> String {
    format!(
        "name: again\nfunctions:\n  - {{ name: {function}, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }}\n"
    )
}

/// Submissions and executions read the DAG from what the control plane keeps parsed: a re-applied
/// DAG is what the next job runs, a deleted one refuses the next submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reapplied_dag_runs_as_applied_and_a_deleted_one_is_refused() {
    let c = cluster().await;
    let input = sized_input(300_000);
    let names = |s: &JobSummary| {
        let mut n: Vec<String> = s.functions.iter().map(|f| f.name.clone()).collect();
        n.dedup();
        n
    };
    c.apply(&one_function("first")).await;
    let (v, s) = c.run_ok("again", Some("remote"), &input).await;
    assert_eq!(names(&s), ["first"], "{v}");
    // Looked up (and kept) by that job: now replaced.
    c.apply(&one_function("second")).await;
    let (v, s) = c.run_ok("again", Some("remote"), &input).await;
    assert_eq!(names(&s), ["second"], "the re-applied DAG runs: {v}");
    c.assert_copies(&s, 1, &input).await;
    // Replaced by a DAG whose handler this control plane cannot run: refused at submission.
    c.apply("name: again\nfunctions:\n  - { name: only, handler: py-nothing, timeout: 30s }\n")
        .await;
    let r = c
        .post_job(json!({ "dag": "again", "policy": "remote" }))
        .await;
    assert_eq!(r.status(), 400);
    assert!(
        r.text().await.expect("body").contains("py-nothing"),
        "refused for the new revision's handler"
    );
    c.apply(&one_function("third")).await;
    let (v, s) = c.run_ok("again", Some("remote"), &input).await;
    assert_eq!(names(&s), ["third"], "{v}");
    assert_eq!(s.dag_revision, Some(4), "{v}");
    // An older revision runs when asked for, and says so; one never applied is refused.
    let old = c
        .queue(json!({ "dag": "again", "policy": "remote", "revision": 1,
                       "input": { "name": "data.bin", "base64": base64(&input) } }))
        .await;
    let (v, s) = c.ended(&old).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (names(&s), s.dag_revision),
        (vec!["first".to_owned()], Some(1)),
        "{v}"
    );
    c.assert_copies(&s, 1, &input).await;
    let r = c
        .post_job(json!({ "dag": "again", "policy": "remote", "revision": 9 }))
        .await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.expect("body").contains("no revision 9"));
    let detail: Value = c
        .http
        .get(format!("{}/v1/dags/again?revision=2", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(detail["revision"], 2, "{detail}");
    assert_eq!(detail["revisions"], json!([1, 2, 3, 4]), "{detail}");
    assert!(
        detail["yaml"].as_str().expect("yaml").contains("second"),
        "{detail}"
    );
    let r = c
        .http
        .delete(format!("{}/v1/dags/again", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 204);
    let r = c
        .post_job(json!({ "dag": "again", "policy": "remote" }))
        .await;
    assert_eq!(r.status(), 404, "a deleted DAG is refused");
    c.stop().await;
}

#[tokio::test]
async fn a_job_running_at_restart_is_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sonic_control::Db::open_dir(dir.path()).expect("db");
    let job = sonic_control::store::JobRecord {
        dag_revision: None,
        retried_ms: None,
        id: "j-left".into(),
        dag: "fan".into(),
        status: JobStatus::Running,
        policy: sonic_core::planner::Policy::Remote,
        mode: sonic_api::control::JobMode::Profiling,
        input_bytes: 0,
        params: Default::default(),
        summary: None,
        error: None,
        created_ms: 1,
        started_ms: Some(1),
        finished_ms: None,
        updated_ms: 1,
        plan: None,
        mode_reason: None,
        slo: None,
    };
    db.insert_job(&job).expect("insert");
    drop(db);
    let store = Arc::new(LocalStore::new(dir.path().join("store")).expect("store"));
    let runtime = Runtime::new(store, None, JobsConfig::new(TOKEN, FILE_KEY.as_bytes()));
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().to_path_buf(),
        token: TOKEN.into(),
        ..ControlConfig::default()
    };
    let control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
        .await
        .expect("start");
    let got = control
        .state
        .db
        .get_job("j-left")
        .expect("get")
        .expect("job");
    assert_eq!(got.status, JobStatus::Failed);
    assert_eq!(got.error.as_deref(), Some("control plane restarted"));
    control.stop().await;
}

/// mid sleeps long enough for the control plane to be stopped while it runs.
const SLOW: &str = r#"
name: slow
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink, --sleep-ms, "1500"], instances: 2, timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

/// Runs that ended on the cluster's agents, as their metrics count them.
fn runs_ended(c: &Cluster) -> u64 {
    c.agents
        .iter()
        .map(|a| {
            a.state
                .metrics
                .render(&a.state)
                .lines()
                .filter(|l| l.starts_with("sonic_agent_runs_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_survives_a_control_plane_restart_mid_stage() {
    let mut c = cluster().await;
    c.apply(SLOW).await;
    let input = sized_input(300_000);
    for policy in ["remote", "direct"] {
        let before = runs_ended(&c);
        let id = c
            .queue(json!({
                "dag": "slow",
                "policy": policy,
                "input": { "name": "data.bin", "base64": base64(&input) },
            }))
            .await;
        // Stopped once gen has ended and both mids were sent to their agents.
        c.wait_mids_sent(&id).await;
        // A changed DAG applied meanwhile: the job keeps the revision it was submitted with.
        c.apply(&SLOW.replace("sink", "last")).await;
        c = c.restart().await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        assert!(
            s.functions.iter().any(|f| f.name == "sink"),
            "{policy}: {v}"
        );
        c.apply(SLOW).await;
        // Nothing ran twice: gen was not run again and the mids were adopted, not repeated.
        assert_eq!(s.functions.len(), 4, "{policy}: {v}");
        assert!(s.functions.iter().all(|f| f.attempts == 1), "{policy}: {v}");
        assert_eq!(
            runs_ended(&c) - before,
            4,
            "{policy}: each instance runs once on the agents"
        );
        // The same outputs as a run without a restart: the input, once per mid.
        c.assert_copies(&s, 2, &input).await;
        // Once ended, nothing of its execution is kept to resume.
        assert!(
            c.control()
                .state
                .db
                .instance_runs(&id, 1)
                .expect("runs")
                .is_empty()
        );
    }
    c.stop().await;
}

/// The same, for a planned job: models learned from four profiling jobs, then a `sonic` job
/// stopped while its mids run; the new control plane plans it again, is granted the agents it
/// ran on, and goes on from what was recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_job_survives_a_control_plane_restart_mid_stage() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 4,
        ..Convergence::default()
    };
    let mut c = cluster_with(rule).await;
    c.apply(SLOW).await;
    let body = |input: &[u8]| {
        json!({
            "dag": "slow",
            "input": { "name": "data.bin", "base64": base64(input) },
        })
    };
    for n in [30_000usize, 90_000, 150_000, 210_000] {
        let id = c.queue(body(&sized_input(n))).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    }
    let input = sized_input(120_000);
    let before = runs_ended(&c);
    let id = c.queue(body(&input)).await;
    c.wait_mids_sent(&id).await;
    let granted = c
        .control()
        .state
        .db
        .get_job(&id)
        .expect("get")
        .expect("job")
        .plan;
    c = c.restart().await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (s.policy.as_str(), s.mode),
        ("sonic", JobMode::Planned),
        "{v}"
    );
    assert_eq!(s.functions.len(), 4, "{v}");
    assert!(s.functions.iter().all(|f| f.attempts == 1), "{v}");
    assert_eq!(runs_ended(&c) - before, 4, "each instance runs once: {v}");
    // The same agents as before the restart.
    let hosts = |p: &Option<sonic_api::control::JobPlan>| {
        p.as_ref().map(|p| {
            p.stages
                .iter()
                .map(|s| s.agents.clone())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(hosts(&s.plan), hosts(&granted), "{v}");
    c.assert_copies(&s, 2, &input).await;
    c.stop().await;
}

/// A planned job whose plan changes across a restart: the new control plane plans it again
/// (with empty bandwidth measurements and warm ledger, so the plan can differ); here its edges go
/// from `direct` to `remote`, for sure, because the test changes the job's policy in the database
/// while no control plane runs. What ran under the old plan is not reused (gen's files were
/// never uploaded, as `remote` receivers need): the execution starts over and succeeds. It used
/// to keep gen's recorded run, and the job failed with "... was not uploaded".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_job_whose_edge_methods_change_at_resume_starts_over_and_succeeds() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 4,
        ..Convergence::default()
    };
    let mut c = cluster_with(rule).await;
    c.apply(SLOW).await;
    let body = |input: &[u8], policy: Option<&str>| {
        let mut b = json!({
            "dag": "slow",
            "input": { "name": "data.bin", "base64": base64(input) },
        });
        if let Some(p) = policy {
            b["policy"] = json!(p);
            b["planned"] = json!(true);
        }
        b
    };
    for n in [30_000usize, 90_000, 150_000, 210_000] {
        let id = c.queue(body(&sized_input(n), None)).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    }
    let input = sized_input(120_000);
    let id = c.queue(body(&input, Some("direct"))).await;
    c.wait_mids_sent(&id).await;
    let recorded = c
        .control()
        .state
        .db
        .job_execution(&id)
        .expect("read")
        .expect("an execution");
    assert!(
        recorded
            .methods
            .iter()
            .all(|m| *m == sonic_core::model::Method::Direct),
        "{recorded:?}"
    );
    let job = id.clone();
    c = c
        .restart_with(move |dir| {
            let db = rusqlite::Connection::open(dir.join(sonic_control::store::DB_FILE))
                .expect("open the database");
            let changed = db
                .execute(
                    "UPDATE jobs SET policy = 'remote' WHERE id = ?1",
                    rusqlite::params![job],
                )
                .expect("update");
            assert_eq!(changed, 1);
        })
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (s.policy.as_str(), s.mode),
        ("remote", JobMode::Planned),
        "{v}"
    );
    assert!(
        !s.edges.is_empty() && s.edges.iter().all(|e| e.method.as_str() == "remote"),
        "{v}"
    );
    c.assert_copies(&s, 2, &input).await;
    c.stop().await;
}

/// Two mappers write `part-<j>` for two reducers (`SONIC_FANOUT_RED`); reducer j gets part j of
/// every mapper, the same bytes whether they move directly or through the store.
const SHUFFLE: &str = r#"
name: shuffle
functions:
  - { name: map, image: sonic-lambdas:latest, command: [synthetic, run, --to, red, --output-bytes, "40000"], instances: 2, timeout: 30s }
  - { name: red, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], instances: 2, timeout: 30s }
edges:
  - { from: map, to: red, kind: shuffle }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_routes_each_part_to_its_reducer() {
    let c = cluster().await;
    c.apply(SHUFFLE).await;
    let mut seen = Vec::new();
    for policy in ["direct", "remote"] {
        let id = c.queue(json!({ "dag": "shuffle", "policy": policy })).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        assert_eq!(s.edges[0].bytes, 80_000, "{v}");
        let mut files = Vec::new();
        for out in &s.outputs {
            let key = out.strip_prefix("store://").expect("store url");
            let rel = key
                .strip_prefix(&format!("jobs/{id}/result/"))
                .expect("under result/");
            // result/red/<j>/map/<i>/part-<j>
            let parts: Vec<&str> = rel.split('/').collect();
            assert_eq!(parts.len(), 5, "{rel}");
            assert_eq!(parts[0], "red");
            assert_eq!(parts[4], format!("part-{}", parts[1]), "{rel}");
            let data = c.store().get_bytes(key).await.expect("result");
            assert_eq!(data.len(), 20_000, "{rel}");
            files.push((rel.to_owned(), data.to_vec()));
        }
        assert_eq!(files.len(), 4, "{v}");
        seen.push(files);
    }
    assert_eq!(seen[0], seen[1], "direct and remote results differ");
    c.stop().await;
}

/// A profiling (unforced or forced, unplanned) job runs at most one lambda per vCPU of an
/// agent's type at once; the rest wait and run in the job's warm containers, so profiling
/// measures hot times too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplanned_stages_run_one_lambda_per_vcpu_and_measure_hot_runs() {
    let c = cluster().await;
    c.apply(DAG).await;
    // 6 mids over 2 agents of 2 vCPUs (m5.large): 3 per agent, at most 2 at once.
    let input = sized_input(20_000);
    let id = c
        .queue(json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(&input) },
            "params": { "mids": 6 },
            "policy": "remote",
        }))
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let mids: Vec<_> = s.functions.iter().filter(|f| f.name == "mid").collect();
    assert_eq!(mids.len(), 6, "{v}");
    for agent in ["a-1", "a-2"] {
        let on: Vec<_> = mids.iter().filter(|f| f.agent == agent).collect();
        assert_eq!(on.len(), 3, "{agent}: {v}");
        assert!(
            on.iter().any(|f| !f.cold),
            "{agent}: a third mid ran hot: {v}"
        );
    }
    // The sample is of the job's own setting (mids=6).
    let (_, m) = c
        .get_json_status("/v1/dags/fan/models?params=%7B%22mids%22%3A6%7D")
        .await;
    let hot = m["samples"][0]["measured"]["functions"]["mid"]["hot_s"].as_f64();
    assert!(hot.is_some(), "the sample has a hot time: {m}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_fails_as_cancelled() {
    let c = cluster().await;
    c.apply(
        r#"
name: slow
functions:
  - { name: nap, image: sonic-lambdas:latest, command: [synthetic, run, --sleep-ms, "60000"], timeout: 120s }
"#,
    )
    .await;
    let id = c.queue(json!({ "dag": "slow", "policy": "remote" })).await;
    let running = |c: &Cluster| -> u32 {
        c.agents
            .iter()
            .map(|a| a.state.running.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    };
    // Cancelled while its lambda runs on an agent.
    let deadline = Instant::now() + Duration::from_secs(60);
    while running(&c) == 0 {
        assert!(Instant::now() < deadline, "the lambda never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = c
        .http
        .post(format!("{}/v1/jobs/{id}/cancel", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 202);
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    assert!(
        s.error.as_deref().unwrap_or("").contains("cancelled"),
        "{v}"
    );
    // The lambda was stopped on its agent, not left to sleep its minute.
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(&c) > 0 {
        assert!(
            Instant::now() < deadline,
            "the cancelled job's lambda still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A finished job cannot be cancelled again.
    let again = c
        .http
        .post(format!("{}/v1/jobs/{id}/cancel", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("cancel");
    assert_eq!(again.status(), 400);
    c.stop().await;
}

#[tokio::test]
async fn without_an_object_store_jobs_are_refused_clearly() {
    // The library's control plane with no job runtime (sonic_control::start always opens one).
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().to_path_buf(),
        token: TOKEN.into(),
        ..ControlConfig::default()
    };
    let control = start_with_jobs(config, Arc::new(SystemClock), None)
        .await
        .expect("start");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/jobs", control.url()))
        .bearer_auth(TOKEN)
        .json(&json!({ "dag": "fan" }))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("object store"),
        "{body}"
    );
    control.stop().await;
}

impl Cluster {
    /// Reads `GET /v1/jobs/{id}/events` to its end (within the deadline): every event in order.
    async fn all_events(&self, id: &str) -> Vec<JobEvent> {
        let mut events = self.events(id).await;
        assert_eq!(events.status, 200);
        let ct = &events.content_type;
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let mut out = Vec::new();
        while let Some(e) = events.next().await {
            out.push(e);
        }
        out
    }

    /// Runs `dag` on `input` (under `policy`, or as the control plane chooses) to its end.
    async fn run_ok(&self, dag: &str, policy: Option<&str>, input: &[u8]) -> (Value, JobSummary) {
        let mut body = json!({
            "dag": dag,
            "input": { "name": "data.bin", "base64": base64(input) },
        });
        if let Some(p) = policy {
            body["policy"] = json!(p);
        }
        let id = self.queue(body).await;
        let (v, s) = self.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy:?}: {v}");
        (v, s)
    }

    /// `GET` of a path of the API.
    async fn get_path(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
    }

    /// `DELETE /v1/jobs/{id}`.
    async fn delete_job(&self, id: &str) -> reqwest::Response {
        self.http
            .delete(format!("{}/v1/jobs/{id}", self.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("delete")
    }

    /// `POST /v1/jobs/{id}/retry`.
    async fn retry(&self, id: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/jobs/{id}/retry", self.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("retry")
    }

    /// Every result of the job is a copy of `input`, and there are `n` of them.
    async fn assert_copies(&self, s: &JobSummary, n: usize, input: &[u8]) {
        assert_eq!(s.outputs.len(), n, "{s:?}");
        for out in &s.outputs {
            let key = out.strip_prefix("store://").expect("store url");
            let data = self.store().get_bytes(key).await.expect("result");
            assert_eq!(data.as_ref(), input, "{key}");
        }
    }

    /// Waits until `gen` of job `id` ended and both its `mid`s were sent (and still run).
    async fn wait_mids_sent(&self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let runs = self.control().state.db.instance_runs(id, 1).expect("runs");
            let gen_done = runs
                .iter()
                .any(|r| r.function == "gen" && r.report.is_some());
            if gen_done && runs.iter().filter(|r| r.function == "mid").count() == 2 {
                assert!(
                    runs.iter()
                        .all(|r| r.function != "mid" || r.report.is_none()),
                    "the mids ended before the restart: {runs:?}"
                );
                return;
            }
            assert!(Instant::now() < deadline, "mid never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn submit_input(&self, policy: Option<&str>, input: &[u8]) -> String {
        let mut body = json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(input) },
        });
        if let Some(p) = policy {
            body["policy"] = json!(p);
        }
        self.queue(body).await
    }
}

/// The learning loop: unforced jobs profile with `remote` until the models converge, then run
/// planned with `sonic` and still add samples; the models, the plan, the progress stream and
/// the logs are served; a restart keeps what was learned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_learns_then_runs_planned_and_remembers_across_a_restart() {
    // Lambda times of a few milliseconds are noise: this test checks the mechanism, so the
    // error threshold is loose; the number of samples is what converges here.
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 4,
        ..Convergence::default()
    };
    let c = cluster_with(rule).await;
    c.apply(DAG).await;

    // Nothing learned: a forced sonic job and a plan are refused, saying why.
    let r = c.post_job(json!({ "dag": "fan", "policy": "sonic" })).await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be planned yet"),
        "{body}"
    );
    let (status, body) = c
        .get_json_status("/v1/dags/fan/plan?input_bytes=1000")
        .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = c.get_json_status("/v1/dags/fan/models").await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["converged"].as_bool(), body["jobs"].as_u64()),
        (Some(false), Some(0))
    );

    // Profiling: four sizes.
    for (k, n) in [30_000usize, 90_000, 150_000, 210_000]
        .into_iter()
        .enumerate()
    {
        let id = c.submit_input(None, &sized_input(n)).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        assert_eq!(
            (s.policy.as_str(), s.mode),
            ("remote", JobMode::Profiling),
            "{v}"
        );
        assert!(s.plan.is_none(), "{v}");
        let (_, m) = c.get_json_status("/v1/dags/fan/models").await;
        let m: DagModelsView = serde_json::from_value(m).expect("models view");
        assert_eq!(m.jobs, k + 1);
        assert_eq!(m.samples.len(), k + 1);
        assert_eq!(m.converged, k + 1 >= 4, "after {} jobs: {m:?}", k + 1);
    }
    let (_, m) = c.get_json_status("/v1/dags/fan/models").await;
    let m: DagModelsView = serde_json::from_value(m).expect("models view");
    assert_eq!(m.max_mape, 1000.0);
    for p in [
        "gen.memory_mb",
        "mid.cold_s",
        "mid.instances",
        "gen->mid.bytes",
        "mid->sink.bytes",
    ] {
        let model = m
            .models
            .iter()
            .find(|x| x.parameter == p)
            .unwrap_or_else(|| panic!("no model {p}: {m:?}"));
        assert!(model.converged, "{model:?}");
        assert_eq!(model.samples, 4);
        assert!(
            model.equation.is_some() && model.degree.is_some(),
            "{model:?}"
        );
    }
    // The broadcast edge carries exactly the input: its line is `x` itself.
    let bytes = m
        .models
        .iter()
        .find(|x| x.parameter == "gen->mid.bytes")
        .expect("model");
    // (Least squares leaves a rounding residue in the constant.)
    assert!(
        bytes
            .equation
            .as_deref()
            .is_some_and(|e| e.starts_with("1*x")),
        "{bytes:?}"
    );
    assert_eq!(bytes.cv_mape, Some(0.0));

    // The plan for a size never run.
    let (status, plan) = c
        .get_json_status("/v1/dags/fan/plan?input_bytes=120000")
        .await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(
        (plan["dag"].as_str(), plan["policy"].as_str()),
        (Some("fan"), Some("sonic"))
    );
    assert_eq!(plan["input_bytes"], 120_000);
    assert_eq!(plan["stages"].as_array().map(Vec::len), Some(3), "{plan}");
    assert_eq!(plan["stages"][1]["function"], "mid");
    let planned_edges = plan["edges"].as_array().expect("edges");
    assert_eq!(planned_edges.len(), 2);
    for e in planned_edges {
        assert!(
            ["vm-storage", "direct", "remote"].contains(&e["method"].as_str().unwrap_or("")),
            "{e}"
        );
    }
    assert!(
        plan["predicted"]["perf_per_dollar"]
            .as_f64()
            .is_some_and(|x| x > 0.0),
        "{plan}"
    );
    assert_eq!(plan["network_mbps"]["m5.large"]["source"], "catalog");
    // Four jobs of two mids each, both cold (one per agent): eight ratios of a mid's time to
    // its job's mean, enough for the models to say how mids spread, and for the plan its
    // latency distribution (issue 36).
    let q = &plan["predicted"]["latency_quantiles_s"];
    let at = |k: &str| q[k].as_f64().unwrap_or_else(|| panic!("{k}: {plan}"));
    assert!(
        0.0 < at("p50")
            && at("p50") <= at("p90")
            && at("p90") <= at("p95")
            && at("p95") <= at("p99"),
        "{q}"
    );
    let (status, _) = c
        .get_json_status("/v1/dags/fan/plan?input_bytes=120000&policy=remote")
        .await;
    assert_eq!(status, 200);
    let (status, _) = c.get_json_status("/v1/dags/fan/plan").await;
    assert_eq!(status, 400, "input_bytes is required");
    let (status, _) = c.get_json_status("/v1/dags/nope/plan?input_bytes=1").await;
    assert_eq!(status, 404);

    // Converged: the next unforced job is planned, and its progress streams to its end.
    let input = sized_input(120_000);
    let planned_id = c.submit_input(None, &input).await;
    let events = c.all_events(&planned_id).await;
    let last = events.last().expect("at least one event");
    assert_eq!(last.status, JobStatus::Succeeded, "{events:?}");
    assert!(events.iter().all(|e| e.job_id == planned_id));
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| !e.status.is_terminal()),
        "only the last event is terminal: {events:?}"
    );
    assert_eq!(last.done_instances, 4, "{events:?}");
    assert_eq!(last.total_instances, 4, "{events:?}");
    let (v, planned) = c.ended(&planned_id).await;
    assert_eq!(planned.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (planned.policy.as_str(), planned.mode),
        ("sonic", JobMode::Planned),
        "{v}"
    );
    let jp = planned
        .plan
        .clone()
        .expect("the plan is recorded with the job");
    assert!(
        [PlanUsed::Best, PlanUsed::SecondBest].contains(&jp.used),
        "{v}"
    );
    assert_eq!(crate::support::report_json(&jp)["input_bytes"], 120_000);
    assert_eq!(jp.stages.len(), 3);
    for st in &jp.stages {
        assert!(!st.agents.is_empty(), "{st:?}");
        assert!(st.agents.iter().all(|a| a == "a-1" || a == "a-2"), "{st:?}");
        assert!(st.concurrent >= 1);
    }
    // Each edge moved data the way the plan that ran says.
    let report = crate::support::report_json(&jp);
    for e in &planned.edges {
        let want = report["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .find(|p| p["from"] == e.from.as_str() && p["to"] == e.to.as_str())
            .expect("planned edge");
        assert_eq!(want["method"], e.method.as_str(), "{v}");
    }
    // Each instance ran on an agent of its stage.
    for f in &planned.functions {
        let st = jp
            .stages
            .iter()
            .find(|s| s.function == f.name)
            .expect("stage");
        assert!(st.agents.contains(&f.agent), "{f:?} not on {st:?}");
    }

    // Byte-identical to a remote run of the same input.
    let remote_id = c.submit_input(Some("remote"), &input).await;
    let (v, remote) = c.ended(&remote_id).await;
    assert_eq!(remote.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (remote.policy.as_str(), remote.mode),
        ("remote", JobMode::Profiling)
    );
    let (got, want) = (
        c.stored_results(&planned).await,
        c.stored_results(&remote).await,
    );
    assert_eq!(got.len(), 2);
    assert_eq!(got, want, "planned and remote results differ");
    assert!(got.iter().all(|(_, data)| data == &input));

    // Logs: one per instance attempt, what the lambda printed.
    let (status, logs) = c
        .get_json_status(&format!("/v1/jobs/{planned_id}/logs"))
        .await;
    assert_eq!(status, 200);
    let logs: JobLogs = serde_json::from_value(logs).expect("logs");
    assert_eq!(logs.job_id, planned_id);
    assert_eq!(logs.logs.len(), 4, "{logs:?}");
    for l in &logs.logs {
        assert_eq!(l.attempt, 1);
        assert!(
            l.log
                .contains(&format!("function={} instance={}", l.function, l.instance)),
            "{l:?}"
        );
    }
    let (_, mids) = c
        .get_json_status(&format!("/v1/jobs/{planned_id}/logs?function=mid"))
        .await;
    let mids: JobLogs = serde_json::from_value(mids).expect("logs");
    assert_eq!(
        mids.logs.iter().map(|l| l.instance).collect::<Vec<_>>(),
        [0, 1]
    );
    let (status, _) = c.get_json_status("/v1/jobs/j-0000/logs").await;
    assert_eq!(status, 404);
    // A function the DAG does not have is a 404 that says so, not an empty list.
    let (status, body) = c
        .get_json_status(&format!("/v1/jobs/{planned_id}/logs?function=mapers"))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.to_string().contains("has no function mapers"),
        "{body}"
    );
    // A finished job's stream is one terminal event.
    let again = c.all_events(&planned_id).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].status, JobStatus::Succeeded);

    // Planned and forced jobs keep teaching the models.
    let (_, m) = c.get_json_status("/v1/dags/fan/models").await;
    assert_eq!(m["jobs"], 6, "{m}");

    // A restart reads the models back: still converged, still planned.
    let c = c.restart().await;
    let (_, m) = c.get_json_status("/v1/dags/fan/models").await;
    let m: DagModelsView = serde_json::from_value(m).expect("models view");
    assert!(m.converged, "{m:?}");
    assert_eq!(m.jobs, 6);
    let record = c
        .control()
        .state
        .db
        .get_model("fan", &m.setting)
        .expect("get")
        .expect("stored");
    assert!(record.converged);
    assert_eq!(record.samples, 6);
    // Bandwidth an agent measures feeds the plans.
    let beat = json!({
        "agent_id": "a-1", "running": 0,
        "bandwidth": { "egress_bps": 50_000_000.0, "ingress_bps": null, "samples": 3 }
    });
    let r = c
        .http
        .post(format!("{}/v1/agents/a-1/heartbeat", c.url()))
        .bearer_auth(TOKEN)
        .json(&beat)
        .send()
        .await
        .expect("heartbeat");
    assert_eq!(r.status(), 200);
    let (_, plan) = c
        .get_json_status("/v1/dags/fan/plan?input_bytes=60000")
        .await;
    assert_eq!(
        plan["network_mbps"]["m5.large"]["source"], "measured",
        "{plan}"
    );
    assert_eq!(plan["network_mbps"]["m5.large"]["network_mbps"], 400.0);
    let id = c.submit_input(None, &sized_input(60_000)).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(s.mode, JobMode::Planned, "{v}");
    let best = s.plan.expect("plan");
    assert_eq!(best.used, PlanUsed::Best, "{v}");
    // The cheapest plan keeps every file on one m5.large VM (same predicted times, half the
    // price of m5.xlarge, no transfer at all).
    assert!(
        crate::support::report_json(&best)["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .any(|e| e["method"] == "vm-storage"),
        "{v}"
    );

    // Now the agents say they are m5.xlarge VMs: the pool can never give the best plan's
    // m5.large VM, so the resource manager answers with what it has and the job is re-planned
    // for m5.xlarge only, and says why. Same bytes out.
    for a in &c.agents {
        let mut cap = a.state.capacity();
        cap.vm_type = "m5.xlarge".into();
        let r = c
            .http
            .post(format!("{}/v1/agents/register", c.url()))
            .bearer_auth(TOKEN)
            .json(&cap)
            .send()
            .await
            .expect("register");
        assert!(r.status().is_success());
    }
    let id = c.submit_input(None, &input).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (s.policy.as_str(), s.mode),
        ("sonic", JobMode::Planned),
        "{v}"
    );
    let replanned = s.plan.clone().expect("plan");
    assert_eq!(replanned.used, PlanUsed::Best, "{v}");
    assert!(
        replanned.notes[0].starts_with("re-planned for at most 0 m5.large, 2 m5.xlarge: ")
            && replanned.notes[0].contains("m5.large VMs, the pool has 0"),
        "{:?}",
        replanned.notes
    );
    assert_eq!(
        crate::support::report_json(&replanned)["vm_limits"],
        json!({ "m5.large": 0, "m5.xlarge": 2 }),
        "{v}"
    );
    assert!(
        replanned.stages.iter().all(|st| st.vm_type == "m5.xlarge"),
        "{v}"
    );
    // What the policy asked for before the pool's limits is kept: the m5.large plan.
    let asked = &crate::support::report_json(&replanned)["unlimited"];
    assert!(
        asked["stages"]
            .as_array()
            .is_some_and(|st| st.iter().all(|x| x["vm_type"] == "m5.large")),
        "the plan asked for, before the limits: {asked}"
    );
    assert!(s.functions.iter().all(|f| f.vm_type == "m5.xlarge"), "{v}");
    assert_eq!(
        c.stored_results(&s).await,
        want,
        "re-planned and remote results differ"
    );

    // The evaluation's policies. `oracle` plans with what jobs measured at this very size.
    let body = |policy: &str, planned: bool, input: &[u8]| {
        json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(input) },
            "policy": policy,
            "planned": planned,
        })
    };
    let id = c.queue(body("oracle", false, &input)).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (s.policy.as_str(), s.mode),
        ("oracle", JobMode::Planned),
        "{v}"
    );
    let plan = s.plan.clone().expect("an oracle job records its plan");
    assert_eq!(
        crate::support::report_json(&plan)["policy"],
        "oracle",
        "{v}"
    );
    assert_eq!(
        c.stored_results(&s).await,
        want,
        "oracle and remote results differ"
    );
    // A baseline placed the way the planner places it: planned, every edge through the store.
    let id = c.queue(body("remote", true, &input)).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        (s.policy.as_str(), s.mode),
        ("remote", JobMode::Planned),
        "{v}"
    );
    assert_eq!(
        s.plan
            .as_ref()
            .map(|p| crate::support::report_json(p)["policy"].clone()),
        Some(json!("remote"))
    );
    assert!(s.edges.iter().all(|e| e.method.as_str() == "remote"), "{v}");
    assert_eq!(
        c.stored_results(&s).await,
        want,
        "planned remote and remote results differ"
    );
    // One VM per lambda in this plan: each is charged for at least its lambda's run, even
    // where two of the plan's VMs share one agent here.
    let catalog = Catalog::from_yaml(CATALOG).expect("catalog");
    let floor: f64 = s
        .functions
        .iter()
        .map(|f| {
            catalog
                .vm_type(&f.vm_type)
                .map_or(0.0, |t| t.usd_per_second())
                * f.seconds
        })
        .sum();
    assert!(s.functions.len() == 4 && floor > 0.0, "{v}");
    assert!(
        s.cost_usd >= floor * (1.0 - 1e-9),
        "{} < {floor}: {v}",
        s.cost_usd
    );
    // Refused, and nothing is queued: the oracle at a size never measured; `planned` without a
    // baseline.
    let before = c.get_json_status("/v1/jobs?dag=fan&limit=500").await.1["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    for (b, status) in [
        (body("oracle", false, &sized_input(77_777)), 409),
        (body("sonic", true, &input), 400),
    ] {
        let r = c.post_job(b).await;
        let code = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert_eq!(code, status, "{text}");
        assert!(
            text.contains("oracle") || text.contains("planned"),
            "{text}"
        );
    }
    let after = c.get_json_status("/v1/jobs?dag=fan&limit=500").await.1["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(before, after);
    c.stop().await;
}

/// Warm containers across jobs and prewarming (issue 13): until the DAG's cold times are
/// learned, every job starts cold on each agent (its runs share warm environments only among
/// themselves); from then on a later job finds its first stage warm on the agent where an
/// earlier job ran it, and while a stage runs the agents that will run the stages reading from
/// it are asked to prewarm them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_jobs_start_warm_and_next_stages_are_prewarmed() {
    // Cold times count as learned after two jobs.
    let c = cluster_with(Convergence {
        max_mape: 1000.0,
        min_samples: 2,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    let input = sized_input(20_000);
    let mut gens = Vec::new();
    let prewarmed = |c: &Cluster| -> u64 {
        c.agents
            .iter()
            .filter_map(|a| a.state.sandbox.prewarm_stats())
            .map(|s| s.started)
            .sum()
    };
    for n in 0..4 {
        let id = c
            .queue(json!({
                "dag": "fan",
                "input": { "name": "data.bin", "base64": base64(&input) },
                "policy": "remote",
            }))
            .await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        let first = s.functions.iter().find(|f| f.name == "gen").expect("gen");
        gens.push((first.agent.clone(), first.cold));
        if n < 2 {
            assert_eq!(
                prewarmed(&c),
                0,
                "job {n} measures cold starts: nothing prewarmed"
            );
        }
    }
    assert!(
        gens.iter().all(|g| g.0 == gens[0].0),
        "gen runs on one agent: {gens:?}"
    );
    assert!(
        gens[0].1 && gens[1].1,
        "the profiling jobs' gen starts cold: {gens:?}"
    );
    // The third job is the first to share the function's environments across jobs: the fourth
    // finds gen's warm.
    assert!(
        !gens[3].1,
        "once cold times are learned, gen finds its environment warm: {gens:?}"
    );
    // The later jobs asked for the mids and the sink to be prewarmed (in the background: polled).
    let deadline = Instant::now() + Duration::from_secs(30);
    while prewarmed(&c) == 0 {
        assert!(Instant::now() < deadline, "nothing was prewarmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.stop().await;
}

/// Agents say what they keep warm when a run ends; the next planned job is priced hot where its
/// agents keep enough, granted those agents, and its runs there start hot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_job_after_another_is_priced_and_granted_warm() {
    let c = cluster_with(Convergence {
        max_mape: 1000.0,
        min_samples: 2,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    // Profiling until the models converge (a few sizes).
    let mut profiled = 0;
    for n in [30_000, 90_000, 150_000, 210_000, 270_000] {
        let (v, s) = c.run_ok("fan", None, &sized_input(n)).await;
        assert_eq!(s.mode, JobMode::Profiling, "{v}");
        profiled += 1;
        let (_, m) = c.get_json_status("/v1/dags/fan/models").await;
        if m["mode"]["mode"] == "planned" {
            break;
        }
    }
    assert!(profiled < 5, "the models never converged");
    let plan_of = |s: &JobSummary| s.plan.clone().expect("a planned job has a plan");
    let priced_warm = |p: &JobPlan| -> Vec<String> {
        crate::support::report_json(p)["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .filter(|st| st["warm"] == json!(true))
            .map(|st| st["function"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    // The first planned job: the profiling jobs' containers served only themselves.
    let input = sized_input(60_000);
    let (v, first) = c.run_ok("fan", None, &input).await;
    assert_eq!(first.mode, JobMode::Planned, "{v}");
    assert!(priced_warm(&plan_of(&first)).is_empty(), "{v}");
    // This control plane prewarms (the default): the stages that read from others are priced
    // without their cold start, the first one is not.
    let prewarmed: Vec<(String, bool)> = crate::support::report_json(&plan_of(&first))["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|st| {
            (
                st["function"].as_str().unwrap_or("").to_owned(),
                st["prewarmed"] == json!(true),
            )
        })
        .collect();
    assert_eq!(
        prewarmed,
        [
            ("gen".into(), false),
            ("mid".into(), true),
            ("sink".into(), true)
        ],
        "{v}"
    );
    // The next one finds its functions' containers warm where the first ran them.
    let (v, second) = c.run_ok("fan", None, &input).await;
    assert_eq!(second.mode, JobMode::Planned, "{v}");
    let plan = plan_of(&second);
    let warm = priced_warm(&plan);
    assert!(!warm.is_empty(), "no stage priced warm: {v}");
    for f in &warm {
        let hosts = plan
            .stages
            .iter()
            .find(|s| &s.function == f)
            .expect("hosts");
        assert!(hosts.warm, "{hosts:?}");
        let ran_first: Vec<&str> = first
            .functions
            .iter()
            .filter(|r| &r.name == f)
            .map(|r| r.agent.as_str())
            .collect();
        for a in &hosts.agents {
            assert!(
                ran_first.contains(&a.as_str()),
                "{f} granted {a}, not where it ran: {v}"
            );
        }
        for r in second.functions.iter().filter(|r| &r.name == f) {
            assert!(!r.cold, "{f} was priced warm but started cold: {v}");
        }
    }
    assert!(
        plan.notes.iter().all(|n| !n.contains("priced warm")),
        "{:?}",
        plan.notes
    );
    // What the plan route shows now prices the same stages warm.
    let (status, now) = c
        .get_json_status("/v1/dags/fan/plan?input_bytes=60000")
        .await;
    assert_eq!(status, 200, "{now}");
    assert!(
        now["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .any(|st| st["warm"] == json!(true)),
        "{now}"
    );
    c.stop().await;
}

/// A three-stage chain whose middle lambda writes `output_bytes` (a job parameter) to the sink,
/// whatever the input size: a job can change its behaviour without a new DAG.
/// `output_bytes` stands here for a lambda that changes behaviour, not for a setting of the work:
/// it is left out of the work parameters, so that every job shares one set of models.
const CHAIN: &str = r#"
name: chain
params: { output_bytes: 100000 }
work_params: []
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, run, --to, sink], timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, noop], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: one }
  - { from: mid, to: sink, kind: one }
"#;

/// Convergence with hysteresis and drift detection, through the real control plane: once its
/// models converged the chain stays planned at input sizes it never saw; one job whose mid writes
/// ten times more does not flip it; three in a row do (drift), the DAG profiles again and says
/// why (the models view, the next job's mode reason), and a restarted control plane still knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_dag_profiles_again_only_on_sustained_drift() {
    // Millisecond lambdas: the cross-validated error is noise, so its threshold is loose; the
    // drift rule is the default one.
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = cluster_with(rule).await;
    c.apply(CHAIN).await;
    let run = |n: usize, output_bytes: Option<u64>| {
        let mut body = json!({
            "dag": "chain",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
        });
        if let Some(b) = output_bytes {
            body["params"] = json!({ "output_bytes": b });
        }
        let c = &c;
        async move {
            let id = c.queue(body).await;
            let (v, s) = c.ended(&id).await;
            assert_eq!(s.status, JobStatus::Succeeded, "{v}");
            s
        }
    };
    let mode = |m: &DagModelsView| m.mode.clone().expect("the models view has the mode");
    let models = || async {
        let (_, m) = c.get_json_status("/v1/dags/chain/models").await;
        serde_json::from_value::<DagModelsView>(m).expect("models view")
    };

    // Profiling until converged.
    for (k, n) in [20_000usize, 60_000, 100_000].into_iter().enumerate() {
        let s = run(n, None).await;
        assert_eq!(s.mode, JobMode::Profiling, "{s:?}");
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(
            why.starts_with(&format!(
                "profiling ({k} of at most 30 profiling jobs; then it plans with the models as they are): the models have not converged"
            )),
            "{why}"
        );
        let m = mode(&models().await);
        assert_eq!(m.mode == JobMode::Planned, k == 2, "{m:?}");
    }
    // Planned at new sizes; an outlier (mid writes 10x) and a normal job after it: still planned.
    for (n, out) in [
        (140_000, None),
        (40_000, None),
        (80_000, Some(1_000_000)),
        (120_000, None),
    ] {
        let s = run(n, out).await;
        assert_eq!(
            (s.policy.as_str(), s.mode),
            ("sonic", JobMode::Planned),
            "{s:?}"
        );
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(why.starts_with("planned: the models converged"), "{why}");
    }
    let m = mode(&models().await);
    assert_eq!((m.mode, m.drifts), (JobMode::Planned, 0), "{m:?}");
    assert!(m.watch.is_empty(), "the normal job reset the count: {m:?}");

    // The lambda changes for good: the third planned job off drifts.
    for (i, n) in [50_000usize, 90_000, 130_000].into_iter().enumerate() {
        let s = run(n, Some(1_000_000)).await;
        assert_eq!(s.mode, JobMode::Planned, "{s:?}");
        let m = mode(&models().await);
        if i < 2 {
            assert_eq!(m.mode, JobMode::Planned, "{m:?}");
            let w = m.watch.iter().find(|w| w.parameter == "mid->sink.bytes");
            assert_eq!(w.map(|w| w.jobs), Some(i + 1), "{m:?}");
        } else {
            assert_eq!((m.mode, m.drifts), (JobMode::Profiling, 1), "{m:?}");
            assert!(
                m.reason.starts_with("drift: mid->sink.bytes measured"),
                "{m:?}"
            );
        }
    }
    // Profiling again, saying why, until the models refitted on the new behaviour converge (the
    // planned jobs ran warm: the cold times need profiling jobs).
    let mut profiled = 0;
    while mode(&models().await).mode == JobMode::Profiling {
        assert!(profiled < 4, "profiling again never converged");
        let s = run(30_000 + 40_000 * profiled, Some(1_000_000)).await;
        profiled += 1;
        assert_eq!((s.policy.as_str(), s.mode), ("remote", JobMode::Profiling));
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(why.starts_with("drift: mid->sink.bytes"), "{why}");
    }
    // The models are fitted on the new behaviour only: the three drifting jobs and the profiling.
    let m = models().await;
    assert_eq!(
        (m.jobs, m.samples.len()),
        (3 + profiled, 3 + profiled),
        "{m:?}"
    );
    let bytes = m.models.iter().find(|v| v.parameter == "mid->sink.bytes");
    // (Least squares leaves a rounding residue in the slope.)
    assert!(
        bytes
            .and_then(|v| v.equation.as_deref())
            .is_some_and(|e| e.ends_with("1e6")),
        "{m:?}"
    );

    // The state survives a restart.
    let c = c.restart().await;
    let (_, m) = c.get_json_status("/v1/dags/chain/models").await;
    let m: DagModelsView = serde_json::from_value(m).expect("models view");
    let m = m.mode.expect("mode");
    assert_eq!((m.mode, m.drifts), (JobMode::Planned, 1), "{m:?}");
    assert!(m.fitted_from.is_some(), "{m:?}");
    c.stop().await;
}

/// A chain whose mid writes `output_bytes` (a work parameter) and takes a `seed` that is not one.
const KNOB: &str = r#"
name: knob
params: { output_bytes: 100000, seed: 1 }
work_params: [output_bytes]
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, run, --to, sink], timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, noop], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: one }
  - { from: mid, to: sink, kind: one }
"#;

/// Models per parameter setting, through the real control plane: setting A (the defaults)
/// converges; setting B (mid writes 10x more) then profiles under its own key, saying so, while
/// A's jobs stay planned (a different seed is still A); once both converged, A and B jobs in turn
/// all run planned, and neither drifts (with one set of models, B's bytes would be a drift of A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_parameter_setting_profiles_and_plans_on_its_own() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = cluster_with(rule).await;
    c.apply(KNOB).await;
    let run = |n: usize, params: Value| {
        let body = json!({
            "dag": "knob",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
            "params": params,
        });
        let c = &c;
        async move {
            let id = c.queue(body).await;
            let (v, s) = c.ended(&id).await;
            assert_eq!(s.status, JobStatus::Succeeded, "{v}");
            s
        }
    };
    let models = || async {
        let (_, m) = c.get_json_status("/v1/dags/knob/models").await;
        serde_json::from_value::<DagModelsView>(m).expect("models view")
    };
    let (a_key, b_key) = (r#"{"output_bytes":100000}"#, r#"{"output_bytes":1000000}"#);
    let b = || json!({ "output_bytes": 1_000_000 });

    // A profiles until converged; the reasons name the setting and how many jobs it learned.
    for (k, n) in [20_000usize, 60_000, 100_000].into_iter().enumerate() {
        let s = run(n, json!({})).await;
        assert_eq!(
            (s.policy.as_str(), s.mode),
            ("remote", JobMode::Profiling),
            "{s:?}"
        );
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(
            why.starts_with(&format!(
                "setting output_bytes=100000 ({k} job{} learned): profiling ({k} of at most 30 profiling jobs; then it plans with the models as they are): the models have not converged",
                if k == 1 { "" } else { "s" }
            )),
            "{why}"
        );
    }
    let m = models().await;
    assert_eq!(
        m.setting, a_key,
        "the top level is the default parameters' setting"
    );
    assert_eq!(
        m.mode.as_ref().map(|v| v.mode),
        Some(JobMode::Planned),
        "{m:?}"
    );

    // B profiles under its own key; A's jobs in between stay planned, a new seed included.
    for (k, n) in [30_000usize, 70_000, 110_000].into_iter().enumerate() {
        let s = run(n, b()).await;
        assert_eq!(
            (s.policy.as_str(), s.mode),
            ("remote", JobMode::Profiling),
            "{s:?}"
        );
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(
            why.starts_with(&format!("setting output_bytes=1000000 ({k} job")),
            "{why}"
        );
        assert!(why.contains("profiling"), "{why}");
        let seed = if k == 1 {
            json!({ "seed": 7 })
        } else {
            json!({})
        };
        let s = run(40_000 + 30_000 * k, seed).await;
        assert_eq!(
            (s.policy.as_str(), s.mode),
            ("sonic", JobMode::Planned),
            "{s:?}"
        );
        let why = s.mode_reason.clone().unwrap_or_default();
        assert!(why.starts_with("setting output_bytes=100000 ("), "{why}");
        assert!(why.contains("planned: the models converged"), "{why}");
    }
    let m = models().await;
    // Listed by key: `{"output_bytes":1000000}` sorts before `{"output_bytes":100000}`.
    let listed: Vec<(&str, usize, Option<JobMode>)> = m
        .settings
        .iter()
        .map(|v| (v.setting.as_str(), v.jobs, v.mode.as_ref().map(|m| m.mode)))
        .collect();
    assert_eq!(
        listed,
        [
            (b_key, 3, Some(JobMode::Planned)),
            (a_key, 6, Some(JobMode::Planned))
        ],
        "{m:?}"
    );
    let b_view = &m.settings[0];
    assert_eq!(b_view.params.get("output_bytes"), Some(&json!(1_000_000)));
    assert_eq!(b_view.label, "output_bytes=1000000");

    // Both converged: A and B in turn, each planned with its own models, more jobs than the
    // drift rule needs, and no drift.
    for (i, n) in [25_000usize, 55_000, 85_000, 115_000]
        .into_iter()
        .enumerate()
    {
        for params in [json!({}), b()] {
            let s = run(n + 1000 * i, params.clone()).await;
            assert_eq!(
                (s.policy.as_str(), s.mode),
                ("sonic", JobMode::Planned),
                "{params}: {s:?}"
            );
        }
    }
    let m = models().await;
    for v in &m.settings {
        let mode = v.mode.as_ref().expect("mode");
        assert_eq!((mode.mode, mode.drifts), (JobMode::Planned, 0), "{v:?}");
        assert!(mode.watch.is_empty(), "{v:?}");
    }
    // Each setting predicts its own bytes on mid -> sink.
    let bytes = |key: &str| {
        m.settings
            .iter()
            .find(|v| v.setting == key)
            .and_then(|v| v.models.iter().find(|p| p.parameter == "mid->sink.bytes"))
            .and_then(|p| p.equation.clone())
            .unwrap_or_default()
    };
    // A constant (least squares leaves a residue of a slope): its last term.
    let constant = |key: &str| {
        let e = bytes(key);
        let c = e.rsplit(' ').next().and_then(|t| t.parse::<f64>().ok());
        (e, c.unwrap_or(f64::NAN))
    };
    let (ea, ca) = constant(a_key);
    assert!((ca - 1e5).abs() < 1.0, "A: {ea}");
    let (eb, cb) = constant(b_key);
    assert!((cb - 1e6).abs() < 1.0, "B: {eb}");

    // The view of the setting a job with given overrides plans with; the seed does not split.
    let of = |query: &'static str| {
        let c = &c;
        async move {
            let (status, v) = c
                .get_json_status(&format!("/v1/dags/knob/models?params={query}"))
                .await;
            assert_eq!(status, 200, "{v}");
            serde_json::from_value::<DagModelsView>(v).expect("models view")
        }
    };
    let mb = of("%7B%22output_bytes%22%3A1000000%7D").await;
    assert_eq!(
        (mb.setting.as_str(), mb.jobs, mb.samples.len()),
        (b_key, 7, 7)
    );
    let ma = of("%7B%22seed%22%3A9%7D").await;
    assert_eq!((ma.setting.as_str(), ma.jobs), (a_key, 10));
    let (status, v) = c
        .get_json_status("/v1/dags/knob/models?params=%5B1%5D")
        .await;
    assert_eq!(status, 400, "{v}");
    c.stop().await;
}

/// A job's percentile objective (interfaces.md §6) through the control plane: a profiling job
/// is not planned for it; once the models converged, an objective out of reach refuses the job
/// (422, naming the best reachable) unless best effort, which runs it and says the plan misses;
/// one within reach is planned for and recorded in the summary; `sonic-mean` plans for it as a
/// bound on the mean; a DAG's own `slo:` applies to jobs that give none; a malformed one is a
/// 400 that changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_planned_for_its_percentile_slo_or_refused() {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 4,
        ..Convergence::default()
    };
    let c = cluster_with(rule).await;
    c.apply(DAG).await;
    let body = |n: usize, extra: Value| {
        let mut b = json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
        });
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    // Malformed: refused, nothing stored.
    for bad in [
        json!({ "slo": { "percentile": 20, "latency_s": 1.0 } }),
        json!({ "slo": { "percentile": 95, "latency_s": 0.0 } }),
        json!({ "slo": { "percentile": 95 } }),
    ] {
        let r = c.post_job(body(1000, bad.clone())).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
    let (_, jobs) = c.get_json_status("/v1/jobs").await;
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "{jobs}");
    // Profiling (the models cannot predict yet): not planned for the objective.
    for (k, n) in [30_000usize, 90_000, 150_000, 210_000]
        .into_iter()
        .enumerate()
    {
        let extra = if k == 0 {
            json!({ "slo": { "percentile": 95, "latency_s": 3600.0 } })
        } else {
            json!({})
        };
        let id = c.queue(body(n, extra)).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(
            (s.status, s.mode),
            (JobStatus::Succeeded, JobMode::Profiling),
            "{v}"
        );
        assert!(v.get("slo").is_none(), "{v}");
    }
    // The plan route answers what a job with an objective would get.
    let plan = |q: &str| {
        let path = format!("/v1/dags/fan/plan?input_bytes=120000&{q}");
        let c = &c;
        async move { c.get_json_status(&path).await }
    };
    let (status, answer) = plan("slo=p95%3D1ms").await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer.to_string().contains("no plan meets the SLO p95"),
        "{answer}"
    );
    let (status, answer) = plan("slo=p95%3D1ms&slo_best_effort=true").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["slo"]["met"], false, "{answer}");
    let (status, answer) = plan("slo=p95%3D1h").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["slo"]["met"], true, "{answer}");
    assert_eq!(answer["slo"]["latency_s"], 3600.0, "{answer}");
    let (status, answer) = plan("slo=p20%3D1s").await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = plan("slo=soon").await;
    assert_eq!(status, 400, "{answer}");
    // Out of reach: refused before it runs, naming the best p95 there is.
    let tight = json!({ "slo": { "percentile": 95, "latency_s": 0.000_001 } });
    let r = c.post_job(body(120_000, tight.clone())).await;
    assert_eq!(r.status(), 422);
    let err: Value = r.json().await.expect("json");
    let msg = err["error"].as_str().unwrap_or("");
    assert!(
        msg.contains("no plan meets the SLO p95") && msg.contains("lowest p95 latency reachable"),
        "{err}"
    );
    let (_, jobs) = c.get_json_status("/v1/jobs").await;
    assert_eq!(
        jobs["jobs"].as_array().map(Vec::len),
        Some(4),
        "a refused job is not stored: {jobs}"
    );
    // Best effort: it runs, planned, and the report says the plan misses.
    let mut effort = tight.clone();
    effort["slo_best_effort"] = json!(true);
    let id = c.queue(body(120_000, effort)).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(
        (s.status, s.mode),
        (JobStatus::Succeeded, JobMode::Planned),
        "{v}"
    );
    assert_eq!(
        v["slo"],
        json!({ "percentile": 95.0, "latency_s": 0.000_001, "best_effort": true }),
        "{v}"
    );
    let report = crate::support::report_json(s.plan.as_ref().expect("plan"));
    assert_eq!(report["slo"]["met"], false, "{report}");
    assert!(
        report["slo"]["predicted_s"]
            .as_f64()
            .is_some_and(|x| x > 0.0),
        "{report}"
    );
    // Within reach: planned for it, met.
    let id = c
        .queue(body(
            120_000,
            json!({ "slo": { "percentile": 90, "latency_s": 3600.0 } }),
        ))
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(
        (s.status, s.mode),
        (JobStatus::Succeeded, JobMode::Planned),
        "{v}"
    );
    assert_eq!(
        v["slo"],
        json!({ "percentile": 90.0, "latency_s": 3600.0 }),
        "{v}"
    );
    let report = crate::support::report_json(s.plan.as_ref().expect("plan"));
    let verdict = &report["slo"];
    assert_eq!(verdict["met"], true, "{report}");
    assert_eq!(verdict["percentile"], 90.0);
    let p90 = verdict["predicted_s"].as_f64().expect("predicted_s");
    assert!(p90 > 0.0 && p90 <= 3600.0, "{report}");
    assert_eq!(
        report["predicted"]["latency_quantiles_s"]["p90"].as_f64(),
        Some(p90),
        "{report}"
    );
    // The paper's planner, forced: the objective as a bound on the mean.
    let id = c
        .queue(body(
            120_000,
            json!({ "policy": "sonic-mean", "slo": { "percentile": 95, "latency_s": 3600.0 } }),
        ))
        .await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(
        (s.status, s.policy.as_str(), s.mode),
        (JobStatus::Succeeded, "sonic-mean", JobMode::Planned),
        "{v}"
    );
    let report = crate::support::report_json(s.plan.as_ref().expect("plan"));
    assert_eq!(report["policy"], "sonic-mean", "{report}");
    assert_eq!(report["slo"]["met"], true, "{report}");
    // The DAG's own objective applies to a job that gives none.
    c.apply(&format!("{DAG}slo: {{ percentile: 99, latency: 1h }}\n"))
        .await;
    let id = c.queue(body(120_000, json!({}))).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(
        (s.status, s.mode),
        (JobStatus::Succeeded, JobMode::Planned),
        "{v}"
    );
    assert_eq!(
        v["slo"],
        json!({ "percentile": 99.0, "latency_s": 3600.0 }),
        "{v}"
    );
}

/// Timed prewarm (issue 36, ORION §6.4.4): in a planned job whose first stage takes 1.5 s, the
/// mids' containers are asked for when the plan needs them, not when gen starts; the job's plan
/// notes say how long the prewarm waits and the idle container-seconds that saves, and the
/// job's prewarm calls reach its agents (their prewarm counts grow, polled; which call started
/// which container the counts do not tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_jobs_next_stage_is_prewarmed_when_the_plan_needs_it() {
    let c = cluster_with(Convergence {
        max_mape: 1000.0,
        min_samples: 2,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    let body = |n: usize| {
        json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
            "params": { "gen.sleep_ms": 1500 },
        })
    };
    let prewarmed = |c: &Cluster| -> u64 {
        c.agents
            .iter()
            .filter_map(|a| a.state.sandbox.prewarm_stats())
            .map(|s| s.started)
            .sum()
    };
    let mut planned = None;
    for n in [30_000, 90_000, 150_000, 210_000, 120_000] {
        let before = prewarmed(&c);
        let id = c.queue(body(n)).await;
        let (v, s) = c.ended(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        if s.mode == JobMode::Planned {
            planned = Some((v, s, before));
            break;
        }
    }
    let (v, s, before) = planned.expect("the DAG plans within five jobs");
    let notes = &s.plan.as_ref().expect("plan").notes;
    let timed = notes
        .iter()
        .find(|n| n.starts_with("prewarm of mid sent "))
        .unwrap_or_else(|| panic!("no timed prewarm of mid in the notes: {v}"));
    assert!(
        timed.contains("after gen starts, when the plan needs its containers")
            && timed.contains("container-seconds not spent idle"),
        "{timed}"
    );
    // The wait is the plan's gap less the lead: gen's predicted 1.5 s bounds it.
    let waited: f64 = timed
        .trim_start_matches("prewarm of mid sent ")
        .split(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no wait in {timed}"));
    assert!(waited > 0.0 && waited < 1.5 + 1.0, "{timed}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while prewarmed(&c) == before {
        assert!(
            Instant::now() < deadline,
            "the timed prewarm never reached an agent"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.stop().await;
}

/// The job ids of a `GET /v1/jobs` answer, newest first.
fn job_ids(v: &Value) -> Vec<String> {
    v["jobs"]
        .as_array()
        .map(|js| {
            js.iter()
                .filter_map(|j| j["job_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A DAG's schedule (interfaces.md §7) starts its jobs: every second here, each job with the
/// DAG's defaults and no input, each under the key of its time; deleting the DAG stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dags_schedule_starts_its_jobs_until_the_dag_is_deleted() {
    let c = cluster().await;
    c.apply(
        "name: ticker\ntriggers:\n  - { schedule: \"* * * * * *\" }\nfunctions:\n  - { name: t, image: sonic-lambdas:latest, command: [synthetic, --output-bytes, \"16\", --to, result], timeout: 30s }\n",
    )
    .await;
    assert_eq!(c.control().state.ctx.triggers.keys(), ["ticker"]);
    // The DAG's list shows what starts its jobs (`ofctl get dags`' TRIGGERS).
    let (_, list) = c.get_json_status("/v1/dags").await;
    assert_eq!(
        list["dags"][0]["triggers"],
        json!(["schedule * * * * * *"]),
        "{list}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut started = Vec::new();
    while started.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        started = job_ids(&c.get_json_status("/v1/jobs?dag=ticker").await.1);
    }
    assert!(started.len() >= 2, "the schedule started {started:?}");
    // Deleted: its schedule goes with it.
    let r = c
        .http
        .delete(c.url_for("/v1/dags/ticker"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 204);
    assert!(c.control().state.ctx.triggers.keys().is_empty());
    for id in started.iter().take(2) {
        let s = c.wait(id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{id}: {:?}", s.error);
        assert_eq!(s.outputs.len(), 1, "{id}");
    }
}

/// A DAG's `object_created` trigger (interfaces.md §7): what is under the prefix when it first
/// looks is not new; each object that appears after starts one job with it as the input, and
/// only one, however many looks follow and across a restart of the control plane (an object
/// that arrived while it was down starts its job when it is back); deleting the DAG stops the
/// watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_objects_under_a_dags_prefix_start_one_job_each() {
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tune_agents(|a| a.network_mbps = None)
        .executor_threads(2)
        .tune(|j| j.trigger_poll = Duration::from_millis(100))
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await;
    let store = c.store().clone();
    store
        .put_bytes("incoming/before.bin", bytes::Bytes::from_static(b"old"))
        .await
        .expect("put");
    c.apply(
        "name: watcher\ntriggers:\n  - { object_created: { prefix: incoming/ } }\nfunctions:\n  - { name: w, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }\n",
    )
    .await;
    let ctx = c.control().state.ctx.clone();
    assert_eq!(ctx.triggers.keys(), ["watcher objects incoming/"]);
    // Its first look takes what is there as not new.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let looked = ctx
            .db
            .run(|db| db.trigger_baseline("watcher", "incoming/"))
            .await
            .expect("db");
        if looked || Instant::now() > deadline {
            assert!(looked, "the trigger never looked at its prefix");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ran = Vec::new();
    for (key, data) in [
        ("incoming/a.bin", &b"first"[..]),
        ("incoming/b c.bin", &b"second"[..]),
    ] {
        store
            .put_bytes(key, bytes::Bytes::copy_from_slice(data))
            .await
            .expect("put");
        let deadline = Instant::now() + Duration::from_secs(60);
        let job = loop {
            let jobs = job_ids(&c.get_json_status("/v1/jobs?dag=watcher").await.1);
            if jobs.len() > ran.len() || Instant::now() > deadline {
                assert_eq!(jobs.len(), ran.len() + 1, "{key}: {jobs:?}");
                break jobs[0].clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let s = c.wait(&job).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{key}: {:?}", s.error);
        let results = c.results(&s).await;
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(
            results[0].1, data,
            "{key}: the job's input was the new object"
        );
        ran.push(job);
    }
    // Many looks later, still one job per new object and none for the old one.
    let jobs = job_ids(&c.get_json_status("/v1/jobs?dag=watcher").await.1);
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    // An object that arrives while the control plane is down starts its job once it is back;
    // those seen before do not start theirs again.
    let c = c
        .restart_with(|_| {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(
                    store.put_bytes("incoming/down.bin", bytes::Bytes::from_static(b"down")),
                )
            })
            .expect("put while down");
        })
        .await;
    let ctx = c.control().state.ctx.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let jobs = loop {
        let jobs = job_ids(&c.get_json_status("/v1/jobs?dag=watcher").await.1);
        if jobs.len() > 2 || Instant::now() > deadline {
            break jobs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    let s = c.wait(&jobs[0]).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(c.results(&s).await[0].1, b"down");
    // Looks after that one start nothing more.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let jobs = job_ids(&c.get_json_status("/v1/jobs?dag=watcher").await.1);
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    let r = c
        .http
        .delete(c.url_for("/v1/dags/watcher"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 204);
    assert!(ctx.triggers.keys().is_empty());
    // What it saw goes with it: the DAG applied again looks afresh.
    let looked = ctx
        .db
        .run(|db| db.trigger_baseline("watcher", "incoming/"))
        .await
        .expect("db");
    assert!(!looked);
}

/// A function's `env:` (interfaces.md §7) reaches its runs: the lambda writes what it sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_functions_env_reaches_its_runs() {
    let c = cluster().await;
    c.apply(
        "name: envy\nfunctions:\n  - name: e\n    image: sonic-lambdas:latest\n    command: [sh, -c, 'mkdir -p \"$SONIC_OUTPUT_DIR/result\" && printf \"%s %s\" \"$MODE\" \"$LEVEL\" > \"$SONIC_OUTPUT_DIR/result/env.txt\"']\n    env: { MODE: fast, LEVEL: 3 }\n    timeout: 30s\n",
    )
    .await;
    let (_, s) = c.run(json!({ "dag": "envy" })).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    let results = c.results(&s).await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].1, b"fast 3");
}

/// gen's file goes to slow and, directly, to join, which waits for slow: under `memory` the
/// gen -> join file waits in the tier while slow runs.
const WAITING: &str = r#"
name: waiting
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, "slow,join"], timeout: 30s }
  - { name: slow, image: sonic-lambdas:latest, command: [synthetic, copy, --to, join, --sleep-ms, "3000"], timeout: 30s }
  - { name: join, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: slow, kind: one }
  - { from: gen, to: join, kind: one }
  - { from: slow, to: join, kind: one }
"#;

/// The job's result files, by name with the job's id taken out, and their bytes.
async fn results_of(c: &Cluster, id: &str, s: &JobSummary) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for out in &s.outputs {
        let key = out.strip_prefix("store://").expect("store url");
        let data = c.store().get_bytes(key).await.expect("result");
        files.push((key.replace(id, "JOB"), data.to_vec()));
    }
    files.sort();
    files
}

/// `memory` through a real Redis: the job's intermediates pass through the tier (no store
/// request, nothing left in the tier or the store after), with the results `remote` gives; with
/// the tier gone before the job, every file goes to the store and the job completes; with the
/// tier gone while a file waits in it, the job fails naming the tier, and once it is back the
/// next job runs through it again. A control plane without a tier refuses `memory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_runs_through_the_memory_tier_with_the_results_of_the_store() {
    use sonic_storage::ObjectStore as _;
    let mut redis = sonic_testkit::redis::RedisServer::start(&[]);
    let url = redis.url();
    let (jobs_url, agents_url) = (url.clone(), url.clone());
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tune_agents(move |a| {
            a.network_mbps = None;
            a.memory_tier = Some(agents_url.clone());
        })
        .tune(move |j| j.memory_tier = Some(jobs_url.clone()))
        .executor_threads(2)
        .wait_deadline(Duration::from_secs(90))
        .start()
        .await;
    let tier = sonic_storage::redis::RedisStore::connect(&url, sonic_storage::redis::NAMESPACE)
        .await
        .expect("the tier");
    c.apply(WAITING).await;
    let input = sized_input(200_000);
    let submit = |policy: &'static str| {
        json!({
            "dag": "waiting",
            "policy": policy,
            "input": { "name": "data.bin", "base64": base64(&input) },
        })
    };

    let id = c.queue(submit("remote")).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let want = results_of(&c, &id, &s).await;
    assert_eq!(want.len(), 2, "{v}");
    assert!(want.iter().all(|(_, data)| data == &input));

    let id = c.queue(submit("memory")).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert!(s.edges.iter().all(|e| e.method.as_str() == "memory"), "{v}");
    assert_eq!(
        results_of(&c, &id, &s).await,
        want,
        "memory's results differ"
    );
    // No store request: every intermediate went through the tier, whose files cost something.
    assert_eq!(s.requests_usd, 0.0, "{v}");
    assert!(s.storage_usd > 0.0, "{v}");
    let prefix = format!("jobs/{id}/");
    assert!(
        tier.list(&prefix).await.expect("list").is_empty(),
        "left in the tier"
    );
    let left = c.store().list(&prefix).await.expect("list");
    assert_eq!(
        left.len(),
        2,
        "only the results stay in the store: {left:?}"
    );

    // The tier gone before the job: its files go to the store, and it completes.
    redis.kill();
    let id = c.queue(submit("memory")).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(
        results_of(&c, &id, &s).await,
        want,
        "results through the store differ"
    );

    // The tier gone while gen's file for join waits in it (slow sleeps 3 s): join cannot
    // have it, and the job fails saying why.
    redis.restart();
    let id = c.queue(submit("memory")).await;
    let waiting = format!("jobs/{id}/gen/0/join/");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tier.list(&waiting).await.map_or(true, |l| l.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "gen's file never reached the tier"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.kill();
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("memory tier"), "{v}");
    // Nothing of the job's input was lost: with the tier back, the job runs again.
    redis.restart();
    let id = c.queue(submit("memory")).await;
    let (v, s) = c.ended(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    assert_eq!(results_of(&c, &id, &s).await, want);

    // A control plane without a tier refuses the policy, saying what to configure.
    let plain = cluster().await;
    plain.apply(WAITING).await;
    let r = plain.post_job(submit("memory")).await;
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap_or_default();
    assert!(body.contains("--memory-tier"), "{body}");
}

/// One function that sleeps 400 ms, under a DAG bound of 100 ms on latency.
const BOUNDED: &str = r#"
name: bounded
functions:
  - { name: slow, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result, --sleep-ms, "400"], timeout: 30s }
bounds: { max_latency: 100ms, max_cost_usd: 1 }
"#;

/// A job that succeeds outside its DAG's bounds says so in its summary (the planner meets the
/// bounds on its predictions; what ran may not), and only the bound it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_misses_its_dags_bound_says_so() {
    let c = cluster().await;
    c.apply(BOUNDED).await;
    let input = sized_input(1000);
    let (v, s) = c.run_ok("bounded", Some("remote"), &input).await;
    assert!(s.latency_s > 0.4, "{v}");
    assert_eq!(s.bounds_missed.len(), 1, "{v}");
    let missed = &s.bounds_missed[0];
    assert!(
        missed.starts_with("latency ") && missed.ends_with("over the DAG's max_latency 0.1 s"),
        "{missed}"
    );
    assert_eq!(v["bounds_missed"][0], serde_json::json!(missed), "{v}");
    c.stop().await;
}
