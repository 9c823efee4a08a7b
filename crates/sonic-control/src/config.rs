//! The control plane's configuration: a YAML file, overridden by flags and environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sonic_core::units::{ByteSize, Seconds};
use sonic_daemon::TlsFiles;
use sonic_storage::StoreChoice;

pub use sonic_daemon::ConfigError;

/// The shortest token accepted: a guessable secret protects nothing.
pub const MIN_TOKEN_LEN: usize = sonic_daemon::secret::MIN_SECRET_LEN;

/// Everything the control plane needs to start.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Where the SQLite database (`sonic.db`) lives, and the secrets it generates.
    pub data_dir: PathBuf,
    /// The bearer token clients (`ofctl`, scripts) present.
    pub token: String,
    /// The secret an agent presents to join (register and send heartbeats); empty: agents join
    /// with `token` only.
    pub join_token: String,
    /// The bearer token the control plane presents to agents (handed to them when they join);
    /// `None`: generated once and kept in `<data_dir>/agent-token`.
    pub agent_token: Option<String>,
    /// The key of the HMAC file tokens of `direct` transfers (handed to agents when they join).
    pub file_key: Option<String>,
    /// A file holding the file key; with neither, it is generated once and kept in
    /// `<data_dir>/file-key`.
    pub file_key_file: Option<PathBuf>,
    /// Where job inputs, `remote` files and results live; `None`: a folder under `data_dir`,
    /// which only agents on this machine can use (a fallback, said so in the log).
    pub store: Option<StoreChoice>,
    /// Serve HTTPS with this certificate and key.
    pub tls: Option<TlsFiles>,
    /// The CA the agents' certificates are verified against; without it, the system's roots.
    pub ca_file: Option<PathBuf>,
    /// An agent silent for longer than this is not alive (`10s`, `1500ms`, ...).
    pub heartbeat_timeout: Seconds,
    /// The VM catalog file (interfaces.md); read by the planner once jobs run.
    pub catalog: Option<String>,
    /// The in-memory tier of `memory` edges, `redis://host:port` (told to joining agents).
    /// Without it no plan uses `memory`, whatever the catalog prices; with it and a catalog
    /// that prices none, the built-in tier's prices ([`sonic_core::catalog::MemoryTier`]).
    pub memory_tier: Option<String>,
    /// Request bodies larger than this are refused with 413 (`1MiB`, ...).
    pub max_body: ByteSize,
    /// How long planning one job (or one `GET /v1/dags/{name}/plan`) may take (`2s`, ...); past
    /// it the best plan found so far is used, marked not exact (docs/model.md).
    pub plan_budget: Seconds,
    /// The memory one planning search's labels may take (`256MiB`, ...).
    pub plan_memory: ByteSize,
    /// Ask agents to start the next stages' containers while a stage runs
    /// (`JobsConfig::prewarm`); off where every agent shares one machine's cores (`ofctl up`),
    /// where starting containers ahead slows the stage that runs.
    pub prewarm: bool,
    /// OpenLambda's worker API (`/run/<name>`, `/registry`) on a listener of its own, with
    /// Python handlers (docs/python.md); `None`: not served.
    pub openlambda: Option<OpenLambdaSettings>,
    /// The cluster's time dilation factor D (>= 1; 1: none): every agent runs D times slower
    /// than the VM it stands for (deploy/cluster.sh --dilation), so the control plane plans
    /// with the catalog dilated by D (network and store figures,
    /// [`sonic_core::catalog::Catalog::dilated`]) and its predictions are in the cluster's
    /// dilated time. `GET /v1/health` reports it.
    pub dilation: f64,
    /// Job executions run on threads of their own this much nicer than the API's (Linux nice,
    /// 0 to 19; `sonic_control::executor`), so that under load the API is served first; `None`
    /// (`executor_nice: null`): on the API's threads. Default 10. `ofctl up` runs without it:
    /// there the lambdas share the control plane's cores and would delay the executions.
    pub executor_nice: Option<u8>,
    /// How long a failed or cancelled job keeps what `ofctl retry` reuses (its succeeded
    /// instances' files on the agents, in the store and the memory tier) before it is deleted
    /// (`24h`, `30m`, ...; `0s`: deleted when the job fails). Default a day, at most 30 days.
    pub keep_failed: Seconds,
    /// Jobs that ended longer ago than this are deleted whole: record, logs, results and input
    /// (`30d`... as `720h`; `null`, the default: kept until `ofctl delete job`). The samples
    /// they taught the models stay.
    pub retain_jobs: Option<Seconds>,
    /// A folder whose files are secrets, each named by its file name (a mounted Kubernetes
    /// Secret, Docker's `/run/secrets`), beside the secret store (`ofctl create secret`), which
    /// wins for a name both hold. `None`: the store only.
    pub secrets_dir: Option<std::path::PathBuf>,
    /// The retry policy of functions whose DAG gives none (`retries:` in the DAG file replaces
    /// it field by field): `{ limit: 2, backoff: 200ms, on: [error, timeout, oom, lost] }`.
    pub retries: RetriesConfig,
    /// A DAG (each parameter setting) profiles at most this many jobs before it plans with the
    /// models it has, converged or not (0: until they converge).
    pub max_profiling_jobs: usize,
}

/// The control plane's default retry policy (`retries:` in its configuration file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetriesConfig {
    /// How many times a failed run is tried again after its first attempt (0: never).
    pub limit: u32,
    /// The wait before the first retry, doubled before each next one.
    pub backoff: Seconds,
    /// The kinds of failure tried again: `error`, `timeout`, `oom`, `lost`.
    pub on: Vec<sonic_core::dag::RetryOn>,
}

