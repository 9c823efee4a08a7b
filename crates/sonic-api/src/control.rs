//! The control plane's HTTP API: what `ofctl` and the agents send to the control plane and get back.
//!
//! Every error answer is an [`crate::agent::ErrorBody`] (`{"error": "..."}`); a refused DAG file
//! answers a [`DagErrorBody`], which has the same `error` field plus where the file is wrong.
//! Times are Unix milliseconds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sonic_core::model::Method;
use sonic_core::planner::Policy;
use utoipa::ToSchema;

use crate::agent::Capacity;

/// `GET /v1/health` (no token).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ControlHealth {
    /// `ok`, or `unavailable` when the database does not answer.
    pub status: String,
    pub version: String,
    /// The cluster's time dilation factor D (deploy/cluster.sh --dilation): the control plane
    /// plans with a catalog whose links and store are D times slower, and times it reports are
    /// in the cluster's dilated time (divide by D for the emulated ones). 1 when not dilated.
    #[serde(default = "one")]
    pub dilation: f64,
}

fn one() -> f64 {
    1.0
}

/// A stored DAG, as listed: `GET /v1/dags`, and the answer to `PUT`/`POST /v1/dags`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagSummary {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The function names, in a topological order.
    #[serde(default)]
    pub functions: Vec<String>,
    /// How many edges.
    #[serde(default)]
    pub edges: usize,
    /// 1 when first applied; grows by one each time a different file is applied under this name.
    pub revision: u64,
    /// What starts its jobs besides submissions (`triggers:`), one line each:
    /// `schedule <cron>` or `object_created <prefix>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggers: Vec<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// In the answer to an apply: what the agents said they cannot start of its functions
    /// (an image not on an agent's engine, a program not on its host), one line each; its jobs'
    /// runs placed there would fail `unrunnable`. Empty when all can, or none was asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `GET /v1/dags`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagList {
    pub dags: Vec<DagSummary>,
}

/// `GET /v1/dags/{name}`: the summary, the file as applied, and the checked DAG.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagDetail {
    #[serde(flatten)]
    pub summary: DagSummary,
    /// The YAML text exactly as it was applied.
    pub yaml: String,
    /// The checked DAG (`sonic_core::dag::Dag` as JSON).
    pub parsed: serde_json::Value,
    /// Every revision kept, in order (`GET /v1/dags/{name}?revision=N` shows one); the
    /// summary's `revision` is the one shown.
    #[serde(default)]
    pub revisions: Vec<u64>,
}

/// The 400 answer to a DAG file that is not valid: where and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagErrorBody {
    /// The whole message, `file:line:column: field: why`.
    pub error: String,
    pub file: String,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The field at fault (`functions[1].timeout`), empty for the whole document.
    pub field: String,
}

/// One registered agent: `GET /v1/agents`, and the answer to registration and heartbeats.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct AgentInfo {
    pub agent_id: String,
    pub url: String,
    pub vm_type: String,
    /// Whether its last heartbeat (or registration) is within the heartbeat timeout.
    pub alive: bool,
    pub registered_at_ms: i64,
    pub last_heartbeat_ms: i64,
    /// Milliseconds since the last heartbeat, by the control plane's clock.
    pub heartbeat_age_ms: i64,
    /// What it registered with; `running` and `bandwidth` as of its last heartbeat.
    pub capacity: Capacity,
}

/// `GET /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentInfo>,
    /// An agent silent for longer than this is not alive.
    pub heartbeat_timeout_ms: u64,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
}

/// How a job was run: `profiling` while the DAG's models have not converged, `planned` after.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobMode {
    Profiling,
    Planned,
}

/// A name on the wire that is not one of an enum's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.kind, self.name)
    }
}

impl std::error::Error for UnknownName {}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
        }
    }

    /// Succeeded or failed: nothing will change it any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed)
    }
}

impl FromStr for JobStatus {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "succeeded" => JobStatus::Succeeded,
            "failed" => JobStatus::Failed,
            _ => {
                return Err(UnknownName {
                    kind: "job status",
                    name: s.to_owned(),
                });
            }
        })
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobMode {
    pub fn as_str(self) -> &'static str {
        match self {
            JobMode::Profiling => "profiling",
            JobMode::Planned => "planned",
        }
    }
}

