//! Runs one function instance: stage its inputs (all of them, before it starts: atomic visibility),
//! run it in the sandbox, then route its outputs into the job's namespace and the object store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use sonic_api::agent::{
    FetchReport, FetchRequest, FetchedFile, FileSource, HandlerRun, MAX_FETCH_FILES, MAX_PREWARM,
    OutputFile, PrewarmRequest, Prewarmed, RunReport, RunRequest, RunStatus, StagedInput,
};
use sonic_core::model::Method;

use crate::files::{FilePath, JobId, link_local, move_local};
use crate::sandbox::{RunSpec, Termination};
use crate::server::AgentState;

/// Why an instance could not be run or its outputs not routed (the lambda itself may be fine).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("staging input {dest}: {message}")]
    Stage { dest: String, message: String },
    #[error("sandbox: {0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("output {path}: {message}")]
    Output { path: String, message: String },
    /// The lambda left something the agent refuses to take as an output (a symlink, a FIFO):
    /// the lambda's fault, so the run fails rather than errs.
    #[error("output {path}: {message}")]
    Refused { path: String, message: String },
    /// A handler stage's code could not be made ready on this agent.
    #[error("handler {name}: {message}")]
    Handler { name: String, message: String },
}

/// A run request checked at the agent's door and parsed once: its job id, and each input's
/// destination and source as the agent's own path types. Only a checked run is ever run.
#[derive(Debug, Clone)]
pub struct CheckedRun {
    req: RunRequest,
    job: JobId,
    inputs: Vec<CheckedInput>,
}

/// One input of a checked run.
#[derive(Debug, Clone)]
struct CheckedInput {
    /// Where it lands under the instance's input folder.
    dest: FilePath,
    source: Source,
    /// The size its sender reported (atomic visibility, checked before the instance starts).
    expected_size: Option<u64>,
}

impl CheckedInput {
    /// Checks one input: its destination, and where it comes from.
    fn parse(input: &sonic_api::agent::InputSpec) -> Result<CheckedInput, RunError> {
        let dest = FilePath::parse(&input.dest)
            .map_err(|e| RunError::Invalid(format!("input dest: {e}")))?;
        Ok(CheckedInput {
            dest,
            source: Source::parse(&input.source)?,
            expected_size: input.expected_size,
        })
    }
}

/// Where a checked input comes from.
#[derive(Debug, Clone)]
enum Source {
    /// A file of the job already on this agent.
    VmStorage(FilePath),
    /// A peer agent's file.
    Direct {
        peer_url: String,
        path: FilePath,
        token: String,
    },
    /// The object store's `key`, kept in the job's namespace at `path` (`remote/<key>`).
    Remote { key: String, path: FilePath },
    /// The memory tier's `key`, kept at `path` (`memory/<key>`).
    Memory { key: String, path: FilePath },
}

impl Source {
    /// Checks where a file comes from.
    fn parse(source: &FileSource) -> Result<Source, RunError> {
        let file_path = |raw: &str| {
            FilePath::parse(raw).map_err(|e| RunError::Invalid(format!("input file_path: {e}")))
        };
        Ok(match source {
            FileSource::VmStorage { file_path: raw } => Source::VmStorage(file_path(raw)?),
            FileSource::Direct {
                peer_url,
                file_path: raw,
                token,
            } => Source::Direct {
                peer_url: peer_url.clone(),
                path: file_path(raw)?,
                token: token.clone(),
            },
            FileSource::Remote { key } => {
                sonic_storage::validate_key(key).map_err(|e| RunError::Invalid(e.to_string()))?;
                Source::Remote {
                    key: key.clone(),
                    path: FilePath::parse(&format!("remote/{key}"))
                        .map_err(|e| RunError::Invalid(format!("input key: {e}")))?,
                }
            }
            FileSource::Memory { key } => {
                sonic_storage::validate_key(key).map_err(|e| RunError::Invalid(e.to_string()))?;
                Source::Memory {
                    key: key.clone(),
                    path: FilePath::parse(&format!("memory/{key}"))
                        .map_err(|e| RunError::Invalid(format!("input key: {e}")))?,
                }
            }
        })
    }
}

impl CheckedRun {
    /// Checks what the control plane sent before anything is touched.
    pub fn new(req: RunRequest) -> Result<CheckedRun, RunError> {
        let (job, inputs) = check_request(&req)?;
        Ok(CheckedRun { req, job, inputs })
    }

    /// The request as it came.
    pub fn request(&self) -> &RunRequest {
        &self.req
    }

    /// The run's id.
    pub fn run_id(&self) -> String {
        self.req.run_id()
    }
}

fn check_request(req: &RunRequest) -> Result<(JobId, Vec<CheckedInput>), RunError> {
    let job = JobId::parse(&req.job_id).map_err(|e| RunError::Invalid(e.to_string()))?;
    if !sonic_core::dag::valid_function_name(&req.function) {
        return Err(RunError::Invalid(format!(
            "invalid function name {:?}",
            req.function
        )));
    }
    if let Some(key) = &req.function_key {
        sonic_api::agent::check_function_key(key).map_err(RunError::Invalid)?;
    }
    if req.instances == 0 || req.instance >= req.instances {
        return Err(RunError::Invalid("instance must be below instances".into()));
    }
    match &req.handler {
        Some(h) => check_handler(req, h)?,
        None => {
            if req.command.is_empty() || req.command.iter().any(|a| a.contains('\0')) {
                return Err(RunError::Invalid(
                    "command needs an executable and no NUL".into(),
                ));
            }
        }
    }
    if req.memory_limit_mb == 0
        || !(req.cpus.is_finite() && req.cpus > 0.0)
        || req.timeout_ms == 0
        || req.output_quota_mb == Some(0)
    {
        return Err(RunError::Invalid(
            "memory_limit_mb, cpus, timeout_ms and output_quota_mb must be positive".into(),
        ));
    }
    let mut dests = std::collections::HashSet::new();
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        // Inputs are staged concurrently: two of them must not land on one path.
        if !dests.insert(input.dest.as_str()) {
            return Err(RunError::Invalid(format!(
                "input dest {:?} named twice",
                input.dest
            )));
        }
        inputs.push(CheckedInput::parse(input)?);
    }
    for route in &req.outputs {
        let ok = route.to == "result" || sonic_core::dag::valid_function_name(&route.to);
        if !ok {
            return Err(RunError::Invalid(format!(
                "invalid output route {:?}",
                route.to
            )));
        }
        if let Some(prefix) = &route.upload_prefix {
            sonic_storage::validate_prefix(prefix).map_err(|e| RunError::Invalid(e.to_string()))?;
        }
    }
    for (k, v) in req.env.iter().chain(&req.secrets.0) {
        if k.is_empty()
            || k.contains('=')
            || k.contains('\0')
            || v.contains('\0')
            || sonic_core::dag::reserved_env(k)
        {
            return Err(RunError::Invalid(format!(
                "environment variable {k:?} is not allowed"
            )));
        }
    }
    Ok((job, inputs))
}

