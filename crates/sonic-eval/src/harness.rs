//! Where the bench's cluster experiments run: `ofctl up`'s cluster in this process (the default),
//! or a cluster of containers that `deploy/cluster.sh up` started (`--cluster containers`),
//! possibly time-dilated (`cluster.sh up --dilation D`, DieCast): what the experiments need of
//! either (a client, job inputs, a description), and how what a dilated cluster measures becomes
//! emulated time (docs/evaluation.md, "The dilated cluster").

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::Value;
use sonic_api::control::{AgentList, ControlHealth, JobSummary};

use sonic_cluster::client::Client;
use sonic_cluster::cluster::{AgentView, Cluster, ClusterInfo, ClusterOptions};
use sonic_cluster::config;
use sonic_cluster::jobs::JobInput;

/// Which cluster the bench's cluster experiments run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClusterKind {
    /// `ofctl up`'s cluster, started in this process for the run (agents share its cores;
    /// compute is not emulated).
    #[default]
    InProcess,
    /// The cluster of containers `deploy/cluster.sh up` started, reached through the context it
    /// saved (or `--server`, `SONIC_TOKEN`); its dilation factor is the one its control plane
    /// reports.
    Containers,
}

/// The cluster the experiments run on.
pub enum Harness {
    /// Started here, stopped at the end.
    InProcess(Cluster),
    /// Running already; left running.
    Remote {
        client: Client,
        info: ClusterInfo,
        dilation: f64,
    },
}

impl Harness {
    /// Starts `ofctl up`'s cluster in this process.
    pub async fn start(options: ClusterOptions) -> anyhow::Result<Harness> {
        let mut note = |line: &str| eprintln!("{line}");
        Ok(Harness::InProcess(
            Cluster::start(options, &mut note).await?,
        ))
    }

    /// The running cluster of containers at `server` (else the saved context). `dilation`, when
    /// given, must be the factor the control plane reports (a guard against reading a cluster
    /// of another factor).
    pub async fn connect(server: Option<&str>, dilation: Option<f64>) -> anyhow::Result<Harness> {
        let target = config::resolve(server)?;
        let client = Client::new(target.clone())?;
        let health: ControlHealth = client
            .get("/v1/health")
            .await
            .with_context(|| format!("the control plane at {} does not answer", target.server))?;
        let reported = health.dilation;
        if let Some(d) = dilation
            && (d - reported).abs() > 1e-9 * d.max(1.0)
        {
            bail!(
                "--dilation {d}, but the cluster at {} runs at dilation {reported} (bash deploy/cluster.sh status)",
                target.server
            );
        }
        let list: AgentList = client.get("/v1/agents").await?;
        let agents: Vec<AgentView> = list
            .agents
            .iter()
            .filter(|a| a.alive)
            .map(|a| AgentView {
                agent_id: a.agent_id.clone(),
                vm_type: a.vm_type.clone(),
                vcpus: a.capacity.vcpus,
                memory_mb: a.capacity.memory_mb,
                network_mbps: a.capacity.network_mbps.unwrap_or(0.0),
                url: a.url.clone(),
            })
            .collect();
        if agents.is_empty() {
            bail!("the cluster at {} has no alive agent", target.server);
        }
        let sandbox = list
            .agents
            .iter()
            .find(|a| a.alive)
            .map(|a| a.capacity.sandbox.clone())
            .unwrap_or_default();
        let info = ClusterInfo {
            server: target.server.clone(),
            sandbox,
            sandbox_reason: "the container cluster's agents".into(),
            store: "s3".into(),
            store_location: "the cluster's own store (sonic-store)".into(),
            store_reason: "deploy/cluster.sh".into(),
            data_dir: PathBuf::new(),
            lambdas: None,
            openlambda: None,
            agents,
        };
        Ok(Harness::Remote {
            client,
            info,
            dilation: reported,
        })
    }

    pub fn client(&self) -> anyhow::Result<Client> {
        match self {
            Harness::InProcess(c) => c.client(),
            Harness::Remote { client, .. } => Ok(client.clone()),
        }
    }

