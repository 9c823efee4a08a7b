//! The process sandbox: runs an instance's command directly on the host, with the same file ABI
//! as the Docker sandbox (`SONIC_INPUT_DIR` and `SONIC_OUTPUT_DIR` are the spec's own folders).
//!
//! - Each run is its own process group; a timeout kills the whole group, and so does the end of
//!   the run (nothing a lambda starts in the background outlives it).
//! - Memory: when cgroup v1 memory groups can be created under `cgroup_parent` (root on a v1
//!   machine), each run gets a fresh group with the memory limit (no swap): the kernel enforces
//!   the limit, and an OOM kill is reported as `OutOfMemory`. The peak the profiler learns is the
//!   lambda's `ru_maxrss` as `sonic-time` reports it (the largest resident set of the lambda and
//!   its descendants): what the function needs. The group's `memory.max_usage_in_bytes` also
//!   counts the page cache the run caused (every output written), which the kernel reclaims
//!   under the limit and which varies with the machine's state, so it is the peak only when
//!   `sonic-time` gave no report. Without cgroups the peak is `ru_maxrss` and the limit is checked
//!   after the fact: a run whose peak exceeded it is reported as `OutOfMemory`.
//!   RLIMIT_AS is not used: it limits address space, not memory, and breaks normal programs that
//!   reserve more than they touch.
//! - Starting: the agent spawns `sonic-time` (found in the lambda folders) with no work between
//!   fork and exec, so std uses `posix_spawn` (vfork: the agent's page tables are not copied),
//!   from a blocking thread, never an async worker. `sonic-time` forks the lambda from its own
//!   few MB, and its child sets `RLIMIT_FSIZE` and joins the run's cgroup (writing `0` to the
//!   group's `tasks`, which the kernel does without its cgroup-wide lock) before its exec; it
//!   reports the lambda's exit and `ru_maxrss` (a child's `ru_maxrss` starts from the size of the
//!   process it was forked from, so the agent must not fork lambdas itself). Without `sonic-time`
//!   the lambda is started directly with those steps as `pre_exec` hooks: std then forks the
//!   whole agent, and the peak without cgroups includes the agent's size at fork time.
//! - The input folder is not write-protected here (the lambda runs as the agent's user); the
//!   Docker sandbox mounts it read-only.
//! - Output quota: `RLIMIT_FSIZE` at the quota (no file grows past it: `SIGXFSZ`; set by
//!   `sonic-time` for the lambda), and a watcher that sums the output folder every `quota_poll`
//!   and kills the group once it holds more than the quota; a run that ends over it is refused
//!   too (`OutputQuotaExceeded`).
//! - What this sandbox does NOT contain: the lambda runs as the agent's user with the agent's view
//!   of the filesystem and network. It can read and write any file that user can (outside its
//!   folders too: only its output folder is counted against the quota), hard-link host files into
//!   its outputs, and open sockets. It is the fallback for machines without Docker, for trusted
//!   lambdas (docs/security.md).
//! - Environment: only `PATH` (the configured lambda folders first), `HOME` and `TMPDIR` (a private
//!   folder per warm key, also the working directory), then the spec's variables: nothing of the
//!   agent's own environment (credentials, ...) leaks into a lambda.
//! - Hot and cold: each running instance has an environment of its own (never shared by two runs
//!   at once, like a container). A run that finds an idle environment of its warm key (kept the
//!   idle time after its last run, or made by `prewarm`) is hot: the binary is then in the page
//!   cache and the `TMPDIR` state of earlier runs of the key is still there; else it is cold.
//!   Warm keys name a function across jobs (docs/agent.md), so a later job's runs are hot too;
//!   what is job-specific (environment, input and output folders) is each run's own. An
//!   environment whose run was killed (timeout, memory, quota, a signal) or broke containment is
//!   removed, never reused, as the Docker sandbox's container.
//! - With cgroups, a run's command gets its memory group's folder as `SONIC_MEMORY_CGROUP`, so
//!   that a process it hands its work to (a Python handler's warm runtime, docs/python.md) can
//!   join the group for the run and leave it after.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::cgroup::{CGROUP_ROOT, MemoryCgroup};
use super::fsutil::{Tail, quota_exceeded, remove_tree, tree_bytes};
use super::{PrewarmStats, RunOutcome, RunSpec, Sandbox, SandboxError, Termination, sys};

