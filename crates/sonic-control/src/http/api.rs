//! The control plane's HTTP API: the route table, the token check, request metrics and the handlers.
//!
//! The route table ([`routes`]) is the one list the router is built from; the OpenAPI document and
//! the tests walk the same list, so a route cannot exist without being documented and guarded.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sonic_api::agent::{Capacity, ErrorBody, Heartbeat};
use sonic_api::control::{
    AgentInfo, AgentList, ControlHealth, DagDetail, DagErrorBody, DagList, DagModelsView,
    DagSummary, JobEvent, JobLogs, JobStatus, JobSummary, Joined, SecretList,
};
use sonic_api::plan::PlanReport;
use sonic_core::dag::Dag;
use sonic_core::setting::Setting;
use sonic_daemon::routes::{Route, RouteTable};
use utoipa::{IntoParams, ToSchema};

pub(crate) use crate::admission::checked_dag_name;
use crate::admission::{self, job_record};
use crate::clock::Clock;
use crate::exec::requests::Policy;
use crate::exec::{Context, Runtime};
use crate::http::error::ApiError;
use crate::http::openapi::{DagName, Id, ResultKey, SecretName};
use crate::metrics::{self, Gauges};
use crate::store::{AgentRecord, Applied, DagRecord, Db, JobRecord};

/// What the handlers read from the configuration.
#[derive(Clone)]
pub struct Settings {
    /// The bearer token every route but health requires.
    pub token: String,
    /// The secret agents may present instead on the agent routes (registration, heartbeats);
    /// empty: none.
    pub join_token: String,
    /// An agent that has not been heard from for this long is not alive.
    pub heartbeat_timeout: Duration,
    /// The largest request body accepted, bytes.
    pub max_body_bytes: usize,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("token", &"<redacted>")
            .field("join_token", &"<redacted>")
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

/// Everything the handlers share: the domain's [`Context`] (read through `Deref`: `state.db`,
/// `state.jobs`, ...) and what only the API needs.
#[derive(Debug)]
pub struct ControlState {
    /// What admission and the executor share.
    pub ctx: Arc<Context>,
    /// Tokens and limits of the API.
    pub settings: Settings,
    /// What the web dashboard keeps (whether cookies must be `Secure`).
    pub dashboard: crate::http::dashboard::DashboardState,
}

impl std::ops::Deref for ControlState {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.ctx
    }
}

impl ControlState {
    /// A state that refuses jobs (no [`Runtime`]): the registries and the API only.
    pub fn new(db: Db, clock: Arc<dyn Clock>, settings: Settings) -> Arc<ControlState> {
        ControlState::with_jobs(db, clock, settings, None)
    }

    /// A state that can run jobs with `jobs`.
    pub fn with_jobs(
        db: Db,
        clock: Arc<dyn Clock>,
        settings: Settings,
        jobs: Option<Arc<Runtime>>,
    ) -> Arc<ControlState> {
        let ctx = Context::new(db, clock, settings.heartbeat_timeout, jobs);
        Arc::new(ControlState {
            ctx: Arc::new(ctx),
            settings,
            dashboard: crate::http::dashboard::DashboardState::default(),
        })
    }
}

/// Who may call an API route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (health).
    Public,
    /// `Authorization: Bearer <token>`, the API token.
    Token,
    /// The routes agents call: the API token, the join token or the agents' token.
    Agents,
}

impl Access {
    /// Whether the route requires a token (every route but health).
    pub fn needs_token(self) -> bool {
        self != Access::Public
    }
}

/// One route of the API.
pub type RouteInfo = Route<Access>;

type Shared = Arc<ControlState>;

/// The route table: each route once, with its guard and its handler.
fn table() -> RouteTable<Shared, Access> {
    use Access::{Agents, Public, Token};
    RouteTable::new()
        .route(Method::GET, "/v1/health", Public, health)
        .route(Method::GET, "/v1/openapi.json", Token, openapi)
        .route(Method::GET, "/metrics", Token, render_metrics)
        .route(Method::GET, "/v1/dags", Token, list_dags)
        .route(Method::PUT, "/v1/dags", Token, apply_dag)
        .route(Method::POST, "/v1/dags", Token, apply_dag)
        .route(Method::GET, "/v1/dags/{name}", Token, get_dag)
        .route(Method::DELETE, "/v1/dags/{name}", Token, delete_dag)
        .route(Method::GET, "/v1/dags/{name}/models", Token, dag_models)
        .route(Method::GET, "/v1/dags/{name}/plan", Token, dag_plan)
        .route(Method::GET, "/v1/agents", Token, list_agents)
        .route(Method::POST, "/v1/agents/register", Agents, register_agent)
        .route(Method::POST, "/v1/agents/{id}/heartbeat", Agents, heartbeat)
        .route(
            Method::POST,
            "/v1/agents/{id}/runs/{run_id}/report",
            Agents,
            crate::http::reports::report_run,
        )
        .route(Method::GET, "/v1/jobs", Token, list_jobs)
        .route(Method::POST, "/v1/jobs", Token, submit_job)
        .route(Method::GET, "/v1/jobs/{id}", Token, get_job)
        .route(Method::POST, "/v1/jobs/{id}/cancel", Token, cancel_job)
        .route(Method::POST, "/v1/jobs/{id}/retry", Token, retry_job)
        .route(Method::DELETE, "/v1/jobs/{id}", Token, delete_job)
        .route(
            Method::GET,
            "/v1/jobs/{id}/results/{*key}",
            Token,
            get_result,
        )
        .route(Method::GET, "/v1/jobs/{id}/events", Token, job_events)
        .route(Method::GET, "/v1/jobs/{id}/logs", Token, job_logs)
        .route(Method::GET, "/v1/secrets", Token, list_secrets)
        .route(Method::PUT, "/v1/secrets/{name}", Token, put_secret)
        .route(Method::DELETE, "/v1/secrets/{name}", Token, delete_secret)
}

/// Every route the router serves.
pub fn routes() -> Vec<RouteInfo> {
    table().routes()
}

