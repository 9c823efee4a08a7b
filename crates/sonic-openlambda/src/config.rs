//! The listener's settings and a lambda's `ol.yaml`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// How the OpenLambda listener runs.
#[derive(Clone)]
pub struct OpenLambdaConfig {
    /// Where it listens; off loopback, `token` must be set.
    pub listen: SocketAddr,
    /// Its folder: the registry (`registry/<name>/`) and the runtime script.
    pub dir: PathBuf,
    /// The bearer token every route but `/status` requires; empty: none (loopback only).
    pub token: String,
    /// The Python interpreter (a name on `PATH` or a path).
    pub python: String,
    /// The longest a call may take (including the import on a cold start).
    pub timeout: Duration,
    /// Request bodies (events, tarballs) larger than this get 413.
    pub max_body: usize,
    /// The largest result a handler may return (its JSON).
    pub max_output: usize,
    /// The most bytes an unpacked lambda may take.
    pub max_unpacked: u64,
    /// Warm workers (and concurrent calls) per lambda.
    pub workers_per_lambda: usize,
    /// Calls a lambda may have waiting or running; past it, 429.
    pub queue_per_lambda: usize,
    /// How long a warm worker may wait for a call before it is stopped.
    pub keep_alive: Duration,
    /// How many warm workers may wait for calls at once, across lambdas; past it the one idle
    /// longest is stopped.
    pub max_warm: usize,
    /// The longest building a `requirements.txt` environment (venv and pip) may take.
    pub pip_timeout: Duration,
    /// The most address space one warm worker may map (`RLIMIT_AS`, set by the runtime before
    /// it imports `f.py`): past it an allocation raises `MemoryError` in the handler, so a
    /// handler that allocates without bound fails its call instead of taking the host's
    /// memory. 0: no limit.
    pub worker_memory: u64,
    /// The CPUs one warm worker may use (a CFS quota: a cgroup of its own per worker, cgroup
    /// v1 `cpu` or v2 `cpu.max`); 0: none. Where cgroups cannot be made (not root), workers
    /// run unbounded and the listener says so once.
    pub worker_cpus: f64,
    /// The memory one warm worker and the processes it forks may hold together, without swap
    /// (a memory cgroup of its own in the process sandbox, Docker's `--memory` in the Docker
    /// sandbox); past it the kernel kills a process of the worker. 0: none.
    pub worker_resident: u64,
    /// The processes and threads one warm worker may have at once, itself included (a `pids`
    /// cgroup; Docker's `--pids-limit`): a handler that forks without end gets an error from
    /// `fork`. 0: none.
    pub worker_procs: u32,
    /// Where `/run/` workers run: host processes of `python` or containers of a Python image.
    pub sandbox: WorkerSandbox,
    /// OpenLambda's registry folder, when lambdas are kept there (`registry` of its worker
    /// configuration): a call of `<name>` installs `<folder>/<name>.tar.gz`, `<name>.py` or
    /// `<name>/` (in that order), and uploads are written there as `<name>.tar.gz`.
    pub registry_folder: Option<PathBuf>,
    /// How long code pulled from the registry folder is used before the folder is looked at
    /// again for a newer version.
    pub registry_cache: Duration,
}

/// The parts of OpenLambda's worker configuration (its `config.json`, as OpenLambda's
/// `go/common/config.go` names them) that a Sonic listener follows: `registry`,
/// `registry_cache_ms` and `limits` (`procs`, `mem_mb`, `cpu_percent`, `runtime_sec`). Keys it
/// does not know are OpenLambda's own (its sandboxes, zygotes, tracing) and are left alone; a
/// limit of 0 keeps the listener's setting, as OpenLambda fills zero limits from its defaults.
#[derive(Debug, Default, Deserialize)]
pub struct WorkerFile {
    #[serde(default)]
    registry: Option<String>,
    #[serde(default)]
    registry_cache_ms: Option<u64>,
    #[serde(default)]
    limits: Option<WorkerFileLimits>,
}

#[derive(Debug, Default, Deserialize)]
struct WorkerFileLimits {
    #[serde(default)]
    procs: Option<u32>,
    #[serde(default)]
    mem_mb: Option<u64>,
    #[serde(default)]
    cpu_percent: Option<u32>,
    #[serde(default)]
    runtime_sec: Option<u64>,
}