/// A handler run names a registered lambda by digest, its tarball at the digest's key, and a
/// known edge kind for each of its routes; it has no image or command of its own.
fn check_handler(req: &RunRequest, h: &HandlerRun) -> Result<(), RunError> {
    let invalid = |m: String| Err(RunError::Invalid(m));
    if !req.command.is_empty() || !req.image.is_empty() {
        return invalid("a handler run has no image or command".into());
    }
    if !sonic_core::dag::valid_handler_name(&h.name) {
        return invalid(format!("invalid handler name {:?}", h.name));
    }
    if !sonic_api::agent::valid_sha256(&h.sha256) {
        return invalid("handler.sha256 must be 64 lowercase hex digits".into());
    }
    if h.key != sonic_api::agent::handler_key(&h.sha256) {
        return invalid("handler.key must be the tarball's key under its digest".into());
    }
    for (to, kind) in &h.routes {
        let to_ok = to == "result" || sonic_core::dag::valid_function_name(to);
        let kind_ok = matches!(
            kind.as_str(),
            "one" | "broadcast" | "gather" | "scatter" | "shuffle" | "result"
        );
        if !to_ok || !kind_ok {
            return invalid(format!("invalid handler route {to:?}: {kind:?}"));
        }
    }
    Ok(())
}

/// Where a handler's code and Sonic's Python runtime are in its container (Docker sandbox).
const HANDLER_DIR: &str = "/sonic/handler";
const RUNTIME_DIR: &str = "/sonic/runtime";

/// How a handler run starts: its command, extra environment, image and mounts.
struct HandlerLaunch {
    command: Vec<String>,
    env: Vec<(String, String)>,
    /// The Python image (Docker sandbox); empty for the process sandbox.
    image: String,
    mounts: Vec<crate::sandbox::Mount>,
}

/// The command and extra environment of a handler run: its lambda fetched from the store,
/// checked against its digest and unpacked once per digest (`<data_dir>/handlers/<sha256>/`),
/// run by the shipped Python runner (`<data_dir>/handlers/runtime/`). The process sandbox runs
/// it with the host's `python3`, or the interpreter of its `requirements.txt`'s environment
/// (`<data_dir>/handlers/venvs/`); the Docker sandbox in a container of the Python image
/// (`config.python_image`), the code, the runtime and the environment (built in that image,
/// `<data_dir>/handlers/docker-venvs/`) bound read-only into it.
async fn handler_command(
    state: &Arc<AgentState>,
    h: &HandlerRun,
) -> Result<HandlerLaunch, RunError> {
    let fail = |message: String| RunError::Handler {
        name: h.name.clone(),
        message,
    };
    let docker = match state.sandbox.kind() {
        "process" => false,
        "docker" => true,
        other => {
            return Err(fail(format!(
                "handler stages run in the process or Docker sandbox, not {other}"
            )));
        }
    };
    let cache = state.config.data_dir.join("handlers");
    let dir = cache.join(&h.sha256);
    if !dir.join("f.py").is_file() {
        let lock = state.fetch_locks.get(&format!("handler/{}", h.sha256));
        let _guard = lock.lock().await;
        if !dir.join("f.py").is_file() {
            let store = state
                .store
                .as_ref()
                .ok_or_else(|| fail("this agent has no object store to fetch it from".into()))?;
            let bytes = store
                .get_bytes(&h.key)
                .await
                .map_err(|e| fail(format!("cannot fetch {}: {e}", h.key)))?;
            let (cache, sha) = (cache.clone(), h.sha256.clone());
            tokio::task::spawn_blocking(move || {
                sonic_openlambda::package::unpack_verified(&cache, &sha, &bytes)
            })
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
            tracing::info!(handler = %h.name, sha256 = %h.sha256, "handler unpacked");
        }
    }
    let rt_dir = cache.join("runtime");
    let (runner, config, requirements) = {
        let (rt_dir, code) = (rt_dir.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            let runner = sonic_openlambda::package::install_runtime(&rt_dir)
                .map_err(|e| format!("cannot write the Python runner: {e}"))?;
            let config = sonic_openlambda::LambdaConfig::load(&code).map_err(|e| e.to_string())?;
            let reqs =
                sonic_openlambda::venv::Requirements::load(&code).map_err(|e| e.to_string())?;
            Ok::<_, String>((runner, config, reqs))
        })
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(fail)?
    };
    let venvs = if docker {
        state
            .docker_venvs
            .as_ref()
            .ok_or_else(|| fail("this agent's Docker sandbox has no environment builder".into()))?
    } else {
        &state.venvs
    };
    // Its requirements.txt's environment, built here the first time a run of this set needs it
    // (that run pays pip's install; later runs, and concurrent ones, share it).
    let venv = match &requirements {
        None => None,
        Some(r) => {
            let built = !venvs.ready(r);
            let python = venvs.ensure(r).await.map_err(|e| fail(e.to_string()))?;
            if built {
                tracing::info!(handler = %h.name, requirements = %r.sha256(), docker, "handler environment ready");
            }
            Some((venvs.dir_of(r), python))
        }
    };
    let mut env: Vec<(String, String)> = config
        .env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("SONIC_") && k != "PYTHONPATH")
        .collect();
    env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    env.push(("PYTHONUNBUFFERED".into(), "1".into()));
    env.push((
        "SONIC_HANDLER_ROUTES".into(),
        serde_json::to_string(&h.routes).unwrap_or_else(|_| "{}".into()),
    ));
    if !docker {
        env.push(("PYTHONPATH".into(), rt_dir.display().to_string()));
        // The warm runtime of the instance ends when the agent is gone (docs/python.md).
        env.push(("SONIC_AGENT_PID".into(), std::process::id().to_string()));
        let python = match venv {
            Some((_, p)) => p.display().to_string(),
            None => host_python().await.to_owned(),
        };
        return Ok(HandlerLaunch {
            command: vec![
                python,
                runner.display().to_string(),
                dir.display().to_string(),
            ],
            env,
            image: String::new(),
            mounts: Vec::new(),
        });
    }
    use crate::sandbox::Mount;
    use crate::sandbox::docker::VENV_DIR;
    env.push(("PYTHONPATH".into(), RUNTIME_DIR.into()));
    env.push(("HOME".into(), "/tmp".into()));
    env.push(("LANG".into(), "C.UTF-8".into()));
    let mut mounts = vec![
        Mount {
            host: dir.clone(),
            container: HANDLER_DIR.into(),
        },
        Mount {
            host: rt_dir.clone(),
            container: RUNTIME_DIR.into(),
        },
    ];
    let python = match venv {
        None => "python3".to_owned(),
        Some((venv_dir, _)) => {
            mounts.push(Mount {
                host: venv_dir,
                container: VENV_DIR.into(),
            });
            format!("{VENV_DIR}/bin/python")
        }
    };
    let runner_name = runner
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(HandlerLaunch {
        command: vec![
            python,
            format!("{RUNTIME_DIR}/{runner_name}"),
            HANDLER_DIR.into(),
        ],
        env,
        image: state.config.python_image.clone(),
        mounts,
    })
}

/// What the Python runner reported of a handler run (`sonic_dag_runner.py`, `USAGE_FILE`).
#[derive(Debug, Default, PartialEq)]
struct HandlerUsage {
    /// The peak resident memory of the warm runtime during the call, in bytes.
    peak: Option<u64>,
    /// The run started its instance's runtime (which imported `f.py`): a cold start for the
    /// handler even in a warm instance (the previous runtime ended, e.g. the handler called
    /// `os._exit`).
    runtime_started: bool,
}

/// Reads (and removes: it is not an output) what the Python runner reported of a handler run.
fn handler_usage(output_dir: &Path) -> HandlerUsage {
    let path = output_dir.join(".sonic-handler-usage.json");
    let text = std::fs::read(&path).ok();
    let _ = std::fs::remove_file(&path);
    let Some(v) = text.and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok()) else {
        return HandlerUsage::default();
    };
    HandlerUsage {
        peak: v
            .get("peak_kib")
            .and_then(serde_json::Value::as_u64)
            .map(|k| k.saturating_mul(1024)),
        runtime_started: v
            .get("runtime_started")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
    }
}