/// The whole HTTP API.
pub fn router(state: Shared) -> Router {
    // route_layer: the token is checked only on matched routes, before any extractor reads the
    // body, so an unauthenticated client cannot make the server buffer anything.
    let api = table().router(|access, routes| match access {
        Access::Public => routes,
        Access::Token => {
            routes.route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        }
        Access::Agents => routes.route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_agent_token,
        )),
    });
    api.merge(crate::http::dashboard::router(state.clone()))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(state.settings.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

// ---- middleware ----

/// Whether the request carries `Authorization: Bearer <expected>`.
pub fn authorized(headers: &HeaderMap, expected: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, token)) = value.trim().split_once(' ') else {
        return false;
    };
    // An empty configured token must never match an empty presented one.
    scheme.eq_ignore_ascii_case("bearer")
        && sonic_daemon::secret::matches(token.trim().as_bytes(), expected.as_bytes())
}

async fn require_token(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if authorized(req.headers(), &state.settings.token) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// The agent routes: the API token, the join token, or the agents' token (which joining hands
/// out, so it opens no more than the join token does; agents push run reports with it).
async fn require_agent_token(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if authorized(req.headers(), &state.settings.token)
        || authorized(req.headers(), &state.settings.join_token)
        || state
            .jobs
            .as_ref()
            .is_some_and(|rt| authorized(req.headers(), &rt.config.agent_token))
    {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Counts every answer by route template and status.
async fn track(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = match *req.method() {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        // Clients may invent methods; one label keeps the series bounded.
        _ => "OTHER",
    };
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let metrics = &state.metrics;
    metrics.count_request(method, &route, response.status().as_u16());
    metrics.request_took(method, &route, started.elapsed().as_secs_f64());
    response
}

// ---- extraction helpers ----

fn body_error(e: BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(limit)
    } else {
        ApiError::BadRequest(format!("cannot read the request body: {}", e.body_text()))
    }
}

pub(crate) fn json_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| body_error(e, limit))?;
    // serde fills a struct from a JSON array too (`["ml-pipeline"]` is a job): only objects.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::BadRequest(
            "invalid JSON body: expected an object".into(),
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

fn path_param(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(v)| v)
        .map_err(|e| ApiError::BadRequest(format!("bad path: {}", e.body_text())))
}

/// Agent ids and VM type names: letters, digits, `-`, `_`, `.`; at most 64.
fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

pub(crate) fn checked_agent_id(id: &str) -> Result<(), ApiError> {
    if valid_ident(id) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "invalid agent_id: letters, digits, '-', '_' and '.', at most 64".into(),
        ))
    }
}

/// An absolute `http` or `https` URL with a host and nothing after the authority but a path.
fn valid_agent_url(url: &str) -> bool {
    if url.len() > 2048 {
        return false;
    }
    let Ok(uri) = url.parse::<axum::http::Uri>() else {
        return false;
    };
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let host_ok = uri.host().is_some_and(|h| !h.is_empty());
    let no_userinfo = uri.authority().is_some_and(|a| !a.as_str().contains('@'));
    scheme_ok && host_ok && no_userinfo && uri.query().is_none()
}

fn check_capacity(c: &Capacity) -> Result<(), ApiError> {
    checked_agent_id(&c.agent_id)?;
    let bad = |m: &str| Err(ApiError::BadRequest(m.to_owned()));
    if !valid_agent_url(&c.url) {
        return bad("invalid url: an absolute http:// or https:// URL with a host");
    }
    if !valid_ident(&c.vm_type) {
        return bad("invalid vm_type: letters, digits, '-', '_' and '.', at most 64");
    }
    if c.vcpus == 0 || c.memory_mb == 0 {
        return bad("vcpus and memory_mb must be positive");
    }
    if c.network_mbps.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
        return bad("network_mbps must be a positive number");
    }
    if !valid_ident(&c.sandbox) {
        return bad("invalid sandbox name");
    }
    Ok(())
}

// ---- conversions ----

pub(crate) fn dag_summary(r: &DagRecord) -> DagSummary {
    // Read from the stored JSON by field name, so rows written by an older `Dag` still list.
    let functions = r.parsed["functions"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter_map(|f| f["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let triggers = r.parsed["triggers"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    if let Some(s) = t["schedule"].as_str() {
                        Some(format!("schedule {s}"))
                    } else {
                        t["object_created"]["prefix"]
                            .as_str()
                            .map(|p| format!("object_created {p}"))
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    DagSummary {
        warnings: Vec::new(),
        name: r.name.clone(),
        description: r.parsed["description"].as_str().unwrap_or("").to_owned(),
        functions,
        edges: r.parsed["edges"].as_array().map_or(0, Vec::len),
        revision: r.revision,
        triggers,
        created_at_ms: r.created_ms,
        updated_at_ms: r.updated_ms,
    }
}

pub(crate) fn agent_info(a: AgentRecord, now_ms: i64, timeout: Duration) -> AgentInfo {
    AgentInfo {
        alive: a.alive(now_ms, timeout),
        heartbeat_age_ms: now_ms.saturating_sub(a.last_heartbeat_ms),
        agent_id: a.id,
        url: a.url,
        vm_type: a.vm_type,
        registered_at_ms: a.registered_ms,
        last_heartbeat_ms: a.last_heartbeat_ms,
        capacity: a.capacity,
    }
}

fn timeout_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---- handlers ----

/// Liveness of the control plane and its database
#[utoipa::path(
    get,
    path = "/v1/health",
    operation_id = "health",
    tag = "system",
    responses(
        (status = 200, description = "up", body = ControlHealth),
        (status = 503, description = "the database does not answer", body = ControlHealth),
    )
)]
async fn health(State(state): State<Shared>) -> Response {
    let ok = match state.db.run(|db| db.ping()).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "database does not answer");
            false
        }
    };
    let body = ControlHealth {
        status: if ok { "ok" } else { "unavailable" }.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        dilation: state.jobs.as_ref().map_or(1.0, |rt| rt.config.dilation),
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// This document
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "system",
    responses(
        (status = 200, description = "OpenAPI 3 document", body = Object,
            content_type = "application/json"),
    )
)]
async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::http::openapi::document())
}

