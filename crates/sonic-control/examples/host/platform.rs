//! The host platform around the control plane: it opens the object store, builds the
//! [`Runtime`] with its own resource manager ([`OnDemand`]), starts the control plane as a
//! library in this process, registers its machines, then runs a DAG: profiling jobs first (their
//! instances start agents through [`sonic_control::resources::ResourceManager::slot`]), then,
//! once every agent went idle and was stopped, a job planned with what they taught the models
//! (its grant starts agents again). Agents are processes, or containers on a network made for
//! the run ([`Options::containers`]); the control plane then listens on that network's gateway,
//! and every container and the network are removed at the end, whatever happened.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sonic_api::control::{JobStatus, JobSummary};
use sonic_control::{ControlConfig, JobsConfig, Runtime, SystemClock, start_with_jobs};
use sonic_core::catalog::Catalog;
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;

use crate::containers::{ContainerOptions, Containers};
use crate::on_demand::{Event, Launcher, Machine, OnDemand};

/// The VM types of the host's machines, as the planner sees them.
pub const CATALOG: &str = r#"
vm_types:
  - { name: m5.large,   vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge,  vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

/// What the host runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `sonic-agent` binary.
    pub agent_bin: PathBuf,
    /// Where the DAG's lambdas are built (e.g. `target/debug`).
    pub lambda_dir: PathBuf,
    /// Everything the run writes (the control plane's database, the store, the agents).
    pub dir: PathBuf,
    /// The DAG (YAML).
    pub dag: String,
    /// Parameters every job is given (e.g. smaller outputs).
    pub params: Value,
    /// Input sizes of the profiling jobs; the planned job gets the last one.
    pub sizes: Vec<usize>,
    /// An agent nobody held for this long is stopped.
    pub idle: Duration,
    /// How long to wait for a job, or for the agents to stop.
    pub patience: Duration,
    /// Agents as containers of this image (`None`: as processes).
    pub containers: Option<ContainerOptions>,
}

/// What happened.
#[derive(Debug)]
pub struct Outcome {
    /// Every job's summary, in the order they ran (the planned job last).
    pub summaries: Vec<JobSummary>,
    /// What the host did to its agents, in order.
    pub events: Vec<Event>,
    /// How many events had happened when the planned job was submitted.
    pub before_planned: usize,
    /// The agents still running at the end (all were idle long enough to stop: none).
    pub running_at_end: Vec<String>,
    /// Agents as containers: the run's id (label `sonic.host.run`) and its network's name, both
    /// removed by now.
    pub containers: Option<(String, String)>,
}

/// The inventory: machines the host can start agents on.
pub fn machines() -> Vec<Machine> {
    let m = |id: &str, vm_type: &str, vcpus: u32, memory_mb: u64| Machine {
        id: id.into(),
        vm_type: vm_type.into(),
        vcpus,
        memory_mb,
    };
    vec![
        m("host-1", "m5.large", 2, 8192),
        m("host-2", "m5.large", 2, 8192),
        m("host-3", "m5.xlarge", 4, 16384),
    ]
}

