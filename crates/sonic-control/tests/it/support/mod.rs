//! A cluster in this process for the observability tests (metrics, logs, dashboard): the control
//! plane with jobs and real agents (process sandbox running the `synthetic` lambda, one shared
//! LocalStore), over HTTP on loopback.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_agent::config::{AgentConfig, local_config};
use sonic_agent::sandbox::{ProcessConfig, ProcessSandbox};
use sonic_agent::server::RunningAgent;
use sonic_agent::throttle::AgentThrottle;
use sonic_api::control::JobSummary;
use sonic_control::{
    ControlConfig, JobsConfig, RunningControl, Runtime, SystemClock, start_with_jobs,
};
use sonic_core::catalog::Catalog;
use sonic_core::regression::Convergence;
use sonic_core::units::Seconds;
use sonic_storage::local::LocalStore;

pub const TOKEN: &str = "control-token-0123456789";
pub const FILE_KEY: &str = "file-key-0123456789abcdef";

pub const CATALOG: &str = r#"
vm_types:
  - { name: m5.large,   vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge,  vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

/// gen copies the job input and broadcasts it to two mids, which copy it on; sink gathers both.
pub const DAG: &str = r#"
name: fan
description: gen broadcasts the input to two mids; sink gathers their copies
params: { mids: 2 }
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: "{{ params.mids }}", timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

/// `target/debug` after building the lambdas in it (`sonic_testkit::lambda_dir`).
pub fn lambda_dir() -> &'static Path {
    sonic_testkit::lambda_dir()
}

/// Whether this run is CI's (`sonic_testkit::in_ci`).
pub fn in_ci() -> bool {
    sonic_testkit::in_ci()
}

pub struct Cluster {
    pub control: RunningControl,
    pub agents: Vec<RunningAgent>,
    pub store: Arc<LocalStore>,
    pub http: reqwest::Client,
    pub dir: tempfile::TempDir,
}

async fn agent(id: &str, vm_type: &str, root: &Path, store: Arc<LocalStore>) -> RunningAgent {
    let mut cfg: AgentConfig = local_config(id, &root.join(id), TOKEN, FILE_KEY);
    cfg.vm_type = vm_type.into();
    cfg.vcpus = if vm_type == "m5.xlarge" { 4 } else { 2 };
    cfg.network_mbps = Some(if vm_type == "m5.xlarge" {
        1250.0
    } else {
        750.0
    });
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

impl Cluster {
    /// A control plane on port 0 and two agents (m5.large, m5.xlarge), registered.
    pub async fn start(convergence: Convergence) -> Cluster {
        Cluster::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), convergence).await
    }

    pub async fn start_on(listen: SocketAddr, convergence: Convergence) -> Cluster {
        Cluster::start_tuned(listen, convergence, |_| {}).await
    }

    /// [`Cluster::start_on`] with the executor's configuration changed by `tune`.
    pub async fn start_tuned(
        listen: SocketAddr,
        convergence: Convergence,
        tune: impl FnOnce(&mut JobsConfig),
    ) -> Cluster {
        Cluster::start_with(
            listen,
            convergence,
            &[("a-1", "m5.large"), ("a-2", "m5.xlarge")],
            tune,
        )
        .await
    }

    /// A control plane on port 0 and the agents given (id, VM type), registered.
    pub async fn start_agents(convergence: Convergence, agents: &[(&str, &str)]) -> Cluster {
        let listen = SocketAddr::from(([127, 0, 0, 1], 0));
        Cluster::start_with(listen, convergence, agents, |_| {}).await
    }

    async fn start_with(
        listen: SocketAddr,
        convergence: Convergence,
        agents: &[(&str, &str)],
        tune: impl FnOnce(&mut JobsConfig),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(LocalStore::new(dir.path().join("store")).expect("store"));
        let mut running = Vec::new();
        for (id, vm_type) in agents {
            running.push(agent(id, vm_type, dir.path(), store.clone()).await);
        }
        let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
        jobs.backoff = Duration::from_millis(20);
        jobs.convergence = convergence;
        tune(&mut jobs);
        let runtime = Runtime::new(
            store.clone(),
            Some(Catalog::from_yaml(CATALOG).expect("catalog")),
            jobs,
        );
        let config = ControlConfig {
            listen,
            data_dir: dir.path().join("control"),
            token: TOKEN.into(),
            // These agents do not heartbeat (no control URL): registration keeps them alive.
            heartbeat_timeout: Seconds(3600.0),
            ..ControlConfig::default()
        };
        let control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
            .await
            .expect("start control plane");
        let http = reqwest::Client::new();
        for a in &running {
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
            agents: running,
            store,
            http,
            dir,
        }
    }

    pub fn url(&self) -> String {
        self.control.url()
    }

    pub async fn apply(&self, yaml: &str) {
        let r = self
            .http
            .put(format!("{}/v1/dags", self.url()))
            .bearer_auth(TOKEN)
            .header("content-type", "application/yaml")
            .body(yaml.to_owned())
            .send()
            .await
            .expect("apply");
        assert!(r.status().is_success(), "apply: {}", r.status());
    }

    pub async fn submit(&self, body: Value) -> String {
        let r = self
            .http
            .post(format!("{}/v1/jobs", self.url()))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("submit");
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("accepted");
        v["job_id"].as_str().expect("job id").to_owned()
    }

    /// Submits a job of `fan` with `n` bytes of input.
    pub async fn submit_sized(&self, policy: Option<&str>, n: usize) -> String {
        let mut body = json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
        });
        if let Some(p) = policy {
            body["policy"] = json!(p);
        }
        self.submit(body).await
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get");
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.expect("json body")
    }

    /// Polls the job until it ends (deadline, no fixed sleeps).
    pub async fn wait(&self, id: &str) -> JobSummary {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.get_json(&format!("/v1/jobs/{id}")).await;
            let s: JobSummary = serde_json::from_value(v.clone()).expect("summary");
            if s.status.is_terminal() {
                return s;
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET url` with the token (when given): status and body text.
    pub async fn get_text(&self, url: &str, token: Option<&str>) -> (u16, String) {
        let mut req = self.http.get(url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("get");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    pub async fn stop(self) {
        self.control.stop().await;
        for a in self.agents {
            a.stop().await;
        }
    }
}

pub fn sized_input(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

pub fn base64(data: &[u8]) -> String {
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

/// A job plan's report as it travels (`null` without one): what the tests read by key.
pub fn report_json(plan: &sonic_api::control::JobPlan) -> serde_json::Value {
    serde_json::to_value(&plan.report).expect("a plan report encodes")
}