/// Prometheus metrics (text format 0.0.4)
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "system",
    responses(
        (status = 200, description = "requests, jobs, stages, instances, data passing, planning, \
            prediction error, queue, capacity, store retries (docs/api.md, Metrics)",
            body = String, content_type = "text/plain"),
    )
)]
async fn render_metrics(State(state): State<Shared>) -> Result<Response, ApiError> {
    let now = state.clock.now_ms();
    let timeout = state.settings.heartbeat_timeout;
    let mut gauges = state
        .db
        .run(move |db| {
            let dags = db.count_dags()?;
            let agents = db.list_agents()?;
            let mut capacity = std::collections::BTreeMap::<String, (u64, u64)>::new();
            let mut alive = 0;
            for a in agents.iter().filter(|a| a.alive(now, timeout)) {
                alive += 1;
                let c = capacity.entry(a.vm_type.clone()).or_default();
                c.0 += u64::from(a.capacity.running);
                c.1 += u64::from(a.capacity.vcpus);
            }
            Ok(Gauges {
                dags,
                agents_alive: alive,
                agents_dead: agents.len() as u64 - alive,
                capacity,
                ..Gauges::default()
            })
        })
        .await?;
    if let Some(rt) = &state.jobs {
        for ev in rt.progress() {
            match ev.status {
                JobStatus::Queued => gauges.jobs_queued += 1,
                JobStatus::Running => gauges.jobs_running += 1,
                _ => {}
            }
        }
        gauges.store_retries = rt.store.retries();
    }
    let text = state.metrics.render(gauges);
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ApplyQuery {
    /// The file name errors should show (default: `request body`; `ofctl apply -f FILE` sends
    /// FILE).
    #[param(max_length = 256)]
    file: Option<String>,
}

/// Refuses bodies that say they are not text: the DAG is a YAML file.
fn check_yaml_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or("").trim();
    let ok = matches!(
        essence,
        "application/yaml"
            | "application/x-yaml"
            | "text/yaml"
            | "text/x-yaml"
            | "application/json"
    ) || essence.starts_with("text/");
    if ok {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(
            "send the DAG file as application/yaml (or text)".into(),
        ))
    }
}

/// Apply a DAG file (create or update)
// `POST /v1/dags` too: the OpenAPI document copies this operation as `postDag`.
#[utoipa::path(
    put,
    path = "/v1/dags",
    operation_id = "putDag",
    tag = "dags",
    params(ApplyQuery),
    request_body(
        description = "the DAG file (interfaces.md section 1)",
        content((String = "application/yaml"), (String = "text/plain")),
    ),
    responses(
        (status = 201, description = "created", body = DagSummary),
        (status = 200, description = "updated, or unchanged (same text)", body = DagSummary),
        (status = 400, description = "the file is not a valid DAG: where and why",
            body = DagErrorBody),
        (status = 413, description = "body over the size limit", body = ErrorBody),
        (status = 415, description = "not a YAML or text body", body = ErrorBody),
    )
)]
async fn apply_dag(
    State(state): State<Shared>,
    query: Result<Query<ApplyQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_yaml_content_type(&headers)?;
    let bytes = body.map_err(|e| body_error(e, state.settings.max_body_bytes))?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::BadRequest("the DAG file is not UTF-8 text".into()))?;
    let file = query
        .file
        .filter(|f| !f.is_empty() && f.len() <= 256 && !f.chars().any(char::is_control))
        .unwrap_or_else(|| "request body".to_owned());
    let now = state.clock.now_ms();
    // Parsing a large file is CPU work: it runs on the blocking pool with the write.
    let outcome = state
        .db
        .run(move |db| {
            let dag = match Dag::from_yaml(&file, &text) {
                Ok(d) => d,
                Err(e) => return Ok(Err(e)),
            };
            let parsed =
                serde_json::to_value(&dag).map_err(|source| crate::store::StoreError::Encode {
                    what: "parsed dag",
                    source,
                })?;
            db.put_dag(&dag.name, &text, &parsed, now)
                .map(|applied| Ok((applied, dag)))
        })
        .await?;
    let ((applied, record), dag) = outcome.map_err(ApiError::InvalidDag)?;
    if applied != Applied::Unchanged {
        crate::admission::triggers::schedule(&state.ctx, &dag);
    }
    tracing::info!(dag = %record.name, revision = record.revision, ?applied, "dag applied");
    let status = if applied == Applied::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    // Stored either way; what the agents cannot start is said now, not when a job runs.
    let mut summary = dag_summary(&record);
    summary.warnings = crate::admission::runnable_warnings(&state.ctx, &dag).await;
    for w in &summary.warnings {
        tracing::warn!(dag = %record.name, "{w}");
    }
    Ok((status, Json(summary)).into_response())
}

/// List the DAGs
#[utoipa::path(
    get,
    path = "/v1/dags",
    operation_id = "listDags",
    tag = "dags",
    responses((status = 200, description = "every DAG, by name", body = DagList))
)]
async fn list_dags(State(state): State<Shared>) -> Result<Json<DagList>, ApiError> {
    let dags = state.db.run(|db| db.list_dags()).await?;
    Ok(Json(DagList {
        dags: dags.iter().map(dag_summary).collect(),
    }))
}

