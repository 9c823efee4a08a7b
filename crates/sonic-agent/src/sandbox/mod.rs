//! Sandboxes run one function instance each: a Docker container or a plain process, behind one trait.
//!
//! This file is the contract between the sandboxes and the agent; keep its names stable.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

mod cgroup;
pub mod docker;
mod fsutil;
pub mod process;
mod sys;

pub use docker::{DockerConfig, DockerSandbox};
pub use process::{CgroupMode, ProcessConfig, ProcessSandbox};

/// A number unique in this process: names containers, cgroups and folders, also when several
/// sandboxes (agents) share one process.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Environment starts in flight and begun: how many starts a cold run's shared the host with
/// (`sonic_api::agent::StartContention`).
#[derive(Debug, Default)]
pub(crate) struct StartGauge {
    in_flight: AtomicU32,
    begun: AtomicU64,
}

/// This process's starts, every sandbox and agent of it together (the agents one process runs
/// share its host and its cores).
pub(crate) static STARTS: StartGauge = StartGauge::new();

impl StartGauge {
    pub(crate) const fn new() -> StartGauge {
        StartGauge {
            in_flight: AtomicU32::new(0),
            begun: AtomicU64::new(0),
        }
    }

    /// Counts a start in until the ticket is dropped (so a start abandoned midway does not
    /// stay counted).
    pub(crate) fn begin(&self) -> StartTicket<'_> {
        let in_flight = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let begun = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        StartTicket {
            gauge: self,
            in_flight,
            begun,
        }
    }
}

/// One environment start in flight (a container's creation).
#[derive(Debug)]
pub(crate) struct StartTicket<'a> {
    gauge: &'a StartGauge,
    /// Starts in flight when this one began, itself included.
    in_flight: u32,
    /// The gauge's starts begun once this one began.
    begun: u64,
}

impl StartTicket<'_> {
    /// The starts that overlapped this one so far, its own included: those in flight when it
    /// began and those begun since.
    pub(crate) fn overlapping(&self) -> u32 {
        let since = self
            .gauge
            .begun
            .load(Ordering::SeqCst)
            .saturating_sub(self.begun);
        self.in_flight
            .saturating_add(u32::try_from(since).unwrap_or(u32::MAX))
    }
}

impl Drop for StartTicket<'_> {
    fn drop(&mut self) {
        self.gauge.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Everything a sandbox needs to run one function instance.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Unique id of this run (job, function, instance, attempt); names containers and logs.
    pub run_id: String,
    /// Instances with the same key may reuse one warm container: the agent keys them by the
    /// function's identity across jobs (or the job), image and command
    /// (`sonic_api::agent::RunRequest::warm_key`). Everything job-specific (environment, input
    /// and output folders) is the run's own; what the lambda leaves in its `/tmp` (`TMPDIR`)
    /// stays for the next run of the key, as in a warm AWS Lambda container.
    pub warm_key: String,
    /// Image for the Docker sandbox; ignored by the process sandbox.
    pub image: String,
    /// Executable and arguments.
    pub command: Vec<String>,
    /// Environment of the lambda, besides `SONIC_INPUT_DIR` and `SONIC_OUTPUT_DIR`, which the
    /// sandbox sets to where it exposes `input_dir` and `output_dir` to the lambda.
    pub env: Vec<(String, String)>,
    /// Host directory with the staged inputs (complete before the run: atomic visibility); read-only to the lambda.
    pub input_dir: PathBuf,
    /// Host directory the lambda writes its outputs into; empty at start.
    pub output_dir: PathBuf,
    /// Memory limit of the instance.
    pub memory_limit_bytes: u64,
    /// CPU limit in vCPUs (may be fractional).
    pub cpus: f64,
    /// Wall-clock limit; past it the instance is killed and reported as timed out.
    pub timeout: Duration,
    /// Most bytes the instance may write (its outputs, and in the Docker sandbox also its log);
    /// past it the instance is killed and reported as `OutputQuotaExceeded`. No single file may
    /// grow past it either (`RLIMIT_FSIZE`). `u64::MAX` for no quota.
    pub output_quota_bytes: u64,
    /// Host folders shown read-only to the instance, besides its input and output folders (a
    /// Python handler's code, runtime and environment): the Docker sandbox binds each at its
    /// `container` path; the process sandbox runs on the host, where the command names the host
    /// paths, and ignores them.
    pub mounts: Vec<Mount>,
}

/// A host folder bound read-only into an instance's container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mount {
    /// The folder on the host.
    pub host: PathBuf,
    /// Where the instance sees it: an absolute path outside `/sonic/in`, `/sonic/out` and the
    /// launcher's control folder.
    pub container: String,
}

