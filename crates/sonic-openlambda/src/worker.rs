//! A warm Python process serving one lambda: imports `f.py` once, then one call at a time.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The handler raised: its traceback.
    #[error("{0}")]
    Raised(String),
    /// Importing `f.py` (or finding `f` in it) failed: its traceback.
    #[error("{0}")]
    Import(String),
    /// The handler did not return in time.
    #[error("the handler did not return within {0:?}; its worker was stopped")]
    Timeout(Duration),
    /// The result was larger than allowed.
    #[error("the handler's result is larger than {0} bytes")]
    TooLarge(usize),
    /// The worker process could not start or died.
    #[error("the Python worker failed: {0}")]
    Worker(String),
}

/// One warm worker; dropping it kills the process (and then removes its CPU group).
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The code version it imported.
    pub version: u64,
    /// Its CPU bound, when it has one; after `child`, so that it is removed after the kill.
    _cpu: Option<CpuGroup>,
}

/// A worker's CPU bound: a cgroup of its own with a CFS quota (cgroup v1 `cpu` controller at
/// `/sys/fs/cgroup/cpu`, else cgroup v2 `cpu.max`), removed when dropped.
struct CpuGroup {
    dir: std::path::PathBuf,
}

/// The CFS period of worker CPU groups (µs).
const CPU_PERIOD_US: u64 = 100_000;

impl CpuGroup {
    /// Makes a group allowing `cpus` CPUs and moves `pid` into it.
    fn create(cpus: f64, pid: u32) -> std::io::Result<CpuGroup> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sonic-openlambda-{}-{n}", std::process::id());
        let quota = ((cpus * CPU_PERIOD_US as f64) as u64).max(1_000);
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limits) = if v1.join("cpu.cfs_quota_us").is_file() {
            (
                v1.join(name),
                vec![
                    ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            )
        } else if v2.join("cgroup.controllers").is_file() {
            (
                v2.join(name),
                vec![("cpu.max", format!("{quota} {CPU_PERIOD_US}"))],
            )
        } else {
            return Err(std::io::Error::other("no cgroup cpu controller"));
        };
        std::fs::create_dir(&dir)?;
        // From here on, a failure removes the group (drop).
        let group = CpuGroup { dir };
        for (file, value) in limits {
            std::fs::write(group.dir.join(file), value)?;
        }
        std::fs::write(group.dir.join("cgroup.procs"), pid.to_string())?;
        Ok(group)
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.dir);
        // The worker was killed just before: removal waits (briefly) for it to exit.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&dir).is_err() && std::time::Instant::now() < deadline {
                if !dir.exists() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }
}

/// Puts a new worker under its CPU bound; where no group can be made, says so once and lets it
/// run unbounded.
fn bound_cpu(cpus: f64, pid: Option<u32>) -> Option<CpuGroup> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !(cpus.is_finite() && cpus > 0.0) {
        return None;
    }
    let pid = pid?;
    match CpuGroup::create(cpus, pid) {
        Ok(g) => Some(g),
        Err(e) => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot bound the CPU of /run/ workers (cgroups need root): they run unbounded");
            }
            None
        }
    }
}

/// How workers start and how much a call may take.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Per call, including the import on a cold start.
    pub timeout: Duration,
    /// The largest result line read back.
    pub max_output: usize,
    /// The worker's address space (`RLIMIT_AS`), bytes; 0: no limit.
    pub memory: u64,
    /// The CPUs the worker may use (its own cgroup's CFS quota); 0: no limit.
    pub cpus: f64,
}

impl Worker {
    /// Starts `python` on `runtime` for the lambda in `dir`, and waits until it imported `f.py`.
    pub async fn start(
        python: &Path,
        runtime: &Path,
        dir: &Path,
        env: &[(String, String)],
        version: u64,
        limits: &Limits,
    ) -> Result<Worker, CallError> {
        let mut cmd = Command::new(python);
        cmd.arg(runtime)
            .arg(dir)
            .current_dir(dir)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The daemon's own environment (tokens, keys) is not the handler's business.
        for key in ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"] {
            if let Ok(v) = std::env::var(key) {
                cmd.env(key, v);
            }
        }
        cmd.env("PYTHONDONTWRITEBYTECODE", "1");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // Read (and removed from the handler's environment) by the runtime, which sets it as
        // its RLIMIT_AS before it imports f.py.
        if limits.memory > 0 {
            cmd.env("SONIC_WORKER_MEMORY", limits.memory.to_string());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CallError::Worker(format!("cannot start {}: {e}", python.display())))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(CallError::Worker("no pipes".into()));
        };
        tokio::spawn(drain(stderr));
        // Right after the start, while the runtime is still starting Python.
        let cpu = bound_cpu(limits.cpus, child.id());
        let mut w = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            version,
            _cpu: cpu,
        };
        let first = tokio::time::timeout(limits.timeout, w.read_line(limits.max_output))
            .await
            .map_err(|_| CallError::Timeout(limits.timeout))??;
        match first.get("ready") {
            Some(_) => Ok(w),
            None => Err(CallError::Import(
                first
                    .get("import_error")
                    .and_then(|v| v.as_str())
                    .unwrap_or("the worker did not start")
                    .to_string(),
            )),
        }
    }

    /// Whether the process still runs (an idle worker may have been killed, e.g. by the OOM
    /// killer).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Calls `f(event)`. After any error but `Raised`, the worker must be dropped.
    pub async fn call(
        &mut self,
        event: &serde_json::Value,
        limits: &Limits,
    ) -> Result<serde_json::Value, CallError> {
        let mut line = serde_json::to_vec(&serde_json::json!({ "event": event }))
            .map_err(|e| CallError::Worker(e.to_string()))?;
        line.push(b'\n');
        let exchange = async {
            self.stdin
                .write_all(&line)
                .await
                .map_err(|e| CallError::Worker(format!("cannot send the call: {e}")))?;
            self.stdin
                .flush()
                .await
                .map_err(|e| CallError::Worker(format!("cannot send the call: {e}")))?;
            self.read_line(limits.max_output).await
        };
        let mut reply = tokio::time::timeout(limits.timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout(limits.timeout))??;
        if let Some(ok) = reply.get_mut("ok") {
            return Ok(ok.take());
        }
        match reply.get("err").and_then(|v| v.as_str()) {
            Some(tb) => Err(CallError::Raised(tb.to_string())),
            None => Err(CallError::Worker("unexpected reply".into())),
        }
    }

    async fn read_line(&mut self, max: usize) -> Result<serde_json::Value, CallError> {
        let mut buf = Vec::new();
        loop {
            let chunk = self
                .stdout
                .fill_buf()
                .await
                .map_err(|e| CallError::Worker(e.to_string()))?;
            if chunk.is_empty() {
                let status = self.child.try_wait().ok().flatten();
                return Err(CallError::Worker(match status {
                    Some(s) => format!("the worker exited ({s})"),
                    None => "the worker closed its output".into(),
                }));
            }
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if buf.len() + take > max + 1 {
                return Err(CallError::TooLarge(max));
            }
            buf.extend_from_slice(&chunk[..take]);
            self.stdout.consume(take);
            if done {
                return serde_json::from_slice(&buf)
                    .map_err(|e| CallError::Worker(format!("bad reply: {e}")));
            }
        }
    }
}

/// Reads and drops what the handler prints, so that a chatty handler never blocks on a full
/// pipe and never grows the daemon's memory.
async fn drain(mut stderr: tokio::process::ChildStderr) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}