/// One DAG: summary, the file as applied, and the checked DAG
#[utoipa::path(
    get,
    path = "/v1/dags/{name}",
    operation_id = "getDag",
    tag = "dags",
    params(DagName, DagQuery),
    responses(
        (status = 200, description = "the DAG", body = DagDetail),
        (status = 400, description = "not a valid DAG name", body = ErrorBody),
        (status = 404, description = "no such DAG", body = ErrorBody),
    )
)]
async fn get_dag(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<DagQuery>, QueryRejection>,
) -> Result<Json<DagDetail>, ApiError> {
    let name = checked_dag_name(path_param(name)?)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let lookup = name.clone();
    let (record, revisions) = state
        .db
        .run(move |db| {
            let Some(now) = db.get_dag(&lookup)? else {
                return Ok(None);
            };
            let record = match q.revision {
                Some(r) if r != now.revision => db.get_dag_revision(&lookup, r)?.map(|old| {
                    // The registered DAG's own times; the revision's file.
                    DagRecord {
                        created_ms: now.created_ms,
                        ..old
                    }
                }),
                _ => Some(now),
            };
            Ok(record.map(|r| (r, db.dag_revisions(&lookup))))
        })
        .await?
        .ok_or_else(|| match q.revision {
            Some(r) => ApiError::NotFound(format!("no dag named {name} with a revision {r}")),
            None => ApiError::NotFound(format!("no dag named {name}")),
        })?;
    Ok(Json(DagDetail {
        summary: dag_summary(&record),
        yaml: record.yaml,
        parsed: record.parsed,
        revisions: revisions?,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DagQuery {
    /// Show this revision's file (default: the one applied last).
    revision: Option<u64>,
}

/// Remove a DAG's definition (its jobs, samples and models stay)
#[utoipa::path(
    delete,
    path = "/v1/dags/{name}",
    operation_id = "deleteDag",
    tag = "dags",
    params(DagName),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "not a valid DAG name", body = ErrorBody),
        (status = 404, description = "no such DAG", body = ErrorBody),
    )
)]
async fn delete_dag(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = checked_dag_name(path_param(name)?)?;
    let target = name.clone();
    let deleted = state
        .db
        .run(move |db| {
            let deleted = db.delete_dag(&target)?;
            if deleted {
                db.forget_trigger_objects(&target)?;
            }
            Ok(deleted)
        })
        .await?;
    if deleted {
        crate::admission::triggers::forget(&state.ctx, &name);
        tracing::info!(dag = %name, "dag deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("no dag named {name}")))
    }
}

/// List the agents with their liveness
#[utoipa::path(
    get,
    path = "/v1/agents",
    operation_id = "listAgents",
    tag = "agents",
    responses((status = 200, description = "every agent, by id", body = AgentList))
)]
async fn list_agents(State(state): State<Shared>) -> Result<Json<AgentList>, ApiError> {
    let agents = state.db.run(|db| db.list_agents()).await?;
    let now = state.clock.now_ms();
    let timeout = state.settings.heartbeat_timeout;
    Ok(Json(AgentList {
        agents: agents
            .into_iter()
            .map(|a| agent_info(a, now, timeout))
            .collect(),
        heartbeat_timeout_ms: timeout_ms(timeout),
    }))
}

/// Register (or re-register) an agent: the join token (or the API token) opens it; the answer
/// hands a joining agent its token, the file key and the store
#[utoipa::path(
    post,
    path = "/v1/agents/register",
    operation_id = "registerAgent",
    tag = "agents",
    request_body = Capacity,
    responses(
        (status = 200, description = "registered", body = Joined),
        (status = 400, description = "invalid JSON, agent id, URL or VM type", body = ErrorBody),
        (status = 413, description = "body over the size limit", body = ErrorBody),
    )
)]
async fn register_agent(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Joined>, ApiError> {
    let capacity: Capacity = json_body(body, state.settings.max_body_bytes)?;
    check_capacity(&capacity)?;
    let now = state.clock.now_ms();
    let record = state
        .db
        .run(move |db| db.register_agent(&capacity, now))
        .await?;
    state
        .bandwidth
        .observe(&record.id, &record.vm_type, &record.capacity.bandwidth);
    // An agent registers when it starts: whatever it kept warm before went with its old process.
    if let Some(rt) = &state.jobs {
        rt.warm.forget_agent(&record.id);
    }
    tracing::info!(agent = %record.id, url = %record.url, vm_type = %record.vm_type, "agent registered");
    Ok(Json(Joined {
        agent: agent_info(record, now, state.settings.heartbeat_timeout),
        join: state.jobs.as_ref().map(|rt| rt.join_secrets()),
    }))
}

/// An agent's heartbeat (the join token or the API token opens it)
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/heartbeat",
    operation_id = "heartbeat",
    tag = "agents",
    params(Id),
    request_body = Heartbeat,
    responses(
        (status = 200, description = "recorded", body = AgentInfo),
        (status = 400, description = "invalid JSON, or the body's agent_id differs from the path",
            body = ErrorBody),
        (status = 404, description = "unknown agent: register again", body = ErrorBody),
        (status = 413, description = "body over the size limit", body = ErrorBody),
    )
)]
async fn heartbeat(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AgentInfo>, ApiError> {
    let id = path_param(id)?;
    checked_agent_id(&id)?;
    let beat: Heartbeat = json_body(body, state.settings.max_body_bytes)?;
    if beat.agent_id != id {
        return Err(ApiError::BadRequest(
            "agent_id in the body does not match the path".into(),
        ));
    }
    let now = state.clock.now_ms();
    let record = state
        .db
        .run(move |db| db.heartbeat(&beat, now))
        .await?
        // 404 tells the agent to register again (the control plane lost it, or never knew it).
        .ok_or_else(|| ApiError::NotFound(format!("unknown agent {id}: register first")))?;
    if state
        .bandwidth
        .observe(&record.id, &record.vm_type, &record.capacity.bandwidth)
    {
        tracing::debug!(agent = %record.id, vm_type = %record.vm_type, "bandwidth measured");
    }
    Ok(Json(agent_info(
        record,
        now,
        state.settings.heartbeat_timeout,
    )))
}

// ---- jobs ----

pub use sonic_api::control::{JobAccepted, JobInput, SubmitJob};

/// `GET /v1/jobs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobList {
    /// Every job's summary.
    pub jobs: Vec<JobSummary>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct JobsQuery {
    /// Only this DAG's jobs.
    dag: Option<String>,
    /// At most this many (default 100).
    #[param(maximum = 1000)]
    limit: Option<u32>,
    /// Only jobs in this status (`queued`, `running`, `succeeded`, `failed`).
    status: Option<String>,
}

/// A job as the API shows it: the recorded summary once it ended, its state before.
pub fn job_view(r: JobRecord) -> JobSummary {
    // The record's times are the job's, whatever the summary stored with it says.
    let times = (
        Some(r.created_ms),
        r.started_ms,
        r.finished_ms.filter(|_| r.status.is_terminal()),
    );
    let mut s = summary_of(r);
    (s.submitted_ms, s.started_ms, s.ended_ms) = times;
    s
}

/// The record's summary with what the record knows beside it, or one made from the record.
fn summary_of(r: JobRecord) -> JobSummary {
    if let Some(mut s) = r.summary {
        s.status = r.status;
        if s.error.is_none() {
            s.error = r.error;
        }
        if s.plan.is_none() {
            s.plan = r.plan;
        }
        if s.mode_reason.is_none() {
            s.mode_reason = r.mode_reason;
        }
        if s.slo.is_none() && r.mode == sonic_api::control::JobMode::Planned {
            s.slo = r.slo;
        }
        s.dag_revision = s.dag_revision.or(r.dag_revision);
        return s;
    }
    JobSummary {
        failed_attempts: Vec::new(),
        bounds_missed: Vec::new(),
        job_id: r.id,
        dag: r.dag,
        status: r.status,
        policy: r.policy,
        mode: r.mode,
        input_bytes: r.input_bytes,
        latency_s: 0.0,
        cost_usd: 0.0,
        storage_usd: 0.0,
        requests_usd: 0.0,
        perf_per_dollar: 0.0,
        edges: Vec::new(),
        functions: Vec::new(),
        fetches: Vec::new(),
        outputs: Vec::new(),
        error: r.error,
        failure: None,
        plan: r.plan,
        mode_reason: r.mode_reason,
        // An objective applies to a job planned for it; a profiling job is not.
        slo: r
            .slo
            .filter(|_| r.mode == sonic_api::control::JobMode::Planned),
        submitted_ms: None,
        started_ms: None,
        ended_ms: None,
        dag_revision: r.dag_revision,
        on_failure: None,
    }
}

/// Submit a job: run a DAG on an input
#[utoipa::path(
    post,
    path = "/v1/jobs",
    operation_id = "submitJob",
    tag = "jobs",
    request_body = SubmitJob,
    params(
        ("Idempotency-Key" = Option<String>, Header,
            description = "1 to 255 visible ASCII characters: a second submission of the DAG \
            with the same key returns the first job (200) and starts nothing"),
    ),
    responses(
        (status = 202, description = "accepted; follow it with GET /v1/jobs/{id}",
            body = JobAccepted),
        (status = 200, description = "the job this DAG's Idempotency-Key made before, in its \
            current status; nothing started", body = JobAccepted),
        (status = 400, description = "invalid JSON, policy, parameters, input or SLO",
            body = ErrorBody),
        (status = 404, description = "no such DAG", body = ErrorBody),
        (status = 409, description = "policy sonic forced, but the DAG's models cannot predict yet",
            body = ErrorBody),
        (status = 422, description = "policy sonic forced, but no plan is possible; or no plan \
            meets the job's percentile SLO (its or its DAG's) and it is not best effort",
            body = ErrorBody),
        (status = 413, description = "body over the size limit", body = ErrorBody),
        (status = 503, description = "this control plane runs no jobs (no object store)",
            body = ErrorBody),
    )
)]
async fn submit_job(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::BadRequest("Idempotency-Key: visible ASCII characters only".into())
        })?),
    };
    let req: SubmitJob = json_body(body, state.settings.max_body_bytes)?;
    // Spans at debug: with span timings on (`sonic-load`'s SONIC_LOAD_SPANS), where a
    // submission's time goes.
    let submitted = tracing::Instrument::instrument(
        admission::submit_keyed(&state.ctx, req, key),
        tracing::debug_span!("submit"),
    )
    .await?;
    let status = if submitted.existed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(submitted.accepted)).into_response())
}

