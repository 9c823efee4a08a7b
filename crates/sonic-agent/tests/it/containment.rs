//! Hostile lambdas (`lambdas/src/bin/sonic-hostile.rs`) against both sandboxes and the agent:
//! writes outside the output folder, a planted symbolic link to a host file, and writers far over
//! their output quota. What the process sandbox cannot contain is in docs/security.md.
//!
//! The Docker tests need the engine and `sonic-lambdas:latest` with `sonic-hostile` in it
//! (`bash deploy/build-images.sh --debug`); the process tests build the lambdas themselves.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sonic_agent::config::local_config;
use sonic_agent::runner;
use sonic_agent::sandbox::{
    DockerConfig, DockerSandbox, ProcessConfig, ProcessSandbox, RunOutcome, RunSpec, Sandbox,
    Termination,
};
use sonic_agent::server::AgentState;
use sonic_agent::throttle::AgentThrottle;
use sonic_api::agent::{OutputRoute, RunReport, RunRequest, RunStatus};
use sonic_testkit::lambda_dir;

const IMAGE: &str = "sonic-lambdas:latest";
const MIB: u64 = 1 << 20;
/// The quota of the quota tests; the writers try 25 times as much.
const QUOTA_MB: u64 = 16;
const TRY_MB: &str = "400";

async fn docker(dir: &Path) -> DockerSandbox {
    let config = DockerConfig {
        work_dir: dir.join("containers"),
        ..DockerConfig::default()
    };
    let sandbox = DockerSandbox::connect_with(config).await.unwrap_or_else(|e| {
        panic!("these tests need a running Docker engine: {e}. Start it (e.g. `service docker start`).")
    });
    assert!(
        sandbox.image_exists(IMAGE).await.unwrap(),
        "image {IMAGE} is missing: build it with `bash deploy/build-images.sh --debug`"
    );
    sandbox
}

fn process(dir: &Path) -> ProcessSandbox {
    ProcessSandbox::new(ProcessConfig {
        work_dir: dir.join("processes"),
        path: vec![lambda_dir().to_path_buf()],
        ..ProcessConfig::default()
    })
    .expect("process sandbox")
}

fn spec(dir: &Path, run: &str, command: &[&str]) -> RunSpec {
    let base = dir.join(run);
    RunSpec {
        run_id: format!("test/{run}"),
        warm_key: run.to_string(),
        image: IMAGE.to_string(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: vec![
            ("SONIC_JOB_ID".into(), "j-test".into()),
            ("SONIC_FUNCTION".into(), "f".into()),
            ("SONIC_INSTANCE".into(), "0".into()),
            ("SONIC_INSTANCES".into(), "1".into()),
            ("SONIC_PARAMS".into(), "{}".into()),
        ],
        input_dir: base.join("in"),
        output_dir: base.join("out"),
        memory_limit_bytes: 256 * MIB,
        cpus: 1.0,
        // Generous: a quota test that is not stopped ends by writing everything, not by this.
        timeout: Duration::from_secs(120),
        output_quota_bytes: QUOTA_MB * MIB,
        mounts: Vec::new(),
    }
}

async fn run(sandbox: &dyn Sandbox, spec: RunSpec) -> RunOutcome {
    match sandbox.run(spec.clone()).await {
        Ok(o) => o,
        Err(e) => {
            let _ = sandbox.shutdown().await;
            panic!("run {} failed to run: {e}", spec.run_id)
        }
    }
}

/// Every path under `root` whose name contains `needle` (symbolic links not followed).
fn find_named(root: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_name().to_string_lossy().contains(needle) {
            out.push(p.clone());
        }
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(find_named(&p, needle));
        }
    }
    out
}

