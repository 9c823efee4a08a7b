//! The OpenLambda listener's glue: `POST /run/<dag-name>` runs a job of the DAG ([`DagCalls`]).

use std::sync::Arc;

use crate::http::api::ControlState;
use crate::http::error::ApiError;

/// `POST /run/<dag-name>` on the OpenLambda listener: a job of the DAG (its policy chosen as
/// for `POST /v1/jobs` without one) with the request's JSON as its input (`input/event.json`),
/// answered with the final function's result once the job ended.
pub struct DagCalls {
    state: std::sync::Weak<ControlState>,
}

impl DagCalls {
    /// Runs jobs on `state` (held weakly: the listener does not keep the control plane alive).
    pub fn new(state: &Arc<ControlState>) -> DagCalls {
        DagCalls {
            state: Arc::downgrade(state),
        }
    }
}

/// The largest result `POST /run/<dag-name>` answers with inline.
pub const MAX_INLINE_RESULT: u64 = 16 << 20;

impl sonic_openlambda::DagRunner for DagCalls {
    fn has_dag<'a>(&'a self, name: &'a str) -> sonic_openlambda::DagFuture<'a, bool> {
        Box::pin(async move {
            let Some(state) = self.state.upgrade() else {
                return false;
            };
            matches!(state.db.parsed_dag(name).await, Ok(Some(_)))
        })
    }

    fn run_dag<'a>(
        &'a self,
        name: &'a str,
        event: serde_json::Value,
    ) -> sonic_openlambda::DagFuture<'a, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let state = self
                .state
                .upgrade()
                .ok_or_else(|| "the control plane is stopping".to_owned())?;
            let body = serde_json::to_vec(&event).map_err(|e| e.to_string())?;
            let req = sonic_api::control::SubmitJob {
                revision: None,
                dag: name.to_owned(),
                input: Some(sonic_api::control::JobInput {
                    name: Some("event.json".into()),
                    base64: Some(crate::exec::requests::encode_base64(&body)),
                    key: None,
                }),
                params: serde_json::Map::new(),
                policy: None,
                planned: false,
                slo: None,
                slo_best_effort: false,
            };
            let accepted = crate::admission::submit(&state.ctx, req)
                .await
                .map_err(|e| format!("the job could not start: {}", api_message(e.into())))?;
            let id = accepted.job_id;
            let job = wait_ended(&state, &id).await?;
            if job.status != sonic_api::control::JobStatus::Succeeded {
                return Err(format!(
                    "job {id} {}: {}",
                    job.status,
                    job.error.unwrap_or_else(|| "no error recorded".into())
                ));
            }
            result_value(&state, &id).await
        })
    }
}

fn api_message(e: ApiError) -> String {
    use ApiError as E;
    match e {
        E::BadRequest(m)
        | E::Forbidden(m)
        | E::NotFound(m)
        | E::Conflict(m)
        | E::Unprocessable(m)
        | E::UnsupportedMediaType(m)
        | E::Unavailable(m) => m,
        E::InvalidDag(d) => d.to_string(),
        // Internal details stay in the log.
        other => {
            tracing::warn!(status = %other.status(), "a DAG call could not start");
            format!("{}", other.status())
        }
    }
}

/// Waits until job `id` ended (woken by its progress events, read from the database).
async fn wait_ended(state: &ControlState, id: &str) -> Result<crate::store::JobRecord, String> {
    let rx = state.jobs.as_ref().and_then(|rt| rt.subscribe(id));
    let mut rx = rx;
    loop {
        let lookup = id.to_owned();
        let job = state
            .db
            .run(move |db| db.get_job(&lookup))
            .await
            .map_err(|e| format!("database: {e}"))?
            .ok_or_else(|| format!("job {id} vanished"))?;
        if job.status.is_terminal() {
            return Ok(job);
        }
        match rx.as_mut() {
            Some(r) => {
                let changed =
                    tokio::time::timeout(std::time::Duration::from_millis(500), r.changed()).await;
                if matches!(changed, Ok(Err(_))) {
                    // The job's events ended: read its record from now on.
                    rx = None;
                }
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

/// The job's result: its one result object as JSON, or, when there are several or one that is
/// not JSON, `{"job_id", "results": {<key under result/>: <JSON value, or {"bytes": n}>}}`.
async fn result_value(state: &ControlState, id: &str) -> Result<serde_json::Value, String> {
    let rt = state
        .jobs
        .as_ref()
        .ok_or_else(|| "this control plane runs no jobs".to_owned())?;
    let prefix = format!("{}result/", crate::exec::requests::job_prefix(id));
    let objects = rt
        .store
        .list(&prefix)
        .await
        .map_err(|e| format!("cannot list the job's results: {e}"))?;
    let mut values = serde_json::Map::new();
    for o in &objects {
        let rel = o.key.strip_prefix(&prefix).unwrap_or(&o.key).to_owned();
        let value = if o.size <= MAX_INLINE_RESULT {
            let bytes = rt
                .store
                .get_bytes(&o.key)
                .await
                .map_err(|e| format!("cannot read the result {rel}: {e}"))?;
            serde_json::from_slice(&bytes).ok()
        } else {
            None
        };
        if objects.len() == 1
            && let Some(v) = value
        {
            return Ok(v);
        }
        values.insert(
            rel,
            value.unwrap_or_else(|| serde_json::json!({ "bytes": o.size })),
        );
    }
    Ok(serde_json::json!({ "job_id": id, "results": values }))
}
