//! The Docker sandbox: one container per running instance, kept warm between runs.
//!
//! Design (why it is fast, and what it measures):
//! - A container runs `sonic-launcher` (under `docker-init`) and stays up. Each run is handed to
//!   the launcher through a FIFO in a per-container host folder (the protocol is in
//!   `sonic_lambda::launcher`); the launcher forks the command, so a hot start costs about a
//!   millisecond instead of the tens of milliseconds of `docker exec`. The image must contain
//!   `sonic-launcher` on its PATH (`deploy/build-images.sh` puts it in `sonic-lambdas:latest`).
//! - Per container, three host folders are bind-mounted: `ctl` (requests, logs, reports),
//!   `in` read-only and `out` read-write. A run's inputs are hard-linked (never copied) into
//!   `in/<run>` and its outputs are renamed from `out/<run>` into the spec's output folder
//!   afterwards, so `config.work_dir` should be on the filesystem of the agent's data.
//! - Limits: `memory` = `memory_swap` = the spec's limit (no swap), `nano_cpus` from `cpus`, no
//!   network (`network_mode`; lambdas exchange files, not sockets).
//! - Containment of writes: the image's root filesystem is read-only; `/tmp` is a tmpfs of at most
//!   the output quota (its pages count against the memory limit); `RLIMIT_FSIZE` (ulimit `fsize`)
//!   is the output quota, so no file grows past it. So a lambda can write only `/tmp`, its output
//!   folder, the container's `out` and `ctl` mounts (and Docker's small `/dev/shm`). A watcher
//!   sums `out` and `ctl` (outputs and the run's log) every `quota_poll` and kills the container
//!   once they hold more than the quota (`OutputQuotaExceeded`); a run that ends over it is
//!   refused too. After each run, anything in `out` or `ctl` that is not the run's own (a write
//!   through `../`) fails the run as a `Violation` and the container is removed, never reused.
//! - Warm containers are kept for `idle_timeout` after a run, keyed by warm key, image, memory
//!   limit and output quota (not CPUs: a warm container given other CPUs has its limit changed
//!   in place, `docker update`); a run that finds one is hot (`cold: false`). Warm keys name a function across jobs
//!   (docs/agent.md): each run has its own environment (handed to the launcher), its own `in/<run>`
//!   and `out/<run>` folders, removed after it; `/tmp` is the container's and stays, as in a
//!   warm AWS Lambda container. `prewarm` starts containers ahead of the runs. A container that timed out, was
//!   OOM-killed or stopped is never reused.
//! - Peak memory: the lambda's `ru_maxrss` (reported by the launcher from `wait4`: the largest
//!   resident set of the lambda and its descendants), what the function needs. Only when the
//!   launcher gave none (the container died), the growth of the container's memory cgroup during
//!   the run (cgroup v1: `memory.max_usage_in_bytes` reset before the run, minus the charge at
//!   that moment; on v2 for a run in a fresh container only): it also counts the page cache the
//!   run caused (every output written), which the kernel reclaims under the limit and which
//!   varies with the machine's state, so the profiler would learn noise from it.
//! - Out of memory: the cgroup's `oom_kill` counter grew during the run, or Docker reports
//!   `OOMKilled` for a container that died.
//! - Timeout (counted from the start of the command): the container is killed and removed.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures::StreamExt;
use sonic_lambda::launcher::{self, Report, Request};
use tokio::io::AsyncBufReadExt;

use super::cgroup::{CGROUP_ROOT, MemoryCgroup, Version};
use super::fsutil::{link_tree, move_tree, quota_exceeded, remove_tree, tail_file, tree_bytes};
use super::process::{sanitize, validate};
use sonic_api::agent::StartContention;

use super::{PrewarmStats, RunOutcome, RunSpec, STARTS, Sandbox, SandboxError, Termination, sys};

/// Where the per-container folders are mounted in the container.
const IN_DIR: &str = "/sonic/in";
const OUT_DIR: &str = "/sonic/out";
/// Labels that mark the containers of a sandbox, to clean up after a crashed agent.
const LABEL_SANDBOX: &str = "sonic.sandbox";
const LABEL_OWNER: &str = "sonic.owner";
const LABEL_DIR: &str = "sonic.dir";
const LABEL_WARM_KEY: &str = "sonic.warm-key";

/// Settings of the Docker sandbox.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Per-container folders (control, inputs, outputs); best on the agent's data filesystem,
    /// so that inputs are hard-linked and outputs renamed rather than copied.
    pub work_dir: PathBuf,
    /// How long a container is kept warm after its last run.
    pub idle_timeout: Duration,
    /// The container's main command: the launcher (must be in the image).
    pub launcher: Vec<String>,
    /// Docker network mode of the containers; `None` for Docker's default (bridge).
    pub network_mode: Option<String>,
    /// Mount point of the cgroup hierarchies.
    pub cgroup_root: PathBuf,
    /// Bytes of the end of a run's output and error kept as its log.
    pub log_limit: usize,
    /// Longest wait for the engine to answer when connecting.
    pub connect_timeout: Duration,
    /// How often a running instance's writes are summed against its output quota.
    pub quota_poll: Duration,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            work_dir: std::env::temp_dir().join("sonic-docker"),
            idle_timeout: Duration::from_secs(60),
            launcher: vec!["sonic-launcher".to_string()],
            network_mode: Some("none".to_string()),
            cgroup_root: PathBuf::from(CGROUP_ROOT),
            log_limit: 64 * 1024,
            connect_timeout: Duration::from_secs(5),
            quota_poll: Duration::from_millis(100),
        }
    }
}

