//! Jobs end to end: the control plane and two real agents in-process (process sandbox running the
//! `synthetic` lambda, one shared LocalStore), over HTTP on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_agent::config::{AgentConfig, local_config};
use sonic_agent::sandbox::{ProcessConfig, ProcessSandbox};
use sonic_agent::server::RunningAgent;
use sonic_agent::throttle::AgentThrottle;
use sonic_api::control::{JobStatus, JobSummary};
use sonic_control::{
    ControlConfig, JobsConfig, RunningControl, Runtime, SystemClock, start_with_jobs,
};
use sonic_core::catalog::Catalog;
use sonic_core::units::Seconds;
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;

const TOKEN: &str = "control-token-0123456789";
const FILE_KEY: &str = "file-key-0123456789abcdef";

const CATALOG: &str = r#"
vm_types:
  - { name: m5.large,   vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge,  vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

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

/// `target/debug` after building the lambdas in it.
fn lambda_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let status = std::process::Command::new(&cargo)
            .args(["build", "-p", "sonic-lambdas", "--bin", "synthetic"])
            .current_dir(&workspace)
            .status()
            .expect("run cargo to build the synthetic lambda");
        assert!(status.success(), "`cargo build -p sonic-lambdas` failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        target.join("debug")
    })
}

struct Cluster {
    control: RunningControl,
    agents: Vec<RunningAgent>,
    store: Arc<LocalStore>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn agent(id: &str, root: &Path, store: Arc<LocalStore>) -> RunningAgent {
    let mut cfg: AgentConfig = local_config(id, &root.join(id), TOKEN, FILE_KEY);
    cfg.vm_type = "m5.large".into();
    cfg.bin_dirs = vec![lambda_dir().to_path_buf()];
    let sandbox = ProcessSandbox::new(ProcessConfig {
        work_dir: root.join(id).join("processes"),
        path: cfg.bin_dirs.clone(),
        ..ProcessConfig::default()
    })
    .expect("process sandbox");
    sonic_agent::server::start(
        cfg,
        Arc::new(sandbox),
        Some(store),
        &AgentThrottle::unlimited(),
    )
    .await
    .expect("start agent")
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(LocalStore::new(dir.path().join("store")).expect("store"));
    let a = agent("a-1", dir.path(), store.clone()).await;
    let b = agent("a-2", dir.path(), store.clone()).await;
    let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
    jobs.backoff = Duration::from_millis(20);
    let runtime = Runtime::new(
        store.clone(),
        Some(Catalog::from_yaml(CATALOG).expect("catalog")),
        jobs,
    );
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("control"),
        token: TOKEN.into(),
        // These agents do not heartbeat (no control URL): registration must keep them alive for
        // the whole test, however slow the machine.
        heartbeat_timeout: Seconds(3600.0),
        ..ControlConfig::default()
    };
    let control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
        .await
        .expect("start control plane");
    let http = reqwest::Client::new();
    for a in [&a, &b] {
        let r = http
            .post(format!("{}/v1/agents/register", control.url()))
            .bearer_auth(TOKEN)
            .json(&a.state.capacity())
            .send()
            .await
            .expect("register");
        assert!(r.status().is_success(), "register: {}", r.status());
    }
    Cluster {
        control,
        agents: vec![a, b],
        store,
        http,
        _dir: dir,
    }
}

impl Cluster {
    async fn apply(&self, yaml: &str) {
        let r = self
            .http
            .put(format!("{}/v1/dags", self.control.url()))
            .bearer_auth(TOKEN)
            .header("content-type", "application/yaml")
            .body(yaml.to_owned())
            .send()
            .await
            .expect("apply");
        assert!(r.status().is_success(), "apply: {}", r.status());
    }

    async fn submit(&self, body: Value) -> String {
        let r = self
            .http
            .post(format!("{}/v1/jobs", self.control.url()))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("submit");
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("accepted");
        assert_eq!(v["status"], "queued");
        let id = v["job_id"].as_str().expect("job id").to_owned();
        assert!(id.starts_with("j-"), "{id}");
        id
    }

