//! The agent daemon: its HTTP API (runs, capacity, health, job cleanup, the file server), the
//! control-plane token check, registration and heartbeats.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use sonic_api::agent::{
    Capacity, ErrorBody, FetchReport, FetchRequest, Health, Heartbeat, PrewarmRequest, Prewarmed,
    RunAccepted, RunReport, RunRequest, RunStatus, RunnableCheck, RunnableReport,
};
use sonic_daemon::routes::{Route, RouteTable};
use sonic_storage::ObjectStore;

use crate::config::AgentConfig;
use crate::files::{FileStore, JobId};
use crate::runner::{self, FetchLocks};
use crate::sandbox::Sandbox;
use crate::throttle::{AgentThrottle, BandwidthMeter};

/// Everything the handlers share.
#[derive(Debug)]
pub struct AgentState {
    pub config: AgentConfig,
    pub sandbox: Arc<dyn Sandbox>,
    pub store: Option<Arc<dyn ObjectStore>>,
    /// The in-memory tier of `memory` edges.
    pub memory: crate::memory::MemoryTier,
    pub files: FileStore,
    pub throttle: sonic_storage::Throttle,
    pub meter: BandwidthMeter,
    pub http: reqwest::Client,
    pub running: AtomicU32,
    pub fetch_locks: FetchLocks,
    /// What `GET /metrics` shows.
    pub metrics: crate::metrics::AgentMetrics,
    /// The environments of handler stages with a `requirements.txt`
    /// (`<data_dir>/handlers/venvs/<sha256>/`, pip's cache in `<data_dir>/handlers/pip-cache/`).
    pub venvs: sonic_openlambda::venv::Venvs,
    /// With the Docker sandbox, the same built in containers of the Python image, for its
    /// containers (`<data_dir>/handlers/docker-venvs/<sha256>/`, seen at
    /// `sandbox::docker::VENV_DIR`; pip's cache in `<data_dir>/handlers/docker-pip-cache/`).
    pub docker_venvs: Option<sonic_openlambda::venv::Venvs>,
    runs: Mutex<HashMap<String, RunReport>>,
    /// The runs going on, to stop them: run id -> its task.
    tasks: Mutex<HashMap<String, tokio::task::AbortHandle>>,
}

impl AgentState {
    /// `throttle` must be the one the store was built with, so that S3 and peer traffic share
    /// the VM's bandwidth.
    pub fn new(
        config: AgentConfig,
        sandbox: Arc<dyn Sandbox>,
        store: Option<Arc<dyn ObjectStore>>,
        throttle: &AgentThrottle,
    ) -> Result<AgentState, crate::files::FileError> {
        let files = FileStore::open(&config.data_dir)?;
        let throttle = throttle.storage_throttle();
        let docker_venvs = if sandbox.kind() == "docker" {
            let builder = crate::sandbox::docker::venv_builder(config.python_image.clone())
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            Some(sonic_openlambda::venv::Venvs::with_builder(
                config.data_dir.join("handlers").join("docker-venvs"),
                config.data_dir.join("handlers").join("docker-pip-cache"),
                builder,
                sonic_openlambda::venv::DEFAULT_PIP_TIMEOUT,
            ))
        } else {
            None
        };
        Ok(AgentState {
            files,
            memory: crate::memory::MemoryTier::new(config.memory_tier.clone(), throttle.clone()),
            throttle,
            meter: BandwidthMeter::default(),
            http: crate::transfer::http_client(config.ca_file.as_deref())
                .map_err(|e| std::io::Error::other(e.to_string()))?,
            running: AtomicU32::new(0),
            fetch_locks: FetchLocks::default(),
            metrics: crate::metrics::AgentMetrics::default(),
            venvs: sonic_openlambda::venv::Venvs::new(
                config.data_dir.join("handlers").join("venvs"),
                config.data_dir.join("handlers").join("pip-cache"),
                std::path::PathBuf::from("python3"),
                sonic_openlambda::venv::DEFAULT_PIP_TIMEOUT,
            ),
            docker_venvs,
            runs: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            sandbox,
            store,
            config,
        })
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunReport>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::AbortHandle>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the runs going on whose ids `which` selects: the lambda's process group is killed
    /// (or its container removed) and the run's report says it was stopped. Returns how many.
    pub fn stop_runs(&self, which: impl Fn(&str) -> bool) -> usize {
        let stopped: Vec<(String, tokio::task::AbortHandle)> = {
            let mut tasks = self.tasks();
            let ids: Vec<String> = tasks.keys().filter(|id| which(id)).cloned().collect();
            ids.into_iter()
                .filter_map(|id| tasks.remove(&id).map(|t| (id, t)))
                .collect()
        };
        let mut runs = self.runs();
        for (id, task) in &stopped {
            task.abort();
            if let Some(r) = runs.get_mut(id)
                && r.status == RunStatus::Running
            {
                r.status = RunStatus::Error;
                r.error = Some("stopped by the control plane".to_owned());
            }
        }
        stopped.len()
    }

    pub fn capacity(&self) -> Capacity {
        Capacity {
            running: self.running.load(Ordering::SeqCst),
            bandwidth: self.meter.report(),
            ..capacity_of(&self.config, self.sandbox.kind())
        }
    }
}

/// What an agent of `config` offers, idle (the body of its registration).
pub fn capacity_of(config: &AgentConfig, sandbox: &str) -> Capacity {
    Capacity {
        agent_id: config.id.clone(),
        url: config.url(),
        vm_type: config.vm_type.clone(),
        vcpus: config.vcpus,
        memory_mb: config.memory_mb,
        network_mbps: config.network_mbps,
        sandbox: sandbox.to_owned(),
        running: 0,
        bandwidth: sonic_api::agent::BandwidthReport::default(),
    }
}

/// The one error type of the API, mapped to a status and a JSON body in one place.
#[derive(Debug)]
pub enum ApiError {
    BadRequest(String),
    /// A body axum refused before the handler (too large, wrong content type, bad JSON).
    Rejected(StatusCode, String),
    Unauthorized,
    NotFound(String),
    Conflict(String),
    /// What the request needed from elsewhere (a peer, the store) could not be had.
    BadGateway(String),
    Internal,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, msg) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::Rejected(status, m) => (status, m),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "missing or wrong token".to_owned(),
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::BadGateway(m) => (StatusCode::BAD_GATEWAY, m),
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error".to_owned(),
            ),
        };
        (status, Json(ErrorBody { error: msg })).into_response()
    }
}