/// A secret for this run (32 hex digits).
fn secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Runs the whole scenario (see the module's documentation).
pub async fn run(opts: &Options) -> anyhow::Result<Outcome> {
    let containers = match &opts.containers {
        Some(c) => Some(Arc::new(
            Containers::setup(c.clone())
                .await
                .map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let outcome = run_with(opts, containers.clone()).await;
    let Some(c) = containers else {
        return outcome;
    };
    // Whatever happened: the run's containers and its network go (dropping the last handle
    // would too, but here the error is seen).
    let cleaned = c.cleanup().await;
    let mut outcome = outcome?;
    cleaned.map_err(|e| anyhow::anyhow!("cleaning up: {e}"))?;
    let left = c.leftovers().await.map_err(anyhow::Error::msg)?;
    if !left.is_empty() {
        bail!("left after cleaning up: {}", left.join(", "));
    }
    outcome.containers = Some((c.run.clone(), c.network.clone()));
    Ok(outcome)
}

async fn run_with(opts: &Options, containers: Option<Arc<Containers>>) -> anyhow::Result<Outcome> {
    let store_dir = opts.dir.join("store");
    let store = Arc::new(LocalStore::new(&store_dir).context("object store")?);
    let catalog = Catalog::from_yaml(CATALOG).context("catalog")?;
    let (api_token, agent_token, file_key) = (secret(), secret(), secret());
    // Containers reach the control plane (their reports) at the host's address on their
    // network; processes at loopback.
    let listen = match &containers {
        Some(c) => SocketAddr::from((c.gateway, 0)),
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
    };

    let manager = OnDemand::new(
        machines(),
        Launcher {
            agent_bin: opts.agent_bin.clone(),
            lambda_dirs: vec![opts.lambda_dir.clone()],
            data_dir: opts.dir.join("agents"),
            store_dir,
            agent_token: agent_token.clone(),
            file_key: file_key.clone(),
            start_timeout: Duration::from_secs(30),
            containers,
        },
        opts.idle,
    )?;
    let jobs = JobsConfig::new(agent_token.clone(), file_key.into_bytes());
    let runtime =
        Runtime::new(store.clone(), Some(catalog), jobs).with_resources(Arc::new(manager.clone()));
    let config = ControlConfig {
        listen,
        data_dir: opts.dir.join("control"),
        token: api_token.clone(),
        ..ControlConfig::default()
    };
    let control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
        .await
        .context("start the control plane")?;
    let url = control.url();
    let beat = (opts.idle / 2).min(Duration::from_secs(2));
    let background = match manager.keep_registered(&url, &agent_token, beat).await {
        Ok(b) => b,
        Err(e) => {
            control.stop().await;
            bail!(e);
        }
    };

    let api = Api {
        http: reqwest::Client::new(),
        store: store.clone(),
        url,
        token: api_token,
    };
    let outcome = scenario(&api, &manager, opts).await;
    control.stop().await;
    background.abort();
    manager.stop_all().await;
    outcome
}

async fn scenario(api: &Api, manager: &OnDemand, opts: &Options) -> anyhow::Result<Outcome> {
    api.apply(&opts.dag).await?;
    let dag_name = sonic_core::dag::Dag::from_yaml("dag.yaml", &opts.dag)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .name;
    let mut summaries = Vec::new();
    for &n in &opts.sizes {
        let id = api.submit(&dag_name, n, &opts.params, None).await?;
        let s = api.wait(&id, opts.patience).await?;
        if s.status != JobStatus::Succeeded {
            bail!(
                "profiling job {id} ended {:?}: {}",
                s.status,
                s.error.as_deref().unwrap_or("no error given")
            );
        }
        summaries.push(s);
    }
    wait_all_stopped(manager, opts.patience).await?;
    let before_planned = manager.events().len();
    let last = opts.sizes.last().copied().unwrap_or(1000);
    // Planned with what the profiling jobs taught the models, converged or not yet.
    let id = api
        .submit(&dag_name, last, &opts.params, Some("sonic"))
        .await?;
    summaries.push(api.wait(&id, opts.patience).await?);
    wait_all_stopped(manager, opts.patience).await?;
    Ok(Outcome {
        summaries,
        events: manager.events(),
        before_planned,
        running_at_end: manager.running(),
        containers: None,
    })
}

/// Polls until no agent runs (the idle ones were stopped), within `patience`.
async fn wait_all_stopped(manager: &OnDemand, patience: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + patience;
    while !manager.running().is_empty() {
        if Instant::now() > deadline {
            bail!("agents still running: {:?}", manager.running());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The control plane's HTTP API, as the host's users call it.
struct Api {
    http: reqwest::Client,
    store: Arc<LocalStore>,
    url: String,
    token: String,
}

impl Api {
    async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let r = self
            .http
            .put(format!("{}/v1/dags", self.url))
            .bearer_auth(&self.token)
            .header("content-type", "application/yaml")
            .body(yaml.to_owned())
            .send()
            .await?;
        if !r.status().is_success() {
            bail!(
                "apply: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    async fn submit(
        &self,
        dag: &str,
        bytes: usize,
        params: &Value,
        policy: Option<&str>,
    ) -> anyhow::Result<String> {
        // The host's users put inputs straight into the store the control plane reads.
        let key = format!("inputs/{dag}-{bytes}.bin");
        let input: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
        self.store.put_bytes(&key, input.into()).await?;
        let mut body = json!({
            "dag": dag,
            "params": params,
            "input": { "name": "data.bin", "key": key },
        });
        if let Some(p) = policy {
            body["policy"] = json!(p);
        }
        let r = self
            .http
            .post(format!("{}/v1/jobs", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        if r.status() != 202 {
            bail!(
                "submit: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        let v: Value = r.json().await?;
        v["job_id"]
            .as_str()
            .map(str::to_owned)
            .context("no job_id in the answer")
    }

    async fn wait(&self, id: &str, patience: Duration) -> anyhow::Result<JobSummary> {
        let deadline = Instant::now() + patience;
        loop {
            let r = self
                .http
                .get(format!("{}/v1/jobs/{id}", self.url))
                .bearer_auth(&self.token)
                .send()
                .await?
                .error_for_status()?;
            let s: JobSummary = r.json().await?;
            if s.status.is_terminal() {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("job {id} did not end within {patience:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
