//! Two agents over HTTP on loopback, running the synthetic lambda as processes: a sender's output
//! reaches receivers by `vm-storage`, `direct` and `remote`, byte-exact, through the run API.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sonic_agent::config::{AgentConfig, local_config};
use sonic_agent::sandbox::{ProcessConfig, ProcessSandbox};
use sonic_agent::server::RunningAgent;
use sonic_agent::throttle::AgentThrottle;
use sonic_api::agent::{
    FileSource, InputSpec, OutputRoute, RunAccepted, RunReport, RunRequest, RunStatus,
};
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;
use sonic_testkit::lambda_dir;

const TOKEN: &str = "control-token-0123456789";
const FILE_KEY: &str = "file-key-0123456789abcdef";

struct Cluster {
    a: RunningAgent,
    b: RunningAgent,
    store: Arc<LocalStore>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn agent(id: &str, root: &Path, store: Arc<dyn ObjectStore>) -> RunningAgent {
    agent_with_tier(id, root, store, None).await
}

async fn agent_with_tier(
    id: &str,
    root: &Path,
    store: Arc<dyn ObjectStore>,
    memory_tier: Option<String>,
) -> RunningAgent {
    let mut cfg: AgentConfig = local_config(id, &root.join(id), TOKEN, FILE_KEY);
    cfg.bin_dirs = vec![lambda_dir().to_path_buf()];
    cfg.memory_tier = memory_tier;
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
    cluster_with_tier(None).await
}

/// Two agents sharing a store and, if given, a memory tier.
async fn cluster_with_tier(memory_tier: Option<String>) -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(LocalStore::new(dir.path().join("store")).expect("store"));
    let a = agent_with_tier("a-1", dir.path(), store.clone(), memory_tier.clone()).await;
    let b = agent_with_tier("a-2", dir.path(), store.clone(), memory_tier).await;
    Cluster {
        a,
        b,
        store,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

fn request(job: &str, function: &str, args: &[&str]) -> RunRequest {
    RunRequest {
        secrets: Default::default(),
        job_id: job.into(),
        function: function.into(),
        instance: 0,
        instances: 1,
        attempt: 1,
        execution: 1,
        function_key: None,
        image: "sonic-lambdas:latest".into(),
        command: std::iter::once("synthetic")
            .chain(args.iter().copied())
            .map(String::from)
            .collect(),
        env: Default::default(),
        params: Default::default(),
        fanouts: Default::default(),
        memory_limit_mb: 512,
        cpus: 1.0,
        timeout_ms: 60_000,
        inputs: Vec::new(),
        outputs: Vec::new(),
        output_quota_mb: None,
        report_url: None,
        handler: None,
    }
}

impl Cluster {
    /// Submits a run and polls its report until it ends (deadline, no fixed sleeps).
    async fn run(&self, agent: &RunningAgent, req: &RunRequest) -> RunReport {
        let id = self.start(agent, req).await;
        self.wait_report(agent, &id).await
    }

    /// Submits a run; its id.
    async fn start(&self, agent: &RunningAgent, req: &RunRequest) -> String {
        let r = self
            .http
            .post(format!("{}/v1/runs", agent.url()))
            .bearer_auth(TOKEN)
            .json(req)
            .send()
            .await
            .expect("post run");
        assert!(
            r.status().is_success(),
            "run refused: {}",
            r.text().await.unwrap_or_default()
        );
        r.json::<RunAccepted>().await.expect("accepted").run_id
    }

    /// The report of run `id` as it stands.
    async fn report(&self, agent: &RunningAgent, id: &str) -> RunReport {
        self.http
            .get(format!("{}/v1/runs/{id}", agent.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get run")
            .json()
            .await
            .expect("report")
    }

    /// Polls the report of run `id` until it ends (deadline, no fixed sleeps).
    async fn wait_report(&self, agent: &RunningAgent, id: &str) -> RunReport {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let report = self.report(agent, id).await;
            if report.status != RunStatus::Running {
                return report;
            }
            assert!(Instant::now() < deadline, "run did not end in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_moves_by_every_method_byte_exact() {
    let c = cluster().await;
    let job = "j-daemon-1";
    // The sender writes 3 MiB for `recv` (kept on its agent and uploaded to the store).
    let mut send = request(
        job,
        "send",
        &[
            "--output-bytes",
            "3145728",
            "--to",
            "recv",
            "--name",
            "data.bin",
        ],
    );
    send.outputs = vec![OutputRoute {
        to: "recv".into(),
        keep_local: true,
        upload_prefix: Some(format!("jobs/{job}/send/0/recv")),
        memory: false,
    }];
    let sent = c.run(&c.a, &send).await;
    assert_eq!(sent.status, RunStatus::Succeeded, "{sent:?}");
    assert_eq!(sent.outputs.len(), 1, "{sent:?}");
    let out = &sent.outputs[0];
    assert_eq!(out.size, 3_145_728);
    assert_eq!(out.file_path, "send/0/recv/data.bin");
    let key = out.key.clone().expect("uploaded");
    assert_eq!(c.store.head(&key).await.expect("head"), Some(3_145_728));

    let token = sonic_api::token::issue(FILE_KEY.as_bytes(), job, &out.file_path, u64::MAX / 2);
    let sources = [
        (
            "vm-storage",
            &c.a,
            FileSource::VmStorage {
                file_path: out.file_path.clone(),
            },
        ),
        (
            "direct",
            &c.b,
            FileSource::Direct {
                peer_url: c.a.url(),
                file_path: out.file_path.clone(),
                token,
            },
        ),
        ("remote", &c.b, FileSource::Remote { key }),
    ];
    for (i, (method, agent, source)) in sources.into_iter().enumerate() {
        let mut recv = request(job, "recv", &["--mode", "copy", "--to", "result"]);
        recv.attempt = i as u32 + 1;
        recv.inputs = vec![InputSpec {
            dest: "send/0/data.bin".into(),
            source,
            expected_size: None,
        }];
        recv.outputs = vec![OutputRoute {
            to: "result".into(),
            keep_local: true,
            upload_prefix: None,
            memory: false,
        }];
        let got = c.run(agent, &recv).await;
        assert_eq!(got.status, RunStatus::Succeeded, "{method}: {got:?}");
        assert_eq!(got.staged.len(), 1);
        assert_eq!(got.staged[0].method.as_str(), method);
        assert_eq!(got.staged[0].bytes, 3_145_728);
        assert_eq!(got.outputs.len(), 1, "{method}: {got:?}");
        assert_eq!(
            got.outputs[0].checksum, out.checksum,
            "{method}: bytes differ"
        );
    }

    // Cleaning the job removes its files from the agent.
    let r = c
        .http
        .delete(format!("{}/v1/jobs/{job}", c.a.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 204);
    assert!(
        c.a.state
            .files
            .list(&sonic_agent::files::JobId::parse(job).expect("id"))
            .expect("list")
            .is_empty()
    );
    c.a.stop().await;
    c.b.stop().await;
}

/// `memory`: a sender's output goes to the memory tier (not the store) and a receiver on another
/// agent reads it from there, byte-exact; with the tier stopped, an output asked for the tier goes
/// to the store (its report says why) and a receiver reads it from there, while a file that was
/// in the tier is gone with it and the run that needs it fails naming the tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_passes_through_the_memory_tier_or_the_store_when_the_tier_is_gone() {
    let mut server = sonic_testkit::redis::RedisServer::start(&[]);
    let c = cluster_with_tier(Some(server.url())).await;
    let job = "j-daemon-memory";
    let send = |name: &str, attempt: u32| {
        let mut send = request(
            job,
            "send",
            &["--output-bytes", "3145728", "--to", "recv", "--name", name],
        );
        send.attempt = attempt;
        send.outputs = vec![OutputRoute {
            to: "recv".into(),
            keep_local: false,
            upload_prefix: Some(format!("jobs/{job}/send/0/recv")),
            memory: true,
        }];
        send
    };
    let recv = |source: FileSource, attempt: u32| {
        let mut recv = request(job, "recv", &["--mode", "copy", "--to", "result"]);
        recv.attempt = attempt;
        recv.inputs = vec![InputSpec {
            dest: "send/0/data.bin".into(),
            source,
            expected_size: Some(3_145_728),
        }];
        recv.outputs = vec![OutputRoute {
            to: "result".into(),
            keep_local: true,
            upload_prefix: None,
            memory: false,
        }];
        recv
    };

    let sent = c.run(&c.a, &send("data.bin", 1)).await;
    assert_eq!(sent.status, RunStatus::Succeeded, "{sent:?}");
    let out = &sent.outputs[0];
    let key = out.key.clone().expect("uploaded");
    assert!(out.in_memory && out.spilled.is_none(), "{out:?}");
    assert_eq!(
        c.store.head(&key).await.expect("head"),
        None,
        "not in the store"
    );
    let got = c
        .run(&c.b, &recv(FileSource::Memory { key: key.clone() }, 1))
        .await;
    assert_eq!(got.status, RunStatus::Succeeded, "{got:?}");
    assert_eq!(got.staged[0].method.as_str(), "memory");
    assert!(got.staged[0].fetched);
    assert_eq!(got.outputs[0].checksum, out.checksum, "bytes differ");

    // The tier goes (and what it held with it).
    server.kill();
    let spilled = c.run(&c.a, &send("late.bin", 2)).await;
    assert_eq!(spilled.status, RunStatus::Succeeded, "{spilled:?}");
    let late = &spilled.outputs[0];
    let why = late
        .spilled
        .as_deref()
        .expect("the report says it went to the store");
    assert!(!late.in_memory && why.contains("memory tier"), "{late:?}");
    let late_key = late.key.clone().expect("uploaded");
    assert_eq!(
        c.store.head(&late_key).await.expect("head"),
        Some(3_145_728)
    );
    let got = c
        .run(&c.b, &recv(FileSource::Remote { key: late_key }, 2))
        .await;
    assert_eq!(got.status, RunStatus::Succeeded, "{got:?}");
    assert_eq!(got.outputs[0].checksum, late.checksum, "bytes differ");

    let lost = c.run(&c.a, &recv(FileSource::Memory { key }, 3)).await;
    assert_ne!(lost.status, RunStatus::Succeeded, "{lost:?}");
    let error = lost.error.unwrap_or_default();
    assert!(error.contains("memory tier"), "{error}");
    c.a.stop().await;
    c.b.stop().await;
}

/// A store whose uploads and downloads each take 30 ms more, counting how many are in flight at
/// once (the most seen).
#[derive(Debug)]
struct Counting {
    inner: LocalStore,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Counting {
    async fn timed<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let out = f.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, sonic_storage::StoreError> {
        self.timed(self.inner.put_file(key, path)).await
    }
    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, sonic_storage::StoreError> {
        self.timed(self.inner.get_file(key, path)).await
    }
    async fn put_bytes(
        &self,
        key: &str,
        data: bytes::Bytes,
    ) -> Result<(), sonic_storage::StoreError> {
        self.inner.put_bytes(key, data).await
    }
    async fn get_bytes(&self, key: &str) -> Result<bytes::Bytes, sonic_storage::StoreError> {
        self.inner.get_bytes(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, sonic_storage::StoreError> {
        self.inner.head(key).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<sonic_storage::ObjectInfo>, sonic_storage::StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), sonic_storage::StoreError> {
        self.inner.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, sonic_storage::StoreError> {
        self.inner.delete_prefix(prefix).await
    }
}

/// A shuffle's files: one instance uploads its six outputs and another fetches six inputs
/// concurrently (the store sees several requests in flight, where one at a time would pay its
/// latency six times), byte-exact; each transfer's reported seconds are its share of the time
/// they took together, so they never add up to more than the instance's span. Two inputs named
/// alike are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_moves_its_files_concurrently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(Counting {
        inner: LocalStore::new(dir.path().join("store")).expect("store"),
        now: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let a = agent("a-1", dir.path(), store.clone()).await;
    let c = Cluster {
        b: agent("a-2", dir.path(), store.clone()).await,
        a,
        store: Arc::new(LocalStore::new(dir.path().join("unused")).expect("store")),
        http: reqwest::Client::new(),
        _dir: dir,
    };
    let job = "j-daemon-shuffle";
    let receivers: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
    let mut send = request(
        job,
        "send",
        &[
            "--output-bytes",
            "100000",
            "--to",
            &receivers.join(","),
            "--name",
            "part",
        ],
    );
    send.outputs = receivers
        .iter()
        .map(|r| OutputRoute {
            to: r.clone(),
            keep_local: false,
            upload_prefix: Some(format!("jobs/{job}/send/0/{r}")),
            memory: false,
        })
        .collect();
    let sent = c.run(&c.a, &send).await;
    assert_eq!(sent.status, RunStatus::Succeeded, "{sent:?}");
    assert_eq!(sent.outputs.len(), 6, "{sent:?}");
    assert!(
        store.most.load(Ordering::SeqCst) > 1,
        "the six uploads went one at a time"
    );
    let uploads: f64 = sent.outputs.iter().filter_map(|o| o.upload_seconds).sum();
    assert_eq!(
        sent.outputs
            .iter()
            .filter(|o| o.upload_seconds.is_some())
            .count(),
        6
    );

    store.most.store(0, Ordering::SeqCst);
    let mut recv = request(job, "gather", &["--mode", "copy", "--to", "result"]);
    recv.inputs = sent
        .outputs
        .iter()
        .map(|o| InputSpec {
            dest: format!("send/0/{}", o.to),
            source: FileSource::Remote {
                key: o.key.clone().expect("uploaded"),
            },
            expected_size: Some(o.size),
        })
        .collect();
    recv.outputs = vec![OutputRoute {
        to: "result".into(),
        keep_local: true,
        upload_prefix: None,
        memory: false,
    }];
    let started = Instant::now();
    let got = c.run(&c.b, &recv).await;
    let span = started.elapsed().as_secs_f64();
    assert_eq!(got.status, RunStatus::Succeeded, "{got:?}");
    assert!(
        store.most.load(Ordering::SeqCst) > 1,
        "the six downloads went one at a time"
    );
    assert_eq!(got.staged.len(), 6);
    let mut outs = got.outputs.clone();
    outs.sort_by(|x, y| x.name.cmp(&y.name));
    for (o, s) in outs.iter().zip(&sent.outputs) {
        assert_eq!(o.checksum, s.checksum, "{} differs", o.name);
    }
    let staged: f64 = got.staged.iter().map(|s| s.seconds).sum();
    assert!(
        staged <= span && uploads > 0.0,
        "staged {staged} s in an instance of {span} s"
    );

    // The same destination twice: refused, nothing runs.
    let mut twice = recv.clone();
    twice.attempt = 2;
    twice.inputs[1].dest = twice.inputs[0].dest.clone();
    let r = c
        .http
        .post(format!("{}/v1/runs", c.b.url()))
        .bearer_auth(TOKEN)
        .json(&twice)
        .send()
        .await
        .expect("post run");
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    if status.is_success() {
        let id: RunAccepted = serde_json::from_str(&body).expect("accepted");
        let got = c.wait_report(&c.b, &id.run_id).await;
        assert_eq!(got.status, RunStatus::Error, "{got:?}");
        assert!(
            got.error.as_deref().unwrap_or("").contains("named twice"),
            "{got:?}"
        );
    } else {
        assert!(body.contains("named twice"), "{status}: {body}");
    }
    c.a.stop().await;
    c.b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_reported_not_crashes() {
    let c = cluster().await;
    let job = "j-daemon-2";
    // Exit status.
    let got = c.run(&c.a, &request(job, "f", &["--exit-code", "3"])).await;
    assert_eq!(got.status, RunStatus::Failed);
    assert_eq!(got.exit_code, Some(3));
    // A command that is not there cannot start: another attempt would not start it either.
    let mut absent = request(job, "n", &[]);
    absent.command = vec!["sonic-no-such-command".into()];
    let got = c.run(&c.a, &absent).await;
    assert_eq!(got.status, RunStatus::Unrunnable, "{got:?}");
    assert_eq!(got.exit_code, Some(127));
    assert!(
        got.error.as_deref().unwrap_or("").contains("was not found"),
        "{got:?}"
    );
    // Timeout.
    let mut slow = request(job, "g", &["--sleep-ms", "30000"]);
    slow.timeout_ms = 300;
    assert_eq!(c.run(&c.a, &slow).await.status, RunStatus::TimedOut);
    // An input that is not there: the instance never starts.
    let mut missing = request(job, "h", &["--mode", "copy", "--to", "result"]);
    missing.inputs = vec![InputSpec {
        dest: "x/0/f".into(),
        source: FileSource::VmStorage {
            file_path: "x/0/h/f".into(),
        },
        expected_size: None,
    }];
    let got = c.run(&c.a, &missing).await;
    assert_eq!(got.status, RunStatus::Error);
    assert!(
        got.error
            .as_deref()
            .unwrap_or("")
            .contains("not on this agent"),
        "{got:?}"
    );
    // A lambda writing to a folder that is no receiver of it.
    let stray = request(job, "k", &["--output-bytes", "10", "--to", "nobody"]);
    let got = c.run(&c.a, &stray).await;
    assert_eq!(got.status, RunStatus::Error);
    assert!(
        got.error
            .as_deref()
            .unwrap_or("")
            .contains("not a receiver"),
        "{got:?}"
    );
    // A direct fetch with a token for another file is refused by the peer.
    let mut sneaky = request(job, "m", &["--mode", "copy", "--to", "result"]);
    sneaky.inputs = vec![InputSpec {
        dest: "x/0/f".into(),
        source: FileSource::Direct {
            peer_url: c.a.url(),
            file_path: "f/0/result/out".into(),
            token: sonic_api::token::issue(FILE_KEY.as_bytes(), job, "other/path", u64::MAX / 2),
        },
        expected_size: None,
    }];
    sneaky.outputs = vec![OutputRoute {
        to: "result".into(),
        keep_local: true,
        upload_prefix: None,
        memory: false,
    }];
    assert_eq!(c.run(&c.b, &sneaky).await.status, RunStatus::Error);
    c.a.stop().await;
    c.b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_stops_runs_one_by_one_or_by_job() {
    let c = cluster().await;
    let job = "j-daemon-stop";
    let status = |path: String| {
        let http = c.http.clone();
        let url = format!("{}{path}", c.a.url());
        async move {
            http.delete(url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("delete")
                .status()
                .as_u16()
        }
    };
    let wait_running = |n: u32| {
        let state = c.a.state.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while state.running.load(std::sync::atomic::Ordering::SeqCst) != n {
                assert!(Instant::now() < deadline, "never {n} running");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // One run, stopped by its id: the lambda (sleeping 60 s) is gone at once.
    let one = c
        .start(&c.a, &request(job, "f", &["--sleep-ms", "60000"]))
        .await;
    wait_running(1).await;
    assert_eq!(status(format!("/v1/runs/{one}")).await, 204);
    wait_running(0).await;
    let report = c.report(&c.a, &one).await;
    assert_eq!(report.status, RunStatus::Error);
    assert!(
        report.error.as_deref().unwrap_or("").contains("stopped"),
        "{report:?}"
    );
    // Stopped already, or never there.
    assert_eq!(status(format!("/v1/runs/{one}")).await, 409);
    assert_eq!(status(format!("/v1/runs/{job}.nope.0.1")).await, 404);
    // Deleting the job stops what it still runs, and only that.
    let _g = c
        .start(&c.a, &request(job, "g", &["--sleep-ms", "60000"]))
        .await;
    let other = request("j-daemon-other", "h", &["--sleep-ms", "1500"]);
    let other_id = c.start(&c.a, &other).await;
    wait_running(2).await;
    assert_eq!(status(format!("/v1/jobs/{job}")).await, 204);
    wait_running(1).await;
    let r = c.wait_report(&c.a, &other_id).await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    c.a.stop().await;
    c.b.stop().await;
}

#[tokio::test]
async fn the_api_checks_tokens_and_bodies() {
    let c = cluster().await;
    let url = c.a.url();
    let health = c
        .http
        .get(format!("{url}/v1/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    // Every control-plane route of the table, over a real socket (tests/it/access.rs walks every
    // route in-process with more credentials).
    let control_routes = sonic_agent::server::routes()
        .into_iter()
        .filter(|r| r.guard == sonic_agent::server::Guard::ControlToken);
    for route in control_routes {
        // Any `{param}` becomes `x`.
        let path: String = route
            .path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "x" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for auth in [None, Some("wrong-token-0123456789")] {
            let mut rb = c.http.request(route.method.clone(), format!("{url}{path}"));
            if let Some(t) = auth {
                rb = rb.bearer_auth(t);
            }
            let r = rb.send().await.expect("send");
            assert_eq!(r.status(), 401, "{} {path} with {auth:?}", route.method);
        }
    }
    let cap: sonic_api::agent::Capacity = c
        .http
        .get(format!("{url}/v1/capacity"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("capacity")
        .json()
        .await
        .expect("json");
    assert_eq!(cap.agent_id, "a-1");
    assert_eq!(cap.sandbox, "process");
    // Malformed and hostile run requests: 400 with a message, nothing runs.
    let mut bad_job = request("../etc", "f", &[]);
    bad_job.job_id = "../etc".into();
    let mut bad_dest = request("j", "f", &[]);
    bad_dest.inputs = vec![InputSpec {
        dest: "../../x".into(),
        source: FileSource::Remote { key: "k".into() },
        expected_size: None,
    }];
    let mut bad_env = request("j", "f", &[]);
    bad_env.env.insert("SONIC_INPUT_DIR".into(), "/".into());
    for req in [bad_job, bad_dest, bad_env] {
        let r = c
            .http
            .post(format!("{url}/v1/runs"))
            .bearer_auth(TOKEN)
            .json(&req)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400);
        let body: sonic_api::agent::ErrorBody = r.json().await.expect("error body");
        assert!(!body.error.is_empty());
    }
    let r = c
        .http
        .post(format!("{url}/v1/runs"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{\"job_id\": 5}")
        .send()
        .await
        .expect("send");
    // Well-formed JSON of the wrong shape: axum's 422, with serde's message.
    assert_eq!(r.status(), 422);
    assert!(r.text().await.expect("body").contains("job_id"));
    let huge = vec![b'x'; 2 * 1024 * 1024];
    let r = c
        .http
        .post(format!("{url}/v1/runs"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 413);
    c.a.stop().await;
    c.b.stop().await;
}