async fn require_token(State(state): State<Arc<AgentState>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // An empty configured token must never match an empty presented one.
    let expected = state.config.token.as_bytes();
    match presented {
        Some(t) if sonic_daemon::secret::matches(t.as_bytes(), expected) => next.run(req).await,
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// Bodies larger than this are refused (a run request is a few KiB).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Anyone (health).
    Public,
    /// The control plane: `Authorization: Bearer <token>`, else 401.
    ControlToken,
    /// A peer agent holding an HMAC file token for the very file, else 403.
    FileToken,
}

/// One route of the agent's API.
pub type RouteInfo = Route<Guard>;

/// The agent's own routes, each once with its guard and handler; the file server's are in
/// [`crate::fileserver::routes`].
fn table() -> RouteTable<Arc<AgentState>, Guard> {
    use Guard::{ControlToken, Public};
    RouteTable::new()
        .route(Method::GET, "/v1/health", Public, health)
        .route(Method::GET, "/v1/capacity", ControlToken, capacity)
        .route(Method::POST, "/v1/runs", ControlToken, start_run)
        .route(Method::POST, "/v1/prewarm", ControlToken, prewarm)
        .route(Method::POST, "/v1/fetches", ControlToken, fetch)
        .route(Method::POST, "/v1/runnable", ControlToken, runnable)
        .route(Method::GET, "/v1/runs/{run_id}", ControlToken, get_run)
        .route(Method::DELETE, "/v1/runs/{run_id}", ControlToken, stop_run)
        .route(
            Method::DELETE,
            "/v1/jobs/{job_id}",
            ControlToken,
            delete_job,
        )
        .route(Method::GET, "/metrics", ControlToken, render_metrics)
}

/// Every route the agent serves, the file server's included: what the access tests walk.
pub fn routes() -> Vec<RouteInfo> {
    let mut routes = table().routes();
    routes.extend(crate::fileserver::routes());
    routes
}

/// The whole HTTP API.
pub fn router(state: Arc<AgentState>) -> Router {
    let agent = table().router(|guard, routes| match guard {
        Guard::Public => routes,
        Guard::ControlToken => {
            routes.route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        }
        // A file route checks its file token itself (the file server's own router).
        Guard::FileToken => routes,
    });
    let files = crate::fileserver::router(crate::fileserver::FileServerState {
        files: state.files.clone(),
        key: state.config.file_key.as_bytes().to_vec(),
        throttle: state.throttle.clone(),
        meter: state.meter.clone(),
    });
    agent
        .with_state(state)
        .merge(files)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn health(State(state): State<Arc<AgentState>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        agent_id: state.config.id.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn capacity(State(state): State<Arc<AgentState>>) -> Json<Capacity> {
    Json(state.capacity())
}

async fn render_metrics(State(state): State<Arc<AgentState>>) -> Response {
    let text = state.metrics.render(&state);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            sonic_daemon::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

async fn start_run(
    State(state): State<Arc<AgentState>>,
    body: Result<Json<RunRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<RunAccepted>), ApiError> {
    let Json(req) = body.map_err(|e| ApiError::Rejected(e.status(), e.body_text()))?;
    let run = runner::CheckedRun::new(req).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let req = run.request();
    let run_id = run.run_id();
    {
        let mut runs = state.runs();
        if runs.contains_key(&run_id) {
            // The same attempt again: idempotent, the first one goes on.
            return Ok((StatusCode::OK, Json(RunAccepted { run_id })));
        }
        runs.insert(
            run_id.clone(),
            RunReport::new(run_id.clone(), RunStatus::Running),
        );
    }
    // Every event of the run (staging, the sandbox, routing outputs) carries its span.
    let span = tracing::info_span!(
        "run",
        run = %run_id,
        job = %req.job_id,
        function = %req.function,
        instance = req.instance,
        attempt = req.attempt
    );
    span.in_scope(|| tracing::info!(image = %req.image, "run accepted"));
    let task_state = state.clone();
    let id = run_id.clone();
    let report_url = req.report_url.clone();
    let task = async move {
        let report = runner::execute_checked(task_state.clone(), run).await;
        tracing::info!(status = ?report.status, cold = report.cold, seconds = report.seconds, "run ended");
        task_state.metrics.run_ended(&report);
        // Kept first: `GET /v1/runs/{id}` answers with it whatever becomes of the push.
        task_state.runs().insert(id.clone(), report.clone());
        task_state.tasks().remove(&id);
        if let Some(url) = report_url {
            push_report(&task_state, &url, &report).await;
        }
    };
    // Held under the tasks' lock: a stop that comes now finds the task.
    let mut tasks = state.tasks();
    let handle = tokio::spawn(tracing::Instrument::instrument(task, span)).abort_handle();
    if !handle.is_finished() {
        tasks.insert(run_id.clone(), handle);
    }
    drop(tasks);
    Ok((StatusCode::ACCEPTED, Json(RunAccepted { run_id })))
}

/// `POST /v1/prewarm`: containers (environments) for a function's next runs, started before
/// the answer. Input the checks refuse, or an image the engine does not have: 400, nothing started.
async fn prewarm(
    State(state): State<Arc<AgentState>>,
    body: Result<Json<PrewarmRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Prewarmed>, ApiError> {
    use crate::sandbox::SandboxError;
    let Json(req) = body.map_err(|e| ApiError::Rejected(e.status(), e.body_text()))?;
    match runner::prewarm(&state, &req).await {
        Ok(done) => Ok(Json(done)),
        Err(runner::RunError::Invalid(m)) => Err(ApiError::BadRequest(m)),
        Err(runner::RunError::Sandbox(
            e @ (SandboxError::ImageNotFound(_) | SandboxError::InvalidSpec(_)),
        )) => Err(ApiError::BadRequest(e.to_string())),
        Err(e) => {
            tracing::warn!(key = %req.function_key, error = %e, "prewarm failed");
            Err(ApiError::Internal)
        }
    }
}

/// The most executables one `POST /v1/runnable` asks about (a DAG has at most so many
/// functions).
const MAX_RUNNABLES: usize = 1024;

/// `POST /v1/runnable`: which of these executables this agent cannot start, and why (its
/// sandbox's [`crate::sandbox::Sandbox::can_run`]). Bad names: 400, nothing looked up.
async fn runnable(
    State(state): State<Arc<AgentState>>,
    body: Result<Json<RunnableCheck>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<RunnableReport>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::Rejected(e.status(), e.body_text()))?;
    if req.runnables.len() > MAX_RUNNABLES {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_RUNNABLES} executables at once"
        )));
    }
    for r in &req.runnables {
        let program_ok = !r.program.is_empty()
            && r.program.len() <= 4096
            && !r.program.chars().any(char::is_control);
        if !sonic_core::dag::valid_image(&r.image) || !program_ok {
            return Err(ApiError::BadRequest(format!(
                "not an image and a program: {:?} {:?}",
                r.image.chars().take(80).collect::<String>(),
                r.program.chars().take(80).collect::<String>()
            )));
        }
    }
    let mut report = RunnableReport::default();
    for r in req.runnables {
        if let Err(why) = state.sandbox.can_run(&r.image, &r.program).await {
            report.missing.push(sonic_api::agent::NotRunnable {
                image: r.image,
                program: r.program,
                why,
            });
        }
    }
    Ok(Json(report))
}

