//! Agent loss: the three applications run under `direct` (every edge a VM-to-VM copy, so a lost
//! agent takes files the next stage needs) on agents that are processes of their own (this test
//! binary re-run as a whole agent, see `agent_process_entry`; process sandbox, one shared local
//! store). For each application and each of its stages, one agent is
//! killed with SIGKILL while the job's event stream says that stage runs; the job must succeed
//! with results byte-identical to an undisturbed run. A replacement agent joins after each kill.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_agent::config::{SandboxChoice, StoreChoice, local_config};
use sonic_api::control::{JobEvent, JobLogs, JobStatus, JobSummary};
use sonic_control::{
    ControlConfig, JobsConfig, RunningControl, Runtime, SystemClock, start_with_jobs,
};
use sonic_core::units::Seconds;
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;
use sonic_storage::s3::{S3Config, S3Store};
use sonic_testkit::lambda_dir as bin_dir;

const TOKEN: &str = "faults-token-0123456789";
const FILE_KEY: &str = "faults-file-key-0123456789abcdef";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The agent processes: this test binary started again with `SONIC_FAULTS_AGENT` set runs only
/// this entry, which is a whole `sonic-agent` (the library's `start_from_config`, as the daemon
/// does) until it is killed. Without the variable it does nothing.
#[test]
fn agent_process_entry() {
    let Ok(id) = std::env::var("SONIC_FAULTS_AGENT") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let root = PathBuf::from(var("SONIC_FAULTS_ROOT"));
    let mut cfg = local_config(&id, &root, TOKEN, FILE_KEY);
    cfg.vm_type = "m5.large".into();
    cfg.control_url = Some(var("SONIC_FAULTS_CONTROL"));
    cfg.sandbox = SandboxChoice::Process;
    cfg.store = Some(match std::env::var("SONIC_FAULTS_S3") {
        Ok(json) => StoreChoice::S3(serde_json::from_str(&json).expect("an S3Config")),
        Err(_) => StoreChoice::Local {
            root: PathBuf::from(var("SONIC_FAULTS_STORE")),
        },
    });
    cfg.bin_dirs = vec![PathBuf::from(var("SONIC_FAULTS_BINS"))];
    cfg.heartbeat_interval_ms = 1000;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let _agent = sonic_agent::start_from_config(cfg)
            .await
            .expect("start the agent");
        std::future::pending::<()>().await;
    });
}

