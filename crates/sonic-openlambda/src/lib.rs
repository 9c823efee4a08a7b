//! OpenLambda's worker API on a listener of its own, with Python handlers in warm host processes.
//!
//! Routes (as OpenLambda's `go/worker/event` serves them): `POST /run/<name>[/extra]`,
//! `GET /status`, `GET /stats`, and the registry: `POST /registry/<name>` (a `.tar.gz` of the
//! lambda's folder), `DELETE /registry/<name>`, `GET /registry`, `GET /registry/<name>/config`.
//! docs/python.md says how to use it and what is not supported yet.

#![warn(missing_docs)]

pub mod config;
pub mod docker_venv;
pub mod package;
pub mod registry;
pub mod tarball;
pub mod venv;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};

pub use config::{LambdaConfig, OpenLambdaConfig, WorkerSandbox};
use worker::{CallError, Entry, HttpCall, HttpReply, Limits, Place, Worker};

/// The Python side of the runtime, written next to the registry at start.
pub const RUNTIME_PY: &str = include_str!("../python/sonic_ol_runtime.py");

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Listening off loopback needs a token.
    #[error("the OpenLambda listener on {0} is not loopback: set a token (openlambda_token)")]
    TokenRequired(SocketAddr),
    /// The token is too short to protect anything.
    #[error("the OpenLambda token must be at least 16 characters")]
    WeakToken,
    /// No usable Python.
    #[error("cannot run `{0}`: {1}")]
    Python(String, String),
    /// The Docker sandbox's image cannot be had.
    #[error("{0}")]
    Image(String),
    /// The registry folder or the listener.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Its configuration (an OpenLambda worker configuration that cannot be read).
    #[error("{0}")]
    Config(String),
}

/// A future the [`DagRunner`] answers with.
pub type DagFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What `POST /run/<name>` calls when `name` is not a registered lambda but may be a DAG: the
/// control plane runs a job of that DAG with the event as its input.
pub trait DagRunner: Send + Sync {
    /// Whether a DAG of this name is applied.
    fn has_dag<'a>(&'a self, name: &'a str) -> DagFuture<'a, bool>;

    /// Runs a job of DAG `name` with `event` as its input and returns the final function's
    /// result, or the job's error when it failed or could not start.
    fn run_dag<'a>(
        &'a self,
        name: &'a str,
        event: serde_json::Value,
    ) -> DagFuture<'a, Result<serde_json::Value, String>>;
}

struct Lambda {
    dir: PathBuf,
    /// Its tarball as installed, for DAG stages on other hosts (`None`: installed by a version
    /// that did not keep it; upload it again to use it in a DAG).
    package: Option<package::Package>,
    config: LambdaConfig,
    /// Its `requirements.txt` pins: its workers run in their environment.
    requirements: Option<venv::Requirements>,
    /// What it was installed from ([`registry::Source::digest`]; empty when not known): the
    /// registry folder's lambda is installed again when its digest differs.
    source: String,
    version: u64,
    /// Its warm workers waiting for a call, the most recently used last.
    idle: Vec<Idle>,
    queued: usize,
    slots: Arc<tokio::sync::Semaphore>,
}

/// One pull or upload of a lambda at a time ([`Handlers::one_at_a_time`]); the lock is
/// forgotten when no one else waits for it, so that names called once leave nothing behind.
struct NameGuard<'a> {
    h: &'a Handlers,
    name: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock(&self.h.name_locks);
        // The map's and this guard's: nobody else holds or waits for it.
        if Arc::strong_count(&self.lock) <= 2 {
            locks.remove(&self.name);
        }
    }
}

/// A warm worker waiting for a call, and since when.
struct Idle {
    worker: Worker,
    since: Instant,
}

/// What an install found in a lambda's code, besides its folder.
struct Installed {
    package: Option<package::Package>,
    config: LambdaConfig,
    requirements: Option<venv::Requirements>,
    source: String,
}

#[derive(Default)]
struct Timer {
    cnt: u64,
    total_ms: f64,
}

/// The listener's shared state.
pub struct Handlers {
    root: PathBuf,
    /// `<dir>/packages/<name>.tar.gz`: each lambda's tarball as installed.
    packages: PathBuf,
    python: PathBuf,
    runtime: PathBuf,
    cfg: OpenLambdaConfig,
    /// The `requirements.txt` environments: `<dir>/venvs/<sha256>/`, pip's cache in
    /// `<dir>/pip-cache/`.
    venvs: venv::Venvs,
    /// The Docker sandbox's environments, built in containers of its image:
    /// `<dir>/docker-venvs/<sha256>/` (seen at `/sonic/venv`), pip's cache in
    /// `<dir>/docker-pip-cache/`.
    docker_venvs: Option<venv::Venvs>,
    lambdas: Mutex<HashMap<String, Lambda>>,
    /// Serializes registry writes, so that two uploads of one name do not interleave.
    installs: tokio::sync::Mutex<()>,
    versions: AtomicU64,
    stats: Mutex<BTreeMap<String, Timer>>,
    cold_starts: AtomicUsize,
    evictions: AtomicUsize,
    /// Runs DAGs for `/run/<dag-name>`, once the control plane set it.
    dags: std::sync::OnceLock<Arc<dyn DagRunner>>,
    /// Per lambda, when the registry folder was last looked at for it.
    pulled: Mutex<HashMap<String, Instant>>,
    /// Per lambda, one pull or upload at a time.
    name_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Whether host workers get a `/tmp` of their own ([`worker::Scratch::PrivateTmp`]); else
    /// each gets a folder of its own under `scratch`.
    private_tmp: bool,
    /// `<dir>/scratch/`: host workers' scratch folders, when they have no `/tmp` of their own.
    scratch: PathBuf,
    /// The lambdas' cron triggers (`ol.yaml` `triggers.cron`).
    cron: sonic_daemon::cron::Scheduler<String>,
    /// This listener's state as its cron firings reach it (set once it is shared).
    me: std::sync::OnceLock<std::sync::Weak<Handlers>>,
}