impl Default for RetriesConfig {
    fn default() -> RetriesConfig {
        RetriesConfig {
            limit: 2,
            backoff: Seconds(0.2),
            on: sonic_core::dag::RetryOn::ALL.to_vec(),
        }
    }
}

/// The OpenLambda listener's settings (`openlambda:` in the file, `--openlambda ADDR`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenLambdaSettings {
    /// Where it listens. Off loopback, `token` is required.
    pub listen: SocketAddr,
    /// The bearer token every route but `/status` requires; empty: none (loopback only, as
    /// OpenLambda's worker).
    #[serde(default)]
    pub token: String,
    /// The Python interpreter handlers run with (the process sandbox).
    #[serde(default = "default_python")]
    pub python: String,
    /// The longest one call may take, its cold start included.
    #[serde(default = "default_call_timeout")]
    pub timeout: Seconds,
    /// Larger events and lambda tarballs get 413.
    #[serde(default = "default_openlambda_body")]
    pub max_body: ByteSize,
    /// The longest building one `requirements.txt` environment (venv and pip) may take.
    #[serde(default = "default_pip_timeout")]
    pub pip_timeout: Seconds,
    /// The most address space one warm `/run/` worker may map; past it the handler gets
    /// `MemoryError` (docs/python.md). 0: no limit.
    #[serde(default = "default_worker_memory")]
    pub worker_memory: ByteSize,
    /// The CPUs one warm `/run/` worker may use (a CFS quota: a cgroup of its own in the process
    /// sandbox, Docker's `--cpus` in the Docker sandbox); 0: no bound.
    #[serde(default = "default_worker_cpus")]
    pub worker_cpus: f64,
    /// Where `/run/` workers run: `process` (host processes of `python`) or `docker`
    /// (containers of `image`).
    #[serde(default)]
    pub sandbox: OpenLambdaSandbox,
    /// The Python image of the `docker` sandbox (`deploy/build-python-image.sh`).
    #[serde(default = "default_python_image")]
    pub image: String,
    /// The memory one warm `/run/` worker and the processes it forks may hold together (a
    /// memory cgroup of its own in the process sandbox, Docker's `--memory` in the Docker
    /// sandbox); 0: no bound.
    #[serde(default = "default_worker_memory")]
    pub worker_resident: ByteSize,
    /// The processes and threads one warm `/run/` worker may have at once (a `pids` cgroup,
    /// Docker's `--pids-limit`); 0: no bound.
    #[serde(default = "default_worker_procs")]
    pub worker_procs: u32,
    /// OpenLambda's registry folder: lambdas kept there as `<name>.tar.gz`, `<name>.py` or
    /// `<name>/` are installed when called, and uploads are written there.
    #[serde(default)]
    pub registry: Option<PathBuf>,
    /// How long code from the registry folder is used before the folder is looked at again.
    #[serde(default = "default_registry_cache")]
    pub registry_cache: Seconds,
    /// How long a warm `/run/` worker may wait for a call before it is stopped.
    #[serde(default = "default_keep_alive")]
    pub keep_alive: Seconds,
    /// How many warm `/run/` workers may wait for calls at once, across lambdas; past it the one
    /// idle longest is stopped.
    #[serde(default = "default_max_warm")]
    pub max_warm: usize,
    /// An OpenLambda worker configuration (`config.json`) to follow: its `registry`,
    /// `registry_cache_ms` and `limits` (`procs`, `mem_mb`, `cpu_percent`, `runtime_sec`) take
    /// the place of the keys above.
    #[serde(default)]
    pub worker_config: Option<PathBuf>,
}

/// Where the OpenLambda listener's `/run/` workers run (`openlambda.sandbox`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpenLambdaSandbox {
    /// Host processes.
    #[default]
    Process,
    /// Containers of the Python image.
    Docker,
}

fn default_worker_cpus() -> f64 {
    sonic_openlambda::DEFAULT_WORKER_CPUS
}

fn default_worker_procs() -> u32 {
    sonic_openlambda::DEFAULT_WORKER_PROCS
}

fn default_keep_alive() -> Seconds {
    Seconds(sonic_openlambda::DEFAULT_KEEP_ALIVE.as_secs_f64())
}

fn default_max_warm() -> usize {
    sonic_openlambda::DEFAULT_MAX_WARM
}

fn default_registry_cache() -> Seconds {
    Seconds(sonic_openlambda::DEFAULT_REGISTRY_CACHE.as_secs_f64())
}

fn default_python_image() -> String {
    "sonic-python:latest".into()
}

fn default_worker_memory() -> ByteSize {
    ByteSize(sonic_openlambda::DEFAULT_WORKER_MEMORY)
}

fn default_pip_timeout() -> Seconds {
    Seconds(sonic_openlambda::venv::DEFAULT_PIP_TIMEOUT.as_secs_f64())
}

fn default_python() -> String {
    "python3".into()
}

fn default_call_timeout() -> Seconds {
    Seconds(sonic_openlambda::DEFAULT_TIMEOUT.as_secs_f64())
}

fn default_openlambda_body() -> ByteSize {
    ByteSize(64 * 1024 * 1024)
}

impl std::fmt::Debug for OpenLambdaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenLambdaSettings")
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
            .field("python", &self.python)
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .field("pip_timeout", &self.pip_timeout)
            .field("worker_memory", &self.worker_memory)
            .field("worker_cpus", &self.worker_cpus)
            .field("sandbox", &self.sandbox)
            .field("image", &self.image)
            .field("worker_resident", &self.worker_resident)
            .field("worker_procs", &self.worker_procs)
            .field("registry", &self.registry)
            .field("registry_cache", &self.registry_cache)
            .field("keep_alive", &self.keep_alive)
            .field("max_warm", &self.max_warm)
            .field("worker_config", &self.worker_config)
            .finish()
    }
}