/// Whether the process sandbox uses cgroup v1 memory groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// Use them when they can be created, else measure with `ru_maxrss`.
    Auto,
    /// Never.
    Off,
    /// Fail at construction when they cannot be created.
    Required,
}

/// Settings of the process sandbox.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// Private folders of the warm keys (`TMPDIR`, working directory).
    pub work_dir: PathBuf,
    /// Folders searched first for a command's executable (e.g. `target/release`).
    pub path: Vec<PathBuf>,
    /// How long a warm key's folder is kept after its last run; the next run after that is cold.
    pub idle_timeout: Duration,
    pub cgroups: CgroupMode,
    /// Where per-run memory cgroups are made.
    pub cgroup_parent: PathBuf,
    /// Bytes of the end of the output and error kept as the log.
    pub log_limit: usize,
    /// How often the output folder of a running instance is summed against its quota.
    pub quota_poll: Duration,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            work_dir: std::env::temp_dir().join(format!("sonic-process-{}", std::process::id())),
            path: Vec::new(),
            idle_timeout: Duration::from_secs(60),
            cgroups: CgroupMode::Auto,
            cgroup_parent: PathBuf::from(CGROUP_ROOT).join("memory/sonic"),
            log_limit: 64 * 1024,
            quota_poll: Duration::from_millis(100),
        }
    }
}

#[derive(Debug)]
struct WarmEnv {
    dir: PathBuf,
    last_used: Instant,
    /// Made by `prewarm` and not used by a run yet.
    prewarmed: bool,
}

/// Runs instances as host processes.
#[derive(Debug)]
pub struct ProcessSandbox {
    config: ProcessConfig,
    use_cgroups: bool,
    /// The idle environments of each warm key; a running instance holds its own (never shared
    /// by two runs at once, as a container).
    envs: Mutex<HashMap<String, Vec<WarmEnv>>>,
    prewarm: Mutex<PrewarmStats>,
}

impl ProcessSandbox {
    pub fn new(config: ProcessConfig) -> Result<Self, SandboxError> {
        std::fs::create_dir_all(&config.work_dir)?;
        let use_cgroups = match config.cgroups {
            CgroupMode::Off => false,
            CgroupMode::Auto => MemoryCgroup::v1_writable(&config.cgroup_parent),
            CgroupMode::Required => {
                if !MemoryCgroup::v1_writable(&config.cgroup_parent) {
                    return Err(SandboxError::Unavailable(format!(
                        "cannot create cgroup v1 memory groups under {} (needs root and cgroup v1)",
                        config.cgroup_parent.display()
                    )));
                }
                true
            }
        };
        let timer = find_timer(&config.path);
        if timer.is_none() {
            tracing::warn!(
                "no {TIMER} in the lambda folders: lambdas start without it, so every start \
                 forks the agent, and peaks without cgroups include the agent's size"
            );
        }
        tracing::info!(
            work_dir = %config.work_dir.display(),
            cgroups = use_cgroups,
            timer = ?timer,
            "process sandbox ready"
        );
        Ok(Self {
            config,
            use_cgroups,
            envs: Mutex::new(HashMap::new()),
            prewarm: Mutex::new(PrewarmStats::default()),
        })
    }

    /// True when runs get a memory cgroup (limit enforced by the kernel).
    pub fn uses_cgroups(&self) -> bool {
        self.use_cgroups
    }

    /// Idle environments of `key` within their keep-alive that a run used before (a prewarmed
    /// one's first run is still cold), and the count's place in the order of counts
    /// (`RunOutcome::warm_seq`).
    fn idle_count(&self, key: &str) -> (usize, u64) {
        let idle = self.config.idle_timeout;
        match self.envs.lock() {
            Ok(m) => {
                let n = m.get(key).map_or(0, |l| {
                    l.iter()
                        .filter(|e| !e.prewarmed && e.last_used.elapsed() < idle)
                        .count()
                });
                (n, super::next_id() + 1)
            }
            Err(_) => (0, 0),
        }
    }

    /// Warm environments idle now and not yet expired: the next run of their key is hot.
    pub fn warm_environments(&self) -> usize {
        let idle = self.config.idle_timeout;
        self.envs
            .lock()
            .map(|m| {
                m.values()
                    .flatten()
                    .filter(|e| e.last_used.elapsed() < idle)
                    .count()
            })
            .unwrap_or(0)
    }