impl FromStr for JobMode {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "profiling" => JobMode::Profiling,
            "planned" => JobMode::Planned,
            _ => {
                return Err(UnknownName {
                    kind: "job mode",
                    name: s.to_owned(),
                });
            }
        })
    }
}

impl fmt::Display for JobMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one edge's data moved in a finished job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct EdgeRun {
    pub from: String,
    pub to: String,
    /// How it moved: `vm-storage`, `direct` or `remote` on the wire.
    #[schema(schema_with = crate::schema::method)]
    pub method: Method,
    pub bytes: u64,
    pub seconds: f64,
}

/// How one function instance ran in a finished job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FunctionRun {
    pub name: String,
    pub instance: u32,
    pub agent: String,
    pub vm_type: String,
    pub cold: bool,
    pub seconds: f64,
    /// Of `seconds`, from the hand-over to the sandbox to the lambda running: a container's
    /// (process environment's) creation when `cold` (absent in summaries recorded before it
    /// was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_latency_s: Option<f64>,
    /// How many container starts shared the engine's cores with this run's (its report's
    /// `start_contention`); the cold start is learned as if it had run alone on a core
    /// (docs/model.md). Absent when the agent did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_contention: Option<crate::agent::StartContention>,
    pub peak_memory_mb: Option<f64>,
    /// The CPUs it was given (its plan's `cores`; absent in summaries recorded before
    /// instances were sized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    pub attempts: u32,
    /// When the control plane sent the instance's first attempt, in seconds since the job
    /// started (absent in summaries recorded before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_s: Option<f64>,
    /// When its report came back, in seconds since the job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_s: Option<f64>,
    /// A retried job's instance that succeeded before the retry and was not run again: its
    /// outputs were reused, its times are those of its earlier run, and it cost nothing now
    /// (interfaces.md §7).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
}

/// A stage's inputs fetched onto one agent before the stage's first batch there (the receiving
/// VM's fetch of docs/model.md): agent work outside any instance's own run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FetchRun {
    /// The receiving stage.
    pub function: String,
    pub agent: String,
    /// When the fetch started and ended, seconds since the job started.
    pub started_s: f64,
    pub ended_s: f64,
    /// The bytes it brought.
    pub bytes: u64,
}

/// The job summary of interfaces.md (`ofctl run --wait -o json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobSummary {
    pub job_id: String,
    pub dag: String,
    pub status: JobStatus,
    #[schema(schema_with = crate::schema::policy)]
    pub policy: Policy,
    pub mode: JobMode,
    pub input_bytes: u64,
    pub latency_s: f64,
    /// Everything the job cost, USD: the VMs it held (and executions a lost agent made it
    /// discard), plus `storage_usd` and `requests_usd`.
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// Of `cost_usd`: keeping the job's intermediate files, on the agents' disks, in the
    /// object store and in the memory tier, from when each was written to the job's end
    /// (GB-seconds at the catalog's prices; the tier's per byte-second is its node's price over
    /// its capacity). 0 from older control planes.
    #[serde(default)]
    pub storage_usd: f64,
    /// Of `cost_usd`: the object store's requests on the DAG's edges, PUTs of the files sent
    /// `remote` and GETs of those fetched, at the catalog's prices per request (these do not
    /// grow with time). 0 from older control planes.
    #[serde(default)]
    pub requests_usd: f64,
    #[serde(default)]
    pub edges: Vec<EdgeRun>,
    #[serde(default)]
    pub functions: Vec<FunctionRun>,
    /// The stages' fetches, one per stage and agent that fetched (absent when none did, and in
    /// summaries recorded before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetches: Vec<FetchRun>,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When a run's failure failed the job: its kind (`exit`, `timeout`, `out_of_memory`,
    /// `error`, `disk_full`, `no_report`, `cancelled`, `refused`), so that a client can tell a
    /// lambda's own failure from its agent's without reading `error`. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::failure)]
    pub failure: Option<sonic_core::machine::Failure>,
    /// How a `sonic` job was planned and placed (absent for the other policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<JobPlan>,
    /// Why the job ran in its mode: the DAG's mode and why (its models converged; not yet; a
    /// drift sent it back to profiling), or the policy it was forced to. Absent from older
    /// control planes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_reason: Option<String>,
    /// The percentile objective the job was planned for (its own or its DAG's): `percentile`
    /// and `latency_s` (and `best_effort` when set); the plan report's `slo` says whether the
    /// plan's prediction met it. Absent when none applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::slo)]
    pub slo: Option<sonic_core::slo::Slo>,
    /// When the job was submitted, started running and ended, in milliseconds since the Unix
    /// epoch (the control plane's clock); absent until it did, and in summaries of older
    /// control planes. `latency_s` counts from its start (a resumed job's first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// The DAG's bounds a job that ended missed, in words (`latency 12.3 s over the DAG's
    /// max_latency 10 s`): it succeeded, but not within them. Empty when it met them or has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bounds_missed: Vec<String>,
    /// The revision of its DAG the job ran, kept through resume and retry whatever was applied
    /// since (absent for jobs recorded before revisions were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dag_revision: Option<u64>,
    /// The run of the DAG's `on_failure:` function after the job failed (absent when the DAG
    /// has none, or the job succeeded or was cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailureRun>,
    /// Every attempt that failed in the job's last execution, in the order they ended (those
    /// retried after, and the one that failed the job); `functions` lists the instances that
    /// succeeded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_attempts: Vec<FailedAttempt>,
}

