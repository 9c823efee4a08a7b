//! The simulator's side of the evaluation: its error against the real runs of Fig. 7 (each
//! application's lone job on a simulated copy of the emulated cluster, with the parameters the
//! profiling jobs measured at that input), and the paper-scale experiments it runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use sonic_control::store::SampleRecord;
use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::planner::Policy;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sonic_core::params::Params;
use sonic_sim::experiments as ex;
use sonic_sim::{Cluster, JobSpec, PlanShape, SimConfig, validate_alone, validate_plan};
use std::path::Path;

use super::report::Verdict;
use crate::charts::{self, BarChart, BarGroup, LineChart, Series};

use super::apps;
use super::{Results, aggregate};
use sonic_cluster::ClusterInfo;

/// The file of a run's output folder that holds what the simulator's validation needs
/// ([`ValidationInputs`]): `ofctl bench --only validate --out DIR` re-runs it from there.
pub const VALIDATION_INPUTS: &str = "validation-inputs.json";

/// The simulator next to the real runs for one (application, policy).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationRow {
    pub app: String,
    pub policy: String,
    pub real_latency_s: f64,
    pub sim_latency_s: f64,
    pub real_cost_usd: f64,
    pub sim_cost_usd: f64,
}

impl ValidationRow {
    /// `|sim - real| / real`.
    pub fn latency_error(&self) -> f64 {
        rel(self.sim_latency_s, self.real_latency_s)
    }
    pub fn cost_error(&self) -> f64 {
        rel(self.sim_cost_usd, self.real_cost_usd)
    }
}

fn rel(sim: f64, real: f64) -> f64 {
    if real.abs() > 0.0 {
        (sim - real).abs() / real.abs()
    } else {
        0.0
    }
}

/// The planner's policy for a policy name of the harness.
pub fn policy(name: &str) -> Option<Policy> {
    Some(match name {
        "sonic" => Policy::Sonic,
        "sonic-mean" => Policy::SonicMean,
        "remote" => Policy::Remote,
        "local" => Policy::Local,
        "direct" => Policy::Direct,
        "memory" => Policy::Memory,
        "oracle" => Policy::Oracle,
        _ => return None,
    })
}

/// Everything the simulator's validation of a run needs, all in emulated time: saved with the
/// run ([`VALIDATION_INPUTS`]) so that it can be re-run without the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationInputs {
    /// The cluster's time dilation factor (1: none); every time below is already divided by it.
    pub dilation: f64,
    /// The catalog the cluster's control plane was given (before dilation and before the
    /// measured bandwidths replaced its VM types' `network_mbps`).
    pub catalog: Catalog,
    /// VMs of each type the cluster had (its agents: one per VM on the container cluster).
    pub vms: BTreeMap<String, u32>,
    pub apps: Vec<AppInputs>,
}

/// One application's inputs: the parameters the profiling jobs measured at the Fig. 7 input
/// (`learn::measured_params`, the oracle's), and its cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppInputs {
    pub app: String,
    pub input_bytes: u64,
    pub params: Params,
    pub cells: Vec<CellInputs>,
}

/// One Fig. 7 cell: the mean of its measured jobs (as in `jobs.csv`), the plan its first job
/// ran (as in `plans/`) and the bandwidth per VM type the planner used for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellInputs {
    pub policy: String,
    pub jobs: usize,
    pub real_latency_s: f64,
    pub real_cost_usd: f64,
    /// `None`: the cell's jobs ran unplanned; the simulator plans them with the policy.
    pub plan: Option<PlanShape>,
    /// Mbit/s per VM type the planner used (`network_mbps` of its report), emulated time.
    pub network_mbps: BTreeMap<String, f64>,
}