    fn envs(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<String, Vec<WarmEnv>>>, SandboxError> {
        self.envs
            .lock()
            .map_err(|_| SandboxError::Runtime("warm environment table poisoned".into()))
    }

    /// Forgets environments idle longer than the idle time; their folders are removed by a
    /// thread of their own (after a burst of runs, hundreds expire at once).
    fn expire(&self, envs: &mut HashMap<String, Vec<WarmEnv>>) {
        let idle = self.config.idle_timeout;
        let mut gone = Vec::new();
        for list in envs.values_mut() {
            list.retain_mut(|e| {
                let keep = e.last_used.elapsed() < idle;
                if !keep {
                    gone.push(std::mem::take(&mut e.dir));
                }
                keep
            });
        }
        envs.retain(|_, v| !v.is_empty());
        if !gone.is_empty() {
            std::thread::spawn(move || {
                for dir in gone {
                    if let Err(err) = remove_tree(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %err, "cannot remove idle environment");
                    }
                }
            });
        }
    }

    /// A new environment's folder for `key`.
    fn new_env(&self, key: &str) -> Result<PathBuf, SandboxError> {
        let n = super::next_id();
        let dir = self
            .config
            .work_dir
            .join(format!("env-{n}-{}", sanitize(key, 40)));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// An idle environment of the key (hot), else a new one (cold): its folder, and whether the
    /// run is cold. Also drops folders idle too long.
    fn acquire_env(&self, key: &str) -> Result<(PathBuf, bool), SandboxError> {
        {
            let mut envs = self.envs()?;
            self.expire(&mut envs);
            let taken = envs.get_mut(key).and_then(|list| list.pop());
            if envs.get(key).is_some_and(|l| l.is_empty()) {
                envs.remove(key);
            }
            if let Some(env) = taken {
                if env.prewarmed
                    && let Ok(mut stats) = self.prewarm.lock()
                {
                    stats.used += 1;
                }
                // A prewarmed environment has never run the function: its first run pays the
                // function's own initialization, so it is cold (it only skipped the setup).
                return Ok((env.dir, env.prewarmed));
            }
        }
        Ok((self.new_env(key)?, true))
    }

    /// Puts an environment back for the next run of its key.
    fn release_env(&self, key: &str, dir: PathBuf) {
        let env = WarmEnv {
            dir,
            last_used: Instant::now(),
            prewarmed: false,
        };
        match self.envs.lock() {
            Ok(mut envs) => envs.entry(key.to_string()).or_default().push(env),
            Err(_) => {
                let _ = remove_tree(&env.dir);
            }
        }
    }

    /// The executable `program` resolves to, as the run will start it.
    fn resolve(&self, program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            return Some(PathBuf::from(program));
        }
        std::env::split_paths(&self.path_var())
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    }

    fn path_var(&self) -> std::ffi::OsString {
        let mut dirs: Vec<PathBuf> = self.config.path.clone();
        if let Some(p) = std::env::var_os("PATH") {
            dirs.extend(std::env::split_paths(&p));
        }
        std::env::join_paths(dirs).unwrap_or_default()
    }