/// The interpreter the host's `python3` is (`sys.executable`), found once: a handler stage's
/// hot run starts it per run (the client of the instance's warm runtime), and a shim in front
/// of it (pyenv's is a bash script) would cost more than the start itself. `python3` when it
/// does not say.
pub async fn host_python() -> &'static str {
    static PYTHON: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    PYTHON
        .get_or_init(|| async {
            let out = tokio::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .stdin(std::process::Stdio::null())
                .output()
                .await;
            match out {
                Ok(o) if o.status.success() => {
                    let exe = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                    if exe.starts_with('/') {
                        exe
                    } else {
                        "python3".to_owned()
                    }
                }
                _ => "python3".to_owned(),
            }
        })
        .await
}

/// The quota of an instance: what the request asks, at most the agent's own.
fn output_quota_mb(state: &AgentState, req: &RunRequest) -> u64 {
    quota_mb(state, req.output_quota_mb)
}

fn quota_mb(state: &AgentState, asked: Option<u64>) -> u64 {
    let own = state.config.output_quota_mb;
    asked.map_or(own, |q| q.min(own))
}

/// Checks a prewarm request against this agent before anything starts; the number of
/// containers (environments) to have warm: the count asked, at most what the agent's memory
/// holds at the request's memory limit.
pub fn check_prewarm(state: &AgentState, req: &PrewarmRequest) -> Result<usize, RunError> {
    let invalid = |m: String| Err(RunError::Invalid(m));
    sonic_api::agent::check_function_key(&req.function_key).map_err(RunError::Invalid)?;
    if let Some(h) = &req.handler {
        if !req.command.is_empty() || !req.image.is_empty() {
            return invalid("a handler stage's prewarm names no image or command".into());
        }
        if h.name.is_empty() || h.name.contains('\0') || h.key.contains('\0') {
            return invalid("handler: a name and a key with no NUL".into());
        }
        if h.sha256.len() != 64 || !h.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return invalid("handler: sha256 must be 64 hex digits".into());
        }
    } else if req.command.is_empty() || req.command.iter().any(|a| a.contains('\0')) {
        return invalid("command needs an executable and no NUL".into());
    }
    if req.image.contains('\0') {
        return invalid("image must have no NUL".into());
    }
    if req.count == 0 || req.count > MAX_PREWARM {
        return invalid(format!("count must be 1 to {MAX_PREWARM}"));
    }
    let memory = state.config.memory_mb;
    if req.memory_limit_mb == 0 || req.memory_limit_mb > memory {
        return invalid(format!(
            "memory_limit_mb must be 1 to this agent's {memory} MB"
        ));
    }
    let vcpus = f64::from(state.config.vcpus.max(1));
    if !(req.cpus.is_finite() && req.cpus > 0.0 && req.cpus <= vcpus) {
        return invalid(format!("cpus must be above 0 and at most {vcpus}"));
    }
    if req.output_quota_mb == Some(0) {
        return invalid("output_quota_mb must be positive".into());
    }
    let fits = usize::try_from(memory / req.memory_limit_mb).unwrap_or(usize::MAX);
    Ok((req.count as usize).min(fits))
}

/// `POST /v1/prewarm`: makes `count` containers (environments) of the function warm and idle on
/// this agent, with the limits its runs will have, so that its next runs are hot.
pub async fn prewarm(state: &Arc<AgentState>, req: &PrewarmRequest) -> Result<Prewarmed, RunError> {
    let count = check_prewarm(state, req)?;
    if let Some(h) = &req.handler {
        return prewarm_handler(state, req, h, count).await;
    }
    let spec = RunSpec {
        run_id: format!("prewarm.{}", req.function_key),
        warm_key: req.warm_key(),
        image: req.image.clone(),
        command: req.command.clone(),
        env: Vec::new(),
        input_dir: PathBuf::new(),
        output_dir: PathBuf::new(),
        memory_limit_bytes: req.memory_limit_mb.saturating_mul(1024 * 1024),
        cpus: req.cpus,
        // Not used: nothing runs.
        timeout: std::time::Duration::from_secs(1),
        output_quota_bytes: quota_mb(state, req.output_quota_mb).saturating_mul(1024 * 1024),
        mounts: Vec::new(),
    };
    let (started, warm) = state.sandbox.prewarm(&spec, count).await?;
    tracing::info!(key = %spec.warm_key, asked = req.count, started, warm, "prewarmed");
    Ok(Prewarmed {
        started: u32::try_from(started).unwrap_or(u32::MAX),
        warm: u32::try_from(warm).unwrap_or(u32::MAX),
    })
}

/// How long starting one instance's Python runtime (its `f.py` imported) may take in a prewarm.
const PREWARM_HANDLER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A handler stage's prewarm: its code fetched and its environment built as for a run, then
/// `count` runs of the runner at once that only start their instance's runtime and import
/// `f.py` (`SONIC_PREWARM`: no call, no output), with the limits of the runs to come. Each ends
/// with its instance warm and idle under the runs' warm key, the runtime in it; an instance
/// that was already warm with a runtime is taken by one of them and left as it was. `started`
/// counts the runtimes started.
async fn prewarm_handler(
    state: &Arc<AgentState>,
    req: &PrewarmRequest,
    h: &HandlerRun,
    count: usize,
) -> Result<Prewarmed, RunError> {
    let launch = handler_command(state, h).await?;
    let base = format!("prewarm.{}", req.function_key);
    let quota = quota_mb(state, req.output_quota_mb).saturating_mul(1024 * 1024);
    let runs: Vec<_> = (0..count)
        .map(|i| {
            let launch = &launch;
            let run_id = format!("{base}.{i}.{}", std::process::id());
            let scratch = state.config.scratch_dir().join(&run_id);
            async move {
                let (input_dir, output_dir) = (scratch.join("input"), scratch.join("output"));
                for d in [&input_dir, &output_dir] {
                    tokio::fs::create_dir_all(d)
                        .await
                        .map_err(|e| RunError::Invalid(format!("scratch: {e}")))?;
                }
                let mut env = launch.env.clone();
                env.push(("SONIC_PREWARM".into(), "1".into()));
                let spec = RunSpec {
                    run_id,
                    warm_key: req.warm_key(),
                    image: launch.image.clone(),
                    mounts: launch.mounts.clone(),
                    command: launch.command.clone(),
                    env,
                    input_dir,
                    output_dir: output_dir.clone(),
                    memory_limit_bytes: req.memory_limit_mb.saturating_mul(1024 * 1024),
                    cpus: req.cpus,
                    timeout: PREWARM_HANDLER_TIMEOUT,
                    output_quota_bytes: quota,
                };
                let outcome = {
                    let _running = Running::count(&state.running);
                    state.sandbox.run(spec).await
                };
                let started = handler_usage(&output_dir).runtime_started;
                let _ = tokio::fs::remove_dir_all(&scratch).await;
                let outcome = outcome?;
                match outcome.termination {
                    Termination::Exited(0) => Ok(started),
                    other => Err(RunError::Handler {
                        name: h.name.clone(),
                        message: format!(
                            "its runtime did not start ({other:?}): {}",
                            outcome.log.lines().last().unwrap_or_default()
                        ),
                    }),
                }
            }
        })
        .collect();
    let results = futures::future::join_all(runs).await;
    let (started, failed) = split_results(results);
    if let Some(e) = failed {
        return Err(e);
    }
    let n = started.iter().filter(|s| **s).count();
    tracing::info!(key = %req.warm_key(), asked = req.count, started = n, warm = started.len(), "prewarmed handler runtimes");
    Ok(Prewarmed {
        started: u32::try_from(n).unwrap_or(u32::MAX),
        warm: u32::try_from(started.len()).unwrap_or(u32::MAX),
    })
}