impl WorkerFile {
    /// Reads an OpenLambda worker configuration file.
    pub fn load(path: &Path) -> Result<WorkerFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        WorkerFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses one.
    pub fn parse(text: &str) -> Result<WorkerFile, String> {
        let file: WorkerFile = serde_json::from_str(text)
            .map_err(|e| format!("not an OpenLambda worker configuration: {e}"))?;
        if let Some(r) = &file.registry {
            registry_folder(r)?;
        }
        if let Some(l) = &file.limits
            && let Some(s) = l.runtime_sec
            && s > 86_400
        {
            return Err(format!("limits.runtime_sec {s} is more than a day (86400)"));
        }
        if let Some(ms) = file.registry_cache_ms
            && ms > 86_400_000
        {
            return Err(format!(
                "registry_cache_ms {ms} is more than a day (86400000)"
            ));
        }
        Ok(file)
    }
}

/// The folder a `registry` names: a path, or a `file://` URL of one. OpenLambda's other
/// registries (HTTP, S3, GCS) are refused, saying so.
fn registry_folder(registry: &str) -> Result<Option<PathBuf>, String> {
    let path = match registry.split_once("://") {
        None => registry,
        Some(("file", rest)) => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "registry {registry:?}: a {scheme}:// registry is not supported; give a folder (a path, or file:///path)"
            ));
        }
    };
    if path.is_empty() {
        return Ok(None);
    }
    std::path::absolute(path)
        .map(Some)
        .map_err(|e| format!("registry {registry:?}: {e}"))
}

impl OpenLambdaConfig {
    /// Follows an OpenLambda worker configuration: its registry folder and cache interval, and
    /// its limits (`procs`, `mem_mb` as the resident bound, `cpu_percent`, `runtime_sec` as the
    /// call timeout). What it leaves out keeps this configuration's value.
    pub fn follow(&mut self, file: &WorkerFile) {
        if let Some(r) = &file.registry
            && let Ok(Some(folder)) = registry_folder(r)
        {
            self.registry_folder = Some(folder);
        }
        if let Some(ms) = file.registry_cache_ms {
            self.registry_cache = Duration::from_millis(ms);
        }
        if let Some(l) = &file.limits {
            if let Some(p) = l.procs.filter(|&p| p > 0) {
                self.worker_procs = p;
            }
            if let Some(mb) = l.mem_mb.filter(|&m| m > 0) {
                self.worker_resident = mb.saturating_mul(1 << 20);
            }
            if let Some(pct) = l.cpu_percent.filter(|&p| p > 0) {
                self.worker_cpus = f64::from(pct) / 100.0;
            }
            if let Some(s) = l.runtime_sec.filter(|&s| s > 0) {
                self.timeout = Duration::from_secs(s);
            }
        }
    }
}

/// Where the listener's `/run/` workers run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerSandbox {
    /// Host processes of `OpenLambdaConfig::python`, each in a CPU cgroup of its own.
    Process,
    /// One container of this image per warm worker (the Python image of
    /// `deploy/build-python-image.sh`, as the Docker sandbox's handler stages use): no network,
    /// a read-only root, `/tmp` a tmpfs, the worker's memory and CPU bounds as Docker's.
    Docker {
        /// The image, e.g. `sonic-python:latest`.
        image: String,
    },
}

impl WorkerSandbox {
    /// `"process"` or `"docker"`.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerSandbox::Process => "process",
            WorkerSandbox::Docker { .. } => "docker",
        }
    }
}

impl std::fmt::Debug for OpenLambdaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenLambdaConfig")
            .field("listen", &self.listen)
            .field("dir", &self.dir)
            .field("token", &if self.token.is_empty() { "" } else { "<set>" })
            .field("python", &self.python)
            .field("timeout", &self.timeout)
            .field("sandbox", &self.sandbox)
            .field("worker_resident", &self.worker_resident)
            .field("worker_procs", &self.worker_procs)
            .field("registry_folder", &self.registry_folder)
            .field("registry_cache", &self.registry_cache)
            .finish_non_exhaustive()
    }
}

impl OpenLambdaConfig {
    /// Defaults for a listener on `listen` keeping its files in `dir`.
    pub fn new(listen: SocketAddr, dir: PathBuf) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        OpenLambdaConfig {
            listen,
            dir,
            token: String::new(),
            python: "python3".into(),
            timeout: crate::DEFAULT_TIMEOUT,
            max_body: 64 << 20,
            max_output: 16 << 20,
            max_unpacked: 1 << 30,
            workers_per_lambda: cores.max(2),
            queue_per_lambda: 256,
            keep_alive: crate::DEFAULT_KEEP_ALIVE,
            max_warm: crate::DEFAULT_MAX_WARM,
            pip_timeout: crate::venv::DEFAULT_PIP_TIMEOUT,
            worker_memory: crate::DEFAULT_WORKER_MEMORY,
            worker_cpus: crate::DEFAULT_WORKER_CPUS,
            worker_resident: crate::DEFAULT_WORKER_MEMORY,
            worker_procs: crate::DEFAULT_WORKER_PROCS,
            sandbox: WorkerSandbox::Process,
            registry_folder: None,
            registry_cache: crate::DEFAULT_REGISTRY_CACHE,
        }
    }
}

