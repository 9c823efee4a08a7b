//! A DAG's `on_failure:` function (interfaces.md §7): run once when one of its jobs fails, on
//! an alive agent, with the failure's context as its one input, `input/failure.json`:
//!
//! ```json
//! {"job_id": "j-...", "dag": "etl", "dag_revision": 3, "error": "function train instance 2 failed after 3 attempts: ...",
//!  "function": "train", "instance": 2, "kind": "exit", "params": {...}}
//! ```
//!
//! Its log is the job's like any function's (`ofctl logs JOB NAME`); what it writes is not kept;
//! how it ended is the summary's `on_failure`. It is tried once: a hook that fails does not
//! change how the job ended, and a job cancelled by its user runs none.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use sonic_api::agent::{FileSource, InputSpec, RunRequest, RunStatus};
use sonic_api::control::OnFailureRun;
use sonic_core::dag::{Dag, Function};
use tokio_util::sync::CancellationToken;

use super::requests::{DEFAULT_MEMORY_MB, job_prefix};
use super::{Context, Runtime, alive_agents, attempt_once, describe, keep_log};
use crate::store::{AgentSlot, JobRecord};

/// What the `on_failure` function is told of the failure.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FailureContext {
    pub job_id: String,
    pub dag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dag_revision: Option<u64>,
    /// The job's error, as its summary says it.
    pub error: String,
    /// The function whose run failed the job, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<u32>,
    /// The kind of that run's failure (`exit`, `timeout`, `out_of_memory`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<sonic_core::machine::Failure>,
    /// The job's parameters (the DAG's, overridden by the job's).
    pub params: BTreeMap<String, serde_json::Value>,
}

/// The name of the input file the function reads its context from (under `input/`).
pub const CONTEXT_FILE: &str = "failure.json";

/// Runs `dag`'s `on_failure` function for `job`, once, and says how it went; `None` when the
/// DAG has none. The agent it ran on is returned too, for the job's cleanup.
pub(super) async fn run(
    state: &Arc<Context>,
    rt: &Arc<Runtime>,
    job: &JobRecord,
    dag: &Dag,
    context: &FailureContext,
) -> Option<(OnFailureRun, Option<AgentSlot>)> {
    let f = dag.on_failure.as_ref()?;
    tracing::info!(job = %job.id, function = %f.name, "the job failed: running its DAG's on_failure function");
    let started = Instant::now();
    let outcome = attempt(state, rt, job, dag, f, context).await;
    let seconds = started.elapsed().as_secs_f64();
    let (succeeded, agent, error) = match outcome {
        Ok((agent, None)) => (true, Some(agent), None),
        Ok((agent, Some(e))) => (false, Some(agent), Some(e)),
        Err(e) => (false, None, Some(e)),
    };
    if let Some(e) = &error {
        tracing::warn!(job = %job.id, function = %f.name, error = %e, "the on_failure function failed");
    }
    let run = OnFailureRun {
        function: f.name.clone(),
        succeeded,
        agent: agent.as_ref().map(|a| a.id.clone()).unwrap_or_default(),
        seconds,
        error,
    };
    Some((run, agent))
}

/// One attempt: `Err` when it could not be sent, else the agent and the run's failure if any.
async fn attempt(
    state: &Arc<Context>,
    rt: &Arc<Runtime>,
    job: &JobRecord,
    dag: &Dag,
    f: &Function,
    context: &FailureContext,
) -> Result<(AgentSlot, Option<String>), String> {
    let body = serde_json::to_vec_pretty(context).map_err(|e| e.to_string())?;
    let size = body.len() as u64;
    let key = format!("{}on_failure/{CONTEXT_FILE}", job_prefix(&job.id));
    rt.store
        .put_bytes(&key, Bytes::from(body))
        .await
        .map_err(|e| format!("cannot store its input: {e}"))?;
    // A handler runs as it would in the DAG.
    let handler = match &f.handler {
        None => None,
        Some(_) => {
            let alone = Dag {
                functions: vec![f.clone()],
                edges: Vec::new(),
                on_failure: None,
                ..dag.clone()
            };
            super::handlers::resolve(rt, &alone).await?.remove(&0)
        }
    };
    // Its secrets, as the DAG's functions get theirs.
    let secrets = if f.secrets.is_empty() {
        Default::default()
    } else {
        let (dir, needed) = (
            rt.config.secrets_dir.clone(),
            f.secrets.values().cloned().collect(),
        );
        let values = state
            .db
            .run(move |db| Ok(super::secrets::resolve(db, dir.as_deref(), &needed)))
            .await
            .map_err(|e| format!("database: {e}"))??;
        super::secrets::env_of(f, &values)
    };
    // An alive agent: it holds one slot of it, like any unplanned run.
    let agent = alive_agents(state)
        .await
        .into_iter()
        .next()
        .ok_or("no alive agent to run it on")?;
    let request = RunRequest {
        job_id: job.id.clone(),
        function: f.name.clone(),
        instance: 0,
        instances: 1,
        attempt: 1,
        execution: 1,
        function_key: None,
        image: f.image.clone(),
        command: f.command.clone(),
        env: f.env.clone(),
        secrets,
        params: context
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        fanouts: BTreeMap::new(),
        memory_limit_mb: DEFAULT_MEMORY_MB,
        cpus: 1.0,
        timeout_ms: (f.timeout_s * 1000.0) as u64,
        inputs: vec![InputSpec {
            dest: format!("input/{CONTEXT_FILE}"),
            source: FileSource::Remote { key },
            expected_size: Some(size),
        }],
        outputs: Vec::new(),
        output_quota_mb: None,
        report_url: None,
        handler,
    };
    let slot = tokio::time::timeout(
        Duration::from_secs(60),
        rt.resources.slot(&job.id, &agent, request.memory_limit_mb),
    )
    .await;
    let _slot = match slot {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("agent {}: {e}", agent.id)),
        Err(_) => return Err(format!("agent {} had no free slot within 60 s", agent.id)),
    };
    let outcome = attempt_once(state, rt, &agent, &request, &CancellationToken::new()).await;
    let (log, error) = match outcome {
        Ok(report) if report.status == RunStatus::Succeeded => (report.log, None),
        Ok(report) => (report.log.clone(), Some(describe(&report))),
        Err(e) => (
            format!("[sonic-control] no report from agent {}: {e}\n", agent.id),
            Some(e.to_string()),
        ),
    };
    keep_log(state, &request, &agent, log).await;
    Ok((agent, error))
}