/// The planner's bandwidths of a plan report (`network_mbps`), in emulated time: the measured
/// ones multiplied by `dilation`, the catalog's (undilated in `catalog`) left out.
fn report_network(report: &Value, dilation: f64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if let Some(m) = report["network_mbps"].as_object() {
        for (t, v) in m {
            if v["source"].as_str() == Some("measured")
                && let Some(x) = v["network_mbps"].as_f64()
            {
                out.insert(t.clone(), x * dilation);
            }
        }
    }
    out
}

/// Collects the validation's inputs from a run: each Fig. 7 cell's measured mean, the plan its
/// first job ran, and the application's measured parameters at that input.
pub fn inputs(
    catalog: &Catalog,
    real: &ClusterInfo,
    results: &Results,
) -> anyhow::Result<ValidationInputs> {
    let mut vms: BTreeMap<String, u32> = BTreeMap::new();
    for a in &real.agents {
        *vms.entry(a.vm_type.clone()).or_default() += 1;
    }
    let d = if results.dilation.is_finite() && results.dilation >= 1.0 {
        results.dilation
    } else {
        1.0
    };
    let cells = aggregate(&results.rows);
    let mut apps_out = Vec::new();
    for app in apps::apps() {
        let Some(&(_, bytes)) = results.measured_sizes.get(app.name) else {
            continue;
        };
        let Some(samples) = results_samples(results, app.name) else {
            continue;
        };
        let dag = Dag::from_yaml(app.file, app.yaml).map_err(|e| anyhow!("{e}"))?;
        // Emulated time already (`harness::emulated_sample`).
        let params = sonic_control::learn::measured_params(&dag, samples, bytes)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("{}: measured parameters", app.name))?;
        let mut out = Vec::new();
        for c in cells
            .iter()
            .filter(|c| c.experiment == "fig7" && c.app == app.name)
        {
            let report = results
                .plans
                .iter()
                .find(|(n, _)| *n == format!("fig7-{}-{}.json", app.name, c.policy))
                .map(|(_, v)| v);
            let plan = report
                .map(|r| serde_json::from_value::<PlanShape>(r.clone()))
                .transpose()
                .with_context(|| format!("{} {}: the plan report", app.name, c.policy))?;
            out.push(CellInputs {
                policy: c.policy.clone(),
                jobs: c.jobs,
                real_latency_s: c.latency_s,
                real_cost_usd: c.cost_usd,
                plan,
                network_mbps: report.map(|r| report_network(r, d)).unwrap_or_default(),
            });
        }
        apps_out.push(AppInputs {
            app: app.name.into(),
            input_bytes: bytes,
            params,
            cells: out,
        });
    }
    Ok(ValidationInputs {
        dilation: d,
        catalog: catalog.clone(),
        vms,
        apps: apps_out,
    })
}

/// Simulates each cell's job alone, as the system ran it: the plan its first job ran (planned
/// by the policy when the cell has none), on a cluster of the run's VMs (at least as many of a
/// type as the plan asks for), the catalog with the bandwidths the planner used, the
/// parameters measured at that input (with each function's per-instance overhead); the cost
/// as the job summary computes it (`JobCost::summary_usd`). Errors name the cell.
pub fn validate_inputs(v: &ValidationInputs) -> anyhow::Result<Vec<ValidationRow>> {
    let mut out = Vec::new();
    for app in &v.apps {
        let a = apps::apps()
            .into_iter()
            .find(|a| a.name == app.app)
            .ok_or_else(|| anyhow!("no application {:?}", app.app))?;
        let dag = Arc::new(Dag::from_yaml(a.file, a.yaml).map_err(|e| anyhow!("{e}"))?);
        for c in &app.cells {
            let Some(p) = policy(&c.policy) else {
                continue;
            };
            let name = format!("{}-{}", app.app, c.policy);
            let mut catalog = v.catalog.clone();
            for t in &mut catalog.vm_types {
                if let Some(&mbps) = c.network_mbps.get(&t.name) {
                    t.network_mbps = mbps;
                }
            }
            let mut counts = v.vms.clone();
            for s in c.plan.iter().flat_map(|p| &p.stages) {
                let n = counts.entry(s.vm_type.clone()).or_default();
                *n = (*n).max(s.vms);
            }
            let counts: Vec<(String, u32)> = counts.into_iter().collect();
            let cluster = Cluster::new(&catalog, &counts).map_err(|e| anyhow!("{name}: {e}"))?;
            let job = JobSpec {
                name: name.clone(),
                dag: dag.clone(),
                params: app.params.clone(),
                predicted: None,
                arrival_s: 0.0,
                policy: p,
                bounds: dag.bounds,
            };
            let config = SimConfig::default();
            let r = match &c.plan {
                Some(plan) => validate_plan(&cluster, &job, plan, &config),
                None => validate_alone(&cluster, &job, &config),
            }
            .map_err(|e| anyhow!("{name}: {e}"))?;
            out.push(ValidationRow {
                app: app.app.clone(),
                policy: c.policy.clone(),
                real_latency_s: c.real_latency_s,
                sim_latency_s: r.job.latency_s,
                real_cost_usd: c.real_cost_usd,
                sim_cost_usd: r.job.cost.summary_usd,
            });
        }
    }
    Ok(out)
}