/// What a warm container must match to be reused. Not its CPUs: a plan may give a function's
/// instances more or fewer (right-sizing), and a warm container's limit is changed in place
/// (`docker update`) rather than its warmth lost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    warm_key: String,
    image: String,
    memory: u64,
    /// Fixed at creation (`/tmp`'s size, `RLIMIT_FSIZE`).
    output_quota: u64,
    /// Bound at creation.
    mounts: Vec<super::Mount>,
}

impl PoolKey {
    fn of(spec: &RunSpec) -> Self {
        Self {
            warm_key: spec.warm_key.clone(),
            image: spec.image.clone(),
            memory: spec.memory_limit_bytes,
            output_quota: spec.output_quota_bytes,
            mounts: spec.mounts.clone(),
        }
    }
}

/// Refuses mounts Docker would misread (`:` or `,` in a path), relative container paths, and
/// any that would cover the sandbox's own folders.
fn check_mounts(spec: &RunSpec) -> Result<(), SandboxError> {
    for m in &spec.mounts {
        let host = m.host.to_string_lossy();
        let c = m.container.as_str();
        let ours = ["/", "/sonic", "/tmp"].contains(&c)
            || [IN_DIR, OUT_DIR, launcher::CTL_DIR]
                .iter()
                .any(|d| c == *d || c.starts_with(&format!("{d}/")));
        if !m.host.is_absolute()
            || !c.starts_with('/')
            || c.contains("..")
            || [host.as_ref(), c]
                .iter()
                .any(|p| p.contains([':', ',', '\0']))
            || ours
        {
            return Err(SandboxError::InvalidSpec(format!(
                "run {}: cannot mount {host} at {c}",
                spec.run_id
            )));
        }
    }
    Ok(())
}

/// A running container with its launcher.
#[derive(Debug)]
struct Container {
    id: String,
    name: String,
    /// Host folder with `ctl/`, `in/`, `out/`.
    dir: PathBuf,
    /// The launcher's request FIFO, open read-write so writes never block or fail while the
    /// launcher starts.
    requests: fs::File,
    cgroup: Option<MemoryCgroup>,
    key: PoolKey,
    /// Its CPU limit now ([`nano_cpus`]).
    nano_cpus: i64,
    last_used: Instant,
    runs: u64,
    /// Started by `prewarm` and not used by a run yet.
    prewarmed: bool,
}

/// The CPU limit of a run's container: the spec's CPUs, at most the engine's cores (Docker
/// refuses more than the host has; an agent standing for a VM type larger than its host gives
/// what there is), at least a hundredth of one.
fn nano_cpus(cpus: f64, engine_cores: u32) -> i64 {
    let cpus = if cpus.is_finite() { cpus } else { 1.0 };
    (cpus.min(f64::from(engine_cores.max(1))).max(0.01) * 1e9).round() as i64
}

#[derive(Debug)]
struct Inner {
    docker: Docker,
    config: DockerConfig,
    idle: Mutex<HashMap<PoolKey, Vec<Container>>>,
    /// Every container this sandbox made and has not removed: id -> host folder.
    live: Mutex<HashMap<String, PathBuf>>,
    owner: String,
    prewarm: Mutex<PrewarmStats>,
    /// The engine's CPUs (`docker info`'s `NCPU`; this process's when it does not say): the
    /// cores its container starts share.
    engine_cores: u32,
}

/// Runs instances in Docker containers.
#[derive(Debug)]
pub struct DockerSandbox {
    inner: Arc<Inner>,
    reaper: tokio::task::JoinHandle<()>,
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        self.reaper.abort();
    }
}

/// How a run ended, before it becomes a `RunOutcome`.
enum Ending {
    Report(Report),
    Stopped,
    TimedOut,
    OverQuota,
}

impl DockerSandbox {
    /// Connects to the local engine with the default settings.
    pub async fn connect() -> Result<Self, SandboxError> {
        Self::connect_with(DockerConfig::default()).await
    }

