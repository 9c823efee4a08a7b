//! The agent's HTTP API: what the control plane sends to an agent and what it gets back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/health` (no token).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Health {
    pub status: String,
    pub agent_id: String,
    pub version: String,
}

/// What a VM offers: `GET /v1/capacity`, and the body of the registration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Capacity {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub agent_id: String,
    /// The URL peers and the control plane reach this agent at.
    pub url: String,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub vm_type: String,
    #[schema(minimum = 1)]
    pub vcpus: u32,
    #[schema(minimum = 1)]
    pub memory_mb: u64,
    /// The VM type's nominal bandwidth (the agent's limit), megabits per second; `None` = unlimited.
    pub network_mbps: Option<f64>,
    /// `docker` or `process`.
    pub sandbox: String,
    /// Instances running now.
    pub running: u32,
    pub bandwidth: BandwidthReport,
}

/// Bandwidth the agent measured (exponentially weighted moving average over completed transfers).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default, ToSchema)]
pub struct BandwidthReport {
    pub egress_bps: Option<f64>,
    pub ingress_bps: Option<f64>,
    pub samples: u64,
}

/// A heartbeat: `POST {control}/v1/agents/{id}/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Heartbeat {
    pub agent_id: String,
    pub running: u32,
    pub bandwidth: BandwidthReport,
}

/// Where one input file of an instance comes from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", tag = "method")]
pub enum FileSource {
    /// `vm-storage`: a file of this job already on this agent (`file_path` in the job's namespace).
    VmStorage { file_path: String },
    /// `direct`: fetch from a peer agent's file server with a token the control plane issued.
    Direct {
        peer_url: String,
        file_path: String,
        token: String,
    },
    /// `remote`: download from the object store.
    Remote { key: String },
    /// `memory`: download from the in-memory tier (the agent's `memory_tier`).
    Memory { key: String },
}

/// One input to stage before an instance starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InputSpec {
    /// Path under the instance's input dir, e.g. `pca/0/data.bin` or `input/data.csv`.
    pub dest: String,
    pub source: FileSource,
    /// The size the sender reported: the agent refuses to start the instance unless the staged
    /// file has exactly this size (atomic visibility, checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_size: Option<u64>,
}

/// Where the outputs written for one downstream function (or `result`) go after the run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutputRoute {
    /// The top-level folder of the output dir: a downstream function's name, or `result`.
    pub to: String,
    /// Keep the files on this agent (for `vm-storage` and `direct` receivers).
    pub keep_local: bool,
    /// Also upload them under this object-store prefix (for `remote`, and for results).
    pub upload_prefix: Option<String>,
    /// Upload them under `upload_prefix` to the in-memory tier instead of the object store
    /// (`memory`); a file the tier refuses (full, too large, unreachable) goes to the store,
    /// and its [`OutputFile`] says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory: bool,
}

/// `POST /v1/runs`: run one function instance.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRequest {
    pub job_id: String,
    pub function: String,
    pub instance: u32,
    pub instances: u32,
    pub attempt: u32,
    /// Which execution of the job this run belongs to (a job runs again, from its input, without
    /// agents it lost): run ids differ across executions, so a late report of an abandoned
    /// execution is never taken for the new one's.
    #[serde(
        default = "first_execution",
        skip_serializing_if = "is_first_execution"
    )]
    pub execution: u32,
    /// The function's identity across jobs (`<dag>.<function>@<hash of its definition>`,
    /// [`function_key`]): runs with the same identity, image and command share the agent's warm
    /// containers (or process environments) across jobs. Absent (an older control plane): the
    /// job's id, so that only the runs of one job share them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_key: Option<String>,
    pub image: String,
    pub command: Vec<String>,
    /// Extra environment (the agent sets the ABI's `SONIC_*` variables itself).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are secrets (a DAG's `env: { VAR: { secret: NAME } }`):
    /// set like `env`, and the agent replaces each value in the run's log with `[secret VAR]`.
    #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
    pub secrets: SecretEnv,
    /// The job's parameters (`SONIC_PARAMS`).
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// `SONIC_FANOUT_<TO>` for shuffle senders: receiver name -> count.
    #[serde(default)]
    pub fanouts: BTreeMap<String, u32>,
    pub memory_limit_mb: u64,
    pub cpus: f64,
    pub timeout_ms: u64,
    #[serde(default)]
    pub inputs: Vec<InputSpec>,
    #[serde(default)]
    pub outputs: Vec<OutputRoute>,
    /// Most megabytes the instance may write; the agent's own quota (`output_quota_mb` of its
    /// configuration) applies when this is absent, and caps it when larger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_quota_mb: Option<u64>,
    /// Asks the agent to push its report when the run ends (the control plane waits for it
    /// rather than polling): `POST {base}/v1/agents/{agent_id}/runs/{run_id}/report` with the
    /// agents' token, where `base` is the agent's own `control_url` when it has one (where it
    /// joined, reachable across hosts), else this URL (the control plane's own, for agents it
    /// registered in one process). Absent: the control plane polls `GET /v1/runs/{run_id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_url: Option<String>,
    /// A function that runs an OpenLambda handler rather than `image` and `command` (both then
    /// empty): the agent fetches the lambda's tarball, checks it and runs `f(event)` through
    /// Sonic's Python runner under the file ABI (docs/python.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<HandlerRun>,
}

