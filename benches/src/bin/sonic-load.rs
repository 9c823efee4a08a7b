//! Load benchmark (not a test): a real control plane in a process of its own, agents running the
//! synthetic lambda as processes, and many concurrent HTTP calls. Measures the API's latency (p50,
//! p99 of job submissions and status reads), how fast instances start, and the control plane's
//! CPU seconds and peak RSS (`/proc/<pid>/stat` and `status`). Figures: docs/load.md.
//!
//! ```text
//! cargo build --release -p sonic-lambdas -p sonic-benches
//! target/release/sonic-load [--jobs 500] [--instances 1000] [--agents 4] [--sleep-ms 20000]
//!                           [--lambdas target/release]
//! ```
//!
//! Phase 1: `--jobs` one-instance jobs (`synthetic noop`) submitted at once; each is then polled
//! until it ends. Phase 2: one job of `--instances` instances (`synthetic --sleep-ms`, so they
//! overlap), spread over the agents; the agents' running counters are sampled every 5 ms until all
//! run at once. The control plane is this same binary started as `sonic-load control ...`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use sonic_agent::config::{SandboxChoice, StoreChoice, local_config};
use sonic_agent::server::RunningAgent;
use sonic_control::{ControlConfig, JobsConfig, Runtime, SystemClock};
use sonic_core::units::{ByteSize, Seconds};

const TOKEN: &str = "load-token-0123456789abcdef";
const FILE_KEY: &str = "load-file-key-0123456789abcdef";

const ONE: &str = "name: load-one\nfunctions:\n  - name: f\n    image: sonic-lambdas:latest\n    command: [synthetic, noop]\n    timeout: 600s\n";