fn tool(bin: &str, args: &[&str]) {
    let out = Command::new(bin_dir().join(bin))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One agent process; killed (SIGKILL) on drop if still running.
struct AgentProc {
    id: String,
    child: Child,
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    control: RunningControl,
    agents: Vec<AgentProc>,
    store: Arc<dyn ObjectStore>,
    /// The agents' S3 store, when not the shared local folder.
    s3: Option<S3Config>,
    http: reqwest::Client,
    dir: tempfile::TempDir,
    next: u32,
}

impl Cluster {
    async fn start(n: u32) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(LocalStore::new(dir.path().join("store")).expect("store"));
        Cluster::start_with(n, dir, store, None).await
    }

    async fn start_with(
        n: u32,
        dir: tempfile::TempDir,
        store: Arc<dyn ObjectStore>,
        s3: Option<S3Config>,
    ) -> Cluster {
        let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
        jobs.backoff = Duration::from_millis(20);
        let runtime = Runtime::new(store.clone(), None, jobs);
        let config = ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("control"),
            token: TOKEN.into(),
            // Agents heartbeat every second; a killed one drops out of the list after this.
            heartbeat_timeout: Seconds(4.0),
            max_body: sonic_core::units::ByteSize(256 << 20),
            ..ControlConfig::default()
        };
        let control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
            .await
            .expect("start control plane");
        let mut c = Cluster {
            control,
            agents: Vec::new(),
            store,
            s3,
            http: reqwest::Client::new(),
            dir,
            next: 1,
        };
        for _ in 0..n {
            c.add_agent();
        }
        c.wait_agents().await;
        c
    }

    fn add_agent(&mut self) -> String {
        let id = format!("a-{:02}", self.next);
        let root = self.dir.path().join("agents").join(&id);
        std::fs::create_dir_all(&root).unwrap();
        self.add_agent_at(root)
    }

    /// Starts an agent whose data directory is `root` (created by the caller).
    fn add_agent_at(&mut self, root: PathBuf) -> String {
        let id = format!("a-{:02}", self.next);
        self.next += 1;
        let log = std::fs::File::create(
            self.dir
                .path()
                .join("agents")
                .join(&id)
                .with_extension("log"),
        )
        .unwrap();
        let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
        if let Some(s3) = &self.s3 {
            cmd.env("SONIC_FAULTS_S3", serde_json::to_string(s3).unwrap());
        }
        let child = cmd
            .args([
                "--exact",
                "faults::agent_process_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("SONIC_FAULTS_AGENT", &id)
            .env("SONIC_FAULTS_ROOT", &root)
            .env("SONIC_FAULTS_CONTROL", self.control.url())
            .env("SONIC_FAULTS_STORE", self.dir.path().join("store"))
            .env("SONIC_FAULTS_BINS", bin_dir())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start an agent process");
        self.agents.push(AgentProc {
            id: id.clone(),
            child,
        });
        id
    }

    /// `GET path` on the control plane, as JSON.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        self.http
            .get(format!("{}{path}", self.control.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: not the JSON expected: {e}"))
    }

    /// The ids the control plane lists as alive.
    async fn alive(&self) -> Vec<String> {
        let v: Value = self.get_json("/v1/agents").await;
        let mut ids: Vec<String> = v["agents"]
            .as_array()
            .expect("agents array")
            .iter()
            .filter(|a| a["alive"] == json!(true))
            .map(|a| a["agent_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Waits until exactly the running agent processes are alive on the control plane.
    async fn wait_agents(&self) {
        let mut want: Vec<String> = self.agents.iter().map(|a| a.id.clone()).collect();
        want.sort();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let alive = self.alive().await;
            if alive == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agents alive {alive:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn apply(&self, file: &str) {
        let yaml = std::fs::read_to_string(workspace().join("dags").join(file)).unwrap();
        let r = self
            .http
            .put(format!("{}/v1/dags", self.control.url()))
            .bearer_auth(TOKEN)
            .header("content-type", "application/yaml")
            .body(yaml)
            .send()
            .await
            .expect("apply");
        assert!(r.status().is_success(), "apply {file}: {}", r.status());
    }

    async fn submit(&self, dag: &str, input: &Path, params: &Value) -> String {
        self.submit_as(dag, input, params, "direct").await
    }

    async fn submit_as(&self, dag: &str, input: &Path, params: &Value, policy: &str) -> String {
        let bytes = std::fs::read(input).unwrap();
        let name = input.file_name().unwrap().to_str().unwrap();
        let body = json!({
            "dag": dag,
            "policy": policy,
            "params": params,
            "input": { "name": name, "base64": base64(&bytes) },
        });
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
        v["job_id"].as_str().expect("job id").to_owned()
    }

    async fn summary(&self, id: &str) -> JobSummary {
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let v: Value = self.get_json(&format!("/v1/jobs/{id}")).await;
            let s: JobSummary = serde_json::from_value(v.clone()).expect("summary");
            if s.status.is_terminal() {
                return s;
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn results(&self, s: &JobSummary) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        for out in &s.outputs {
            let key = match out.strip_prefix("store://") {
                Some(k) => k,
                None => out
                    .strip_prefix("s3://")
                    .and_then(|r| r.split_once('/'))
                    .map(|(_, k)| k)
                    .expect("store or s3 url"),
            };
            let rel = key
                .strip_prefix(&format!("jobs/{}/result/", s.job_id))
                .expect("under result/")
                .to_owned();
            files.insert(
                rel,
                self.store.get_bytes(key).await.expect("result").to_vec(),
            );
        }
        files
    }

    /// Atomic visibility, as the agents checked it: in the job's logs, every receiving stage has
    /// instances that started after their inputs' sizes matched the senders' (the agent writes
    /// that line before the lambda's log), and no instance found an input incomplete.
    async fn assert_inputs_checked(&self, id: &str, receivers: &[&str]) {
        let logs: JobLogs = self.get_json(&format!("/v1/jobs/{id}/logs")).await;
        for l in &logs.logs {
            assert!(
                !l.log.contains("the instance was not started"),
                "{id}: {} {} started with an incomplete input: {}",
                l.function,
                l.instance,
                l.log
            );
        }
        for stage in receivers {
            assert!(
                logs.logs.iter().any(|l| l.function == *stage
                    && l.log
                        .contains("inputs complete before the start (sizes checked)")),
                "{id}: no {stage} instance reports its inputs checked: {logs:?}"
            );
        }
    }

    /// Follows the job's events until `stage` shows up (or the job ends): every event seen.
    async fn wait_stage(&self, id: &str, name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut r = self
            .http
            .get(format!("{}/v1/jobs/{id}/events", self.control.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("events");
        let mut buf = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, r.chunk())
                .await
                .unwrap_or_else(|_| panic!("the events of {id} did not end"))
                .expect("stream");
            let Some(chunk) = chunk else { return false };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(pos) = buf.find('\n') {
                let line: String = buf.drain(..=pos).collect();
                if let Some(data) = line.trim_end().strip_prefix("data:") {
                    let e: JobEvent = serde_json::from_str(data.trim()).expect("a JobEvent");
                    if e.stage.as_deref() == Some(name) {
                        return true;
                    }
                }
            }
        }
    }

    /// Follows the job's events; when `stage` shows up, kills the agent that runs its first
    /// instance under `direct` (placement `(stage + k) % agents` over the ids in order). Returns
    /// every event seen and the id killed (None if the stage was never seen running).
    async fn kill_during(
        &mut self,
        id: &str,
        stage: usize,
        name: &str,
    ) -> (Vec<JobEvent>, Option<String>) {
        let mut r = self
            .http
            .get(format!("{}/v1/jobs/{id}/events", self.control.url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("events");
        assert_eq!(r.status(), 200);
        let ids: Vec<String> = self.alive().await;
        let victim = ids[stage % ids.len()].clone();
        let mut killed = None;
        let mut buf = String::new();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, r.chunk())
                .await
                .unwrap_or_else(|_| panic!("the events of {id} did not end"))
                .expect("stream");
            let Some(chunk) = chunk else { break };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(pos) = buf.find('\n') {
                let line: String = buf.drain(..=pos).collect();
                if let Some(data) = line.trim_end().strip_prefix("data:") {
                    let e: JobEvent = serde_json::from_str(data.trim()).expect("a JobEvent");
                    if killed.is_none() && e.stage.as_deref() == Some(name) {
                        let pos = self.agents.iter().position(|a| a.id == victim).unwrap();
                        let mut a = self.agents.remove(pos);
                        a.child.kill().expect("SIGKILL the agent");
                        a.child.wait().expect("reap the agent");
                        killed = Some(victim.clone());
                    }
                    events.push(e);
                }
            }
        }
        (events, killed)
    }
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

struct App {
    file: &'static str,
    dag: &'static str,
    stages: [&'static str; 3],
    input: PathBuf,
    params: Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_agent_in_any_stage_of_any_application_changes_no_result() {
    let mut c = Cluster::start(3).await;
    let dir = c.dir.path().join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = |n: &str| dir.join(n).display().to_string();
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "4000000",
            "--seed",
            "7",
            "--out",
            &path("records.bin"),
        ],
    );
    tool(
        "sonic-gen",
        &[
            "ml",
            "--rows",
            "4000",
            "--seed",
            "3",
            "--out",
            &path("data.csv"),
        ],
    );
    tool(
        "sonic-gen",
        &[
            "video",
            "--seconds",
            "40",
            "--seed",
            "5",
            "--out",
            &path("video.y4m"),
            "--truth",
            &path("truth.json"),
        ],
    );
    let apps = [
        App {
            file: "mapreduce-sort.yaml",
            dag: "mapreduce-sort",
            stages: ["split", "map", "reduce"],
            input: dir.join("records.bin"),
            params: json!({ "mappers": 3, "reducers": 3 }),
        },
        App {
            file: "ml-pipeline.yaml",
            dag: "ml-pipeline",
            stages: ["pca", "train", "combine"],
            input: dir.join("data.csv"),
            params: json!({ "trees": 3 }),
        },
        App {
            file: "video-analytics.yaml",
            dag: "video-analytics",
            stages: ["split", "extract", "classify"],
            input: dir.join("video.y4m"),
            params: json!({}),
        },
    ];
    let mut report = Vec::new();
    for app in &apps {
        c.apply(app.file).await;
        let id = c.submit(app.dag, &app.input, &app.params).await;
        let undisturbed = c.summary(&id).await;
        assert_eq!(
            undisturbed.status.to_string(),
            "succeeded",
            "{}: {:?}",
            app.dag,
            undisturbed.error
        );
        let want = c.results(&undisturbed).await;
        assert!(!want.is_empty(), "{} has results", app.dag);
        let mut recovered = 0;
        for (stage, name) in app.stages.iter().enumerate() {
            let id = c.submit(app.dag, &app.input, &app.params).await;
            let (events, killed) = c.kill_during(&id, stage, name).await;
            let s = c.summary(&id).await;
            let killed = killed.unwrap_or_else(|| panic!("{}: stage {name} never ran", app.dag));
            assert_eq!(
                s.status.to_string(),
                "succeeded",
                "{} with {killed} killed during {name}: {:?}",
                app.dag,
                s.error
            );
            assert_eq!(
                c.results(&s).await,
                want,
                "{}: results after killing {killed} during {name} differ",
                app.dag
            );
            c.assert_inputs_checked(&id, &app.stages[1..]).await;
            let again = events.iter().any(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(&format!("agent {killed} lost")))
            });
            if again {
                recovered += 1;
            }
            report.push(format!(
                "{} {name}: killed {killed}, {}",
                app.dag,
                if again {
                    "ran again without it"
                } else {
                    "not needed again"
                }
            ));
            // A fresh agent replaces the dead one before the next kill.
            c.add_agent();
            c.wait_agents().await;
        }
        assert!(
            recovered >= 1,
            "{}: no kill made the job run again: {report:?}",
            app.dag
        );
    }
    eprintln!("{}", report.join("\n"));
    c.control.stop().await;
}

/// Unmounts a test's tmpfs however the test ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An agent whose disk is full (its data directory is a 2 MiB tmpfs, so writes fail with ENOSPC
/// for real) fails the instances placed on it with that reason, and the job runs again without
/// it, with the results of an undisturbed run. Needs root (mount), as `.ci/run` has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_instance_and_the_job_runs_elsewhere() {
    let mut c = Cluster::start(2).await;
    let dir = c.dir.path().join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "6000000",
            "--seed",
            "11",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    c.apply("mapreduce-sort.yaml").await;
    let params = json!({ "mappers": 3, "reducers": 3 });
    let id = c.submit("mapreduce-sort", &input, &params).await;
    let undisturbed = c.summary(&id).await;
    assert_eq!(
        undisturbed.status,
        JobStatus::Succeeded,
        "{:?}",
        undisturbed.error
    );
    let want = c.results(&undisturbed).await;

    let small = c.dir.path().join("agents").join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .output()
        .expect("run mount");
    assert!(
        mounted.status.success(),
        "this test mounts a small tmpfs to fill an agent's disk and needs root: {}",
        String::from_utf8_lossy(&mounted.stderr)
    );
    let _mount = Mount(small.clone());
    let full = c.add_agent_at(small);
    c.wait_agents().await;

    let id = c.submit("mapreduce-sort", &input, &params).await;
    let s = c.summary(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(c.results(&s).await, want, "results with a full disk differ");
    let logs: Value = c.get_json(&format!("/v1/jobs/{id}/logs")).await;
    let text = logs.to_string().to_ascii_lowercase();
    assert!(
        text.contains(&full) && text.contains("no space left on device"),
        "the logs name the full agent and the reason: {logs}"
    );
    c.control.stop().await;
}

/// A TCP forwarder standing between the cluster and the S3 server: taking it down refuses new
/// connections and cuts open ones, as a store that went away would.
struct Outage {
    addr: SocketAddr,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
    refused: Arc<std::sync::atomic::AtomicU32>,
}

impl Outage {
    async fn start(upstream: String) -> Outage {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(tokio::sync::Notify::new());
        let refused = Arc::new(AtomicU32::new(0));
        let (up2, cut2, refused2) = (up.clone(), cut.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !up2.load(Ordering::SeqCst) {
                    refused2.fetch_add(1, Ordering::SeqCst);
                    drop(inbound);
                    continue;
                }
                let (upstream, cut) = (upstream.clone(), cut2.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.notified() => {}
                    }
                });
            }
        });
        Outage {
            addr,
            up,
            cut,
            refused,
        }
    }

    fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The object store goes away during a `remote` job: for 2 s (shorter than the 6 s the agents
/// and the control plane wait out), the job completes with the undisturbed results; for good,
/// the job fails with an error naming the store. Needs the S3 server of `.ci/run`
/// (`SONIC_S3_ENDPOINT`, default http://127.0.0.1:8333).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_outage_is_waited_out_or_fails_the_job_clearly() {
    use std::sync::atomic::Ordering;
    let endpoint =
        std::env::var("SONIC_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:8333".into());
    let upstream = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let outage = Outage::start(upstream).await;
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let mut cfg = S3Config::new(
        format!("http://{}", outage.addr),
        // The shared bucket (SeaweedFS makes new buckets slowly); job keys are unique.
        env("SONIC_S3_BUCKET", "sonic"),
        env("SONIC_S3_ACCESS_KEY", "sonic"),
        env("SONIC_S3_SECRET_KEY", "sonicsecret"),
    );
    cfg.outage_window_ms = 6_000;
    cfg.max_attempts = 2;
    let raw = S3Store::new(cfg.clone()).expect("s3 store");
    raw.ensure_bucket().await.unwrap_or_else(|e| {
        panic!("this test needs the S3 server at {endpoint} (bash deploy/seaweedfs.sh start): {e}")
    });
    let store: Arc<dyn ObjectStore> = Arc::new(cfg.patient(raw));
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Cluster::start_with(2, dir, store, Some(cfg.clone())).await;
    let input = c.dir.path().join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "3000000",
            "--seed",
            "13",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    c.apply("mapreduce-sort.yaml").await;
    let params = json!({ "mappers": 3, "reducers": 2 });
    let mut jobs = Vec::new();
    let id = c
        .submit_as("mapreduce-sort", &input, &params, "remote")
        .await;
    jobs.push(id.clone());
    let undisturbed = c.summary(&id).await;
    assert_eq!(
        undisturbed.status,
        JobStatus::Succeeded,
        "{:?}",
        undisturbed.error
    );
    let want = c.results(&undisturbed).await;

    // A 2 s outage while the mappers run: waited out.
    let id = c
        .submit_as("mapreduce-sort", &input, &params, "remote")
        .await;
    jobs.push(id.clone());
    assert!(c.wait_stage(&id, "map").await, "the map stage ran");
    outage.down();
    tokio::time::sleep(Duration::from_secs(2)).await;
    outage.restore();
    let s = c.summary(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(c.results(&s).await, want, "results after an outage differ");
    let refused = outage.refused.load(Ordering::SeqCst);
    assert!(
        refused > 0,
        "the outage refused no connection: it did not hit the job"
    );

    // Down for good from the map stage on: the job fails, naming the store.
    let id = c
        .submit_as("mapreduce-sort", &input, &params, "remote")
        .await;
    jobs.push(id.clone());
    assert!(c.wait_stage(&id, "map").await, "the map stage ran");
    outage.down();
    let s = c.summary(&id).await;
    assert_eq!(s.status, JobStatus::Failed);
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("did not answer") && error.contains(&outage.addr.to_string()),
        "the job's error names the store and the wait: {error}"
    );
    outage.restore();
    let Cluster {
        control, agents, ..
    } = c;
    control.stop().await;
    drop(agents);
    let raw = S3Store::new(cfg).expect("s3 store");
    for id in jobs {
        let _ = raw.delete_prefix(&format!("jobs/{id}/")).await;
    }
}

/// The control plane as a process of its own: this test binary re-run with
/// `SONIC_FAULTS_CONTROL_DIR` set serves a control plane with jobs on that data directory, the
/// address `SONIC_FAULTS_LISTEN` and the local store `SONIC_FAULTS_STORE`, until it is killed.
#[test]
fn control_process_entry() {
    let Ok(dir) = std::env::var("SONIC_FAULTS_CONTROL_DIR") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = Arc::new(LocalStore::new(var("SONIC_FAULTS_STORE")).expect("store"));
        let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
        jobs.backoff = Duration::from_millis(20);
        let runtime = Runtime::new(store, None, jobs);
        let config = ControlConfig {
            listen: var("SONIC_FAULTS_LISTEN").parse().expect("an address"),
            data_dir: PathBuf::from(dir),
            token: TOKEN.into(),
            heartbeat_timeout: Seconds(4.0),
            max_body: sonic_core::units::ByteSize(256 << 20),
            ..ControlConfig::default()
        };
        let _control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
            .await
            .expect("start control plane");
        std::future::pending::<()>().await;
    });
}

/// The control plane is killed (SIGKILL) while a job runs, and started again on the same
/// database: the job goes on from what was recorded and succeeds with an undisturbed run's
/// results; the DAG, the earlier job with its summary and results, its profiling sample and the
/// models are all still there; the agents are heard again and a new job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_mid_job_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let store_dir = dir.path().join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let start_control = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("control.log"))
            .unwrap();
        let child = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "faults::control_process_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("SONIC_FAULTS_CONTROL_DIR", dir.path().join("control"))
            .env("SONIC_FAULTS_LISTEN", format!("127.0.0.1:{port}"))
            .env("SONIC_FAULTS_STORE", &store_dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start a control plane process");
        AgentProc {
            id: "control".into(),
            child,
        }
    };
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match http
                    .get(format!("{url}{path}"))
                    .bearer_auth(TOKEN)
                    .send()
                    .await
                {
                    Ok(r) => {
                        let status = r.status();
                        return (status, r.json::<Value>().await.unwrap_or(Value::Null));
                    }
                    Err(e) => {
                        assert!(Instant::now() < deadline, "{path}: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    };
    let mut control = start_control();
    let mut agents = Vec::new();
    for i in 1..=2 {
        let id = format!("a-{i:02}");
        let root = dir.path().join("agents").join(&id);
        std::fs::create_dir_all(&root).unwrap();
        let child = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "faults::agent_process_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("SONIC_FAULTS_AGENT", &id)
            .env("SONIC_FAULTS_ROOT", &root)
            .env("SONIC_FAULTS_CONTROL", &url)
            .env("SONIC_FAULTS_STORE", &store_dir)
            .env("SONIC_FAULTS_BINS", bin_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start an agent process");
        agents.push(AgentProc { id, child });
    }
    let alive = || async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, v) = get("/v1/agents".into()).await;
            let n = v["agents"].as_array().map_or(0, |a| {
                a.iter().filter(|a| a["alive"] == json!(true)).count()
            });
            if n == 2 {
                return;
            }
            assert!(Instant::now() < deadline, "agents: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    alive().await;
    let input = dir.path().join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "4000000",
            "--seed",
            "17",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    let yaml = std::fs::read_to_string(workspace().join("dags/mapreduce-sort.yaml")).unwrap();
    let r = http
        .put(format!("{url}/v1/dags"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/yaml")
        .body(yaml)
        .send()
        .await
        .expect("apply");
    assert!(r.status().is_success(), "apply: {}", r.status());
    let submit = || {
        let (http, url, input) = (http.clone(), url.clone(), input.clone());
        async move {
            let body = json!({
                "dag": "mapreduce-sort",
                "policy": "direct",
                "params": { "mappers": 3, "reducers": 2 },
                "input": { "name": "records.bin", "base64": base64(&std::fs::read(&input).unwrap()) },
            });
            let r = http
                .post(format!("{url}/v1/jobs"))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("submit");
            assert_eq!(r.status(), 202);
            let v: Value = r.json().await.expect("accepted");
            v["job_id"].as_str().expect("job id").to_owned()
        }
    };
    let ended = |id: String| async move {
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let (_, v) = get(format!("/v1/jobs/{id}")).await;
            if matches!(v["status"].as_str(), Some("succeeded" | "failed")) {
                return v;
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // The models of the jobs' own parameter setting (models are learned per setting).
    const MODELS: &str =
        "/v1/dags/mapreduce-sort/models?params=%7B%22mappers%22%3A3%2C%22reducers%22%3A2%7D";
    let first = submit().await;
    let before = ended(first.clone()).await;
    assert_eq!(before["status"], "succeeded", "{before}");
    let (_, models_before) = get(MODELS.into()).await;
    let samples = |m: &Value| m["samples"].as_array().map_or(0, Vec::len);
    assert_eq!(samples(&models_before), 1, "{models_before}");

    // A second job; the control plane is killed while its mappers run.
    let second = submit().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, v) = get(format!("/v1/jobs/{second}")).await;
        if v["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "job {second} never ran: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    control.child.kill().expect("SIGKILL the control plane");
    control.child.wait().expect("reap it");
    control = start_control();

    // The job goes on from what the killed process recorded, to the same results.
    let after = ended(second.clone()).await;
    assert_eq!(after["status"], "succeeded", "{after}");
    let store = LocalStore::new(&store_dir).expect("store");
    let results = |v: &Value| {
        let store = &store;
        let keys: Vec<String> = v["outputs"]
            .as_array()
            .expect("outputs")
            .iter()
            .map(|o| {
                o.as_str()
                    .unwrap()
                    .strip_prefix("store://")
                    .unwrap()
                    .to_owned()
            })
            .collect();
        async move {
            let mut out = Vec::new();
            for k in keys {
                let data = store.get_bytes(&k).await.expect("result");
                let name = k
                    .split_once("/result/")
                    .map_or(k.clone(), |(_, n)| n.to_owned());
                out.push((name, data.to_vec()));
            }
            out.sort();
            out
        }
    };
    assert_eq!(
        results(&after).await,
        results(&before).await,
        "the resumed job's results differ from an undisturbed run's"
    );
    let (status, dags) = get("/v1/dags".into()).await;
    assert_eq!(status, 200);
    assert!(dags.to_string().contains("mapreduce-sort"), "{dags}");
    let (_, first_again) = get(format!("/v1/jobs/{first}")).await;
    assert_eq!(first_again["status"], "succeeded");
    assert_eq!(
        first_again["outputs"], before["outputs"],
        "the earlier job's results are kept"
    );
    assert!(
        models_before["models"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "models were fitted: {models_before}"
    );
    // The first job's sample survived, and the resumed job added its own.
    let (_, models_after) = get(MODELS.into()).await;
    assert_eq!(samples(&models_after), 2, "{models_after}");
    for out in before["outputs"].as_array().expect("outputs") {
        let key = out.as_str().unwrap().strip_prefix("store://").unwrap();
        assert!(
            store.head(key).await.unwrap().is_some(),
            "result {key} is kept"
        );
    }

    // The agents are heard again, and a new job succeeds with the same results.
    alive().await;
    let third = submit().await;
    let done = ended(third).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (_, models_last) = get(MODELS.into()).await;
    assert_eq!(samples(&models_last), 3, "the new job adds its sample");
    drop(agents);
    drop(control);
}