/// `POST /v1/runnable`: can this agent start these executables? (The control plane asks when a
/// DAG is applied, so that a missing image is said then rather than when a job runs.)
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunnableCheck {
    pub runnables: Vec<Runnable>,
}

/// One executable: an image and the program its command starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Runnable {
    pub image: String,
    /// The command's first word.
    pub program: String,
}

/// The answer to a [`RunnableCheck`]: those the agent cannot start, with why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct RunnableReport {
    pub missing: Vec<NotRunnable>,
}

/// An executable the agent cannot start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NotRunnable {
    pub image: String,
    pub program: String,
    pub why: String,
}

/// Environment variables whose values are secrets. Its `Debug` shows the names only, so that a
/// request logged whole never prints a value.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretEnv(pub BTreeMap<String, String>);

impl SecretEnv {
    /// No secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every secret's value replaced by `[secret VAR]`; values shorter than 4
    /// bytes are left alone (they would hide ordinary text and hide nothing worth hiding).
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        // The longest first: a value that holds another is replaced whole.
        let mut values: Vec<(&String, &String)> = self.0.iter().collect();
        values.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        for (var, value) in values {
            if value.len() >= 4 && out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[secret {var}]"));
            }
        }
        out
    }
}

impl std::fmt::Debug for SecretEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "<redacted>")))
            .finish()
    }
}

/// The OpenLambda handler a run calls: which code, where to get it, and how its return value
/// becomes the run's output files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HandlerRun {
    /// The lambda's name in the control plane's registry.
    pub name: String,
    /// The SHA-256 (64 lowercase hex digits) of the lambda's `.tar.gz`: the agent refuses a
    /// tarball with another digest, and caches the unpacked lambda by it.
    pub sha256: String,
    /// The tarball's key in the object store ([`handler_key`]).
    pub key: String,
    /// Per outgoing route (a receiver's name, and `result` for a last function): the edge kind
    /// (`one`, `broadcast`, `gather`, `scatter`, `shuffle`; `result` for `result`), which says how
    /// the returned value is written.
    #[serde(default)]
    pub routes: BTreeMap<String, String>,
}

/// Where the registry's tarball of digest `sha256` is kept in the object store.
pub fn handler_key(sha256: &str) -> String {
    format!("openlambda/{sha256}.tar.gz")
}

/// A SHA-256 digest as the handler fields carry it: 64 lowercase hex digits.
pub fn valid_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn first_execution() -> u32 {
    1
}

fn is_first_execution(n: &u32) -> bool {
    *n == 1
}

/// The longest function identity an agent takes ([`RunRequest::function_key`]).
pub const MAX_FUNCTION_KEY: usize = 256;

/// A function's identity across jobs: its DAG's name, its own name and a hash of its definition
/// (`definition`: the function as the control plane stores it, e.g. its JSON), so that a DAG
/// applied again with a changed function gets containers of its own.
pub fn function_key(dag: &str, function: &str, definition: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(definition);
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{dag}.{function}@{hash}")
}