/// The validation of a finished run (its inputs, which the report saves, and its rows).
pub fn validate(
    catalog: &Catalog,
    real: &ClusterInfo,
    results: &Results,
) -> anyhow::Result<(ValidationInputs, Vec<ValidationRow>)> {
    let v = inputs(catalog, real, results)?;
    let rows = validate_inputs(&v)?;
    Ok((v, rows))
}

/// Reads a run's [`VALIDATION_INPUTS`] from `dir`.
pub fn read_inputs(dir: &Path) -> anyhow::Result<ValidationInputs> {
    let path = dir.join(VALIDATION_INPUTS);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (runs before it was saved cannot be re-validated)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

/// The profiling samples of `app` the harness kept.
fn results_samples<'a>(results: &'a Results, app: &str) -> Option<&'a [SampleRecord]> {
    results.samples.get(app).map(Vec::as_slice)
}

/// The validation as CSV.
pub fn validation_csv(rows: &[ValidationRow]) -> String {
    let mut s = String::from(
        "app,policy,real_latency_s,sim_latency_s,latency_error,real_cost_usd,sim_cost_usd,cost_error\n",
    );
    for r in rows {
        s.push_str(&format!(
            "{},{},{:.4},{:.4},{:.4},{:.8},{:.8},{:.4}\n",
            r.app,
            r.policy,
            r.real_latency_s,
            r.sim_latency_s,
            r.latency_error(),
            r.real_cost_usd,
            r.sim_cost_usd,
            r.cost_error()
        ));
    }
    s
}

/// What the simulator's paper-scale experiments produced.
#[derive(Debug, Clone, Default)]
pub struct SimResults {
    pub fig6: Vec<ex::Fig6Row>,
    pub fig9: Vec<ex::Fig9Row>,
    pub fig14: Vec<ex::Fig14Row>,
    pub fig15: Vec<ex::Fig15Row>,
    pub seconds: f64,
}