/// One run in the agent's `running` count, until dropped.
struct Running<'a>(&'a std::sync::atomic::AtomicU32);

impl<'a> Running<'a> {
    fn count(n: &'a std::sync::atomic::AtomicU32) -> Running<'a> {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(n)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One lock per file being fetched, so two instances on this agent that need the same file (a
/// broadcast) fetch it once and share it: one network copy per VM, not per lambda. The lock
/// guards whether a `direct` copy of the file has come to this agent (fetched from a peer, or
/// charged to this agent's NIC when it wrote the file itself): later `direct` stagings of it are
/// free. Kept in memory: after a restart, a file fetched before it is charged once more. A
/// job's locks (keys `<job>/...`) are forgotten with its files ([`FetchLocks::forget_job`]), so a
/// long-running agent does not keep one per file it ever fetched.
#[derive(Debug, Default)]
pub struct FetchLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<bool>>>>,
}

impl FetchLocks {
    fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<bool>> {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.to_owned()).or_default().clone()
    }

    /// Forgets the locks of job `job`'s files (its files are deleted); returns how many.
    pub fn forget_job(&self, job: &str) -> usize {
        let prefix = format!("{job}/");
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let before = map.len();
        map.retain(|k, _| !k.starts_with(&prefix));
        before - map.len()
    }

    /// How many locks are kept (files fetched or charged, handler tarballs).
    pub fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs the request to its end and returns the report (never panics on bad input: errors become an
/// `Error` report).
pub async fn execute(state: Arc<AgentState>, req: RunRequest) -> RunReport {
    let id = req.run_id();
    match CheckedRun::new(req) {
        Ok(run) => execute_checked(state, run).await,
        Err(e) => {
            tracing::warn!(run = %id, error = %e, "run refused");
            let mut report = RunReport::new(id, RunStatus::Error);
            report.error = Some(e.to_string());
            report
        }
    }
}

/// Runs a checked request to its end and returns the report.
pub async fn execute_checked(state: Arc<AgentState>, run: CheckedRun) -> RunReport {
    let id = run.run_id();
    let mut report = RunReport::new(id.clone(), RunStatus::Error);
    let scratch = state.config.scratch_dir().join(&id);
    match run_inner(&state, &run, &scratch, &mut report).await {
        Ok(()) => {}
        Err(e) => {
            tracing::warn!(run = %id, error = %e, "run failed");
            report.status = if unrunnable(&e) {
                RunStatus::Unrunnable
            } else {
                RunStatus::Error
            };
            report.error = Some(e.to_string());
        }
    }
    // Before the scratch folder goes: what a failed lambda wrote there still fills the disk.
    if matches!(report.status, RunStatus::Failed | RunStatus::Error)
        && disk_full(&report, &state.config.data_dir)
    {
        tracing::warn!(run = %id, "run failed with the agent's disk full");
        report.status = RunStatus::DiskFull;
    }
    // The scratch folder held links and moved-out outputs only; the job's files are in the namespace.
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    report
}

/// Below this much free space a failed run is taken as one the full disk failed.
const NEARLY_FULL_BYTES: u64 = 1 << 20;

/// Whether a run could not start at all, for a reason another attempt keeps: its image is
/// missing, its spec is one the sandbox refuses, its command is not there or not executable.
fn unrunnable(e: &RunError) -> bool {
    use crate::sandbox::SandboxError;
    match e {
        RunError::Sandbox(SandboxError::ImageNotFound(_) | SandboxError::InvalidSpec(_)) => true,
        RunError::Sandbox(SandboxError::Io(io)) => matches!(
            io.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
        ),
        _ => false,
    }
}

/// Whether a failed run failed because this agent's disk is full: its error or the lambda's log
/// carries the system's words for `ENOSPC` (errors reach the report as text: staging, routing
/// and the store's client wrap the `io::Error`, and a lambda only has its log), or the data
/// folder's filesystem has next to no space left now.
fn disk_full(report: &RunReport, data_dir: &Path) -> bool {
    let says = |t: &str| {
        let t = t.to_ascii_lowercase();
        t.contains("no space left on device") || t.contains("os error 28")
    };
    report.error.as_deref().is_some_and(says)
        || says(&report.log)
        || free_space(data_dir).is_some_and(|free| free < NEARLY_FULL_BYTES)
}

/// The free bytes (for unprivileged writers) of the filesystem holding `dir`.
#[allow(unsafe_code)]
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` is writable during the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Atomic visibility, checked: every staged input that names the size its sender reported must
/// have exactly that size in the instance's input folder, or the instance does not start.
/// Returns how many were checked.
fn check_complete(run: &CheckedRun, input_dir: &Path) -> Result<usize, RunError> {
    let mut checked = 0;
    for input in &run.inputs {
        let Some(want) = input.expected_size else {
            continue;
        };
        let have = std::fs::metadata(input_dir.join(input.dest.as_str()))
            .map(|m| m.len())
            .map_err(|e| RunError::Stage {
                dest: input.dest.as_str().to_owned(),
                message: format!("not staged: {e}"),
            })?;
        if have != want {
            return Err(RunError::Stage {
                dest: input.dest.as_str().to_owned(),
                message: format!(
                    "incomplete: {have} of the {want} bytes its sender wrote; the instance was not started"
                ),
            });
        }
        checked += 1;
    }
    Ok(checked)
}

async fn run_inner(
    state: &Arc<AgentState>,
    run: &CheckedRun,
    scratch: &Path,
    report: &mut RunReport,
) -> Result<(), RunError> {
    let (req, job) = (&run.req, &run.job);
    let input_dir = scratch.join("input");
    let output_dir = scratch.join("output");
    let _ = tokio::fs::remove_dir_all(scratch).await;
    for d in [&input_dir, &output_dir] {
        tokio::fs::create_dir_all(d)
            .await
            .map_err(|e| RunError::Invalid(format!("scratch: {e}")))?;
    }
    // Inputs are staged concurrently (a receiver of a shuffle reads one file from every sender:
    // one at a time, it would pay the store's or the peer's request latency once per file, where
    // the model pays it once per VM and direction). Each input's `seconds` is its share of the
    // staging's wall time.
    let started = Instant::now();
    // The futures are made first (a closure inside the stream would not be `Send` for every
    // lifetime, as the spawned run needs).
    let fetches: Vec<_> = run
        .inputs
        .iter()
        .map(|input| stage_input(state, job, input, &input_dir))
        .collect();
    let results: Vec<Result<StagedInput, RunError>> = futures::stream::iter(fetches)
        .buffered(TRANSFER_CONCURRENCY)
        .collect()
        .await;
    let (mut staged, failed) = split_results(results);
    share_wall_time(
        staged.iter_mut().map(|s| &mut s.seconds),
        started.elapsed().as_secs_f64(),
    );
    report.staged.extend(staged);
    if let Some(e) = failed {
        return Err(e);
    }
    let checked = check_complete(run, &input_dir)?;

    let mut env: Vec<(String, String)> = req
        .env
        .iter()
        .chain(&req.secrets.0)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("SONIC_JOB_ID".into(), req.job_id.clone()));
    env.push(("SONIC_FUNCTION".into(), req.function.clone()));
    env.push(("SONIC_INSTANCE".into(), req.instance.to_string()));
    env.push(("SONIC_INSTANCES".into(), req.instances.to_string()));
    env.push((
        "SONIC_PARAMS".into(),
        serde_json::Value::Object(req.params.clone()).to_string(),
    ));
    for (to, n) in &req.fanouts {
        env.push((sonic_core::dag::fanout_env_var(to), n.to_string()));
    }
    let (command, image, mounts) = match &req.handler {
        Some(h) => {
            let setup = Instant::now();
            let launch = handler_command(state, h).await?;
            report.setup_s = Some(setup.elapsed().as_secs_f64());
            env.extend(launch.env);
            (launch.command, launch.image, launch.mounts)
        }
        None => (req.command.clone(), req.image.clone(), Vec::new()),
    };
    let spec = RunSpec {
        run_id: report.run_id.clone(),
        warm_key: req.warm_key(),
        image,
        mounts,
        command,
        env,
        input_dir: input_dir.clone(),
        output_dir: output_dir.clone(),
        memory_limit_bytes: req.memory_limit_mb.saturating_mul(1024 * 1024),
        cpus: req.cpus,
        timeout: std::time::Duration::from_millis(req.timeout_ms),
        output_quota_bytes: output_quota_mb(state, req).saturating_mul(1024 * 1024),
    };
    let outcome = {
        // Counted while the sandbox runs, however the run ends (a stopped run is dropped here).
        let _running = Running::count(&state.running);
        state.sandbox.run(spec).await
    };
    let outcome = outcome?;
    report.cold = Some(outcome.cold);
    report.seconds = Some(outcome.duration.as_secs_f64());
    report.start_latency_s = Some(outcome.start_latency.as_secs_f64());
    report.warm = outcome.warm_idle.map(|idle| sonic_api::agent::WarmIdle {
        idle: u32::try_from(idle).unwrap_or(u32::MAX),
        keep_alive_s: state.config.warm_idle_s,
        seq: outcome.warm_seq,
    });
    report.start_contention = outcome.start_contention;
    report.cpus = outcome.cpus;
    let mut peak = outcome.peak_memory_bytes;
    if req.handler.is_some() {
        let usage = handler_usage(&output_dir);
        if let Some(handler_peak) = usage.peak {
            // The call ran in the instance's warm Python runtime, not in the run's own process.
            peak = Some(peak.unwrap_or(0).max(handler_peak));
        }
        if usage.runtime_started {
            // A new runtime imported the handler: a cold start, whatever the instance was.
            report.cold = Some(true);
        }
    }
    report.peak_memory_mb = peak.map(|b| b as f64 / (1024.0 * 1024.0));
    let mut termination = outcome.termination.clone();
    if state.sandbox.kind() == "process"
        && matches!(termination, Termination::Exited(_))
        && peak.is_some_and(|p| p > req.memory_limit_mb.saturating_mul(1024 * 1024))
    {
        // As the process sandbox checks its own process's peak after the fact: the runtime
        // the handler ran in went over the run's limit.
        termination = Termination::OutOfMemory;
    }
    // What the lambda printed of its secrets is not kept.
    report.log = req.secrets.redact(&outcome.log);
    if checked > 0 {
        report.log.insert_str(
            0,
            &format!("sonic: {checked} inputs complete before the start (sizes checked)\n"),
        );
    }
    match termination {
        Termination::Exited(0) => {}
        Termination::Exited(code @ (126 | 127)) => {
            report.status = RunStatus::Unrunnable;
            report.exit_code = Some(code);
            report.error = Some(format!(
                "lambda exited with status {code}: its command {} (not retried)",
                if code == 127 {
                    "was not found"
                } else {
                    "is not executable"
                }
            ));
            return Ok(());
        }
        Termination::Exited(code) => {
            report.status = RunStatus::Failed;
            report.exit_code = Some(code);
            report.error = Some(format!("lambda exited with status {code}"));
            return Ok(());
        }
        Termination::Signaled(sig) => {
            report.status = RunStatus::Failed;
            report.error = Some(format!("lambda killed by signal {sig}"));
            return Ok(());
        }
        Termination::OutOfMemory => {
            report.status = RunStatus::OutOfMemory;
            report.error = Some(format!(
                "lambda exceeded its memory limit of {} MB",
                req.memory_limit_mb
            ));
            return Ok(());
        }
        Termination::TimedOut => {
            report.status = RunStatus::TimedOut;
            report.error = Some(format!(
                "lambda ran past its timeout of {} ms",
                req.timeout_ms
            ));
            return Ok(());
        }
        Termination::OutputQuotaExceeded => {
            report.status = RunStatus::Failed;
            report.error = Some(format!(
                "lambda wrote more than its quota of {} MB",
                output_quota_mb(state, req)
            ));
            return Ok(());
        }
        Termination::Violation(why) => {
            report.status = RunStatus::Failed;
            report.error = Some(format!("lambda contained: {why}"));
            return Ok(());
        }
    }
    report.outputs = match route_outputs(state, req, job, &output_dir).await {
        Ok(outputs) => outputs,
        Err(e @ RunError::Refused { .. }) => {
            tracing::warn!(run = %report.run_id, error = %e, "lambda output refused");
            report.status = RunStatus::Failed;
            report.error = Some(format!("lambda contained: {e}"));
            report.log.push_str(&format!("sonic: {e}\n"));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    report.status = RunStatus::Succeeded;
    Ok(())
}

async fn stage_input(
    state: &Arc<AgentState>,
    job: &JobId,
    input: &CheckedInput,
    input_dir: &Path,
) -> Result<StagedInput, RunError> {
    let err = |m: String| RunError::Stage {
        dest: input.dest.as_str().to_owned(),
        message: m,
    };
    let target = input_dir.join(input.dest.as_str());
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| err(e.to_string()))?;
    }
    let started = Instant::now();
    // Every source first lands in the job's namespace (once per agent), then is linked into the
    // instance's input folder: no byte copy on this agent whatever the method.
    let (method, local, bytes, fetched) = land(state, job, &input.source).await.map_err(err)?;
    link_local(&local, &target).map_err(|e| err(e.to_string()))?;
    Ok(StagedInput {
        dest: input.dest.as_str().to_owned(),
        method,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        fetched,
    })
}

/// `POST /v1/fetches`: lands a job's files in its namespace now, several at a time, so that the
/// runs that read them later copy nothing (`sonic_api::agent::FetchRequest`). Checked whole
/// before anything is fetched; the first file that cannot be landed fails the request (those
/// landed stay, as a run's staging would leave them).
pub async fn fetch(state: &Arc<AgentState>, req: &FetchRequest) -> Result<FetchReport, RunError> {
    let job = JobId::parse(&req.job_id).map_err(|e| RunError::Invalid(e.to_string()))?;
    if req.files.is_empty() || req.files.len() > MAX_FETCH_FILES {
        return Err(RunError::Invalid(format!(
            "a fetch asks for 1 to {MAX_FETCH_FILES} files, not {}",
            req.files.len()
        )));
    }
    let sources = req
        .files
        .iter()
        .map(|f| match Source::parse(f)? {
            Source::VmStorage(_) => Err(RunError::Invalid(
                "a vm-storage file is on this agent already: nothing to fetch".into(),
            )),
            s => Ok(s),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let lands: Vec<_> = sources
        .iter()
        .map(|source| async {
            let (_, _, bytes, fetched) = land(state, &job, source).await?;
            Ok::<_, String>(FetchedFile {
                bytes,
                done_s: started.elapsed().as_secs_f64(),
                fetched,
            })
        })
        .collect();
    let results: Vec<Result<FetchedFile, String>> = futures::stream::iter(lands)
        .buffered(TRANSFER_CONCURRENCY)
        .collect()
        .await;
    let mut files = Vec::with_capacity(results.len());
    for (r, f) in results.into_iter().zip(&req.files) {
        let what = match f {
            FileSource::Direct { file_path, .. } => file_path.as_str(),
            FileSource::Remote { key } | FileSource::Memory { key } => key.as_str(),
            FileSource::VmStorage { file_path } => file_path.as_str(),
        };
        files.push(r.map_err(|message| RunError::Stage {
            dest: what.to_owned(),
            message,
        })?);
    }
    Ok(FetchReport {
        files,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Lands `source` in `job`'s namespace on this agent (once per agent: a second caller finds it
/// there): how it came, where it is, its size and whether landing it paid the edge's copy.
async fn land(
    state: &Arc<AgentState>,
    job: &JobId,
    source: &Source,
) -> Result<(Method, PathBuf, u64, bool), String> {
    Ok(match source {
        Source::VmStorage(path) => {
            let meta = state.files.meta(job, path).map_err(|e| e.to_string())?;
            let meta = meta.ok_or_else(|| format!("{} is not on this agent", path.as_str()))?;
            let local = state.files.resolve(job, path).map_err(|e| e.to_string())?;
            (Method::VmStorage, local, meta.size, false)
        }
        Source::Direct {
            peer_url,
            path,
            token,
        } => {
            let file_path = path.as_str();
            let lock = state.fetch_locks.get(&format!("{job}/{file_path}"));
            let mut copied = lock.lock().await;
            let (size, fetched) = match state.files.meta(job, path).map_err(|e| e.to_string())? {
                Some(meta) if *copied => (meta.size, false),
                Some(meta) => {
                    // This agent wrote it (the resource manager gave the receiver the sender's
                    // VM): a `direct` edge still costs one network copy (model.md), so the
                    // emulated NIC is charged what fetching it from a peer would cost.
                    let charged =
                        crate::transfer::charge_own_copy(&state.throttle, meta.size).await;
                    *copied = true;
                    (meta.size, charged)
                }
                None => {
                    let dest = state
                        .files
                        .prepare_write(job, path)
                        .map_err(|e| e.to_string())?;
                    let stats = crate::transfer::fetch_direct(
                        &state.http,
                        peer_url,
                        job.as_str(),
                        file_path,
                        token,
                        &dest,
                        Some(&state.throttle),
                        &state.meter,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    state
                        .files
                        .register_verified(job, path, stats.bytes, &stats.checksum)
                        .map_err(|e| e.to_string())?;
                    *copied = true;
                    (stats.bytes, true)
                }
            };
            let local = state.files.resolve(job, path).map_err(|e| e.to_string())?;
            (Method::Direct, local, size, fetched)
        }
        Source::Remote { key, path } => {
            let store = state
                .store
                .as_ref()
                .ok_or_else(|| "this agent has no object store".to_owned())?;
            let (size, fetched) = land_object(state, job, path, "remote", key, |dest| async move {
                let stats = crate::transfer::download_remote(store.as_ref(), key, &dest)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((stats.bytes, stats.checksum))
            })
            .await?;
            let local = state.files.resolve(job, path).map_err(|e| e.to_string())?;
            (Method::Remote, local, size, fetched)
        }
        Source::Memory { key, path } => {
            let (size, fetched) = land_object(state, job, path, "memory", key, |dest| async move {
                // The tier writes `dest` atomically (a temporary name, then a rename).
                state
                    .memory
                    .get_file(key, &dest)
                    .await
                    .map_err(|e| format!("memory tier: {e}"))?;
                tokio::task::spawn_blocking(move || {
                    crate::files::checksum_reader(std::fs::File::open(dest)?)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("memory tier: {e}"))
            })
            .await?;
            let local = state.files.resolve(job, path).map_err(|e| e.to_string())?;
            (Method::Memory, local, size, fetched)
        }
    })
}

/// Lands object `key` of a store (`tier`: `remote` or `memory`) at `path` in `job`'s namespace,
/// once per agent: `download` writes it to the path it is given and returns its size and
/// checksum, which are verified as it is registered. Its size, and whether this call fetched it
/// (false when another instance on this agent had).
async fn land_object<F, Fut>(
    state: &Arc<AgentState>,
    job: &JobId,
    path: &FilePath,
    tier: &str,
    key: &str,
    download: F,
) -> Result<(u64, bool), String>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, String), String>>,
{
    let lock = state.fetch_locks.get(&format!("{job}/{tier}/{key}"));
    let _guard = lock.lock().await;
    if let Some(meta) = state.files.meta(job, path).map_err(|e| e.to_string())? {
        return Ok((meta.size, false));
    }
    let dest = state
        .files
        .prepare_write(job, path)
        .map_err(|e| e.to_string())?;
    let (bytes, checksum) = download(dest).await?;
    let size = state
        .files
        .register_verified(job, path, bytes, &checksum)
        .map_err(|e| e.to_string())?
        .size;
    Ok((size, true))
}

/// Every regular file under `dir`, as paths relative to it, in name order. Symlinks and other
/// special files a lambda planted are refused.
fn walk_outputs(dir: &Path) -> Result<Vec<PathBuf>, RunError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), RunError> {
        let entries = std::fs::read_dir(dir).map_err(|e| RunError::Output {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            let ft = e.file_type().map_err(|err| RunError::Output {
                path: rel.display().to_string(),
                message: err.to_string(),
            })?;
            if ft.is_dir() {
                walk(root, &path, out)?;
            } else if ft.is_file() {
                out.push(rel);
            } else {
                let what = if ft.is_symlink() {
                    "a symbolic link"
                } else {
                    "a special file"
                };
                return Err(RunError::Refused {
                    path: rel.display().to_string(),
                    message: format!(
                        "the lambda wrote {what}; only regular files are outputs (never followed)"
                    ),
                });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// How many transfers one instance runs at once: its inputs' fetches, its outputs' uploads.
pub const TRANSFER_CONCURRENCY: usize = 8;

/// The successes, in order, and the first failure.
fn split_results<T>(results: Vec<Result<T, RunError>>) -> (Vec<T>, Option<RunError>) {
    let mut ok = Vec::with_capacity(results.len());
    let mut failed = None;
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    (ok, failed)
}

/// Transfers that overlapped in time: scales their own durations down so that they sum to the
/// wall time they took together (each keeps its share), so that what the control plane adds up
/// per edge is time the instance spent, not more. Durations that did not overlap (their sum is
/// within the wall time) are left as they are.
fn share_wall_time<'a>(seconds: impl Iterator<Item = &'a mut f64>, wall: f64) {
    let mut seconds: Vec<&mut f64> = seconds.collect();
    let sum: f64 = seconds.iter().map(|s| **s).sum();
    if sum > wall && sum > 0.0 && wall.is_finite() {
        let k = wall / sum;
        for s in &mut seconds {
            **s *= k;
        }
    }
}

/// Uploads output `i` (file `dest`, object `key`); its index and how long it took.
async fn upload_one(
    store: &dyn sonic_storage::ObjectStore,
    i: usize,
    key: String,
    path: String,
    dest: PathBuf,
) -> Result<(usize, f64), RunError> {
    let t = Instant::now();
    crate::transfer::upload_remote(store, &key, &dest)
        .await
        .map_err(|e| RunError::Output {
            path,
            message: e.to_string(),
        })?;
    Ok((i, t.elapsed().as_secs_f64()))
}

/// One output uploaded: where it went and how long it took.
struct Uploaded {
    index: usize,
    seconds: f64,
    in_memory: bool,
    spilled: Option<String>,
}

/// Uploads output `i` to the memory tier when `memory` asks for it, else (or when the tier
/// refuses it: full, too large, unreachable, none configured) to the object store.
async fn upload_to_tier(
    state: &Arc<AgentState>,
    memory: bool,
    i: usize,
    key: String,
    path: String,
    dest: PathBuf,
) -> Result<Uploaded, RunError> {
    let mut spilled = None;
    if memory {
        let t = Instant::now();
        match state.memory.put_file(&key, &dest).await {
            Ok(_) => {
                return Ok(Uploaded {
                    index: i,
                    seconds: t.elapsed().as_secs_f64(),
                    in_memory: true,
                    spilled: None,
                });
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "the memory tier refused an output; it goes to the store");
                spilled = Some(e.to_string());
            }
        }
    }
    let Some(store) = state.store.as_ref() else {
        return Err(RunError::Output {
            path,
            message: format!(
                "the memory tier refused it ({}) and this agent has no object store",
                spilled.unwrap_or_default()
            ),
        });
    };
    let (_, seconds) = upload_one(store.as_ref(), i, key, path, dest).await?;
    Ok(Uploaded {
        index: i,
        seconds,
        in_memory: false,
        spilled,
    })
}

async fn route_outputs(
    state: &Arc<AgentState>,
    req: &RunRequest,
    job: &JobId,
    output_dir: &Path,
) -> Result<Vec<OutputFile>, RunError> {
    let files = {
        let dir = output_dir.to_path_buf();
        tokio::task::spawn_blocking(move || walk_outputs(&dir))
            .await
            .map_err(|e| RunError::Output {
                path: String::new(),
                message: e.to_string(),
            })??
    };
    let mut outputs = Vec::with_capacity(files.len());
    let mut uploads: Vec<(usize, PathBuf, bool)> = Vec::new();
    for rel in files {
        let rel_str = rel.to_string_lossy().to_string();
        let oerr = |m: String| RunError::Output {
            path: rel_str.clone(),
            message: m,
        };
        let (to, name) = rel_str.split_once('/').ok_or_else(|| {
            oerr("outputs go into a folder named after a receiver, or result/".into())
        })?;
        if name.starts_with(crate::files::TEMP_PREFIX)
            || name.split('/').any(|s| s.starts_with(".tmp"))
        {
            // An unfinished atomic write of the lambda's own: not an output.
            continue;
        }
        let route = req.outputs.iter().find(|r| r.to == to).ok_or_else(|| {
            oerr(format!(
                "{to:?} is not a receiver of {} nor result",
                req.function
            ))
        })?;
        let file_path = format!("{}/{}/{}/{}", req.function, req.instance, to, name);
        let path = FilePath::parse(&file_path).map_err(|e| oerr(e.to_string()))?;
        let dest = state
            .files
            .prepare_write(job, &path)
            .map_err(|e| oerr(e.to_string()))?;
        move_local(&output_dir.join(&rel), &dest).map_err(|e| oerr(e.to_string()))?;
        let meta = state
            .files
            .register_output(job, &path)
            .map_err(|e| oerr(e.to_string()))?;
        let mut out = OutputFile {
            file_path: file_path.clone(),
            to: to.to_owned(),
            name: name.to_owned(),
            size: meta.size,
            checksum: meta.checksum.clone(),
            key: None,
            upload_seconds: None,
            in_memory: false,
            spilled: None,
        };
        if let Some(prefix) = &route.upload_prefix {
            if state.store.is_none() && !(route.memory && state.memory.configured()) {
                return Err(oerr("this agent has no object store".into()));
            }
            out.key = Some(format!("{}/{}", prefix.trim_end_matches('/'), name));
            uploads.push((outputs.len(), dest, route.memory));
        }
        outputs.push(out);
    }
    // The uploads, concurrently (as the inputs' fetches); each output's `upload_seconds` is its
    // share of their wall time.
    if !uploads.is_empty() {
        let started = Instant::now();
        let sends: Vec<_> = uploads
            .into_iter()
            .map(|(i, dest, memory)| {
                let key = outputs[i].key.clone().unwrap_or_default();
                let path = format!("{}/{}", outputs[i].to, outputs[i].name);
                upload_to_tier(state, memory, i, key, path, dest)
            })
            .collect();
        let results: Vec<Result<Uploaded, RunError>> = futures::stream::iter(sends)
            .buffered(TRANSFER_CONCURRENCY)
            .collect()
            .await;
        let (mut done, failed) = split_results(results);
        if let Some(e) = failed {
            return Err(e);
        }
        share_wall_time(
            done.iter_mut().map(|u| &mut u.seconds),
            started.elapsed().as_secs_f64(),
        );
        for u in done {
            let o = &mut outputs[u.index];
            o.upload_seconds = Some(u.seconds);
            o.in_memory = u.in_memory;
            o.spilled = u.spilled;
        }
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::RunningAgent;
    use crate::throttle::AgentThrottle;
    use sonic_api::agent::InputSpec;

    /// A failed run is the full disk's when its error or its lambda's log says `ENOSPC` in the
    /// system's words; not otherwise on a disk with room (this machine's temporary folder).
    #[test]
    fn a_failed_run_is_the_full_disks_when_the_system_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = |error: Option<&str>, log: &str| RunReport {
            exit_code: Some(1),
            error: error.map(str::to_owned),
            log: log.into(),
            ..RunReport::new("r".into(), RunStatus::Failed)
        };
        assert!(disk_full(
            &report(
                Some("staging input a/0/x: local i/o: No space left on device (os error 28)"),
                ""
            ),
            dir.path()
        ));
        assert!(disk_full(
            &report(
                Some("lambda exited with status 1"),
                "write: No space left on device\n"
            ),
            dir.path()
        ));
        assert!(!disk_full(
            &report(
                Some("lambda exited with status 1"),
                "panicked at src/main.rs\n"
            ),
            dir.path()
        ));
        assert!(free_space(dir.path()).is_some_and(|f| f >= NEARLY_FULL_BYTES));
    }

    const FILE_KEY: &str = "file-key-0123456789abcdef";
    const JOB: &str = "j-own-copy";
    /// The file a sender wrote: 2 MiB, half a second at the limit below.
    const PATH: &str = "send/0/recv/data.bin";
    const SIZE: usize = 2 << 20;

    /// An agent (no store, no control plane) whose NIC does `bytes_per_sec` each way
    /// (`None`: unlimited).
    async fn agent(root: &Path, id: &str, bytes_per_sec: Option<f64>) -> RunningAgent {
        let cfg =
            crate::config::local_config(id, &root.join(id), "control-token-0123456789", FILE_KEY);
        let sandbox = crate::sandbox::ProcessSandbox::new(crate::sandbox::ProcessConfig {
            work_dir: root.join(id).join("processes"),
            ..crate::sandbox::ProcessConfig::default()
        })
        .expect("process sandbox");
        let throttle = AgentThrottle::from_bytes_per_sec(bytes_per_sec, bytes_per_sec);
        crate::server::start(cfg, Arc::new(sandbox), None, &throttle)
            .await
            .expect("start agent")
    }

    fn direct(peer: &RunningAgent) -> FileSource {
        FileSource::Direct {
            peer_url: peer.url(),
            file_path: PATH.into(),
            token: sonic_api::token::issue(FILE_KEY.as_bytes(), JOB, PATH, u64::MAX / 2),
        }
    }

    /// Stages `source` on `on` for instance `k` of the receiver (an input folder of its own).
    async fn stage(on: &RunningAgent, root: &Path, k: usize, source: FileSource) -> StagedInput {
        let input = InputSpec {
            dest: "send/0/data.bin".into(),
            source,
            expected_size: None,
        };
        let input = CheckedInput::parse(&input).expect("a valid input");
        let job = JobId::parse(JOB).expect("job id");
        let dir = root.join(format!("in-{}-{k}", on.state.config.id));
        stage_input(&on.state, &job, &input, &dir)
            .await
            .expect("staged")
    }

    /// Bytes through the agent's (egress, ingress) limiters so far.
    fn through_nic(a: &RunningAgent) -> (usize, usize) {
        (
            a.state.throttle.egress.total_bytes_consumed(),
            a.state.throttle.ingress.total_bytes_consumed(),
        )
    }

    /// A `direct` input whose file its own agent wrote costs one copy through that agent's NIC
    /// (both ends of a peer fetch: its egress and its ingress), once per agent, reported as
    /// fetched and kept out of the bandwidth meter; `vm-storage` costs nothing; a file a real
    /// fetch brought is not charged again; without an emulated bandwidth nothing is charged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_direct_file_its_own_agent_wrote_costs_one_copy_through_its_nic() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let limited = Some(4e6);
        let (a, b) = (
            agent(root, "a-1", limited).await,
            agent(root, "a-2", limited).await,
        );
        let c = agent(root, "a-3", None).await;
        let job = JobId::parse(JOB).expect("job id");
        let path = FilePath::parse(PATH).expect("path");
        let content = vec![7u8; SIZE];
        for x in [&a, &c] {
            x.state
                .files
                .write_atomic(&job, &path, &content)
                .expect("sender's output");
        }

        let own = stage(&a, root, 0, direct(&a)).await;
        assert_eq!(
            (own.method.as_str(), own.bytes, own.fetched),
            ("direct", SIZE as u64, true)
        );
        assert_eq!(through_nic(&a), (SIZE, SIZE), "one copy, both ends");
        assert_eq!(a.state.meter.snapshot().samples, 0, "not a measurement");
        // A second instance on the same VM shares the copy (broadcast: one per VM).
        let again = stage(&a, root, 1, direct(&a)).await;
        assert!(!again.fetched);
        assert_eq!(through_nic(&a), (SIZE, SIZE));
        let vm = stage(
            &a,
            root,
            2,
            FileSource::VmStorage {
                file_path: PATH.into(),
            },
        )
        .await;
        assert_eq!((vm.method.as_str(), vm.fetched), ("vm-storage", false));
        assert_eq!(through_nic(&a), (SIZE, SIZE), "vm-storage is free");

        // A real fetch: the sender's egress and the receiver's ingress, once.
        let fetched = stage(&b, root, 0, direct(&a)).await;
        assert!(fetched.fetched);
        assert_eq!(through_nic(&a), (2 * SIZE, SIZE));
        assert_eq!(through_nic(&b), (0, SIZE));
        let shared = stage(&b, root, 1, direct(&a)).await;
        assert!(!shared.fetched, "landed by a fetch: not charged again");
        assert_eq!(through_nic(&b), (0, SIZE));

        // Deleting the job's files forgets its locks (one per file and agent), on the route
        // the control plane calls at the job's end.
        assert_eq!(b.state.fetch_locks.len(), 1);
        let gone = reqwest::Client::new()
            .delete(format!("{}/v1/jobs/{JOB}", b.url()))
            .bearer_auth("control-token-0123456789")
            .send()
            .await
            .expect("delete the job");
        assert_eq!(gone.status(), 204);
        assert!(b.state.fetch_locks.is_empty());
        assert_eq!(a.state.fetch_locks.len(), 1, "another agent's are its own");

        let unlimited = stage(&c, root, 0, direct(&c)).await;
        assert!(!unlimited.fetched);
        assert_eq!(
            through_nic(&c),
            (0, 0),
            "no emulated bandwidth: nothing changes"
        );
        for x in [a, b, c] {
            x.stop().await;
        }
    }

    /// `POST /v1/fetches` lands a stage's inputs on the receiving agent at once, through the
    /// route the control plane calls: the sender's NIC pays the copy then, and a run that reads
    /// the file later copies nothing (`fetched: false`). A request the checks refuse (a bad job
    /// id, nothing asked, a vm-storage file, a bad path) is a 400 that fetches nothing; a file
    /// no peer has is a 502.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_lands_a_stages_inputs_before_its_runs_read_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let limited = Some(4e6);
        let (a, b) = (
            agent(root, "a-1", limited).await,
            agent(root, "a-2", limited).await,
        );
        let job = JobId::parse(JOB).expect("job id");
        let path = FilePath::parse(PATH).expect("path");
        a.state
            .files
            .write_atomic(&job, &path, &vec![7u8; SIZE])
            .expect("sender's output");
        let http = reqwest::Client::new();
        let post = |body: serde_json::Value| {
            http.post(format!("{}/v1/fetches", b.url()))
                .bearer_auth("control-token-0123456789")
                .json(&body)
                .send()
        };
        let req = FetchRequest {
            job_id: JOB.into(),
            files: vec![direct(&a)],
        };
        let bad = [
            serde_json::json!({"job_id": "../x", "files": [direct(&a)]}),
            serde_json::json!({"job_id": JOB, "files": []}),
            serde_json::json!({"job_id": JOB, "files": [{"method": "vm-storage", "file_path": PATH}]}),
            serde_json::json!({"job_id": JOB, "files": [{"method": "direct", "peer_url": a.url(), "file_path": "../../etc", "token": "t"}]}),
        ];
        for body in bad {
            let r = post(body.clone()).await.expect("answer");
            assert_eq!(r.status(), 400, "{body}");
        }
        assert_eq!(through_nic(&b), (0, 0), "nothing fetched for bad requests");

        let r = post(serde_json::to_value(&req).expect("json"))
            .await
            .expect("answer");
        assert_eq!(r.status(), 200);
        let report: FetchReport = r.json().await.expect("a fetch report");
        assert_eq!(report.files.len(), 1);
        let f = &report.files[0];
        assert_eq!((f.bytes, f.fetched), (SIZE as u64, true));
        assert!(f.done_s > 0.0 && f.done_s <= report.seconds, "{report:?}");
        assert_eq!(through_nic(&a), (SIZE, 0), "the sender's egress, once");
        assert_eq!(through_nic(&b), (0, SIZE));

        // The runs that read it later copy nothing.
        let run = stage(&b, root, 0, direct(&a)).await;
        assert_eq!((run.bytes, run.fetched), (SIZE as u64, false));
        assert_eq!(through_nic(&a), (SIZE, 0));

        // A file the peer does not have.
        let missing = FileSource::Direct {
            peer_url: a.url(),
            file_path: "send/1/recv/data.bin".into(),
            token: sonic_api::token::issue(
                FILE_KEY.as_bytes(),
                JOB,
                "send/1/recv/data.bin",
                u64::MAX / 2,
            ),
        };
        let r = post(serde_json::json!({"job_id": JOB, "files": [missing]}))
            .await
            .expect("answer");
        assert_eq!(r.status(), 502);
        for x in [a, b] {
            x.stop().await;
        }
    }

    /// The runner's usage file: the runtime's peak and whether the run started the runtime
    /// (reported cold); the file is removed either way.
    #[test]
    fn handler_usage_reads_peak_and_runtime_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(".sonic-handler-usage.json");
        std::fs::write(&file, r#"{"peak_kib": 2048, "runtime_started": true}"#).expect("write");
        assert_eq!(
            handler_usage(dir.path()),
            HandlerUsage {
                peak: Some(2 << 20),
                runtime_started: true
            }
        );
        assert!(!file.exists(), "not an output");
        std::fs::write(&file, r#"{"peak_kib": 4}"#).expect("write");
        assert!(!handler_usage(dir.path()).runtime_started);
        std::fs::write(&file, "not json").expect("write");
        assert_eq!(handler_usage(dir.path()), HandlerUsage::default());
        assert_eq!(handler_usage(dir.path()), HandlerUsage::default());
    }
}