    pub fn info(&self) -> &ClusterInfo {
        match self {
            Harness::InProcess(c) => &c.info,
            Harness::Remote { info, .. } => info,
        }
    }

    /// The cluster's time dilation factor (1: none).
    pub fn dilation(&self) -> f64 {
        match self {
            Harness::InProcess(_) => 1.0,
            Harness::Remote { dilation, .. } => *dilation,
        }
    }

    /// A job input: put into the store under `key` once (in process), or a file under
    /// `scratch` named `name` sent with every job (a cluster of containers, whose store is not
    /// reachable from here). The caller keeps what this returns for the next jobs.
    pub async fn input(
        &self,
        key: &str,
        name: &str,
        data: &[u8],
        scratch: &Path,
    ) -> anyhow::Result<JobInput> {
        match self {
            Harness::InProcess(c) => {
                c.put_input(key, data, scratch).await?;
                Ok(JobInput::Key {
                    key: key.to_owned(),
                    name: name.to_owned(),
                })
            }
            Harness::Remote { .. } => {
                let dir = scratch.join(key.replace('/', "_"));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let path = dir.join(name);
                std::fs::write(&path, data)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                Ok(JobInput::File(path))
            }
        }
    }

    /// Removes the inputs put under `prefix` (in process; a container cluster's jobs keep
    /// theirs with the job).
    pub async fn forget_inputs(&self, prefix: &str) {
        if let Harness::InProcess(c) = self
            && let Err(e) = c.store.delete_prefix(prefix).await
        {
            eprintln!("ofctl bench: cannot delete the bench inputs: {e}");
        }
    }

    /// Stops a cluster started here; leaves a running one as it is.
    pub async fn stop(self) {
        if let Harness::InProcess(c) = self {
            c.stop().await;
        }
    }
}

/// What a job ran, in emulated time. On a cluster dilated by `d` the agents run `d` times slower
/// than their VMs and the control plane does not: it runs at this machine's speed, as it would
/// beside real VMs. So the part of a job when no instance of it was out on an agent (from the
/// job's start to its first dispatch, between one stage's last report and the next stage's
/// first dispatch, after the last report: the control plane's own work, [`control_plane_s`]) is
/// counted as measured, and the rest, the agents' part, is divided by `d`. The measured cost is
/// `cost_usd` of the summary: the catalog price of each VM the job held times how long it held
/// it (and the same for executions a lost agent made it discard), its files kept
/// (`storage_usd`), and the store's requests (`requests_usd`). The requests do not grow with
/// time and count as they are; for the rest, each VM's time, as the instances on it span it, is
/// split the same way (the control plane's part of it as measured, the rest divided by `d`),
/// and the cost scaled by the ratio (the files' keeping, a few millionths of it, with it). A
/// predicted cost also counts the store's requests (`requests_usd` of the plan's prediction),
/// the same way: only the rest is divided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Emulated {
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// The longest edge's data passing.
    pub edge_s: f64,
    pub predicted_latency_s: Option<f64>,
    pub predicted_cost_usd: Option<f64>,
    /// The control plane's part of the job's latency ([`control_plane_s`]), real seconds,
    /// counted undivided in `latency_s`.
    pub control_s: f64,
}

/// When the agents worked for a summary's job, per agent: its instances' `[started_s, ended_s]`
/// intervals (dispatch to report) and its stages' fetches (a receiving agent bringing a stage's
/// inputs before its first batch: agent work, D times slower on a dilated cluster, outside any
/// instance's interval); `None` when an instance lacks its times (a summary recorded before
/// they were measured) or there is none.
fn worked(s: &JobSummary) -> Option<Vec<(&str, f64, f64)>> {
    let mut iv = Vec::with_capacity(s.functions.len() + s.fetches.len());
    for f in &s.functions {
        let (a, b) = (f.started_s?, f.ended_s?);
        if !(a.is_finite() && b.is_finite()) {
            return None;
        }
        iv.push((f.agent.as_str(), a.max(0.0), b.max(a.max(0.0))));
    }
    for f in &s.fetches {
        let (a, b) = (f.started_s, f.ended_s);
        if a.is_finite() && b.is_finite() {
            iv.push((f.agent.as_str(), a.max(0.0), b.max(a.max(0.0))));
        }
    }
    (!iv.is_empty()).then_some(iv)
}