impl Handlers {
    /// Opens the registry under `cfg.dir` (lambdas installed earlier are served again) and
    /// finds the real Python interpreter behind `cfg.python` (so that shims cost nothing per
    /// start).
    pub async fn open(cfg: OpenLambdaConfig) -> Result<Arc<Handlers>, StartError> {
        if !cfg.listen.ip().is_loopback() && cfg.token.is_empty() {
            return Err(StartError::TokenRequired(cfg.listen));
        }
        if !cfg.token.is_empty() && cfg.token.len() < 16 {
            return Err(StartError::WeakToken);
        }
        let out = tokio::process::Command::new(&cfg.python)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .await
            .map_err(|e| StartError::Python(cfg.python.clone(), e.to_string()))?;
        let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || exe.is_empty() {
            return Err(StartError::Python(
                cfg.python.clone(),
                "it did not report sys.executable".into(),
            ));
        }
        // Workers of listeners that are gone (a process that exited without stopping its
        // listener, or was killed) leave their CPU groups and containers: removed here.
        for group in worker::sweep_groups() {
            tracing::info!(group = %group.display(), "removed a stale /run/ worker cgroup");
        }
        if let WorkerSandbox::Docker { image } = &cfg.sandbox {
            check_image(image).await?;
            for name in worker::sweep_containers().await {
                tracing::info!(container = %name, "removed a stale /run/ worker container");
            }
        }
        let root = cfg.dir.join("registry");
        tokio::fs::create_dir_all(&root).await?;
        let packages = cfg.dir.join("packages");
        tokio::fs::create_dir_all(&packages).await?;
        let runtime = cfg.dir.join("sonic_ol_runtime.py");
        tokio::fs::write(&runtime, RUNTIME_PY).await?;
        let venvs = venv::Venvs::new(
            cfg.dir.join("venvs"),
            cfg.dir.join("pip-cache"),
            PathBuf::from(&exe),
            cfg.pip_timeout,
        );
        let docker_venvs = match &cfg.sandbox {
            WorkerSandbox::Process => None,
            WorkerSandbox::Docker { image } => Some(venv::Venvs::with_builder(
                cfg.dir.join("docker-venvs"),
                cfg.dir.join("docker-pip-cache"),
                docker_venv::venv_builder(image.clone()).map_err(StartError::Image)?,
                cfg.pip_timeout,
            )),
        };
        // Host workers' scratch space: those of an earlier listener on this folder go.
        let scratch = cfg.dir.join("scratch");
        let _ = tokio::fs::remove_dir_all(&scratch).await;
        tokio::fs::create_dir_all(&scratch).await?;
        let private_tmp = match &cfg.sandbox {
            WorkerSandbox::Process => private_tmp(&cfg.dir, Path::new(&exe)).await,
            // A container's /tmp is a tmpfs of its own.
            WorkerSandbox::Docker { .. } => false,
        };
        let handlers = Handlers {
            root: root.clone(),
            docker_venvs,
            packages: packages.clone(),
            python: PathBuf::from(exe),
            venvs,
            runtime,
            lambdas: Mutex::new(HashMap::new()),
            installs: tokio::sync::Mutex::new(()),
            versions: AtomicU64::new(1),
            stats: Mutex::new(BTreeMap::new()),
            cold_starts: AtomicUsize::new(0),
            evictions: AtomicUsize::new(0),
            dags: std::sync::OnceLock::new(),
            pulled: Mutex::new(HashMap::new()),
            name_locks: Mutex::new(HashMap::new()),
            private_tmp,
            scratch,
            cron: sonic_daemon::cron::Scheduler::new(),
            me: std::sync::OnceLock::new(),
            cfg,
        };
        if let Some(folder) = &handlers.cfg.registry_folder {
            tokio::fs::create_dir_all(folder).await?;
        }
        let mut rd = tokio::fs::read_dir(&root).await?;
        while let Some(e) = rd.next_entry().await? {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                let _ = tokio::fs::remove_dir_all(e.path()).await;
                continue;
            }
            let loaded = LambdaConfig::load(&e.path())
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    let reqs = venv::Requirements::load(&e.path()).map_err(|e| e.to_string())?;
                    Ok((c, reqs))
                });
            match loaded {
                Ok((config, requirements)) => {
                    let path = packages.join(format!("{name}.tar.gz"));
                    let package = match tokio::fs::read(&path).await {
                        Ok(bytes) => Some(package::Package {
                            sha256: package::sha256_hex(&bytes),
                            path,
                        }),
                        Err(_) => None,
                    };
                    let source = package
                        .as_ref()
                        .map_or_else(String::new, |p| p.sha256.clone());
                    let installed = Installed {
                        package,
                        config,
                        requirements,
                        source,
                    };
                    handlers.put(&name, e.path(), installed, 0)
                }
                Err(err) => {
                    tracing::warn!(lambda = %name, error = %err, "skipped an installed lambda")
                }
            }
        }
        let handlers = Arc::new(handlers);
        let _ = handlers.me.set(Arc::downgrade(&handlers));
        // The cron triggers of the lambdas installed before.
        let loaded: Vec<(String, LambdaConfig)> = lock(&handlers.lambdas)
            .iter()
            .map(|(n, l)| (n.clone(), l.config.clone()))
            .collect();
        for (name, config) in loaded {
            handlers.schedule(&name, &config);
        }
        Ok(handlers)
    }

    fn put(&self, name: &str, dir: PathBuf, installed: Installed, queued: usize) {
        let version = self.versions.fetch_add(1, Ordering::Relaxed);
        let Installed {
            package,
            config,
            requirements,
            source,
        } = installed;
        self.schedule(name, &config);
        let lambda = Lambda {
            dir,
            package,
            config,
            requirements,
            source,
            version,
            idle: Vec::new(),
            queued,
            slots: Arc::new(tokio::sync::Semaphore::new(
                self.cfg.workers_per_lambda.max(1),
            )),
        };
        lock(&self.lambdas).insert(name.to_string(), lambda);
    }

    fn record(&self, timer: &str, since: Instant) {
        let mut stats = lock(&self.stats);
        let t = stats.entry(timer.to_string()).or_default();
        t.cnt += 1;
        t.total_ms += since.elapsed().as_secs_f64() * 1000.0;
    }

    /// The registered lambda `name`'s tarball (its digest and where the registry keeps it), for
    /// a DAG stage that runs it; `None` when no such lambda is registered, or it was installed
    /// by a version that did not keep its tarball.
    pub fn package(&self, name: &str) -> Option<package::Package> {
        lock(&self.lambdas)
            .get(name)
            .and_then(|l| l.package.clone())
    }

    /// `POST /run/<name>` of a name that is not a registered lambda runs the DAG of that name
    /// through `runner` (the first call wins).
    pub fn set_dags(&self, runner: Arc<dyn DagRunner>) {
        let _ = self.dags.set(runner);
    }

    /// Schedules lambda `name`'s cron triggers (in place of those it had): each firing calls it
    /// as OpenLambda's boss does, with the event `{}`, and logs what it answered. Until the
    /// listener is shared (while it opens), nothing is scheduled.
    fn schedule(&self, name: &str, config: &LambdaConfig) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        if config.cron.is_empty() {
            self.cron.remove(&name.to_owned());
            return;
        }
        let lambda = name.to_owned();
        let schedules = config.cron.clone();
        let next = move |after| sonic_core::schedule::next_of(&schedules, after);
        self.cron.set(name.to_owned(), next, move |_at| {
            let (me, name) = (me.clone(), lambda.clone());
            async move {
                let Some(h) = me.upgrade() else { return };
                let call = Call {
                    path: "/".into(),
                    query: String::new(),
                    headers: HeaderMap::new(),
                    cron: true,
                };
                let t0 = Instant::now();
                let answer = run_inner(&h, &name, &Method::POST, &call, b"{}").await;
                h.record("cron-run", t0);
                let status = answer.status();
                if status.is_success() {
                    tracing::info!(lambda = %name, %status, "cron trigger ran the lambda");
                } else {
                    let body = axum::body::to_bytes(answer.into_body(), 4096)
                        .await
                        .unwrap_or_default();
                    tracing::warn!(lambda = %name, %status, answer = %String::from_utf8_lossy(&body).trim(), "cron trigger: the lambda failed");
                }
            }
        });
    }

    /// Waits until no other pull or upload of lambda `name` runs, and holds that until the
    /// guard is dropped.
    async fn one_at_a_time(&self, name: &str) -> NameGuard<'_> {
        let lock = lock(&self.name_locks)
            .entry(name.to_owned())
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        NameGuard {
            h: self,
            name: name.to_owned(),
            lock,
            guard: Some(guard),
        }
    }

    /// Whether a lambda named `name` is registered.
    pub fn has(&self, name: &str) -> bool {
        lock(&self.lambdas).contains_key(name)
    }

    /// Where `/run/` workers' `requirements.txt` environments are built: on the host with
    /// `python` (process sandbox), or in containers of the image (Docker).
    fn venvs_for_workers(&self) -> &venv::Venvs {
        self.docker_venvs.as_ref().unwrap_or(&self.venvs)
    }

    /// How many Python workers were started (cold starts), for tests and benches.
    pub fn cold_starts(&self) -> usize {
        self.cold_starts.load(Ordering::Relaxed)
    }

    /// The lambdas whose cron triggers are scheduled.
    pub fn scheduled(&self) -> Vec<String> {
        let mut names = self.cron.keys();
        names.sort();
        names
    }

    /// How many warm workers wait for a call now.
    pub fn warm(&self) -> usize {
        lock(&self.lambdas).values().map(|l| l.idle.len()).sum()
    }

    /// How many warm workers were stopped for idling past `keep_alive` or for `max_warm`.
    pub fn evictions(&self) -> usize {
        self.evictions.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Whether host workers can have a `/tmp` of their own: the listener's folder (lambdas, their
/// environments, the runtime) and the interpreter must lie outside `/tmp`, which the worker's
/// tmpfs hides, and this process must be allowed to make mount namespaces (root). Says why not.
async fn private_tmp(dir: &Path, python: &Path) -> bool {
    let under_tmp = |p: &Path| std::fs::canonicalize(p).is_ok_and(|p| p.starts_with("/tmp"));
    let why_not = if under_tmp(dir) {
        Some(format!(
            "the listener's folder {} is under /tmp",
            dir.display()
        ))
    } else if under_tmp(python) {
        Some(format!(
            "the interpreter {} is under /tmp",
            python.display()
        ))
    } else if !tokio::task::spawn_blocking(worker::private_tmp_works)
        .await
        .unwrap_or(false)
    {
        Some("mount namespaces cannot be made here (they need root)".to_owned())
    } else {
        None
    };
    match why_not {
        None => true,
        Some(why) => {
            tracing::warn!(
                "/run/ workers in the process sandbox get a scratch folder of their own as TMPDIR, not a /tmp of their own ({why}): a handler that names /tmp writes to the host's"
            );
            false
        }
    }
}

/// Refuses to start the Docker sandbox without its engine or image, saying how to get them.
async fn check_image(image: &str) -> Result<(), StartError> {
    let out = tokio::process::Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| {
            StartError::Image(format!(
                "cannot run `docker` for the /run/ workers' Docker sandbox: {e}"
            ))
        })?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    Err(StartError::Image(
        if said.contains("No such image") || said.contains("No such object") {
            format!(
                "the /run/ workers' image {image} is missing: build it with `bash deploy/build-python-image.sh`"
            )
        } else {
            format!(
                "the Docker engine does not answer for the /run/ workers' image {image}: {said}"
            )
        },
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The OpenLambda routes over `handlers`.
pub fn router(handlers: Arc<Handlers>) -> Router {
    let limit = handlers.cfg.max_body;
    Router::new()
        .route("/status", get(|| async { "ready\n" }))
        .route("/stats", get(stats))
        .route("/run/{name}", any(run))
        .route("/run/{name}/", any(run))
        .route("/run/{name}/{*extra}", any(run_extra))
        .route("/registry", get(list))
        .route("/registry/", get(list))
        .route(
            "/registry/{name}",
            post(install).delete(remove).get(not_implemented),
        )
        .route("/registry/{name}/config", get(show_config))
        .layer(middleware::from_fn_with_state(handlers.clone(), auth))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(handlers)
}

async fn auth(State(h): State<Arc<Handlers>>, req: Request, next: Next) -> Response {
    if h.cfg.token.is_empty() || req.uri().path() == "/status" {
        return next.run(req).await;
    }
    let sent = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if sent.is_some_and(|t| sonic_daemon::secret::matches(t.as_bytes(), h.cfg.token.as_bytes())) {
        next.run(req).await
    } else {
        (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response()
    }
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response {
    let mut m = msg.into();
    if !m.ends_with('\n') {
        m.push('\n');
    }
    (status, m).into_response()
}

/// A 400 for a name that cannot be a registry folder.
fn invalid_name(name: &str) -> Option<Response> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        None
    } else {
        Some(text(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid lambda name `{name}`: use letters, digits, `-`, `_` and `.` (not first)"
            ),
        ))
    }
}

async fn stats(State(h): State<Arc<Handlers>>) -> Response {
    let mut out = serde_json::Map::new();
    for (name, t) in lock(&h.stats).iter() {
        out.insert(format!("{name}.cnt"), t.cnt.into());
        let avg = if t.cnt == 0 {
            0
        } else {
            (t.total_ms / t.cnt as f64).round() as u64
        };
        out.insert(format!("{name}.ms-avg"), avg.into());
    }
    // The packages of lambdas' `requirements.txt` that runs needed, each once (OpenLambda's count
    // of the packages its worker pulled; absent until one was; `venv::Venvs::needed_by_a_run`).
    let (cnt, total_ms) = [Some(&h.venvs), h.docker_venvs.as_ref()]
        .into_iter()
        .flatten()
        .map(venv::Venvs::pulled)
        .fold((0, 0.0), |(c, t), (c2, t2)| (c + c2, t + t2));
    if cnt > 0 {
        out.insert("pull-package.cnt".into(), cnt.into());
        out.insert(
            "pull-package.ms-avg".into(),
            ((total_ms / cnt as f64).round() as u64).into(),
        );
    }
    axum::Json(out).into_response()
}

async fn run_extra(
    State(h): State<Arc<Handlers>>,
    UrlPath((name, extra)): UrlPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run_at(
        &h,
        &name,
        format!("/{extra}"),
        &method,
        &uri,
        headers,
        &body,
    )
    .await
}

/// What an app lambda is handed of a request beyond its method and body.
struct Call {
    /// The path after `/run/<name>`, from `/`.
    path: String,
    /// The query string, without `?`.
    query: String,
    headers: HeaderMap,
    /// A call of one of the lambda's cron triggers, not of HTTP: its HTTP methods do not apply.
    cron: bool,
}

/// A place in a lambda's queue, given back on drop.
struct Queued<'a>(&'a Handlers, String);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(l) = lock(&self.0.lambdas).get_mut(&self.1) {
            l.queued = l.queued.saturating_sub(1);
        }
    }
}