/// Checks a function identity: at most [`MAX_FUNCTION_KEY`] bytes of printable ASCII.
pub fn check_function_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_FUNCTION_KEY {
        return Err(format!(
            "function_key must have 1 to {MAX_FUNCTION_KEY} bytes"
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("function_key must be printable ASCII without spaces".into());
    }
    Ok(())
}

impl RunRequest {
    /// What the agent's warm containers are keyed by, besides the limits: the function's
    /// identity (or, without one, the job), the image and the command.
    pub fn warm_key(&self) -> String {
        let identity = self.function_key.as_deref().unwrap_or(&self.job_id);
        match &self.handler {
            // A handler's code is its tarball: a new version gets environments of its own.
            Some(h) => warm_key(identity, &format!("handler:{}", h.sha256), &[]),
            None => warm_key(identity, &self.image, &self.command),
        }
    }

    /// The id of this run: one per (job, function, instance, attempt, execution), so a repeated
    /// request is idempotent and the control plane knows the id before the agent answers:
    /// `<job>.<function>.<instance>.<attempt>`, with `.x<execution>` after it from the second
    /// execution on.
    pub fn run_id(&self) -> String {
        let mut id = format!(
            "{}.{}.{}.{}",
            self.job_id, self.function, self.instance, self.attempt
        );
        if self.execution > 1 {
            id.push_str(&format!(".x{}", self.execution));
        }
        id
    }
}

/// The warm key of runs of `identity` (a function key, or a job id) with this image and command:
/// the same for [`RunRequest::warm_key`] and [`PrewarmRequest::warm_key`].
pub fn warm_key(identity: &str, image: &str, command: &[String]) -> String {
    format!("{identity}|{image}|{}", command.join("\u{1f}"))
}

/// The most files one fetch request may ask for.
pub const MAX_FETCH_FILES: usize = 10_000;

/// `POST /v1/fetches`: land a job's input files on this agent now, before the runs that read
/// them start. The control plane asks it once per stage and agent, with every `direct` and
/// `remote` input of the stage's instances there, so that the agent fetches all of them at the
/// stage's start, as the model prices it (a `direct` sender's VM is held until its receiver's
/// VM has fetched, not until the receiver's last batch starts). A run that reads a fetched file
/// later finds it in the job's namespace and copies nothing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FetchRequest {
    pub job_id: String,
    /// The files, `vm-storage` sources excepted (1 to [`MAX_FETCH_FILES`]).
    pub files: Vec<FileSource>,
}

/// `POST /v1/fetches` answer: every file landed, in the order asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FetchReport {
    pub files: Vec<FetchedFile>,
    /// The wall time of the whole fetch.
    pub seconds: f64,
}

/// One file of a [`FetchReport`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FetchedFile {
    pub bytes: u64,
    /// Seconds from the fetch's start until this file was on the agent.
    pub done_s: f64,
    /// As [`StagedInput::fetched`]: whether landing it paid the edge's copy to this agent.
    pub fetched: bool,
}

/// The most containers (or process environments) one prewarm request may ask for.
pub const MAX_PREWARM: u32 = 64;

/// `POST /v1/prewarm`: start `count` containers (Docker) or prepare `count` process environments
/// for the runs of one function, so that its next runs on this agent start hot. Limits must be
/// those of the runs to come (a warm container is reused only by runs with the same limits).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PrewarmRequest {
    /// The function's identity ([`RunRequest::function_key`]).
    pub function_key: String,
    pub image: String,
    pub command: Vec<String>,
    /// How many should be warm and idle for this key: the agent starts the missing ones only
    /// (1 to [`MAX_PREWARM`]; the agent also caps it at what its memory holds).
    pub count: u32,
    pub memory_limit_mb: u64,
    pub cpus: f64,
    /// As in [`RunRequest::output_quota_mb`] (absent: the agent's own quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_quota_mb: Option<u64>,
    /// A handler stage ([`RunRequest::handler`]): the agent also fetches its code, builds its
    /// environment and starts each instance's Python runtime, which imports `f.py`, so that the
    /// next runs neither start a runtime nor import. `image` and `command` are then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<HandlerRun>,
}