/// A secret functions may name, as `GET /v1/secrets` lists it: never its value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct SecretView {
    pub name: String,
    /// Its value's size.
    pub bytes: u64,
    /// When it was set (a file's modification time), Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_ms: Option<i64>,
    /// `store` (`ofctl create secret`) or `file` (the control plane's `secrets_dir`).
    pub source: String,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretView>,
}

/// One attempt of an instance that failed (retried after, or the one that failed the job).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FailedAttempt {
    /// The function.
    pub name: String,
    pub instance: u32,
    /// Which attempt (1 the first).
    pub attempt: u32,
    /// The agent it ran on.
    pub agent: String,
    /// What kind of failure (`exit`, `timeout`, `out_of_memory`, ...).
    #[schema(schema_with = crate::schema::failure)]
    pub kind: sonic_core::machine::Failure,
    /// Why, in words (the log's tail included).
    pub error: String,
    /// When it was sent and when its failure came back, seconds from the job's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_s: Option<f64>,
}

/// The one run of a DAG's `on_failure:` function for a failed job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct OnFailureRun {
    /// The function's name.
    pub function: String,
    /// Whether it ran to a successful exit.
    pub succeeded: bool,
    /// The agent it ran on (empty when none could take it).
    pub agent: String,
    /// How long it ran, seconds.
    pub seconds: f64,
    /// Why it did not succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Which of the planner's plans a job ran (`best`, `second_best`, `none` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanUsed {
    /// The best plan.
    Best,
    /// The second-best plan: the resource manager could not grant a vm-storage placement of
    /// the best one.
    SecondBest,
    /// No plan: planning failed and the job profiled with `remote` instead.
    None,
}

impl PlanUsed {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanUsed::Best => "best",
            PlanUsed::SecondBest => "second_best",
            PlanUsed::None => "none",
        }
    }
}

impl std::fmt::Display for PlanUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The plan a planned job ran with, and what the resource manager granted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobPlan {
    /// Which plan ran.
    pub used: PlanUsed,
    /// Why: vm-storage refused, VM types substituted, VMs shared, planning errors.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The `ofctl plan -o json` document at this job's input size (`null` when `used` is `none`).
    pub report: Option<crate::plan::PlanReport>,
    /// Per stage, the agents the plan's VMs were mapped onto.
    #[serde(default)]
    pub stages: Vec<StageHosts>,
    /// Whether the plan is proven optimal: `false` when the planning budget stopped the search
    /// and the job runs the best plan found within it (`report.stopped` says which limit);
    /// absent when nothing was planned, or from a control plane that did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<bool>,
}