    async fn run_in(
        &self,
        spec: &RunSpec,
        env_dir: PathBuf,
        cold: bool,
        t0: Instant,
    ) -> Result<RunOutcome, SandboxError> {
        let n = super::next_id();
        let launch = Launch {
            command: spec.command.clone(),
            env: spec.env.clone(),
            path_var: self.path_var(),
            lambda_dirs: self.config.path.clone(),
            report: env_dir.join(format!(".sonic-usage-{n}.json")),
            env_dir,
            input_dir: spec.input_dir.clone(),
            output_dir: spec.output_dir.clone(),
            quota: spec.output_quota_bytes,
            cgroup: self.use_cgroups.then(|| {
                (
                    self.config.cgroup_parent.clone(),
                    format!("{}-{n}-{}", std::process::id(), sanitize(&spec.run_id, 40)),
                    spec.memory_limit_bytes,
                )
            }),
            log_limit: self.config.log_limit,
            t0,
        };
        // Off the async workers: creating the cgroup and spawning block (a spawn for up to a
        // millisecond or two). If this future is dropped meanwhile, what the closure returns is
        // dropped when it ends: the group is killed and reaped, the cgroup removed.
        let (mut cgroup, spawned) = tokio::task::spawn_blocking(move || launch.start())
            .await
            .map_err(|e| SandboxError::Runtime(format!("the start failed: {e}")))?;
        let result = match spawned {
            Ok(Spawned::Running(started)) => {
                self.supervise(spec, started, cold, t0, cgroup.0.as_ref())
                    .await
            }
            Ok(Spawned::NotStarted { code, message }) => Ok(RunOutcome {
                cpus: None,
                termination: Termination::Exited(code),
                cold,
                duration: t0.elapsed(),
                start_latency: t0.elapsed(),
                peak_memory_bytes: None,
                log: message,
                warm_idle: None,
                warm_seq: 0,
                start_contention: None,
            }),
            Err(e) => Err(e),
        };
        if let Some(cg) = cgroup.0.take() {
            let removed = tokio::task::spawn_blocking(move || cg.remove()).await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(error = %e, "cannot remove a run's cgroup");
            }
        }
        result
    }

    /// Waits for a started run to end (or to be killed for its timeout or its output quota) and
    /// reads what it used.
    async fn supervise(
        &self,
        spec: &RunSpec,
        started: Started,
        cold: bool,
        t0: Instant,
        cgroup: Option<&MemoryCgroup>,
    ) -> Result<RunOutcome, SandboxError> {
        let Started {
            pid,
            group,
            mut waiter,
            log: log_rx,
            report,
            start_latency,
        } = started;
        tracing::debug!(run = %spec.run_id, pid, cold, "process started");

        // From the start of the command, as in the Docker sandbox.
        let quota = spec.output_quota_bytes;
        let watch = quota_exceeded(vec![spec.output_dir.clone()], quota, self.config.quota_poll);
        let (joined, timed_out, mut over_quota) = tokio::select! {
            joined = &mut waiter => (joined, false, false),
            () = tokio::time::sleep(spec.timeout) => {
                group.kill();
                (waiter.await, true, false)
            }
            () = watch => {
                group.kill();
                (waiter.await, false, true)
            }
        };
        let duration = t0.elapsed();
        let reaped = joined
            .map_err(|_| SandboxError::Runtime("the waiter thread failed".into()))?
            .map_err(SandboxError::Io)?;

        // A process that left the group may still hold the pipe: do not wait for it for long.
        let mut log = match tokio::time::timeout(Duration::from_secs(1), log_rx).await {
            Ok(Ok(text)) => text,
            _ => String::from("sonic: log incomplete (a process still holds the output)\n"),
        };

        // The lambda's own end and peak, from `sonic-time`'s report; without one (no
        // `sonic-time`, or it was killed) the reaped process's.
        let mut peak = reaped.max_rss_bytes;
        let mut reported = false;
        let mut ended = (reaped.exit_code, reaped.signal);
        if let Some(report) = &report {
            match read_usage(report) {
                Some(usage) => {
                    peak = usage.max_rss_kib.saturating_mul(1024);
                    reported = true;
                    if usage.exit_code.is_some() || usage.signal.is_some() {
                        ended = (usage.exit_code, usage.signal);
                    }
                }
                None => tracing::debug!(
                    report = %report.display(),
                    "no sonic-time report (killed?): the peak is the wrapper's ru_maxrss"
                ),
            }
            let _ = std::fs::remove_file(report);
            let _ = std::fs::remove_file(report.with_extension("tmp"));
        }
        let mut oom = false;
        if let Some(cg) = cgroup {
            if !reported {
                // No lambda's own figure: the group's peak (page cache included) is the best bound.
                match cg.peak() {
                    Ok(p) => peak = peak.max(p),
                    Err(e) => tracing::warn!(error = %e, "cannot read the cgroup peak"),
                }
            }
            oom = cg.oom_kills().map(|k| k > 0).unwrap_or(false);
        } else if peak > spec.memory_limit_bytes {
            // No kernel enforcement: a run over its limit is what a limit would have killed.
            oom = true;
            log.push_str(&format!(
                "sonic: peak RSS {} bytes exceeded the limit {} bytes\n",
                peak, spec.memory_limit_bytes
            ));
        }
        if !over_quota && quota != u64::MAX {
            // Between two looks of the watcher, or one file stopped at the limit by SIGXFSZ.
            let dir = vec![spec.output_dir.clone()];
            let used = tokio::task::spawn_blocking(move || tree_bytes(&dir, quota))
                .await
                .unwrap_or(0);
            over_quota = used > quota || ended.1 == Some(libc::SIGXFSZ);
        }
        let termination = if over_quota {
            log.push_str(&format!(
                "sonic: killed for writing more than its output quota of {quota} bytes\n"
            ));
            Termination::OutputQuotaExceeded
        } else if timed_out {
            log.push_str(&format!(
                "sonic: killed after its timeout of {:?}\n",
                spec.timeout
            ));
            Termination::TimedOut
        } else if oom {
            if cgroup.is_some() {
                log.push_str(&format!(
                    "sonic: killed for exceeding its memory limit of {} bytes\n",
                    spec.memory_limit_bytes
                ));
            }
            Termination::OutOfMemory
        } else if let (Some(code), _) = ended {
            Termination::Exited(code)
        } else {
            Termination::Signaled(ended.1.unwrap_or(0))
        };
        tracing::info!(
            run = %spec.run_id,
            ?termination,
            cold,
            duration_ms = duration.as_millis() as u64,
            start_us = start_latency.as_micros() as u64,
            peak_memory_bytes = peak,
            max_rss_bytes = reaped.max_rss_bytes,
            "process run ended"
        );
        Ok(RunOutcome {
            cpus: None,
            termination,
            cold,
            duration,
            start_latency,
            peak_memory_bytes: Some(peak),
            log,
            warm_idle: None,
            warm_seq: 0,
            start_contention: None,
        })
    }
}