async fn run(
    State(h): State<Arc<Handlers>>,
    UrlPath(name): UrlPath<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run_at(&h, &name, "/".into(), &method, &uri, headers, &body).await
}

/// `/run/<name>` with `path` after the name: the call, timed as OpenLambda's `web-request`.
async fn run_at(
    h: &Handlers,
    name: &str,
    path: String,
    method: &Method,
    uri: &Uri,
    headers: HeaderMap,
    body: &[u8],
) -> Response {
    let req = Call {
        path,
        query: uri.query().unwrap_or("").to_owned(),
        headers,
        cron: false,
    };
    let t0 = Instant::now();
    let resp = run_inner(h, name, method, &req, body).await;
    h.record("web-request", t0);
    resp
}

async fn run_inner(h: &Handlers, name: &str, method: &Method, req: &Call, body: &[u8]) -> Response {
    if let Some(r) = invalid_name(name) {
        return r;
    }
    if let Err(msg) = pull(h, name).await {
        return text(StatusCode::INTERNAL_SERVER_ERROR, msg);
    }
    if !h.has(name)
        && let Some(dags) = h.dags.get()
        && sonic_dag_name(name)
        && dags.has_dag(name).await
    {
        return run_dag(dags.as_ref(), name, method, body).await;
    }
    let (slots, _queued) = {
        let mut lambdas = lock(&h.lambdas);
        let Some(l) = lambdas.get_mut(name) else {
            return text(
                StatusCode::NOT_FOUND,
                format!("lambda `{name}` is not in the registry"),
            );
        };
        if !req.cron && !l.config.allows(method.as_str()) {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "HTTP method not allowed. Sent: {}, Allowed: [{}]",
                    method,
                    l.config.allowed_methods().join(" ")
                ),
            );
        }
        if l.queued >= h.cfg.queue_per_lambda {
            return text(
                StatusCode::TOO_MANY_REQUESTS,
                format!("lambda `{name}`: too many requests waiting"),
            );
        }
        l.queued += 1;
        (l.slots.clone(), Queued(h, name.to_string()))
    };
    // An `f(event)` lambda's event: no body is the empty object, as OpenLambda's runtime gives
    // it. An app lambda gets the body as sent instead (known once a worker says which it is).
    let event: Result<serde_json::Value, String> = if body.iter().all(u8::is_ascii_whitespace) {
        Ok(serde_json::Value::Object(serde_json::Map::new()))
    } else {
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))
    };
    let Ok(_slot) = slots.acquire_owned().await else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the lambda was removed");
    };
    let limits = Limits {
        timeout: h.cfg.timeout,
        max_output: h.cfg.max_output,
        memory: h.cfg.worker_memory,
        cpus: h.cfg.worker_cpus,
        resident: h.cfg.worker_resident,
        procs: h.cfg.worker_procs,
    };
    // A warm worker of the current code, or a cold start.
    let taken = {
        let mut lambdas = lock(&h.lambdas);
        let Some(l) = lambdas.get_mut(name) else {
            return text(
                StatusCode::NOT_FOUND,
                format!("lambda `{name}` is not in the registry"),
            );
        };
        let current = l.version;
        l.idle
            .retain_mut(|i| i.worker.version == current && i.worker.alive());
        let reqs = l.requirements.clone();
        let warm = l.idle.pop().map(|i| i.worker);
        (warm, l.dir.clone(), l.config.env(), reqs, current)
    };
    let (warm, dir, env, reqs, version) = taken;
    let mut w = match warm {
        Some(w) => w,
        None => {
            // Built at upload; after a restart or a removed folder, built again here once.
            // The interpreter (process sandbox) or the environment's folder (Docker).
            let python = match &reqs {
                None => h.python.clone(),
                Some(r) => match h.venvs_for_workers().ensure(r).await {
                    Ok(p) => {
                        h.venvs_for_workers().needed_by_a_run(r);
                        p
                    }
                    Err(e) => {
                        return text(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("lambda `{name}`: {e}"),
                        );
                    }
                },
            };
            let docker_venv = match (&reqs, &h.docker_venvs) {
                (Some(r), Some(v)) => Some(v.dir_of(r)),
                _ => None,
            };
            h.cold_starts.fetch_add(1, Ordering::Relaxed);
            let t = Instant::now();
            // A host worker's scratch space: a /tmp of its own, else a folder of its own.
            let folder = match (&h.cfg.sandbox, h.private_tmp) {
                (WorkerSandbox::Process, false) => {
                    let n = h.versions.fetch_add(1, Ordering::Relaxed);
                    let folder = h.scratch.join(n.to_string());
                    if let Err(e) = tokio::fs::create_dir_all(&folder).await {
                        return text(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("cannot make a worker's scratch folder: {e}"),
                        );
                    }
                    Some(folder)
                }
                _ => None,
            };
            let scratch = match &folder {
                Some(f) => worker::Scratch::Folder(f),
                None => worker::Scratch::PrivateTmp {
                    bytes: worker::WORKER_TMP_BYTES,
                },
            };
            let place = match &h.cfg.sandbox {
                WorkerSandbox::Process => Place::Host {
                    python: &python,
                    runtime: &h.runtime,
                    scratch,
                },
                WorkerSandbox::Docker { image } => Place::Docker {
                    image,
                    runtime: &h.runtime,
                    registry: &h.root,
                    venv: docker_venv.as_deref(),
                },
            };
            let started = Worker::start(place, &dir, &env, version, &limits).await;
            h.record("cold-start", t);
            match started {
                Ok(w) => w,
                Err(e) => {
                    if let Some(f) = folder {
                        let _ = tokio::fs::remove_dir_all(f).await;
                    }
                    return call_error(name, e);
                }
            }
        }
    };
    if w.entry != Entry::Func {
        let call = HttpCall {
            method: method.to_string(),
            app: name.to_owned(),
            path: req.path.clone(),
            query: req.query.clone(),
            headers: req
                .headers
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
            body: body.to_vec(),
        };
        let t = Instant::now();
        let answered = w.call_http(&call, &limits).await;
        h.record("LambdaInstance-RoundTrip", t);
        return match answered {
            Ok(reply) => {
                give_back(h, name, w);
                app_response(name, reply)
            }
            Err(e @ CallError::Raised(_)) => {
                give_back(h, name, w);
                call_error(name, e)
            }
            Err(e) => call_error(name, e),
        };
    }
    let event = match event {
        Ok(v) => v,
        Err(msg) => {
            give_back(h, name, w);
            return text(StatusCode::BAD_REQUEST, msg);
        }
    };
    let t = Instant::now();
    let answered = w.call(&event, &limits).await;
    h.record("LambdaInstance-RoundTrip", t);
    match answered {
        Ok(v) => {
            give_back(h, name, w);
            axum::Json(v).into_response()
        }
        Err(e @ CallError::Raised(_)) => {
            give_back(h, name, w);
            call_error(name, e)
        }
        Err(e) => call_error(name, e),
    }
}