impl OpenLambdaSettings {
    /// The defaults (as in the file without the optional keys) for a listener on `listen`.
    pub fn on(listen: SocketAddr) -> Self {
        OpenLambdaSettings {
            listen,
            token: String::new(),
            python: default_python(),
            timeout: default_call_timeout(),
            max_body: default_openlambda_body(),
            pip_timeout: default_pip_timeout(),
            worker_memory: default_worker_memory(),
            worker_cpus: default_worker_cpus(),
            sandbox: OpenLambdaSandbox::Process,
            image: default_python_image(),
            worker_resident: default_worker_memory(),
            worker_procs: default_worker_procs(),
            registry: None,
            registry_cache: default_registry_cache(),
            keep_alive: default_keep_alive(),
            max_warm: default_max_warm(),
            worker_config: None,
        }
    }

    /// The listener's configuration, its registry under `data_dir/openlambda`, following the
    /// OpenLambda worker configuration `worker_config` names (an error when it cannot be read).
    pub fn listener(
        &self,
        data_dir: &std::path::Path,
    ) -> Result<sonic_openlambda::OpenLambdaConfig, String> {
        let mut c =
            sonic_openlambda::OpenLambdaConfig::new(self.listen, data_dir.join("openlambda"));
        c.token = self.token.clone();
        c.python = self.python.clone();
        c.timeout = Duration::from_secs_f64(self.timeout.0);
        c.max_body = usize::try_from(self.max_body.0).unwrap_or(usize::MAX);
        c.pip_timeout = Duration::from_secs_f64(self.pip_timeout.0);
        c.worker_memory = self.worker_memory.0;
        c.worker_cpus = self.worker_cpus;
        c.sandbox = match self.sandbox {
            OpenLambdaSandbox::Process => sonic_openlambda::WorkerSandbox::Process,
            OpenLambdaSandbox::Docker => sonic_openlambda::WorkerSandbox::Docker {
                image: self.image.clone(),
            },
        };
        c.worker_resident = self.worker_resident.0;
        c.worker_procs = self.worker_procs;
        c.registry_folder = self.registry.clone();
        c.registry_cache = Duration::from_secs_f64(self.registry_cache.0);
        c.keep_alive = Duration::from_secs_f64(self.keep_alive.0);
        c.max_warm = self.max_warm;
        if let Some(path) = &self.worker_config {
            let file = sonic_openlambda::config::WorkerFile::load(path)
                .map_err(|e| format!("openlambda.worker_config: {e}"))?;
            c.follow(&file);
        }
        Ok(c)
    }
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7000)),
            data_dir: PathBuf::from("/var/lib/sonic-control"),
            token: String::new(),
            join_token: String::new(),
            agent_token: None,
            file_key: None,
            file_key_file: None,
            store: None,
            tls: None,
            ca_file: None,
            heartbeat_timeout: Seconds(10.0),
            catalog: None,
            memory_tier: None,
            max_body: ByteSize(1024 * 1024),
            plan_budget: Seconds(crate::learn::PLAN_TIME.as_secs_f64()),
            plan_memory: ByteSize(crate::learn::PLAN_MEMORY),
            prewarm: true,
            openlambda: None,
            dilation: 1.0,
            executor_nice: Some(DEFAULT_EXECUTOR_NICE),
            keep_failed: Seconds(crate::exec::DEFAULT_KEEP_FAILED.as_secs_f64()),
            retain_jobs: None,
            secrets_dir: None,
            retries: RetriesConfig::default(),
            max_profiling_jobs: sonic_core::regression::DEFAULT_MAX_PROFILING_JOBS,
        }
    }
}

/// [`ControlConfig::executor_nice`]'s default: the executions' threads get about a tenth of
/// the CPU when the API's threads want it all (docs/load.md, "Executions at a lower priority").
pub const DEFAULT_EXECUTOR_NICE: u8 = 10;

impl std::fmt::Debug for ControlConfig {
    // Hand-written so no secret reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlConfig")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("token", &"<redacted>")
            .field("join_token", &"<redacted>")
            .field("file_key_file", &self.file_key_file)
            .field("store", &self.store.as_ref().map(StoreChoice::describe))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("catalog", &self.catalog)
            .field(
                "memory_tier",
                &self
                    .memory_tier
                    .as_deref()
                    .map(sonic_storage::redis::without_credentials),
            )
            .field("max_body", &self.max_body)
            .field("plan_budget", &self.plan_budget)
            .field("plan_memory", &self.plan_memory)
            .field("prewarm", &self.prewarm)
            .field("openlambda", &self.openlambda)
            .field("dilation", &self.dilation)
            .field("keep_failed", &self.keep_failed)
            .field("retain_jobs", &self.retain_jobs)
            .field("secrets_dir", &self.secrets_dir)
            .field("retries", &self.retries)
            .field("max_profiling_jobs", &self.max_profiling_jobs)
            .field("executor_nice", &self.executor_nice)
            .finish()
    }
}

