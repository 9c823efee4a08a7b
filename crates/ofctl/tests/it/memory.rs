//! The memory tier of `ofctl up` and `ofctl demo`: a private `redis-server` (Debian's, which these
//! tests need and never skip without: CI installs it), given to the control plane and every
//! agent; a `policy: memory` job through it; and no `redis-server` left once the cluster stops,
//! is dropped, or `ofctl up` ends, on SIGTERM or SIGKILL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_testkit::lambda_dir;
use sonic_testkit::redis::{NEED_REDIS, redis_answers};

use crate::cluster::Up;
use ofctl::up::{Cluster, ClusterOptions, MemoryArg, write_info};
use ofctl::{SandboxArg, StoreArg};

/// gen copies its input to mid, mid copies it to result: two edges.
const CHAIN: &str = r#"
name: tiered
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: one }
  - { from: mid, to: sink, kind: one }
"#;

/// Fails (never skips) when Debian's redis-server is missing.
pub(crate) fn need_redis() {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "redis-server is not on PATH; {NEED_REDIS}");
}

/// The port of a `redis://127.0.0.1:PORT` URL.
pub(crate) fn port_of(url: &str) -> u16 {
    url.strip_prefix("redis://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not a redis://127.0.0.1:PORT URL: {url}"))
}

/// The `redis-server` processes serving 127.0.0.1:`port` (redis-server names itself
/// `<its path> 127.0.0.1:PORT` in its command line).
fn redis_pids(port: u16) -> Vec<u32> {
    let want = format!("127.0.0.1:{port}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if comm.trim() == "redis-server" && cmdline.contains(&want) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits (a few seconds at most) until no `redis-server` serves `port`.
pub(crate) fn assert_gone(port: u16, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis_pids(port).is_empty() || redis_answers(port) {
        assert!(
            Instant::now() < deadline,
            "redis-server on 127.0.0.1:{port} outlived {after}: pids {:?}",
            redis_pids(port)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn options(data_dir: &Path, memory: MemoryArg) -> ClusterOptions {
    ClusterOptions {
        agents: 2,
        catalog: None,
        sandbox: SandboxArg::Process,
        store: StoreArg::Local,
        memory,
        data_dir: data_dir.to_path_buf(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        lambdas: Some(lambda_dir().to_path_buf()),
        emulate_store: false,
        openlambda: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_job_on_the_clusters_own_tier() {
    need_redis();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut notes = Vec::new();
    let cluster = Cluster::start(
        options(&dir.path().join("data"), MemoryArg::Auto),
        &mut |l: &str| notes.push(l.to_owned()),
    )
    .await
    .expect("the cluster starts");

    // Its description names the tier, what started it and its log.
    let url = cluster
        .memory
        .url
        .clone()
        .unwrap_or_else(|| panic!("no memory tier: {:?}", cluster.memory));
    let port = port_of(&url);
    assert!(redis_answers(port), "the tier at {url} does not answer");
    assert_eq!(redis_pids(port).len(), 1, "{url}");
    let mut described = Vec::new();
    write_info(&cluster.info, &cluster.memory, &mut described).expect("write_info");
    let described = String::from_utf8(described).expect("utf-8");
    let line = described
        .lines()
        .find(|l| l.starts_with("memory "))
        .unwrap_or_else(|| panic!("no memory line in\n{described}"));
    assert!(
        line.starts_with(&format!("memory   {url}: started redis-server (")),
        "{line}"
    );
    assert!(line.contains("maxmemory 256mb noeviction"), "{line}");
    let log = cluster.memory.log.clone().expect("the tier's log");
    assert!(log.starts_with(&cluster.info.data_dir), "{}", log.display());
    assert!(log.is_file(), "{}", log.display());
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("starting the memory tier")),
        "{notes:?}"
    );

    // A `policy: memory` job: every edge through the tier, and its result the input.
    let client = cluster.client().expect("client");
    sonic_cluster::jobs::apply_text(&client, "tiered.yaml", CHAIN.into())
        .await
        .expect("apply");
    let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let accepted: Value = client
        .post(
            "/v1/jobs",
            &json!({
                "dag": "tiered",
                "policy": "memory",
                "input": { "name": "data.bin", "base64": sonic_cluster::jobs::base64(&input) },
            }),
        )
        .await
        .expect("a memory job is accepted where the cluster has a tier");
    let id = accepted["job_id"].as_str().expect("job_id").to_owned();
    let mut progress = sonic_cluster::progress::Progress::new();
    let s = sonic_cluster::jobs::wait_job(&client, &id, &mut progress)
        .await
        .expect("wait");
    assert_eq!(s["status"], "succeeded", "{s}");
    assert_eq!(s["policy"], "memory", "{s}");
    let edges = s["edges"].as_array().expect("edges");
    assert_eq!(edges.len(), 2, "{s}");
    assert!(edges.iter().all(|e| e["method"] == "memory"), "{s}");
    let outputs = s["outputs"].as_array().expect("outputs");
    assert_eq!(outputs.len(), 1, "{s}");
    let key = outputs[0]
        .as_str()
        .and_then(|o| o.strip_prefix("store://"))
        .unwrap_or_else(|| panic!("a store:// output in {s}"));
    let result = cluster.store.get_bytes(key).await.expect("the result");
    assert!(
        result.as_ref() == input.as_slice(),
        "the result differs from the input"
    );

    // Stopped: the tier is gone with it.
    cluster.stop().await;
    assert_gone(port, "Cluster::stop");

    // Dropped without a stop (an error path, a panic): gone too.
    let cluster = Cluster::start(
        options(&dir.path().join("data2"), MemoryArg::Auto),
        &mut |_: &str| {},
    )
    .await
    .expect("the cluster starts");
    let port = port_of(cluster.memory.url.as_deref().expect("a tier"));
    drop(cluster);
    assert_gone(port, "dropping the Cluster");

    // Turned off: no tier, said so, and the control plane refuses `policy: memory`.
    let cluster = Cluster::start(
        options(&dir.path().join("data3"), MemoryArg::Off),
        &mut |_: &str| {},
    )
    .await
    .expect("the cluster starts");
    assert_eq!(cluster.memory.url, None);
    assert!(
        cluster
            .memory
            .reason
            .starts_with("no memory tier: turned off (--no-memory-tier)"),
        "{:?}",
        cluster.memory
    );
    let client = cluster.client().expect("client");
    sonic_cluster::jobs::apply_text(&client, "tiered.yaml", CHAIN.into())
        .await
        .expect("apply");
    let refused = client
        .post::<_, Value>("/v1/jobs", &json!({ "dag": "tiered", "policy": "memory" }))
        .await
        .expect_err("policy memory without a tier");
    assert_eq!(refused.status().map(|s| s.as_u16()), Some(400), "{refused}");
    cluster.stop().await;
}

/// What `memory.rs` reads of a running `ofctl up` (`cluster::Up`).
impl Up {
    fn memory_line(&self) -> &str {
        self.lines
            .iter()
            .find(|l| l.starts_with("memory "))
            .unwrap_or_else(|| panic!("no memory line: {:?}", self.lines))
    }

    /// The tier's port, from `memory   redis://127.0.0.1:PORT: started redis-server (...)`.
    fn tier_port(&self) -> u16 {
        let line = self.memory_line();
        let url = line
            .trim_start_matches("memory")
            .trim_start()
            .split(": ")
            .next()
            .unwrap_or_default();
        assert!(line.contains(": started redis-server ("), "{line}");
        port_of(url)
    }

    fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "ofctl up did not end on {signal}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn no_redis_server_outlives_ofctl_up() {
    need_redis();
    // SIGTERM (as Ctrl-C): up stops the cluster, the tier with it.
    let mut up = Up::start_with(1, &[]);
    let port = up.tier_port();
    assert!(redis_answers(port));
    up.signal("-TERM");
    assert!(
        up.child
            .try_wait()
            .expect("status")
            .is_some_and(|s| s.success())
    );
    assert_gone(port, "ofctl up's SIGTERM");

    // SIGKILL: up cannot stop anything; the kernel ends the tier with it.
    let mut up = Up::start_with(1, &[]);
    let port = up.tier_port();
    assert!(redis_answers(port));
    up.signal("-KILL");
    assert_gone(port, "ofctl up's SIGKILL");

    // --no-memory-tier: none, said so.
    let mut up = Up::start_with(1, &["--no-memory-tier"]);
    assert_eq!(
        up.memory_line(),
        "memory   no memory tier: turned off (--no-memory-tier); plans never use memory"
    );
    up.signal("-TERM");
}