/// An app's answer as it gave it: its status, its headers (those of the connection itself
/// excepted: the listener frames the body) and its body. A status or header HTTP cannot carry
/// is the app's error: 500.
fn app_response(name: &str, reply: HttpReply) -> Response {
    let Ok(status) = StatusCode::from_u16(reply.status) else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("lambda `{name}` answered status {}", reply.status),
        );
    };
    let mut resp = (status, reply.body).into_response();
    let headers = resp.headers_mut();
    headers.remove(header::CONTENT_TYPE);
    for (k, v) in &reply.headers {
        let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) else {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("lambda `{name}` answered a header HTTP cannot carry: {k:?}"),
            );
        };
        if matches!(
            k,
            header::CONTENT_LENGTH | header::TRANSFER_ENCODING | header::CONNECTION
        ) {
            continue;
        }
        headers.append(k, v);
    }
    resp
}

/// A DAG's name: `[a-z0-9-]`, starting and ending with a letter or digit, at most 63.
fn sonic_dag_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

/// `POST /run/<dag-name>`: a job of the DAG with the body as its input; 200 with the final
/// function's result, 500 with the job's error.
async fn run_dag(dags: &dyn DagRunner, name: &str, method: &Method, body: &[u8]) -> Response {
    if method != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("HTTP method not allowed. Sent: {method}, Allowed: [POST]"),
        );
    }
    let event: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not JSON: {e}"),
                );
            }
        }
    };
    match dags.run_dag(name, event).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Keeps a worker warm for its lambda's next call (when its code is still current and the lambda