/// Why an `ol.yaml` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML of the expected shape.
    #[error("ol.yaml: {0}")]
    Parse(String),
    /// A value that OpenLambda refuses too.
    #[error("ol.yaml: {0}")]
    Invalid(String),
    /// It could not be read.
    #[error("ol.yaml: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    triggers: RawTriggers,
    #[serde(default)]
    environment: BTreeMap<String, serde_json::Value>,
    #[serde(default, rename = "reuse-sandbox")]
    reuse_sandbox: Option<bool>,
}

#[derive(Deserialize, Default)]
struct RawTriggers {
    http: Option<Vec<HttpTrigger>>,
    #[serde(default)]
    cron: serde_json::Value,
    #[serde(default)]
    kafka: serde_json::Value,
}

#[derive(Deserialize)]
struct HttpTrigger {
    method: String,
}

#[derive(Deserialize)]
struct CronTrigger {
    schedule: String,
}

/// A lambda's parsed `ol.yaml` (OpenLambda's defaults when it has none).
#[derive(Debug, Clone)]
pub struct LambdaConfig {
    /// Allowed HTTP methods; `*` allows all.
    pub methods: Vec<String>,
    /// The handler's environment variables.
    pub environment: BTreeMap<String, String>,
    /// Whether a worker serves more than one call.
    pub reuse_sandbox: bool,
    /// Its cron triggers' schedules (`triggers.cron[].schedule`).
    pub cron: Vec<sonic_core::schedule::Schedule>,
    cron_raw: serde_json::Value,
    kafka: serde_json::Value,
}

impl LambdaConfig {
    /// Reads `<dir>/ol.yaml`, or the defaults (every method, no environment) without one.
    pub fn load(dir: &Path) -> Result<LambdaConfig, ConfigError> {
        match std::fs::read_to_string(dir.join("ol.yaml")) {
            Ok(text) => LambdaConfig::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LambdaConfig::parse(""),
            Err(e) => Err(e.into()),
        }
    }

