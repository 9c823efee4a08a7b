//! `ofctl up`: a whole cluster in this process: the control plane, N agents standing for VMs of
//! the catalog's types (each with its type's CPUs, memory and bandwidth limit), and the object
//! store (SeaweedFS when it answers or is installed, else a local directory).

use std::io::Write;
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
use sonic_control::{ControlConfig, RunningControl, SystemClock};
use sonic_core::catalog::Catalog;
use sonic_core::units::{ByteSize, Seconds};
use sonic_storage::ObjectStore;
use sonic_storage::s3::{S3Config, S3Store};

use crate::client::Client;
use crate::config::{self, Saved, Target};
use crate::render::Table;
use crate::{Output, SandboxArg, StoreArg, UpArgs};

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
    pub agents: u32,
    pub catalog: Option<PathBuf>,
    pub sandbox: SandboxArg,
    pub store: StoreArg,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub lambdas: Option<PathBuf>,
    /// Agents see the store with the catalog's `remote_storage` request latency and
    /// per-connection throughput (`ofctl bench`: the store here is local and fast).
    pub emulate_store: bool,
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

/// Docker when asked or (auto) when an engine answers and has the lambda image.
async fn choose_sandbox(
    arg: SandboxArg,
    probe_dir: &Path,
) -> anyhow::Result<(SandboxChoice, String)> {
    if arg == SandboxArg::Process {
        return Ok((
            SandboxChoice::Process,
            "asked for (--sandbox process)".into(),
        ));
    }
    let probe = DockerSandbox::connect_with(DockerConfig {
        work_dir: probe_dir.to_path_buf(),
        connect_timeout: Duration::from_secs(3),
        ..DockerConfig::default()
    })
    .await;
    let why_not = match probe {
        Ok(docker) => {
            let has = docker.image_exists(LAMBDA_IMAGE).await;
            let _ = docker.shutdown().await;
            match has {
                Ok(true) => {
                    return Ok((
                        SandboxChoice::Docker,
                        format!("a Docker engine answers and has {LAMBDA_IMAGE}"),
                    ));
                }
                Ok(false) => format!(
                    "Docker answers but has no image {LAMBDA_IMAGE} (build it: bash deploy/build-images.sh)"
                ),
                Err(e) => format!("Docker answers but {e}"),
            }
        }
        Err(e) => format!("no Docker engine ({e})"),
    };
    if arg == SandboxArg::Docker {
        bail!("--sandbox docker: {why_not}");
    }
    Ok((SandboxChoice::Process, why_not))
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
        .output()
        .await
        .map_err(|e| format!("cannot run deploy/seaweedfs.sh: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().last().unwrap_or("failed").to_owned())
    }
}

/// SeaweedFS (S3) when it answers, or is installed and starts; else (auto) a local directory.
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
    if arg == StoreArg::Local {
        return local("asked for (--store local)".into());
    }
    let env = |k: &str, d: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| d.to_owned())
    };
    let endpoint = env("SONIC_S3_ENDPOINT", S3_ENDPOINT);
    let mut started = None;
    let mut reason = format!("SeaweedFS answers at {endpoint}");
    if !answers(&endpoint).await {
        let root = workspace_root();
        let installed = root.as_ref().filter(|r| r.join(".venv/bin/weed").is_file());
        match installed {
            Some(root) => {
                note("starting SeaweedFS: bash deploy/seaweedfs.sh start");
                match run_seaweed_script(root, "start").await {
                    Ok(()) => {
                        started = Some(root.clone());
                        reason = format!("SeaweedFS started at {endpoint} (deploy/seaweedfs.sh)");
                    }
                    Err(e) => {
                        let why = format!("SeaweedFS did not start: {e}");
                        if arg == StoreArg::S3 {
                            bail!("--store s3: {why}");
                        }
                        return local(why);
                    }
                }
            }
            None => {
                let why = format!(
                    "no S3 server at {endpoint} and SeaweedFS is not installed (bash deploy/seaweedfs.sh install)"
                );
                if arg == StoreArg::S3 {
                    bail!("--store s3: {why}");
                }
                return local(why);
            }
        }
    }
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
            local(why)
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
            choose_sandbox(opts.sandbox, &data_dir.join("docker-probe")).await?;
        let lambdas = match sandbox {
            SandboxChoice::Process => Some(lambda_dir(opts.lambdas.as_deref(), note).await?),
            _ => None,
        };
        let store = choose_store(opts.store, &data_dir, note).await?;

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
        let client = self.client()?;
        let deadline = Instant::now() + limit;
        loop {
            let list: AgentList = client.get("/v1/agents").await?;
            let alive = self
                .info
                .agents
                .iter()
                .filter(|a| {
                    list.agents
                        .iter()
                        .any(|r| r.agent_id == a.agent_id && r.alive)
                })
                .count();
            if alive == self.info.agents.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "only {alive} of {} agents registered within {} s",
                    self.info.agents.len(),
                    limit.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

/// Waits for Ctrl-C or SIGTERM.
pub async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// The cluster's choices as a table.
pub fn write_info(info: &ClusterInfo, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "sandbox  {}: {}", info.sandbox, info.sandbox_reason)?;
    writeln!(
        out,
        "store    {} {}: {}",
        info.store, info.store_location, info.store_reason
    )?;
    if let Some(l) = &info.lambdas {
        writeln!(out, "lambdas  {}", l.display())?;
    }
    writeln!(out, "data     {}", info.data_dir.display())?;
    writeln!(out, "agents   {}", info.agents.len())?;
    let mut t = Table::new(&["AGENT", "VM TYPE", "VCPUS", "MEMORY", "NETWORK", "URL"]);
    for a in &info.agents {
        t.row(vec![
            a.agent_id.clone(),
            a.vm_type.clone(),
            a.vcpus.to_string(),
            format!("{} MB", a.memory_mb),
            format!("{:.0} Mbit/s", a.network_mbps),
            a.url.clone(),
        ]);
    }
    t.write("  ", out)
}