/// The measuring wrapper of the `sonic-lambdas` package (`lambdas/src/bin/sonic-time.rs`).
const TIMER: &str = "sonic-time";

/// Stack of the threads that wait for a run and read its output (they keep little on it).
const THREAD_STACK: usize = 128 * 1024;

/// How a lambda ended and its peak, from a `sonic-time` report.
struct Usage {
    exit_code: Option<i32>,
    signal: Option<i32>,
    max_rss_kib: u64,
}

/// A `sonic-time` report (`{"exit_code": .., "signal": .., "max_rss_kib": N, ...}`).
fn read_usage(report: &std::path::Path) -> Option<Usage> {
    let text = std::fs::read(report).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let int = |k: &str| v.get(k).and_then(|x| x.as_i64()).map(|x| x as i32);
    Some(Usage {
        exit_code: int("exit_code"),
        signal: int("signal"),
        max_rss_kib: v.get("max_rss_kib")?.as_u64()?,
    })
}

/// `sonic-time` in the lambda folders, else beside the agent's own executable (the images and
/// cargo's target folder ship it there: an agent started without `--bin-dir` still measures its
/// lambdas with it), if it is there.
fn find_timer(dirs: &[PathBuf]) -> Option<PathBuf> {
    static OWN_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let own = OWN_DIR.get_or_init(|| {
        std::env::current_exe()
            .ok()?
            .parent()
            .map(Path::to_path_buf)
    });
    find_timer_in(dirs, own.as_deref())
}

fn find_timer_in(dirs: &[PathBuf], own_dir: Option<&Path>) -> Option<PathBuf> {
    dirs.iter()
        .map(PathBuf::as_path)
        .chain(own_dir)
        .map(|d| d.join(TIMER))
        .find(|p| p.is_file())
}

/// The executable `program` names, looked up in `path_var` as `execvp` would.
fn resolve_in(program: &str, path_var: &std::ffi::OsStr) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(path_var)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Everything a run's start needs, owned, for a blocking thread.
struct Launch {
    command: Vec<String>,
    env: Vec<(String, String)>,
    path_var: std::ffi::OsString,
    lambda_dirs: Vec<PathBuf>,
    /// Where `sonic-time` writes its report.
    report: PathBuf,
    env_dir: PathBuf,
    input_dir: PathBuf,
    output_dir: PathBuf,
    quota: u64,
    /// The memory cgroup to make: parent, name, limit.
    cgroup: Option<(PathBuf, String, u64)>,
    log_limit: usize,
    t0: Instant,
}

/// A started run: its process group (killed when this is dropped before the leader was reaped),
/// the thread that reaps it and the one that keeps its log's tail.
struct Started {
    pid: u32,
    group: sys::GroupGuard,
    waiter: tokio::sync::oneshot::Receiver<std::io::Result<sys::Reaped>>,
    log: tokio::sync::oneshot::Receiver<String>,
    /// `sonic-time`'s report, when it runs through it.
    report: Option<PathBuf>,
    start_latency: Duration,
}

enum Spawned {
    Running(Started),
    /// The command could not be started (exit status as a shell's, and why).
    NotStarted {
        code: i32,
        message: String,
    },
}

/// Runs `f` on a thread of its own; its result arrives on the receiver.
fn on_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx)
}

