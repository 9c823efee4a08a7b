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

/// One warm worker; dropping it kills the process (and then removes its CPU group) or removes
/// its container. [`Worker::shutdown`] does the same and waits until it is done.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The code version it imported.
    pub version: u64,
    /// Its cgroups (process sandbox), when it has bounds; after `child`, so that they are
    /// removed after the kill.
    groups: Option<Groups>,
    /// Its container (Docker sandbox): `child` is the `docker run -i` attached to it.
    container: Option<String>,
    /// Its scratch folder ([`Scratch::Folder`]), removed with it.
    scratch: Option<std::path::PathBuf>,
    /// What the lambda's entry is, as the runtime found it.
    pub entry: Entry,
}

/// A lambda's entry, as OpenLambda's runtime chooses it (`OL_WSGI_ENTRY`, `OL_ASGI_ENTRY`, `f`,
/// `app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `f(event)`: a JSON event in, a JSON result out.
    Func,
    /// A WSGI app (PEP 3333): the HTTP request in, its status, headers and body out.
    Wsgi,
    /// An ASGI app (HTTP scope): as WSGI.
    Asgi,
}

/// One HTTP request for an app lambda.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// The request's method.
    pub method: String,
    /// The lambda's name (the app's root is `/run/<app>`).
    pub app: String,
    /// The path after `/run/<app>`, from `/`.
    pub path: String,
    /// The query string, without `?`.
    pub query: String,
    /// The request's headers, in order.
    pub headers: Vec<(String, String)>,
    /// The request's body, as sent.
    pub body: Vec<u8>,
}

/// An app's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The status the app answered.
    pub status: u16,
    /// The headers it answered, in order.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(dir) = self.scratch.take() {
            std::thread::spawn(move || {
                let _ = std::fs::remove_dir_all(dir);
            });
        }
        if let Some(name) = self.container.take() {
            // Killing `docker run` does not stop its container: remove it (off the runtime).
            std::thread::spawn(move || {
                let _ = docker_rm(&name);
            });
        }
    }
}