/// Bytes of the regular files under `root`.
fn bytes_under(root: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(root) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// A writer far over its quota is stopped before it wrote everything, reported as such, and its
/// outputs are gone; checked for several ways of writing.
async fn writers_over_quota_are_stopped(sandbox: &dyn Sandbox, dir: &Path, kind: &str) {
    let cases: [(&str, Vec<&str>); 4] = [
        (
            "many-files",
            vec![
                "sonic-hostile",
                "fill",
                "--file-mb",
                "1",
                "--max-mb",
                TRY_MB,
            ],
        ),
        (
            "one-file",
            vec![
                "sonic-hostile",
                "fill",
                "--file-mb",
                TRY_MB,
                "--max-mb",
                TRY_MB,
            ],
        ),
        ("sparse", vec!["sonic-hostile", "sparse", "--gb", "64"]),
        ("log", vec!["sonic-hostile", "log", "--max-mb", TRY_MB]),
    ];
    for (name, command) in cases {
        if kind == "process" && name == "log" {
            // The process sandbox keeps only the log's tail in memory: nothing to contain.
            continue;
        }
        let s = spec(dir, &format!("{kind}-quota-{name}"), &command);
        let out = run(sandbox, s.clone()).await;
        assert_eq!(
            out.termination,
            Termination::OutputQuotaExceeded,
            "{kind} {name}: log: {}",
            out.log
        );
        assert!(
            !out.log.contains("wrote everything"),
            "{kind} {name}: the writer was not stopped: {}",
            out.log
        );
        assert!(
            out.log.contains("output quota"),
            "{kind} {name}: log: {}",
            out.log
        );
        if kind == "docker" {
            // The container and what it wrote are gone; nothing reached the output folder.
            assert_eq!(bytes_under(&s.output_dir), 0, "{kind} {name}");
            assert_eq!(bytes_under(&dir.join("containers")), 0, "{kind} {name}");
        }
    }
    // A writer within its quota is fine (and, in Docker, gets a fresh container).
    let s = spec(
        dir,
        &format!("{kind}-quota-within"),
        &["sonic-hostile", "fill", "--file-mb", "1", "--max-mb", "4"],
    );
    let out = run(sandbox, s.clone()).await;
    assert!(out.succeeded(), "{kind}: log: {}", out.log);
    assert_eq!(bytes_under(&s.output_dir), 4 * MIB);
}

/// What a control plane asks when a DAG is applied (`POST /v1/runnable`): Docker knows its
/// images (never pulls), the process sandbox its programs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_say_what_they_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let docker = docker(dir.path()).await;
    assert_eq!(docker.can_run(IMAGE, "anything").await, Ok(()));
    let why = docker
        .can_run("sonic-no-such-image:4711", "synthetic")
        .await
        .expect_err("no such image");
    assert!(
        why.contains("sonic-no-such-image:4711") && why.contains("never pull"),
        "{why}"
    );
    docker.shutdown().await.unwrap();
    let process = process(dir.path());
    assert_eq!(process.can_run("any", "synthetic").await, Ok(()));
    assert_eq!(process.can_run("any", "sh").await, Ok(()));
    let why = process
        .can_run("any", "no-such-program-4711")
        .await
        .expect_err("no such program");
    assert!(why.contains("not found"), "{why}");
    process.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_writers_over_their_quota_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = docker(dir.path()).await;
    writers_over_quota_are_stopped(&sandbox, dir.path(), "docker").await;
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_writers_over_their_quota_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = process(dir.path());
    writers_over_quota_are_stopped(&sandbox, dir.path(), "process").await;
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_writes_outside_the_output_folder_do_not_reach_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = docker(dir.path()).await;
    let tag = format!("sonic-hostile-{}", std::process::id());
    let s = spec(
        dir.path(),
        "escape",
        &["sonic-hostile", "escape", "--tag", &tag],
    );
    let out = run(&sandbox, s.clone()).await;
    // The same warm key again: the offending container is not reused.
    let mut again = spec(dir.path(), "escape-after", &["synthetic", "noop"]);
    again.warm_key = s.warm_key.clone();
    let again = run(&sandbox, again).await;
    sandbox.shutdown().await.unwrap();

    // The image's filesystem is read-only: /etc, / and /sonic refused the writes.
    for path in [
        format!("/etc/{tag}"),
        format!("/{tag}"),
        format!("/sonic/{tag}"),
    ] {
        assert!(
            out.log
                .contains(&format!("write {path}: Read-only file system")),
            "{path}: log: {}",
            out.log
        );
    }
    // `../` of the output folder and the control folder are writable mounts: the run fails
    // and names both writes.
    match &out.termination {
        Termination::Violation(why) => {
            assert!(why.contains(&format!("/sonic/out/{tag}")), "{why}");
            assert!(why.contains(&format!("/sonic/ctl/{tag}")), "{why}");
        }
        other => panic!("expected a violation, got {other:?}; log: {}", out.log),
    }
    // Nothing of it is on the host: not in /etc or /, not in the sandbox's or the run's folders.
    assert!(!Path::new("/etc").join(&tag).exists());
    assert!(!Path::new("/").join(&tag).exists());
    assert_eq!(find_named(dir.path(), &tag), Vec::<PathBuf>::new());
    // Its normal output was dropped with the container.
    assert_eq!(bytes_under(&s.output_dir), 0);
    assert!(again.succeeded() && again.cold, "log: {}", again.log);
}

/// An agent (no HTTP) around `sandbox`, with the given output quota.
fn agent(dir: &Path, sandbox: Arc<dyn Sandbox>, quota_mb: u64) -> Arc<AgentState> {
    let mut config = local_config(
        "a-hostile",
        &dir.join("agent"),
        "control-token-0123456789",
        "file-key-0123456789abcdef",
    );
    config.output_quota_mb = quota_mb;
    config.bin_dirs = vec![lambda_dir().to_path_buf()];
    Arc::new(AgentState::new(config, sandbox, None, &AgentThrottle::unlimited()).unwrap())
}