/// `POST /v1/fetches`: a job's input files landed on this agent before its runs start
/// (`sonic_api::agent::FetchRequest`), answered when all are here. A request the checks refuse:
/// 400, nothing fetched; a file that could not be had (a peer, the store): 502.
async fn fetch(
    State(state): State<Arc<AgentState>>,
    body: Result<Json<FetchRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<FetchReport>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::Rejected(e.status(), e.body_text()))?;
    match runner::fetch(&state, &req).await {
        Ok(done) => Ok(Json(done)),
        Err(runner::RunError::Invalid(m)) => Err(ApiError::BadRequest(m)),
        Err(e) => {
            tracing::warn!(job = %req.job_id, error = %e, "fetch failed");
            Err(ApiError::BadGateway(e.to_string()))
        }
    }
}

/// Pushes a run's report to the control plane that asked for it: at the agent's own
/// `control_url` when it has one (where it joined), else at the URL the request named.
async fn push_report(state: &AgentState, requested: &str, report: &RunReport) {
    let base = state.config.control_url.as_deref().unwrap_or(requested);
    let outcome = crate::register::push_report(
        &state.http,
        base,
        &state.config.token,
        &state.config.id,
        report,
        crate::register::PUSH_ATTEMPTS,
    )
    .await;
    match &outcome {
        crate::register::PushOutcome::Taken => tracing::debug!("report pushed"),
        crate::register::PushOutcome::Refused(why) => {
            tracing::warn!(control = base, error = %why, "report push refused")
        }
        crate::register::PushOutcome::Failed(why) => {
            tracing::warn!(control = base, error = %why, "report push failed; the control plane will poll")
        }
    }
    state.metrics.report_pushed(&outcome);
}

