//! A local executor: runs a whole DAG on this machine, each instance as a process with the file
//! ABI (interfaces.md §2), and measures every instance (wall time, CPU time, peak RSS).
//!
//! It is what the tests and benchmarks use before (and besides) the control plane: no agents, no
//! object store. Data moves as the `vm-storage` method would move it: hard links between folders
//! of one disk (a copy when linking fails). Layout under the work directory:
//! `<function>/<i>/in/` (the instance's `SONIC_INPUT_DIR`), `<function>/<i>/out/`
//! (`SONIC_OUTPUT_DIR`) and `<function>/<i>/log` (standard output and error).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sonic_lambda::process;

use serde::Serialize;
use sonic_core::dag::{Dag, EdgeKind, Fanout};
use sonic_lambda::{JOB_INPUT, RESULT, env};
use tracing::{debug, info};

/// The measuring wrapper every instance starts through (`src/bin/sonic-time.rs`).
pub const TIMER: &str = "sonic-time";

/// What to run and where.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Created if missing; every instance's folders go under it.
    pub workdir: PathBuf,
    pub job_id: String,
    /// Job parameters over the DAG's defaults.
    pub params: BTreeMap<String, serde_json::Value>,
    /// The job's input files, given to the first functions as `input/<file name>`.
    pub inputs: Vec<PathBuf>,
    /// Executables by the name a command uses (`mapreduce-sort` -> its path), and `sonic-time`.
    pub programs: BTreeMap<String, PathBuf>,
    /// Where to look for a command not in `programs`, before `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// Instances of one stage run at the same time, at most this many.
    pub parallelism: usize,
}