/// Where one stage of a planned job ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct StageHosts {
    pub function: String,
    /// The VM type the plan chose.
    pub vm_type: String,
    /// One agent id per VM of the plan (an agent appears several times when the plan wants more
    /// VMs of the type than are alive).
    pub agents: Vec<String>,
    /// Instances that run at once per VM.
    pub concurrent: u32,
    /// The memory limit each instance gets (from the predicted peak, with headroom).
    pub memory_limit_mb: u64,
    /// The plan priced its first batch hot: its agents kept enough warm containers of the
    /// function when the job was planned (a note says when the grant's agents do not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
}

/// One fitted model as `GET /v1/dags/{name}/models` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ModelView {
    /// `pca.memory_mb`, `pca.cold_s`, `pca.hot_s`, `pca.instances`, `pca->train.bytes`.
    pub parameter: String,
    /// The fitted polynomial in the input size `x` (bytes), `None` before the first fit.
    pub equation: Option<String>,
    pub degree: Option<usize>,
    /// Cross-validated mean absolute percentage error (0.12 = 12%).
    pub cv_mape: Option<f64>,
    pub samples: usize,
    pub converged: bool,
}

/// `GET /v1/dags/{name}/models`: what Sonic learned about a DAG. Models are learned per
/// parameter setting (the values of the job parameters that change the work, docs/model.md);
/// the top level is the setting of a job with the DAG's default parameters, `settings` lists
/// every setting learned.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagModelsView {
    pub dag: String,
    /// The setting the top level describes: its canonical key (`{"trees":6}`; empty for a DAG
    /// without work parameters, and for what was learned before settings existed).
    #[serde(default)]
    pub setting: String,
    /// That setting's work parameter values.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Every setting with models, each profiled, converged and watched for drift on its own
    /// (absent from older control planes).
    #[serde(default)]
    pub settings: Vec<SettingModelsView>,
    /// Every model converged: jobs without a forced policy run planned (`sonic`).
    pub converged: bool,
    /// The convergence threshold on the cross-validated MAPE (0.15 by default).
    pub max_mape: f64,
    /// Jobs whose measurements were added.
    pub jobs: usize,
    pub models: Vec<ModelView>,
    /// The samples the models are fitted on: one per finished job (since a drift, the jobs from
    /// the first drifting one on).
    #[serde(default)]
    pub samples: Vec<serde_json::Value>,
    /// How the DAG's unforced jobs run and why (absent from older control planes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DagModeView>,
}

/// One parameter setting's models and mode in the models view.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct SettingModelsView {
    /// Its canonical key (`{"trees":12}`).
    pub setting: String,
    /// For people: `trees=12`, or `no parameters`.
    pub label: String,
    /// Its work parameter values.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Every model converged.
    pub converged: bool,
    /// Jobs of this setting whose measurements were added.
    pub jobs: usize,
    pub models: Vec<ModelView>,
    /// How this setting's unforced jobs run and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DagModeView>,
}

/// A DAG's mode: profiling until its models converge, then planned until a drift (docs/model.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DagModeView {
    /// How its next unforced job runs.
    pub mode: JobMode,
    /// Why, in a sentence (a drift names the parameter, its measured and predicted values and
    /// the jobs).
    pub reason: String,
    /// When it entered this mode, Unix ms.
    pub since_ms: i64,
    /// The job whose sample changed the mode, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_job: Option<String>,
    /// The models are fitted on this job's sample and later ones (after a drift).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted_from: Option<String>,
    /// Times the DAG drifted back to profiling.
    pub drifts: u32,
    /// Parameters off their prediction in the latest planned jobs (a drift once one is off in
    /// `drift_jobs` jobs in a row).
    #[serde(default)]
    pub watch: Vec<DriftWatch>,
    /// The drift rule: relative error beyond which a parameter is off.
    pub drift_error: f64,
    /// The drift rule: consecutive planned jobs a parameter must be off in.
    pub drift_jobs: usize,
}

/// A parameter off its prediction in the latest planned jobs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DriftWatch {
    pub parameter: String,
    /// In the latest of them.
    pub predicted: f64,
    pub measured: f64,
    /// `|measured - predicted| / max(|predicted|, floor)`.
    pub error: f64,
    /// Consecutive planned jobs it was off in.
    pub jobs: usize,
}

