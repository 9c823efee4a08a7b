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

use sonic_sim::experiments as ex;
use sonic_sim::{Cluster, JobSpec, SimConfig, validate_alone};

use super::report::Verdict;
use crate::charts::{self, BarChart, BarGroup, LineChart, Series};

use super::apps;
use super::{Results, aggregate};
use sonic_cluster::ClusterInfo;

/// VMs of each type in the simulated copy of the emulated cluster.
pub const VALIDATION_VMS: u32 = 64;

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
        "remote" => Policy::Remote,
        "local" => Policy::Local,
        "direct" => Policy::Direct,
        "oracle" => Policy::Oracle,
        _ => return None,
    })
}

/// Simulates each Fig. 7 cell's job alone on the emulated cluster's VMs, with the parameters the
/// profiling jobs measured at the measured input size, and sets it next to the real mean.
pub fn validate(
    catalog: &Catalog,
    real: &ClusterInfo,
    results: &Results,
) -> anyhow::Result<Vec<ValidationRow>> {
    // The emulated cluster runs every VM a plan asks for (several share an agent, each charged
    // as its own VM): it stands for a cluster with enough VMs of each of its types.
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for a in &real.agents {
        counts.insert(a.vm_type.clone(), VALIDATION_VMS);
    }
    let counts: Vec<(String, u32)> = counts.into_iter().collect();
    let cluster = Cluster::new(catalog, &counts).map_err(|e| anyhow!("{e}"))?;
    let cells = aggregate(&results.rows);
    let mut out = Vec::new();
    for app in apps::apps() {
        let Some(&(_, bytes)) = results.measured_sizes.get(app.name) else {
            continue;
        };
        let Some(samples) = results_samples(results, app.name) else {
            continue;
        };
        let dag = Dag::from_yaml(app.file, app.yaml).map_err(|e| anyhow!("{e}"))?;
        let params = sonic_control::learning::measured_params(&dag, samples, bytes)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("{}: measured parameters", app.name))?;
        let dag = Arc::new(dag);
        for c in cells
            .iter()
            .filter(|c| c.experiment == "fig7" && c.app == app.name)
        {
            let Some(p) = policy(&c.policy) else {
                continue;
            };
            let job = JobSpec {
                name: format!("{}-{}", app.name, c.policy),
                dag: dag.clone(),
                params: params.clone(),
                predicted: None,
                arrival_s: 0.0,
                policy: p,
                bounds: dag.bounds,
            };
            let v = validate_alone(&cluster, &job, &SimConfig::default())
                .map_err(|e| anyhow!("{}: {e}", job.name))?;
            out.push(ValidationRow {
                app: app.name.into(),
                policy: c.policy.clone(),
                real_latency_s: c.latency_s,
                sim_latency_s: v.job.latency_s,
                real_cost_usd: c.cost_usd,
                sim_cost_usd: v.job.cost_usd,
            });
        }
    }
    Ok(out)
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