impl RunConfig {
    pub fn new(workdir: impl Into<PathBuf>) -> Self {
        Self {
            workdir: workdir.into(),
            job_id: "local".into(),
            params: BTreeMap::new(),
            inputs: Vec::new(),
            programs: BTreeMap::new(),
            bin_dir: None,
            parallelism: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// What went wrong running a DAG.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parameters: {0}")]
    Params(String),
    #[error("function {function}: program {program:?} not found")]
    Program { function: String, program: String },
    #[error("{function}/{instance} failed ({status}); log tail:\n{log_tail}")]
    Failed {
        function: String,
        instance: u32,
        status: String,
        log_tail: String,
    },
    #[error("routing {from} -> {to}: {reason}")]
    Routing {
        from: String,
        to: String,
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LocalError + '_ {
    move |source| LocalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One instance's run.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceRun {
    pub function: String,
    pub instance: u32,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak resident set size (wait4), KiB.
    pub peak_rss_kib: u64,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub log: PathBuf,
}

impl InstanceRun {
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// Bytes that crossed one edge.
#[derive(Debug, Clone, Serialize)]
pub struct EdgeRun {
    pub from: String,
    pub to: String,
    pub kind: String,
    pub files: usize,
    /// Bytes the receivers got (a broadcast file counts once per receiver).
    pub bytes: u64,
}

/// A final output (`result/...`) of an instance.
#[derive(Debug, Clone, Serialize)]
pub struct ResultFile {
    pub function: String,
    pub instance: u32,
    /// Path under `result/`.
    pub name: String,
    pub path: PathBuf,
}

/// A function's instances taken together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StageSummary {
    pub instances: usize,
    /// The slowest instance.
    pub wall_s: f64,
    /// All instances' CPU time.
    pub cpu_s: f64,
    /// The largest instance.
    pub peak_rss_kib: u64,
}

/// A finished job.
#[derive(Debug, Clone, Serialize)]
pub struct JobRun {
    pub job_id: String,
    pub wall_s: f64,
    /// Each function's instance count, in DAG order.
    pub fanouts: Vec<(String, u32)>,
    pub instances: Vec<InstanceRun>,
    pub edges: Vec<EdgeRun>,
    pub results: Vec<ResultFile>,
}

impl JobRun {
    pub fn stage(&self, function: &str) -> StageSummary {
        let runs: Vec<&InstanceRun> = self
            .instances
            .iter()
            .filter(|r| r.function == function)
            .collect();
        StageSummary {
            instances: runs.len(),
            wall_s: runs.iter().map(|r| r.wall_s).fold(0.0, f64::max),
            cpu_s: runs.iter().map(|r| r.cpu_s()).sum(),
            peak_rss_kib: runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0),
        }
    }

    /// The result file named `name` (under `result/`), from whichever instance wrote it.
    pub fn result(&self, name: &str) -> Option<&ResultFile> {
        self.results.iter().find(|r| r.name == name)
    }

    pub fn fanout(&self, function: &str) -> Option<u32> {
        self.fanouts
            .iter()
            .find(|(f, _)| f == function)
            .map(|(_, n)| *n)
    }
}

/// Runs every function of `dag` in order, each stage's instances in parallel, and routes outputs
/// to receivers by edge kind. Fails at the first failed instance, with its log's tail. Every
/// instance starts through [`TIMER`], which must be found like the commands.
pub fn run_dag(dag: &Dag, config: &RunConfig) -> Result<JobRun, LocalError> {
    let started = Instant::now();
    let params = dag.job_params(&config.params);
    let declared = dag.fanouts(&params).map_err(LocalError::Params)?;
    let params_json =
        serde_json::to_string(&params).map_err(|e| LocalError::Params(e.to_string()))?;
    let root = &config.workdir;
    fs::create_dir_all(root).map_err(io_err(root))?;
    let timer = resolve(TIMER, config).ok_or_else(|| LocalError::Program {
        function: "(every function)".into(),
        program: TIMER.into(),
    })?;

    let n = dag.functions.len();
    // Fanouts known so far: declared ones now, scattered ones when their sender ends.
    let mut fanouts: Vec<Option<u32>> = declared
        .iter()
        .map(|f| match f {
            Fanout::Known(k) => Some(*k),
            Fanout::Scattered => None,
        })
        .collect();
    let mut instances = Vec::new();
    let mut edges = Vec::new();
    let mut results = Vec::new();
    for i in 0..n {
        let f = &dag.functions[i];
        let count = fanouts[i].ok_or_else(|| LocalError::Routing {
            from: "?".into(),
            to: f.name.clone(),
            reason: "its scattered fanout was never set".into(),
        })?;
        if let Some(h) = &f.handler {
            // Handlers live in a control plane's OpenLambda registry, not on this machine.
            return Err(LocalError::Program {
                function: f.name.clone(),
                program: format!("handler {h} (handlers run only through a control plane)"),
            });
        }
        let program = resolve(&f.command[0], config).ok_or_else(|| LocalError::Program {
            function: f.name.clone(),
            program: f.command[0].clone(),
        })?;
        if dag.incoming(i).next().is_none() {
            for k in 0..count {
                let dir = instance_dir(root, &f.name, k).join("in").join(JOB_INPUT);
                fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                for input in &config.inputs {
                    let name = input.file_name().ok_or_else(|| LocalError::Io {
                        path: input.clone(),
                        source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
                    })?;
                    link_or_copy(input, &dir.join(name))?;
                }
            }
        }
        let mut shuffle_fanouts = Vec::new();
        for e in dag.outgoing(i) {
            if e.kind == EdgeKind::Shuffle {
                let to = &dag.functions[e.to].name;
                let m = fanouts[e.to].ok_or_else(|| {
                    LocalError::Params(format!("shuffle receiver {to} has no declared fanout"))
                })?;
                shuffle_fanouts.push((sonic_lambda::fanout_var(to), m.to_string()));
            }
        }
        let spec = StageSpec {
            root,
            job_id: &config.job_id,
            function: &f.name,
            program: &program,
            timer: &timer,
            args: &f.command[1..],
            count,
            params_json: &params_json,
            extra_env: &shuffle_fanouts,
            timeout: Duration::from_secs_f64(f.timeout_s),
        };
        let runs = run_stage(&spec, config.parallelism.max(1))?;
        info!(function = %f.name, instances = count, "stage done");
        instances.extend(runs);

        // Outputs: the folders must name a downstream function or `result`.
        let downstream: Vec<&str> = dag
            .outgoing(i)
            .map(|e| dag.functions[e.to].name.as_str())
            .collect();
        for k in 0..count {
            let out = instance_dir(root, &f.name, k).join("out");
            for entry in list_dir(&out)? {
                if entry != RESULT && !downstream.contains(&entry.as_str()) {
                    return Err(LocalError::Routing {
                        from: f.name.clone(),
                        to: entry,
                        reason: "output for a function that is not downstream".into(),
                    });
                }
            }
            for (name, path) in walk(&out.join(RESULT))? {
                results.push(ResultFile {
                    function: f.name.clone(),
                    instance: k,
                    name,
                    path,
                });
            }
        }
        for e in dag.outgoing(i) {
            let to = &dag.functions[e.to].name;
            let (edge, scattered) = route(root, &f.name, count, to, e.kind, fanouts[e.to])?;
            if let Some(s) = scattered {
                fanouts[e.to] = Some(s);
            }
            debug!(from = %f.name, to = %to, files = edge.files, bytes = edge.bytes, "routed");
            edges.push(edge);
        }
    }
    Ok(JobRun {
        job_id: config.job_id.clone(),
        wall_s: started.elapsed().as_secs_f64(),
        fanouts: dag
            .functions
            .iter()
            .zip(&fanouts)
            .map(|(f, k)| (f.name.clone(), k.unwrap_or(0)))
            .collect(),
        instances,
        edges,
        results,
    })
}

fn instance_dir(root: &Path, function: &str, instance: u32) -> PathBuf {
    root.join(function).join(instance.to_string())
}

fn resolve(program: &str, config: &RunConfig) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    if let Some(p) = config.programs.get(program) {
        return Some(p.clone());
    }
    let mut dirs: Vec<PathBuf> = config.bin_dir.iter().cloned().collect();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Names in a folder (empty if it does not exist).
fn list_dir(dir: &Path) -> Result<Vec<String>, LocalError> {
    let iter = match fs::read_dir(dir) {
        Ok(it) => it,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in iter {
        let entry = entry.map_err(io_err(dir))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Files under `dir` as (relative path, absolute path), sorted by relative path; names starting
/// with `.` (unfinished atomic writes) are skipped.
fn walk(dir: &Path) -> Result<Vec<(String, PathBuf)>, LocalError> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, d)) = stack.pop() {
        for name in list_dir(&d)? {
            if name.starts_with('.') {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let abs = d.join(&name);
            if abs.is_dir() {
                stack.push((rel, abs));
            } else {
                out.push((rel, abs));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn dir_bytes(dir: &Path) -> Result<u64, LocalError> {
    let mut total = 0;
    for (_, p) in walk(dir)? {
        total += fs::metadata(&p).map_err(io_err(&p))?.len();
    }
    Ok(total)
}

/// Hard link (the same disk, like `vm-storage`), else a copy.
fn link_or_copy(src: &Path, dst: &Path) -> Result<u64, LocalError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let len = fs::metadata(src).map_err(io_err(src))?.len();
    if fs::hard_link(src, dst).is_err() {
        fs::copy(src, dst).map_err(io_err(dst))?;
    }
    Ok(len)
}

/// Moves the outputs of `from`'s `senders` instances for `to` into the receivers' input folders.
/// Returns the edge's traffic and, for a scatter or a one edge, the receiver count it sets (one
/// per part; as many as the senders, which a scattered sender learned only at run time).
fn route(
    root: &Path,
    from: &str,
    senders: u32,
    to: &str,
    kind: EdgeKind,
    receivers: Option<u32>,
) -> Result<(EdgeRun, Option<u32>), LocalError> {
    let err = |reason: String| LocalError::Routing {
        from: from.into(),
        to: to.into(),
        reason,
    };
    let dest = |r: u32, s: u32, rel: &str| {
        instance_dir(root, to, r)
            .join("in")
            .join(from)
            .join(s.to_string())
            .join(rel)
    };
    let known =
        |what: &str| receivers.ok_or_else(|| err(format!("{what} receivers need a known fanout")));
    let mut edge = EdgeRun {
        from: from.into(),
        to: to.into(),
        kind: kind.to_string(),
        files: 0,
        bytes: 0,
    };
    let mut scattered = None;
    let add = |edge: &mut EdgeRun, src: &Path, dst: PathBuf| -> Result<(), LocalError> {
        edge.bytes += link_or_copy(src, &dst)?;
        edge.files += 1;
        Ok(())
    };
    match kind {
        EdgeKind::Scatter => {
            let files = walk(&instance_dir(root, from, 0).join("out").join(to))?;
            if files.is_empty() {
                return Err(err(
                    "a scatter sender wrote no file: no receiver to run".into()
                ));
            }
            for (k, (rel, src)) in files.iter().enumerate() {
                add(&mut edge, src, dest(k as u32, 0, rel))?;
            }
            scattered = Some(files.len() as u32);
        }
        EdgeKind::One if receivers.is_some_and(|r| r != senders) => {
            return Err(err(format!(
                "a one edge pairs instances, but {from} has {senders} and {to} {}",
                receivers.unwrap_or_default()
            )));
        }
        EdgeKind::One | EdgeKind::Broadcast | EdgeKind::Gather | EdgeKind::Shuffle => {
            let m = match kind {
                EdgeKind::Gather => 1,
                EdgeKind::One => senders,
                _ => known(&kind.to_string())?,
            };
            for s in 0..senders {
                for (rel, src) in walk(&instance_dir(root, from, s).join("out").join(to))? {
                    match kind {
                        EdgeKind::One => add(&mut edge, &src, dest(s, s, &rel))?,
                        EdgeKind::Gather => add(&mut edge, &src, dest(0, s, &rel))?,
                        EdgeKind::Broadcast => {
                            for r in 0..m {
                                add(&mut edge, &src, dest(r, s, &rel))?;
                            }
                        }
                        _ => {
                            let j: u32 = rel
                                .strip_prefix("part-")
                                .and_then(|j| j.parse().ok())
                                .filter(|&j| j < m)
                                .ok_or_else(|| {
                                    err(format!(
                                        "{from}/{s} wrote {rel:?}: a shuffle sender writes part-<j>, j < {m}"
                                    ))
                                })?;
                            add(&mut edge, &src, dest(j, s, &rel))?;
                        }
                    }
                }
            }
        }
    }
    if kind == EdgeKind::One {
        scattered = Some(senders);
    }
    Ok((edge, scattered))
}

struct StageSpec<'a> {
    root: &'a Path,
    job_id: &'a str,
    function: &'a str,
    program: &'a Path,
    /// The `sonic-time` wrapper.
    timer: &'a Path,
    args: &'a [String],
    count: u32,
    params_json: &'a str,
    extra_env: &'a [(String, String)],
    timeout: Duration,
}

fn run_stage(spec: &StageSpec<'_>, parallelism: usize) -> Result<Vec<InstanceRun>, LocalError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(u32, Result<InstanceRun, LocalError>)>> = Mutex::new(Vec::new());
    let workers = parallelism.min(spec.count as usize).max(1);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= spec.count as usize {
                        break;
                    }
                    let r = run_instance(spec, k as u32);
                    if let Ok(mut v) = results.lock() {
                        v.push((k as u32, r));
                    }
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(k, _)| *k);
    if results.len() != spec.count as usize {
        return Err(LocalError::Failed {
            function: spec.function.into(),
            instance: 0,
            status: "a worker thread died".into(),
            log_tail: String::new(),
        });
    }
    results.into_iter().map(|(_, r)| r).collect()
}

/// Environment variables a lambda may inherit; everything else is the ABI's.
const PASS_ENV: &[&str] = &[
    "PATH",
    "TMPDIR",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "LANG",
    "HOME",
];

fn run_instance(spec: &StageSpec<'_>, k: u32) -> Result<InstanceRun, LocalError> {
    let dir = instance_dir(spec.root, spec.function, k);
    let (input, output, log) = (dir.join("in"), dir.join("out"), dir.join("log"));
    let report = dir.join("usage.json");
    for d in [&input, &output] {
        fs::create_dir_all(d).map_err(io_err(d))?;
    }
    let log_file = fs::File::create(&log).map_err(io_err(&log))?;
    let log_err = log_file.try_clone().map_err(io_err(&log))?;
    // Through `sonic-time`: see [`Usage`] for why the lambda is not started from here directly.
    let mut cmd = Command::new(spec.timer);
    cmd.arg("--report")
        .arg(&report)
        .arg("--")
        .arg(spec.program)
        .args(spec.args)
        .env_clear()
        .envs(
            PASS_ENV
                .iter()
                .filter_map(|k| Some((*k, std::env::var_os(k)?))),
        )
        .env(env::JOB_ID, spec.job_id)
        .env(env::FUNCTION, spec.function)
        .env(env::INSTANCE, k.to_string())
        .env(env::INSTANCES, spec.count.to_string())
        .env(env::INPUT_DIR, &input)
        .env(env::OUTPUT_DIR, &output)
        .env(env::PARAMS, spec.params_json)
        .envs(spec.extra_env.iter().map(|(k, v)| (k, v)))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        // Its own group, so a timeout kills the lambda and whatever it started too.
        .process_group(0);
    let input_bytes = dir_bytes(&input)?;
    let wrapper = run_measured(&mut cmd, Some(spec.timeout)).map_err(io_err(spec.timer))?;
    let failed = |status: String| LocalError::Failed {
        function: spec.function.into(),
        instance: k,
        status,
        log_tail: tail(&log, 2048),
    };
    if wrapper.timed_out {
        return Err(failed(format!("timed out after {:?}", spec.timeout)));
    }
    let usage: Usage = match fs::read(&report) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| failed(format!("bad report {}: {e}", report.display())))?,
        Err(e) => {
            return Err(failed(format!(
                "no report from sonic-time ({e}; wrapper {})",
                wrapper.describe()
            )));
        }
    };
    if !usage.success() {
        return Err(failed(usage.describe()));
    }
    Ok(InstanceRun {
        function: spec.function.into(),
        instance: k,
        wall_s: usage.wall_s,
        user_s: usage.user_s,
        sys_s: usage.sys_s,
        peak_rss_kib: usage.max_rss_kib,
        input_bytes,
        output_bytes: dir_bytes(&output)?,
        log,
    })
}

fn tail(path: &Path, bytes: u64) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// How a measured process ended and what it used.
///
/// Linux charges a child's `ru_maxrss` with the resident size of the process it was forked from
/// (exec records the old address space's high-water mark, and a fork's or vfork's is the
/// parent's). Measured from a large parent (a test harness, an agent), a 3 MiB lambda would show
/// the parent's size. So lambdas start through `sonic-time`, a small process, whose own size is
/// the floor of every measure (about 2 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Usage {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak resident set size (wait4), KiB.
    pub max_rss_kib: u64,
}

impl Usage {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    pub fn describe(&self) -> String {
        match (self.timed_out, self.exit_code, self.signal) {
            (true, _, _) => "timed out".into(),
            (_, Some(c), _) => format!("exit status {c}"),
            (_, _, Some(s)) => format!("killed by signal {s}"),
            _ => "unknown status".into(),
        }
    }

