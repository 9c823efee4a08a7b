//! The paper's experiments at its scale, in the simulator (docs/simulator.md, Experiments):
//! Fig. 6 (direct vs remote for a broadcast fanout on two VM types), Fig. 9 (the mixed workload
//! at 15 to 60 jobs), Fig. 14 (memory prediction noise) and Fig. 15 (cold-to-hot ratio). Each
//! function returns rows; `*_to_csv` writes them as plain CSV. Every result is a function of
//! the seed.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;
use sonic_core::catalog::Catalog;
use sonic_core::dag::{Bounds, Dag};
use sonic_core::model::{Assignment, Method, Placement, perf_per_dollar};
use sonic_core::params::Params;
use sonic_core::planner::Policy;

use crate::engine::simulate_plans;
use crate::input::{Cluster, JobSpec, SimConfig};
use crate::scenario::{self, App, MIXED_CLUSTER, PAPER_CLUSTER, Workload};
use crate::{SimError, simulate};

fn err(e: impl std::fmt::Display) -> SimError {
    SimError::Scenario(e.to_string())
}

fn lone_job(app: &App, params: Params, predicted: Option<Params>, policy: Policy) -> JobSpec {
    JobSpec {
        name: format!("{}-0", app.dag.name),
        dag: app.dag.clone(),
        params,
        predicted,
        arrival_s: 0.0,
        policy,
        bounds: Bounds::default(),
    }
}

fn csv(header: &str, rows: impl Iterator<Item = String>) -> String {
    let mut out = String::from(header);
    out.push('\n');
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    out
}

// ---- Fig. 6 ----

/// One point of Fig. 6: the LightGBM DAG with `fanout` trees, every edge forced to `method`,
/// one lambda per VM, all VMs of `vm_type`, alone on an idle cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fig6Row {
    pub vm_type: String,
    pub fanout: u32,
    pub method: Method,
    pub latency_s: f64,
    pub cost_usd: f64,
}

/// The fanouts of Fig. 6.
pub const FIG6_FANOUTS: [u32; 9] = [1, 2, 3, 4, 6, 8, 10, 12, 16];

/// The VM types of Fig. 6 (the built-in catalog: 750 and 1250 Mbit/s).
pub const FIG6_VM_TYPES: [&str; 2] = ["m5.large", "m5.xlarge"];

/// Fig. 6: direct vs remote for the broadcast `pca -> train`, at each fanout and VM type.
pub fn fig6(fanouts: &[u32], config: &SimConfig) -> Result<Vec<Fig6Row>, SimError> {
    let apps = scenario::builtin_apps()?;
    let ml = apps
        .iter()
        .find(|a| a.dag.name == "ml-pipeline")
        .ok_or_else(|| err("no ml-pipeline"))?;
    let catalog = Catalog::default();
    let mut rows = Vec::new();
    for vm_type in FIG6_VM_TYPES {
        let max = fanouts.iter().copied().max().unwrap_or(1);
        let cluster = Cluster::from_spec(&catalog, &format!("{vm_type}={}", max + 2))?;
        for &k in fanouts {
            let mut params = ml.params.clone();
            let base = params.functions["train"].instances.max(1);
            params
                .functions
                .get_mut("train")
                .ok_or_else(|| err("no train"))?
                .instances = k;
            // train -> combine: 3 MB per tree.
            for e in &mut params.edges {
                if e.from == "train" {
                    e.bytes.0 = e.bytes.0 / u64::from(base) * u64::from(k);
                }
            }
            for method in [Method::Direct, Method::Remote] {
                let job = lone_job(ml, params.clone(), None, Policy::Sonic);
                let stages = ml.dag.functions.len();
                let placements = ml
                    .dag
                    .functions
                    .iter()
                    .map(|f| Placement {
                        vm: 0,
                        vms: if f.name == "train" { k } else { 1 },
                        concurrent: 1,
                    })
                    .collect::<Vec<_>>();
                debug_assert_eq!(placements.len(), stages);
                let a = Assignment {
                    placements,
                    methods: vec![method; ml.dag.edges.len()],
                };
                let r = simulate_plans(&cluster, &[job], &[Some(a)], config)?;
                let j = &r.jobs[0];
                rows.push(Fig6Row {
                    vm_type: vm_type.to_owned(),
                    fanout: k,
                    method,
                    latency_s: j.latency_s,
                    cost_usd: j.cost_usd,
                });
            }
        }
    }
    Ok(rows)
}