async fn get_run(
    State(state): State<Arc<AgentState>>,
    Path(run_id): Path<String>,
) -> Result<Json<RunReport>, ApiError> {
    state
        .runs()
        .get(&run_id)
        .cloned()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no run {run_id:?} on this agent")))
}

/// `DELETE /v1/runs/{run_id}`: stops a run going on (204), keeping its report; 404 for a run
/// this agent does not know; 409 for one that already ended.
async fn stop_run(
    State(state): State<Arc<AgentState>>,
    Path(run_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.stop_runs(|id| id == run_id) > 0 {
        tracing::info!(run = %run_id, "run stopped");
        return Ok(StatusCode::NO_CONTENT);
    }
    match state.runs().get(&run_id) {
        Some(_) => Err(ApiError::Conflict(format!("run {run_id} already ended"))),
        None => Err(ApiError::NotFound(format!("no run {run_id}"))),
    }
}

/// `DELETE /v1/jobs/{id}?keep=files`: the job's runs stop and are forgotten, its files stay (a
/// failed job kept for a retry, which reuses what its succeeded runs wrote).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteJobQuery {
    keep: Option<String>,
}

async fn delete_job(
    State(state): State<Arc<AgentState>>,
    Path(job_id): Path<String>,
    query: Result<Query<DeleteJobQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let job = JobId::parse(&job_id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let keep_files = match q.keep.as_deref() {
        None => false,
        Some("files") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "keep: only `files` can be kept, not {other:?}"
            )));
        }
    };
    // Its runs still going on (a cancelled job, an abandoned execution) stop first.
    let prefix = format!("{job_id}.");
    let stopped = state.stop_runs(|id| id.starts_with(&prefix));
    if stopped > 0 {
        tracing::info!(job = %job_id, runs = stopped, "stopped the job's runs");
    }
    if keep_files {
        state.runs().retain(|id, _| !id.starts_with(&prefix));
        return Ok(StatusCode::NO_CONTENT);
    }
    let files = state.files.clone();
    let result = tokio::task::spawn_blocking(move || files.delete_job(&job)).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!(job = %job_id, error = %e, "deleting job files failed");
            return Err(ApiError::Internal);
        }
        Err(_) => return Err(ApiError::Internal),
    }
    state
        .runs()
        .retain(|id, _| !id.starts_with(&format!("{job_id}.")));
    state.fetch_locks.forget_job(&job_id);
    Ok(StatusCode::NO_CONTENT)
}

/// A running agent: its address and the handle to stop it.
#[derive(Debug)]
pub struct RunningAgent {
    pub addr: SocketAddr,
    pub state: Arc<AgentState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningAgent {
    /// The URL this agent advertises (`https://` when it serves TLS).
    pub fn url(&self) -> String {
        self.state.config.url()
    }

    /// Stops serving and removes warm containers.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
        if let Err(e) = self.state.sandbox.shutdown().await {
            tracing::warn!(error = %e, "sandbox shutdown");
        }
    }
}