impl PrewarmRequest {
    /// The warm key the prewarmed containers serve: the one of the runs of this function.
    pub fn warm_key(&self) -> String {
        match &self.handler {
            Some(h) => warm_key(&self.function_key, &format!("handler:{}", h.sha256), &[]),
            None => warm_key(&self.function_key, &self.image, &self.command),
        }
    }
}

/// `POST /v1/prewarm` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Prewarmed {
    /// Containers (environments) started for this request.
    pub started: u32,
    /// Idle and warm for this key now, those just started included.
    pub warm: u32,
}

/// What an agent holds warm for a function once one of its runs ended: the next runs of the
/// function (same key and limits) on this agent that start hot. The control plane prices a
/// planned stage's first batch hot where its VMs hold enough (docs/model.md, warm starts).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct WarmIdle {
    /// Idle warm containers (process environments) of the run's warm key and limits, the run's
    /// own included when it was kept; prewarmed ones no run used yet are not counted (their
    /// first run still pays the function's initialization).
    pub idle: u32,
    /// How long the agent keeps an idle one after its last run (its `warm_idle_s`), seconds.
    pub keep_alive_s: u64,
    /// Orders the agent's counts: one taken later has a larger number, so that reports read
    /// out of order do not replace a newer count with an older one (0: not ordered).
    #[serde(default)]
    pub seq: u64,
}

/// How many environment starts shared the agent's host with a cold run's own start. Starting
/// a container is CPU-bound: `starts` of them on `cores` cores take about
/// [`StartContention::factor`] times as long as one alone (measured: the one Docker engine the
/// demo's four agents share on two cores started one container in 0.20 s, two at once in 0.24 s,
/// four in 0.5 s). The control plane learns the cold start without it (docs/model.md).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct StartContention {
    /// Environment starts by the agent's process that overlapped this run's, its own included
    /// (the agents one process runs share its host).
    pub starts: u32,
    /// The cores they shared: the Docker engine's CPUs (`docker info`'s `NCPU`; the agent
    /// process's own when the engine does not say).
    pub cores: u32,
}

impl StartContention {
    /// How many starts shared each core: `starts / cores`, at least 1 (a lone start, or no more
    /// starts than cores, runs at full speed).
    pub fn factor(&self) -> f64 {
        (f64::from(self.starts) / f64::from(self.cores.max(1))).max(1.0)
    }
}

/// How an instance ended, as the agent reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    /// The command exited non-zero or was killed.
    Failed,
    OutOfMemory,
    TimedOut,
    /// Inputs could not be staged or outputs not routed.
    Error,
    /// The run failed (as `failed` or `error` would say) with the agent's disk full: its
    /// filesystem refused a write (`ENOSPC`) or has next to no space left. The agent is no place
    /// for the job's next execution.
    DiskFull,
    /// The lambda could not be started at all, and another attempt cannot start it: its image
    /// is missing, its command was not found or is not executable (the sandbox said so, or the
    /// command exited 127 or 126, the shell's and the container runtime's words for it).
    Unrunnable,
}

/// One input as staged: how it came and what it cost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct StagedInput {
    pub dest: String,
    /// How it came: `vm-storage`, `direct` or `remote` on the wire.
    #[schema(schema_with = crate::schema::method)]
    pub method: sonic_core::model::Method,
    pub bytes: u64,
    pub seconds: f64,
    /// Whether staging it paid the edge's copy to this agent: a `direct` fetch, a `remote` GET
    /// (the only case the control plane counts as a store request), or a `direct` file this
    /// agent wrote itself whose network copy was charged to its emulated NIC (no request, no
    /// bytes moved); `false` when it was there already (`vm-storage`, fetched or charged for
    /// another instance on this agent, or written here without an emulated bandwidth). Absent
    /// from older agents: taken as `true`.
    #[serde(default = "fetched_by_default")]
    pub fetched: bool,
}

fn fetched_by_default() -> bool {
    true
}

/// One output file the instance wrote, where it now lives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct OutputFile {
    /// The file's path in the job namespace on this agent: `<function>/<instance>/<to>/<name>`.
    pub file_path: String,
    pub to: String,
    pub name: String,
    pub size: u64,
    pub checksum: String,
    /// The object key when it was uploaded.
    pub key: Option<String>,
    pub upload_seconds: Option<f64>,
    /// The upload went to the in-memory tier (`key` is the tier's), not the object store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_memory: bool,
    /// Asked for the in-memory tier, it went to the object store: why the tier refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spilled: Option<String>,
}