/// How an instance ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "code")]
pub enum Termination {
    /// The command exited with this status (0 is success).
    Exited(i32),
    /// Killed by a signal other than the sandbox's own timeout or OOM kill.
    Signaled(i32),
    /// Killed for exceeding its memory limit.
    OutOfMemory,
    /// Killed for running past its timeout.
    TimedOut,
    /// Killed (or refused after it ended) for writing more than `output_quota_bytes`.
    OutputQuotaExceeded,
    /// The instance did something its sandbox forbids (e.g. wrote outside its output folder);
    /// what, in words. Its outputs are dropped.
    Violation(String),
}

/// What a sandbox measured about one run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunOutcome {
    pub termination: Termination,
    /// True when the instance needed a new container or process environment (cold start).
    pub cold: bool,
    /// Time from the request to the sandbox until the command ended, including the start.
    pub duration: Duration,
    /// Time from the request until the command was started (container creation for a cold start).
    pub start_latency: Duration,
    /// Peak memory of the instance in bytes, when it could be measured.
    pub peak_memory_bytes: Option<u64>,
    /// The last part of the instance's standard output and error (bounded).
    pub log: String,
    /// Once the run ended: the idle warm containers (environments) of its warm key and limits,
    /// its own included when it was kept, prewarmed ones not yet used left out (the next runs
    /// that start hot); `None` when the sandbox does not say.
    pub warm_idle: Option<usize>,
    /// Orders the `warm_idle` counts of this process's sandboxes: a count taken later has a
    /// larger number (taken under the pool's lock), so that reports read out of order are
    /// put back in order; 0 with no count.
    pub warm_seq: u64,
    /// A cold run whose environment this run started (a container created for it): the
    /// environment starts of this process that overlapped that one, its own included
    /// ([`StartTicket::overlapping`]), and the cores they shared; `None` for a hot run, a
    /// prewarmed container and the process sandbox.
    pub start_contention: Option<sonic_api::agent::StartContention>,
    /// The CPUs the run was given, where the sandbox limits them (Docker: the spec's, at most
    /// the engine's cores); `None` where it does not (processes).
    pub cpus: Option<f64>,
}

impl RunOutcome {
    pub fn succeeded(&self) -> bool {
        self.termination == Termination::Exited(0)
    }
}

/// Why a sandbox could not run an instance at all (as opposed to the instance failing).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    #[error("image {0} not found")]
    ImageNotFound(String),
    #[error("invalid run spec: {0}")]
    InvalidSpec(String),
    #[error("sandbox i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("sandbox runtime: {0}")]
    Runtime(String),
}

/// A place where function instances run.
#[async_trait::async_trait]
pub trait Sandbox: Send + Sync + std::fmt::Debug {
    /// `"docker"` or `"process"`.
    fn kind(&self) -> &'static str;
    /// Runs one instance to its end.
    async fn run(&self, spec: RunSpec) -> Result<RunOutcome, SandboxError>;
    /// Stops and removes warm containers or processes kept for reuse.
    async fn shutdown(&self) -> Result<(), SandboxError>;
    /// Warm containers (or process environments) kept for reuse and idle now, when the sandbox
    /// knows; for metrics.
    fn warm(&self) -> Option<usize> {
        None
    }
    /// Makes sure `count` containers (environments) for `spec`'s warm key and limits are warm
    /// and idle, starting the missing ones, so that the next runs of the key are hot. Only the
    /// key, image, command and limits of `spec` matter. Returns how many it started, and how
    /// many are idle for the key now. A sandbox that cannot prewarm starts none.
    async fn prewarm(&self, spec: &RunSpec, count: usize) -> Result<(usize, usize), SandboxError> {
        let _ = (spec, count);
        Ok((0, 0))
    }
    /// Whether it could start `program` of `image` now, and if not, why (a Docker image this
    /// engine lacks, a program this host does not have): asked when a DAG is applied. A sandbox
    /// that cannot tell says yes.
    async fn can_run(&self, image: &str, program: &str) -> Result<(), String> {
        let _ = (image, program);
        Ok(())
    }
    /// How many containers (environments) prewarming started, and how many of them a run used
    /// since the sandbox started, when the sandbox prewarms; for metrics.
    fn prewarm_stats(&self) -> Option<PrewarmStats> {
        None
    }
}

/// Prewarmed containers (environments): started, and taken by a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrewarmStats {
    pub started: u64,
    pub used: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start counts those in flight when it began and those begun while it ran, its own
    /// included; one that ended is no longer in flight.
    #[test]
    fn a_start_counts_the_starts_that_overlapped_it() {
        let gauge = StartGauge::new();
        let alone = gauge.begin();
        assert_eq!(alone.overlapping(), 1);
        drop(alone);
        let a = gauge.begin();
        let b = gauge.begin();
        assert_eq!((a.overlapping(), b.overlapping()), (2, 2));
        drop(a);
        let c = gauge.begin();
        // b saw a (in flight when it began) and c (begun since); c sees only b.
        assert_eq!((b.overlapping(), c.overlapping()), (3, 2));
        drop((b, c));
        assert_eq!(gauge.begin().overlapping(), 1);
    }
}