    /// Parses an `ol.yaml`.
    pub fn parse(text: &str) -> Result<LambdaConfig, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
        };
        let methods = match raw.triggers.http {
            None => vec!["*".to_string()],
            Some(t) => t.into_iter().map(|t| t.method).collect(),
        };
        if methods.iter().any(String::is_empty) {
            return Err(ConfigError::Invalid(
                "HTTP trigger method cannot be empty".into(),
            ));
        }
        let mut environment = BTreeMap::new();
        for (k, v) in raw.environment {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ConfigError::Invalid(format!(
                    "environment variable key `{k}` is not valid"
                )));
            }
            let v = match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null => String::new(),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "environment variable `{k}` must be a scalar"
                    )));
                }
            };
            if v.contains('\0') {
                return Err(ConfigError::Invalid(format!(
                    "environment variable `{k}` contains NUL"
                )));
            }
            environment.insert(k, v);
        }
        let cron = match &raw.triggers.cron {
            serde_json::Value::Null => Vec::new(),
            v => {
                let triggers: Vec<CronTrigger> =
                    serde_json::from_value(v.clone()).map_err(|e| {
                        ConfigError::Invalid(format!(
                            "triggers.cron must be a list of {{schedule: \"...\"}}: {e}"
                        ))
                    })?;
                triggers
                    .iter()
                    .map(|t| {
                        t.schedule
                            .parse()
                            .map_err(|e| ConfigError::Invalid(format!("triggers.cron: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(LambdaConfig {
            methods,
            environment,
            reuse_sandbox: raw.reuse_sandbox.unwrap_or(true),
            cron,
            cron_raw: raw.triggers.cron,
            kafka: raw.triggers.kafka,
        })
    }

    /// Whether `method` may call the lambda.
    pub fn allows(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == "*" || m == method)
    }

    /// The allowed methods as OpenLambda lists them.
    pub fn allowed_methods(&self) -> Vec<String> {
        self.methods.clone()
    }

    /// The file the runtime imports: `OL_ENTRY_FILE` of its environment, as OpenLambda reads
    /// it, or `f.py`; a `.py` file at the lambda's top.
    pub fn entry_file(&self) -> Result<&str, String> {
        let file = self
            .environment
            .get("OL_ENTRY_FILE")
            .map_or("f.py", String::as_str);
        let plain = file.len() > 3
            && file.ends_with(".py")
            && !file.starts_with('.')
            && file
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
            && file.matches('.').count() == 1;
        if plain {
            Ok(file)
        } else {
            Err(format!(
                "OL_ENTRY_FILE must name a Python module file at the lambda's top (like app.py), not {file:?}"
            ))
        }
    }

    /// The environment as pairs.
    pub fn env(&self) -> Vec<(String, String)> {
        self.environment
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The config as OpenLambda's `GET /registry/<name>/config` encodes it (Go field names).
    pub fn to_json(&self) -> serde_json::Value {
        let null_if_empty = |v: &serde_json::Value| {
            if v.is_null() {
                serde_json::Value::Null
            } else {
                v.clone()
            }
        };
        serde_json::json!({
            "Triggers": {
                "HTTP": self.methods.iter().map(|m| serde_json::json!({ "Method": m })).collect::<Vec<_>>(),
                "Cron": null_if_empty(&self.cron_raw),
                "Kafka": null_if_empty(&self.kafka),
            },
            "Environment": self.environment,
            "ReuseSandbox": self.reuse_sandbox,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_environment() {
        let c = LambdaConfig::parse(
            "triggers:\n  http:\n    - method: GET\n    - method: POST\nenvironment:\n  A: x\n  N: 3\n",
        )
        .expect("parses");
        assert!(c.allows("GET") && c.allows("POST") && !c.allows("PUT"));
        assert_eq!(c.allowed_methods().join(" "), "GET POST");
        assert_eq!(c.environment.get("N").map(String::as_str), Some("3"));
        assert!(LambdaConfig::parse("").expect("defaults").allows("DELETE"));
        assert!(LambdaConfig::parse("environment:\n  'A=B': x\n").is_err());
        assert!(LambdaConfig::parse("triggers: [").is_err());
    }

    #[test]
    fn cron_triggers_are_parsed_and_bad_ones_refused() {
        let c = LambdaConfig::parse(
            "triggers:\n  cron:\n    - schedule: \"*/5 * * * *\"\n    - schedule: \"@every 10s\"\n",
        )
        .expect("parses");
        let schedules: Vec<String> = c.cron.iter().map(ToString::to_string).collect();
        assert_eq!(schedules, ["*/5 * * * *", "@every 10s"]);
        assert_eq!(c.to_json()["Triggers"]["Cron"][1]["schedule"], "@every 10s");
        for bad in [
            "triggers:\n  cron:\n    - schedule: \"\"\n",
            "triggers:\n  cron:\n    - schedule: \"every day\"\n",
            "triggers:\n  cron: 5\n",
            "triggers:\n  cron:\n    - when: \"@daily\"\n",
        ] {
            let err = LambdaConfig::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("cron"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_openlambda_worker_configuration_sets_the_registry_folder_and_limits() {
        let mut c = OpenLambdaConfig::new("127.0.0.1:5000".parse().expect("addr"), "/x".into());
        let file = WorkerFile::parse(
            r#"{"registry": "file:///srv/registry", "registry_cache_ms": 3000,
                "limits": {"procs": 10, "mem_mb": 50, "cpu_percent": 50, "runtime_sec": 7, "swappiness": 0},
                "features": {"import_cache": "tree"}, "sandbox": "sock"}"#,
        )
        .expect("parses");
        c.follow(&file);
        assert_eq!(
            c.registry_folder.as_deref(),
            Some(Path::new("/srv/registry"))
        );
        assert_eq!(c.registry_cache, Duration::from_secs(3));
        assert_eq!((c.worker_procs, c.worker_resident), (10, 50 << 20));
        assert_eq!((c.worker_cpus, c.timeout), (0.5, Duration::from_secs(7)));
        // Zero limits and missing keys keep the listener's own settings.
        let mut d = OpenLambdaConfig::new("127.0.0.1:5000".parse().expect("addr"), "/x".into());
        d.follow(
            &WorkerFile::parse(r#"{"registry": "/srv/r", "limits": {"procs": 0}}"#)
                .expect("parses"),
        );
        assert_eq!(d.registry_folder.as_deref(), Some(Path::new("/srv/r")));
        assert_eq!(d.worker_procs, crate::DEFAULT_WORKER_PROCS);
        assert_eq!(d.registry_cache, crate::DEFAULT_REGISTRY_CACHE);
        // Registries Sonic cannot read, and values of the wrong kind, are refused.
        for bad in [
            r#"{"registry": "http://localhost:5000"}"#,
            r#"{"registry": "s3://bucket"}"#,
            r#"{"limits": {"procs": -1}}"#,
            r#"{"limits": {"runtime_sec": 100000}}"#,
            r#"{"registry_cache_ms": "soon"}"#,
            "not json",
        ] {
            assert!(WorkerFile::parse(bad).is_err(), "{bad}");
        }
    }
}