/// reuses sandboxes). Past `max_warm` warm workers in all, the one idle longest goes.
fn give_back(h: &Handlers, name: &str, w: Worker) {
    let mut lambdas = lock(&h.lambdas);
    if let Some(l) = lambdas.get_mut(name)
        && l.version == w.version
        && l.config.reuse_sandbox
    {
        l.idle.push(Idle {
            worker: w,
            since: Instant::now(),
        });
    }
    let mut warm: usize = lambdas.values().map(|l| l.idle.len()).sum();
    while warm > h.cfg.max_warm {
        let oldest = lambdas
            .values_mut()
            .filter_map(|l| Some((l.idle.first()?.since, l)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, l)| l.idle.remove(0));
        let Some(gone) = oldest else { break };
        warm -= 1;
        h.evictions.fetch_add(1, Ordering::Relaxed);
        h.record("evict", Instant::now());
        tokio::spawn(gone.worker.shutdown());
    }
}

/// Stops the warm workers idle for `keep_alive` or longer; returns how many.
async fn evict_idle(h: &Handlers) -> usize {
    let keep_alive = h.cfg.keep_alive;
    let expired: Vec<Worker> = {
        let mut lambdas = lock(&h.lambdas);
        let mut expired = Vec::new();
        for l in lambdas.values_mut() {
            // The oldest come first.
            let n = l
                .idle
                .iter()
                .take_while(|i| i.since.elapsed() >= keep_alive)
                .count();
            expired.extend(l.idle.drain(..n).map(|i| i.worker));
        }
        expired
    };
    let n = expired.len();
    h.evictions.fetch_add(n, Ordering::Relaxed);
    let t = Instant::now();
    futures::future::join_all(expired.into_iter().map(Worker::shutdown)).await;
    for _ in 0..n {
        h.record("evict", t);
    }
    n
}