    /// Connects to the local engine (`DOCKER_HOST` or the default socket), negotiates the API
    /// version (the engine may be older than bollard), and removes containers left by agents
    /// that are gone.
    pub async fn connect_with(config: DockerConfig) -> Result<Self, SandboxError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            SandboxError::Unavailable(format!(
                "the Docker engine is unreachable: {e} (is the daemon running, and is its socket \
                 /var/run/docker.sock or DOCKER_HOST accessible?)"
            ))
        };
        let docker = Docker::connect_with_local_defaults().map_err(|e| unreachable(&e))?;
        let docker =
            match tokio::time::timeout(config.connect_timeout, docker.negotiate_version()).await {
                Ok(Ok(d)) => d,
                Ok(Err(e)) => return Err(unreachable(&e)),
                Err(_) => {
                    return Err(unreachable(&format!(
                        "no answer within {:?}",
                        config.connect_timeout
                    )));
                }
            };
        fs::create_dir_all(&config.work_dir)?;
        let engine_cores =
            match tokio::time::timeout(config.connect_timeout, docker.info()).await {
                Ok(Ok(info)) => info.ncpu.and_then(|n| u32::try_from(n).ok()),
                _ => None,
            }
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
            });
        let version = docker.client_version();
        tracing::info!(
            api = %format!("{}.{}", version.major_version, version.minor_version),
            work_dir = %config.work_dir.display(),
            engine_cores,
            "docker sandbox connected"
        );
        let inner = Arc::new(Inner {
            docker,
            config,
            idle: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            owner: owner_token(std::process::id()).unwrap_or_default(),
            prewarm: Mutex::new(PrewarmStats::default()),
            engine_cores,
        });
        if let Err(e) = inner.remove_stale().await {
            tracing::warn!(error = %e, "cannot clean up containers of earlier agents");
        }
        let reaper = tokio::spawn(reap_idle(Arc::downgrade(&inner)));
        Ok(Self { inner, reaper })
    }

    /// True when the engine has `image`.
    pub async fn image_exists(&self, image: &str) -> Result<bool, SandboxError> {
        match self.inner.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(SandboxError::Runtime(format!(
                "inspecting image {image}: {e}"
            ))),
        }
    }

    /// Containers kept warm right now.
    pub fn warm_containers(&self) -> usize {
        self.inner
            .idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// Ids of every container this sandbox made and has not removed yet (warm or running).
    pub fn live_containers(&self) -> Vec<String> {
        self.inner
            .live
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Sandbox for DockerSandbox {
    fn kind(&self) -> &'static str {
        "docker"
    }

    /// The image must be on this engine (runs never pull); the program is the image's business.
    async fn can_run(&self, image: &str, _program: &str) -> Result<(), String> {
        match self.image_exists(image).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "image {image} is not on its Docker engine (build or pull it there: runs never pull)"
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    fn warm(&self) -> Option<usize> {
        Some(self.warm_containers())
    }

    fn prewarm_stats(&self) -> Option<PrewarmStats> {
        self.inner.prewarm.lock().ok().map(|s| *s)
    }

    /// Starts the missing containers at once (each takes the time of a cold start) and keeps
    /// them idle for the key, as a finished run would leave its container.
    async fn prewarm(&self, spec: &RunSpec, count: usize) -> Result<(usize, usize), SandboxError> {
        validate(spec)?;
        check_mounts(spec)?;
        let key = PoolKey::of(spec);
        let have = self
            .inner
            .idle
            .lock()
            .map(|m| m.get(&key).map_or(0, Vec::len))
            .unwrap_or(0);
        let missing = count.saturating_sub(have);
        let created = futures::future::join_all(
            (0..missing).map(|_| self.inner.create_counted(spec, key.clone())),
        )
        .await;
        let mut started = 0;
        let mut failed = None;
        for c in created {
            match c {
                Ok((mut c, _)) => {
                    c.prewarmed = true;
                    started += 1;
                    let mut lease = Lease {
                        inner: self.inner.clone(),
                        container: Some(c),
                    };
                    lease.give_back();
                }
                Err(e) => {
                    tracing::warn!(key = %spec.warm_key, error = %e, "cannot prewarm a container");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Ok(mut stats) = self.inner.prewarm.lock() {
            stats.started += started as u64;
        }
        if started == 0
            && let Some(e) = failed
        {
            return Err(e);
        }
        tracing::debug!(key = %spec.warm_key, started, "containers prewarmed");
        Ok((started, have + started))
    }

    async fn run(&self, spec: RunSpec) -> Result<RunOutcome, SandboxError> {
        let t0 = Instant::now();
        let wall0 = SystemTime::now();
        validate(&spec)?;
        check_mounts(&spec)?;
        fs::create_dir_all(&spec.input_dir)?;
        fs::create_dir_all(&spec.output_dir)?;
        let key = PoolKey::of(&spec);
        let (taken, expired) = self.inner.take_idle(&key);
        for c in expired {
            self.inner.remove(c.id, c.dir).await;
        }
        let mut start_contention = None;
        let want = nano_cpus(spec.cpus, self.inner.engine_cores);
        // A warm container given other CPUs before: its limit changed in place; one Docker
        // will not change is removed, and the run starts cold.
        let taken = match taken {
            Some(mut c) if c.nano_cpus != want => {
                let body = bollard::models::ContainerUpdateBody {
                    nano_cpus: Some(want),
                    ..Default::default()
                };
                match self.inner.docker.update_container(&c.id, body).await {
                    Ok(()) => {
                        c.nano_cpus = want;
                        Some(c)
                    }
                    Err(e) => {
                        tracing::warn!(container = %c.name, error = %e, "cannot change a warm container's CPUs: a new one starts");
                        self.inner.remove(c.id, c.dir).await;
                        None
                    }
                }
            }
            other => other,
        };
        let (container, cold) = match taken {
            Some(mut c) => {
                let prewarmed = std::mem::take(&mut c.prewarmed);
                if prewarmed && let Ok(mut stats) = self.inner.prewarm.lock() {
                    stats.used += 1;
                }
                // A prewarmed container has never run the function: its first run pays the
                // function's own initialization, so it is cold (only the container's start was
                // taken off it: its start latency).
                (c, prewarmed)
            }
            None => {
                let (c, starts) = self.inner.create_counted(&spec, key).await?;
                start_contention = Some(StartContention {
                    starts,
                    cores: self.inner.engine_cores,
                });
                (c, true)
            }
        };
        let mut lease = Lease {
            inner: self.inner.clone(),
            container: Some(container),
        };
        let Some(container) = lease.container.as_mut() else {
            return Err(SandboxError::Runtime("lease without a container".into()));
        };
        match self.inner.run_in(container, &spec, cold, t0, wall0).await {
            Ok((mut outcome, reusable)) => {
                if reusable {
                    lease.give_back();
                } else {
                    lease.discard().await;
                }
                let (idle, seq) = self.inner.idle_count(&PoolKey::of(&spec));
                outcome.warm_idle = Some(idle);
                outcome.warm_seq = seq;
                outcome.start_contention = start_contention;
                Ok(outcome)
            }
            Err(e) => {
                lease.discard().await;
                Err(e)
            }
        }
    }

    async fn shutdown(&self) -> Result<(), SandboxError> {
        let idle: Vec<Container> = match self.inner.idle.lock() {
            Ok(mut m) => m.drain().flat_map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for c in idle {
            self.inner.remove(c.id, c.dir).await;
        }
        // Containers of runs still in progress, too: their runs then fail.
        let live: Vec<(String, PathBuf)> = match self.inner.live.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Err(_) => Vec::new(),
        };
        for (id, dir) in live {
            self.inner.remove(id, dir).await;
        }
        Ok(())
    }
}

/// A container taken for one run: back to the pool, or removed, also when the run is dropped.
struct Lease {
    inner: Arc<Inner>,
    container: Option<Container>,
}

impl Lease {
    fn give_back(&mut self) {
        if let Some(mut c) = self.container.take() {
            c.last_used = Instant::now();
            c.runs += 1;
            match self.inner.idle.lock() {
                Ok(mut idle) => idle.entry(c.key.clone()).or_default().push(c),
                Err(_) => self.container = Some(c),
            }
        }
    }

    async fn discard(&mut self) {
        if let Some(c) = self.container.take() {
            self.inner.remove(c.id, c.dir).await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The run was cancelled midway: the container's state is unknown, so it goes.
        if let Some(c) = self.container.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let inner = self.inner.clone();
            rt.spawn(async move { inner.remove(c.id, c.dir).await });
        }
    }
}

impl Inner {
    /// The idle containers of `key` within their keep-alive that a run used before (a
    /// prewarmed one's first run is still cold), and the count's place in the order of counts
    /// (`RunOutcome::warm_seq`).
    fn idle_count(&self, key: &PoolKey) -> (usize, u64) {
        let limit = self.config.idle_timeout;
        match self.idle.lock() {
            Ok(m) => {
                let n = m.get(key).map_or(0, |l| {
                    l.iter()
                        .filter(|c| !c.prewarmed && c.last_used.elapsed() < limit)
                        .count()
                });
                (n, super::next_id() + 1)
            }
            Err(_) => (0, 0),
        }
    }

    /// An idle container of `key` within its keep-alive, and the containers of `key` past it,
    /// for the caller to remove: the reaper looks only every quarter of the keep-alive, and a
    /// container past its keep-alive must not be reused whatever the reaper's phase.
    fn take_idle(&self, key: &PoolKey) -> (Option<Container>, Vec<Container>) {
        let Ok(mut idle) = self.idle.lock() else {
            return (None, Vec::new());
        };
        let Some(list) = idle.get_mut(key) else {
            return (None, Vec::new());
        };
        let limit = self.config.idle_timeout;
        let (expired, keep): (Vec<_>, Vec<_>) =
            list.drain(..).partition(|c| c.last_used.elapsed() >= limit);
        *list = keep;
        // The most recently used one: its pages are the likeliest to be in memory.
        let c = list.pop();
        if list.is_empty() {
            idle.remove(key);
        }
        (c, expired)
    }

    /// [`Inner::create`], counted among this process's environment starts: the container, and
    /// how many starts overlapped its own (its own included).
    async fn create_counted(
        &self,
        spec: &RunSpec,
        key: PoolKey,
    ) -> Result<(Container, u32), SandboxError> {
        let ticket = STARTS.begin();
        let c = self.create(spec, key).await?;
        Ok((c, ticket.overlapping()))
    }

    async fn create(&self, spec: &RunSpec, key: PoolKey) -> Result<Container, SandboxError> {
        let cpus = nano_cpus(spec.cpus, self.engine_cores);
        let n = super::next_id();
        let name = format!(
            "sonic-{}-{n}-{}",
            std::process::id(),
            sanitize(&spec.warm_key, 40)
        );
        let dir = self.config.work_dir.join(&name);
        let ctl = dir.join("ctl");
        for d in [&ctl, &dir.join("in"), &dir.join("out")] {
            fs::create_dir_all(d)?;
        }
        let fifo = ctl.join(launcher::REQUESTS);
        sys::mkfifo(&fifo)?;
        let requests = fs::OpenOptions::new().read(true).write(true).open(&fifo)?;

        let bind =
            |host: &Path, inside: &str, mode: &str| format!("{}:{inside}:{mode}", host.display());
        let labels = HashMap::from([
            (LABEL_SANDBOX.to_string(), "docker".to_string()),
            (LABEL_OWNER.to_string(), self.owner.clone()),
            (LABEL_DIR.to_string(), dir.display().to_string()),
            (LABEL_WARM_KEY.to_string(), spec.warm_key.clone()),
        ]);
        let memory = i64::try_from(spec.memory_limit_bytes)
            .map_err(|_| SandboxError::InvalidSpec("memory limit too large".into()))?;
        // Docker takes a ulimit as an i64; beyond it, no quota means "unlimited" (-1).
        let fsize = i64::try_from(spec.output_quota_bytes).unwrap_or(-1);
        let tmp_size = if fsize < 0 {
            String::new()
        } else {
            // tmpfs sizes are in bytes; at least a page.
            format!(",size={}", fsize.max(4096))
        };
        let mut binds = vec![
            bind(&ctl, launcher::CTL_DIR, "rw"),
            bind(&dir.join("in"), IN_DIR, "ro"),
            bind(&dir.join("out"), OUT_DIR, "rw"),
        ];
        for m in &spec.mounts {
            binds.push(bind(&m.host, &m.container, "ro"));
        }
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(self.config.launcher.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: Some(binds),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(cpus),
                // docker-init as PID 1: reaps orphans of lambdas, ends the launcher on SIGTERM.
                init: Some(true),
                network_mode: self.config.network_mode.clone(),
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_string(),
                    format!("rw,nosuid,nodev,mode=1777{tmp_size}"),
                )])),
                ulimits: Some(vec![ResourcesUlimits {
                    name: Some("fsize".into()),
                    soft: Some(fsize),
                    hard: Some(fsize),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = match self.docker.create_container(Some(options), body).await {
            Ok(c) => c,
            Err(e) => {
                let _ = remove_tree(&dir);
                return Err(match e {
                    DockerError::DockerResponseServerError {
                        status_code: 404, ..
                    } => SandboxError::ImageNotFound(spec.image.clone()),
                    e => SandboxError::Runtime(format!(
                        "cannot create a container of {}: {e}",
                        spec.image
                    )),
                });
            }
        };
        let id = created.id;
        if let Ok(mut live) = self.live.lock() {
            live.insert(id.clone(), dir.clone());
        }
        if let Err(e) = self.docker.start_container(&id, None).await {
            self.remove(id, dir).await;
            return Err(SandboxError::Runtime(format!(
                "cannot start a container of {}: {e} (the image must contain {:?} on its PATH: \
                 build it with deploy/build-images.sh)",
                spec.image, self.config.launcher
            )));
        }
        let cgroup = MemoryCgroup::of_container(&self.config.cgroup_root, &id);
        if cgroup.is_none() {
            tracing::warn!(container = %name, "no memory cgroup found: peak memory from ru_maxrss only");
        }
        tracing::debug!(container = %name, id = %id, image = %spec.image, "container started");
        Ok(Container {
            id,
            name,
            dir,
            requests,
            cgroup,
            key,
            nano_cpus: cpus,
            last_used: Instant::now(),
            runs: 0,
            prewarmed: false,
        })
    }

    /// One run in `c`; the outcome, and whether `c` may be reused.
    async fn run_in(
        &self,
        c: &mut Container,
        spec: &RunSpec,
        cold: bool,
        t0: Instant,
        wall0: SystemTime,
    ) -> Result<(RunOutcome, bool), SandboxError> {
        let run = format!("r{}", super::next_id());
        let ctl = c.dir.join("ctl");
        let in_dir = c.dir.join("in").join(&run);
        let out_dir = c.dir.join("out").join(&run);

        let (src, dst) = (spec.input_dir.clone(), in_dir.clone());
        let staged = tokio::task::spawn_blocking(move || link_tree(&src, &dst))
            .await
            .map_err(|e| SandboxError::Runtime(format!("staging inputs: {e}")))??;
        if staged.copied > 0 {
            tracing::warn!(
                run = %spec.run_id,
                copied = staged.copied,
                "inputs copied, not linked: the sandbox work dir is on another filesystem"
            );
        }
        fs::create_dir_all(&out_dir)?;

        let mut env = spec.env.clone();
        env.push(("SONIC_INPUT_DIR".into(), format!("{IN_DIR}/{run}")));
        env.push(("SONIC_OUTPUT_DIR".into(), format!("{OUT_DIR}/{run}")));
        let request = Request {
            cmd: spec.command.clone(),
            env,
            cwd: "/".into(),
        };
        let json = serde_json::to_vec(&request)
            .map_err(|e| SandboxError::Runtime(format!("encoding the request: {e}")))?;
        fs::write(ctl.join(launcher::request_file(&run)), json)?;
        let done = ctl.join(launcher::done_fifo(&run));
        sys::mkfifo(&done)?;
        // Read-write, so the read waits for the report instead of seeing end-of-file.
        let receiver = tokio::net::unix::pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&done)?;

        // Memory before the run: the peak restarts from here.
        let mut baseline = 0;
        let mut oom_before = 0;
        let mut cgroup_peak_valid = false;
        if let Some(cg) = &c.cgroup {
            let reset = cg.reset_peak().unwrap_or(false);
            cgroup_peak_valid = reset || (cg.version == Version::V2 && cold);
            baseline = if reset { cg.usage().unwrap_or(0) } else { 0 };
            oom_before = cg.oom_kills().unwrap_or(0);
        }

        (&c.requests).write_all(format!("{run}\n").as_bytes())?;
        let sent = Instant::now();

        let ending = {
            let mut lines = tokio::io::BufReader::new(receiver);
            let mut line = String::new();
            tokio::select! {
                read = lines.read_line(&mut line) => {
                    read?;
                    Ending::Report(serde_json::from_str(&line).map_err(|e| SandboxError::Runtime(
                        format!("bad report from the launcher: {e}: {line:?}")))?)
                }
                () = container_stopped(&self.docker, &c.id) => Ending::Stopped,
                () = quota_exceeded(
                    vec![c.dir.join("out"), ctl.clone()],
                    spec.output_quota_bytes,
                    self.config.quota_poll,
                ) => Ending::OverQuota,
                // From the hand-over to the launcher: creating a container is not the lambda's
                // time (the launcher is already running when start_container returns).
                () = tokio::time::sleep(spec.timeout) => Ending::TimedOut,
            }
        };
        let duration = t0.elapsed();

        let mut peak = None;
        let mut oom = false;
        if let Some(cg) = &c.cgroup
            && !matches!(ending, Ending::Stopped)
        {
            if cgroup_peak_valid && let Ok(p) = cg.peak() {
                peak = Some(p.saturating_sub(baseline));
            }
            oom = cg.oom_kills().unwrap_or(oom_before) > oom_before;
        }
        let mut reusable = !oom;
        let mut log = tail_file(&ctl.join(launcher::log_file(&run)), self.config.log_limit)
            .unwrap_or_default();
        let mut start_latency = sent - t0;
        let termination = match &ending {
            Ending::OverQuota => {
                reusable = false;
                self.kill(&c.id).await;
                Termination::OutputQuotaExceeded
            }
            Ending::TimedOut => {
                reusable = false;
                self.kill(&c.id).await;
                log.push_str(&format!(
                    "sonic: killed after its timeout of {:?}\n",
                    spec.timeout
                ));
                Termination::TimedOut
            }
            Ending::Stopped => {
                reusable = false;
                let state = self
                    .docker
                    .inspect_container(&c.id, None)
                    .await
                    .ok()
                    .and_then(|i| i.state);
                if state.as_ref().and_then(|s| s.oom_killed) == Some(true) {
                    log.push_str(&format!(
                        "sonic: container killed for exceeding its memory limit of {} bytes\n",
                        spec.memory_limit_bytes
                    ));
                    Termination::OutOfMemory
                } else {
                    let code = state.and_then(|s| s.exit_code).unwrap_or(-1);
                    let _ = self.clean_run(&ctl, &run, &in_dir, &out_dir, spec).await;
                    return Err(SandboxError::Runtime(format!(
                        "container {} stopped during run {} (exit code {code}); log: {}",
                        c.name,
                        spec.run_id,
                        log.lines().last().unwrap_or("")
                    )));
                }
            }
            Ending::Report(r) => {
                if let Some(ns) = r.spawned_unix_ns {
                    let spawned = UNIX_EPOCH + Duration::from_nanos(ns);
                    if let Ok(d) = spawned.duration_since(wall0) {
                        start_latency = d;
                    }
                }
                let rss = r.max_rss_kib.map(|k| k * 1024);
                // The lambda's own peak when the launcher measured it; the cgroup's growth
                // (page cache included) only without it.
                peak = rss.or(peak);
                if let Some(err) = &r.error {
                    log.push_str(&format!("sonic: {err}\n"));
                }
                if oom {
                    log.push_str(&format!(
                        "sonic: killed for exceeding its memory limit of {} bytes\n",
                        spec.memory_limit_bytes
                    ));
                    Termination::OutOfMemory
                } else if let Some(code) = r.exit_code {
                    Termination::Exited(code)
                } else if let Some(sig) = r.signal {
                    Termination::Signaled(sig)
                } else {
                    Termination::Exited(r.error_exit_code.unwrap_or(126))
                }
            }
        };
        // What the lambda wrote besides its outputs, and whether all of it fits the quota.
        let (stray, used) = {
            let (dir, ctl, run, quota) = (
                c.dir.clone(),
                ctl.clone(),
                run.clone(),
                spec.output_quota_bytes,
            );
            tokio::task::spawn_blocking(move || {
                (
                    stray_entries(&dir, &ctl, &run),
                    tree_bytes(&[dir.join("out"), ctl], quota),
                )
            })
            .await
            .map_err(|e| SandboxError::Runtime(format!("checking the run's writes: {e}")))?
        };
        let termination = if !stray.is_empty() {
            reusable = false;
            tracing::warn!(run = %spec.run_id, container = %c.name, ?stray, "lambda wrote outside its output folder");
            Termination::Violation(format!(
                "the lambda wrote outside its output folder: {}",
                stray.join(", ")
            ))
        } else if termination != Termination::OutputQuotaExceeded
            && (used > spec.output_quota_bytes
                || termination == Termination::Signaled(libc::SIGXFSZ))
        {
            // Between two looks of the watcher, or one file stopped at the limit (SIGXFSZ).
            reusable = false;
            Termination::OutputQuotaExceeded
        } else {
            termination
        };
        match &termination {
            Termination::OutputQuotaExceeded => {
                tracing::warn!(run = %spec.run_id, container = %c.name, quota = spec.output_quota_bytes, "lambda wrote more than its output quota");
                log.push_str(&format!(
                    "sonic: killed for writing more than its output quota of {} bytes\n",
                    spec.output_quota_bytes
                ));
            }
            Termination::Violation(why) => log.push_str(&format!("sonic: {why}\n")),
            _ => {}
        }
        // After a quota or violation the container and its folder go as a whole (the lease
        // discards it): nothing of what it wrote reaches the output folder.
        if !matches!(
            termination,
            Termination::OutputQuotaExceeded | Termination::Violation(_)
        ) {
            self.clean_run(&ctl, &run, &in_dir, &out_dir, spec).await?;
        }
        tracing::info!(
            run = %spec.run_id,
            container = %c.name,
            ?termination,
            cold,
            reuse = c.runs,
            duration_ms = duration.as_millis() as u64,
            start_us = start_latency.as_micros() as u64,
            peak_memory_bytes = peak,
            "docker run ended"
        );
        Ok((
            RunOutcome {
                termination,
                cold,
                duration,
                start_latency: start_latency.min(duration),
                peak_memory_bytes: peak,
                log,
                warm_idle: None,
                warm_seq: 0,
                start_contention: None,
                cpus: Some(c.nano_cpus as f64 / 1e9),
            },
            reusable,
        ))
    }

    /// Outputs to the spec's folder, and the run's files out of the container's folders.
    async fn clean_run(
        &self,
        ctl: &Path,
        run: &str,
        in_dir: &Path,
        out_dir: &Path,
        spec: &RunSpec,
    ) -> Result<(), SandboxError> {
        let (ctl, run) = (ctl.to_path_buf(), run.to_string());
        let (in_dir, out_dir, dest) = (
            in_dir.to_path_buf(),
            out_dir.to_path_buf(),
            spec.output_dir.clone(),
        );
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let moved = move_tree(&out_dir, &dest);
            // The links go; the staged files themselves stay where the agent put them.
            remove_tree(&in_dir)?;
            for f in [
                launcher::request_file(&run),
                launcher::log_file(&run),
                launcher::done_fifo(&run),
            ] {
                let _ = fs::remove_file(ctl.join(f));
            }
            moved?;
            remove_tree(&out_dir)
        })
        .await
        .map_err(|e| SandboxError::Runtime(format!("collecting outputs: {e}")))??;
        Ok(())
    }

    async fn kill(&self, id: &str) {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        if let Err(e) = self.docker.remove_container(id, Some(options)).await {
            tracing::warn!(id, error = %e, "cannot kill a container");
        }
    }

    /// Removes a container (force) and its host folder.
    async fn remove(&self, id: String, dir: PathBuf) {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(&id, Some(options)).await {
            Ok(())
            | Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            // 409: removal already in progress (a timeout killed it).
            Err(DockerError::DockerResponseServerError {
                status_code: 409, ..
            }) => {}
            Err(e) => tracing::warn!(id, error = %e, "cannot remove a container"),
        }
        if let Ok(mut live) = self.live.lock() {
            live.remove(&id);
        }
        let removed = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(error = %e, "cannot remove a container folder");
        }
    }

    /// Removes the containers of sandboxes whose process is gone (an agent that crashed). Only
    /// containers made under this sandbox's own work folder are considered: other agents of the
    /// same Docker engine (in containers of their own, with their own process ids) keep theirs.
    async fn remove_stale(&self) -> Result<(), SandboxError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_SANDBOX}=docker")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| SandboxError::Runtime(format!("listing containers: {e}")))?;
        for c in list {
            let (Some(id), Some(labels)) = (c.id, c.labels) else {
                continue;
            };
            let Some(owner) = labels.get(LABEL_OWNER) else {
                continue;
            };
            let dir = labels.get(LABEL_DIR).map(PathBuf::from).unwrap_or_default();
            // Only our own kind of folder: a label is not a licence to delete anything.
            let ours = dir.starts_with(&self.config.work_dir)
                && dir
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("sonic-"));
            if !ours || owner_alive(owner) {
                continue;
            }
            tracing::info!(id = %id, owner = %owner, "removing a container of a gone agent");
            self.remove(id, dir).await;
        }
        Ok(())
    }
}

