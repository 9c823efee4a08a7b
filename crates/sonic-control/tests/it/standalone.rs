//! The daemons as they run on real hosts, in-process: a control plane started from its own
//! configuration only (`sonic_control::start`: its store, its generated agent token and file key),
//! serving HTTPS with a certificate of `deploy/certs.sh`; agents that know only its URL, the join
//! token and the CA (`sonic_agent::start_from_config`), serving HTTPS themselves. A job runs under
//! every policy with `direct` files crossing between the agents over TLS; wrong credentials and
//! untrusting clients are refused.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_agent::config::{AgentConfig, SandboxChoice};
use sonic_agent::server::RunningAgent;
use sonic_api::control::{AgentList, JobStatus, JobSummary};
use sonic_control::{ControlConfig, RunningControl, SystemClock};
use sonic_daemon::TlsFiles;
use sonic_storage::StoreChoice;

use crate::support::{base64, lambda_dir};

const TOKEN: &str = "api-token-0123456789abcdef";
const JOIN: &str = "join-token-0123456789abcdef";

const DAG: &str = r#"
name: fan
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: 2, timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A CA and certificates for `names` (SANs: the name, localhost, 127.0.0.1) by deploy/certs.sh.
fn certificates(dir: &Path, names: &[&str]) {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(workspace().join("deploy/certs.sh"))
        .arg("--out")
        .arg(dir);
    for n in names {
        cmd.args(["--name", n]);
    }
    let out = cmd.output().expect("run deploy/certs.sh");
    assert!(
        out.status.success(),
        "deploy/certs.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tls_files(dir: &Path, name: &str) -> TlsFiles {
    TlsFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    }
}

/// The store of this run: SeaweedFS when the tests have one (CI), else a folder.
fn store_choice(dir: &Path) -> StoreChoice {
    match std::env::var("SONIC_S3_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => StoreChoice::S3(sonic_storage::s3::S3Config::new(
            endpoint,
            "sonic-standalone",
            "sonic",
            "sonicsecret",
        )),
        _ => StoreChoice::Local {
            root: dir.join("store"),
        },
    }
}

struct Cluster {
    control: RunningControl,
    agents: Vec<RunningAgent>,
    /// Trusts the cluster's CA only.
    http: reqwest::Client,
    certs: PathBuf,
    _dir: tempfile::TempDir,
}

fn agent_config(id: &str, dir: &Path, certs: &Path, control: &str, join: &str) -> AgentConfig {
    AgentConfig {
        id: id.to_owned(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.join(id),
        vm_type: "m5.large".into(),
        control_url: Some(control.to_owned()),
        join_token: join.to_owned(),
        tls: Some(tls_files(certs, id)),
        ca_file: Some(certs.join("ca.pem")),
        sandbox: SandboxChoice::Process,
        bin_dirs: vec![lambda_dir().to_path_buf()],
        heartbeat_interval_ms: 200,
        ..AgentConfig::default()
    }
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("tls");
    certificates(&certs, &["control", "a-1", "a-2"]);
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("control"),
        token: TOKEN.into(),
        join_token: JOIN.into(),
        store: Some(store_choice(dir.path())),
        tls: Some(tls_files(&certs, "control")),
        ca_file: Some(certs.join("ca.pem")),
        ..ControlConfig::default()
    };
    let control = sonic_control::start(config, std::sync::Arc::new(SystemClock))
        .await
        .expect("start the control plane from its configuration");
    assert!(control.url().starts_with("https://"), "{}", control.url());
    let mut agents = Vec::new();
    for id in ["a-1", "a-2"] {
        let cfg = agent_config(id, dir.path(), &certs, &control.url(), JOIN);
        // It has no token and no file key of its own: both come from joining.
        assert!(cfg.token.is_empty() && cfg.file_key.is_empty());
        let agent = sonic_agent::start_from_config(cfg)
            .await
            .expect("the agent joins");
        assert!(agent.url().starts_with("https://"), "{}", agent.url());
        assert_eq!(agent.state.config.file_key.len(), 32, "file key received");
        agents.push(agent);
    }
    let http = sonic_daemon::tls::client_builder(Some(&certs.join("ca.pem")))
        .expect("CA")
        .build()
        .expect("client");
    Cluster {
        control,
        agents,
        http,
        certs,
        _dir: dir,
    }
}