/// Per VM type, the first fanout at which remote is faster than direct (`None`: never, in
/// the fanouts run).
pub fn fig6_crossover(rows: &[Fig6Row]) -> Vec<(String, Option<u32>)> {
    let mut types: Vec<String> = Vec::new();
    for r in rows {
        if !types.contains(&r.vm_type) {
            types.push(r.vm_type.clone());
        }
    }
    types
        .into_iter()
        .map(|t| {
            let mut ks: Vec<u32> = rows
                .iter()
                .filter(|r| r.vm_type == t)
                .map(|r| r.fanout)
                .collect();
            ks.sort_unstable();
            ks.dedup();
            let lat = |k: u32, m: Method| {
                rows.iter()
                    .find(|r| r.vm_type == t && r.fanout == k && r.method == m)
                    .map(|r| r.latency_s)
            };
            let cross = ks.into_iter().find(|&k| {
                matches!((lat(k, Method::Remote), lat(k, Method::Direct)), (Some(r), Some(d)) if r < d)
            });
            (t, cross)
        })
        .collect()
}

pub fn fig6_to_csv(rows: &[Fig6Row]) -> String {
    csv(
        "vm_type,fanout,method,latency_s,cost_usd",
        rows.iter().map(|r| {
            format!(
                "{},{},{},{:.6},{:.9}",
                r.vm_type, r.fanout, r.method, r.latency_s, r.cost_usd
            )
        }),
    )
}

// ---- Fig. 9 ----

/// One point of the Fig. 9 sweep: one policy on one cluster at one number of jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fig9Row {
    /// `mixed` or `paper`.
    pub cluster: String,
    pub jobs: usize,
    pub policy: Policy,
    /// `1 / (mean latency x mean cost)` over the jobs: the evaluation's one Perf/$ definition
    /// (not the mean of per-job Perf/$, which a few short cheap jobs dominate).
    pub perf_per_dollar: f64,
    pub latency_mean_s: f64,
    pub cost_mean_usd: f64,
    pub makespan_s: f64,
    pub queued_mean_s: f64,
}

/// The job counts of Fig. 9.
pub const FIG9_JOBS: [usize; 4] = [15, 30, 45, 60];

/// Fig. 9: the mixed workload at each job count on the mixed and the paper cluster, per policy.
pub fn fig9_sweep(
    job_counts: &[usize],
    seed: u64,
    config: &SimConfig,
) -> Result<Vec<Fig9Row>, SimError> {
    let apps = scenario::builtin_apps()?;
    let catalog = Catalog::default();
    let mut rows = Vec::new();
    for (name, spec) in [("mixed", MIXED_CLUSTER), ("paper", PAPER_CLUSTER)] {
        let cluster = Cluster::from_spec(&catalog, spec)?;
        for &jobs in job_counts {
            let w = Workload {
                jobs,
                seed,
                ..Workload::default()
            };
            let cfg = SimConfig { seed, ..*config };
            for r in scenario::run(&cluster, &apps, &w, &Policy::ALL, &cfg)? {
                for s in &r.summary {
                    rows.push(Fig9Row {
                        cluster: name.to_owned(),
                        jobs,
                        policy: s.policy,
                        perf_per_dollar: if s.latency_mean_s > 0.0 && s.cost_mean_usd > 0.0 {
                            1.0 / (s.latency_mean_s * s.cost_mean_usd)
                        } else {
                            0.0
                        },
                        latency_mean_s: s.latency_mean_s,
                        cost_mean_usd: s.cost_mean_usd,
                        makespan_s: s.makespan_s,
                        queued_mean_s: s.queued_mean_s,
                    });
                }
            }
        }
    }
    Ok(rows)
}

pub fn fig9_to_csv(rows: &[Fig9Row]) -> String {
    csv(
        "cluster,jobs,policy,perf_per_dollar,latency_mean_s,cost_mean_usd,makespan_s,queued_mean_s",
        rows.iter().map(|r| {
            format!(
                "{},{},{},{:.6},{:.6},{:.9},{:.6},{:.6}",
                r.cluster,
                r.jobs,
                r.policy,
                r.perf_per_dollar,
                r.latency_mean_s,
                r.cost_mean_usd,
                r.makespan_s,
                r.queued_mean_s
            )
        }),
    )
}

// ---- Fig. 14 ----

/// One point of Fig. 14: Sonic planning one job with every function's memory predicted
/// `x (1 + error)`, the simulator running it with the true memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fig14Row {
    pub app: String,
    pub error: f64,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// Perf/$ over Perf/$ at error 0.
    pub relative_to_zero_error: f64,
    /// Lambdas that could not run at once as planned (too little true memory on their VMs).
    pub batched: u32,
    /// VMs the plan asks for, over all stages.
    pub vms: u32,
}

/// The memory errors of Fig. 14.
pub const FIG14_ERRORS: [f64; 7] = [-0.5, -0.3, -0.1, 0.0, 0.1, 0.3, 0.5];