pub use sonic_openlambda::docker_venv::VENV_DIR;

/// Builds `requirements.txt` environments in containers of `image`
/// ([`sonic_openlambda::docker_venv::venv_builder`]).
pub fn venv_builder(image: String) -> Result<sonic_openlambda::venv::BuildFn, SandboxError> {
    sonic_openlambda::docker_venv::venv_builder(image).map_err(SandboxError::Unavailable)
}

/// Entries of a container's `out` and `ctl` folders that are not run `run`'s own, shown as the
/// lambda sees them (`/sonic/out/x`).
fn stray_entries(dir: &Path, ctl: &Path, run: &str) -> Vec<String> {
    let names = |d: &Path| -> Vec<String> {
        fs::read_dir(d)
            .map(|it| {
                it.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let own_ctl = [
        launcher::REQUESTS.to_string(),
        launcher::request_file(run),
        launcher::log_file(run),
        launcher::done_fifo(run),
    ];
    let mut stray: Vec<String> = names(&dir.join("out"))
        .into_iter()
        .filter(|n| n != run)
        .map(|n| format!("{OUT_DIR}/{n}"))
        .chain(
            names(ctl)
                .into_iter()
                .filter(|n| !own_ctl.contains(n))
                .map(|n| format!("{}/{n}", launcher::CTL_DIR)),
        )
        .collect();
    stray.sort();
    stray
}

/// Resolves when the container is no longer running (or no longer exists).
async fn container_stopped(docker: &Docker, id: &str) {
    loop {
        match docker.wait_container(id, None).next().await {
            Some(Ok(_)) | Some(Err(DockerError::DockerContainerWaitError { .. })) => return,
            Some(Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            })) => return,
            // A client timeout or a dropped connection says nothing: ask the engine.
            _ => match docker.inspect_container(id, None).await {
                Ok(i) if i.state.as_ref().and_then(|s| s.running) == Some(true) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(_) => return,
                Err(DockerError::DockerResponseServerError {
                    status_code: 404, ..
                }) => return,
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            },
        }
    }
}

/// Removes containers that stayed idle longer than the idle time, until the sandbox is dropped.
async fn reap_idle(inner: Weak<Inner>) {
    loop {
        let tick = match inner.upgrade() {
            Some(i) => {
                (i.config.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
            }
            None => return,
        };
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else { return };
        let expired: Vec<Container> = match inner.idle.lock() {
            Ok(mut idle) => {
                let limit = inner.config.idle_timeout;
                let mut out = Vec::new();
                for list in idle.values_mut() {
                    let (old, keep): (Vec<_>, Vec<_>) =
                        list.drain(..).partition(|c| c.last_used.elapsed() >= limit);
                    *list = keep;
                    out.extend(old);
                }
                idle.retain(|_, v| !v.is_empty());
                out
            }
            Err(_) => return,
        };
        for c in expired {
            tracing::debug!(container = %c.name, runs = c.runs, "idle container removed");
            inner.remove(c.id, c.dir).await;
        }
    }
}

/// `<pid>-<start time>`: names a process for good (a pid alone may be reused).
fn owner_token(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime) counted after the command name, which may contain spaces.
    let after = stat.rsplit_once(") ")?.1;
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{pid}-{start}"))
}

fn owner_alive(owner: &str) -> bool {
    let Some(pid) = owner.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        // Not a token of ours: leave it alone.
        return true;
    };
    owner_token(pid).as_deref() == Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_name_live_processes_only() {
        let me = owner_token(std::process::id()).unwrap();
        assert!(owner_alive(&me));
        let (pid, start) = me.split_once('-').unwrap();
        assert!(!owner_alive(&format!(
            "{pid}-{}",
            start.parse::<u64>().unwrap() + 1
        )));
        assert!(!owner_alive("4000000-1"));
        assert!(owner_alive("not-a-token"));
    }

    #[test]
    fn pool_keys_separate_limits() {
        let spec = RunSpec {
            run_id: "r".into(),
            warm_key: "k".into(),
            image: "i".into(),
            command: vec!["x".into()],
            env: vec![],
            input_dir: PathBuf::new(),
            output_dir: PathBuf::new(),
            memory_limit_bytes: 1,
            cpus: 0.5,
            timeout: Duration::from_secs(1),
            output_quota_bytes: 1 << 30,
            mounts: vec![],
        };
        let a = PoolKey::of(&spec);
        assert_eq!(nano_cpus(spec.cpus, 4), 500_000_000);
        // More than the engine has: what it has.
        assert_eq!(nano_cpus(8.0, 2), 2_000_000_000);
        // Other CPUs: the same warm containers (their limit is changed in place).
        let mut more = spec.clone();
        more.cpus = 2.0;
        assert_eq!(a, PoolKey::of(&more));
        let mut other = spec.clone();
        other.memory_limit_bytes = 2;
        assert_ne!(a, PoolKey::of(&other));
        assert_eq!(a, PoolKey::of(&spec.clone()));
    }
}