/// List jobs, newest first
#[utoipa::path(
    get,
    path = "/v1/jobs",
    operation_id = "listJobs",
    tag = "jobs",
    params(JobsQuery),
    responses(
        (status = 200, description = "jobs", body = JobList),
        (status = 400, description = "bad query", body = ErrorBody),
    )
)]
async fn list_jobs(
    State(state): State<Shared>,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Result<Json<JobList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let dag = q.dag.map(checked_dag_name).transpose()?;
    let limit = q.limit.unwrap_or(100).min(1000);
    let status = q
        .status
        .as_deref()
        .map(str::parse::<JobStatus>)
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("status: {e}")))?;
    let jobs = state
        .db
        .run(move |db| db.find_jobs(dag.as_deref(), status, limit))
        .await?;
    Ok(Json(JobList {
        jobs: jobs.into_iter().map(job_view).collect(),
    }))
}

pub(crate) fn checked_job_id(id: String) -> Result<String, ApiError> {
    if id.starts_with("j-") && valid_ident(&id) {
        Ok(id)
    } else {
        Err(ApiError::BadRequest("invalid job id".into()))
    }
}

/// A job: its state, and its summary once it ended
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    operation_id = "getJob",
    tag = "jobs",
    params(Id),
    responses(
        (status = 200, description = "the job", body = JobSummary),
        (status = 400, description = "not a job id", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
    )
)]
async fn get_job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<JobSummary>, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    Ok(Json(job_view(job_record(&state, &id).await?)))
}

/// Cancel a queued or running job
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    operation_id = "cancelJob",
    tag = "jobs",
    params(Id),
    responses(
        (status = 202, description = "cancel requested", body = JobSummary),
        (status = 400, description = "not a job id, or the job already ended", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
    )
)]
async fn cancel_job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    let job = admission::cancel(&state, id).await?;
    Ok((StatusCode::ACCEPTED, Json(job_view(job))).into_response())
}

/// Delete an ended job: its record, logs, results and input, its files on the agents
///
/// The sample it taught the DAG's models stays. A queued or running job is cancelled first.
#[utoipa::path(
    delete,
    path = "/v1/jobs/{id}",
    operation_id = "deleteJob",
    tag = "jobs",
    params(Id),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "not a job id", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
        (status = 409, description = "the job has not ended", body = ErrorBody),
    )
)]
async fn delete_job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    admission::delete_job(&state.ctx, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List the secrets functions may name: names, sizes and sources, never values
#[utoipa::path(
    get,
    path = "/v1/secrets",
    operation_id = "listSecrets",
    tag = "secrets",
    responses((status = 200, description = "the secrets", body = SecretList))
)]
async fn list_secrets(State(state): State<Shared>) -> Result<Json<SecretList>, ApiError> {
    let secrets = admission::list_secrets(&state.ctx).await?;
    Ok(Json(SecretList { secrets }))
}