/// The intervals of [`worked`], whatever the agent, sorted and merged.
fn busy(s: &JobSummary) -> Option<Vec<(f64, f64)>> {
    worked(s).map(|w| merged(&w))
}

fn merged(worked: &[(&str, f64, f64)]) -> Vec<(f64, f64)> {
    let mut iv: Vec<(f64, f64)> = worked.iter().map(|&(_, a, b)| (a, b)).collect();
    iv.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(iv.len());
    for (a, b) in iv {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Seconds of `[from, to]` that no interval of `busy` covers.
fn idle_within(busy: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let covered: f64 = busy
        .iter()
        .map(|&(a, b)| (b.min(to) - a.max(from)).max(0.0))
        .sum();
    (to - from - covered).max(0.0)
}

/// The control plane's part of a job's latency, real seconds: the time from the job's start to
/// its end when no instance of it was out on an agent (sent and not yet reported) and no stage
/// fetch was under way: queueing, planning and the first dispatch, the scheduling between
/// stages, finishing the job. 0 when the summary does not say when its instances ran.
pub fn control_plane_s(s: &JobSummary) -> f64 {
    busy(s).map_or(0.0, |b| idle_within(&b, 0.0, s.latency_s.max(0.0)))
}

/// A job's instants in emulated time, as [`emulated`] counts its latency: the time before `t`
/// when no instance was out on an agent as measured, the rest divided by `d`; so the clock at
/// the job's end reads its emulated latency.
#[derive(Debug, Clone)]
pub struct Clock {
    busy: Vec<(f64, f64)>,
    d: f64,
}

impl Clock {
    /// `None` when the summary does not say when its instances ran.
    pub fn of(s: &JobSummary, d: f64) -> Option<Clock> {
        let d = if d.is_finite() && d >= 1.0 { d } else { 1.0 };
        Some(Clock { busy: busy(s)?, d })
    }

    /// `t` seconds after the job started (measured), in emulated time.
    pub fn at(&self, t: f64) -> f64 {
        let t = t.max(0.0);
        let idle = idle_within(&self.busy, 0.0, t).min(t);
        idle + (t - idle) / self.d
    }
}

/// `s` in emulated time on a cluster dilated by `d` (>= 1; 1 leaves the figures as they are).
pub fn emulated(s: &JobSummary, d: f64) -> Emulated {
    let d = if d.is_finite() && d >= 1.0 { d } else { 1.0 };
    let worked = worked(s);
    let merged = worked.as_deref().map(merged);
    let control_s = merged
        .as_ref()
        .map_or(0.0, |b| idle_within(b, 0.0, s.latency_s.max(0.0)))
        .min(s.latency_s.max(0.0));
    // Measured time t of which `c` is the control plane's: c + (t - c) / d.
    let split = |t: f64, c: f64| c + (t - c) / d;
    let latency_s = split(s.latency_s, control_s);
    // Each VM's time, as the instances on it span it (per agent: a summary does not say which
    // of an agent's VMs an instance had), split the same way; the cost scales with the total.
    // A stage's fetch holds its agent's VM from the fetch's start (as the job's cost counts it).
    let mut spans: std::collections::BTreeMap<&str, (f64, f64)> = Default::default();
    for &(agent, a, b) in worked.iter().flatten() {
        let e = spans.entry(agent).or_insert((a, b));
        e.0 = e.0.min(a);
        e.1 = e.1.max(b);
    }
    let (held, emulated_held) = spans.values().fold((0.0, 0.0), |(h, e), &(a, b)| {
        let c = merged.as_ref().map_or(0.0, |m| idle_within(m, a, b));
        (h + (b - a), e + split(b - a, c))
    });
    // The store's requests cost the same however slow the cluster: only the rest dilates.
    let requests = s.requests_usd.clamp(0.0, s.cost_usd.max(0.0));
    let timed = s.cost_usd - requests;
    let cost_usd = requests
        + if held > 0.0 {
            timed * emulated_held / held
        } else {
            timed / d
        };
    let predicted = s
        .plan
        .as_ref()
        .and_then(|p| p.report.as_ref())
        .map(|r| r.predicted());
    let number = |x: f64| x.is_finite().then_some(x);
    let predicted_latency_s = predicted.and_then(|p| number(p.latency_s)).map(|l| l / d);
    let predicted_cost_usd = predicted.and_then(|p| {
        let total = number(p.cost_usd)?;
        let requests = number(p.requests_usd).unwrap_or(0.0).clamp(0.0, total);
        Some((total - requests) / d + requests)
    });
    Emulated {
        latency_s,
        cost_usd,
        perf_per_dollar: if latency_s > 0.0 && cost_usd > 0.0 {
            1.0 / (latency_s * cost_usd)
        } else {
            0.0
        },
        edge_s: s.edges.iter().map(|e| e.seconds).fold(0.0, f64::max) / d,
        predicted_latency_s,
        predicted_cost_usd,
        control_s,
    }
}

/// A profiling sample (`--params` shape, as the control plane recorded it) in emulated time:
/// functions' `cold_s`, `hot_s` and `overhead_s` (a wall time per instance, measured on the
/// dilated clock like the others) divided by `d`; bytes, memory and instances stay.
pub fn emulated_sample(measured: &mut Value, d: f64) {
    if !(d.is_finite() && d > 1.0) {
        return;
    }
    if let Some(functions) = measured["functions"].as_object_mut() {
        for f in functions.values_mut() {
            for k in ["cold_s", "hot_s", "overhead_s"] {
                if let Some(x) = f[k].as_f64() {
                    f[k] = Value::from(x / d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sonic_api::control::{EdgeRun, FunctionRun, JobPlan};

    fn summary(latency: f64, cost: f64, predicted: Option<Value>) -> JobSummary {
        let mut s: JobSummary = serde_json::from_value(json!({
            "job_id": "j-1", "dag": "d", "status": "succeeded", "policy": "sonic",
            "mode": "planned", "input_bytes": 1, "latency_s": latency, "cost_usd": cost,
            "perf_per_dollar": 1.0 / (latency * cost), "edges": [], "functions": [], "outputs": []
        }))
        .expect("a summary");
        s.edges = vec![EdgeRun {
            from: "a".into(),
            to: "b".into(),
            method: sonic_core::model::Method::Remote,
            bytes: 10,
            seconds: 2.0,
        }];
        s.plan = predicted.map(|p| JobPlan {
            used: sonic_api::control::PlanUsed::Best,
            notes: Vec::new(),
            report: Some(
                serde_json::from_value(json!({
                    "dag": "d", "policy": "sonic", "stages": [], "edges": [],
                    "predicted": p,
                }))
                .expect("a plan report"),
            ),
            stages: Vec::new(),
            exact: None,
        });
        s
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn times_and_vm_costs_are_divided_requests_are_not() {
        let s = summary(
            8.0,
            0.004,
            Some(
                json!({"latency_s": 6.0, "cost_usd": 0.0041, "perf_per_dollar": 40.0, "requests_usd": 0.0001}),
            ),
        );
        let e = emulated(&s, 4.0);
        assert!(close(e.latency_s, 2.0) && close(e.cost_usd, 0.001) && close(e.edge_s, 0.5));
        assert!(close(e.perf_per_dollar, 1.0 / (2.0 * 0.001)));
        assert!(close(e.predicted_latency_s.unwrap(), 1.5));
        assert!(close(e.predicted_cost_usd.unwrap(), 0.004 / 4.0 + 0.0001));
        // The measured cost's store requests are not divided either.
        let mut with_requests = s.clone();
        with_requests.cost_usd = 0.0041;
        with_requests.requests_usd = 0.0001;
        let e = emulated(&with_requests, 4.0);
        assert!(close(e.cost_usd, 0.004 / 4.0 + 0.0001), "{}", e.cost_usd);
        // Not dilated: as reported.
        let e = emulated(&s, 1.0);
        assert!(close(e.latency_s, 8.0) && close(e.predicted_cost_usd.unwrap(), 0.0041));
        // No plan: no prediction; an old report without requests_usd is divided whole.
        assert_eq!(
            emulated(&summary(8.0, 0.004, None), 2.0).predicted_cost_usd,
            None
        );
        let old = summary(
            8.0,
            0.004,
            Some(json!({"latency_s": 6.0, "cost_usd": 0.004, "perf_per_dollar": 40.0})),
        );
        assert!(close(
            emulated(&old, 2.0).predicted_cost_usd.unwrap(),
            0.002
        ));
    }

    fn run(agent: &str, started: f64, ended: f64) -> FunctionRun {
        FunctionRun {
            reused: false,
            cpus: None,
            name: "f".into(),
            instance: 0,
            agent: agent.into(),
            vm_type: "m5.large".into(),
            cold: false,
            seconds: ended - started,
            start_latency_s: None,
            start_contention: None,
            peak_memory_mb: None,
            attempts: 1,
            started_s: Some(started),
            ended_s: Some(ended),
        }
    }

    #[test]
    fn the_control_planes_part_is_counted_as_measured() {
        // 10 s measured at D = 4: nothing out on an agent during [0, 1], [4, 5] and [9, 10]
        // (3 s of the control plane's), instances on a over [1, 4] and [5, 9], on b over
        // [1, 3.5] and [2, 4].
        let mut s = summary(10.0, 0.008, None);
        s.functions = vec![
            run("a", 1.0, 4.0),
            run("b", 1.0, 3.5),
            run("b", 2.0, 4.0),
            run("a", 5.0, 9.0),
        ];
        assert!(close(control_plane_s(&s), 3.0));
        let e = emulated(&s, 4.0);
        assert!(close(e.control_s, 3.0));
        assert!(close(e.latency_s, 3.0 + 7.0 / 4.0), "{}", e.latency_s);
        // a held [1, 9] (1 s of it the control plane's), b [1, 4] (none): 11 s of VM time
        // become 1 + 7 / 4 + 3 / 4 s.
        let want = 0.008 * (1.0 + 7.0 / 4.0 + 3.0 / 4.0) / 11.0;
        assert!(close(e.cost_usd, want), "{} vs {want}", e.cost_usd);
        assert!(close(e.perf_per_dollar, 1.0 / (e.latency_s * e.cost_usd)));
        // Not dilated: as measured.
        let e = emulated(&s, 1.0);
        assert!(close(e.latency_s, 10.0) && close(e.cost_usd, 0.008));
        // A stage's fetch on a over [4, 5], before its second instance was sent: agent work,
        // divided too (the control plane's part is now [0, 1] and [9, 10]).
        s.fetches = vec![sonic_api::control::FetchRun {
            function: "f".into(),
            agent: "a".into(),
            started_s: 4.0,
            ended_s: 5.0,
            bytes: 1,
        }];
        assert!(close(control_plane_s(&s), 2.0));
        let e = emulated(&s, 4.0);
        assert!(close(e.latency_s, 2.0 + 8.0 / 4.0), "{}", e.latency_s);
        s.fetches.clear();
        // Instances without their times: all of it divided.
        s.functions[0].started_s = None;
        assert_eq!(control_plane_s(&s), 0.0);
        let e = emulated(&s, 4.0);
        assert!(close(e.latency_s, 2.5) && close(e.cost_usd, 0.002));
    }

    #[test]
    fn samples_are_rescaled_in_time_only() {
        let mut m = json!({"functions": {"f": {"memory_mb": 100.0, "cold_s": 4.0, "hot_s": null,
            "instances": 3, "overhead_s": 0.8}}, "edges": [{"from": "f", "to": "g", "bytes": 1000}]});
        emulated_sample(&mut m, 4.0);
        assert_eq!(m["functions"]["f"]["cold_s"], 1.0);
        assert!(m["functions"]["f"]["hot_s"].is_null());
        // The per-instance overhead is a time too (it was left dilated before).
        assert_eq!(m["functions"]["f"]["overhead_s"], 0.2);
        assert_eq!(m["functions"]["f"]["memory_mb"], 100.0);
        assert_eq!(m["functions"]["f"]["instances"], 3);
        assert_eq!(m["edges"][0]["bytes"], 1000);
    }
}