impl Cluster {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.control.url())
    }

    async fn wait_alive(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let list: AgentList = self
                .http
                .get(self.url("/v1/agents"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("agents")
                .json()
                .await
                .expect("json");
            if list.agents.len() == 2 && list.agents.iter().all(|a| a.alive) {
                assert!(list.agents.iter().all(|a| a.url.starts_with("https://")));
                return;
            }
            assert!(Instant::now() < deadline, "agents not alive: {list:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn run(&self, policy: &str, input: &[u8]) -> (Value, JobSummary) {
        let r = self
            .http
            .post(self.url("/v1/jobs"))
            .bearer_auth(TOKEN)
            .json(&json!({
                "dag": "fan",
                "policy": policy,
                "input": { "name": "data.bin", "base64": base64(input) },
            }))
            .send()
            .await
            .expect("submit");
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("accepted");
        let id = v["job_id"].as_str().expect("id").to_owned();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v: Value = self
                .http
                .get(self.url(&format!("/v1/jobs/{id}")))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("get job")
                .json()
                .await
                .expect("json");
            let s: JobSummary = serde_json::from_value(v.clone()).expect("summary");
            if s.status.is_terminal() {
                return (v, s);
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every result file of a job, read through the API (keyed without the job id).
    async fn results(&self, s: &JobSummary) -> Vec<(String, Vec<u8>)> {
        let mut files = Vec::new();
        for out in &s.outputs {
            let marker = format!("jobs/{}/result/", s.job_id);
            let key = out
                .split_once(&marker)
                .map(|(_, k)| k.to_owned())
                .unwrap_or_else(|| panic!("output {out} is not a result"));
            let r = self
                .http
                .get(self.url(&format!("/v1/jobs/{}/results/{key}", s.job_id)))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("result");
            assert_eq!(r.status(), 200, "{out}");
            files.push((key, r.bytes().await.expect("bytes").to_vec()));
        }
        files.sort();
        files
    }

    async fn stop(self) {
        for a in self.agents {
            a.stop().await;
        }
        self.control.stop().await;
    }
}

#[tokio::test]
async fn joined_agents_run_a_job_under_every_policy_over_tls() {
    let c = cluster().await;
    c.wait_alive().await;
    let r = c
        .http
        .put(c.url("/v1/dags"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/yaml")
        .body(DAG)
        .send()
        .await
        .expect("apply");
    assert!(r.status().is_success(), "apply: {}", r.status());
    let input: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut all = Vec::new();
    for policy in ["direct", "remote", "local"] {
        let (v, s) = c.run(policy, &input).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        let method = if policy == "local" {
            "vm-storage"
        } else {
            policy
        };
        assert!(s.edges.iter().all(|e| e.method.as_str() == method), "{v}");
        let agents: std::collections::BTreeSet<&str> =
            s.functions.iter().map(|f| f.agent.as_str()).collect();
        if policy == "direct" {
            // direct files crossed between the two agents, over their TLS file servers.
            assert_eq!(agents.len(), 2, "direct spreads over both agents: {v}");
        }
        let files = c.results(&s).await;
        assert_eq!(files.len(), 2, "{v}");
        assert!(
            files.iter().all(|(_, d)| d == &input),
            "{policy}: results differ from the input"
        );
        all.push(files);
    }
    assert_eq!(all[0], all[1], "direct and remote results differ");
    assert_eq!(all[0], all[2], "direct and local results differ");
    c.stop().await;
}

#[tokio::test]
async fn wrong_credentials_and_untrusting_clients_are_refused() {
    let c = cluster().await;
    c.wait_alive().await;
    let dir = tempfile::tempdir().expect("tempdir");

    // An agent with a wrong join token is refused and does not start.
    certificates(&c.certs, &["a-3"]);
    let cfg = agent_config(
        "a-3",
        dir.path(),
        &c.certs,
        &c.control.url(),
        "wrong-join-token-0123456789",
    );
    let err = sonic_agent::start_from_config(cfg)
        .await
        .expect_err("a wrong join token is refused");
    assert!(err.to_string().contains("401"), "{err}");

    // An agent that does not trust the control plane's certificate stops with a clear error
    // instead of retrying for ever.
    let other = dir.path().join("other-ca");
    certificates(&other, &["x"]);
    let mut cfg = agent_config("a-3", dir.path(), &c.certs, &c.control.url(), JOIN);
    cfg.ca_file = Some(other.join("ca.pem"));
    let err = sonic_agent::start_from_config(cfg)
        .await
        .expect_err("an untrusted control plane is refused");
    assert!(err.to_string().contains("certificate"), "{err}");

    // The join token opens the agent routes only, never the API.
    for (path, token) in [
        ("/v1/agents", JOIN),
        ("/v1/dags", JOIN),
        ("/v1/jobs", "nope"),
    ] {
        let r = c
            .http
            .get(c.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 401, "{path} with {token}");
    }

    // A client that does not trust the cluster's CA cannot talk to the control plane or to an
    // agent, token or not.
    let untrusting = reqwest::Client::new();
    for url in [
        c.url("/v1/health"),
        format!("{}/v1/health", c.agents[0].url()),
    ] {
        let e = untrusting
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect_err("an untrusted certificate is refused");
        assert!(e.is_connect(), "{url}: {e}");
    }
    // Another CA's client is refused just the same.
    let foreign = sonic_daemon::tls::client_builder(Some(&other.join("ca.pem")))
        .expect("CA")
        .build()
        .expect("client");
    assert!(foreign.get(c.url("/v1/health")).send().await.is_err());
    // Plain HTTP to the TLS port gets nothing useful.
    let plain = c.control.url().replacen("https://", "http://", 1);
    let r = reqwest::Client::new()
        .get(format!("{plain}/v1/agents"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert!(r.map(|r| !r.status().is_success()).unwrap_or(true));
    c.stop().await;
}

#[tokio::test]
async fn a_restarted_control_plane_hands_out_the_same_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ControlConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("control"),
        token: TOKEN.into(),
        join_token: JOIN.into(),
        ..ControlConfig::default()
    };
    let secrets = |c: &RunningControl| {
        c.state
            .jobs
            .as_ref()
            .expect("a standalone control plane runs jobs")
            .join_secrets()
    };
    let first = sonic_control::start(config.clone(), std::sync::Arc::new(SystemClock))
        .await
        .expect("start");
    let before = secrets(&first);
    // No store configured: the fallback folder in the data folder, said so.
    assert_eq!(
        before.store,
        Some(sonic_api::control::StoreSpec::Local {
            root: dir.path().join("control/store").display().to_string()
        })
    );
    first.stop().await;
    let second = sonic_control::start(config, std::sync::Arc::new(SystemClock))
        .await
        .expect("restart");
    assert_eq!(
        secrets(&second),
        before,
        "same agent token and file key after a restart"
    );
    second.stop().await;
}