/// Set a secret: the request's body is its value (UTF-8 text, no NUL, at most 64 KiB)
///
/// A DAG's function names it as `env: { VAR: { secret: NAME } }`; its runs get the value as
/// `VAR`, and the agent replaces it in their logs. The API never returns a value.
#[utoipa::path(
    put,
    path = "/v1/secrets/{name}",
    operation_id = "putSecret",
    tag = "secrets",
    params(SecretName),
    request_body(content = String, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "set"),
        (status = 400, description = "an invalid name or value", body = ErrorBody),
    )
)]
async fn put_secret(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_param(name)?;
    let bytes = body.map_err(|e| body_error(e, state.settings.max_body_bytes))?;
    admission::put_secret(&state.ctx, name, &bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Delete a secret from the store
#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    operation_id = "deleteSecret",
    tag = "secrets",
    params(SecretName),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "an invalid name", body = ErrorBody),
        (status = 404, description = "no such secret", body = ErrorBody),
        (status = 409, description = "a file of the secrets folder, not the store's", body = ErrorBody),
    )
)]
async fn delete_secret(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_param(name)?;
    admission::delete_secret(&state.ctx, name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run a failed or cancelled job again under its id, reusing what its instances that succeeded wrote
///
/// The job keeps its DAG revision, parameters, policy and input; its instances that succeeded
/// before are not run again (`"reused": true` in the summary's `functions`). A failed job keeps
/// what a retry reuses for the control plane's `keep_failed` (a day by default).
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/retry",
    operation_id = "retryJob",
    tag = "jobs",
    params(Id),
    responses(
        (status = 202, description = "queued again", body = JobAccepted),
        (status = 400, description = "not a job id", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
        (status = 409, description = "the job has not failed, or what it kept was deleted", body = ErrorBody),
    )
)]
async fn retry_job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    let accepted = admission::retry(&state.ctx, id).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

/// Download one result object of a job (an `outputs` entry, by its path under the job's result/)
///
/// `key` is the object's path under the job's `result/`; `ofctl fetch` downloads it so.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/results/{key}",
    operation_id = "getJobResult",
    tag = "jobs",
    params(Id, ResultKey),
    responses(
        (status = 200, description = "the object's bytes, streamed",
            content(("application/octet-stream"))),
        (status = 400, description = "not a job id, or an invalid key", body = ErrorBody),
        (status = 404, description = "no such job or result", body = ErrorBody),
        (status = 409, description = "the job has not succeeded: it has no results", body = ErrorBody),
        (status = 503, description = "this control plane runs no jobs (no object store)",
            body = ErrorBody),
    )
)]
pub(crate) async fn get_result(
    State(state): State<Shared>,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, key)) =
        params.map_err(|e| ApiError::BadRequest(format!("bad path: {}", e.body_text())))?;
    let id = checked_job_id(id)?;
    let rt = state.jobs.clone().ok_or_else(|| {
        ApiError::Unavailable("this control plane runs no jobs: it has no object store".into())
    })?;
    let full = format!("{}result/{key}", crate::exec::requests::job_prefix(&id));
    sonic_storage::validate_key(&full)
        .map_err(|_| ApiError::BadRequest("invalid result key".into()))?;
    // A running or failed job's result folder may hold part of what it would write.
    let job = job_record(&state, &id).await?;
    if job.status != JobStatus::Succeeded {
        return Err(ApiError::Conflict(format!(
            "job {id} is {}: only a succeeded job's results are served",
            job.status
        )));
    }
    // Streamed from the store as the client reads: a large result is never held whole.
    let size = rt.store.head(&full).await.ok().flatten();
    match rt.store.get_stream(&full).await {
        Ok(stream) => {
            let mut response = axum::body::Body::from_stream(stream).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/octet-stream"),
            );
            if let Some(n) = size {
                headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(n));
            }
            Ok(response)
        }
        Err(sonic_storage::StoreError::NotFound(_)) => {
            Err(ApiError::NotFound(format!("job {id} has no result {key}")))
        }
        Err(e) => Err(ApiError::Internal(format!("cannot read {full}: {e}"))),
    }
}

// ---- models, plans, progress, logs ----

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ModelsQuery {
    /// A job's parameter overrides, as a JSON object: the view is of the setting such a job
    /// plans with (default: none, the DAG's default parameters).
    params: Option<String>,
}

