//! Load benchmark (not a test): a real control plane in a process of its own, configured as a
//! deployment is (`sonic_control::server::runtime_from_config`: the catalog, so the pool and the
//! per-vCPU limit), agents standing for the catalog's VM types running the synthetic lambda as
//! processes, and many concurrent HTTP calls. Measures the API's latency (p50, p99 of job
//! submissions and status reads), jobs' latency (submission to end), how fast instances cycle
//! through the agents' vCPU slots, the control plane's overhead per stage and on a chain, and its
//! CPU seconds and peak RSS (`/proc/<pid>/stat` and `status`). Figures: docs/load.md.
//!
//! ```text
//! cargo build --release -p sonic-lambdas -p sonic-benches
//! target/release/sonic-load [--jobs 500] [--instances 1000] [--agents 4] [--sleep-ms 100]
//!                           [--chains 30] [--lambdas target/release] [--catalog FILE]
//!                           [--executor-nice 10|off] [--agents-nice 0]
//!                           [--rounds 2] [--warm-connections] [--pin]
//! ```
//!
//! The agents' VM types are the catalog's (the built-in one unless `--catalog`), in its order,
//! repeating, each with its type's vCPUs, memory and network rate, as `ofctl up` starts them.
//! Phase 1: `--jobs` one-instance jobs (`synthetic noop`) submitted at once; each job's end is
//! followed on its event stream (`GET /v1/jobs/{id}/events`); `--rounds` times, each round by a new
//! client (new connections) once the previous round's jobs have ended: the first round meets a
//! control plane just started, the later ones one that has served a burst before. `--pin`: the
//! control plane alone on one CPU, everything else on another. Phase 2: one job of `--instances`
//! instances (`synthetic --sleep-ms`), more than the agents have vCPUs, so they go through the
//! pool's slots; the agents' running counters are sampled every 5 ms (the most at once per agent
//! against its vCPUs) and the job's time is compared with its sleeps alone. Phase 3: `--chains`
//! jobs of a chain of 8 no-op stages (`one` edges), one after the other; the agents (in this
//! process) mark when each run ended (its outputs registered: the next stage's inputs
//! complete), when the next run's request reached its agent and when its process started, so
//! the overhead per stage is read where it happens; the chain's latency (submission to its end
//! on the event stream) is compared with its lambdas' own seconds (the agents' reports). The
//! control plane is this same binary started as `sonic-load control ...`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use sonic_agent::config::{SandboxChoice, StoreChoice, local_config};
use sonic_agent::server::RunningAgent;
use sonic_control::{ControlConfig, SystemClock};
use sonic_core::catalog::Catalog;
use sonic_core::units::{ByteSize, Seconds};

const TOKEN: &str = "load-token-0123456789abcdef";
const FILE_KEY: &str = "load-file-key-0123456789abcdef";

const ONE: &str = "name: load-one\nfunctions:\n  - name: f\n    image: sonic-lambdas:latest\n    command: [synthetic, noop]\n    timeout: 600s\n";

/// Stages of the no-op chain (phase 3).
const CHAIN: usize = 8;

fn chain_dag() -> String {
    let mut y = String::from("name: load-chain\nfunctions:\n");
    for k in 1..=CHAIN {
        y.push_str(&format!(
            "  - name: s{k}\n    image: sonic-lambdas:latest\n    command: [synthetic, noop]\n    timeout: 600s\n"
        ));
    }
    y.push_str("edges:\n");
    for k in 1..CHAIN {
        y.push_str(&format!(
            "  - {{ from: s{k}, to: s{}, kind: one }}\n",
            k + 1
        ));
    }
    y
}

fn fanout_dag(sleep_ms: u64) -> String {
    format!(
        "name: load-fanout\nparams:\n  n: 1000\nfunctions:\n  - name: f\n    image: sonic-lambdas:latest\n    command: [synthetic, run, --sleep-ms, \"{sleep_ms}\", --output-bytes, \"0\", --alloc-mb, \"0\", --compute-ms, \"0\"]\n    instances: \"{{{{ params.n }}}}\"\n    timeout: 600s\n"
    )
}

/// What an agent of this process did to a run, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// `POST /v1/runs` reached the agent.
    Accepted,
    /// The sandbox started the lambda's process.
    Started,
    /// The run ended and its outputs are registered (a receiver's inputs are complete); its
    /// report is pushed next.
    Ended,
}

/// The agents' events of runs, read from their tracing (the agents run in this process): the
/// `run` span's id and the events `run accepted`, `process started` (process sandbox) and
/// `run ended`. Only while `on` is set.
#[derive(Default)]
struct Marks {
    on: AtomicBool,
    seen: Mutex<Vec<(String, Step, Instant)>>,
}

struct RunId(String);