/// One event of `GET /v1/jobs/{id}/events` (server-sent events, `data:` is this JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobEvent {
    pub job_id: String,
    pub status: JobStatus,
    /// The function of the stage running, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Instances finished and in all, over the whole job (0 of 0 before planning).
    pub done_instances: u32,
    pub total_instances: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One instance's log lines, as `GET /v1/jobs/{id}/logs[?function=F]` returns them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct InstanceLog {
    pub function: String,
    pub instance: u32,
    pub attempt: u32,
    pub agent: String,
    /// What the lambda wrote on stderr (and stdout), truncated by the agent.
    pub log: String,
}

/// `GET /v1/jobs/{id}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobLogs {
    pub job_id: String,
    pub logs: Vec<InstanceLog>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_summary_reads_the_interfaces_example() {
        let text = r#"{
          "job_id": "j-1", "dag": "ml-pipeline", "status": "succeeded",
          "policy": "sonic", "mode": "planned",
          "input_bytes": 200000000,
          "latency_s": 31.2, "cost_usd": 0.0013, "perf_per_dollar": 24600.0,
          "edges": [ { "from": "pca", "to": "train", "method": "direct", "bytes": 4800000000, "seconds": 2.1 } ],
          "functions": [ { "name": "train", "instance": 0, "agent": "a-2", "vm_type": "m5.large",
                           "cold": true, "seconds": 12.7, "peak_memory_mb": 2411, "attempts": 1 } ],
          "outputs": [ "s3://sonic/jobs/j-1/result/model.json" ]
        }"#;
        let s: JobSummary = serde_json::from_str(text).expect("parse");
        assert_eq!(s.status, JobStatus::Succeeded);
        assert_eq!(s.mode, JobMode::Planned);
        assert_eq!(s.edges[0].bytes, 4_800_000_000);
        assert_eq!(s.functions[0].peak_memory_mb, Some(2411.0));
        let back = serde_json::to_value(&s).expect("serialize");
        assert!(back.get("error").is_none(), "no error field on success");
    }

    #[test]
    fn names_round_trip() {
        for s in [
            JobStatus::Queued,
            JobStatus::Running,
            JobStatus::Succeeded,
            JobStatus::Failed,
        ] {
            assert_eq!(s.as_str().parse::<JobStatus>(), Ok(s));
            assert_eq!(serde_json::to_value(s).expect("json"), s.as_str());
        }
        for m in [JobMode::Profiling, JobMode::Planned] {
            assert_eq!(m.as_str().parse::<JobMode>(), Ok(m));
        }
        assert!("done".parse::<JobStatus>().is_err());
    }

    #[test]
    fn a_job_plan_without_exact_still_reads_and_none_is_not_written() {
        let old = r#"{"used": "best", "notes": [], "report": null, "stages": []}"#;
        let p: JobPlan = serde_json::from_str(old).expect("parse");
        assert_eq!(p.exact, None);
        assert!(
            serde_json::to_value(&p)
                .expect("json")
                .get("exact")
                .is_none()
        );
        let cut = JobPlan {
            exact: Some(false),
            ..p
        };
        let v = serde_json::to_value(&cut).expect("json");
        assert_eq!(v["exact"], false);
        assert_eq!(serde_json::from_value::<JobPlan>(v).expect("parse"), cut);
    }
}

/// Where a cluster's `remote` files live, as the control plane tells a joining agent (the agent's
/// own store setting, if any, wins).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreSpec {
    /// An S3-compatible endpoint.
    S3 {
        endpoint: String,
        region: String,
        bucket: String,
        access_key: String,
        secret_key: String,
        /// How long an outage of the store is waited out before an operation fails (the
        /// control plane's own setting, so that agents and control plane agree).
        #[serde(default = "default_outage_window_ms")]
        outage_window_ms: u64,
    },
    /// A folder: only agents on the control plane's machine can use it.
    Local { root: String },
}

fn default_outage_window_ms() -> u64 {
    30_000
}