fn fanout_dag(sleep_ms: u64) -> String {
    format!(
        "name: load-fanout\nparams:\n  n: 1000\nfunctions:\n  - name: f\n    image: sonic-lambdas:latest\n    command: [synthetic, run, --sleep-ms, \"{sleep_ms}\", --output-bytes, \"0\", --alloc-mb, \"0\", --compute-ms, \"0\"]\n    instances: \"{{{{ params.n }}}}\"\n    timeout: 600s\n"
    )
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

#[allow(unsafe_code)]
fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes no pointers.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU seconds (user + system) and peak RSS in MiB of process `pid`.
fn usage(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").ok_or_else(|| anyhow!("bad stat"))?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from 1; `after` starts at field 3.
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Ok((ticks / clock_ticks(), hwm_kib / 1024.0))
}

/// The control plane role: runs until killed; writes its URL to `url_file`.
async fn control(dir: &Path, url_file: &Path) -> anyhow::Result<()> {
    raise_nofile();
    let store = Arc::new(sonic_storage::local::LocalStore::new(dir.join("store"))?);
    let runtime = Runtime::new(store, None, JobsConfig::new(TOKEN, FILE_KEY.as_bytes()));
    let config = ControlConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.join("control"),
        token: TOKEN.into(),
        heartbeat_timeout: Seconds(30.0),
        catalog: None,
        max_body: ByteSize(1024 * 1024),
        ..ControlConfig::default()
    };
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

fn running(agents: &[RunningAgent]) -> u32 {
    agents
        .iter()
        .map(|a| a.state.running.load(Ordering::SeqCst))
        .sum()
}

async fn drive(args: &[String]) -> anyhow::Result<()> {
    let jobs = num(args, "--jobs", 500)?;
    let instances = num(args, "--instances", 1000)?;
    let n_agents = num(args, "--agents", 4)?.max(1);
    let sleep_ms = num(args, "--sleep-ms", 20_000)?;
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
    let nofile = raise_nofile();
    let dir = tempfile::tempdir()?;
    let url_file = dir.path().join("control.url");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("control")
        .arg(dir.path())
        .arg(&url_file)
        .env("RUST_LOG", "warn")
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
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .timeout(Duration::from_secs(120))
            .build()?,
        url: url.clone(),
    });
    println!(
        "control plane pid {pid} at {url}; {n_agents} agents (process sandbox, {}); open files {nofile}",
        lambdas.display()
    );

    let mut agents = Vec::new();
    for i in 0..n_agents {
        let id = format!("a-{}", i + 1);
        let mut cfg = local_config(&id, &dir.path().join("agents").join(&id), TOKEN, FILE_KEY);
        cfg.control_url = Some(url.clone());
        cfg.sandbox = SandboxChoice::Process;
        cfg.store = Some(StoreChoice::Local {
            root: dir.path().join("store"),
        });
        cfg.bin_dirs = vec![lambdas.clone()];
        cfg.heartbeat_interval_ms = 1000;
        cfg.vcpus = 64;
        cfg.memory_mb = 1 << 20;
        agents.push(
            sonic_agent::start_from_config(cfg)
                .await
                .map_err(|e| anyhow!("agent {id}: {e}"))?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v, _) = api.call(reqwest::Method::GET, "/v1/agents", None).await?;
        let alive = v["agents"]
            .as_array()
            .map(|a| a.iter().filter(|x| x["alive"] == true).count())
            .unwrap_or(0);
        if alive as u64 == n_agents {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {alive} agents registered");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for dag in [ONE.to_string(), fanout_dag(sleep_ms)] {
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
    let (cpu0, _) = usage(pid)?;

    // Phase 1: concurrent submissions.
    println!("\nphase 1: {jobs} one-instance jobs submitted at once");
    let t1 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..jobs {
        let api = api.clone();
        set.spawn(async move {
            let mut lat = Latencies::default();
            let body = br#"{"dag": "load-one", "policy": "remote"}"#.to_vec();
            let (code, v, ms) = api
                .call(
                    reqwest::Method::POST,
                    "/v1/jobs",
                    Some(("application/json", body)),
                )
                .await?;
            lat.add("submit", ms);
            if code != 202 {
                bail!("POST /v1/jobs: {code} {v}");
            }
            let id = v["job_id"].as_str().unwrap_or("").to_owned();
            let end = api.wait(&id, &mut lat).await?;
            anyhow::Ok((lat, end))
        });
    }
    let mut lat1 = Latencies::default();
    let mut ends: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors = Vec::new();
    while let Some(r) = set.join_next().await {
        match r? {
            Ok((l, end)) => {
                lat1.merge(l);
                *ends.entry(end).or_default() += 1;
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let phase1 = t1.elapsed().as_secs_f64();
    let (cpu1, rss1) = usage(pid)?;
    println!(
        "  {jobs} jobs ended in {phase1:.1} s ({:.1} jobs/s); outcomes {ends:?}; errors {}",
        jobs as f64 / phase1,
        errors.len()
    );
    if let Some(e) = errors.first() {
        println!("  first error: {e}");
    }
    lat1.print();
    println!(
        "  control plane: {:.1} CPU s in this phase, peak RSS so far {rss1:.0} MiB",
        cpu1 - cpu0
    );

    // Phase 2: one job of `instances` instances that overlap.
    println!("\nphase 2: one job of {instances} instances (each sleeps {sleep_ms} ms)");
    let body =
        format!(r#"{{"dag": "load-fanout", "policy": "remote", "params": {{"n": {instances}}}}}"#);
    let t2 = Instant::now();
    let (code, v, submit_ms) = api
        .call(
            reqwest::Method::POST,
            "/v1/jobs",
            Some(("application/json", body.into_bytes())),
        )
        .await?;
    if code != 202 {
        bail!("POST /v1/jobs: {code} {v}");
    }
    let id = v["job_id"].as_str().unwrap_or("").to_owned();
    let mut lat2 = Latencies::default();
    lat2.add("submit", submit_ms);
    // Status reads while it runs, from a task of their own.
    let poller = {
        let api = api.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let mut lat = Latencies::default();
            let end = api.wait(&id, &mut lat).await;
            (lat, end)
        })
    };
    let mut peak = 0u32;
    let mut first: Option<f64> = None;
    let mut half: Option<f64> = None;
    let mut all: Option<f64> = None;
    let sample_deadline = Instant::now() + Duration::from_millis(sleep_ms);
    while Instant::now() < sample_deadline && all.is_none() {
        let n = running(&agents);
        let t = t2.elapsed().as_secs_f64();
        peak = peak.max(n);
        if n > 0 && first.is_none() {
            first = Some(t);
        }
        if u64::from(n) * 2 >= instances && half.is_none() {
            half = Some(t);
        }
        if u64::from(n) >= instances {
            all = Some(t);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (lat, end) = poller.await?;
    lat2.merge(lat);
    let phase2 = t2.elapsed().as_secs_f64();
    let (cpu2, rss2) = usage(pid)?;
    println!(
        "  job {id} {} in {phase2:.1} s; peak concurrently running {peak}",
        end.unwrap_or_else(|e| format!("error: {e}"))
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
    let fmt = |o: Option<f64>| o.map_or("never".to_string(), |s| format!("{s:.2} s"));
    println!(
        "  first instance running after {}, half after {}, all {instances} after {}",
        fmt(first),
        fmt(half),
        fmt(all)
    );
    if let Some(a) = all.or(half) {
        let started = if all.is_some() {
            instances as f64
        } else {
            instances as f64 / 2.0
        };
        println!(
            "  scheduling throughput: {:.0} instances started per second",
            started / a
        );
    }
    lat2.print();
    println!("  control plane: {:.1} CPU s in this phase", cpu2 - cpu1);
    println!(
        "\ncontrol plane total: {:.1} CPU s, peak RSS {rss2:.0} MiB; load average {}",
        cpu2 - cpu0,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for a in agents {
        a.stop().await;
    }
    let _ = child.kill().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.first().map(String::as_str) == Some("control") {
        let (Some(dir), Some(url_file)) = (args.get(1), args.get(2)) else {
            bail!("usage: sonic-load control DIR URL_FILE");
        };
        return rt.block_on(control(Path::new(dir), Path::new(url_file)));
    }
    rt.block_on(drive(&args))
}