/// `GET /v1/runs/{run_id}`: the state or result of a run; also the body an agent pushes to
/// `POST {control}/v1/agents/{agent_id}/runs/{run_id}/report` when the run ends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RunReport {
    pub run_id: String,
    pub status: RunStatus,
    pub cold: Option<bool>,
    pub seconds: Option<f64>,
    pub start_latency_s: Option<f64>,
    /// A cold run whose container the agent started for it: how many starts shared the host
    /// with that one ([`StartContention`]); absent for a hot run, a prewarmed container, the
    /// process sandbox (a process spawns in a millisecond) and older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_contention: Option<StartContention>,
    /// The CPUs the run had, where its sandbox limits them: the request's `cpus`, at most what
    /// the host has (a Docker engine refuses more than its cores). Absent from the process
    /// sandbox (unlimited) and older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// A handler stage: the seconds the agent spent preparing its code before the sandbox
    /// started (fetching and unpacking the lambda's tarball, building its `requirements.txt`
    /// environment: once per version, or per requirements set, on an agent; about nothing
    /// after). Part of the instance's wall time, but neither its run nor the per-instance
    /// overhead the control plane learns. `None` for an executable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_s: Option<f64>,
    /// The warm environments of this run's function the agent holds once the run ended
    /// ([`WarmIdle`]); absent from an agent or sandbox that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmIdle>,
    pub peak_memory_mb: Option<f64>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    #[serde(default)]
    pub staged: Vec<StagedInput>,
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// The tail of the instance's standard output and error.
    #[serde(default)]
    pub log: String,
}

impl RunReport {
    /// A report of run `run_id` in `status` with nothing else said yet.
    pub fn new(run_id: String, status: RunStatus) -> RunReport {
        RunReport {
            cpus: None,
            run_id,
            status,
            cold: None,
            seconds: None,
            start_latency_s: None,
            start_contention: None,
            setup_s: None,
            warm: None,
            peak_memory_mb: None,
            exit_code: None,
            error: None,
            staged: Vec::new(),
            outputs: Vec::new(),
            log: String::new(),
        }
    }
}

/// `POST /v1/runs` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunAccepted {
    pub run_id: String,
}