/// The overrides of `?params=`: a JSON object of numbers, strings and booleans.
fn query_overrides(
    text: Option<&str>,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, ApiError> {
    let Some(text) = text else {
        return Ok(Default::default());
    };
    let bad = |why: &str| ApiError::BadRequest(format!("params: {why}"));
    let map: std::collections::BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
        .map_err(|_| bad("a JSON object of parameter overrides, e.g. {\"trees\":12}"))?;
    if map
        .values()
        .any(|v| !(v.is_number() || v.is_string() || v.is_boolean()))
    {
        return Err(bad("a parameter is a number, a string or a boolean"));
    }
    Ok(map)
}

/// What online profiling learned: per parameter the fitted equation, its cross-validated MAPE,
/// its samples; whether the DAG converged (its jobs then run planned)
///
/// Of the parameter setting a job with the overrides of `params` plans with (default: the DAG's
/// default parameters).
#[utoipa::path(
    get,
    path = "/v1/dags/{name}/models",
    operation_id = "getDagModels",
    tag = "dags",
    params(DagName, ModelsQuery),
    responses(
        (status = 200, description = "the models (empty equations before the first job)",
            body = DagModelsView),
        (status = 400, description = "not a valid DAG name, or bad params", body = ErrorBody),
        (status = 404, description = "no such DAG, and no models of that name", body = ErrorBody),
    )
)]
async fn dag_models(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<ModelsQuery>, QueryRejection>,
) -> Result<Json<DagModelsView>, ApiError> {
    let name = checked_dag_name(path_param(name)?)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let overrides = query_overrides(q.params.as_deref())?;
    let rule = state.convergence();
    let lookup = name.clone();
    let view = state
        .db
        .run(move |db| {
            let Some(record) = db.get_dag(&lookup)? else {
                // A deleted DAG's models stay, as they were last fitted: its default setting
                // is unknown, so the top level is the most recently fitted setting.
                let mut stored = db.models(&lookup)?;
                stored.sort_by_key(|m| m.updated_ms);
                let Some(last) = stored.pop() else {
                    return Ok(Ok(None));
                };
                let Some(mut models) = crate::learn::decode(&last) else {
                    return Ok(Ok(None));
                };
                models.convergence = rule;
                let setting = Setting::from_key(&last.setting).unwrap_or_default();
                let samples: Vec<_> = db
                    .samples(&lookup)?
                    .into_iter()
                    .filter(|s| crate::learn::sample_setting(None, s) == setting)
                    .collect();
                let mode = crate::learn::mode_of(db, &lookup, &setting, &models, last.updated_ms)?;
                return Ok(Ok(Some(crate::learn::view(
                    &lookup,
                    &setting,
                    &models,
                    &samples,
                    Some(&mode),
                    Vec::new(),
                ))));
            };
            let dag = match record.dag() {
                Ok(dag) => dag,
                Err(e) => return Ok(Err(ApiError::Internal(e))),
            };
            let setting = crate::learn::job_setting(&dag, &overrides);
            let samples = crate::learn::fitted_samples(db, &dag, &setting)?;
            let models = crate::learn::current(db, &dag, &setting, rule)?;
            // A setting with no mode recorded yet has been in it since the DAG was applied
            // (not since this request: the view stays the same from one request to the next).
            let since = record.created_ms;
            let mode = crate::learn::mode_of(db, &lookup, &setting, &models, since)?;
            let settings = crate::learn::settings_view(db, &dag, rule, since)?;
            Ok(Ok(Some(crate::learn::view(
                &lookup,
                &setting,
                &models,
                &samples,
                Some(&mode),
                settings,
            ))))
        })
        .await??;
    view.map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no dag named {name}")))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct PlanQuery {
    /// The job input size to plan for.
    #[param(required = true)]
    input_bytes: Option<u64>,
    /// The policy to plan with.
    #[param(schema_with = crate::http::openapi::plan_policies)]
    policy: Option<String>,
    /// A percentile objective, `p<percentile>=<duration>` (e.g. `p95=20s`), overriding the DAG's
    /// `slo:`: the plan a job submitted with it would get.
    slo: Option<String>,
    /// Where no plan meets the objective, the plan with the lowest percentile latency instead of
    /// a 422.
    slo_best_effort: Option<bool>,
}

/// The plan for a job of a given input size, from the fitted models and the measured bandwidths
/// (the `ofctl plan -o json` document)
#[utoipa::path(
    get,
    path = "/v1/dags/{name}/plan",
    operation_id = "getDagPlan",
    tag = "dags",
    params(DagName, PlanQuery),
    responses(
        (status = 200, description = "the plan", body = PlanReport),
        (status = 400, description = "not a valid DAG name, input_bytes missing, or an unknown \
            policy", body = ErrorBody),
        (status = 404, description = "no such DAG", body = ErrorBody),
        (status = 409, description = "the models cannot predict yet (a parameter was never \
            measured)", body = ErrorBody),
        (status = 422, description = "no plan is possible (the DAG's bounds, memory no VM type \
            offers)", body = ErrorBody),
    )
)]
async fn dag_plan(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<PlanQuery>, QueryRejection>,
) -> Result<Json<sonic_api::plan::PlanReport>, ApiError> {
    let name = checked_dag_name(path_param(name)?)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let input_bytes = q.input_bytes.ok_or_else(|| {
        ApiError::BadRequest("input_bytes is required: the job input size to plan for".into())
    })?;
    let policy: Policy = q
        .policy
        .as_deref()
        .unwrap_or("sonic")
        .parse()
        .map_err(ApiError::BadRequest)?;
    let slo = q
        .slo
        .as_deref()
        .map(|s| s.parse::<sonic_core::slo::Slo>())
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("slo: {e}")))?;
    let objective = admission::Objective {
        slo,
        best_effort: q.slo_best_effort.unwrap_or(false),
    };
    let planned = admission::plan_dag(&state, name, input_bytes, policy, objective).await?;
    Ok(Json(planned.report))
}

/// A job's state as one progress event, from its record (a job this process does not run).
fn event_of(r: &JobRecord) -> JobEvent {
    let ran = r.summary.as_ref().map_or(0, |s| s.functions.len()) as u32;
    JobEvent {
        job_id: r.id.clone(),
        status: r.status,
        stage: None,
        done_instances: ran,
        total_instances: ran,
        message: r.error.clone(),
    }
}

/// Where a progress stream is.
enum Follow {
    /// A job this process does not run: its record as read.
    Start(Box<JobRecord>),
    /// A job this process runs: its executor's current event first.
    First(tokio::sync::watch::Receiver<JobEvent>),
    /// The executor of this process tells every change.
    Live(tokio::sync::watch::Receiver<JobEvent>),
    /// Nobody here runs the job (any more): its record is polled, and sent when it changes.
    Poll(String, JobStatus),
    Done,
}

/// How often the record of a job that this process does not run is read.
const EVENTS_POLL: Duration = Duration::from_millis(250);

fn sse_event(ev: &JobEvent) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .data(serde_json::to_string(ev).unwrap_or_else(|_| "{}".into()))
}

/// After sending `ev`: the end when it is terminal, else the same way of following.
fn after(ev: &JobEvent, live: Option<tokio::sync::watch::Receiver<JobEvent>>) -> Follow {
    match (ev.status.is_terminal(), live) {
        (true, _) => Follow::Done,
        (false, Some(rx)) => Follow::Live(rx),
        (false, None) => Follow::Poll(ev.job_id.clone(), ev.status),
    }
}