/// Runs the simulator's paper-scale experiments (the built-in catalog, seed 1).
pub fn paper_scale(quick: bool) -> anyhow::Result<SimResults> {
    let started = std::time::Instant::now();
    let config = SimConfig::default();
    let e = |e: sonic_sim::SimError| anyhow!("{e}");
    let fanouts: &[u32] = if quick {
        &[1, 2, 4, 8, 12, 16]
    } else {
        &ex::FIG6_FANOUTS
    };
    let fig6 = ex::fig6(fanouts, &config).map_err(e)?;
    let jobs: &[usize] = if quick { &[15, 60] } else { &ex::FIG9_JOBS };
    let fig9 = ex::fig9_sweep(jobs, config.seed, &config).map_err(e)?;
    let fig14 = ex::fig14(&ex::FIG14_ERRORS, &config).map_err(e)?;
    let fig15 = ex::fig15(&ex::FIG15_RATIOS, &config).map_err(e)?;
    Ok(SimResults {
        fig6,
        fig9,
        fig14,
        fig15,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Price of a whole simulated cluster per second (`mixed`, `paper` or `TYPE=N,...`).
fn cluster_usd_per_s(name: &str) -> Option<f64> {
    let spec = match name {
        "mixed" => sonic_sim::scenario::MIXED_CLUSTER,
        "paper" => sonic_sim::scenario::PAPER_CLUSTER,
        other => other,
    };
    let catalog = Catalog::default();
    let c = Cluster::from_spec(&catalog, spec).ok()?;
    Some(
        c.counts()
            .iter()
            .filter_map(|(t, n)| {
                catalog
                    .vm_type(t)
                    .map(|v| v.usd_per_second() * f64::from(*n))
            })
            .sum(),
    )
}

/// Fig. 9 with the whole cluster paid for the makespan: Perf/$ =
/// `jobs / (mean latency x cluster price x makespan)` (the cost per job is the cluster's bill over
/// the makespan, shared equally).
pub fn fig9_cluster_perf(r: &ex::Fig9Row) -> Option<f64> {
    let price = cluster_usd_per_s(&r.cluster)?;
    let cost_per_job = price * r.makespan_s / r.jobs.max(1) as f64;
    (r.latency_mean_s > 0.0 && cost_per_job > 0.0).then(|| 1.0 / (r.latency_mean_s * cost_per_job))
}

/// The paper-scale experiments' files (name, text).
pub fn files(s: &SimResults) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = vec![
        ("fig6-sim.csv".to_owned(), ex::fig6_to_csv(&s.fig6)),
        ("fig9-sim.csv".to_owned(), ex::fig9_to_csv(&s.fig9)),
        ("fig14-sim.csv".to_owned(), ex::fig14_to_csv(&s.fig14)),
        ("fig15-sim.csv".to_owned(), ex::fig15_to_csv(&s.fig15)),
    ];
    // Fig. 6: latency vs fanout, one line per (method, VM type).
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &s.fig6 {
        by.entry(format!("{} {}", r.method, r.vm_type))
            .or_default()
            .push((f64::from(r.fanout), r.latency_s));
    }
    let series = to_series(by);
    out.push((
        "fig6-sim.svg".into(),
        charts::line_chart(&LineChart {
            title: "Fig. 6 (simulated, paper scale): broadcast, direct vs remote",
            x_label: "broadcast fanout (one receiver per VM)",
            y_label: "job latency (s)",
            series: &series,
            log_x: false,
            log_y: false,
        })?,
    ));
    // Fig. 9: Perf/$ (1 / (mean latency x mean cost)) vs concurrent jobs, per cluster and policy.
    for cluster in clusters(&s.fig9) {
        let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in s.fig9.iter().filter(|r| r.cluster == cluster) {
            by.entry(r.policy.to_string())
                .or_default()
                .push((r.jobs as f64, r.perf_per_dollar));
        }
        let series = to_series(by);
        out.push((
            format!("fig9-sim-{cluster}.svg"),
            charts::line_chart(&LineChart {
                title: &format!("Fig. 9 (simulated, {cluster} cluster): Perf/$"),
                x_label: "concurrent jobs (equal parts of the three applications)",
                y_label: "Perf/$ = 1 / (mean latency x mean cost)",
                series: &series,
                log_x: false,
                log_y: false,
            })?,
        ));
    }
    // Fig. 14: relative Perf/$ per memory error, one group per error.
    let mut groups: Vec<BarGroup> = Vec::new();
    for r in &s.fig14 {
        let label = format!("{:+.0}%", 100.0 * r.error);
        match groups.iter_mut().find(|g| g.label == label) {
            Some(g) => g.bars.push((r.app.clone(), r.relative_to_zero_error)),
            None => groups.push(BarGroup {
                label,
                bars: vec![(r.app.clone(), r.relative_to_zero_error)],
            }),
        }
    }
    out.push((
        "fig14-sim.svg".into(),
        charts::bar_chart(&BarChart {
            title: "Fig. 14 (simulated): Sonic's Perf/$ with memory mispredicted",
            y_label: "Perf/$ / Perf/$ at zero error",
            groups: &groups,
            reference: Some((1.0, "zero error")),
            show_values: false,
        })?,
    ));
    // Fig. 15: normalized Perf/$ vs cold:hot ratio.
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &s.fig15 {
        by.entry(r.policy.to_string())
            .or_default()
            .push((r.ratio, r.normalized));
    }
    let series = to_series(by);
    out.push((
        "fig15-sim.svg".into(),
        charts::line_chart(&LineChart {
            title: "Fig. 15 (simulated): cold-to-hot ratio, 10 parallel lambdas",
            x_label: "cold / hot compute time",
            y_label: "Perf/$ / best policy's",
            series: &series,
            log_x: false,
            log_y: false,
        })?,
    ));
    Ok(out)
}

fn to_series(by: BTreeMap<String, Vec<(f64, f64)>>) -> Vec<Series> {
    by.into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect()
}

/// The (cluster, concurrent jobs) points of Fig. 9, in the order run.
fn fig9_points(rows: &[ex::Fig9Row]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in rows {
        if !out.iter().any(|(c, n)| *c == r.cluster && *n == r.jobs) {
            out.push((r.cluster.clone(), r.jobs));
        }
    }
    out
}

fn clusters(rows: &[ex::Fig9Row]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        if !out.contains(&r.cluster) {
            out.push(r.cluster.clone());
        }
    }
    out
}

const STATIC: [Policy; 3] = [Policy::Remote, Policy::Local, Policy::Direct];

/// Sonic against the best static policy in the paper-scale experiments (Fig. 9 per cluster and
/// concurrency, Fig. 15 per ratio).
pub fn verdicts(s: &SimResults) -> Vec<Verdict> {
    let mut out = Vec::new();
    for (cluster, n) in fig9_points(&s.fig9) {
        let rows = s
            .fig9
            .iter()
            .filter(|r| r.cluster == cluster && r.jobs == n);
        if let Some(v) = verdict(
            "fig9 (sim)",
            format!("{cluster} cluster, {n} jobs"),
            rows.map(|r| (r.policy, r.perf_per_dollar)),
        ) {
            out.push(v);
        }
    }
    let mut ratios: Vec<f64> = s.fig15.iter().map(|r| r.ratio).collect();
    ratios.dedup();
    for ratio in ratios {
        if let Some(v) = verdict(
            "fig15 (sim)",
            format!("cold/hot {ratio}"),
            s.fig15
                .iter()
                .filter(|r| r.ratio == ratio)
                .map(|r| (r.policy, r.perf_per_dollar)),
        ) {
            out.push(v);
        }
    }
    out
}

fn verdict(
    experiment: &str,
    group: String,
    cells: impl Iterator<Item = (Policy, f64)>,
) -> Option<Verdict> {
    let cells: Vec<(Policy, f64)> = cells.collect();
    let sonic = cells.iter().find(|(p, _)| *p == Policy::Sonic)?.1;
    let (best, b) = cells
        .iter()
        .filter(|(p, _)| STATIC.contains(p))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(Verdict {
        experiment: experiment.into(),
        group,
        sonic,
        best_static: best.to_string(),
        ratio: if *b > 0.0 { sonic / b } else { 0.0 },
        // One seeded simulation: no run-to-run spread to put an interval on.
        ci: None,
    })
}

/// The paper-scale experiments' section of the report.
pub fn report(out: &mut String, s: &SimResults) {
    let _ = writeln!(
        out,
        "## At the paper's scale, in the simulator\n\nThe discrete-event simulator (`crates/sonic-sim`, docs/simulator.md) plans every job with the same planner and runs it on a simulated cluster: max-min fair NICs and store, vCPU sharing, warm containers, a memory-granting resource manager (Sonic's is load-aware: it picks, among the best plans on each subset of the cluster's VM types, the one with the best Perf/$ counting its predicted wait). The applications' parameters are the paper's operating points (`crates/sonic-sim/scenarios/fig9/`). Seed 1; {:.1} s.\n",
        s.seconds
    );
    let _ = writeln!(
        out,
        "### Fig. 6: direct vs remote at paper scale\n\n![Fig. 6 sim](fig6-sim.svg)\n"
    );
    out.push_str("| VM type | first fanout where remote beats direct |\n|---|---|\n");
    for (t, k) in ex::fig6_crossover(&s.fig6) {
        let _ = writeln!(
            out,
            "| {t} | {} |",
            k.map_or("none".to_owned(), |k| k.to_string())
        );
    }
    out.push_str("\n### Fig. 9: the mixed workload at 15 to 60 concurrent jobs\n\n");
    for c in clusters(&s.fig9) {
        let _ = writeln!(out, "![Fig. 9 {c}](fig9-sim-{c}.svg)\n");
    }
    out.push_str("Perf/$ = 1 / (mean latency x mean cost) over the jobs, as everywhere in this report; a job's cost is its share of the VMs it held (a VM's price is split among the jobs holding it). The last column charges instead the whole cluster for the makespan, shared equally by the jobs (what an operator who rents the cluster for the workload pays).\n\n| cluster | jobs | policy | Perf/$ | mean latency s | mean cost $ | makespan s | mean queueing s | Perf/$ (cluster paid) |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in &s.fig9 {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.1} | {:.5} | {:.1} | {:.1} | {} |",
            r.cluster,
            r.jobs,
            r.policy,
            r.perf_per_dollar,
            r.latency_mean_s,
            r.cost_mean_usd,
            r.makespan_s,
            r.queued_mean_s,
            fig9_cluster_perf(r).map_or("-".into(), |v| format!("{v:.2}"))
        );
    }
    for (cluster, n) in fig9_points(&s.fig9) {
        let at = |p: Policy| {
            s.fig9
                .iter()
                .find(|r| r.cluster == cluster && r.jobs == n && r.policy == p)
        };
        let (Some(sonic), Some(local)) = (at(Policy::Sonic), at(Policy::Local)) else {
            continue;
        };
        if sonic.perf_per_dollar < 0.95 * local.perf_per_dollar {
            let _ = writeln!(
                out,
                "\n**{cluster} cluster, {n} jobs: Sonic loses to `local` on Perf/$** ({:.2} vs {:.2}) \
                     although its jobs finish sooner (mean latency {:.1} s vs {:.1} s, makespan {:.1} s vs {:.1} s). \
                     `local` puts every job on the largest type, so the jobs queue for the few m5.2xlarge \
                     (mean queueing {:.1} s vs {:.1} s) and pack onto them: a VM's price is split among the jobs \
                     holding it, waiting in the queue costs a job nothing, and packed jobs of one application \
                     find warm containers, so each job's share is small. Sonic's planner prices a plan as if \
                     its VMs were the job's alone and knows nothing of warm containers left by other jobs. \
                     Charging the whole cluster for the makespan instead, Sonic gets {} and `local` {}.",
                sonic.perf_per_dollar,
                local.perf_per_dollar,
                sonic.latency_mean_s,
                local.latency_mean_s,
                sonic.makespan_s,
                local.makespan_s,
                sonic.queued_mean_s,
                local.queued_mean_s,
                fig9_cluster_perf(sonic).map_or("-".into(), |v| format!("{v:.2}")),
                fig9_cluster_perf(local).map_or("-".into(), |v| format!("{v:.2}")),
            );
        }
    }
    out.push_str("\n### Fig. 14: memory mispredicted\n\n![Fig. 14 sim](fig14-sim.svg)\n\nSonic plans with every function's memory predicted x (1 + error) and runs with the true memory (each application alone, paper cluster).\n\n| app | error | latency s | cost $ | Perf/$ / zero error | lambdas batched | VMs |\n|---|---|---|---|---|---|---|\n");
    for r in &s.fig14 {
        let _ = writeln!(
            out,
            "| {} | {:+.0}% | {:.2} | {:.5} | {:.3} | {} | {} |",
            r.app,
            100.0 * r.error,
            r.latency_s,
            r.cost_usd,
            r.relative_to_zero_error,
            r.batched,
            r.vms
        );
    }
    out.push_str("\n### Fig. 15: the cold-to-hot ratio\n\n![Fig. 15 sim](fig15-sim.svg)\n\nA synthetic stage of 10 parallel lambdas (hot time fixed, cold = ratio x hot).\n\n| ratio | policy | latency s | cost $ | Perf/$ | / best |\n|---|---|---|---|---|---|\n");
    for r in &s.fig15 {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.6} | {:.1} | {:.3} |",
            r.ratio, r.policy, r.latency_s, r.cost_usd, r.perf_per_dollar, r.normalized
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;
    use sonic_sim::{EdgeShape, StageShape};

    fn ml_params(overhead: f64) -> Params {
        Params::from_yaml(&format!(
            "functions:\n  pca: {{ memory_mb: 50, cold_s: 0.2, hot_s: 0.1, instances: 1, overhead_s: {overhead} }}\n  train: {{ memory_mb: 80, cold_s: 0.5, hot_s: 0.4, instances: 6, overhead_s: {overhead} }}\n  combine: {{ memory_mb: 40, cold_s: 0.1, hot_s: 0.1, instances: 1, overhead_s: {overhead} }}\nedges:\n  - {{ from: pca, to: train, bytes: 2000000 }}\n  - {{ from: train, to: combine, bytes: 500000 }}\n"
        ))
        .unwrap()
    }

    /// The Fig. 7 `remote` plan of the committed dilated run: everything on the one t2.large.
    fn remote_plan() -> PlanShape {
        let st = |f: &str, c: u32| StageShape {
            function: f.into(),
            vm_type: "t2.large".into(),
            vms: 1,
            concurrent: c,
        };
        let ed = |a: &str, b: &str| EdgeShape {
            from: a.into(),
            to: b.into(),
            method: sonic_core::model::Method::Remote,
        };
        PlanShape {
            stages: vec![st("pca", 1), st("train", 2), st("combine", 1)],
            edges: vec![ed("pca", "train"), ed("train", "combine")],
        }
    }

    fn inputs(overhead: f64, t2_mbps: Option<f64>) -> ValidationInputs {
        let vms: BTreeMap<String, u32> = ["m5.large", "m5.xlarge", "m5.2xlarge", "t2.large"]
            .iter()
            .map(|t| ((*t).to_owned(), 1))
            .collect();
        ValidationInputs {
            dilation: 16.0,
            catalog: Catalog::default(),
            vms,
            apps: vec![AppInputs {
                app: "ml-pipeline".into(),
                input_bytes: 1_947_657,
                params: ml_params(overhead),
                cells: vec![
                    CellInputs {
                        policy: "remote".into(),
                        jobs: 5,
                        real_latency_s: 0.7,
                        real_cost_usd: 2e-5,
                        plan: Some(remote_plan()),
                        network_mbps: t2_mbps
                            .map(|m| BTreeMap::from([("t2.large".to_owned(), m)]))
                            .unwrap_or_default(),
                    },
                    CellInputs {
                        policy: "local".into(),
                        jobs: 5,
                        real_latency_s: 0.2,
                        real_cost_usd: 2e-5,
                        plan: None,
                        network_mbps: BTreeMap::new(),
                    },
                ],
            }],
        }
    }

    #[test]
    fn saved_inputs_read_back_and_rerun_the_same() {
        let v = inputs(0.05, Some(176.0));
        let text = serde_json::to_string_pretty(&v).unwrap();
        let back: ValidationInputs = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
        let a = validate_inputs(&v).unwrap();
        assert_eq!(a, validate_inputs(&back).unwrap());
        assert_eq!(a.len(), 2);
        assert!(
            a.iter()
                .all(|r| r.sim_latency_s > 0.0 && r.sim_cost_usd > 0.0)
        );
        // `local` had no plan: planned by its policy, on the one largest VM the run had.
        assert_eq!(a[1].policy, "local");
    }

    #[test]
    fn the_overhead_is_paid_once_per_batch_of_the_plan_the_system_ran() {
        let (o0, o1) = (0.0, 0.1);
        let without = validate_inputs(&inputs(o0, None)).unwrap();
        let with = validate_inputs(&inputs(o1, None)).unwrap();
        // The remote plan: pca 1 batch, train 6 on one VM 2 at once (3 batches), combine 1;
        // a chain, so the job takes 5 overheads more.
        let grew = with[0].sim_latency_s - without[0].sim_latency_s;
        assert!((grew - 5.0 * (o1 - o0)).abs() < 1e-6, "{grew}");
        // Paid on the VM too: the one t2.large for 0.5 s more (and the files kept 0.5 s longer
        // in the store: a ten-thousandth of that).
        let price = Catalog::default()
            .vm_type("t2.large")
            .unwrap()
            .usd_per_second();
        let paid = with[0].sim_cost_usd - without[0].sim_cost_usd;
        assert!(
            paid >= 0.5 * price && paid - 0.5 * price < 1e-4 * 0.5 * price,
            "{paid}"
        );
    }

    #[test]
    fn the_bandwidth_the_planner_measured_is_the_one_simulated() {
        let nominal = validate_inputs(&inputs(0.0, None)).unwrap();
        let measured = validate_inputs(&inputs(0.0, Some(100.0))).unwrap();
        // The catalog's t2.large has 500 Mbit/s; at 100 the remote edges take longer.
        assert!(measured[0].sim_latency_s > nominal[0].sim_latency_s + 0.01);
        // `local` moves nothing between VMs.
        assert!((measured[1].sim_latency_s - nominal[1].sim_latency_s).abs() < 1e-9);
    }

    #[test]
    fn a_plan_reports_measured_bandwidths_in_emulated_time() {
        let r = json!({"network_mbps": {
            "t2.large": {"network_mbps": 11.0, "reports": 29, "source": "measured"},
            "m5.large": {"network_mbps": 46.875, "reports": 0, "source": "catalog"}}});
        let n = report_network(&r, 16.0);
        assert_eq!(n, BTreeMap::from([("t2.large".to_owned(), 176.0)]));
        assert!(report_network(&json!({}), 16.0).is_empty());
        // A plan report (as `plans/` keeps them, abridged) is a plan shape.
        let report = json!({"dag": "ml-pipeline", "policy": "remote", "exact": true,
            "edges": [
                {"from": "pca", "method": "remote", "predicted_s": 2.0, "to": "train"},
                {"from": "train", "method": "remote", "predicted_s": 1.4, "to": "combine"}],
            "stages": [
                {"concurrent": 1, "function": "pca", "per_vm": 1, "vm_type": "t2.large", "vms": 1},
                {"concurrent": 2, "function": "train", "per_vm": 6, "vm_type": "t2.large", "vms": 1},
                {"concurrent": 1, "function": "combine", "per_vm": 1, "vm_type": "t2.large", "vms": 1}],
            "timing": []});
        let shape: PlanShape = serde_json::from_value(report).unwrap();
        assert_eq!(shape, remote_plan());
    }
}