/// Every error body of the agent and the control plane.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets are redacted from text, the longest first, never from short values; their
    /// `Debug` names them without their values; on the wire they are a plain map.
    #[test]
    fn secret_env_redacts_and_never_prints_values() {
        let s = SecretEnv(BTreeMap::from([
            ("TOKEN".to_owned(), "hunter2-long".to_owned()),
            ("PART".to_owned(), "hunter2".to_owned()),
            ("PIN".to_owned(), "42".to_owned()),
        ]));
        assert_eq!(
            s.redact("token hunter2-long, part hunter2, pin 42"),
            "token [secret TOKEN], part [secret PART], pin 42"
        );
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("TOKEN"),
            "{shown}"
        );
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["TOKEN"], "hunter2-long");
        assert_eq!(serde_json::from_value::<SecretEnv>(json).expect("back"), s);
    }

    /// As many starts as cores or fewer run at full speed; past that, they share the cores.
    #[test]
    fn start_contention_is_starts_per_core_at_least_one() {
        let f = |starts, cores| StartContention { starts, cores }.factor();
        assert_eq!((f(1, 2), f(2, 2), f(4, 2), f(3, 2)), (1.0, 1.0, 2.0, 1.5));
        assert_eq!((f(0, 2), f(3, 0)), (1.0, 3.0));
        let report: RunReport = serde_json::from_value(serde_json::json!({
            "run_id": "r", "status": "succeeded", "cold": true, "seconds": 0.5,
            "start_latency_s": 0.4, "start_contention": {"starts": 4, "cores": 2},
            "peak_memory_mb": 40.0, "exit_code": 0, "error": null,
        }))
        .expect("report");
        assert_eq!(
            report.start_contention,
            Some(StartContention {
                starts: 4,
                cores: 2
            })
        );
    }

    /// A handler stage's setup time travels with its report; a report without it (an
    /// executable's, or an older agent's) reads as none.
    #[test]
    fn setup_seconds_are_optional_in_a_report() {
        let mut v = serde_json::json!({
            "run_id": "r", "status": "succeeded", "cold": true, "seconds": 0.5,
            "start_latency_s": 0.01, "peak_memory_mb": 40.0, "exit_code": 0, "error": null,
        });
        let r: RunReport = serde_json::from_value(v.clone()).expect("report");
        assert_eq!(r.setup_s, None);
        assert!(
            serde_json::to_value(&r)
                .expect("json")
                .get("setup_s")
                .is_none()
        );
        v["setup_s"] = serde_json::json!(6.8);
        let r: RunReport = serde_json::from_value(v).expect("report");
        assert_eq!(r.setup_s, Some(6.8));
        assert_eq!(serde_json::to_value(&r).expect("json")["setup_s"], 6.8);
    }

    #[test]
    fn run_ids_differ_across_attempts_and_executions() {
        let body = serde_json::json!({
            "job_id": "j-1", "function": "map", "instance": 3, "instances": 4, "attempt": 2,
            "image": "i", "command": ["x"], "memory_limit_mb": 512, "cpus": 1.0,
            "timeout_ms": 1000,
        });
        // A request without `execution` (an older control plane) is the first execution's.
        let mut req: RunRequest = serde_json::from_value(body).expect("request");
        assert_eq!(req.execution, 1);
        assert_eq!(req.run_id(), "j-1.map.3.2");
        assert!(
            serde_json::to_value(&req)
                .expect("json")
                .get("execution")
                .is_none()
        );
        req.execution = 2;
        assert_eq!(req.run_id(), "j-1.map.3.2.x2");
        let again: RunRequest =
            serde_json::from_value(serde_json::to_value(&req).expect("json")).expect("request");
        assert_eq!(again.run_id(), "j-1.map.3.2.x2");
    }

    #[test]
    fn runs_of_one_function_share_a_warm_key_across_jobs() {
        let body = |job: &str, key: Option<&str>| {
            let mut v = serde_json::json!({
                "job_id": job, "function": "map", "instance": 0, "instances": 1, "attempt": 1,
                "image": "i", "command": ["x", "y"], "memory_limit_mb": 512, "cpus": 1.0,
                "timeout_ms": 1000,
            });
            if let Some(k) = key {
                v["function_key"] = k.into();
            }
            serde_json::from_value::<RunRequest>(v).expect("request")
        };
        let key = function_key("dag", "map", b"{\"image\":\"i\"}");
        assert!(key.starts_with("dag.map@") && key.len() == "dag.map@".len() + 16);
        assert!(check_function_key(&key).is_ok());
        assert_ne!(key, function_key("dag", "map", b"{\"image\":\"j\"}"));
        let (a, b) = (body("j-1", Some(&key)), body("j-2", Some(&key)));
        assert_eq!(a.warm_key(), b.warm_key());
        // Without an identity (an older control plane): per job, as before.
        assert_ne!(body("j-1", None).warm_key(), body("j-2", None).warm_key());
        let prewarm = PrewarmRequest {
            function_key: key.clone(),
            image: "i".into(),
            command: vec!["x".into(), "y".into()],
            count: 1,
            memory_limit_mb: 512,
            cpus: 1.0,
            output_quota_mb: None,
            handler: None,
        };
        assert_eq!(prewarm.warm_key(), a.warm_key());
        // A handler stage's prewarm serves the warm key of its runs.
        let handler = HandlerRun {
            name: "py".into(),
            sha256: "a".repeat(64),
            key: handler_key(&"a".repeat(64)),
            routes: BTreeMap::new(),
        };
        let mut run = body("j-1", Some(&key));
        run.handler = Some(handler.clone());
        let prewarm = PrewarmRequest {
            image: String::new(),
            command: Vec::new(),
            handler: Some(handler),
            ..prewarm
        };
        assert_eq!(prewarm.warm_key(), run.warm_key());
        assert_ne!(prewarm.warm_key(), a.warm_key());
        assert!(check_function_key("a b").is_err() && check_function_key("").is_err());
    }
}