/// The next event of a progress stream, and where the stream is then; `None` ends it.
async fn next_event(
    state: Shared,
    follow: Follow,
) -> Option<(axum::response::sse::Event, (Shared, Follow))> {
    let ev = match follow {
        Follow::Done => return None,
        Follow::Start(record) => {
            let ev = event_of(&record);
            return Some((sse_event(&ev), (state, after(&ev, None))));
        }
        Follow::First(mut rx) => {
            let ev = rx.borrow_and_update().clone();
            return Some((sse_event(&ev), (state, after(&ev, Some(rx)))));
        }
        Follow::Live(mut rx) => {
            if rx.changed().await.is_ok() {
                let ev = rx.borrow_and_update().clone();
                return Some((sse_event(&ev), (state, after(&ev, Some(rx)))));
            }
            // The executor forgot the job: it ended, and its record says how.
            let id = rx.borrow().job_id.clone();
            let record = state.db.run(move |db| db.get_job(&id)).await.ok()??;
            event_of(&record)
        }
        Follow::Poll(id, last) => loop {
            tokio::time::sleep(EVENTS_POLL).await;
            let lookup = id.clone();
            let record = state.db.run(move |db| db.get_job(&lookup)).await.ok()??;
            if record.status != last {
                break event_of(&record);
            }
        },
    };
    let next = after(&ev, None);
    Some((sse_event(&ev), (state, next)))
}

/// The job's progress as server-sent events: each `data:` line is one JobEvent; the first is its
/// state now, the stream ends after the event with a terminal status
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/events",
    operation_id = "getJobEvents",
    tag = "jobs",
    params(Id),
    responses(
        (status = 200, description = "text/event-stream of JobEvent (keep-alive comments in \
            between)", body = JobEvent, content_type = "text/event-stream"),
        (status = 400, description = "not a job id", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
    )
)]
pub(crate) async fn job_events(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    // A job this process runs is followed from its executor's events, with no read of its
    // record (500 streams opened at once were 500 blocking-pool reads); any other from its
    // record, then polled.
    let subscribe = || state.jobs.as_ref().and_then(|rt| rt.subscribe(&id));
    let start = match subscribe() {
        Some(rx) => Follow::First(rx),
        None => {
            let record = job_record(&state, &id).await?;
            // It may have started or ended here in between: its executor then says so.
            match subscribe() {
                Some(rx) => Follow::First(rx),
                None => Follow::Start(Box::new(record)),
            }
        }
    };
    let stream = futures::stream::unfold((state, start), |(state, follow)| async move {
        next_event(state, follow)
            .await
            .map(|(ev, next)| (Ok::<_, std::convert::Infallible>(ev), next))
    });
    Ok(axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LogsQuery {
    /// Only this function's instances.
    function: Option<String>,
}

/// What every instance attempt of the job wrote (standard output and error, as kept by its
/// agent)
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/logs",
    operation_id = "getJobLogs",
    tag = "jobs",
    params(Id, LogsQuery),
    responses(
        (status = 200, description = "the logs, by function, instance and attempt", body = JobLogs),
        (status = 400, description = "not a job id or function name", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody),
    )
)]
async fn job_logs(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Json<JobLogs>, ApiError> {
    let id = checked_job_id(path_param(id)?)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if let Some(f) = &q.function
        && !sonic_core::dag::valid_function_name(f)
    {
        return Err(ApiError::BadRequest("invalid function name".into()));
    }
    let lookup = id.clone();
    let function = q.function.clone();
    // A function the job's DAG does not have, and no log of it: a 404 that says so, rather
    // than an empty list that reads as "it printed nothing".
    let found = state
        .db
        .run(move |db| {
            let Some(job) = db.get_job(&lookup)? else {
                return Ok(None);
            };
            let mut logs = db.logs(&lookup, function.as_deref())?;
            let dag = db.load_dag(&job.dag)?;
            let unknown = match &function {
                Some(f) if logs.is_empty() => dag.as_ref().is_some_and(|p| {
                    p.dag.function_index(f).is_none()
                        && p.dag.on_failure.as_ref().is_none_or(|o| o.name != *f)
                }),
                _ => false,
            };
            // In the DAG's order (the store keeps them by name), then instance and attempt.
            if let Some(p) = &dag {
                logs.sort_by_key(|l| p.dag.function_index(&l.function).unwrap_or(usize::MAX));
            }
            Ok(Some((logs, unknown, job.dag)))
        })
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let (logs, unknown, dag) = found;
    if unknown {
        return Err(ApiError::NotFound(format!(
            "job {id}: DAG {dag} has no function {}",
            q.function.unwrap_or_default()
        )));
    }
    Ok(Json(JobLogs { job_id: id, logs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "0123456789abcdef"));
        let mut check = |value: &str, expected: &str| {
            h.insert(header::AUTHORIZATION, value.parse().expect("header"));
            authorized(&h, expected)
        };
        assert!(check("Bearer 0123456789abcdef", "0123456789abcdef"));
        assert!(check("bearer 0123456789abcdef", "0123456789abcdef"));
        assert!(!check("Bearer 0123456789abcdeF", "0123456789abcdef"));
        assert!(!check("Bearer 0123456789abcde", "0123456789abcdef"));
        assert!(!check("Bearer 0123456789abcdef0", "0123456789abcdef"));
        assert!(!check("Basic 0123456789abcdef", "0123456789abcdef"));
        assert!(!check("0123456789abcdef", "0123456789abcdef"));
        assert!(!check("Bearer ", ""), "an empty token never matches");
    }

    #[test]
    fn agent_urls() {
        for ok in [
            "http://127.0.0.1:7070",
            "https://agent-1.internal:443/",
            "http://[::1]:80",
        ] {
            assert!(valid_agent_url(ok), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1:7070",
            "ftp://host/",
            "http://user:pw@host/",
            "http://host/?x=1",
            "javascript:alert(1)",
            "http:///nohost",
        ] {
            assert!(!valid_agent_url(bad), "{bad}");
        }
    }

    #[test]
    fn routes_are_unique() {
        let r = routes();
        for (i, a) in r.iter().enumerate() {
            for b in &r[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
        }
        assert_eq!(
            r.iter().filter(|r| !r.guard.needs_token()).count(),
            1,
            "only health is public"
        );
    }
}