fn request(job: &str, command: &[&str]) -> RunRequest {
    RunRequest {
        secrets: Default::default(),
        job_id: job.into(),
        function: "hostile".into(),
        instance: 0,
        instances: 1,
        attempt: 1,
        execution: 1,
        function_key: None,
        image: IMAGE.into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        params: Default::default(),
        fanouts: Default::default(),
        memory_limit_mb: 256,
        cpus: 1.0,
        timeout_ms: 120_000,
        inputs: Vec::new(),
        outputs: vec![OutputRoute {
            to: "result".into(),
            keep_local: true,
            upload_prefix: None,
            memory: false,
        }],
        output_quota_mb: None,
        report_url: None,
        handler: None,
    }
}

/// Every regular file under `root` whose bytes are those of `secret`.
fn copies_of(root: &Path, secret: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(copies_of(&e.path(), secret)),
            Ok(t) if t.is_file() && fs::read(e.path()).is_ok_and(|b| b == secret) => {
                out.push(e.path());
            }
            _ => {}
        }
    }
    out
}

/// A symbolic link to a host file among the outputs fails the run, is named, and is never
/// followed: no copy of the file anywhere in the agent's data.
async fn planted_symlink_is_refused(sandbox: Arc<dyn Sandbox>, dir: &Path) {
    let secret_path = dir.join("host-secret");
    let secret = format!("not for lambdas {}\n", std::process::id());
    fs::write(&secret_path, &secret).unwrap();
    let state = agent(dir, sandbox.clone(), 1024);
    let mut reports: Vec<RunReport> = Vec::new();
    for (i, target) in ["/etc/passwd", secret_path.to_str().unwrap()]
        .into_iter()
        .enumerate()
    {
        let req = request(
            &format!("j-link-{i}"),
            &["sonic-hostile", "symlink", "--target", target],
        );
        reports.push(runner::execute(state.clone(), req).await);
    }
    sandbox.shutdown().await.unwrap();
    for r in &reports {
        assert_eq!(r.status, RunStatus::Failed, "{r:?}");
        let error = r.error.clone().unwrap_or_default();
        assert!(
            error.contains("result/leak") && error.contains("symbolic link"),
            "{error}"
        );
        assert!(r.outputs.is_empty(), "{r:?}");
    }
    let passwd = fs::read("/etc/passwd").unwrap();
    assert_eq!(
        copies_of(&dir.join("agent"), &passwd),
        Vec::<PathBuf>::new()
    );
    assert_eq!(
        copies_of(&dir.join("agent"), secret.as_bytes()),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_planted_symlink_is_refused_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Arc::new(docker(dir.path()).await);
    planted_symlink_is_refused(sandbox, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_planted_symlink_is_refused_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Arc::new(process(dir.path()));
    planted_symlink_is_refused(sandbox, dir.path()).await;
}

/// Through the agent: the quota is the agent's, a request may lower it, and the report says why
/// the run failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reports_a_quota_in_megabytes() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox: Arc<dyn Sandbox> = Arc::new(docker(dir.path()).await);
    let state = agent(dir.path(), sandbox.clone(), 64);
    let fill = ["sonic-hostile", "fill", "--file-mb", "1", "--max-mb", "32"];
    let within = runner::execute(state.clone(), request("j-quota-1", &fill)).await;
    let mut lowered = request("j-quota-2", &fill);
    lowered.output_quota_mb = Some(8);
    let lowered = runner::execute(state.clone(), lowered).await;
    // Asking for more than the agent allows gets the agent's quota.
    let mut raised = request(
        "j-quota-3",
        &[
            "sonic-hostile",
            "fill",
            "--file-mb",
            "1",
            "--max-mb",
            TRY_MB,
        ],
    );
    raised.output_quota_mb = Some(1 << 20);
    let raised = runner::execute(state.clone(), raised).await;
    let mut zero = request("j-quota-4", &fill);
    zero.output_quota_mb = Some(0);
    let zero = runner::execute(state.clone(), zero).await;
    sandbox.shutdown().await.unwrap();

    assert_eq!(within.status, RunStatus::Succeeded, "{within:?}");
    assert_eq!(within.outputs.len(), 32);
    assert_eq!(lowered.status, RunStatus::Failed, "{lowered:?}");
    assert_eq!(
        lowered.error.as_deref(),
        Some("lambda wrote more than its quota of 8 MB")
    );
    assert!(lowered.outputs.is_empty());
    assert_eq!(
        raised.error.as_deref(),
        Some("lambda wrote more than its quota of 64 MB"),
        "{raised:?}"
    );
    assert_eq!(zero.status, RunStatus::Error);
    assert!(
        zero.error.unwrap_or_default().contains("output_quota_mb"),
        "a zero quota is refused"
    );
}