impl Launch {
    /// Makes the run's cgroup and starts its command (blocking). The cgroup comes back whatever
    /// happened, so that it is removed.
    fn start(self) -> (CgroupCleanup, Result<Spawned, SandboxError>) {
        let cgroup = match &self.cgroup {
            Some((parent, name, limit)) => match MemoryCgroup::create_v1(parent, name, *limit) {
                Ok(cg) => Some(cg),
                Err(e) => {
                    return (
                        CgroupCleanup(None),
                        Err(SandboxError::Runtime(format!(
                            "cannot create a cgroup: {e}"
                        ))),
                    );
                }
            },
            None => None,
        };
        let cleanup = CgroupCleanup(cgroup);
        let spawned = self.spawn(cleanup.0.as_ref());
        (cleanup, spawned)
    }

    /// Spawns the command with no work between fork and exec, so that std uses `posix_spawn`
    /// (vfork: no copy of this large process's page tables): through `sonic-time`, which sets
    /// the file size limit and joins the cgroup in its own small fork. Without `sonic-time` in
    /// the lambda folders, the command is started directly with those steps as `pre_exec` hooks,
    /// and std forks this whole process (tens of milliseconds for a process of hundreds of MB).
    fn spawn(&self, cgroup: Option<&MemoryCgroup>) -> Result<Spawned, SandboxError> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| SandboxError::InvalidSpec("empty command".into()))?;
        let (mut reader, writer) = std::io::pipe()?;
        let timer = find_timer(&self.lambda_dirs);
        let mut hooks_fd = None;
        let mut cmd = match &timer {
            Some(timer) => {
                let mut c = Command::new(timer);
                c.arg("--report").arg(&self.report);
                if self.quota != u64::MAX {
                    c.arg("--fsize").arg(self.quota.to_string());
                }
                if let Some(cg) = cgroup {
                    c.arg("--cgroup").arg(&cg.dir);
                }
                c.arg("--").arg(program);
                c
            }
            None => {
                // std looks a bare name up in the PATH below only by forking: resolve it here.
                let Some(exe) = resolve_in(program, &self.path_var) else {
                    return Ok(Spawned::NotStarted {
                        code: 127,
                        message: format!("sonic: cannot start {program:?}: not found\n"),
                    });
                };
                let mut c = Command::new(exe);
                if let Some(cg) = cgroup {
                    let tasks = std::fs::OpenOptions::new()
                        .write(true)
                        .open(cg.tasks_file())?;
                    sys::join_cgroup_before_exec(&mut c, tasks.as_raw_fd());
                    hooks_fd = Some(tasks);
                }
                if self.quota != u64::MAX {
                    sys::limit_file_size_before_exec(&mut c, self.quota);
                }
                c
            }
        };
        cmd.args(args)
            .env_clear()
            .env("PATH", &self.path_var)
            .env("HOME", &self.env_dir)
            .env("TMPDIR", &self.env_dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("SONIC_INPUT_DIR", &self.input_dir)
            .env("SONIC_OUTPUT_DIR", &self.output_dir)
            .current_dir(&self.env_dir);
        if let Some(cg) = cgroup {
            // A process the run hands its work to (a handler's warm Python runtime) joins the
            // run's memory group for it (docs/python.md).
            cmd.env("SONIC_MEMORY_CGROUP", &cg.dir);
        }
        cmd.stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .process_group(0);
        let spawned = cmd.spawn();
        // The parent's copies of the pipe's write end must go, or the log never ends.
        drop(cmd);
        drop(hooks_fd);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let code = match e.kind() {
                    std::io::ErrorKind::NotFound => 127,
                    std::io::ErrorKind::PermissionDenied => 126,
                    _ => {
                        return Err(SandboxError::Runtime(format!(
                            "cannot start {program:?}: {e}"
                        )));
                    }
                };
                return Ok(Spawned::NotStarted {
                    code,
                    message: format!("sonic: cannot start {program:?}: {e}\n"),
                });
            }
        };
        let start_latency = self.t0.elapsed();
        let pid = child.id();
        // Killed when dropped before its leader is reaped (the run was abandoned).
        let group = sys::GroupGuard::new(pid);
        let waiter = match on_thread("sonic-wait", group.waiter()) {
            Ok(w) => w,
            Err(e) => {
                group.kill();
                let _ = group.waiter()();
                return Err(SandboxError::Runtime(format!(
                    "cannot start a waiter thread: {e}"
                )));
            }
        };
        let log_limit = self.log_limit;
        let log = on_thread("sonic-log", move || {
            let mut tail = Tail::new(log_limit);
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => tail.push(&buf[..k]),
                }
            }
            tail.text()
        })
        .map_err(|e| {
            // The group is killed when `group` goes; the waiter reaps it.
            SandboxError::Runtime(format!("cannot start a log thread: {e}"))
        })?;
        Ok(Spawned::Running(Started {
            pid,
            group,
            waiter,
            log,
            report: timer.map(|_| self.report.clone()),
            start_latency,
        }))
    }
}