impl UpArgs {
    pub fn options(&self, data_dir: PathBuf, listen: SocketAddr) -> ClusterOptions {
        ClusterOptions {
            agents: self.agents,
            catalog: self.catalog.clone(),
            sandbox: self.sandbox,
            store: self.store,
            data_dir,
            listen,
            lambdas: self.lambdas.clone(),
            emulate_store: false,
        }
    }
}

/// `ofctl up`: start, save the URL and token, report, serve until Ctrl-C, stop.
pub async fn run(args: UpArgs, output: Output, out: &mut dyn Write) -> anyhow::Result<()> {
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => config::default_data_dir()?,
    };
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7000)));
    let mut note = |line: &str| eprintln!("{line}");
    let cluster = Cluster::start(args.options(data_dir, listen), &mut note).await?;
    let path = config::path()?;
    let saved = config::save(
        &path,
        &Saved {
            server: cluster.info.server.clone(),
            token: cluster.token.clone(),
            ca_file: None,
        },
    );
    if let Err(e) = saved {
        cluster.stop().await;
        return Err(e);
    }
    let printed = match output {
        Output::Json => {
            let mut v = serde_json::to_value(&cluster.info)?;
            v["config_file"] = serde_json::json!(path);
            crate::commands::print_json(out, &v)
        }
        Output::Table => (|| {
            write_info(&cluster.info, out)?;
            writeln!(
                out,
                "server   {}  (saved with its token in {})",
                cluster.info.server,
                path.display()
            )?;
            writeln!(out, "ready: Ctrl-C stops the cluster")?;
            Ok::<_, std::io::Error>(())
        })()
        .map_err(anyhow::Error::from),
    };
    // A closed stdout (the reader went away) must not take the cluster down with it.
    if let Err(e) = printed.and_then(|()| Ok(out.flush()?)) {
        eprintln!("ofctl: cannot print the cluster's description: {e:#}");
    }
    let waited = wait_for_signal().await;
    eprintln!("stopping the cluster");
    cluster.stop().await;
    waited
}