impl fmt::Debug for StoreSpec {
    // Hand-written so the secret key never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreSpec::S3 {
                endpoint, bucket, ..
            } => f
                .debug_struct("S3")
                .field("endpoint", endpoint)
                .field("bucket", bucket)
                .field("secret_key", &"<redacted>")
                .finish(),
            StoreSpec::Local { root } => f.debug_struct("Local").field("root", root).finish(),
        }
    }
}

/// What a joining agent needs to take part in jobs, handed out at registration to an agent that
/// presented the join token (or the API token).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinSecrets {
    /// The bearer token the control plane presents on every call to an agent.
    pub agent_token: String,
    /// The key of the HMAC file tokens of `direct` transfers.
    pub file_key: String,
    /// Where `remote` files go.
    pub store: Option<StoreSpec>,
    /// Where `memory` files go: the in-memory tier's URL (`redis://host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_tier: Option<String>,
}

impl fmt::Debug for JoinSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSecrets")
            .field("agent_token", &"<redacted>")
            .field("file_key", &"<redacted>")
            .field("store", &self.store)
            // A URL may carry a password.
            .field(
                "memory_tier",
                &self.memory_tier.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The answer to `POST /v1/agents/register`: the agent's record and, from a control plane that
/// runs jobs, what the agent needs to take part in them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Joined {
    #[serde(flatten)]
    pub agent: AgentInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinSecrets>,
}

/// `POST /v1/jobs`: run a DAG.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    /// The name of an applied DAG.
    pub dag: String,
    /// The job's input; none for a DAG whose first functions read nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<JobInput>,
    /// Overrides of the DAG's parameters.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Forces `remote`, `direct`, `local` or `sonic`. Without it: `sonic` (planned) once the
    /// DAG's models converged, `remote` (profiling) before.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "forced_policy"
    )]
    #[schema(schema_with = crate::schema::policy)]
    pub policy: Option<Policy>,
    /// With a forced `remote`, `direct` or `local`: place the job the way the planner places
    /// that baseline (the paper's OpenLambda+S3, direct passing, SAND: VM types chosen by the
    /// models' predicted memory, lambdas per VM, the whole job on one VM for `local`) and run it
    /// through the control plane's resource manager, mode `planned`. Without it a forced policy spreads the
    /// instances over the agents (mode `profiling`). Needs models that predict (409 otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub planned: bool,
    /// A percentile objective on the job's latency (interfaces.md §6), overriding its DAG's
    /// `slo`: `{"percentile": 95, "latency_s": 20.0}`. A job that cannot meet it is refused
    /// before it runs (422) unless `slo_best_effort`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "checked_slo"
    )]
    #[schema(schema_with = crate::schema::slo)]
    pub slo: Option<sonic_core::slo::Slo>,
    /// Where no plan meets the objective (the job's or its DAG's), run the plan with the lowest
    /// percentile latency instead of refusing the job.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slo_best_effort: bool,
    /// Runs this revision of the DAG instead of the one applied last (`ofctl run --revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// A submission's objective, checked as it is read (a percentile from 50 to 99.9, a latency
/// more than 0).
fn checked_slo<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<sonic_core::slo::Slo>, D::Error> {
    let slo: Option<sonic_core::slo::Slo> = Option::deserialize(d)?;
    slo.map(|s| s.checked().map_err(serde::de::Error::custom))
        .transpose()
}

/// A submission's policy, read by its name: a name that is not one refuses the submission,
/// saying which are ("unknown policy ...").
fn forced_policy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Policy>, D::Error> {
    let name: Option<String> = Option::deserialize(d)?;
    name.map(|n| n.parse::<Policy>().map_err(serde::de::Error::custom))
        .transpose()
}

/// The job input: inline bytes (`base64`) or an object already in the store (`key`); the first
/// functions see it as `input/<name>`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobInput {
    /// The file name under `input/` (default `input`, or the key's last segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The file's bytes, base64 (standard alphabet, padded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// The key of an object already in the cluster's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// The 202 answer to a submitted job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobAccepted {
    /// The new job's id (`j-...`).
    pub job_id: String,
    /// `queued` on acceptance.
    pub status: JobStatus,
}