/// A run's environment; a run dropped midway leaves it in an unknown state, so it goes.
struct EnvLease {
    dir: Option<PathBuf>,
}

impl Drop for EnvLease {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            std::thread::spawn(move || {
                if let Err(e) = remove_tree(&dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an environment");
                }
            });
        }
    }
}

/// A run's cgroup, removed on drop by a thread of its own (removal waits for killed processes).
struct CgroupCleanup(Option<MemoryCgroup>);

impl Drop for CgroupCleanup {
    fn drop(&mut self) {
        if let Some(cg) = self.0.take() {
            std::thread::spawn(move || {
                if let Err(e) = cg.remove() {
                    tracing::warn!(error = %e, "cannot remove a run's cgroup");
                }
            });
        }
    }
}

#[async_trait::async_trait]
impl Sandbox for ProcessSandbox {
    fn kind(&self) -> &'static str {
        "process"
    }

    /// The image does not matter here; the program must resolve as a run would start it.
    async fn can_run(&self, _image: &str, program: &str) -> Result<(), String> {
        match self.resolve(program) {
            Some(p) if p.is_file() => Ok(()),
            _ => Err(format!(
                "command {program:?} is not found on its PATH or lambdas folder (process sandbox)"
            )),
        }
    }

    fn warm(&self) -> Option<usize> {
        Some(self.warm_environments())
    }

    fn prewarm_stats(&self) -> Option<PrewarmStats> {
        self.prewarm.lock().ok().map(|s| *s)
    }

    async fn run(&self, spec: RunSpec) -> Result<RunOutcome, SandboxError> {
        let t0 = Instant::now();
        validate(&spec)?;
        std::fs::create_dir_all(&spec.input_dir)?;
        std::fs::create_dir_all(&spec.output_dir)?;
        let (env_dir, cold) = self.acquire_env(&spec.warm_key)?;
        // Back to the key's idle ones when the run ends; removed when the run is dropped midway.
        let mut lease = EnvLease {
            dir: Some(env_dir.clone()),
        };
        let result = self.run_in(&spec, env_dir, cold, t0).await;
        // An environment whose run was killed (timeout, memory, quota, a signal) or broke its
        // containment is not reused, as the Docker sandbox's container: whatever it held (a
        // handler's warm Python runtime) went with the run, and the next run is cold.
        let reusable = match &result {
            Ok(outcome) => matches!(outcome.termination, Termination::Exited(_)),
            Err(_) => false,
        };
        if reusable && let Some(dir) = lease.dir.take() {
            self.release_env(&spec.warm_key, dir);
        }
        result.map(|mut outcome| {
            let (idle, seq) = self.idle_count(&spec.warm_key);
            outcome.warm_idle = Some(idle);
            outcome.warm_seq = seq;
            outcome
        })
    }

    /// A process environment is a private folder (`TMPDIR`, `HOME`, working directory) with the
    /// executable read once, so its pages are in the page cache.
    async fn prewarm(&self, spec: &RunSpec, count: usize) -> Result<(usize, usize), SandboxError> {
        validate(spec)?;
        let have = {
            let mut envs = self.envs()?;
            self.expire(&mut envs);
            envs.get(&spec.warm_key).map_or(0, Vec::len)
        };
        let missing = count.saturating_sub(have);
        if missing > 0
            && let Some(exe) = spec.command.first().and_then(|p| self.resolve(p))
        {
            let read = tokio::task::spawn_blocking(move || {
                std::fs::File::open(&exe)
                    .and_then(|mut f| std::io::copy(&mut f, &mut std::io::sink()))
            })
            .await;
            if let Ok(Err(e)) = read {
                tracing::debug!(error = %e, "cannot read the executable ahead of its run");
            }
        }
        for _ in 0..missing {
            let dir = self.new_env(&spec.warm_key)?;
            let env = WarmEnv {
                dir,
                last_used: Instant::now(),
                prewarmed: true,
            };
            self.envs()?
                .entry(spec.warm_key.clone())
                .or_default()
                .push(env);
        }
        if let Ok(mut stats) = self.prewarm.lock() {
            stats.started += missing as u64;
        }
        tracing::debug!(key = %spec.warm_key, started = missing, "process environments prewarmed");
        Ok((missing, have + missing))
    }

    async fn shutdown(&self) -> Result<(), SandboxError> {
        let dirs: Vec<PathBuf> = match self.envs.lock() {
            Ok(mut envs) => envs.drain().flat_map(|(_, v)| v).map(|e| e.dir).collect(),
            Err(_) => Vec::new(),
        };
        for d in dirs {
            remove_tree(&d)?;
        }
        Ok(())
    }
}

