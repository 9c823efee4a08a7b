//! Where the bench's cluster experiments run: `ofctl up`'s cluster in this process (the default),
//! or a cluster of containers that `deploy/cluster.sh up` started (`--cluster containers`),
//! possibly time-dilated (`cluster.sh up --dilation D`, DieCast): what the experiments need of
//! either (a client, job inputs, a description), and how what a dilated cluster measures becomes
//! emulated time (docs/evaluation.md, "The dilated cluster").

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::Value;
use sonic_api::control::{AgentList, ControlHealth, JobSummary};

use crate::client::Client;
use crate::commands::JobInput;
use crate::config;
use crate::up::{AgentView, Cluster, ClusterInfo, ClusterOptions};

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

/// What a job ran, in emulated time: on a cluster dilated by `d`, every time is divided by `d`.
/// The measured cost is VM time only (`cost_usd` of the summary: the catalog price of each VM
/// the job held times how long it held it, and the same for executions a lost agent made it
/// discard; no per-request store charge is in it), so all of it is divided by `d`. A predicted
/// cost also counts the store's requests (`requests_usd` of the plan's prediction), which do not
/// grow with time: only the rest is divided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Emulated {
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// The longest edge's data passing.
    pub edge_s: f64,
    pub predicted_latency_s: Option<f64>,
    pub predicted_cost_usd: Option<f64>,
}

/// `s` in emulated time on a cluster dilated by `d` (>= 1; 1 leaves the figures as they are).
pub fn emulated(s: &JobSummary, d: f64) -> Emulated {
    let d = if d.is_finite() && d >= 1.0 { d } else { 1.0 };
    let latency_s = s.latency_s / d;
    let cost_usd = s.cost_usd / d;
    let predicted = s
        .plan
        .as_ref()
        .map(|p| &p.report["predicted"])
        .filter(|p| p.is_object());
    let number = |v: &Value, k: &str| v[k].as_f64().filter(|x| x.is_finite());
    let predicted_latency_s = predicted
        .and_then(|p| number(p, "latency_s"))
        .map(|l| l / d);
    let predicted_cost_usd = predicted.and_then(|p| {
        let total = number(p, "cost_usd")?;
        let requests = number(p, "requests_usd").unwrap_or(0.0).clamp(0.0, total);
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
    }
}

/// A profiling sample (`--params` shape, as the control plane recorded it) in emulated time:
/// functions' `cold_s` and `hot_s` divided by `d`; bytes, memory and instances stay.
pub fn emulated_sample(measured: &mut Value, d: f64) {
    if !(d.is_finite() && d > 1.0) {
        return;
    }
    if let Some(functions) = measured["functions"].as_object_mut() {
        for f in functions.values_mut() {
            for k in ["cold_s", "hot_s"] {
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
    use sonic_api::control::{EdgeRun, JobPlan};

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
            method: "remote".into(),
            bytes: 10,
            seconds: 2.0,
        }];
        s.plan = predicted.map(|p| JobPlan {
            used: "best".into(),
            notes: Vec::new(),
            report: json!({ "predicted": p }),
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
            Some(json!({"latency_s": 6.0, "cost_usd": 0.0041, "requests_usd": 0.0001})),
        );
        let e = emulated(&s, 4.0);
        assert!(close(e.latency_s, 2.0) && close(e.cost_usd, 0.001) && close(e.edge_s, 0.5));
        assert!(close(e.perf_per_dollar, 1.0 / (2.0 * 0.001)));
        assert!(close(e.predicted_latency_s.unwrap(), 1.5));
        assert!(close(e.predicted_cost_usd.unwrap(), 0.004 / 4.0 + 0.0001));
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
            Some(json!({"latency_s": 6.0, "cost_usd": 0.004})),
        );
        assert!(close(
            emulated(&old, 2.0).predicted_cost_usd.unwrap(),
            0.002
        ));
    }

    #[test]
    fn samples_are_rescaled_in_time_only() {
        let mut m = json!({"functions": {"f": {"memory_mb": 100.0, "cold_s": 4.0, "hot_s": null,
            "instances": 3}}, "edges": [{"from": "f", "to": "g", "bytes": 1000}]});
        emulated_sample(&mut m, 4.0);
        assert_eq!(m["functions"]["f"]["cold_s"], 1.0);
        assert!(m["functions"]["f"]["hot_s"].is_null());
        assert_eq!(m["functions"]["f"]["memory_mb"], 100.0);
        assert_eq!(m["functions"]["f"]["instances"], 3);
        assert_eq!(m["edges"][0]["bytes"], 1000);
    }
}