/// Command-line flags and environment variables; each overrides the file.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "sonic-control",
    about = "Sonic's control plane: DAG and agent registry, job planning and scheduling"
)]
pub struct ControlArgs {
    /// A YAML configuration file.
    #[arg(long, env = "SONIC_CONTROL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7000.
    #[arg(long, env = "SONIC_CONTROL_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory of the SQLite database.
    #[arg(long, env = "SONIC_CONTROL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Bearer token clients present (at least 16 characters).
    #[arg(long, env = "SONIC_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The secret agents present to join (at least 16 characters).
    #[arg(long, env = "SONIC_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// A file holding the key of direct-transfer file tokens (else generated in the data folder).
    #[arg(long, env = "SONIC_FILE_KEY_FILE")]
    pub file_key_file: Option<PathBuf>,
    /// The S3-compatible endpoint of the object store, e.g. http://store:8333.
    #[arg(long, env = "SONIC_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// The bucket (with --s3-endpoint).
    #[arg(long, env = "SONIC_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// The store's access key (with --s3-endpoint).
    #[arg(long, env = "SONIC_S3_ACCESS_KEY", hide_env_values = true)]
    pub s3_access_key: Option<String>,
    /// The store's secret key (with --s3-endpoint).
    #[arg(long, env = "SONIC_S3_SECRET_KEY", hide_env_values = true)]
    pub s3_secret_key: Option<String>,
    /// The store's region (with --s3-endpoint).
    #[arg(long, env = "SONIC_S3_REGION")]
    pub s3_region: Option<String>,
    /// How long a store outage is waited out before operations fail, in milliseconds (default
    /// 30000); joining agents are told the same.
    #[arg(long, env = "SONIC_S3_OUTAGE_WINDOW_MS")]
    pub s3_outage_window_ms: Option<u64>,
    /// A local folder as the object store (one machine only).
    #[arg(long, env = "SONIC_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// PEM certificate to serve HTTPS with (with --tls-key).
    #[arg(long, env = "SONIC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SONIC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) the agents' certificates are verified against.
    #[arg(long, env = "SONIC_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Agent heartbeat timeout, e.g. 10s.
    #[arg(long, env = "SONIC_HEARTBEAT_TIMEOUT")]
    pub heartbeat_timeout: Option<Seconds>,
    /// The VM catalog file.
    #[arg(long, env = "SONIC_CATALOG")]
    pub catalog: Option<String>,
    /// The in-memory tier of `memory` edges, redis://host:port.
    #[arg(long, env = "SONIC_MEMORY_TIER", hide_env_values = true)]
    pub memory_tier: Option<String>,
    /// Largest request body, e.g. 1MiB.
    #[arg(long, env = "SONIC_MAX_BODY")]
    pub max_body: Option<ByteSize>,
    /// How long planning a job may take, e.g. 2s (then the best plan found so far is used).
    #[arg(long, env = "SONIC_PLAN_BUDGET")]
    pub plan_budget: Option<Seconds>,
    /// The memory a planning search may take, e.g. 256MiB.
    #[arg(long, env = "SONIC_PLAN_MEMORY")]
    pub plan_memory: Option<ByteSize>,
    /// Serve OpenLambda's worker API (`/run/<name>`, `/registry`) on this address, e.g.
    /// 127.0.0.1:5000.
    #[arg(long, env = "SONIC_OPENLAMBDA_LISTEN")]
    pub openlambda: Option<SocketAddr>,
    /// The bearer token the OpenLambda listener requires (needed off loopback).
    #[arg(long, env = "SONIC_OPENLAMBDA_TOKEN", hide_env_values = true)]
    pub openlambda_token: Option<String>,
    /// An OpenLambda worker configuration (`config.json`) for the OpenLambda listener to
    /// follow: its registry folder, cache interval and limits.
    #[arg(long, env = "SONIC_OPENLAMBDA_CONFIG")]
    pub openlambda_config: Option<PathBuf>,
    /// The cluster's time dilation factor (>= 1): plan with the catalog's links and store this
    /// many times slower (deploy/cluster.sh --dilation).
    #[arg(long, env = "SONIC_CONTROL_DILATION")]
    pub dilation: Option<f64>,
    /// Run job executions on threads this much nicer than the API's (0 to 19; default 10).
    #[arg(long, env = "SONIC_EXECUTOR_NICE")]
    pub executor_nice: Option<u8>,
    /// How long a failed job keeps what a retry reuses, e.g. 24h (0s: nothing).
    #[arg(long, env = "SONIC_KEEP_FAILED")]
    pub keep_failed: Option<Seconds>,
    /// Delete jobs (record, logs, results) that ended longer ago than this, e.g. 720h.
    #[arg(long, env = "SONIC_RETAIN_JOBS")]
    pub retain_jobs: Option<Seconds>,
    /// A folder whose files are secrets functions may name (beside `ofctl create secret`).
    #[arg(long, env = "SONIC_SECRETS_DIR")]
    pub secrets_dir: Option<std::path::PathBuf>,
    /// How log lines are written: text, or json (one object per line, with the job's and the
    /// run's spans).
    #[arg(long, env = "SONIC_LOG_FORMAT", default_value = "text")]
    pub log_format: sonic_daemon::logging::LogFormat,
}

impl ControlConfig {
    /// What the API's handlers read from it.
    pub fn settings(&self) -> crate::http::api::Settings {
        crate::http::api::Settings {
            token: self.token.clone(),
            join_token: self.join_token.clone(),
            heartbeat_timeout: self.heartbeat_timeout(),
            max_body_bytes: self.max_body_bytes(),
        }
    }

    /// Parses a YAML configuration; `path` names it in errors.
    pub fn from_yaml(path: &str, text: &str) -> Result<ControlConfig, ConfigError> {
        sonic_daemon::Layers::new().yaml_str(path, text).extract()
    }