fn call_error(name: &str, e: CallError) -> Response {
    let status = match e {
        CallError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if !matches!(e, CallError::Raised(_)) {
        tracing::warn!(lambda = %name, error = %e, "handler call failed");
    }
    text(status, e.to_string())
}

async fn list(State(h): State<Arc<Handlers>>) -> Response {
    let mut names: Vec<String> = lock(&h.lambdas).keys().cloned().collect();
    if let Some(folder) = h.cfg.registry_folder.clone() {
        let found = tokio::task::spawn_blocking(move || registry::names(&folder))
            .await
            .unwrap_or_default();
        names.extend(found.into_iter().filter(|n| invalid_name(n).is_none()));
    }
    names.sort();
    names.dedup();
    axum::Json(names).into_response()
}

async fn not_implemented() -> Response {
    text(StatusCode::NOT_IMPLEMENTED, "not implemented")
}

async fn show_config(State(h): State<Arc<Handlers>>, UrlPath(name): UrlPath<String>) -> Response {
    if let Some(r) = invalid_name(&name) {
        return r;
    }
    if let Err(msg) = pull(&h, &name).await {
        return text(StatusCode::INTERNAL_SERVER_ERROR, msg);
    }
    match lock(&h.lambdas).get(&name) {
        Some(l) => axum::Json(l.config.to_json()).into_response(),
        None => text(
            StatusCode::NOT_FOUND,
            format!("lambda `{name}` is not in the registry"),
        ),
    }
}

async fn install(
    State(h): State<Arc<Handlers>>,
    UrlPath(name): UrlPath<String>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = invalid_name(&name) {
        return r;
    }
    let t0 = Instant::now();
    let _one = h.one_at_a_time(&name).await;
    let source = registry::Source::Tarball(body.clone());
    let digest = source.digest();
    if let Err((status, msg)) = install_source(&h, &name, source, digest).await {
        return text(status, msg);
    }
    // With a registry folder, the upload is kept there, as OpenLambda's worker keeps it.
    if let Some(folder) = h.cfg.registry_folder.clone() {
        let n = h.versions.fetch_add(1, Ordering::Relaxed);
        let kept = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || registry::keep(&folder, &name, &body, n))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r)
        };
        if let Err(e) = kept {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("lambda `{name}` installed, but not kept in the registry folder: {e}"),
            );
        }
        lock(&h.pulled).insert(name.clone(), Instant::now());
    }
    h.record("registry-upload", t0);
    (StatusCode::CREATED, format!("lambda `{name}` installed\n")).into_response()
}