#[derive(Default)]
struct Fields {
    message: String,
    run: Option<String>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "run" => self.run = Some(value.to_owned()),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "run" => self.run = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

struct MarksLayer(Arc<Marks>);

impl<S> tracing_subscriber::Layer<S> for MarksLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != "run" {
            return;
        }
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let (Some(run), Some(span)) = (f.run, ctx.span(id)) {
            span.extensions_mut().insert(RunId(run));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if !self.0.on.load(Ordering::Relaxed) {
            return;
        }
        let at = Instant::now();
        let mut f = Fields::default();
        event.record(&mut f);
        let step = match f.message.as_str() {
            "run accepted" => Step::Accepted,
            "process started" => Step::Started,
            "run ended" => Step::Ended,
            _ => return,
        };
        let run = f.run.or_else(|| {
            ctx.event_scope(event)?
                .find_map(|s| s.extensions().get::<RunId>().map(|r| r.0.clone()))
        });
        if let Some(run) = run {
            self.0
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((run, step, at));
        }
    }
}

impl Marks {
    /// Installs the layer for this process's agents; events of other crates are not looked at.
    fn install() -> anyhow::Result<Arc<Marks>> {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::{Layer, filter};
        let marks = Arc::new(Marks::default());
        let layer = MarksLayer(marks.clone())
            .with_filter(filter::filter_fn(|m| m.target().starts_with("sonic_agent")));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))?;
        Ok(marks)
    }

    fn take(&self) -> Vec<(String, Step, Instant)> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: u64) -> anyhow::Result<u64> {
    match arg(args, name) {
        Some(v) => v.parse().with_context(|| format!("{name} {v}")),
        None => Ok(default),
    }
}

/// The count and the quantiles `qs` (each the upper bound of the first bucket that holds it,
/// in seconds; infinite past the last bound) of the control plane's
/// `sonic_http_request_duration_seconds` series whose labels start with `labels`, counting the
/// requests since the metrics text `before` (empty: all).
fn bucket_quantiles(text: &str, before: &str, labels: &str, qs: &[f64]) -> Option<(u64, Vec<f64>)> {
    let prefix = format!("sonic_http_request_duration_seconds_bucket{{{labels},le=\"");
    let read = |text: &str| -> BTreeMap<String, u64> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|rest| {
                let (le, count) = rest.split_once("\"} ")?;
                Some((le.to_owned(), count.trim().parse().ok()?))
            })
            .collect()
    };
    let earlier = read(before);
    let mut buckets: Vec<(f64, u64)> = read(text)
        .into_iter()
        .filter_map(|(le, count)| {
            let since = count.saturating_sub(earlier.get(&le).copied().unwrap_or(0));
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, since))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let at = |q: f64| {
        let want = (q * total as f64).ceil() as u64;
        buckets
            .iter()
            .find(|(_, c)| *c >= want)
            .map_or(f64::INFINITY, |(le, _)| *le)
    };
    Some((total, qs.iter().map(|q| at(*q)).collect()))
}

/// Raises the open-file limit to its hard maximum (1,000 lambdas hold pipes and sockets).
#[allow(unsafe_code)]
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit on a valid, local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            return r.rlim_cur;
        }
    }
    0
}

/// The CPUs this process may run on (its affinity), lowest first.
#[allow(unsafe_code)]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills a zeroed, local cpu_set_t of the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Binds the calling thread (and the threads and processes it starts afterwards) to `cpu`.
#[allow(unsafe_code)]
fn pin_thread(cpu: usize) {
    // SAFETY: sched_setaffinity on the calling thread (0) with a local, initialized set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "--pin: cannot bind a thread to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// `--pin`: the control plane alone on the second allowed CPU; this process (the agents, so
/// their lambdas too, and phase 1's client) on the first: `(others, control)`. The control
/// plane's own timings are then free of the rest's CPU; the client's are not.
fn pin_layout(args: &[String]) -> anyhow::Result<Option<(usize, usize)>> {
    if !args.iter().any(|a| a == "--pin") {
        return Ok(None);
    }
    match allowed_cpus()[..] {
        [a, b, ..] => Ok(Some((a, b))),
        _ => bail!("--pin needs two CPUs"),
    }
}

#[allow(unsafe_code)]
fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes no pointers.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// What process `pid` has used so far (`/proc/<pid>/stat` and `status`).
struct Usage {
    /// CPU seconds, user + system.
    cpu_s: f64,
    /// Peak RSS (`VmHWM`), MiB.
    peak_rss_mib: f64,
    /// Minor page faults: memory it touched for the first time.
    minor_faults: u64,
}

fn usage(pid: u32) -> anyhow::Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").ok_or_else(|| anyhow!("bad stat"))?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    if f.len() < 13 {
        bail!("bad stat");
    }
    // Fields 10 (minflt), 14 and 15 (utime, stime), counted from 1; `after` starts at field 3.
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Ok(Usage {
        cpu_s: ticks / clock_ticks(),
        peak_rss_mib: hwm_kib / 1024.0,
        minor_faults: f[7].parse()?,
    })
}