    /// The exit status a shell would show for this end (128 + signal for a signal).
    pub fn shell_status(&self) -> u8 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => (c & 0xff) as u8,
            (_, Some(s)) => (128 + s).clamp(0, 255) as u8,
            _ => 1,
        }
    }
}

/// Spawns `cmd`, waits for it (killing its process group after `timeout`, when the command was
/// put in its own group), and reaps it with wait4 for its resource usage.
pub fn run_measured(cmd: &mut Command, timeout: Option<Duration>) -> io::Result<Usage> {
    let started = Instant::now();
    let child = cmd.spawn()?;
    let mut usage = wait_measured(child.id(), timeout)?;
    usage.wall_s = started.elapsed().as_secs_f64();
    Ok(usage)
}

fn wait_measured(pid: u32, timeout: Option<Duration>) -> io::Result<Usage> {
    let (tx, rx) = mpsc::channel::<()>();
    let watchdog = timeout.map(|timeout| {
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                // The child is not reaped before this thread is joined (`wait_exited` leaves
                // it a zombie), so its group's id cannot belong to anyone else.
                process::kill_group(pid);
                return true;
            }
            false
        })
    });
    let waited = process::wait_exited(pid);
    drop(tx);
    let timed_out = watchdog.is_some_and(|w| w.join().unwrap_or(false));
    waited?;
    let r = process::reap(pid)?;
    Ok(Usage {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out,
        wall_s: 0.0,
        user_s: r.user_s,
        sys_s: r.sys_s,
        max_rss_kib: r.max_rss_kib,
    })
}