/// Installs lambda `name` from `source` (whose content `digest` names): unpacked beside, its
/// `ol.yaml`, entry file and `requirements.txt` checked and its environment built, then put in
/// place of the old version at once. On error nothing changed: the status and message say why.
async fn install_source(
    h: &Handlers,
    name: &str,
    source: registry::Source,
    digest: String,
) -> Result<(), (StatusCode, String)> {
    let n = h.versions.fetch_add(1, Ordering::Relaxed);
    let staging = h.root.join(format!(".new-{name}-{n}"));
    let max = h.cfg.max_unpacked;
    let st = staging.clone();
    type Unpacked = (LambdaConfig, Option<venv::Requirements>, registry::Source);
    let unpacked = tokio::task::spawn_blocking(move || -> Result<Unpacked, String> {
        std::fs::create_dir(&st).map_err(|e| e.to_string())?;
        source.unpack(&st, max)?;
        let config = LambdaConfig::load(&st).map_err(|e| e.to_string())?;
        let entry = config.entry_file()?;
        if !st.join(entry).is_file() {
            return Err(format!("the tarball has no {entry} at its top (pack the lambda's folder: tar -czf name.tar.gz -C dir .)"));
        }
        let reqs = venv::Requirements::load(&st).map_err(|e| e.to_string())?;
        Ok((config, reqs, source))
    })
    .await;
    let (config, requirements, source) = match unpacked {
        Ok(Ok(c)) => c,
        Ok(Err(msg)) => {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return Err((StatusCode::BAD_REQUEST, msg));
        }
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unpacking failed: {e}"),
            ));
        }
    };
    // Its environment is built before anything is replaced: a failed install keeps the previous
    // version serving. Concurrent uploads of one requirements set wait for the same build.
    if let Some(r) = &requirements
        && let Err(e) = h.venvs_for_workers().ensure(r).await
    {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        let status = match e {
            venv::VenvError::Pip { .. } => StatusCode::BAD_REQUEST,
            venv::VenvError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        return Err((status, format!("lambda `{name}` not installed: {e}")));
    }
    let _one = h.installs.lock().await;
    // A tarball is kept as sent (it unpacked safely), for DAG stages on other hosts.
    let package_path = h.packages.join(format!("{name}.tar.gz"));
    let package = match &source {
        registry::Source::Tarball(tarball) => {
            let package_tmp = h.packages.join(format!(".new-{name}-{n}"));
            let kept = async {
                tokio::fs::write(&package_tmp, tarball).await?;
                tokio::fs::rename(&package_tmp, &package_path).await
            }
            .await;
            if let Err(e) = kept {
                let _ = tokio::fs::remove_dir_all(&staging).await;
                let _ = tokio::fs::remove_file(&package_tmp).await;
                return Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot keep the tarball: {e}"),
                ));
            }
            // A tarball's digest is its SHA-256 (`registry::Source::digest`).
            Some(package::Package {
                sha256: digest.clone(),
                path: package_path,
            })
        }
        // A script or folder of the registry folder has no tarball to ship to other hosts.
        _ => {
            let _ = tokio::fs::remove_file(&package_path).await;
            None
        }
    };
    let dest = h.root.join(name);
    let old = h.root.join(format!(".old-{name}-{n}"));
    let swapped = async {
        if tokio::fs::try_exists(&dest).await? {
            tokio::fs::rename(&dest, &old).await?;
        }
        tokio::fs::rename(&staging, &dest).await
    }
    .await;
    if let Err(e) = swapped {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot install: {e}"),
        ));
    }
    // The new version replaces the old one; its warm workers are dropped (killed) here or when
    // their call ends, so that the next call imports the new code.
    // Calls of the old code still hold their place in the queue (they give it back on drop).
    let previous = lock(&h.lambdas).remove(name);
    let queued = previous.as_ref().map_or(0, |l| l.queued);
    drop(previous);
    let installed = Installed {
        package,
        config,
        requirements,
        source: digest,
    };
    h.put(name, dest, installed, queued);
    let _ = tokio::fs::remove_dir_all(&old).await;
    tracing::info!(lambda = %name, "lambda installed");
    Ok(())
}