/// Checks what both sandboxes need of a spec.
pub(crate) fn validate(spec: &RunSpec) -> Result<(), SandboxError> {
    if spec.command.is_empty() || spec.command[0].is_empty() {
        return Err(SandboxError::InvalidSpec(format!(
            "run {}: empty command",
            spec.run_id
        )));
    }
    if spec.memory_limit_bytes == 0 {
        return Err(SandboxError::InvalidSpec(format!(
            "run {}: memory limit is zero",
            spec.run_id
        )));
    }
    if !(spec.cpus > 0.0 && spec.cpus.is_finite()) {
        return Err(SandboxError::InvalidSpec(format!(
            "run {}: cpus must be positive, got {}",
            spec.run_id, spec.cpus
        )));
    }
    if spec.timeout.is_zero() {
        return Err(SandboxError::InvalidSpec(format!(
            "run {}: timeout is zero",
            spec.run_id
        )));
    }
    if let Some((k, _)) = spec
        .env
        .iter()
        .find(|(k, _)| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(SandboxError::InvalidSpec(format!(
            "run {}: invalid environment variable name {k:?}",
            spec.run_id
        )));
    }
    Ok(())
}

/// A name made of `[a-zA-Z0-9_.-]`, at most `max` characters, for folders and container names.
pub(crate) fn sanitize(s: &str, max: usize) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect();
    if out.is_empty() { "x".to_string() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_is_looked_for_in_the_lambda_folders_then_beside_the_agent() {
        let lambdas = tempfile::tempdir().unwrap();
        let own = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        std::fs::write(own.path().join(TIMER), b"").unwrap();
        let dirs = vec![empty.path().to_path_buf()];
        assert_eq!(
            find_timer_in(&dirs, Some(own.path())),
            Some(own.path().join(TIMER))
        );
        assert_eq!(find_timer_in(&dirs, None), None);
        std::fs::write(lambdas.path().join(TIMER), b"").unwrap();
        let dirs = vec![empty.path().to_path_buf(), lambdas.path().to_path_buf()];
        assert_eq!(
            find_timer_in(&dirs, Some(own.path())),
            Some(lambdas.path().join(TIMER))
        );
    }

    fn spec() -> RunSpec {
        RunSpec {
            run_id: "j-1/f/0/1".into(),
            warm_key: "k".into(),
            image: String::new(),
            command: vec!["true".into()],
            env: vec![],
            input_dir: PathBuf::from("/in"),
            output_dir: PathBuf::from("/out"),
            memory_limit_bytes: 1 << 20,
            cpus: 1.0,
            timeout: Duration::from_secs(1),
            output_quota_bytes: u64::MAX,
            mounts: Vec::new(),
        }
    }

    #[test]
    fn specs_are_checked() {
        let check = |edit: fn(&mut RunSpec), expect: &str| {
            let mut s = spec();
            edit(&mut s);
            match validate(&s) {
                Ok(()) => assert!(expect.is_empty(), "expected an error with {expect:?}"),
                Err(e) => assert!(
                    !expect.is_empty() && e.to_string().contains(expect),
                    "{e} should contain {expect:?}"
                ),
            }
        };
        check(|_| {}, "");
        check(|s| s.command.clear(), "empty command");
        check(|s| s.memory_limit_bytes = 0, "memory limit");
        check(|s| s.cpus = 0.0, "cpus");
        check(|s| s.cpus = f64::NAN, "cpus");
        check(|s| s.timeout = Duration::ZERO, "timeout");
        check(|s| s.env = vec![("A=B".into(), "x".into())], "environment");
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize("j-1/f/0/1", 40), "j-1_f_0_1");
        assert_eq!(sanitize("", 40), "x");
        assert_eq!(sanitize("abcdef", 3), "abc");
    }
}
