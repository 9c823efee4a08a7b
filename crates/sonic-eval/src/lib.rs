//! Sonic's evaluation (what `ofctl bench` runs): the SONIC paper's experiments on an emulated
//! cluster on this machine, and at the paper's scale in the simulator (docs/evaluation.md).
//! Writes CSV, SVG charts ([`charts`]) and a markdown report into the output folder.
//!
//! On the emulated cluster (`sonic-cluster`'s, as `ofctl up` starts it: agents standing for the catalog's VM types,
//! each limited to its type's bandwidth; the store answering with the catalog's request latency
//! and per-connection throughput): each application is profiled at varied input sizes (Fig. 10
//! is computed from those samples), then measured under every policy (Fig. 7), the ML pipeline
//! at fanouts 1, 3 and 12 (Fig. 2), a broadcast edge under `direct` and `remote` on two VM types
//! (Fig. 6); the simulator reruns the lone jobs with the measured parameters (its error against
//! the real runs) and runs the paper-scale experiments (Fig. 6, 9, 14, 15).

pub mod apps;
pub mod charts;
pub mod explain;
pub mod fig10;
pub mod harness;
pub mod predictions;
pub mod report;
pub mod sim;
pub mod stats;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, anyhow};
use serde_json::Value;
use sonic_api::control::{DagModelsView, JobMode, JobStatus, JobSummary};
use sonic_core::catalog::Catalog;

use apps::App;
use harness::{ClusterKind, Harness};
use sonic_cluster::client::{Client, encode};
use sonic_cluster::jobs::{self, JobInput, JobRequest};
use sonic_cluster::progress::Progress;
use sonic_cluster::{Cluster, ClusterInfo, ClusterOptions};

/// The experiments `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Experiment {
    /// Profiling (and Fig. 10 from it), Fig. 7 with the overhead, the simulator's validation.
    Fig7,
    /// The ML pipeline at fanout 1, 3, 12 (needs fig7's profiling; runs it when absent).
    Fig2,
    /// direct vs remote on a broadcast edge, two VM types.
    Fig6,
    /// The simulator's paper-scale experiments (Fig. 6, 9, 14, 15).
    Sim,
    /// The dilation check's run on one cluster: mapreduce-sort at one size, forced `remote` and
    /// `direct` (deploy/dilation-check.sh runs it at several factors and compares).
    Dilation,
    /// Profiling only, as the other experiments start: each application until its models
    /// converge (or the cap); prints how many jobs each needed and every model's error.
    Profile,
    /// No cluster: the simulator's validation again, from the `validation-inputs.json` a run
    /// saved in `--out`; rewrites that folder's `validation.csv` and prints the table.
    Validate,
}

/// How much the harness runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A few minutes: fewer sizes, fanouts and repetitions.
    pub quick: bool,
    pub out_dir: PathBuf,
    /// Where the clusters started here keep their files (each in a folder of its own under it);
    /// `None`: a temporary folder, removed at the end.
    pub data_dir: Option<PathBuf>,
    /// Empty: every experiment but `dilation`.
    pub only: Vec<Experiment>,
    /// Seeds the random order of the policies in each round and the bootstrap intervals; the
    /// report names it.
    pub seed: u64,
    /// Where the cluster experiments run.
    pub cluster: ClusterKind,
    /// The container cluster's URL (else the saved context).
    pub server: Option<String>,
    /// The container cluster's dilation factor, when the caller wants it checked.
    pub dilation: Option<f64>,
    /// Repetitions per policy of the dilation check.
    pub dilation_reps: usize,
    /// Only these applications (by name; empty: all of [`apps::apps`]).
    pub apps: Vec<String>,
    /// Run Fig. 7's cells even where a policy's plan does not fit the cluster ([`fits`]).
    pub allow_squeezed: bool,
}

impl BenchOptions {
    fn wants(&self, e: Experiment) -> bool {
        if matches!(
            e,
            Experiment::Dilation | Experiment::Profile | Experiment::Validate
        ) {
            return self.only.contains(&e);
        }
        self.only.is_empty() || self.only.contains(&e)
    }

    /// The applications to run: [`apps::apps`], or those `--app` named, in that order.
    fn apps(&self) -> Vec<apps::App> {
        apps::apps()
            .into_iter()
            .filter(|a| self.apps.is_empty() || self.apps.iter().any(|n| n == a.name))
            .collect()
    }

    /// (training sizes, held-out sizes, rounds) of the application runs: every comparison of
    /// policies runs at least [`stats::MIN_ROUNDS`] rounds, quick or not.
    fn scale(&self) -> (usize, usize, usize) {
        if self.quick {
            (6, 2, stats::MIN_ROUNDS)
        } else {
            (12, 4, stats::MIN_ROUNDS)
        }
    }
}

/// The static policies (baselines); `sonic` and `oracle` are planned.
pub const STATIC: [&str; 3] = ["remote", "local", "direct"];
/// Fig. 7's policies, in the report's order.
pub const FIG7_POLICIES: [&str; 5] = ["remote", "local", "direct", "sonic", "oracle"];
/// Fig. 2's.
pub const FIG2_POLICIES: [&str; 4] = ["remote", "local", "direct", "sonic"];

/// One measured job.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `fig7`, `fig2` or `fig6`.
    pub experiment: String,
    pub app: String,
    /// What varies within the experiment (`trees=3`, `m5.large k=4`); empty for Fig. 7.
    pub variant: String,
    pub policy: String,
    pub job_id: String,
    pub mode: String,
    pub input_bytes: u64,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    pub methods: String,
    pub plan_used: String,
    /// A planned job's placement: `function:VM type x VMs/concurrent per VM`, space-separated.
    pub placement: String,
    /// The longest edge's data-passing time the job summary reports (seconds).
    pub edge_s: f64,
    /// The planner's own time for a planned job (µs; 0 when not planned; the control plane's
    /// own time, not dilated).
    pub planning_us: f64,
    /// What the plan predicted (emulated time, as the measured figures); `None` without a plan.
    pub predicted_latency_s: Option<f64>,
    pub predicted_cost_usd: Option<f64>,
    /// The time dilation factor of the cluster the job ran on (1: none). Latency, cost, Perf/$,
    /// edge time and the predictions above are already the emulated ones (divided by it:
    /// [`harness::emulated`]).
    pub dilation: f64,
    /// The most VMs one stage of the job's plan asked for, before the resource manager's pool
    /// limited it (`PlanReport::asked`); `None` without a plan.
    pub vms_planned: Option<u32>,
    /// The distinct agents the job's instances ran on.
    pub vms_run: u32,
    /// The stages that ran on fewer distinct agents than their plan asked VMs for
    /// (`map:30>4`, space-separated): a plan squeezed onto the cluster, a testbed error.
    pub squeezed: String,
}