/// With a registry folder, brings lambda `name` up to date with it before a call: looked at
/// when it was not within the cache interval; installed when its content changed; removed
/// when the folder no longer has it. A version that cannot be installed leaves the one before
/// serving (and is tried again after the interval); with none before, the call fails (500)
/// with why.
async fn pull(h: &Handlers, name: &str) -> Result<(), String> {
    let Some(folder) = h.cfg.registry_folder.clone() else {
        return Ok(());
    };
    let fresh = || {
        lock(&h.pulled)
            .get(name)
            .is_some_and(|t| t.elapsed() < h.cfg.registry_cache)
    };
    if fresh() {
        return Ok(());
    }
    let _one = h.one_at_a_time(name).await;
    if fresh() {
        return Ok(());
    }
    let t0 = Instant::now();
    let found = {
        let (name, max) = (name.to_owned(), h.cfg.max_unpacked);
        tokio::task::spawn_blocking(move || registry::find(&folder, &name, max))
            .await
            .unwrap_or_else(|e| Err(format!("reading the registry folder failed: {e}")))
    };
    lock(&h.pulled).insert(name.to_owned(), Instant::now());
    let failed = |msg: String| {
        if h.has(name) {
            tracing::warn!(lambda = %name, error = %msg, "the registry folder's new version cannot be installed; the one before serves");
            Ok(())
        } else {
            Err(format!(
                "lambda `{name}` in the registry folder cannot be installed: {msg}"
            ))
        }
    };
    match found {
        Ok(None) => {
            // Not (or no longer) in the folder: not in the registry. A name called that was
            // never there leaves no entry.
            lock(&h.pulled).remove(name);
            let _install = h.installs.lock().await;
            if uninstall(h, name).await {
                tracing::info!(lambda = %name, "removed: the registry folder no longer has it");
            }
            Ok(())
        }
        Ok(Some(source)) => {
            let digest = source.digest();
            if lock(&h.lambdas)
                .get(name)
                .is_some_and(|l| l.source == digest)
            {
                return Ok(());
            }
            match install_source(h, name, source, digest).await {
                Ok(()) => {
                    h.record("pull-lambda", t0);
                    Ok(())
                }
                Err((_, msg)) => failed(msg),
            }
        }
        Err(msg) => failed(msg),
    }
}

async fn remove(State(h): State<Arc<Handlers>>, UrlPath(name): UrlPath<String>) -> Response {
    if let Some(r) = invalid_name(&name) {
        return r;
    }
    let _name = h.one_at_a_time(&name).await;
    let _one = h.installs.lock().await;
    // With a registry folder, the lambda goes from there too (every form of it).
    let in_folder = match &h.cfg.registry_folder {
        None => false,
        Some(folder) => match registry::remove(folder, &name) {
            Ok(found) => {
                lock(&h.pulled).remove(&name);
                found
            }
            Err(e) => {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot remove lambda `{name}` from the registry folder: {e}"),
                );
            }
        },
    };
    if !uninstall(&h, &name).await && !in_folder {
        return text(
            StatusCode::NOT_FOUND,
            format!("lambda `{name}` is not in the registry"),
        );
    }
    text(StatusCode::OK, format!("lambda `{name}` deleted"))
}

/// Takes lambda `name` out of the registry: its schedules, its entry (its warm workers go with
/// it), its folder and its kept tarball. Whether it was installed. The caller holds `installs`.
async fn uninstall(h: &Handlers, name: &str) -> bool {
    h.cron.remove(&name.to_owned());
    if lock(&h.lambdas).remove(name).is_none() {
        return false;
    }
    if let Err(e) = tokio::fs::remove_dir_all(h.root.join(name)).await {
        tracing::warn!(lambda = %name, error = %e, "cannot remove the lambda's folder");
    }
    let _ = tokio::fs::remove_file(h.packages.join(format!("{name}.tar.gz"))).await;
    true
}

/// A running OpenLambda listener.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub handlers: Arc<Handlers>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    /// Stops workers idle past the keep-alive.
    evictor: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops listening, then stops the warm workers and waits until they are gone: their
    /// processes reaped and CPU groups removed, or their containers removed.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
        self.evictor.abort();
        let _ = (&mut self.evictor).await;
        self.handlers.cron.clear();
        let workers: Vec<Worker> = lock(&self.handlers.lambdas)
            .drain()
            .flat_map(|(_, l)| l.idle.into_iter().map(|i| i.worker))
            .collect();
        futures::future::join_all(workers.into_iter().map(Worker::shutdown)).await;
        if let WorkerSandbox::Docker { .. } = &self.handlers.cfg.sandbox {
            // Also the containers of workers dropped earlier (timed out, replaced), whose
            // removal may still be under way.
            worker::remove_containers_of(&self.handlers.root).await;
        }
    }
}

/// Opens the registry and serves the OpenLambda routes on `cfg.listen` (plain HTTP).
pub async fn start(cfg: OpenLambdaConfig) -> Result<Running, StartError> {
    let listen = cfg.listen;
    let handlers = Handlers::open(cfg).await?;
    // An accept queue for bursts of invocations (`sonic_daemon::net`).
    let listener = sonic_daemon::net::bind(listen)?;
    let addr = listener.local_addr()?;
    let app = router(handlers.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the OpenLambda listener stopped");
        }
    });
    let evictor = {
        let h = handlers.clone();
        // Often enough that a worker goes within a tenth of its keep-alive after it.
        let tick = (h.cfg.keep_alive / 10).clamp(Duration::from_millis(50), Duration::from_secs(5));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                evict_idle(&h).await;
            }
        })
    };
    tracing::info!(%addr, "OpenLambda listener ready");
    Ok(Running {
        addr,
        handlers,
        stop: Some(tx),
        task,
        evictor,
    })
}

/// How long a warm worker may wait for a call before it is stopped
/// (`openlambda.keep_alive`).
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(600);

/// How many warm workers may wait for calls at once, across lambdas (`openlambda.max_warm`).
pub const DEFAULT_MAX_WARM: usize = 32;

/// The default timeout of a call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The address space a warm worker may map by default (2 GiB).
pub const DEFAULT_WORKER_MEMORY: u64 = 2 << 30;

/// The CPUs one warm `/run/` worker may use by default (`OpenLambdaConfig::worker_cpus`).
pub const DEFAULT_WORKER_CPUS: f64 = 1.0;

/// The processes and threads one `/run/` worker may have at once, itself included
/// (`openlambda.worker_procs`).
pub const DEFAULT_WORKER_PROCS: u32 = 128;

/// How long code pulled from a registry folder is used before the folder is looked at again
/// (`registry_cache_ms` of OpenLambda's worker configuration, whose default this is).
pub const DEFAULT_REGISTRY_CACHE: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}