    async fn get(&self, id: &str) -> (Value, JobSummary) {
        let r = self
            .http
            .get(format!("{}/v1/jobs/{id}", self.control.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get job");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        let s: JobSummary = serde_json::from_value(v.clone()).expect("summary");
        (v, s)
    }

    /// Polls the job until it ends (deadline, no fixed sleeps).
    async fn wait(&self, id: &str) -> (Value, JobSummary) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (v, s) = self.get(id).await;
            if s.status.is_terminal() {
                return (v, s);
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        self.control.stop().await;
        for a in self.agents {
            a.stop().await;
        }
    }
}

fn input_bytes() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect()
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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
    let input = input_bytes();
    let mut results: Vec<Vec<(String, Vec<u8>)>> = Vec::new();
    for policy in ["remote", "direct", "local"] {
        let id = c
            .submit(json!({
                "dag": "fan",
                "policy": policy,
                "input": { "name": "data.bin", "base64": base64(&input) },
            }))
            .await;
        let (v, s) = c.wait(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        assert_summary_shape(&v);
        assert_eq!(s.policy, policy);
        assert_eq!(s.input_bytes, input.len() as u64);
        assert!(s.latency_s > 0.0);
        assert!(s.cost_usd > 0.0, "{policy}: cost from the catalog price");
        assert!(
            (s.perf_per_dollar - 1.0 / (s.latency_s * s.cost_usd)).abs() < 1e-6 * s.perf_per_dollar
        );
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
            assert_eq!(e.method, method, "{v}");
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
            let data = c.store.get_bytes(key).await.expect("result");
            assert_eq!(
                data.as_ref(),
                input.as_slice(),
                "{policy}: {key} differs from the input"
            );
            files.push((key.replace(&id, "JOB"), data.to_vec()));
        }
        results.push(files);
        // Only the results stay in the store; the agents forgot the job.
        let left = c.store.list(&format!("jobs/{id}/")).await.expect("list");
        assert_eq!(left.len(), 2, "intermediates left in the store: {left:?}");
        for a in &c.agents {
            let job = sonic_agent::files::JobId::parse(&id).expect("id");
            assert!(a.state.files.list(&job).expect("list").is_empty());
        }
        // A profiling sample was recorded.
        let samples = c.control.state.db.samples("fan").expect("samples");
        let sample = samples.iter().find(|x| x.job == id).expect("sample");
        assert_eq!(sample.input_bytes, n);
        assert_eq!(sample.measured["functions"]["mid"]["instances"], 2);
        assert_eq!(sample.measured["edges"][0]["bytes"], 2 * n);
    }
    assert_eq!(results[0], results[1], "remote and direct results differ");
    assert_eq!(results[0], results[2], "remote and local results differ");

    let r: Value = c
        .http
        .get(format!("{}/v1/jobs", c.control.url()))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lambda_fails_the_job_after_its_retries() {
    let c = cluster().await;
    c.apply(FAILING).await;
    let id = c
        .submit(json!({ "dag": "broken", "policy": "remote" }))
        .await;
    let (v, s) = c.wait(&id).await;
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
    // No sample from a failed job; nothing of it left in the store.
    assert!(
        c.control
            .state
            .db
            .samples("broken")
            .expect("samples")
            .is_empty()
    );
    assert!(
        c.store
            .list(&format!("jobs/{id}/"))
            .await
            .expect("list")
            .is_empty()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_are_refused() {
    let c = cluster().await;
    c.apply(DAG).await;
    let post = |body: Value| {
        c.http
            .post(format!("{}/v1/jobs", c.control.url()))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    assert_eq!(
        post(json!({ "dag": "nope" })).await.expect("send").status(),
        404
    );
    assert_eq!(
        post(json!({ "dag": "fan", "policy": "fast" }))
            .await
            .expect("send")
            .status(),
        400
    );
    assert_eq!(
        post(json!({ "dag": "fan", "params": { "mids": 0 } }))
            .await
            .expect("send")
            .status(),
        400
    );
    assert_eq!(
        post(json!({ "dag": "fan", "input": { "base64": "!!" } }))
            .await
            .expect("send")
            .status(),
        400
    );
    assert_eq!(
        post(json!({ "dag": "fan", "input": { "key": "no/such/object" } }))
            .await
            .expect("send")
            .status(),
        400
    );
    let missing = c
        .http
        .get(format!("{}/v1/jobs/j-0000", c.control.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("send");
    assert_eq!(missing.status(), 404);
    c.stop().await;
}

#[tokio::test]
async fn a_job_running_at_restart_is_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sonic_control::Db::open_dir(dir.path()).expect("db");
    let job = sonic_control::store::JobRecord {
        id: "j-left".into(),
        dag: "fan".into(),
        status: JobStatus::Running,
        policy: "remote".into(),
        mode: sonic_api::control::JobMode::Profiling,
        input_bytes: 0,
        params: Default::default(),
        summary: None,
        error: None,
        created_ms: 1,
        started_ms: Some(1),
        finished_ms: None,
        updated_ms: 1,
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
        let id = c
            .submit(json!({ "dag": "shuffle", "policy": policy }))
            .await;
        let (v, s) = c.wait(&id).await;
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
            let data = c.store.get_bytes(key).await.expect("result");
            assert_eq!(data.len(), 20_000, "{rel}");
            files.push((rel.to_owned(), data.to_vec()));
        }
        assert_eq!(files.len(), 4, "{v}");
        seen.push(files);
    }
    assert_eq!(seen[0], seen[1], "direct and remote results differ");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_fails_as_cancelled() {
    let c = cluster().await;
    c.apply(
        r#"
name: slow
functions:
  - { name: nap, image: sonic-lambdas:latest, command: [synthetic, run, --sleep-ms, "2000"], timeout: 30s }
"#,
    )
    .await;
    let id = c.submit(json!({ "dag": "slow", "policy": "remote" })).await;
    let r = c
        .http
        .post(format!("{}/v1/jobs/{id}/cancel", c.control.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 202);
    let (v, s) = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Failed, "{v}");
    assert!(
        s.error.as_deref().unwrap_or("").contains("cancelled"),
        "{v}"
    );
    // A finished job cannot be cancelled again.
    let again = c
        .http
        .post(format!("{}/v1/jobs/{id}/cancel", c.control.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("cancel");
    assert_eq!(again.status(), 400);
    c.stop().await;
}

#[tokio::test]
async fn without_an_object_store_jobs_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().to_path_buf(),
        token: TOKEN.into(),
        ..ControlConfig::default()
    };
    let control = sonic_control::start(config, Arc::new(SystemClock))
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