/// The applications of Fig. 14: the three of Fig. 9, and the paper's own Fig. 14 case,
/// MapReduce sort with 30 mappers and 30 reducers (`mapreduce-sort-30`).
pub fn fig14_apps() -> Result<Vec<(String, App)>, SimError> {
    let mut out: Vec<(String, App)> = scenario::builtin_apps()?
        .into_iter()
        .map(|a| (a.dag.name.clone(), a))
        .collect();
    if let Some((_, mr)) = out.iter().find(|(n, _)| n == "mapreduce-sort") {
        let mut big = mr.clone();
        for f in ["map", "reduce"] {
            if let Some(fp) = big.params.functions.get_mut(f) {
                fp.instances = 30;
            }
        }
        out.push(("mapreduce-sort-30".to_owned(), big));
    }
    Ok(out)
}

/// Fig. 14 on each application alone on the paper cluster (52 x m5.large).
pub fn fig14(errors: &[f64], config: &SimConfig) -> Result<Vec<Fig14Row>, SimError> {
    let cluster = Cluster::from_spec(&Catalog::default(), PAPER_CLUSTER)?;
    let mut rows = Vec::new();
    for (name, app) in fig14_apps()? {
        let mut base = None;
        let mut points = Vec::new();
        for &e in errors {
            let mut pred = app.params.clone();
            for f in pred.functions.values_mut() {
                f.memory_mb = (f.memory_mb * (1.0 + e)).round().max(1.0);
            }
            let job = lone_job(&app, app.params.clone(), Some(pred), Policy::Sonic);
            let r = simulate(&cluster, &[job], config)?;
            let j = &r.jobs[0];
            let p = perf_per_dollar(j.latency_s, j.cost_usd);
            if e == 0.0 {
                base = Some(p);
            }
            points.push((e, j.clone(), p));
        }
        let base = match base {
            Some(b) => b,
            None => {
                let job = lone_job(&app, app.params.clone(), None, Policy::Sonic);
                let j = simulate(&cluster, &[job], config)?.jobs.remove(0);
                perf_per_dollar(j.latency_s, j.cost_usd)
            }
        };
        for (e, j, p) in points {
            rows.push(Fig14Row {
                app: name.clone(),
                error: e,
                latency_s: j.latency_s,
                cost_usd: j.cost_usd,
                perf_per_dollar: p,
                relative_to_zero_error: p / base,
                batched: j.stages.iter().map(|s| s.batched).sum(),
                vms: j.stages.iter().map(|s| s.vms).sum(),
            });
        }
    }
    Ok(rows)
}

pub fn fig14_to_csv(rows: &[Fig14Row]) -> String {
    csv(
        "app,error,latency_s,cost_usd,perf_per_dollar,relative_to_zero_error,batched,vms",
        rows.iter().map(|r| {
            format!(
                "{},{},{:.6},{:.9},{:.6},{:.6},{},{}",
                r.app,
                r.error,
                r.latency_s,
                r.cost_usd,
                r.perf_per_dollar,
                r.relative_to_zero_error,
                r.batched,
                r.vms
            )
        }),
    )
}

// ---- Fig. 15 ----

/// One point of Fig. 15: the synthetic one-stage application at one cold-to-hot ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fig15Row {
    pub ratio: f64,
    pub policy: Policy,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// Perf/$ over the best Perf/$ of the policies at this ratio.
    pub normalized: f64,
}

/// The cold-to-hot ratios of Fig. 15.
pub const FIG15_RATIOS: [f64; 8] = [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0];

/// The policies of Fig. 15: Sonic, SAND (`local`), OpenLambda + S3 (`remote`), `direct`.
pub const FIG15_POLICIES: [Policy; 4] =
    [Policy::Sonic, Policy::Local, Policy::Remote, Policy::Direct];

const FIG15_DAG: &str = "\
name: fanout10
description: Fig. 15's synthetic application, one stage of 10 parallel functions.
functions:
  - { name: source, image: x, command: [x] }
  - { name: worker, image: x, command: [x] }
  - { name: sink, image: x, command: [x] }
edges:
  - { from: source, to: worker, kind: scatter }
  - { from: worker, to: sink, kind: gather }
";

/// Hot run of a worker (seconds).
pub const FIG15_HOT_S: f64 = 2.0;