/// `docker rm -f <name>` (blocking); a container already gone is fine.
fn docker_rm(name: &str) -> std::io::Result<()> {
    std::process::Command::new("docker")
        .args(["rm", "-f", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|_| ())
}

/// The label that marks the containers of `/run/` workers, its value the listener's
/// [`owner`]: a sweep at start removes those of listeners that are gone.
pub const OWNER_LABEL: &str = "sonic.openlambda.owner";

/// This process as the owner of worker containers: its pid namespace and pid
/// (`<pidns inode>-<pid>`), so that a sweep never takes a live listener's containers for a dead
/// one's, also when listeners in other pid namespaces share the engine.
pub fn owner() -> String {
    format!("{}-{}", pid_namespace(), std::process::id())
}

fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| {
            l.to_string_lossy()
                .chars()
                .filter(char::is_ascii_digit)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` of this pid namespace still exists (a zombie counts as gone).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Removes the cgroups of `/run/` workers whose listener process is gone
/// (`sonic-openlambda-<pid>-<n>` of a pid that no longer runs: a listener that exited without
/// stopping, or was killed), in each hierarchy workers' groups are made in. Returns the groups
/// removed.
pub fn sweep_groups() -> Vec<std::path::PathBuf> {
    let mut removed = Vec::new();
    for root in [V1_CPU, V1_MEMORY, V1_PIDS, V2].map(Path::new) {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("sonic-openlambda-")
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, n)| n.parse::<u64>().ok().and(pid.parse::<u32>().ok()))
            else {
                continue;
            };
            if pid_alive(pid) {
                continue;
            }
            // Its workers got EOF on their stdin when the listener went, and exited; a group
            // that still holds a process (a handler that never returns) stays and is reported.
            match std::fs::remove_dir(e.path()) {
                Ok(()) => removed.push(e.path()),
                Err(err) => {
                    tracing::warn!(group = %e.path().display(), error = %err, "cannot remove a stale worker cgroup")
                }
            }
        }
    }
    removed
}

/// Removes every worker container of the listener whose registry folder is `registry` (its
/// [`REGISTRY_LABEL`]), including those of dropped workers whose removal is still under way.
/// Returns how many it removed.
pub async fn remove_containers_of(registry: &Path) -> usize {
    let list = || async {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label={REGISTRY_LABEL}={}", registry.display()))
            .stdin(Stdio::null())
            .output()
            .await;
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<String>>()
        })
        .unwrap_or_default()
    };
    let mut removed = std::collections::BTreeSet::new();
    // A removal already under way (a dropped worker's) makes `docker rm` fail at once while the
    // container is still listed: wait until it is gone (at most about 30 s).
    for _ in 0..150 {
        let ids = list().await;
        if ids.is_empty() {
            break;
        }
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        removed.extend(ids);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    removed.len()
}

/// Removes the worker containers of listeners that are gone (label [`OWNER_LABEL`] of this pid
/// namespace, of a pid that no longer runs). Returns their names.
pub async fn sweep_containers() -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label={OWNER_LABEL}"),
            "--format",
            &format!("{{{{.Names}}}} {{{{.Label \"{OWNER_LABEL}\"}}}}"),
        ])
        .stdin(Stdio::null())
        .output()
        .await;
    let Ok(out) = out else {
        return Vec::new();
    };
    let ns = pid_namespace();
    let mut removed = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, owner)) = line.split_once(' ') else {
            continue;
        };
        let Some((their_ns, pid)) = owner.rsplit_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if their_ns != ns || pid_alive(pid) {
            continue;
        }
        let name = name.to_owned();
        if docker_rm_force(&name).await {
            removed.push(name);
        }
    }
    removed
}

/// A worker's bounds in the process sandbox: a cgroup of its own in each controller it needs
/// (cgroup v1: `cpu` with a CFS quota, `memory` with `memory.limit_in_bytes` and, where swap is
/// accounted, `memory.memsw.limit_in_bytes`, `pids` with `pids.max`; cgroup v2: one group with
/// `cpu.max`, `memory.max`, `memory.swap.max` and `pids.max`), removed when dropped. The
/// memory and process bounds cover the worker and every process it forks.
struct Groups {
    dirs: Vec<std::path::PathBuf>,
}

/// The CFS period of worker CPU groups (µs).
const CPU_PERIOD_US: u64 = 100_000;

/// The cgroup v1 hierarchies workers' groups are made in, and cgroup v2's root.
const V1_CPU: &str = "/sys/fs/cgroup/cpu";
const V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const V1_PIDS: &str = "/sys/fs/cgroup/pids";
const V2: &str = "/sys/fs/cgroup";

impl Groups {
    /// Makes the groups `limits` asks for and moves `pid` into them; `None` when it asks for
    /// no bound.
    fn create(limits: &Limits, pid: u32) -> std::io::Result<Option<Groups>> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let cpus = (limits.cpus.is_finite() && limits.cpus > 0.0).then_some(limits.cpus);
        let memory = (limits.resident > 0).then_some(limits.resident);
        let procs = (limits.procs > 0).then_some(limits.procs);
        if cpus.is_none() && memory.is_none() && procs.is_none() {
            return Ok(None);
        }
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sonic-openlambda-{}-{n}", std::process::id());
        let quota = cpus.map(|c| ((c * CPU_PERIOD_US as f64) as u64).max(1_000));
        // Per group folder, the files to write, in order (the last is `cgroup.procs`).
        let mut plan: Vec<(std::path::PathBuf, Vec<(&str, String)>)> = Vec::new();
        if Path::new(V1_CPU).join("cpu.cfs_quota_us").is_file()
            || Path::new(V1_MEMORY).join("memory.limit_in_bytes").is_file()
            || Path::new(V1_PIDS).join("pids.max").is_file()
        {
            // A controller with nothing to write is not wanted.
            for (root, files) in [
                (
                    V1_CPU,
                    quota.map_or_else(Vec::new, |q| {
                        vec![
                            ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
                            ("cpu.cfs_quota_us", q.to_string()),
                        ]
                    }),
                ),
                (
                    V1_MEMORY,
                    memory.map_or_else(Vec::new, |m| {
                        let mut f = vec![("memory.limit_in_bytes", m.to_string())];
                        if Path::new(V1_MEMORY)
                            .join("memory.memsw.limit_in_bytes")
                            .is_file()
                        {
                            f.push(("memory.memsw.limit_in_bytes", m.to_string()));
                        }
                        f.push(("memory.swappiness", "0".into()));
                        f
                    }),
                ),
                (
                    V1_PIDS,
                    procs.map_or_else(Vec::new, |p| vec![("pids.max", p.to_string())]),
                ),
            ] {
                if files.is_empty() {
                    continue;
                }
                if !Path::new(root).is_dir() {
                    return Err(std::io::Error::other(format!(
                        "no cgroup hierarchy at {root}"
                    )));
                }
                plan.push((Path::new(root).join(&name), files));
            }
        } else if Path::new(V2).join("cgroup.controllers").is_file() {
            let mut files = Vec::new();
            if let Some(q) = quota {
                files.push(("cpu.max", format!("{q} {CPU_PERIOD_US}")));
            }
            if let Some(m) = memory {
                files.push(("memory.max", m.to_string()));
                files.push(("memory.swap.max", "0".into()));
            }
            if let Some(p) = procs {
                files.push(("pids.max", p.to_string()));
            }
            plan.push((Path::new(V2).join(&name), files));
        } else {
            return Err(std::io::Error::other("no cgroup controllers"));
        }
        // From here on, a failure removes the groups made (drop).
        let mut groups = Groups { dirs: Vec::new() };
        for (dir, files) in plan {
            std::fs::create_dir(&dir)?;
            groups.dirs.push(dir.clone());
            for (file, value) in files {
                std::fs::write(dir.join(file), &value).map_err(|e| {
                    std::io::Error::other(format!("{}: {e}", dir.join(file).display()))
                })?;
            }
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(Some(groups))
    }

    /// How many times a process of the worker was killed for going over its memory bound
    /// (cgroup v1 `memory.oom_control`'s or v2 `memory.events`' `oom_kill`).
    fn oom_kills(&self) -> u64 {
        self.dirs
            .iter()
            .filter_map(|d| {
                std::fs::read_to_string(d.join("memory.oom_control"))
                    .or_else(|_| std::fs::read_to_string(d.join("memory.events")))
                    .ok()
            })
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Removes the groups once their worker is gone (waited for): at most a few tries.
    async fn remove(mut self) {
        for dir in std::mem::take(&mut self.dirs) {
            let mut removed = false;
            for _ in 0..500 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    removed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if !removed {
                tracing::warn!(group = %dir.display(), "cannot remove a worker's cgroup");
            }
        }
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        if dirs.is_empty() {
            return;
        }
        // The worker was killed just before: removal waits (briefly) for it to exit.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            for dir in dirs {
                while std::fs::remove_dir(&dir).is_err() && std::time::Instant::now() < deadline {
                    if !dir.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        });
    }
}

/// Puts a new worker under its bounds; where no group can be made, says so once and lets it
/// run unbounded.
fn bound(limits: &Limits, pid: Option<u32>) -> Option<Groups> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let pid = pid?;
    match Groups::create(limits, pid) {
        Ok(g) => g,
        Err(e) => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot bound the CPU, memory and processes of /run/ workers (cgroups need root): they run unbounded");
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
    /// The memory the worker and the processes it forks may hold (a memory cgroup of its own,
    /// without swap; Docker's `--memory` in a container), bytes; 0: no limit.
    pub resident: u64,
    /// How many processes and threads the worker may have at once, itself included (a `pids`
    /// cgroup; Docker's `--pids-limit`); 0: no limit.
    pub procs: u32,
}

/// Where a worker runs.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// A host process of `python` running `runtime`, in cgroups of its own.
    Host {
        /// The interpreter (the lambda's environment's, when it has one).
        python: &'a Path,
        /// `sonic_ol_runtime.py`.
        runtime: &'a Path,
        /// Where it writes its temporary files.
        scratch: Scratch<'a>,
    },
    /// A container of `image` (`docker run -i`, the call protocol on its attached standard
    /// input and output): the lambda's folder bound read-only at [`HANDLER_DIR`], the runtime
    /// at [`RUNTIME_DIR`].
    Docker {
        /// The Python image.
        image: &'a str,
        /// `sonic_ol_runtime.py` on the host.
        runtime: &'a Path,
        /// The listener's registry folder, its containers' [`REGISTRY_LABEL`].
        registry: &'a Path,
        /// The lambda's `requirements.txt` environment (built in the image), bound read-only
        /// at [`crate::docker_venv::VENV_DIR`], whose Python then runs the runtime.
        venv: Option<&'a Path>,
    },
}

/// Where a host worker writes its temporary files.
#[derive(Debug, Clone, Copy)]
pub enum Scratch<'a> {
    /// A `/tmp` of its own: the worker starts in a mount namespace of its own (private
    /// propagation) with a tmpfs of this many bytes on `/tmp` (mode 1777), gone with the worker;
    /// its pages count against the worker's memory bound. Needs root ([`private_tmp_works`]),
    /// and the interpreter, runtime and lambda folders outside `/tmp` (the tmpfs hides them).
    PrivateTmp {
        /// The tmpfs's size.
        bytes: u64,
    },
    /// A folder of its own as `TMPDIR` (a handler that names `/tmp` itself still writes to the
    /// host's). The caller makes it; it is removed with the worker.
    Folder(&'a Path),
}

/// Whether a host worker can have a `/tmp` of its own here: starts `true` as a worker would
/// start with [`Scratch::PrivateTmp`] (a new mount namespace and a tmpfs on `/tmp`).
pub fn private_tmp_works() -> bool {
    let mut cmd = std::process::Command::new("true");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match private_tmp_before_exec(&mut cmd, 1 << 20) {
        Ok(()) => cmd.status().is_ok_and(|s| s.success()),
        Err(_) => false,
    }
}

/// Makes `cmd` start in a mount namespace of its own whose `/tmp` is a new tmpfs of `bytes`.
#[allow(unsafe_code)] // pre_exec, with system calls only (below)
fn private_tmp_before_exec(
    cmd: &mut impl std::os::unix::process::CommandExt,
    bytes: u64,
) -> std::io::Result<()> {
    use std::ffi::CString;
    let none = CString::new("none").map_err(std::io::Error::other)?;
    let root = CString::new("/").map_err(std::io::Error::other)?;
    let tmpfs = CString::new("tmpfs").map_err(std::io::Error::other)?;
    let tmp = CString::new("/tmp").map_err(std::io::Error::other)?;
    let options = CString::new(format!("size={bytes},mode=1777")).map_err(std::io::Error::other)?;
    // SAFETY: the closure runs in the forked child before exec and only calls unshare(2) and
    // mount(2), which are system calls that allocate nothing and take no lock in this process,
    // on strings made before the fork and moved into the closure.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing mounted here reaches the host's namespace.
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                none.as_ptr(),
                root.as_ptr(),
                std::ptr::null(),
                private,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let flags = libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mount(
                tmpfs.as_ptr(),
                tmp.as_ptr(),
                tmpfs.as_ptr(),
                flags,
                options.as_ptr().cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// The label naming the registry folder of the listener a worker container belongs to.
pub const REGISTRY_LABEL: &str = "sonic.openlambda.registry";

/// Where a Docker worker sees the lambda's folder (as the Docker sandbox's handler stages).
pub const HANDLER_DIR: &str = "/sonic/handler";
/// Where a Docker worker sees `sonic_ol_runtime.py`.
pub const RUNTIME_DIR: &str = "/sonic/runtime";
/// The size of a worker's `/tmp`, a tmpfs of its own (a Docker worker's, or a host worker's
/// [`Scratch::PrivateTmp`]); its pages count against the memory bound.
pub const WORKER_TMP_BYTES: u64 = 256 << 20;

impl Worker {
    /// Starts a worker for the lambda in `dir` at `place`, and waits until it imported `f.py`.
    pub async fn start(
        place: Place<'_>,
        dir: &Path,
        env: &[(String, String)],
        version: u64,
        limits: &Limits,
    ) -> Result<Worker, CallError> {
        let (mut cmd, container) = match place {
            Place::Host {
                python,
                runtime,
                scratch,
            } => (
                host_command(python, runtime, dir, env, limits, scratch)
                    .map_err(|e| CallError::Worker(format!("cannot start a worker: {e}")))?,
                None,
            ),
            Place::Docker {
                image,
                runtime,
                registry,
                venv,
            } => {
                let (cmd, name) = docker_command(image, runtime, registry, venv, dir, env, limits)?;
                (cmd, Some(name))
            }
        };
        let what = match place {
            Place::Host { python, .. } => python.display().to_string(),
            Place::Docker { image, .. } => format!("a container of {image}"),
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| CallError::Worker(format!("cannot start {what}: {e}")))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(CallError::Worker("no pipes".into()));
        };
        // What the worker prints is dropped; in Docker, what `docker run` itself says before the
        // container runs (an error) is kept for the start's error.
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        tokio::spawn(drain(stderr, container.is_some().then(|| said.clone())));
        // Right after the start, while the runtime is still starting Python. A container has
        // Docker's CPU bound instead.
        let groups = match place {
            Place::Host { .. } => bound(limits, child.id()),
            Place::Docker { .. } => None,
        };
        let mut w = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            version,
            groups,
            container,
            scratch: match place {
                Place::Host {
                    scratch: Scratch::Folder(f),
                    ..
                } => Some(f.to_path_buf()),
                _ => None,
            },
            entry: Entry::Func,
        };
        let first = match tokio::time::timeout(limits.timeout, w.read_line(limits.max_output)).await
        {
            Err(_) => return Err(CallError::Timeout(limits.timeout)),
            Ok(Err(CallError::Worker(e))) if w.container.is_some() => {
                let said = said
                    .lock()
                    .map(|s| String::from_utf8_lossy(&s).trim().to_owned())
                    .unwrap_or_default();
                return Err(CallError::Worker(if said.is_empty() {
                    e
                } else {
                    format!("{e}: {said}")
                }));
            }
            Ok(r) => r?,
        };
        match first.get("ready") {
            Some(_) => {
                w.entry = match first.get("entry").and_then(|v| v.as_str()) {
                    Some("wsgi") => Entry::Wsgi,
                    Some("asgi") => Entry::Asgi,
                    _ => Entry::Func,
                };
                Ok(w)
            }
            None => Err(CallError::Import(
                first
                    .get("import_error")
                    .and_then(|v| v.as_str())
                    .unwrap_or("the worker did not start")
                    .to_string(),
            )),
        }
    }

    /// Stops the worker and waits until it is gone: its process killed and reaped and its CPU
    /// group removed, or its container removed.
    pub async fn shutdown(mut self) {
        let _ = self.child.kill().await;
        if let Some(name) = self.container.take() {
            docker_rm_force(&name).await;
        }
        if let Some(groups) = self.groups.take() {
            groups.remove().await;
        }
        if let Some(dir) = self.scratch.take() {
            let _ = tokio::fs::remove_dir_all(dir).await;
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
        let mut reply = self
            .exchange(&serde_json::json!({ "event": event }), limits)
            .await?;
        if let Some(ok) = reply.get_mut("ok") {
            return Ok(ok.take());
        }
        match reply.get("err").and_then(|v| v.as_str()) {
            Some(tb) => Err(CallError::Raised(tb.to_string())),
            None => Err(CallError::Worker("unexpected reply".into())),
        }
    }

    /// Calls an app with one HTTP request (its body and the answer's travel base64-encoded, so
    /// an answer is at most 3/4 of the output bound). After any error but `Raised`, the worker
    /// must be dropped.
    pub async fn call_http(
        &mut self,
        call: &HttpCall,
        limits: &Limits,
    ) -> Result<HttpReply, CallError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let request = serde_json::json!({ "http": {
            "method": call.method,
            "app": call.app,
            "path": call.path,
            "query": call.query,
            "headers": call.headers,
            "body": b64.encode(&call.body),
        }});
        let reply = self.exchange(&request, limits).await?;
        if let Some(tb) = reply.get("err").and_then(|v| v.as_str()) {
            return Err(CallError::Raised(tb.to_string()));
        }
        let bad = |what: &str| CallError::Worker(format!("unexpected reply: {what}"));
        let http = reply.get("http").ok_or_else(|| bad("no answer"))?;
        let status = http
            .get("status")
            .and_then(serde_json::Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| (100..=999).contains(s))
            .ok_or_else(|| bad("no status"))?;
        let headers = serde_json::from_value::<Vec<(String, String)>>(
            http.get("headers").cloned().unwrap_or_default(),
        )
        .map_err(|_| bad("headers"))?;
        let body = b64
            .decode(http.get("body").and_then(|v| v.as_str()).unwrap_or(""))
            .map_err(|_| bad("body"))?;
        Ok(HttpReply {
            status,
            headers,
            body,
        })
    }

    /// Sends one request line and reads the reply's, within the call's time.
    async fn exchange(
        &mut self,
        request: &serde_json::Value,
        limits: &Limits,
    ) -> Result<serde_json::Value, CallError> {
        let mut line = serde_json::to_vec(request).map_err(|e| CallError::Worker(e.to_string()))?;
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
        match tokio::time::timeout(limits.timeout, exchange).await {
            Err(_) => Err(CallError::Timeout(limits.timeout)),
            // A worker killed for its memory says so (its memory group counted the kill).
            Ok(Err(CallError::Worker(msg)))
                if self.groups.as_ref().is_some_and(|g| g.oom_kills() > 0) =>
            {
                Err(CallError::Worker(format!(
                    "{msg}: killed for going over its memory bound of {} MiB",
                    limits.resident >> 20
                )))
            }
            Ok(r) => r,
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
                // Its output closed: it is exiting; its status, when it comes soon.
                let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok);
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

/// The command of a host worker: `python runtime dir`, with a cleared environment and its
/// scratch space as `TMPDIR`.
fn host_command(
    python: &Path,
    runtime: &Path,
    dir: &Path,
    env: &[(String, String)],
    limits: &Limits,
    scratch: Scratch<'_>,
) -> std::io::Result<Command> {
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
    for key in ["PATH", "HOME", "LANG", "LC_ALL"] {
        if let Ok(v) = std::env::var(key) {
            cmd.env(key, v);
        }
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    match scratch {
        Scratch::PrivateTmp { bytes } => {
            private_tmp_before_exec(cmd.as_std_mut(), bytes)?;
            cmd.env("TMPDIR", "/tmp");
        }
        Scratch::Folder(folder) => {
            cmd.env("TMPDIR", folder);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // Read (and removed from the handler's environment) by the runtime, which sets it as
    // its RLIMIT_AS before it imports f.py.
    if limits.memory > 0 {
        cmd.env("SONIC_WORKER_MEMORY", limits.memory.to_string());
    }
    Ok(cmd)
}

/// The command of a Docker worker: `docker run -i` of a new container named
/// `sonic-ol-<pid>-<n>`, labelled with its [`owner`], running the runtime on the lambda's
/// folder, as the Docker sandbox runs a handler stage: no network, a read-only root, no
/// capabilities, `/tmp` a tmpfs, `HOME=/tmp`, `LANG=C.UTF-8`, the lambda's `ol.yaml`
/// environment, memory (= memory and swap) and CPUs bounded by Docker, the image never pulled.
#[allow(clippy::too_many_arguments)] // the container's parts, each named
fn docker_command(
    image: &str,
    runtime: &Path,
    registry: &Path,
    venv: Option<&Path>,
    dir: &Path,
    env: &[(String, String)],
    limits: &Limits,
) -> Result<(Command, String), CallError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for p in [runtime, dir].into_iter().chain(venv) {
        let text = p.to_string_lossy();
        if !p.is_absolute() || text.contains([':', ',', '\0']) {
            return Err(CallError::Worker(format!(
                "cannot bind {text} into a container (it must be absolute, without `:` or `,`)"
            )));
        }
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("sonic-ol-{}-{n}", std::process::id());
    let mut cmd = Command::new("docker");
    cmd.args([
        "run", "-i", "--rm", "--init", "--pull", "never", "--name", &name,
    ])
    .args(["--label", &format!("{OWNER_LABEL}={}", owner())])
    .args([
        "--label",
        &format!("{REGISTRY_LABEL}={}", registry.display()),
    ])
    .args(["--network", "none", "--read-only", "--log-driver", "none"])
    .args(["--cap-drop", "ALL", "--security-opt", "no-new-privileges"])
    .args(["--tmpfs", &format!("/tmp:rw,size={WORKER_TMP_BYTES}")])
    .args(["-v", &format!("{}:{HANDLER_DIR}:ro", dir.display())])
    .args([
        "-v",
        &format!("{}:{RUNTIME_DIR}/sonic_ol_runtime.py:ro", runtime.display()),
    ])
    .args(["-w", HANDLER_DIR]);
    let venv_dir = crate::docker_venv::VENV_DIR;
    if let Some(v) = venv {
        cmd.args(["-v", &format!("{}:{venv_dir}:ro", v.display())]);
    }
    // The container's memory (without swap) is the lower of the resident and address-space
    // bounds that are set; the runtime sets the latter as its RLIMIT_AS either way.
    let container_memory = match (limits.resident, limits.memory) {
        (0, m) | (m, 0) => m,
        (r, m) => r.min(m),
    };
    if container_memory > 0 {
        let m = container_memory.to_string();
        cmd.args(["--memory", &m, "--memory-swap", &m]);
    }
    if limits.memory > 0 {
        cmd.args(["-e", &format!("SONIC_WORKER_MEMORY={}", limits.memory)]);
    }
    if limits.procs > 0 {
        cmd.args(["--pids-limit", &limits.procs.to_string()]);
    }
    if limits.cpus.is_finite() && limits.cpus > 0.0 {
        cmd.args(["--cpus", &format!("{:.3}", limits.cpus)]);
    }
    for (k, v) in [
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
    ] {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    for (k, v) in env {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    let python = match venv {
        Some(_) => format!("{venv_dir}/bin/python"),
        None => "python3".to_owned(),
    };
    cmd.arg(image)
        .args([
            python.as_str(),
            &format!("{RUNTIME_DIR}/sonic_ol_runtime.py"),
            HANDLER_DIR,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok((cmd, name))
}

/// Reads and drops what the handler prints, so that a chatty handler never blocks on a full
/// pipe and never grows the daemon's memory.
/// When `keep` is given, the first 4 KiB are kept there (what `docker run` says when it fails).
async fn drain(
    mut stderr: tokio::process::ChildStderr,
    keep: Option<std::sync::Arc<std::sync::Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if let Some(keep) = &keep
            && let Ok(mut kept) = keep.lock()
        {
            let room = 4096usize.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }
}

/// `docker rm -f NAME`, quietly; whether it succeeded.
async fn docker_rm_force(name: &str) -> bool {
    Command::new("docker")
        .args(["rm", "-f", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}
