//! Running the control plane: open the database, bind, serve until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;

use sonic_core::catalog::Catalog;
use sonic_storage::StoreChoice;

use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, ControlConfig};
use crate::exec::{JobsConfig, Runtime};
use crate::http::api::{ControlState, router};
use crate::store::{Db, StoreError};

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration cannot be run with.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened or migrated.
    #[error("database: {0}")]
    Store(#[from] StoreError),
    /// The listen address is taken or not allowed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    /// The certificate, key or CA could not be loaded.
    #[error("{0}")]
    Tls(#[from] sonic_daemon::tls::TlsError),
    /// The object store could not be opened.
    #[error("object store {location}: {source}")]
    ObjectStore {
        /// Where the store is (its endpoint and bucket, or its folder).
        location: String,
        /// Why.
        source: sonic_storage::StoreError,
    },
    /// The OpenLambda listener could not start.
    #[error("OpenLambda listener: {0}")]
    OpenLambda(#[from] sonic_openlambda::StartError),
    /// The VM catalog could not be read.
    #[error("catalog {path}: {message}")]
    Catalog {
        /// The catalog file.
        path: String,
        /// Why.
        message: String,
    },
}

/// A control plane serving in the background.
#[derive(Debug)]
pub struct RunningControl {
    /// The bound address (the real port when the configuration asked for port 0).
    pub addr: SocketAddr,
    /// Whether it serves HTTPS.
    pub tls: bool,
    /// What the handlers share: the database, the runtime, the settings.
    pub state: Arc<ControlState>,
    /// OpenLambda's worker API, when configured (`openlambda`).
    pub openlambda: Option<sonic_openlambda::Running>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningControl {
    /// The URL it is reached at (`http://` or `https://`, the bound address).
    pub fn url(&self) -> String {
        format!("{}://{}", sonic_daemon::tls::scheme(self.tls), self.addr)
    }

    /// Stops accepting, lets requests in flight finish, and returns when the server is down.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Err(e) = (&mut self.task).await {
            tracing::error!(error = %e, "control plane task failed");
        }
        if let Some(ol) = self.openlambda.take() {
            ol.stop().await;
        }
        // No trigger starts a job once stopped.
        self.state.ctx.triggers.clear();
        // Jobs in flight stop here and resume at the next start on the same database.
        if let Some(rt) = &self.state.jobs {
            rt.stop_jobs();
        }
    }
}

/// Checks the configuration, opens the object store and the database, binds and serves in a
/// background task: a control plane that runs jobs from its own configuration (what
/// `sonic-control` and `ofctl up` both run).
pub async fn start(
    config: ControlConfig,
    clock: Arc<dyn Clock>,
) -> Result<RunningControl, ServeError> {
    config.check()?;
    let runtime = runtime_from_config(&config).await?;
    start_with_jobs(config, clock, Some(Arc::new(runtime))).await
}

/// The object store the configuration names, or the fallback: a folder in the data folder.
pub fn store_choice(config: &ControlConfig) -> StoreChoice {
    config.store.clone().unwrap_or_else(|| StoreChoice::Local {
        root: config.data_dir.join("store"),
    })
}

/// What running jobs needs, from the configuration: the object store (opened, its bucket made),
/// the catalog, the agents' token and the file key (configured, else generated once and kept in
/// the data folder, so that a restart hands joining agents the same ones), a client that trusts
/// the configured CA.
pub async fn runtime_from_config(config: &ControlConfig) -> Result<Runtime, ServeError> {
    let choice = store_choice(config);
    if config.store.is_none() {
        tracing::warn!(
            folder = %choice.describe(),
            "no object store configured: using a folder, which only agents on this machine can \
             use (a fallback); configure store.s3 (SONIC_S3_ENDPOINT, ...) for a cluster"
        );
    }
    let store = choice
        .open(None)
        .await
        .map_err(|source| ServeError::ObjectStore {
            location: choice.describe(),
            source,
        })?;
    let catalog = match &config.catalog {
        Some(path) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| ServeError::Catalog {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            Catalog::from_yaml(&text).map_err(|e| ServeError::Catalog {
                path: path.clone(),
                message: e.to_string(),
            })?
        }
        None => Catalog::default(),
    };
    // The tier as configured before the catalog is dilated: a built-in tier is dilated too.
    let catalog = crate::exec::with_tier_as_configured(catalog, config.memory_tier.is_some());
    let catalog = catalog
        .dilated(config.dilation)
        .map_err(|e| ServeError::Catalog {
            path: config
                .catalog
                .clone()
                .unwrap_or_else(|| "(built-in)".into()),
            message: e.to_string(),
        })?;
    if config.dilation > 1.0 {
        tracing::info!(
            dilation = config.dilation,
            "time-dilated cluster: planning with the catalog's links and store this many times slower"
        );
    }
    let file_key = match (&config.file_key, &config.file_key_file) {
        (Some(k), _) => k.clone(),
        (None, Some(path)) => sonic_daemon::secret::read_file("file_key_file", path)?,
        (None, None) => {
            let path = config.data_dir.join("file-key");
            let (key, made) = sonic_daemon::secret::load_or_create("file key", &path)?;
            if made {
                tracing::info!(path = %path.display(), "generated the file key");
            }
            key
        }
    };
    let agent_token = match &config.agent_token {
        Some(t) => t.clone(),
        None => {
            sonic_daemon::secret::load_or_create(
                "agent token",
                &config.data_dir.join("agent-token"),
            )?
            .0
        }
    };
    let http = sonic_daemon::tls::client_builder(config.ca_file.as_deref())?
        .build()
        .map_err(|e| sonic_daemon::tls::TlsError::Client(e.to_string()))?;
    let mut jobs = JobsConfig::new(agent_token, file_key.into_bytes());
    jobs.bucket = choice.bucket().map(str::to_owned);
    jobs.agent_store = Some(choice.to_spec());
    jobs.memory_tier = config.memory_tier.clone();
    jobs.planning = config.plan_budget();
    jobs.prewarm = config.prewarm;
    jobs.dilation = config.dilation;
    jobs.keep_failed = config.keep_failed();
    jobs.secrets_dir = config.secrets_dir.clone();
    jobs.convergence.max_profiling_jobs = config.max_profiling_jobs;
    jobs.max_attempts = config.retries.limit.saturating_add(1);
    jobs.backoff = std::time::Duration::from_secs_f64(config.retries.backoff.0.max(0.0));
    jobs.retry_on = config.retries.on.iter().copied().collect();
    jobs.retain_jobs = config
        .retain_jobs
        .map(|t| std::time::Duration::from_secs_f64(t.0.max(0.0)));
    tracing::info!(store = %choice.describe(), "object store open");
    let runtime = Runtime::new(store, Some(catalog), jobs).with_http(http);
    Ok(match config.executor_nice {
        Some(nice) => {
            tracing::info!(
                nice,
                "job executions run on threads of their own, one per core, at a lower priority than the API's (executor_nice)"
            );
            runtime.with_executor(crate::exec::threads::Executor::per_core(i32::from(nice))?)
        }
        None => runtime,
    })
}

/// [`start`], able to run jobs with `jobs`. Jobs a previous process left running are failed
/// (with [`crate::exec::RESTARTED`]) before the server answers.
pub async fn start_with_jobs(
    config: ControlConfig,
    clock: Arc<dyn Clock>,
    jobs: Option<Arc<Runtime>>,
) -> Result<RunningControl, ServeError> {
    config.check()?;
    let data_dir = config.data_dir.clone();
    let now = clock.now_ms();
    let can_resume = jobs.is_some();
    let (db, resumed) = tokio::task::spawn_blocking(move || {
        let db = Db::open_dir(&data_dir)?;
        let (failed, resumed) = crate::exec::interrupted(&db, now, can_resume)?;
        if failed > 0 {
            tracing::warn!(jobs = failed, "failed jobs interrupted by a restart");
        }
        Ok::<_, StoreError>((db, resumed))
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))??;
    let tls = match &config.tls {
        Some(files) => Some(files.load().await?),
        None => None,
    };
    let listener = sonic_daemon::net::bind(config.listen).map_err(|source| ServeError::Bind {
        addr: config.listen,
        source,
    })?;
    let addr = listener.local_addr()?;
    let openlambda = match &config.openlambda {
        Some(ol) => {
            let cfg = ol
                .listener(&config.data_dir)
                .map_err(sonic_openlambda::StartError::Config)?;
            Some(sonic_openlambda::start(cfg).await?)
        }
        None => None,
    };
    if let (Some(rt), Some(ol)) = (&jobs, &openlambda) {
        // DAG functions may name the registry's lambdas as handlers.
        rt.set_handlers(ol.handlers.clone());
    }
    if let Some(rt) = &jobs {
        // Agents without a control URL of their own (registered in this process) push run
        // reports here; a wildcard address is reached on loopback.
        let mut reach = addr;
        if reach.ip().is_unspecified() {
            reach.set_ip(match reach {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        rt.listening_at(&format!(
            "{}://{reach}",
            sonic_daemon::tls::scheme(tls.is_some())
        ));
    }
    let state = ControlState::with_jobs(db, clock, config.settings(), jobs);
    if let Some(ol) = &openlambda {
        // `POST /run/<dag-name>` runs the DAG's job.
        ol.handlers
            .set_dags(Arc::new(crate::http::openlambda::DagCalls::new(&state)));
    }
    // The applied DAGs' schedules start their jobs from now on.
    if state.jobs.is_some() {
        match crate::admission::triggers::schedule_all(&state.ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(dags = n, "DAG triggers scheduled"),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the DAGs: their triggers are not scheduled")
            }
        }
    }
    // Failed jobs keep what a retry reuses for a while; then it goes.
    if let Some(rt) = &state.jobs {
        crate::exec::spawn_sweeper(state.ctx.clone(), rt.clone());
    }
    // Jobs a previous process was running go on from what it recorded.
    if let Some(rt) = &state.jobs {
        for job in resumed {
            let cancel = rt.register(&job.id);
            let span =
                tracing::info_span!("job", job = %job.id, dag = %job.dag, policy = %job.policy);
            rt.spawn_job(tracing::Instrument::instrument(
                crate::admission::resume(state.ctx.clone(), rt.clone(), job, cancel),
                span,
            ));
        }
    }
    state.dashboard.set_tls(tls.is_some());
    let app = router(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    sonic_daemon::tls::log_transport("control plane", addr, config.tls.as_ref());
    let tls_on = tls.is_some();
    let task = tokio::spawn(async move {
        let served = sonic_daemon::serve(listener, app, tls, async {
            let _ = rx.await;
        })
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "control plane server failed");
        }
    });
    tracing::info!(
        %addr,
        data_dir = %config.data_dir.display(),
        catalog = config.catalog.as_deref().unwrap_or("-"),
        heartbeat_timeout_ms = config.heartbeat_timeout().as_millis() as u64,
        "control plane listening"
    );
    Ok(RunningControl {
        addr,
        tls: tls_on,
        state,
        openlambda,
        shutdown: Some(tx),
        task,
    })
}

/// Serves with the system clock until Ctrl-C or SIGTERM, then shuts down gracefully.
pub async fn serve(config: ControlConfig) -> Result<(), ServeError> {
    let running = start(config, Arc::new(SystemClock)).await?;
    wait_for_signal().await?;
    tracing::info!("stopping");
    running.stop().await;
    Ok(())
}

async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One HTTP/1.1 request over a plain socket: the server answers real connections.
    async fn raw_get(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn starts_serves_and_stops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("data"),
            token: "0123456789abcdef0123".into(),
            ..ControlConfig::default()
        };
        let running = start(config, Arc::new(SystemClock)).await.expect("start");
        let health = raw_get(running.addr, "/v1/health", None).await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.contains("\"status\":\"ok\""), "{health}");
        let denied = raw_get(running.addr, "/v1/dags", None).await;
        assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
        let listed = raw_get(running.addr, "/v1/dags", Some("0123456789abcdef0123")).await;
        assert!(listed.starts_with("HTTP/1.1 200"), "{listed}");
        assert!(dir.path().join("data").join(crate::store::DB_FILE).exists());
        let addr = running.addr;
        running.stop().await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "still listening after stop"
        );
    }

    #[tokio::test]
    async fn a_dilated_control_plane_plans_with_the_dilated_catalog_and_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("data"),
            token: "0123456789abcdef0123".into(),
            dilation: 4.0,
            ..ControlConfig::default()
        };
        let running = start(config, Arc::new(SystemClock)).await.expect("start");
        let health = raw_get(running.addr, "/v1/health", None).await;
        assert!(health.contains("\"dilation\":4.0"), "{health}");
        let rt = running.state.jobs.as_ref().expect("a runtime");
        let want = Catalog::default().dilated(4.0).expect("dilated");
        assert_eq!(rt.catalog.as_ref(), Some(&want));
        assert_eq!(rt.config.dilation, 4.0);
        // Executions run on threads of their own, at the default lower priority.
        assert_eq!(
            rt.executor().map(|e| e.nice()),
            Some(i32::from(crate::config::DEFAULT_EXECUTOR_NICE))
        );
        running.stop().await;
    }

    #[tokio::test]
    async fn serves_openlambda_when_configured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("data"),
            token: "0123456789abcdef0123".into(),
            openlambda: Some(crate::config::OpenLambdaSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                token: String::new(),
                python: "python3".into(),
                timeout: sonic_core::units::Seconds(10.0),
                max_body: sonic_core::units::ByteSize(1 << 20),
                pip_timeout: sonic_core::units::Seconds(300.0),
                worker_memory: sonic_core::units::ByteSize(1 << 30),
                ..crate::config::OpenLambdaSettings::on(SocketAddr::from(([127, 0, 0, 1], 0)))
            }),
            ..ControlConfig::default()
        };
        let running = start(config, Arc::new(SystemClock)).await.expect("start");
        let ol = running
            .openlambda
            .as_ref()
            .expect("openlambda listener")
            .addr;
        let status = raw_get(ol, "/status", None).await;
        assert!(
            status.starts_with("HTTP/1.1 200") && status.ends_with("ready\n"),
            "{status}"
        );
        let listed = raw_get(ol, "/registry", None).await;
        assert!(listed.ends_with("[]"), "{listed}");
        assert!(dir.path().join("data/openlambda/registry").is_dir());
        running.stop().await;
        assert!(
            tokio::net::TcpStream::connect(ol).await.is_err(),
            "openlambda still listening after stop"
        );
    }

    #[tokio::test]
    async fn refuses_to_start_without_a_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().to_path_buf(),
            ..ControlConfig::default()
        };
        assert!(matches!(
            start(config, Arc::new(SystemClock)).await,
            Err(ServeError::Config(_))
        ));
    }
}