/// Binds, serves, registers with the control plane (if configured) and keeps sending heartbeats.
/// Serves HTTPS when the configuration names a certificate.
pub async fn start(
    mut config: AgentConfig,
    sandbox: Arc<dyn Sandbox>,
    store: Option<Arc<dyn ObjectStore>>,
    throttle: &AgentThrottle,
) -> std::io::Result<RunningAgent> {
    let tls = load_tls(&config).await?;
    let listener = bind(&mut config).await?;
    start_on(listener, tls, config, sandbox, store, throttle).await
}

/// The certificate and key of the configuration, read and checked.
pub async fn load_tls(
    config: &AgentConfig,
) -> std::io::Result<Option<axum_server::tls_rustls::RustlsConfig>> {
    match &config.tls {
        Some(files) => Ok(Some(
            files
                .load()
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?,
        )),
        None => Ok(None),
    }
}

/// Binds the configured address; an agent without an `advertise_url` advertises the bound one.
pub async fn bind(config: &mut AgentConfig) -> std::io::Result<tokio::net::TcpListener> {
    let listener = sonic_daemon::net::bind(config.listen)?;
    let addr = listener.local_addr()?;
    if config.advertise_url.is_none() {
        let scheme = sonic_daemon::tls::scheme(config.tls.is_some());
        config.advertise_url = Some(format!("{scheme}://{addr}"));
    }
    Ok(listener)
}

/// Serves on a bound listener (see [`bind`]), then registers and sends heartbeats.
pub async fn start_on(
    listener: tokio::net::TcpListener,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    config: AgentConfig,
    sandbox: Arc<dyn Sandbox>,
    store: Option<Arc<dyn ObjectStore>>,
    throttle: &AgentThrottle,
) -> std::io::Result<RunningAgent> {
    let addr = listener.local_addr()?;
    sonic_daemon::tls::log_transport("agent", addr, config.tls.as_ref());
    let state = Arc::new(
        AgentState::new(config, sandbox, store, throttle)
            .map_err(|e| std::io::Error::other(e.to_string()))?,
    );
    let app = router(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let bg_state = state.clone();
    let task = tokio::spawn(async move {
        let serve = sonic_daemon::serve(listener, app, tls, async {
            let _ = rx.await;
        });
        let beats = heartbeat_loop(bg_state);
        tokio::select! {
            r = serve => if let Err(e) = r { tracing::error!(error = %e, "agent server failed") },
            () = beats => {}
        }
    });
    tracing::info!(%addr, agent = %state.config.id, url = %state.config.url(), sandbox = state.sandbox.kind(), "agent listening");
    Ok(RunningAgent {
        addr,
        state,
        shutdown: Some(tx),
        task,
    })
}

async fn heartbeat_loop(state: Arc<AgentState>) {
    let Some(control) = state.config.control_url.clone() else {
        return std::future::pending().await;
    };
    // An agent that joined presents the join token; else the shared token.
    let token = if state.config.joins() {
        state.config.join_token.clone()
    } else {
        state.config.token.clone()
    };
    // A joining agent registered before it served (it needed the secrets); the others register
    // now, retrying until the control plane answers (a refusal will not change by retrying).
    if !state.config.joins()
        && let Err(e) =
            crate::register::register(&state.http, &control, &token, &state.capacity(), u32::MAX)
                .await
    {
        tracing::error!(error = %e, "registration refused; not retrying");
        return std::future::pending().await;
    }
    let interval = std::time::Duration::from_millis(state.config.heartbeat_interval_ms.max(100));
    loop {
        tokio::time::sleep(interval).await;
        let beat = Heartbeat {
            agent_id: state.config.id.clone(),
            running: state.running.load(Ordering::SeqCst),
            bandwidth: state.meter.report(),
        };
        match crate::register::heartbeat(&state.http, &control, &token, &beat).await {
            Ok(()) => {}
            Err(crate::register::BeatError::UnknownAgent) => {
                // The control plane forgot this agent (a restart with a fresh database, or it
                // expired it): register again.
                tracing::warn!("control plane does not know this agent; registering again");
                match crate::register::register(&state.http, &control, &token, &state.capacity(), 5)
                    .await
                {
                    Ok(Some(secrets))
                        if secrets.agent_token != state.config.token
                            || secrets.file_key != state.config.file_key =>
                    {
                        tracing::error!(
                            "the control plane now hands out other secrets (its data folder was \
                             replaced?): restart this agent to take part in jobs again"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "registering again failed"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat"),
        }
    }
}