/// (`vms_planned`, `vms_run`, `squeezed`) of a job: what its plan asked for against what it ran on.
pub fn vms_of(s: &JobSummary) -> (Option<u32>, u32, String) {
    let asked = s
        .plan
        .as_ref()
        .and_then(|p| p.report.as_ref())
        .map(|r| r.asked());
    let agents = |function: Option<&str>| {
        s.functions
            .iter()
            .filter(|f| function.is_none_or(|n| f.name == n))
            .map(|f| f.agent.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u32
    };
    let vms_planned = asked
        .as_ref()
        .map(|p| p.stages.iter().map(|st| st.vms).max().unwrap_or(0));
    let squeezed = asked
        .map(|p| {
            p.stages
                .iter()
                .filter_map(|st| {
                    let ran = agents(Some(&st.function));
                    (ran < st.vms).then(|| format!("{}:{}>{}", st.function, st.vms, ran))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    (vms_planned, agents(None), squeezed)
}

impl Row {
    /// The job's row, its times and costs in emulated time (`dilation` >= 1: the factor of the
    /// cluster it ran on).
    pub fn from_summary(
        experiment: &str,
        variant: &str,
        policy: &str,
        s: &JobSummary,
        dilation: f64,
    ) -> Row {
        let e = harness::emulated(s, dilation);
        let (vms_planned, vms_run, squeezed) = vms_of(s);
        Row {
            experiment: experiment.into(),
            app: s.dag.clone(),
            variant: variant.into(),
            policy: policy.into(),
            job_id: s.job_id.clone(),
            mode: s.mode.to_string(),
            input_bytes: s.input_bytes,
            latency_s: e.latency_s,
            cost_usd: e.cost_usd,
            perf_per_dollar: e.perf_per_dollar,
            methods: s
                .edges
                .iter()
                .map(|e| format!("{}->{}:{}", e.from, e.to, e.method))
                .collect::<Vec<_>>()
                .join(" "),
            plan_used: s
                .plan
                .as_ref()
                .map(|p| p.used.to_string())
                .unwrap_or_default(),
            placement: s
                .plan
                .as_ref()
                .map(|p| {
                    p.stages
                        .iter()
                        .map(|h| {
                            format!(
                                "{}:{}x{}/c{}",
                                h.function,
                                h.vm_type,
                                h.agents.len(),
                                h.concurrent
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default(),
            edge_s: e.edge_s,
            planning_us: s
                .plan
                .as_ref()
                .and_then(|p| p.report.as_ref())
                .map_or(0.0, |r| r.plan.planning_time_us as f64),
            predicted_latency_s: e.predicted_latency_s,
            predicted_cost_usd: e.predicted_cost_usd,
            dilation: if dilation.is_finite() && dilation >= 1.0 {
                dilation
            } else {
                1.0
            },
            vms_planned,
            vms_run,
            squeezed,
        }
    }
}

/// One (experiment, application, variant, policy) cell: means over its jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub experiment: String,
    pub app: String,
    pub variant: String,
    pub policy: String,
    pub jobs: usize,
    pub latency_s: f64,
    /// Standard deviation of the jobs' latencies (0 with one job).
    pub latency_sd: f64,
    pub cost_usd: f64,
    /// `1 / (mean latency x mean cost)`, the paper's Perf/$.
    pub perf_per_dollar: f64,
    /// Perf/$ over the best static policy's in the same group (1 for the best static).
    pub ratio_to_best_static: f64,
    /// The 95% bootstrap interval of that ratio (`None` for the best static policy itself, and
    /// with fewer than two jobs in either cell).
    pub ratio_ci: Option<stats::Interval>,
    pub edge_s: f64,
}

/// Means per cell, in first-seen group order and the policies in [`FIG7_POLICIES`]'s order
/// (others after, first seen first); intervals seeded with 0 (see [`aggregate_seeded`]).
pub fn aggregate(rows: &[Row]) -> Vec<Cell> {
    aggregate_seeded(rows, 0)
}

/// Means per cell, and each cell's ratio to the best static policy of its group with its 95%
/// bootstrap interval (resamples seeded from `seed` and the cell's name).
pub fn aggregate_seeded(rows: &[Row], seed: u64) -> Vec<Cell> {
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    let mut policies: Vec<&str> = Vec::new();
    for r in rows {
        let g = (r.experiment.as_str(), r.app.as_str(), r.variant.as_str());
        if !groups.contains(&g) {
            groups.push(g);
        }
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    // The rounds ran the policies in random orders: the tables keep the report's order.
    policies.sort_by_key(|p| {
        FIG7_POLICIES
            .iter()
            .position(|q| q == p)
            .unwrap_or(FIG7_POLICIES.len())
    });
    let mut cells = Vec::new();
    for (e, app, variant) in groups {
        let mut mine = Vec::new();
        for p in &policies {
            let rs: Vec<&Row> = rows
                .iter()
                .filter(|r| {
                    r.experiment == e && r.app == app && r.variant == variant && r.policy == *p
                })
                .collect();
            if rs.is_empty() {
                continue;
            }
            let n = rs.len() as f64;
            let lat = rs.iter().map(|r| r.latency_s).sum::<f64>() / n;
            let sd = (rs.iter().map(|r| (r.latency_s - lat).powi(2)).sum::<f64>() / n).sqrt();
            let cost = rs.iter().map(|r| r.cost_usd).sum::<f64>() / n;
            let edge = rs.iter().map(|r| r.edge_s).sum::<f64>() / n;
            mine.push(Cell {
                experiment: e.to_owned(),
                app: app.to_owned(),
                variant: variant.to_owned(),
                policy: (*p).to_owned(),
                jobs: rs.len(),
                latency_s: lat,
                latency_sd: sd,
                cost_usd: cost,
                perf_per_dollar: stats::perf_per_dollar(&measures(&rs)),
                ratio_to_best_static: 0.0,
                ratio_ci: None,
                edge_s: edge,
            });
        }
        let best = mine
            .iter()
            .filter(|c| STATIC.contains(&c.policy.as_str()))
            .max_by(|a, b| a.perf_per_dollar.total_cmp(&b.perf_per_dollar))
            .map(|c| (c.policy.clone(), c.perf_per_dollar));
        let jobs_of = |p: &str| -> Vec<stats::Job> {
            let rs: Vec<&Row> = rows
                .iter()
                .filter(|r| {
                    r.experiment == e && r.app == app && r.variant == variant && r.policy == p
                })
                .collect();
            measures(&rs)
        };
        for c in &mut mine {
            let Some((best_policy, best)) = &best else {
                continue;
            };
            c.ratio_to_best_static = if *best > 0.0 {
                c.perf_per_dollar / best
            } else {
                0.0
            };
            if c.policy != *best_policy {
                let name = format!("{e}/{app}/{variant}/{}/{best_policy}", c.policy);
                c.ratio_ci = stats::ratio_interval(
                    &jobs_of(&c.policy),
                    &jobs_of(best_policy),
                    stats::seed_for(seed, &name),
                );
            }
        }
        cells.extend(mine);
    }
    cells
}

fn measures(rows: &[&Row]) -> Vec<stats::Job> {
    rows.iter()
        .map(|r| stats::Job {
            latency_s: r.latency_s,
            cost_usd: r.cost_usd,
        })
        .collect()
}

/// The measured jobs as CSV (header first).
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "experiment,app,variant,policy,job_id,mode,input_bytes,latency_s,cost_usd,perf_per_dollar,edge_s,planning_us,methods,plan_used,placement,predicted_latency_s,predicted_cost_usd,dilation,vms_planned,vms_run,squeezed\n",
    );
    let opt = |v: Option<f64>, digits: usize| v.map_or(String::new(), |x| format!("{x:.digits$}"));
    for r in rows {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{:.4},{:.8},{:.2},{:.4},{:.0},{},{},{},{},{},{},{},{},{}\n",
            r.experiment,
            r.app,
            r.variant,
            r.policy,
            r.job_id,
            r.mode,
            r.input_bytes,
            r.latency_s,
            r.cost_usd,
            r.perf_per_dollar,
            r.edge_s,
            r.planning_us,
            r.methods,
            r.plan_used,
            r.placement,
            opt(r.predicted_latency_s, 4),
            opt(r.predicted_cost_usd, 8),
            r.dilation,
            r.vms_planned.map_or(String::new(), |v| v.to_string()),
            r.vms_run,
            r.squeezed,
        ));
    }
    s
}

/// One profiling job.
#[derive(Debug, Clone, PartialEq)]
pub struct Profiled {
    pub app: String,
    pub job_id: String,
    /// In the application's unit (bytes, rows, seconds).
    pub size: u64,
    pub input_bytes: u64,
    pub held_out: bool,
    pub latency_s: f64,
    pub ok: bool,
}

/// The planner's overhead for one application.
#[derive(Debug, Clone, PartialEq)]
pub struct Overhead {
    pub app: String,
    /// Median round trip of `GET /v1/dags/{name}/plan` (prediction + planning + HTTP), seconds.
    pub route_s: f64,
    /// Mean of the planner's own time in the sonic jobs' plans, seconds.
    pub planner_s: f64,
    /// Mean latency of the sonic jobs.
    pub job_s: f64,
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Results {
    /// The clusters used, by purpose.
    pub clusters: Vec<(String, ClusterInfo)>,
    pub rows: Vec<Row>,
    pub profiled: Vec<Profiled>,
    /// Per application: profiling jobs until the models said converged (None: never).
    pub converged_after: BTreeMap<String, Option<usize>>,
    pub fig10: Vec<fig10::ErrorPoint>,
    pub overhead: Vec<Overhead>,
    pub validation: Vec<sim::ValidationRow>,
    /// What the validation ran with, saved as `validation-inputs.json` (`--only validate`
    /// re-runs it from there).
    pub validation_inputs: Option<sim::ValidationInputs>,
    pub sim: Option<sim::SimResults>,
    pub notes: Vec<String>,
    /// Each application's measured input size (its unit) and bytes.
    pub measured_sizes: BTreeMap<String, (u64, u64)>,
    /// The plan report of the first job of each planned cell: (file name, `ofctl plan -o json`).
    pub plans: Vec<(String, Value)>,
    /// Each application's models after profiling (`GET /v1/dags/{name}/models`, samples left out).
    pub models: BTreeMap<String, DagModelsView>,
    /// Each application's profiling samples (as the control plane recorded them).
    pub samples: BTreeMap<String, Vec<sonic_control::store::SampleRecord>>,
    /// The time dilation factor of the cluster the cluster experiments ran on (1: none, also
    /// before one ran); what is recorded here is already in emulated time.
    pub dilation: f64,
    /// Every measured job's time per stage, predicted and measured (in the order of `rows`;
    /// a job whose summary does not say when its instances ran has none).
    pub times: Vec<explain::JobTimes>,
}

/// `ofctl bench`: every experiment `opts` asks for, then the files of the output folder (their
/// list on `out`). The clusters it starts here take `base`'s agents, catalog, sandbox, store,
/// lambdas and OpenLambda listener; each gets its own data folder, a free port and the emulated
/// store.
pub async fn run(
    base: ClusterOptions,
    opts: BenchOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let temp = tempfile::Builder::new()
        .prefix("sonic-bench-")
        .tempdir()
        .context("cannot make a temporary folder")?;
    let data_dir = opts
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let catalog = match &base.catalog {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Catalog::from_yaml(&text).with_context(|| p.display().to_string())?
        }
        None => Catalog::default(),
    };
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("cannot create {}", opts.out_dir.display()))?;
    let mut results = Results {
        dilation: 1.0,
        ..Results::default()
    };
    if !opts.apps.is_empty() {
        let left_out: Vec<&str> = apps::apps()
            .iter()
            .map(|a| a.name)
            .filter(|n| !opts.apps.iter().any(|x| x == n))
            .collect();
        if !left_out.is_empty() {
            results.notes.push(format!(
                "applications not run (--app): {}",
                left_out.join(", ")
            ));
        }
    }
    if opts.only.contains(&Experiment::Validate) {
        if opts.only.len() > 1 {
            anyhow::bail!(
                "--only validate re-runs a saved run's validation and runs nothing else; give it alone"
            );
        }
        let inputs = sim::read_inputs(&opts.out_dir)?;
        let rows = sim::validate_inputs(&inputs)?;
        let path = opts.out_dir.join("validation.csv");
        let text = sim::validation_csv(&rows);
        std::fs::write(&path, &text).with_context(|| format!("cannot write {}", path.display()))?;
        write!(out, "{text}")?;
        writeln!(out, "wrote {}", path.display())?;
        return Ok(());
    }
    if opts.wants(Experiment::Dilation) {
        let written = dilation_run(&base, &opts, &data_dir, &mut results).await?;
        writeln!(
            out,
            "wrote {} in {:.0} s",
            written.display(),
            started.elapsed().as_secs_f64()
        )?;
        if opts.only.len() == 1 {
            return Ok(());
        }
    }
    if opts.wants(Experiment::Profile) {
        profile_run(&base, &opts, &data_dir.join("profile"), &mut results, out).await?;
        if opts.only.len() == 1 {
            return Ok(());
        }
    }
    let wants_cluster = opts.wants(Experiment::Fig7) || opts.wants(Experiment::Fig2);
    if wants_cluster {
        cluster_experiments(&base, &opts, &catalog, &data_dir.join("main"), &mut results).await?;
    }
    if opts.wants(Experiment::Fig6) && opts.cluster == ClusterKind::Containers {
        results.notes.push(
            "fig6 runs on clusters of one VM type it starts in this process; not run with --cluster containers".into(),
        );
    } else if opts.wants(Experiment::Fig6) {
        for vm in ["m5.large", "m5.xlarge"] {
            if let Err(e) =
                broadcast_experiment(&base, &opts, &catalog, vm, &data_dir, &mut results).await
            {
                results.notes.push(format!("fig6 on {vm}: {e:#}"));
                eprintln!("ofctl bench: fig6 on {vm}: {e:#}");
            }
        }
    }
    if opts.wants(Experiment::Sim) {
        eprintln!("simulator: paper-scale experiments");
        match sim::paper_scale(opts.quick) {
            Ok(s) => results.sim = Some(s),
            Err(e) => results.notes.push(format!("simulator: {e:#}")),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let written = report::write_all(&opts, &results, seconds)?;
    writeln!(
        out,
        "wrote {} files into {} in {seconds:.0} s: {}",
        written.len(),
        opts.out_dir.display(),
        written.join(", ")
    )?;
    Ok(())
}

/// A job the harness submits.
struct Job<'a> {
    dag: &'a str,
    input: Option<JobInput>,
    params: Vec<(String, Value)>,
    policy: Option<&'a str>,
    planned: bool,
}

async fn run_job(client: &Client, job: Job<'_>) -> anyhow::Result<JobSummary> {
    let req = JobRequest {
        revision: None,
        dag: job.dag.into(),
        input: job.input,
        params: job.params,
        policy: job.policy.map(str::to_owned),
        planned: job.planned,
        key: None,
        slo: None,
        slo_best_effort: false,
    };
    let accepted = jobs::submit(client, &req).await?;
    let id = accepted["job_id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST /v1/jobs answered no job_id"))?
        .to_owned();
    let v = jobs::wait_job(client, &id, &mut Progress::new()).await?;
    Ok(serde_json::from_value(v)?)
}

/// Inputs made once per (application, size): put into the store, or kept as files to send.
struct Inputs {
    prefix: String,
    /// Per key: the job input and its size in bytes.
    stored: BTreeMap<String, (JobInput, u64)>,
    dir: PathBuf,
}

impl Inputs {
    /// None made yet: they go under `bench/<this process>/` in the store, or as files into
    /// `dir`.
    fn new(dir: &Path) -> Inputs {
        Inputs {
            prefix: format!("bench/{}/", std::process::id()),
            stored: BTreeMap::new(),
            dir: dir.to_path_buf(),
        }
    }

    /// The job input of `app` at `size`, and its bytes.
    async fn input(
        &mut self,
        cluster: &Harness,
        app: &App,
        size: u64,
    ) -> anyhow::Result<(JobInput, u64)> {
        let key = format!("{}{}/{size}/{}", self.prefix, app.name, app.input_name);
        if let Some(found) = self.stored.get(&key) {
            return Ok(found.clone());
        }
        let data = apps::input(app, size)?;
        let input = cluster
            .input(&key, app.input_name, &data, &self.dir)
            .await?;
        let made = (input, data.len() as u64);
        self.stored.insert(key, made.clone());
        Ok(made)
    }
}

/// `trees=3` -> `trees-3-`; empty stays empty.
pub(crate) fn slug(variant: &str) -> String {
    let s: String = variant
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() { s } else { format!("{s}-") }
}

/// The error on one line (causes joined, newlines folded), at most 300 characters.
fn short(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(300)
        .collect()
}

/// Profiling, Fig. 10, Fig. 7, the overhead, the validation and Fig. 2 on one cluster.
async fn cluster_experiments(
    base: &ClusterOptions,
    opts: &BenchOptions,
    catalog: &Catalog,
    data_dir: &Path,
    results: &mut Results,
) -> anyhow::Result<()> {
    let (cluster, mut inputs) = start_run(base, opts, data_dir, results).await?;
    let outcome = measure_apps(&cluster, opts, catalog, &mut inputs, results).await;
    cluster.forget_inputs(&inputs.prefix).await;
    results.clusters.push((
        "applications (Fig. 2, 7, 10)".into(),
        cluster.info().clone(),
    ));
    cluster.stop().await;
    outcome
}

/// The cluster one run of experiments uses ([`harness`]) and the inputs it makes there (in
/// `data_dir`); its dilation factor goes into `results`.
async fn start_run(
    base: &ClusterOptions,
    opts: &BenchOptions,
    data_dir: &Path,
    results: &mut Results,
) -> anyhow::Result<(Harness, Inputs)> {
    let cluster = harness(base, opts, data_dir).await?;
    results.dilation = cluster.dilation();
    Ok((cluster, Inputs::new(data_dir)))
}

/// `base` for a cluster started here in `data_dir`: any free port, the store emulated per agent.
fn options_in(base: &ClusterOptions, data_dir: &Path) -> ClusterOptions {
    ClusterOptions {
        data_dir: data_dir.to_path_buf(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        emulate_store: true,
        ..base.clone()
    }
}

/// The cluster the options name: `ofctl up`'s, started here in `data_dir` (the store emulated
/// per agent), or the running cluster of containers.
async fn harness(
    base: &ClusterOptions,
    opts: &BenchOptions,
    data_dir: &Path,
) -> anyhow::Result<Harness> {
    match opts.cluster {
        ClusterKind::InProcess => {
            if opts.dilation.is_some_and(|d| d != 1.0) {
                anyhow::bail!(
                    "--dilation is the factor of a cluster of containers (--cluster containers); the in-process cluster is not dilated"
                );
            }
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            Harness::start(options_in(base, data_dir)).await
        }
        ClusterKind::Containers => {
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            let h = Harness::connect(opts.server.as_deref(), opts.dilation).await?;
            eprintln!(
                "bench: the cluster of containers at {} ({} agents, dilation {})",
                h.info().server,
                h.info().agents.len(),
                h.dilation()
            );
            Ok(h)
        }
    }
}

/// The size of the dilation check's mapreduce-sort input (bytes).
pub const DILATION_SORT_BYTES: u64 = 32_000_000;
/// The dilation check's policies (forced, spread over the agents as profiling places them).
pub const DILATION_POLICIES: [&str; 2] = ["remote", "direct"];

/// The dilation check on one cluster: mapreduce-sort at [`DILATION_SORT_BYTES`] under each of
/// [`DILATION_POLICIES`], `dilation_reps` rounds, in emulated time; writes `jobs.csv` (with the
/// cluster's factor in its `dilation` column) into the output folder and returns its path.
async fn dilation_run(
    base: &ClusterOptions,
    opts: &BenchOptions,
    data_dir: &Path,
    results: &mut Results,
) -> anyhow::Result<PathBuf> {
    let dir = data_dir.join("dilation");
    let (cluster, mut inputs) = start_run(base, opts, &dir, results).await?;
    let outcome = async {
        let client = cluster.client()?;
        let app = apps::apps()
            .into_iter()
            .find(|a| a.name == "mapreduce-sort")
            .ok_or_else(|| anyhow!("no mapreduce-sort application"))?;
        jobs::apply_text(&client, app.file, app.yaml.to_owned())
            .await
            .with_context(|| format!("apply {}", app.file))?;
        let (input, _) = inputs.input(&cluster, &app, DILATION_SORT_BYTES).await?;
        let variant = format!("D={}", cluster.dilation());
        let total = opts.dilation_reps * DILATION_POLICIES.len();
        let mut k = 0;
        for _ in 0..opts.dilation_reps {
            for policy in DILATION_POLICIES {
                k += 1;
                let job = Job {
                    dag: app.name,
                    input: Some(input.clone()),
                    params: Vec::new(),
                    policy: Some(policy),
                    planned: false,
                };
                record(
                    &client,
                    job,
                    "dilation",
                    &variant,
                    policy,
                    results,
                    (k, total),
                )
                .await;
            }
        }
        cluster.forget_inputs(&inputs.prefix).await;
        anyhow::Ok(())
    }
    .await;
    results
        .clusters
        .push(("dilation check".into(), cluster.info().clone()));
    cluster.stop().await;
    outcome?;
    for n in &results.notes {
        eprintln!("ofctl bench: {n}");
    }
    let path = opts.out_dir.join("jobs.csv");
    let rows: Vec<Row> = results
        .rows
        .iter()
        .filter(|r| r.experiment == "dilation")
        .cloned()
        .collect();
    if rows.is_empty() {
        anyhow::bail!("the dilation check measured no job (see above)");
    }
    std::fs::write(&path, csv(&rows))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

async fn measure_apps(
    cluster: &Harness,
    opts: &BenchOptions,
    catalog: &Catalog,
    inputs: &mut Inputs,
    results: &mut Results,
) -> anyhow::Result<()> {
    let client = cluster.client()?;
    let (n_train, n_test, reps) = opts.scale();
    let all = opts.apps();
    for app in &all {
        jobs::apply_text(&client, app.file, app.yaml.to_owned())
            .await
            .with_context(|| format!("apply {}", app.file))?;
        let sizes = apps::sizes(app, n_train, n_test);
        profile(cluster, &client, app, &sizes, opts, inputs, results).await?;
    }
    if opts.wants(Experiment::Fig7) {
        for app in &all {
            let sizes = apps::sizes(app, n_train, n_test);
            let (input, bytes) = inputs.input(cluster, app, sizes.measured).await?;
            overhead_route(&client, app, results, bytes).await;
            let policies = gated(&FIG7_POLICIES, app.name, "fig7", results);
            // Every policy on the VMs it asks for, or the cell is not run: a plan squeezed onto
            // fewer VMs measures the testbed, not the policy.
            if !opts.allow_squeezed {
                let agents = agents_by_type(cluster.info());
                if let Err(why) = fit_gate(&client, app.name, bytes, &policies, &agents).await {
                    results.notes.push(format!(
                        "fig7 {}: not run: {why}; a plan squeezed onto fewer VMs measures the testbed, not the policy (--allow-squeezed runs it anyway)",
                        app.name
                    ));
                    continue;
                }
            }
            let total = reps * policies.len();
            let mut k = 0;
            let mut rng =
                stats::Rng::new(stats::seed_for(opts.seed, &format!("fig7/{}", app.name)));
            for _ in 0..reps {
                // A random order in each round: no policy always runs first (cold caches) or
                // right after the same neighbour.
                for policy in stats::shuffled(&policies, &mut rng) {
                    k += 1;
                    let job = Job {
                        dag: app.name,
                        input: Some(input.clone()),
                        params: app.job_params(),
                        policy: forced(policy),
                        planned: STATIC.contains(&policy),
                    };
                    record(&client, job, "fig7", "", policy, results, (k, total)).await;
                }
            }
            finish_overhead(app, results);
        }
        match sim::validate(catalog, cluster.info(), results) {
            Ok((inputs, v)) => {
                results.validation = v;
                results.validation_inputs = Some(inputs);
            }
            Err(e) => results
                .notes
                .push(format!("simulator validation: {}", short(&e))),
        }
    }
    if opts.wants(Experiment::Fig2) {
        let Some(app) = all.iter().find(|a| a.name == "ml-pipeline") else {
            results
                .notes
                .push("fig2 not run: it is the ml-pipeline's, and --app left it out".into());
            return Ok(());
        };
        let sizes = apps::sizes(app, n_train, n_test);
        let (input, _) = inputs.input(cluster, app, sizes.measured).await?;
        // Sonic learns per parameter setting: each `trees` variant is profiled until its own
        // models converge (as Fig. 7's profiling does for the default), and Sonic is measured
        // only at the variants whose jobs then run planned.
        let mut variants = Vec::new();
        for trees in FIG2_TREES {
            let params = vec![("trees".to_owned(), Value::from(trees))];
            let variant = format!("trees={trees}");
            let after = profile_setting(
                cluster, &client, app, &sizes, &params, &variant, opts, inputs, results,
            )
            .await?;
            let policies = gated_setting(&FIG2_POLICIES, app.name, &variant, after, results);
            variants.push((params, variant, policies));
        }
        let reps2 = stats::MIN_ROUNDS;
        let total = reps2 * variants.iter().map(|(_, _, p)| p.len()).sum::<usize>();
        let mut k = 0;
        let mut rng = stats::Rng::new(stats::seed_for(opts.seed, "fig2"));
        for _ in 0..reps2 {
            for (params, variant, policies) in &variants {
                for policy in stats::shuffled(policies, &mut rng) {
                    k += 1;
                    let job = Job {
                        dag: app.name,
                        input: Some(input.clone()),
                        params: params.clone(),
                        policy: forced(policy),
                        planned: STATIC.contains(&policy),
                    };
                    record(&client, job, "fig2", variant, policy, results, (k, total)).await;
                }
            }
        }
    }
    Ok(())
}

/// The agents of each VM type.
pub fn agents_by_type(info: &sonic_cluster::cluster::ClusterInfo) -> BTreeMap<String, u32> {
    let mut by = BTreeMap::new();
    for a in &info.agents {
        *by.entry(a.vm_type.clone()).or_insert(0) += 1;
    }
    by
}

/// Whether a plan's stages fit the cluster: each stage asks for at most as many VMs of its type
/// as the cluster has agents of it. `Err` names the first stage that asks for more. Stages are
/// held against the cluster one at a time: two branches that run at once on one type are not
/// summed (the built-in applications are chains).
pub fn fits(
    stages: &[sonic_core::planner::PlanStage],
    agents: &BTreeMap<String, u32>,
) -> Result<(), String> {
    for st in stages {
        let have = agents.get(&st.vm_type).copied().unwrap_or(0);
        if st.vms > have {
            return Err(format!(
                "{} asks for {} {} VMs, the cluster has {have}",
                st.function, st.vms, st.vm_type
            ));
        }
    }
    Ok(())
}

/// Fig. 7's gate: the plan each of `policies` but `oracle` makes for `app` at `bytes` (the plan
/// route: the policy's plan before any pool limits), held against the cluster's agents
/// ([`fits`]).
async fn fit_gate(
    client: &Client,
    app: &str,
    bytes: u64,
    policies: &[&str],
    agents: &BTreeMap<String, u32>,
) -> Result<(), String> {
    // `oracle` plans from what jobs measured at this very size, which none has yet here; its
    // jobs' `squeezed` column says whether its plans fit.
    for policy in policies.iter().filter(|p| **p != "oracle") {
        let path = format!(
            "/v1/dags/{}/plan?input_bytes={bytes}&policy={policy}",
            encode(app)
        );
        let report: sonic_api::plan::PlanReport = client
            .get(&path)
            .await
            .map_err(|e| format!("{policy}'s plan could not be made: {e}"))?;
        fits(&report.plan.stages, agents).map_err(|why| format!("{policy}'s plan: {why}"))?;
    }
    Ok(())
}

/// Fig. 2's ML pipeline fanouts (the job parameter `trees`).
pub const FIG2_TREES: [u32; 3] = [1, 3, 12];

/// `GET /v1/dags/{name}/models` of the parameter setting jobs with `params` plan with (models
/// are learned per setting).
fn models_path(dag: &str, params: &[(String, Value)]) -> String {
    let map: serde_json::Map<String, Value> = params.iter().cloned().collect();
    format!(
        "/v1/dags/{}/models?params={}",
        encode(dag),
        encode(&Value::Object(map).to_string())
    )
}

/// Whether the view's setting's unforced jobs run planned.
fn runs_planned(m: &DagModelsView) -> bool {
    m.mode.as_ref().is_some_and(|v| v.mode == JobMode::Planned)
}

/// Profiles one parameter setting of `app` (forced `remote`, spread over the agents, at the
/// training sizes in turn) until the setting's unforced jobs run planned, up to the profiling
/// cap. Returns the profiling jobs it took (0: it was planned already), `None` when it never
/// converged; notes either.
#[allow(clippy::too_many_arguments)]
async fn profile_setting(
    cluster: &Harness,
    client: &Client,
    app: &App,
    sizes: &apps::Sizes,
    params: &[(String, Value)],
    variant: &str,
    opts: &BenchOptions,
    inputs: &mut Inputs,
    results: &mut Results,
) -> anyhow::Result<Option<usize>> {
    let cap = if opts.quick { 20 } else { PROFILING_CAP };
    let models_path = models_path(app.name, params);
    let m: DagModelsView = client.get(&models_path).await?;
    if runs_planned(&m) {
        results.notes.push(format!(
            "fig2 {} {variant}: planned already (its models converged before), no profiling job",
            app.name
        ));
        return Ok(Some(0));
    }
    let mut why = None;
    for (n, size) in (1..).zip(sizes.train.iter().cycle().take(cap)) {
        let (input, _) = inputs.input(cluster, app, *size).await?;
        let job = Job {
            dag: app.name,
            input: Some(input),
            params: params.to_vec(),
            policy: Some("remote"),
            planned: false,
        };
        let s = run_job(client, job).await?;
        eprintln!(
            "[profiling {} {variant} {n}] {size} {}: {} {:.2} s",
            app.name,
            app.unit,
            s.status,
            harness::emulated(&s, results.dilation).latency_s
        );
        if s.status != JobStatus::Succeeded {
            results.notes.push(format!(
                "fig2 profiling {} {variant} at {size} {}: job {} {}: {}",
                app.name,
                app.unit,
                s.job_id,
                s.status,
                s.error.clone().unwrap_or_default()
            ));
        }
        let m: DagModelsView = client.get(&models_path).await?;
        if runs_planned(&m) {
            results.notes.push(format!(
                "fig2 {} {variant}: profiled to convergence in {n} jobs (forced remote) before it was measured",
                app.name
            ));
            return Ok(Some(n));
        }
        why = m.mode.map(|v| v.reason);
    }
    results.notes.push(format!(
        "fig2 {} {variant}: the models did not converge within {cap} profiling jobs ({}); sonic is not measured at it, the baselines plan with what the models predict",
        app.name,
        why.unwrap_or_else(|| "the control plane listed no models for this setting".into())
    ));
    Ok(None)
}

/// The policies Fig. 2 runs at one setting: all of `policies`, but `sonic` only when the
/// setting converged (`after`); says so when it leaves it out.
fn gated_setting(
    policies: &[&'static str],
    app: &str,
    variant: &str,
    after: Option<usize>,
    results: &mut Results,
) -> Vec<&'static str> {
    if after.is_none() && policies.contains(&"sonic") {
        results.notes.push(format!(
            "fig2 {app} {variant}: sonic not measured: the setting's models did not converge during profiling, and the bench does not force sonic past the convergence gate"
        ));
    }
    policies
        .iter()
        .copied()
        .filter(|p| after.is_some() || *p != "sonic")
        .collect()
}

/// The policies an experiment runs for `app`: all of `policies`, but `sonic` only when the
/// application's models converged during profiling. Sonic is measured unforced, as a user's job
/// runs (planned once the models converged); the bench never forces it past the convergence
/// gate, and says so when it leaves it out.
fn gated(
    policies: &[&'static str],
    app: &str,
    experiment: &str,
    results: &mut Results,
) -> Vec<&'static str> {
    let converged = matches!(results.converged_after.get(app), Some(Some(_)));
    if !converged && policies.contains(&"sonic") {
        results.notes.push(format!(
            "{experiment} {app}: sonic not measured: the models did not converge during profiling, and the bench does not force sonic past the convergence gate"
        ));
    }
    policies
        .iter()
        .copied()
        .filter(|p| converged || *p != "sonic")
        .collect()
}

/// The policy a measured job forces: none for `sonic` (an unforced job of a converged DAG runs
/// planned, as a user's would), the policy itself otherwise.
fn forced(policy: &str) -> Option<&str> {
    (policy != "sonic").then_some(policy)
}

/// Runs one measured job and records it (or a note saying why it is missing).
async fn record(
    client: &Client,
    job: Job<'_>,
    experiment: &str,
    variant: &str,
    policy: &str,
    results: &mut Results,
    (k, total): (usize, usize),
) {
    let app = job.dag.to_owned();
    match run_job(client, job).await {
        Ok(s) if s.status == JobStatus::Succeeded => {
            let row = Row::from_summary(experiment, variant, policy, &s, results.dilation);
            results.times.extend(explain::job_times(
                (experiment, variant, policy),
                &s,
                results.dilation,
            ));
            eprintln!(
                "[{experiment} {k}/{total}] {app} {variant} {policy}: {:.2} s ${:.7} ({}; {})",
                row.latency_s,
                row.cost_usd,
                s.mode,
                s.edges
                    .iter()
                    .map(|e| e.method.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            if (policy == "sonic" || policy == "oracle") && s.mode != JobMode::Planned {
                results.notes.push(format!(
                    "{experiment} {app} {policy} job {} was not planned",
                    s.job_id
                ));
            }
            // The first plan of each planned cell, as the control plane explained it.
            if let Some(report) = s.plan.as_ref().and_then(|p| p.report.as_ref()) {
                let name = format!("{experiment}-{app}-{}{policy}.json", slug(variant));
                if !results.plans.iter().any(|(n, _)| *n == name) {
                    results
                        .plans
                        .push((name, serde_json::to_value(report).unwrap_or_default()));
                }
            }
            results.rows.push(row);
        }
        Ok(s) => {
            eprintln!(
                "[{experiment} {k}/{total}] {app} {variant} {policy}: {}",
                s.status
            );
            results.notes.push(format!(
                "{experiment} {app} {variant} {policy} job {} {}: {}",
                s.job_id,
                s.status,
                s.error.unwrap_or_default()
            ));
        }
        Err(e) => {
            eprintln!(
                "[{experiment} {k}/{total}] {app} {variant} {policy}: {}",
                short(&e)
            );
            results.notes.push(format!(
                "{experiment} {app} {variant} {policy}: not run: {}",
                short(&e)
            ));
        }
    }
}

/// Most profiling jobs per application in a full run.
pub const PROFILING_CAP: usize = 35;

/// Profiles `app` (forced `remote`, spread over the agents: the control plane's profiling) at
/// the training then the held-out sizes, then until the models converge; computes Fig. 10.
async fn profile(
    cluster: &Harness,
    client: &Client,
    app: &App,
    sizes: &apps::Sizes,
    opts: &BenchOptions,
    inputs: &mut Inputs,
    results: &mut Results,
) -> anyhow::Result<()> {
    // Profiling goes on (cycling over the training sizes) until the models converge, up to the
    // paper's 35 jobs (§5.6.1: "with 35 jobs we reach convergence for all predictions"); fewer
    // in a quick run.
    let cap = if opts.quick { 20 } else { PROFILING_CAP };
    let extra = cap.saturating_sub(sizes.train.len() + sizes.test.len());
    let planned: Vec<(u64, bool)> = sizes
        .train
        .iter()
        .map(|s| (*s, false))
        .chain(sizes.test.iter().map(|s| (*s, true)))
        .collect();
    let models_path = models_path(app.name, &app.job_params());
    let mut converged_after = None;
    let mut models_why: Option<String> = None;
    let mut n = 0;
    let total = planned.len();
    for (i, (size, held_out)) in planned
        .iter()
        .copied()
        .chain(sizes.train.iter().cycle().take(extra).map(|s| (*s, false)))
        .enumerate()
    {
        if i >= total && converged_after.is_some() {
            break;
        }
        let (input, _) = inputs.input(cluster, app, size).await?;
        let job = Job {
            dag: app.name,
            input: Some(input),
            params: app.job_params(),
            policy: Some("remote"),
            planned: false,
        };
        let mut s = run_job(client, job).await?;
        // In emulated time, as every figure of the run.
        s.latency_s = harness::emulated(&s, results.dilation).latency_s;
        n += 1;
        let ok = s.status == JobStatus::Succeeded;
        eprintln!(
            "[profiling {n}] {} {size} {}{}: {} {:.2} s",
            app.name,
            app.unit,
            if held_out { " (held out)" } else { "" },
            s.status,
            s.latency_s
        );
        if !ok {
            results.notes.push(format!(
                "profiling {} at {size} {}: job {} {}: {}",
                app.name,
                app.unit,
                s.job_id,
                s.status,
                s.error.clone().unwrap_or_default()
            ));
        }
        if size == sizes.measured {
            results
                .measured_sizes
                .insert(app.name.into(), (size, s.input_bytes));
        }
        results.profiled.push(Profiled {
            app: app.name.into(),
            job_id: s.job_id.clone(),
            size,
            input_bytes: s.input_bytes,
            held_out,
            latency_s: s.latency_s,
            ok,
        });
        if converged_after.is_none() {
            let m: DagModelsView = client.get(&models_path).await?;
            if m.converged {
                converged_after = Some(n);
            }
            models_why = m.mode.map(|v| v.reason);
        }
    }
    results
        .converged_after
        .insert(app.name.into(), converged_after);
    if converged_after.is_none() {
        results.notes.push(format!(
            "{}: the models did not converge within {n} profiling jobs ({}); sonic is not measured, the baselines plan with what the models predict",
            app.name,
            models_why.unwrap_or_else(|| "the control plane gave no reason".into())
        ));
    }
    // Fig. 10 from the recorded samples: training jobs in the order they ran, held-out fixed.
    let mut m: DagModelsView = client.get(&models_path).await?;
    let mut samples = fig10::samples_from_view(app.name, &std::mem::take(&mut m.samples));
    // Emulated time: Fig. 10's errors are ratios (unchanged), the simulator's validation
    // reruns these parameters on the catalog's own (undilated) VMs.
    for s in &mut samples {
        harness::emulated_sample(&mut s.measured, results.dilation);
    }
    results.models.insert(app.name.into(), m);
    let mine: Vec<&Profiled> = results
        .profiled
        .iter()
        .filter(|p| p.app == app.name && p.ok)
        .collect();
    let pick = |held: bool| {
        mine.iter()
            .filter(|p| p.held_out == held)
            .filter_map(|p| samples.iter().find(|s| s.job == p.job_id).cloned())
            .collect::<Vec<_>>()
    };
    let (train, test) = (pick(false), pick(true));
    results
        .fig10
        .extend(fig10::error_curves(app.name, &train, &test));
    let profiled: Vec<_> = train.into_iter().chain(test).collect();
    results.samples.insert(app.name.into(), profiled);
    Ok(())
}

/// `--only profile`: every application profiled as the other experiments start (same sizes,
/// parameters and cap), then a table on `out`: the jobs each ran, after how many its models
/// converged, and every model's cross-validated error; each application's models with their
/// samples go to `models-<app>.json` in the output folder.
async fn profile_run(
    base: &ClusterOptions,
    opts: &BenchOptions,
    data_dir: &Path,
    results: &mut Results,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (cluster, mut inputs) = start_run(base, opts, data_dir, results).await?;
    let outcome = async {
        let client = cluster.client()?;
        let (n_train, n_test, _) = opts.scale();
        for app in opts.apps() {
            jobs::apply_text(&client, app.file, app.yaml.to_owned())
                .await
                .with_context(|| format!("apply {}", app.file))?;
            let sizes = apps::sizes(&app, n_train, n_test);
            profile(&cluster, &client, &app, &sizes, opts, &mut inputs, results).await?;
            // The models with their samples, for a closer look.
            let view: Value = client
                .get(&models_path(app.name, &app.job_params()))
                .await?;
            let file = opts.out_dir.join(format!("models-{}.json", app.name));
            std::fs::write(&file, serde_json::to_string_pretty(&view)?)
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
        anyhow::Ok(())
    }
    .await;
    cluster.forget_inputs(&inputs.prefix).await;
    cluster.stop().await;
    outcome?;
    writeln!(out, "app | profiling jobs | converged after")?;
    for (app, after) in &results.converged_after {
        let jobs = results.profiled.iter().filter(|p| p.app == *app).count();
        let after = after.map_or_else(|| "not converged".to_owned(), |n| format!("{n} jobs"));
        writeln!(out, "{app} | {jobs} | {after}")?;
    }
    writeln!(
        out,
        "\napp | parameter | converged | samples | degree | CV MAPE %"
    )?;
    for (app, m) in &results.models {
        for v in &m.models {
            writeln!(
                out,
                "{app} | {} | {} | {} | {} | {}",
                v.parameter,
                if v.converged { "yes" } else { "no" },
                v.samples,
                v.degree.map_or_else(|| "-".into(), |d| d.to_string()),
                v.cv_mape
                    .map_or_else(|| "-".into(), |e| format!("{:.1}", e * 100.0))
            )?;
        }
    }
    for n in &results.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

/// Times the plan route (prediction + planning + HTTP) for the measured input.
async fn overhead_route(client: &Client, app: &App, results: &mut Results, bytes: u64) {
    let path = format!("/v1/dags/{}/plan?input_bytes={bytes}", encode(app.name));
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        if client.get::<Value>(&path).await.is_ok() {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let route_s = times.get(times.len() / 2).copied().unwrap_or(0.0);
    results.overhead.push(Overhead {
        app: app.name.into(),
        route_s,
        planner_s: 0.0,
        job_s: 0.0,
    });
}

/// The sonic jobs' planner time and latency, into the application's overhead line.
fn finish_overhead(app: &App, results: &mut Results) {
    let sonic: Vec<&Row> = results
        .rows
        .iter()
        .filter(|r| r.experiment == "fig7" && r.app == app.name && r.policy == "sonic")
        .collect();
    if sonic.is_empty() {
        return;
    }
    let n = sonic.len() as f64;
    let planner = sonic.iter().map(|r| r.planning_us / 1e6).sum::<f64>() / n;
    let job = sonic.iter().map(|r| r.latency_s).sum::<f64>() / n;
    if let Some(o) = results.overhead.iter_mut().find(|o| o.app == app.name) {
        o.planner_s = planner;
        o.job_s = job;
    }
}

/// The broadcast fanouts of Fig. 6.
fn fig6_fanouts(quick: bool) -> &'static [u32] {
    if quick {
        &[1, 2, 4, 8, 12]
    } else {
        &[1, 2, 3, 4, 6, 8, 10, 12]
    }
}

/// Bytes the broadcast source writes in Fig. 6.
pub const FIG6_BYTES: u64 = 20_000_000;
/// Fig. 6's clusters run their VM and store links at this fraction of the catalog's.
pub const FIG6_NET_SCALE: f64 = 0.25;

/// Fig. 6 on a cluster of agents of one VM type, one more than the largest fanout: the broadcast
/// DAG at growing fanouts, every edge `direct` or `remote` (forced, spread: the source on the
/// first agent, each sink on an agent of its own, one receiver per VM as in the paper; an agent
/// fetches a broadcast file once for all its receivers, so sharing agents would hide the fanout).
async fn broadcast_experiment(
    base: &ClusterOptions,
    opts: &BenchOptions,
    catalog: &Catalog,
    vm: &str,
    data_dir: &Path,
    results: &mut Results,
) -> anyhow::Result<()> {
    let mut one = catalog.clone();
    one.vm_types.retain(|t| t.name == vm);
    // Links scaled down (VM and store alike, request latency kept) so that this machine's own
    // costs of moving bytes (SeaweedFS, copies, checksums on 2 cores) stay below the emulated
    // links': the transfers, not the CPU, decide, as on real VMs.
    for t in &mut one.vm_types {
        t.network_mbps *= FIG6_NET_SCALE;
    }
    one.remote_storage.read_mbps *= FIG6_NET_SCALE;
    one.remote_storage.write_mbps *= FIG6_NET_SCALE;
    if one.vm_types.is_empty() {
        anyhow::bail!("the catalog has no VM type {vm}");
    }
    let dir = data_dir.join(format!("fig6-{vm}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // JSON is YAML: the catalog reader takes it.
    let catalog_path = dir.join("catalog.yaml");
    std::fs::write(&catalog_path, serde_json::to_string_pretty(&one)?)
        .with_context(|| format!("cannot write {}", catalog_path.display()))?;
    let fanouts = fig6_fanouts(opts.quick);
    let mut options = options_in(base, &dir.join("cluster"));
    options.agents = fanouts.iter().max().copied().unwrap_or(1) + 1;
    options.catalog = Some(catalog_path);
    let mut note = |line: &str| eprintln!("{line}");
    let cluster = Cluster::start(options, &mut note).await?;
    let outcome = async {
        let client = cluster.client()?;
        jobs::apply_text(
            &client,
            "dags/broadcast.yaml",
            apps::BROADCAST_YAML.to_owned(),
        )
        .await?;
        let reps = stats::MIN_ROUNDS;
        let total = reps * fanouts.len() * 2;
        let mut k = 0;
        let mut rng = stats::Rng::new(stats::seed_for(opts.seed, &format!("fig6/{vm}")));
        for _ in 0..reps {
            for &fanout in fanouts {
                for method in stats::shuffled(&["direct", "remote"], &mut rng) {
                    k += 1;
                    let job = Job {
                        dag: "broadcast",
                        input: None,
                        params: vec![
                            ("fanout".into(), Value::from(fanout)),
                            ("output_bytes".into(), Value::from(FIG6_BYTES)),
                        ],
                        policy: Some(method),
                        planned: false,
                    };
                    let variant = format!("{vm} k={fanout}");
                    record(&client, job, "fig6", &variant, method, results, (k, total)).await;
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    results
        .clusters
        .push((format!("Fig. 6 on {vm}"), cluster.info.clone()));
    cluster.stop().await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(experiment: &str, variant: &str, policy: &str, lat: f64, cost: f64) -> Row {
        Row {
            experiment: experiment.into(),
            app: "a".into(),
            variant: variant.into(),
            policy: policy.into(),
            job_id: "j".into(),
            mode: "planned".into(),
            input_bytes: 0,
            latency_s: lat,
            cost_usd: cost,
            perf_per_dollar: 1.0 / (lat * cost),
            methods: String::new(),
            plan_used: String::new(),
            placement: String::new(),
            edge_s: 0.0,
            planning_us: 0.0,
            predicted_latency_s: None,
            predicted_cost_usd: None,
            dilation: 1.0,
            vms_planned: None,
            vms_run: 1,
            squeezed: String::new(),
        }
    }

    /// A job of `functions` (name, agent per instance), planned with `report` (JSON).
    fn ran(functions: &[(&str, &[&str])], report: Option<serde_json::Value>) -> JobSummary {
        use serde_json::json;
        let mut s: JobSummary = serde_json::from_value(json!({
            "job_id": "j-1", "dag": "d", "status": "succeeded", "policy": "remote",
            "mode": "planned", "input_bytes": 1, "latency_s": 1.0, "cost_usd": 1.0,
            "perf_per_dollar": 1.0, "edges": [], "functions": [], "outputs": []
        }))
        .expect("a summary");
        for (name, agents) in functions {
            for (i, a) in agents.iter().enumerate() {
                s.functions.push(
                    serde_json::from_value(json!({
                        "name": name, "instance": i, "agent": a, "vm_type": "t2.large",
                        "cold": true, "seconds": 1.0, "attempts": 1
                    }))
                    .expect("a function run"),
                );
            }
        }
        s.plan = report.map(|r| sonic_api::control::JobPlan {
            used: sonic_api::control::PlanUsed::Best,
            notes: Vec::new(),
            report: Some(serde_json::from_value(r).expect("a plan report")),
            stages: Vec::new(),
            exact: None,
        });
        s
    }

    /// A plan's stage of `vms` VMs of `vm_type`, one lambda on each.
    fn stage(function: &str, vm_type: &str, vms: u32) -> sonic_core::planner::PlanStage {
        sonic_core::planner::PlanStage {
            cores: 1.0,
            function: function.into(),
            vm_type: vm_type.into(),
            vms,
            per_vm: 1,
            concurrent: 1,
            warm: false,
            prewarmed: false,
        }
    }

    #[test]
    fn a_plan_fits_when_every_stage_has_agents_of_its_type() {
        let agents = BTreeMap::from([("t2.large".to_owned(), 4), ("m5.large".to_owned(), 1)]);
        assert_eq!(
            fits(
                &[stage("split", "m5.large", 1), stage("map", "t2.large", 4)],
                &agents
            ),
            Ok(())
        );
        assert_eq!(
            fits(
                &[stage("split", "m5.large", 1), stage("map", "t2.large", 30)],
                &agents
            ),
            Err("map asks for 30 t2.large VMs, the cluster has 4".into())
        );
        assert_eq!(
            fits(&[stage("reduce", "m5.2xlarge", 1)], &agents),
            Err("reduce asks for 1 m5.2xlarge VMs, the cluster has 0".into())
        );
    }

    #[test]
    fn vms_planned_against_vms_run_and_the_squeezed_stages() {
        use serde_json::json;
        let predicted = json!({ "latency_s": 1.0, "cost_usd": 1.0, "perf_per_dollar": 1.0 });
        // remote asked one VM per lambda (split 1, map 4), the pool limited it to 2 agents: the
        // plan that ran says 2, the plan asked for (`unlimited`) 4.
        let squeezed = ran(
            &[("split", &["a1"]), ("map", &["a1", "a2", "a1", "a2"])],
            Some(json!({
                "dag": "d", "policy": "remote", "stages": [stage("split", "t2.large", 1), stage("map", "t2.large", 2)],
                "edges": [], "predicted": predicted,
                "vm_limits": { "t2.large": 2 },
                "unlimited": { "stages": [stage("split", "t2.large", 1), stage("map", "t2.large", 4)], "edges": [],
                               "predicted": predicted }
            })),
        );
        assert_eq!(vms_of(&squeezed), (Some(4), 2, "map:4>2".into()));
        // A plan run as asked: its stages on as many agents as VMs.
        let whole = ran(
            &[("split", &["a1"]), ("map", &["a2", "a3"])],
            Some(json!({
                "dag": "d", "policy": "direct", "stages": [stage("split", "t2.large", 1), stage("map", "t2.large", 2)],
                "edges": [], "predicted": predicted
            })),
        );
        assert_eq!(vms_of(&whole), (Some(2), 3, String::new()));
        // No plan (profiling): nothing planned, the agents counted.
        let profiling = ran(&[("split", &["a1"]), ("map", &["a1", "a2"])], None);
        assert_eq!(vms_of(&profiling), (None, 2, String::new()));
        let row = Row::from_summary("fig7", "", "remote", &squeezed, 1.0);
        let line = csv(std::slice::from_ref(&row));
        assert!(
            line.lines()
                .next()
                .unwrap()
                .ends_with(",dilation,vms_planned,vms_run,squeezed")
        );
        assert!(
            line.lines().nth(1).unwrap().ends_with(",1,4,2,map:4>2"),
            "{line}"
        );
    }

    #[test]
    fn perf_per_dollar_is_relative_to_the_best_static_policy_of_its_group() {
        let rows = vec![
            row("fig7", "", "remote", 2.0, 1.0),
            row("fig7", "", "local", 1.0, 1.0),
            row("fig7", "", "local", 3.0, 1.0),
            row("fig7", "", "sonic", 1.0, 2.0),
            row("fig2", "trees=1", "direct", 1.0, 1.0),
            row("fig2", "trees=1", "sonic", 0.5, 1.0),
        ];
        let cells = aggregate(&rows);
        assert_eq!(cells.len(), 5);
        let local = &cells[1];
        assert_eq!((local.policy.as_str(), local.jobs), ("local", 2));
        assert!((local.latency_s - 2.0).abs() < 1e-12);
        assert!((local.latency_sd - 1.0).abs() < 1e-12);
        // remote and local tie at 0.5; sonic 0.5 too: ratio 1.
        assert!((cells[2].ratio_to_best_static - 1.0).abs() < 1e-12);
        // Another group has its own best static policy.
        let sonic2 = cells
            .iter()
            .find(|c| c.experiment == "fig2" && c.policy == "sonic")
            .unwrap();
        assert!((sonic2.ratio_to_best_static - 2.0).abs() < 1e-12);
        assert_eq!(csv(&rows).lines().count(), 7);
    }
}