/// The control plane role: runs until killed; writes its URL to `url_file`.
async fn control(dir: &Path, url_file: &Path) -> anyhow::Result<()> {
    raise_nofile();
    // Profiling: SONIC_LOAD_SPANS=FILE writes the control plane's debug spans (a submission's
    // steps) to FILE as they close, with their busy and idle time.
    if let Some(file) = std::env::var_os("SONIC_LOAD_SPANS") {
        use tracing_subscriber::fmt::format::FmtSpan;
        let out = std::fs::File::create(&file)?;
        tracing_subscriber::fmt()
            .with_writer(Mutex::new(out))
            .with_ansi(false)
            .with_span_events(FmtSpan::CLOSE)
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "warn,sonic_control::http::api=debug,sonic_control::admission=debug,sonic_control::store=debug",
            ))
            .init();
    }
    // The control plane as a deployment configures it (`sonic_control::start`): the catalog
    // (SONIC_LOAD_CATALOG, else the built-in one, as `sonic-control` without `catalog:`), so the
    // pool accounts every agent's vCPUs and memory and an unplanned job runs at most one lambda
    // per vCPU of an agent; the object store a folder the agents of this machine share.
    let executor_nice = match std::env::var_os("SONIC_LOAD_EXECUTOR_NICE") {
        None => Some(sonic_control::config::DEFAULT_EXECUTOR_NICE),
        Some(v) if v == "off" => None,
        Some(v) => Some(
            v.to_str()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n <= 19)
                .ok_or_else(|| anyhow!("--executor-nice: a number from 0 to 19, or off"))?,
        ),
    };
    let config = ControlConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.join("control"),
        token: TOKEN.into(),
        agent_token: Some(TOKEN.into()),
        file_key: Some(FILE_KEY.into()),
        store: Some(StoreChoice::Local {
            root: dir.join("store"),
        }),
        heartbeat_timeout: Seconds(30.0),
        catalog: std::env::var("SONIC_LOAD_CATALOG").ok(),
        max_body: ByteSize(1024 * 1024),
        executor_nice,
        ..ControlConfig::default()
    };
    config.check().map_err(|e| anyhow!("control plane: {e}"))?;
    let runtime = sonic_control::server::runtime_from_config(&config)
        .await
        .map_err(|e| anyhow!("control plane: {e}"))?;
    let running =
        sonic_control::start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
            .await
            .map_err(|e| anyhow!("control plane: {e}"))?;
    std::fs::write(url_file, running.url())?;
    std::future::pending::<()>().await;
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Latencies(BTreeMap<&'static str, Vec<f64>>);

impl Latencies {
    fn add(&mut self, what: &'static str, ms: f64) {
        self.0.entry(what).or_default().push(ms);
    }
    fn merge(&mut self, other: Latencies) {
        for (k, v) in other.0 {
            self.0.entry(k).or_default().extend(v);
        }
    }
    fn print(&self) {
        for (k, v) in &self.0 {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            println!(
                "  {k:<14} n={:<6} p50={:>8.2} ms  p99={:>8.2} ms  max={:>8.2} ms",
                v.len(),
                percentile(&v, 50.0),
                percentile(&v, 99.0),
                v.last().copied().unwrap_or(f64::NAN)
            );
        }
    }
}

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    /// `POST /v1/jobs` with `body`: the job's id and how long the submission took (ms).
    async fn submit(&self, body: String) -> anyhow::Result<(String, f64)> {
        let (code, v, ms) = self
            .call(
                reqwest::Method::POST,
                "/v1/jobs",
                Some(("application/json", body.into_bytes())),
            )
            .await?;
        if code != 202 {
            bail!("POST /v1/jobs: {code} {v}");
        }
        Ok((v["job_id"].as_str().unwrap_or("").to_owned(), ms))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> anyhow::Result<(u16, serde_json::Value, f64)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(TOKEN);
        if let Some((ct, b)) = body {
            req = req.header("content-type", ct).body(b);
        }
        let t = Instant::now();
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let v = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Ok((status, v, ms))
    }

    /// The control plane's metrics, as text.
    async fn metrics(&self) -> anyhow::Result<String> {
        let resp = self
            .http
            .get(format!("{}/metrics", self.url))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .error_for_status()?;
        Ok(resp.text().await?)
    }

    /// Polls a job until it ends; its final status and the latencies of the reads.
    async fn wait(&self, id: &str, lat: &mut Latencies) -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(1200);
        loop {
            let (code, v, ms) = self
                .call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None)
                .await?;
            lat.add("status", ms);
            if code != 200 {
                bail!("GET /v1/jobs/{id}: {code} {v}");
            }
            let status = v["status"].as_str().unwrap_or("").to_owned();
            if status == "succeeded" || status == "failed" {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("job {id} did not end");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Api {
    /// Follows a job's event stream until its terminal event: its final status and when that
    /// event arrived (the control plane publishes it once the job's end is recorded).
    async fn follow(&self, id: &str) -> anyhow::Result<(String, Instant)> {
        let mut resp = self
            .http
            .get(format!("{}/v1/jobs/{id}/events", self.url))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        if resp.status() != reqwest::StatusCode::OK {
            bail!("GET /v1/jobs/{id}/events: {}", resp.status());
        }
        let mut text = String::new();
        while let Some(chunk) = resp.chunk().await? {
            let at = Instant::now();
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find('\n') {
                let line: String = text.drain(..=end).collect();
                let Some(data) = line.trim_end().strip_prefix("data:") else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(data.trim()).unwrap_or_default();
                let status = v["status"].as_str().unwrap_or("");
                if status == "succeeded" || status == "failed" {
                    return Ok((status.to_owned(), at));
                }
            }
        }
        bail!("the event stream of job {id} ended before the job")
    }
}

/// Samples the agents' running counters every 5 ms while `on` is set: per agent, the most
/// lambdas it ran at once, and when the first one ran (since the sampler started).
fn sample_running(
    agents: &[RunningAgent],
    on: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<u32>, Option<Duration>)> {
    let states: Vec<Arc<sonic_agent::server::AgentState>> =
        agents.iter().map(|a| a.state.clone()).collect();
    tokio::spawn(async move {
        let t = Instant::now();
        let mut peaks = vec![0u32; states.len()];
        let mut first = None;
        while on.load(Ordering::SeqCst) {
            for (p, s) in peaks.iter_mut().zip(&states) {
                let n = s.running.load(Ordering::SeqCst);
                *p = (*p).max(n);
                if n > 0 && first.is_none() {
                    first = Some(t.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (peaks, first)
    })
}

/// Per agent, the most lambdas it ran at once against its vCPUs: `a-1 2/2, a-2 0/4, ...`.
fn peaks_line(peaks: &[u32], vcpus: &[u32]) -> String {
    peaks
        .iter()
        .zip(vcpus)
        .enumerate()
        .map(|(i, (p, v))| format!("a-{} {p}/{v}", i + 1))
        .collect::<Vec<_>>()
        .join(", ")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The stage (function) of a run id `<job>.<function>.<instance>.<attempt>[.<execution>]`.
fn run_parts(run: &str) -> Option<(&str, &str)> {
    let mut it = run.split('.');
    Some((it.next()?, it.next()?))
}

/// Phase 3: per-stage overhead (a stage's inputs complete -> its instance's process started,
/// split at the agent receiving the request) and the chain's latency over its lambdas' time.
async fn chain_phase(api: &Api, marks: &Marks, chains: u64) -> anyhow::Result<()> {
    let mut lat = Latencies::default();
    let mut failed = 0;
    for _ in 0..chains {
        marks.take();
        marks.on.store(true, Ordering::SeqCst);
        let t = Instant::now();
        let (id, ms) = api
            .submit(r#"{"dag": "load-chain", "policy": "remote"}"#.into())
            .await?;
        lat.add("submit", ms);
        let (end, at) = api.follow(&id).await?;
        marks.on.store(false, Ordering::SeqCst);
        if end != "succeeded" {
            failed += 1;
            continue;
        }
        let (_, summary, _) = api
            .call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None)
            .await?;
        let own: f64 = summary["functions"]
            .as_array()
            .map(|f| f.iter().filter_map(|r| r["seconds"].as_f64()).sum())
            .unwrap_or(f64::NAN);
        let job_ms = at.duration_since(t).as_secs_f64() * 1e3;
        lat.add("chain job", job_ms);
        lat.add("chain lambdas", own * 1e3);
        lat.add("chain overhead", job_ms - own * 1e3);
        if let Some(l) = summary["latency_s"].as_f64() {
            lat.add("summary ovh", (l - own) * 1e3);
        }
        // When each stage's run was accepted, started and ended on its agent.
        let mut at_step: BTreeMap<(String, Step), Instant> = BTreeMap::new();
        for (run, step, when) in marks.take() {
            if let Some((job, function)) = run_parts(&run)
                && job == id
            {
                at_step.entry((function.to_owned(), step)).or_insert(when);
            }
        }
        let mark = |k: usize, s: Step| at_step.get(&(format!("s{k}"), s)).copied();
        if let Some(started) = mark(1, Step::Started) {
            lat.add(
                "submit->start",
                started.duration_since(t).as_secs_f64() * 1e3,
            );
        }
        for k in 2..=CHAIN {
            let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
            let (Some(inputs), Some(accepted)) =
                (mark(k - 1, Step::Ended), mark(k, Step::Accepted))
            else {
                continue;
            };
            lat.add("ended->sent", ms(inputs, accepted));
            if let Some(started) = mark(k, Step::Started) {
                lat.add("sent->started", ms(accepted, started));
                lat.add("stage overhead", ms(inputs, started));
            }
        }
    }
    println!(
        "  {} chains succeeded, {failed} failed; per stage (s2..s{CHAIN}): inputs complete \
         (previous run ended on its agent) -> request at the agent -> process started",
        chains - failed
    );
    lat.print();
    Ok(())
}

/// The benchmark's HTTP client: many connections to the control plane at once.
fn http_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(120))
        .build()
}

/// One round of phase 1: `jobs` one-instance jobs submitted at once by a new client (so over
/// new connections, unless `warm`), each followed to its end on its event stream. Prints the
/// round's figures and returns the control plane's metrics text afterwards.
async fn burst(url: &str, pid: u32, jobs: u64, warm: bool) -> anyhow::Result<String> {
    let before = usage(pid)?;
    // The client runs on threads of its own: on the agents' runtime, its tasks queued behind
    // the agents' (500 runs to start), and their answers were read late.
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load-client")
        .enable_all()
        .build()?;
    let client_api = Arc::new(Api {
        http: http_client()?,
        url: url.to_owned(),
    });
    // `--warm-connections`: open one connection per job first (concurrent health reads), so
    // that the submissions reuse them and their latency leaves out connection setup (a
    // diagnostic: a new client connects as part of its submission).
    if warm {
        let mut opened_set = tokio::task::JoinSet::new();
        for _ in 0..jobs {
            let api = client_api.clone();
            opened_set.spawn_on(
                async move { api.call(reqwest::Method::GET, "/v1/health", None).await },
                client.handle(),
            );
        }
        let mut opened = Latencies::default();
        while let Some(r) = opened_set.join_next().await {
            opened.add("health (new connection)", r??.2);
        }
        println!("  {jobs} connections opened first (--warm-connections)");
        opened.print();
    }
    // The control plane's and this process's (the client's and the agents') usage when the last
    // submission is answered: what the burst itself cost each side.
    let mine = std::process::id();
    let at_burst_start = (usage(pid)?, usage(mine)?);
    let at_burst_end: Arc<Mutex<Option<(Usage, Usage)>>> = Arc::default();
    let answered_count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t1 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..jobs {
        let api = client_api.clone();
        let (at_burst_end, answered_count) = (at_burst_end.clone(), answered_count.clone());
        set.spawn_on(
            async move {
                let mut lat = Latencies::default();
                let t = Instant::now();
                let (id, ms) = api
                    .submit(r#"{"dag": "load-one", "policy": "remote"}"#.into())
                    .await?;
                lat.add("submit", ms);
                let answered = Instant::now();
                if answered_count.fetch_add(1, Ordering::SeqCst) + 1 == jobs {
                    *at_burst_end.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((usage(pid)?, usage(mine)?));
                }
                let (end, at) = api.follow(&id).await?;
                lat.add("job", at.duration_since(t).as_secs_f64() * 1e3);
                anyhow::Ok((lat, end, at, answered))
            },
            client.handle(),
        );
    }
    let mut lat = Latencies::default();
    let mut ends: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut last_end = t1;
    let mut last_answer = t1;
    while let Some(r) = set.join_next().await {
        match r? {
            Ok((l, end, at, answered)) => {
                lat.merge(l);
                *ends.entry(end).or_default() += 1;
                last_end = last_end.max(at);
                last_answer = last_answer.max(answered);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let metrics = client_api.metrics().await?;
    client.shutdown_background();
    let took = last_end.duration_since(t1).as_secs_f64();
    let after = usage(pid)?;
    println!(
        "  {jobs} jobs ended {took:.2} s after the first submission ({:.1} jobs/s); outcomes {ends:?}; errors {}",
        jobs as f64 / took,
        errors.len()
    );
    if let Some(e) = errors.first() {
        println!("  first error: {e}");
    }
    println!(
        "  the last submission was answered {:.0} ms after the first was sent",
        last_answer.duration_since(t1).as_secs_f64() * 1e3
    );
    if std::env::var_os("SONIC_LOAD_MONOTONIC").is_some() {
        // For lining up a `perf record -k CLOCK_MONOTONIC` profile with the burst.
        println!("  monotonic: sent {t1:?}, last answered {last_answer:?}");
    }
    lat.print();
    println!(
        "  control plane: {:.1} CPU s, {} minor page faults in this round",
        after.cpu_s - before.cpu_s,
        after.minor_faults - before.minor_faults
    );
    if let Some((cp, me)) = at_burst_end
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        let (cp0, me0) = at_burst_start;
        println!(
            "  until the last submission was answered: control plane {:.0} ms CPU, {} minor faults; this process (client, agents) {:.0} ms CPU, {} minor faults",
            (cp.cpu_s - cp0.cpu_s) * 1e3,
            cp.minor_faults.saturating_sub(cp0.minor_faults),
            (me.cpu_s - me0.cpu_s) * 1e3,
            me.minor_faults.saturating_sub(me0.minor_faults),
        );
    }
    Ok(metrics)
}

/// The benchmark's three phases; `agents_nice` is what `main` ran this runtime's threads at,
/// `pin` where it bound them (`pin_layout`).
async fn drive(
    args: &[String],
    agents_nice: u64,
    pin: Option<(usize, usize)>,
) -> anyhow::Result<()> {
    let jobs = num(args, "--jobs", 500)?;
    let instances = num(args, "--instances", 1000)?;
    let n_agents = num(args, "--agents", 4)?.max(1);
    let sleep_ms = num(args, "--sleep-ms", 100)?;
    let chains = num(args, "--chains", 30)?;
    // Executions on threads of their own at this niceness (`ControlConfig::executor_nice`, the
    // control plane's default unless given), or `off`: on the API's runtime.
    let executor_nice = arg(args, "--executor-nice")
        .unwrap_or_else(|| sonic_control::config::DEFAULT_EXECUTOR_NICE.to_string());
    // The catalog the control plane plans and limits with, and whose VM types the agents stand
    // for (in its order, repeating, as `ofctl up` starts them).
    let catalog_file = arg(args, "--catalog")
        .map(|f| std::fs::canonicalize(&f).with_context(|| format!("--catalog {f}")))
        .transpose()?;
    let catalog = match &catalog_file {
        Some(f) => Catalog::from_yaml(
            &std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?,
        )
        .with_context(|| format!("{}", f.display()))?,
        None => Catalog::default(),
    };
    if catalog.vm_types.is_empty() {
        bail!("the catalog has no VM types");
    }
    let lambdas = match arg(args, "--lambdas") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    if !lambdas.join("synthetic").is_file() {
        bail!(
            "no synthetic lambda in {}: cargo build --release -p sonic-lambdas",
            lambdas.display()
        );
    }
    // Lambdas run in folders of their own: a relative folder would not find them.
    let lambdas = lambdas.canonicalize()?;
    let nofile = raise_nofile();
    let marks = Marks::install()?;
    let dir = tempfile::tempdir()?;
    let url_file = dir.path().join("control.url");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("control")
        .arg(dir.path())
        .arg(&url_file)
        .env("RUST_LOG", "warn")
        .env("SONIC_LOAD_EXECUTOR_NICE", &executor_nice)
        .envs(catalog_file.as_ref().map(|f| ("SONIC_LOAD_CATALOG", f)))
        .envs(pin.map(|(_, control)| ("SONIC_LOAD_CPU", control.to_string())))
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or_else(|| anyhow!("control plane exited"))?;
    let url = loop {
        if let Ok(u) = std::fs::read_to_string(&url_file)
            && !u.is_empty()
        {
            break u;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the control plane exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let api = Arc::new(Api {
        http: http_client()?,
        url: url.clone(),
    });
    println!(
        "load average {} at the start\ncontrol plane pid {pid} at {url}; {n_agents} agents (process sandbox, {}); open files {nofile}; executor nice {executor_nice}; agents nice {agents_nice}; {}",
        loadavg(),
        lambdas.display(),
        match pin {
            Some((a, c)) => format!(
                "pinned: the control plane alone on CPU {c}, the agents, their lambdas and the client on CPU {a}"
            ),
            None => "not pinned".to_owned(),
        }
    );

    let mut agents = Vec::new();
    let mut vm_types = Vec::new();
    for i in 0..n_agents {
        let id = format!("a-{}", i + 1);
        let vm = &catalog.vm_types[i as usize % catalog.vm_types.len()];
        let mut cfg = local_config(&id, &dir.path().join("agents").join(&id), TOKEN, FILE_KEY);
        cfg.control_url = Some(url.clone());
        cfg.sandbox = SandboxChoice::Process;
        cfg.store = Some(StoreChoice::Local {
            root: dir.path().join("store"),
        });
        cfg.bin_dirs = vec![lambdas.clone()];
        cfg.heartbeat_interval_ms = 1000;
        cfg.vm_type = vm.name.clone();
        cfg.vcpus = vm.vcpus;
        cfg.memory_mb = vm.memory_mb;
        cfg.network_mbps = Some(vm.network_mbps);
        vm_types.push(vm.clone());
        agents.push(
            sonic_agent::start_from_config(cfg)
                .await
                .map_err(|e| anyhow!("agent {id}: {e}"))?,
        );
    }
    let vcpus: Vec<u32> = vm_types.iter().map(|v| v.vcpus).collect();
    println!(
        "catalog {}; agents {} ({} vCPUs in all: the pool's slots, one lambda per vCPU)",
        catalog_file
            .as_ref()
            .map_or("built-in".to_owned(), |f| f.display().to_string()),
        vm_types
            .iter()
            .enumerate()
            .map(|(i, v)| format!("a-{} {} ({} vCPUs)", i + 1, v.name, v.vcpus))
            .collect::<Vec<_>>()
            .join(", "),
        vcpus.iter().sum::<u32>()
    );
    let ids: Vec<String> = (1..=n_agents).map(|i| format!("a-{i}")).collect();
    let client = sonic_cluster::Client::new(sonic_cluster::config::Target {
        server: url.clone(),
        token: Some(TOKEN.into()),
        ca_file: None,
    })?;
    sonic_cluster::cluster::wait_alive(&client, &ids, Duration::from_secs(60)).await?;
    for dag in [ONE.to_string(), fanout_dag(sleep_ms), chain_dag()] {
        let (code, v, _) = api
            .call(
                reqwest::Method::PUT,
                "/v1/dags",
                Some(("application/yaml", dag.into_bytes())),
            )
            .await?;
        if code >= 300 {
            bail!("PUT /v1/dags: {code} {v}");
        }
    }
    let cpu0 = usage(pid)?.cpu_s;

    // Phase 1: concurrent submissions, `--rounds` times (each round a new client, so new
    // connections; the next round starts once the previous one's jobs have ended).
    let rounds = num(args, "--rounds", 2)?.max(1);
    let warm = args.iter().any(|a| a == "--warm-connections");
    let mut metrics_before = api.metrics().await?;
    for round in 1..=rounds {
        println!(
            "\nphase 1, round {round} of {rounds}: {jobs} one-instance jobs submitted at once"
        );
        let on = Arc::new(AtomicBool::new(true));
        let sampler = sample_running(&agents, on.clone());
        let metrics_after = burst(&url, pid, jobs, warm).await?;
        on.store(false, Ordering::SeqCst);
        let (peaks, _) = sampler.await?;
        println!(
            "  most lambdas running at once per agent (against its vCPUs): {}",
            peaks_line(&peaks, &vcpus)
        );
        // The same submissions as the control plane timed them (routing to response head):
        // what the client's own work on this machine's cores adds is the difference.
        match bucket_quantiles(
            &metrics_after,
            &metrics_before,
            r#"method="POST",route="/v1/jobs""#,
            &[0.5, 0.99],
        ) {
            Some((n, q)) => println!(
                "  submit at the control plane (its request histogram, bucket bounds): n={n} p50 <= {:.1} ms  p99 <= {:.1} ms",
                q[0] * 1e3,
                q[1] * 1e3
            ),
            None => println!("  submit at the control plane: no request histogram in its metrics"),
        }
        metrics_before = metrics_after;
    }
    let Usage {
        cpu_s: cpu1,
        peak_rss_mib: rss1,
        ..
    } = usage(pid)?;
    println!(
        "  control plane: {:.1} CPU s in phase 1, peak RSS so far {rss1:.0} MiB",
        cpu1 - cpu0
    );

    // Phase 2: one job of `instances` instances, more than the agents have vCPUs: they go
    // through the pool's slots, at most one lambda per vCPU of each agent at a time.
    let limit: u32 = vcpus.iter().sum();
    println!(
        "\nphase 2: one job of {instances} instances (each sleeps {sleep_ms} ms) on {n_agents} agents of {limit} vCPUs in all"
    );
    let body =
        format!(r#"{{"dag": "load-fanout", "policy": "remote", "params": {{"n": {instances}}}}}"#);
    let on = Arc::new(AtomicBool::new(true));
    let sampler = sample_running(&agents, on.clone());
    let t2 = Instant::now();
    let (id, submit_ms) = api.submit(body).await?;
    let mut lat2 = Latencies::default();
    lat2.add("submit", submit_ms);
    // Status reads while it runs (every 200 ms) until it ends.
    let (lat, end) = {
        let mut lat = Latencies::default();
        let end = api.wait(&id, &mut lat).await;
        (lat, end)
    };
    let phase2 = t2.elapsed().as_secs_f64();
    on.store(false, Ordering::SeqCst);
    let (peaks, first) = sampler.await?;
    lat2.merge(lat);
    let Usage {
        cpu_s: cpu2,
        peak_rss_mib: rss2,
        ..
    } = usage(pid)?;
    println!(
        "  job {id} {} {phase2:.2} s after its submission (status reads every 200 ms); first instance running after {}",
        end.unwrap_or_else(|e| format!("error: {e}")),
        first.map_or("never".to_owned(), |f| format!("{:.2} s", f.as_secs_f64()))
    );
    println!(
        "  most lambdas running at once: {} of {limit} vCPUs; per agent (against its vCPUs): {}",
        peaks.iter().sum::<u32>(),
        peaks_line(&peaks, &vcpus)
    );
    // Instances go round-robin over the agents (instance k of the job's one stage on agent
    // k mod n): each agent runs its share in waves of its vCPUs, and the slowest one bounds
    // the job. What that takes if every slot were refilled the moment it freed:
    let n = vcpus.len() as u64;
    let waves = (0..n)
        .map(|j| {
            let share = instances / n + u64::from(j < instances % n);
            share.div_ceil(u64::from(vcpus[j as usize].max(1)))
        })
        .max()
        .unwrap_or(0);
    let ideal = (waves * sleep_ms) as f64 / 1e3;
    println!(
        "  {:.0} instances ended per second; the sleeps alone, every slot refilled at once: {ideal:.2} s ({waves} waves of {sleep_ms} ms on the agent with the fewest vCPUs for its share), so {:.2} s of overhead, {:.1} ms per wave",
        instances as f64 / phase2,
        phase2 - ideal,
        (phase2 - ideal) * 1e3 / waves.max(1) as f64
    );
    // Instances that needed more than one attempt, and why the first one failed.
    let (_, logs, _) = api
        .call(reqwest::Method::GET, &format!("/v1/jobs/{id}/logs"), None)
        .await?;
    let retried: Vec<&serde_json::Value> = logs["logs"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter(|x| x["attempt"].as_u64() > Some(1))
                .collect()
        })
        .unwrap_or_default();
    println!("  attempts after the first: {}", retried.len());
    if let Some(first_fail) = logs["logs"].as_array().and_then(|l| {
        l.iter().find(|x| {
            x["attempt"].as_u64() == Some(1)
                && retried.iter().any(|r| r["instance"] == x["instance"])
        })
    }) {
        let text = first_fail["log"].as_str().unwrap_or("");
        let tail: String = text
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        println!("  a failed first attempt: {}", tail.trim());
    }
    lat2.print();
    println!("  control plane: {:.1} CPU s in this phase", cpu2 - cpu1);
    println!("  load average {}", loadavg());

    // Phase 3: chains of no-op stages, one job at a time.
    println!("\nphase 3: {chains} jobs of a chain of {CHAIN} no-op stages, one after the other");
    chain_phase(&api, &marks, chains).await?;
    let Usage {
        cpu_s: cpu3,
        peak_rss_mib: rss3,
        ..
    } = usage(pid)?;
    println!("  control plane: {:.1} CPU s in this phase", cpu3 - cpu2);
    println!(
        "\ncontrol plane total: {:.1} CPU s, peak RSS {:.0} MiB; load average {}",
        cpu3 - cpu0,
        rss2.max(rss3),
        loadavg()
    );
    for a in agents {
        a.stop().await;
    }
    let _ = child.kill().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("control") {
        let (Some(dir), Some(url_file)) = (args.get(1), args.get(2)) else {
            bail!("usage: sonic-load control DIR URL_FILE");
        };
        // `--pin`: every thread of the control plane on the CPU it was given (they inherit the
        // main thread's binding).
        if let Some(cpu) = std::env::var_os("SONIC_LOAD_CPU") {
            let cpu = cpu
                .to_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("SONIC_LOAD_CPU: a CPU number"))?;
            pin_thread(cpu);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return rt.block_on(control(Path::new(dir), Path::new(url_file)));
    }
    // `--agents-nice N`: the agents' threads (this runtime's workers and blocking threads, so
    // the lambdas they start too) run N nicer than the control plane and the phase-1 client,
    // standing in for agents on hosts of their own. 0 (the default): the same priority.
    let agents_nice = num(&args, "--agents-nice", 0)?;
    if agents_nice > 19 {
        bail!("--agents-nice: a number from 0 to 19");
    }
    let nice = agents_nice as i32;
    // `--pin`: this thread first, so that every thread and process started from it (the
    // runtime's, the client's, the lambdas) inherits the binding.
    let pin = pin_layout(&args)?;
    if let Some((others, _)) = pin {
        pin_thread(others);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .on_thread_start(move || sonic_control::exec::threads::lower_thread_priority(nice))
        .enable_all()
        .build()?;
    rt.block_on(drive(&args, agents_nice, pin))
}

#[cfg(test)]
mod tests {
    use super::bucket_quantiles;

    #[test]
    fn quantiles_are_read_from_the_buckets_of_one_route() {
        let text = "\
sonic_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/jobs\",le=\"0.01\"} 10
sonic_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/jobs\",le=\"0.05\"} 98
sonic_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/jobs\",le=\"0.1\"} 99
sonic_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/jobs\",le=\"+Inf\"} 100
sonic_http_request_duration_seconds_bucket{method=\"GET\",route=\"/v1/jobs\",le=\"+Inf\"} 7
";
        let post = r#"method="POST",route="/v1/jobs""#;
        let (n, q) = bucket_quantiles(text, "", post, &[0.5, 0.99, 1.0]).expect("a series");
        assert_eq!(n, 100);
        assert_eq!(q, vec![0.05, 0.1, f64::INFINITY]);
        assert!(bucket_quantiles(text, "", r#"method="PUT",route="/v1/jobs""#, &[0.5]).is_none());
        // Since an earlier reading: 10 more requests, 8 of them within 0.01 s, 2 past 0.1 s.
        let before = text
            .replace("} 10\n", "} 2\n")
            .replace("} 98", "} 90")
            .replace("} 99", "} 91")
            .replace("} 100", "} 90");
        let (n, q) = bucket_quantiles(text, &before, post, &[0.5, 0.8, 0.9]).expect("a series");
        assert_eq!(n, 10);
        assert_eq!(q, vec![0.01, 0.01, f64::INFINITY]);
        assert!(bucket_quantiles(text, text, post, &[0.5]).is_none());
    }
}