    /// Defaults, then the file named by `args.config` (if any), then every flag or variable that
    /// is set; checked.
    pub fn load(args: &ControlArgs) -> Result<ControlConfig, ConfigError> {
        let a = args;
        let cfg: ControlConfig = sonic_daemon::Layers::new()
            .yaml_file(a.config.as_deref())
            .set("listen", a.listen)
            .set("data_dir", a.data_dir.as_ref())
            .set("token", a.token.as_ref())
            .set("join_token", a.join_token.as_ref())
            .set("file_key_file", a.file_key_file.as_ref())
            .set("store.s3.endpoint", a.s3_endpoint.as_ref())
            .set("store.s3.bucket", a.s3_bucket.as_ref())
            .set("store.s3.access_key", a.s3_access_key.as_ref())
            .set("store.s3.secret_key", a.s3_secret_key.as_ref())
            .set("store.s3.region", a.s3_region.as_ref())
            .set("store.s3.outage_window_ms", a.s3_outage_window_ms)
            .set("store.local.root", a.store_dir.as_ref())
            .set("tls.cert", a.tls_cert.as_ref())
            .set("tls.key", a.tls_key.as_ref())
            .set("ca_file", a.ca_file.as_ref())
            .set("heartbeat_timeout", a.heartbeat_timeout)
            .set("catalog", a.catalog.as_ref())
            .set("memory_tier", a.memory_tier.as_ref())
            .set("max_body", a.max_body)
            .set("plan_budget", a.plan_budget)
            .set("plan_memory", a.plan_memory)
            .set("openlambda.listen", a.openlambda)
            .set("openlambda.token", a.openlambda_token.as_ref())
            .set("openlambda.worker_config", a.openlambda_config.as_ref())
            .set("dilation", a.dilation)
            .set("executor_nice", a.executor_nice)
            .set("keep_failed", a.keep_failed)
            .set("retain_jobs", a.retain_jobs)
            .set("secrets_dir", a.secrets_dir.as_ref())
            .extract()?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Refuses settings the control plane cannot run with.
    pub fn check(&self) -> Result<(), ConfigError> {
        sonic_daemon::secret::check("token (SONIC_TOKEN)", &self.token)?;
        if !self.join_token.is_empty() {
            sonic_daemon::secret::check("join_token (SONIC_JOIN_TOKEN)", &self.join_token)?;
        }
        if let Some(t) = &self.agent_token {
            sonic_daemon::secret::check("agent_token", t)?;
        }
        if let Some(k) = &self.file_key {
            sonic_daemon::secret::check("file_key", k)?;
        }
        if let Some(url) = &self.memory_tier {
            sonic_storage::redis::check_url(url).map_err(ConfigError::Invalid)?;
        }
        let t = self.heartbeat_timeout.0;
        if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
            return Err(ConfigError::Invalid(
                "heartbeat_timeout must be positive and at most a day".into(),
            ));
        }
        if self.max_body.0 < 1024 || self.max_body.0 > 1024 * 1024 * 1024 {
            return Err(ConfigError::Invalid(
                "max_body must be between 1KiB and 1GiB".into(),
            ));
        }
        if !(self.dilation.is_finite() && self.dilation >= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "dilation must be a number >= 1, not {}",
                self.dilation
            )));
        }
        if let Some(n) = self.executor_nice
            && n > 19
        {
            return Err(ConfigError::Invalid(format!(
                "executor_nice must be from 0 to 19 (or null: no executor of its own), not {n}"
            )));
        }
        let t = self.keep_failed.0;
        if !(t.is_finite() && (0.0..=30.0 * 86_400.0).contains(&t)) {
            return Err(ConfigError::Invalid(
                "keep_failed must be from 0s to 30 days".into(),
            ));
        }
        if self.retries.limit > sonic_core::dag::MAX_RETRIES {
            return Err(ConfigError::Invalid(format!(
                "retries.limit must be from 0 to {}, not {}",
                sonic_core::dag::MAX_RETRIES,
                self.retries.limit
            )));
        }
        let b = self.retries.backoff.0;
        if !(b.is_finite() && (0.0..=3_600.0).contains(&b)) {
            return Err(ConfigError::Invalid(
                "retries.backoff must be from 0s to 1h".into(),
            ));
        }
        if let Some(Seconds(t)) = self.retain_jobs
            && !(t.is_finite() && t >= 1.0)
        {
            return Err(ConfigError::Invalid(format!(
                "retain_jobs must be at least 1s (or null: kept until deleted), not {t} s"
            )));
        }
        let t = self.plan_budget.0;
        if !(t.is_finite() && t > 0.0 && t <= 3_600.0) {
            return Err(ConfigError::Invalid(
                "plan_budget must be positive and at most an hour".into(),
            ));
        }
        if self.plan_memory.0 < 1024 * 1024 {
            return Err(ConfigError::Invalid(
                "plan_memory must be at least 1MiB".into(),
            ));
        }
        if let Some(ol) = &self.openlambda {
            if !ol.token.is_empty() {
                sonic_daemon::secret::check(
                    "openlambda.token (SONIC_OPENLAMBDA_TOKEN)",
                    &ol.token,
                )?;
            } else if !ol.listen.ip().is_loopback() {
                return Err(ConfigError::Invalid(format!(
                    "openlambda.listen {} is not loopback: set openlambda.token (SONIC_OPENLAMBDA_TOKEN)",
                    ol.listen
                )));
            }
            let t = ol.timeout.0;
            if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
                return Err(ConfigError::Invalid(
                    "openlambda.timeout must be positive and at most a day".into(),
                ));
            }
            let t = ol.pip_timeout.0;
            if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
                return Err(ConfigError::Invalid(
                    "openlambda.pip_timeout must be positive and at most a day".into(),
                ));
            }
            if !(ol.worker_cpus.is_finite() && (0.0..=1024.0).contains(&ol.worker_cpus)) {
                return Err(ConfigError::Invalid(
                    "openlambda.worker_cpus must be between 0 (no bound) and 1024".into(),
                ));
            }
            if ol.image.is_empty()
                || ol.image.starts_with('-')
                || ol.image.contains(char::is_whitespace)
            {
                return Err(ConfigError::Invalid(format!(
                    "openlambda.image `{}` is not an image name",
                    ol.image
                )));
            }
            let t = ol.registry_cache.0;
            if !(t.is_finite() && (0.0..=86_400.0).contains(&t)) {
                return Err(ConfigError::Invalid(
                    "openlambda.registry_cache must be between 0 and a day".into(),
                ));
            }
            let t = ol.keep_alive.0;
            if !(t.is_finite() && t > 0.0 && t <= 7.0 * 86_400.0) {
                return Err(ConfigError::Invalid(
                    "openlambda.keep_alive must be positive and at most a week".into(),
                ));
            }
            // The worker configuration is read here too, so that a bad one stops the start
            // with what is wrong in it.
            if let Some(path) = &ol.worker_config {
                sonic_openlambda::config::WorkerFile::load(path)
                    .map_err(|e| ConfigError::Invalid(format!("openlambda.worker_config: {e}")))?;
            }
            if ol.max_body.0 < 1024 || ol.max_body.0 > 1024 * 1024 * 1024 {
                return Err(ConfigError::Invalid(
                    "openlambda.max_body must be between 1KiB and 1GiB".into(),
                ));
            }
        }
        Ok(())
    }

    /// What planning one job may spend.
    pub fn plan_budget(&self) -> sonic_core::planner::Budget {
        sonic_core::planner::Budget {
            time: Some(Duration::from_secs_f64(self.plan_budget.0.max(0.0))),
            max_memory_bytes: Some(self.plan_memory.0),
            max_expansions: None,
        }
    }

    /// How long a failed job keeps what a retry reuses.
    pub fn keep_failed(&self) -> Duration {
        Duration::from_secs_f64(self.keep_failed.0.max(0.0))
    }

    /// How long an agent stays alive after its last heartbeat.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_timeout.0.max(0.0))
    }

    /// The largest request body accepted, bytes.
    pub fn max_body_bytes(&self) -> usize {
        usize::try_from(self.max_body.0).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default retry policy, the failed-job keep and the retention from the file.
    #[test]
    fn retries_keep_and_retention_from_the_file() {
        let token = "token: 0123456789abcdef\n";
        let cfg = ControlConfig::from_yaml("c.yaml", token).expect("defaults");
        assert_eq!(cfg.retries, RetriesConfig::default());
        assert_eq!(cfg.retries.limit, 2);
        assert_eq!(cfg.keep_failed(), crate::exec::DEFAULT_KEEP_FAILED);
        assert_eq!(cfg.retain_jobs, None);
        let yaml = format!(
            "{token}retries: {{ limit: 4, backoff: 500ms, on: [error, oom] }}\nkeep_failed: 30m\nretain_jobs: 720h\n"
        );
        let cfg = ControlConfig::from_yaml("c.yaml", &yaml).expect("parses");
        cfg.check().expect("valid");
        assert_eq!(cfg.retries.limit, 4);
        assert_eq!(cfg.retries.backoff, Seconds(0.5));
        assert_eq!(
            cfg.retries.on,
            [
                sonic_core::dag::RetryOn::Error,
                sonic_core::dag::RetryOn::Oom
            ]
        );
        assert_eq!(cfg.keep_failed(), Duration::from_secs(1800));
        assert_eq!(cfg.retain_jobs, Some(Seconds(720.0 * 3600.0)));
        let cfg = ControlConfig::from_yaml("c.yaml", &format!("{token}max_profiling_jobs: 50\n"))
            .expect("parses");
        assert_eq!(cfg.max_profiling_jobs, 50);
        for bad in [
            "retries: { limit: 101 }\n",
            "retries: { backoff: 2h }\n",
            "retries: { on: [sometimes] }\n",
            "retries: { tries: 3 }\n",
            "keep_failed: 31d\n",
            "retain_jobs: 0s\n",
        ] {
            let refused = ControlConfig::from_yaml("c.yaml", &format!("{token}{bad}"))
                .and_then(|c| c.check().map(|()| c));
            assert!(refused.is_err(), "{bad}");
        }
    }

    #[test]
    fn file_then_flags() {
        let yaml = "listen: 127.0.0.1:7123\ntoken: 0123456789abcdef\nheartbeat_timeout: 1500ms\nmax_body: 2MiB\ncatalog: catalog.yaml\nplan_budget: 500ms\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("control.yaml");
        std::fs::write(&path, yaml).expect("write");
        let args = ControlArgs {
            config: Some(path),
            data_dir: Some(dir.path().join("data")),
            ..ControlArgs::default()
        };
        let cfg = ControlConfig::load(&args).expect("load");
        assert_eq!(cfg.listen.port(), 7123);
        assert_eq!(cfg.heartbeat_timeout(), Duration::from_millis(1500));
        assert_eq!(cfg.max_body_bytes(), 2 * 1024 * 1024);
        assert_eq!(cfg.plan_budget().time, Some(Duration::from_millis(500)));
        assert_eq!(
            cfg.plan_budget().max_memory_bytes,
            Some(crate::learn::PLAN_MEMORY)
        );
        assert_eq!(cfg.catalog.as_deref(), Some("catalog.yaml"));
        assert_eq!(cfg.data_dir, dir.path().join("data"));
        assert_eq!(cfg.dilation, 1.0);
        let dilated = ControlArgs {
            dilation: Some(4.0),
            ..args.clone()
        };
        assert_eq!(ControlConfig::load(&dilated).expect("load").dilation, 4.0);
        for bad in [0.5, f64::NAN] {
            let a = ControlArgs {
                dilation: Some(bad),
                ..args.clone()
            };
            assert!(ControlConfig::load(&a).is_err(), "{bad}");
        }
        assert!(
            !format!("{cfg:?}").contains("0123456789abcdef"),
            "token redacted"
        );
    }

    #[test]
    fn executor_nice_defaults_to_ten_and_can_be_turned_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let load = |yaml: &str, flag: Option<u8>| {
            let path = dir.path().join("control.yaml");
            std::fs::write(&path, format!("token: 0123456789abcdef\n{yaml}")).expect("write");
            ControlConfig::load(&ControlArgs {
                config: Some(path),
                executor_nice: flag,
                ..ControlArgs::default()
            })
        };
        assert_eq!(load("", None).expect("load").executor_nice, Some(10));
        assert_eq!(
            load("executor_nice: null\n", None)
                .expect("load")
                .executor_nice,
            None
        );
        assert_eq!(
            load("executor_nice: 3\n", None)
                .expect("load")
                .executor_nice,
            Some(3)
        );
        // The flag overrides the file.
        assert_eq!(
            load("executor_nice: 3\n", Some(19))
                .expect("load")
                .executor_nice,
            Some(19)
        );
        let err = load("executor_nice: 20\n", None).expect_err("20 is past Linux's nice range");
        assert!(err.to_string().contains("executor_nice"), "{err}");
        assert!(load("executor_nice: -1\n", None).is_err());
    }

    #[test]
    fn log_format_flag() {
        use clap::Parser;
        use sonic_daemon::logging::LogFormat;
        let parse = |args: &[&str]| ControlArgs::try_parse_from(args).map(|a| a.log_format);
        assert_eq!(parse(&["sonic-control"]).ok(), Some(LogFormat::Text));
        assert_eq!(
            parse(&["sonic-control", "--log-format", "json"]).ok(),
            Some(LogFormat::Json)
        );
        assert!(parse(&["sonic-control", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn refuses_weak_token_and_unknown_keys() {
        let weak = ControlConfig {
            token: "short".into(),
            ..ControlConfig::default()
        };
        assert!(matches!(weak.check(), Err(ConfigError::Invalid(m)) if m.contains("token")));
        assert!(matches!(
            ControlConfig::from_yaml("c.yaml", "listne: 1.2.3.4:5\n"),
            Err(ConfigError::Parse { path, .. }) if path == "c.yaml"
        ));
    }

    #[test]
    fn openlambda_listener_from_flags_and_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = ControlArgs {
            token: Some("0123456789abcdef".into()),
            data_dir: Some(dir.path().to_path_buf()),
            ..ControlArgs::default()
        };
        let cfg = ControlConfig::load(&base).expect("load");
        assert!(cfg.openlambda.is_none(), "off unless asked for");
        let on = ControlArgs {
            openlambda: Some("127.0.0.1:5000".parse().expect("addr")),
            ..base.clone()
        };
        let cfg = ControlConfig::load(&on).expect("load");
        let ol = cfg.openlambda.as_ref().expect("configured");
        assert_eq!(ol.listen.port(), 5000);
        assert_eq!(ol.python, "python3");
        assert!(ol.token.is_empty());
        let listener = ol.listener(dir.path()).expect("listener");
        assert_eq!(listener.dir, dir.path().join("openlambda"));
        // Off loopback, a token is required; a short one is refused.
        let open = ControlArgs {
            openlambda: Some("0.0.0.0:5000".parse().expect("addr")),
            ..base.clone()
        };
        let err = ControlConfig::load(&open).expect_err("no token off loopback");
        assert!(err.to_string().contains("openlambda.token"), "{err}");
        let weak = ControlArgs {
            openlambda_token: Some("short".into()),
            ..open.clone()
        };
        assert!(ControlConfig::load(&weak).is_err());
        let guarded = ControlArgs {
            openlambda_token: Some("openlambda-0123456789".into()),
            ..open
        };
        let cfg = ControlConfig::load(&guarded).expect("token set");
        assert!(
            !format!("{cfg:?}").contains("openlambda-0123"),
            "token redacted"
        );
        let yaml =
            "openlambda:\n  listen: 127.0.0.1:5001\n  timeout: 5s\n  python: /usr/bin/python3\n";
        let cfg = ControlConfig::from_yaml("c.yaml", yaml).expect("parses");
        let ol = cfg.openlambda.expect("configured");
        assert_eq!(
            (ol.timeout, ol.python.as_str()),
            (Seconds(5.0), "/usr/bin/python3")
        );
        assert!(
            ControlConfig::from_yaml("c.yaml", "openlambda:\n  listen: 127.0.0.1:1\n  nope: 1\n")
                .is_err()
        );
        // The /run/ workers' CPU bound and sandbox.
        assert_eq!(ol.worker_cpus, 1.0, "one CPU unless set");
        assert_eq!(ol.sandbox, OpenLambdaSandbox::Process);
        let yaml = "openlambda:\n  listen: 127.0.0.1:5001\n  worker_cpus: 0.5\n  sandbox: docker\n  image: py:test\n";
        let ol = ControlConfig::from_yaml("c.yaml", yaml)
            .expect("parses")
            .openlambda
            .expect("configured");
        let listener = ol.listener(std::path::Path::new("/d")).expect("listener");
        assert_eq!(listener.worker_cpus, 0.5);
        assert_eq!(
            listener.sandbox,
            sonic_openlambda::WorkerSandbox::Docker {
                image: "py:test".into()
            }
        );
        for bad in [
            "worker_cpus: -1",
            "worker_cpus: .nan",
            "sandbox: vm",
            "image: ''",
            "registry_cache: -1s",
            "keep_alive: 0s",
            "worker_config: /nonexistent/config.json",
        ] {
            // With the control plane's token set, so that what is refused is the bad key.
            let yaml = format!(
                "token: 0123456789abcdef0123\nopenlambda:\n  listen: 127.0.0.1:5001\n  {bad}\n"
            );
            let refused = ControlConfig::from_yaml("c.yaml", &yaml).and_then(|c| c.check());
            let key = bad.split(':').next().unwrap_or(bad);
            // A parse error names the line (the bad key's is line 4), a check the key.
            assert!(
                refused.as_ref().is_err_and(|e| {
                    let e = e.to_string();
                    e.contains(key) || e.contains("line 4")
                }),
                "{bad}: {refused:?}"
            );
        }
    }

    #[test]
    fn the_openlambda_listener_follows_an_openlambda_worker_configuration() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"registry": "file:///srv/reg", "registry_cache_ms": 3000, "limits": {"procs": 10, "mem_mb": 50, "runtime_sec": 9}, "sandbox": "sock"}"#,
        )
        .expect("write");
        let yaml = format!(
            "token: 0123456789abcdef0123\nopenlambda:\n  listen: 127.0.0.1:5001\n  registry: /elsewhere\n  worker_procs: 64\n  worker_config: {}\n",
            file.display()
        );
        let cfg = ControlConfig::from_yaml("c.yaml", &yaml).expect("parses");
        cfg.check().expect("valid");
        let listener = cfg
            .openlambda
            .as_ref()
            .expect("configured")
            .listener(dir.path())
            .expect("listener");
        assert_eq!(
            listener.registry_folder.as_deref(),
            Some(std::path::Path::new("/srv/reg"))
        );
        assert_eq!(listener.registry_cache, Duration::from_secs(3));
        assert_eq!(
            (listener.worker_procs, listener.worker_resident),
            (10, 50 << 20)
        );
        assert_eq!(listener.timeout, Duration::from_secs(9));
        // Without it, the YAML's keys.
        let yaml = "openlambda:\n  listen: 127.0.0.1:5001\n  registry: /elsewhere\n  registry_cache: 0s\n  worker_procs: 64\n  worker_resident: 100MiB\n  keep_alive: 2m\n  max_warm: 3\n";
        let listener = ControlConfig::from_yaml("c.yaml", yaml)
            .expect("parses")
            .openlambda
            .expect("configured")
            .listener(dir.path())
            .expect("listener");
        assert_eq!(
            listener.registry_folder.as_deref(),
            Some(std::path::Path::new("/elsewhere"))
        );
        assert_eq!(listener.registry_cache, Duration::ZERO);
        assert_eq!(
            (listener.worker_procs, listener.worker_resident),
            (64, 100 << 20)
        );
        assert_eq!(
            (listener.keep_alive, listener.max_warm),
            (Duration::from_secs(120), 3)
        );
        // A file that is not an OpenLambda configuration stops the start, saying where.
        std::fs::write(&file, r#"{"registry": "http://localhost:5000"}"#).expect("write");
        let yaml = format!(
            "token: 0123456789abcdef0123\nopenlambda:\n  listen: 127.0.0.1:5001\n  worker_config: {}\n",
            file.display()
        );
        let err = ControlConfig::from_yaml("c.yaml", &yaml)
            .and_then(|c| c.check())
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains("http:// registry is not supported"),
            "{err}"
        );
    }

    #[test]
    fn store_tls_and_join_from_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = ControlArgs {
            token: Some("0123456789abcdef".into()),
            join_token: Some("join-0123456789abcdef".into()),
            data_dir: Some(dir.path().to_path_buf()),
            ..ControlArgs::default()
        };
        let args = ControlArgs {
            s3_endpoint: Some("http://sonic-store:8333".into()),
            s3_bucket: Some("sonic".into()),
            s3_access_key: Some("ak".into()),
            s3_secret_key: Some("sk-secret".into()),
            tls_cert: Some("c.pem".into()),
            tls_key: Some("k.pem".into()),
            ca_file: Some("ca.pem".into()),
            heartbeat_timeout: Some(Seconds(3.0)),
            ..base.clone()
        };
        let cfg = ControlConfig::load(&args).expect("load");
        let Some(StoreChoice::S3(s3)) = &cfg.store else {
            panic!("an S3 store: {cfg:?}");
        };
        assert_eq!(s3.endpoint, "http://sonic-store:8333");
        assert_eq!(s3.secret_key, "sk-secret");
        assert_eq!(
            cfg.tls,
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into()
            })
        );
        assert_eq!(cfg.heartbeat_timeout(), Duration::from_secs(3));
        assert!(
            !format!("{cfg:?}").contains("sk-secret"),
            "secret key redacted"
        );
        assert!(
            !format!("{cfg:?}").contains("join-0123"),
            "join token redacted"
        );

        let half = ControlArgs {
            tls_cert: Some("c.pem".into()),
            ..base.clone()
        };
        assert!(
            matches!(ControlConfig::load(&half), Err(ConfigError::Parse { path, .. }) if path.contains("tls")),
            "a certificate without its key"
        );
        let no_keys = ControlArgs {
            s3_endpoint: Some("http://s:8333".into()),
            ..base.clone()
        };
        assert!(
            ControlConfig::load(&no_keys).is_err(),
            "S3 without credentials"
        );
        let weak_join = ControlArgs {
            join_token: Some("short".into()),
            ..base
        };
        assert!(
            matches!(ControlConfig::load(&weak_join), Err(ConfigError::Invalid(m)) if m.contains("join_token"))
        );
    }
}
