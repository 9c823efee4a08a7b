//! `POST /v1/agents/{id}/runs/{run_id}/report`: the route that hands a report an agent pushes to
//! the run's waiter ([`crate::exec::reports::Waiters`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sonic_api::agent::{ErrorBody, RunReport, RunStatus};

use crate::exec::reports::Refusal;
use crate::http::api::{ControlState, checked_agent_id, json_body};
use crate::http::error::ApiError;
use crate::http::openapi::{Id, RunId};

/// An agent pushes the report of a run that ended, to the executor waiting for it (the agents'
/// token, the join token or the API token opens it)
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/runs/{run_id}/report",
    operation_id = "reportRun",
    tag = "agents",
    params(Id, RunId),
    request_body = RunReport,
    responses(
        (status = 204, description = "taken: the waiting executor has the report"),
        (status = 400, description = "invalid JSON, agent id or run id; the body's run_id differs \
            from the path; status running", body = ErrorBody),
        (status = 403, description = "the run was sent to another agent", body = ErrorBody),
        (status = 404, description = "no run of that id waits for a report (unknown, stale \
            attempt, already reported), or the control plane runs no jobs", body = ErrorBody),
        (status = 413, description = "body over the size limit", body = ErrorBody),
    )
)]
pub(crate) async fn report_run(
    State(state): State<std::sync::Arc<ControlState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let Path((agent, run_id)) =
        path.map_err(|e| ApiError::BadRequest(format!("bad path: {}", e.body_text())))?;
    checked_agent_id(&agent)?;
    if run_id.is_empty() || run_id.len() > 512 {
        return Err(ApiError::BadRequest("invalid run id".into()));
    }
    let Some(rt) = state.jobs.as_ref() else {
        return Err(ApiError::NotFound("this control plane runs no jobs".into()));
    };
    let report: RunReport = match json_body(body, state.settings.max_body_bytes) {
        Ok(r) => r,
        Err(e) => {
            // The agent meant to report and could not: its waiter reads the report itself.
            rt.reports.nudge(&agent, &run_id);
            return Err(e);
        }
    };
    if report.run_id != run_id {
        rt.reports.nudge(&agent, &run_id);
        return Err(ApiError::BadRequest(
            "run_id in the body does not match the path".into(),
        ));
    }
    if report.status == RunStatus::Running {
        return Err(ApiError::BadRequest(
            "a pushed report says how the run ended: status running is not one".into(),
        ));
    }
    match rt.reports.deliver(&agent, &run_id, report) {
        Ok(()) => {
            state.metrics.report_received("push");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(Refusal::NotWaiting) => Err(ApiError::NotFound(format!(
            "no run {run_id} waits for a report (unknown, stale or already reported)"
        ))),
        Err(Refusal::OtherAgent) => Err(ApiError::Forbidden(format!(
            "run {run_id} was not sent to agent {agent}"
        ))),
    }
}