/// The Fig. 15 application at cold-to-hot ratio `r`: a tiny source scatters 10 MB to 10
/// workers (1 GB each, hot 2 s, cold `r` x 2 s), a tiny sink gathers 100 KB.
pub fn fig15_app(r: f64) -> Result<App, SimError> {
    let params = format!(
        "functions:\n  source: {{ memory_mb: 256, cold_s: 0.2, hot_s: 0.2, instances: 1 }}\n  worker: {{ memory_mb: 1024, cold_s: {}, hot_s: {}, instances: 10 }}\n  sink: {{ memory_mb: 256, cold_s: 0.2, hot_s: 0.2, instances: 1 }}\nedges:\n  - {{ from: source, to: worker, bytes: 10MB }}\n  - {{ from: worker, to: sink, bytes: 100KB }}\n",
        r * FIG15_HOT_S,
        FIG15_HOT_S
    );
    let dag = Dag::from_yaml("fanout10", FIG15_DAG).map_err(err)?;
    Ok(App {
        dag: Arc::new(dag),
        params: Params::from_yaml(&params).map_err(err)?,
    })
}

/// Fig. 15: each ratio and policy, one job alone on the paper cluster (52 x m5.large).
pub fn fig15(ratios: &[f64], config: &SimConfig) -> Result<Vec<Fig15Row>, SimError> {
    let cluster = Cluster::from_spec(&Catalog::default(), PAPER_CLUSTER)?;
    let mut rows = Vec::new();
    for &r in ratios {
        let app = fig15_app(r)?;
        let start = rows.len();
        for p in FIG15_POLICIES {
            let job = lone_job(&app, app.params.clone(), None, p);
            let j = simulate(&cluster, &[job], config)?.jobs.remove(0);
            rows.push(Fig15Row {
                ratio: r,
                policy: p,
                latency_s: j.latency_s,
                cost_usd: j.cost_usd,
                perf_per_dollar: perf_per_dollar(j.latency_s, j.cost_usd),
                normalized: 0.0,
            });
        }
        let best = rows[start..]
            .iter()
            .map(|x| x.perf_per_dollar)
            .fold(0.0, f64::max);
        for x in &mut rows[start..] {
            x.normalized = x.perf_per_dollar / best;
        }
    }
    Ok(rows)
}

pub fn fig15_to_csv(rows: &[Fig15Row]) -> String {
    csv(
        "ratio,policy,latency_s,cost_usd,perf_per_dollar,normalized",
        rows.iter().map(|r| {
            format!(
                "{},{},{:.6},{:.9},{:.6},{:.6}",
                r.ratio, r.policy, r.latency_s, r.cost_usd, r.perf_per_dollar, r.normalized
            )
        }),
    )
}

// ---- all of them ----

/// Runs the four experiments and writes `fig6-sim.csv`, `fig9-sim.csv`, `fig14-sim.csv` and
/// `fig15-sim.csv` into `dir`. `quick`: fewer points. Returns a short text summary.
pub fn write_all(dir: &std::path::Path, quick: bool, seed: u64) -> Result<String, SimError> {
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let write = |name: &str, text: String| -> Result<(), SimError> {
        std::fs::write(dir.join(name), text).map_err(|e| err(format!("{name}: {e}")))
    };
    let mut out = String::new();
    let fanouts: &[u32] = if quick { &[1, 4, 8, 16] } else { &FIG6_FANOUTS };
    let f6 = fig6(fanouts, &config)?;
    write("fig6-sim.csv", fig6_to_csv(&f6))?;
    for (t, k) in fig6_crossover(&f6) {
        let _ = writeln!(
            out,
            "fig6: {t}: remote faster from fanout {}",
            k.map_or("(never)".to_owned(), |k| k.to_string())
        );
    }
    let jobs: &[usize] = if quick { &[15, 60] } else { &FIG9_JOBS };
    let f9 = fig9_sweep(jobs, seed, &config)?;
    write("fig9-sim.csv", fig9_to_csv(&f9))?;
    for r in f9.iter().filter(|r| r.jobs == *jobs.last().unwrap_or(&60)) {
        let _ = writeln!(
            out,
            "fig9: {} {} jobs {}: Perf/$ {:.2}, latency {:.1} s",
            r.cluster, r.jobs, r.policy, r.perf_per_dollar, r.latency_mean_s
        );
    }
    let errors: &[f64] = if quick {
        &[-0.5, 0.0, 0.5]
    } else {
        &FIG14_ERRORS
    };
    let f14 = fig14(errors, &config)?;
    write("fig14-sim.csv", fig14_to_csv(&f14))?;
    for r in &f14 {
        let _ = writeln!(
            out,
            "fig14: {} error {:+}: relative {:.3} ({} batched)",
            r.app, r.error, r.relative_to_zero_error, r.batched
        );
    }
    let ratios: &[f64] = if quick {
        &[1.0, 3.0, 10.0]
    } else {
        &FIG15_RATIOS
    };
    let f15 = fig15(ratios, &config)?;
    write("fig15-sim.csv", fig15_to_csv(&f15))?;
    for r in &f15 {
        let _ = writeln!(
            out,
            "fig15: ratio {} {}: normalized {:.3}",
            r.ratio, r.policy, r.normalized
        );
    }
    Ok(out)
}
