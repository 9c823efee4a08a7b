//! What a simulation reports: per job (latency, cost, Perf/$, per-edge method and seconds), per
//! policy (throughput, latency percentiles, total cost, Perf/$), and a text table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use sonic_core::dag::EdgeKind;
use sonic_core::model::Method;
use sonic_core::planner::{Policy, Predicted};

use crate::input::SimConfig;

/// Where one job's money went.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct JobCost {
    /// The job's share of the VMs it held (a VM's price is split among its holders by the
    /// memory they reserved).
    pub vm_usd: f64,
    pub local_storage_usd: f64,
    pub remote_storage_usd: f64,
    pub requests_usd: f64,
    /// The memory tier's share (`memory` edges): the bytes it held, from durable to fetched,
    /// over its capacity, times the node's price.
    pub memory_tier_usd: f64,
    /// What the control plane's job summary charges for the same run (`cost_usd`:
    /// `exec::spans_cost` plus the summary's `storage_usd` and `requests_usd`): each VM the
    /// job had (a lease of its plan) at its type's full price, from the grant of its first
    /// instance's slot to its last instance's end (the `remote` and `memory` uploads included,
    /// which the system makes inside the sender's instance), no share of a VM with other jobs;
    /// plus the storage (the memory tier's share with it) and the requests as above (the
    /// summary keeps files to the job's end, the model to their receiver's: a difference of
    /// millionths). Not part of [`JobCost::total`]: the evaluation compares it with the
    /// measured jobs' cost.
    pub summary_usd: f64,
}

impl JobCost {
    pub fn total(&self) -> f64 {
        self.vm_usd
            + self.local_storage_usd
            + self.remote_storage_usd
            + self.requests_usd
            + self.memory_tier_usd
    }
}

/// How one stage ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageReport {
    pub function: String,
    pub vm_type: String,
    pub vms: u32,
    pub concurrent: u32,
    /// When every input was durable (seconds since the job arrived).
    pub ready_s: f64,
    /// When its first VM was granted.
    pub start_s: f64,
    pub end_s: f64,
    /// Instances that ran (cold + hot): the fanout, if nothing was lost or duplicated.
    pub instances_run: u32,
    pub cold: u32,
    pub hot: u32,
    /// Lambdas its VMs could not run at once because their true memory exceeds the prediction
    /// the plan was made with (planned concurrency minus what ran, summed over its VMs).
    pub batched: u32,
    /// The cluster VMs it ran on (index into the cluster's VM list), one per VM of the plan.
    pub on_vms: Vec<usize>,
    /// Per instance, the VM of the plan it ran on (an index into `on_vms`), as the job machine
    /// placed it (`sonic_core::machine::vm_of`, the control plane's rule).
    pub instance_vms: Vec<u32>,
}

/// How one edge's data moved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeReport {
    pub from: String,
    pub to: String,
    pub kind: EdgeKind,
    pub bytes: f64,
    /// What the first plan said.
    pub planned: Method,
    /// What ran (differs after a fallback, when vm-storage could not be honoured, or when the
    /// memory tier could not hold the edge's true bytes: `remote` then).
    pub method: Method,
    /// Upload to the store or the memory tier: from the sender stage's end until its output
    /// was durable.
    pub upload_s: f64,
    /// The longest fetch into one receiving VM (from that VM's grant to its last byte).
    pub fetch_s: f64,
    pub seconds: f64,
}

/// One job's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobReport {
    pub name: String,
    pub app: String,
    pub policy: Policy,
    pub arrival_s: f64,
    pub finish_s: f64,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub cost: JobCost,
    /// `1 / (latency * cost)`.
    pub perf_per_dollar: f64,
    /// The planner's prediction for its plan, from the parameters it was given.
    pub planned: Predicted,
    /// The model's prediction for the first plan under the job's true parameters: what the
    /// simulation of the job alone on an idle cluster must reproduce.
    pub model_latency_s: f64,
    pub model_cost_usd: f64,
    /// The resource manager vetoed a vm-storage placement and the job switched to its
    /// second-best plan.
    pub fell_back: bool,
    /// Seconds its stages waited for VMs (sum over stages of first grant - ready).
    pub queued_s: f64,
    pub stages: Vec<StageReport>,
    pub edges: Vec<EdgeReport>,
}

/// Per application, within one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppSummary {
    pub app: String,
    pub jobs: usize,
    pub latency_mean_s: f64,
    pub cost_mean_usd: f64,
    /// Mean over jobs of `1 / (latency * cost)` (the paper's "Perf/$ per job").
    pub perf_per_dollar_mean: f64,
}

/// All jobs of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySummary {
    pub policy: Policy,
    pub jobs: usize,
    /// From the first arrival to the last finish.
    pub makespan_s: f64,
    pub throughput_jobs_per_min: f64,
    pub latency_mean_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    pub cost_total_usd: f64,
    pub cost_mean_usd: f64,
    pub perf_per_dollar_mean: f64,
    pub fallbacks: usize,
    pub queued_mean_s: f64,
    pub cold_starts: u64,
    pub hot_starts: u64,
    pub apps: Vec<AppSummary>,
}

/// What the simulator did, for the curious and for benchmarks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterStats {
    pub vms: usize,
    /// `type=count,...`
    pub spec: String,
    pub events: u64,
    pub flows: u64,
    pub instances: u64,
    /// When the last job finished.
    pub end_s: f64,
    /// VM-seconds during which a VM was held by at least one job.
    pub busy_vm_s: f64,
    /// What those VM-seconds cost: the jobs' VM shares add up to it.
    pub busy_usd: f64,
    /// Lambdas running at once, at most (the paper's Fig. 9: 480).
    pub peak_running: u64,
}

/// Everything one simulation reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    pub config: SimConfig,
    pub cluster: ClusterStats,
    pub summary: Vec<PolicySummary>,
    pub jobs: Vec<JobReport>,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (n, s) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Nearest-rank percentile of sorted values (`q` in 0..=1).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Per-policy summaries of `jobs`, in the order policies first appear.
pub(crate) fn summarize(jobs: &[JobReport]) -> Vec<PolicySummary> {
    let mut policies: Vec<Policy> = Vec::new();
    for j in jobs {
        if !policies.contains(&j.policy) {
            policies.push(j.policy);
        }
    }
    policies
        .into_iter()
        .map(|p| {
            let js: Vec<&JobReport> = jobs.iter().filter(|j| j.policy == p).collect();
            let first = js.iter().map(|j| j.arrival_s).fold(f64::INFINITY, f64::min);
            let last = js.iter().map(|j| j.finish_s).fold(0.0, f64::max);
            let makespan = (last - first).max(0.0);
            let mut lat: Vec<f64> = js.iter().map(|j| j.latency_s).collect();
            lat.sort_by(f64::total_cmp);
            let cost_total: f64 = js.iter().map(|j| j.cost_usd).sum();
            let mut apps: BTreeMap<&str, Vec<&JobReport>> = BTreeMap::new();
            for j in &js {
                apps.entry(j.app.as_str()).or_default().push(j);
            }
            PolicySummary {
                policy: p,
                jobs: js.len(),
                makespan_s: makespan,
                throughput_jobs_per_min: if makespan > 0.0 {
                    js.len() as f64 * 60.0 / makespan
                } else {
                    0.0
                },
                latency_mean_s: mean(lat.iter().copied()),
                latency_p50_s: percentile(&lat, 0.5),
                latency_p99_s: percentile(&lat, 0.99),
                cost_total_usd: cost_total,
                cost_mean_usd: cost_total / js.len().max(1) as f64,
                perf_per_dollar_mean: mean(js.iter().map(|j| j.perf_per_dollar)),
                fallbacks: js.iter().filter(|j| j.fell_back).count(),
                queued_mean_s: mean(js.iter().map(|j| j.queued_s)),
                cold_starts: js
                    .iter()
                    .flat_map(|j| &j.stages)
                    .map(|s| u64::from(s.cold))
                    .sum(),
                hot_starts: js
                    .iter()
                    .flat_map(|j| &j.stages)
                    .map(|s| u64::from(s.hot))
                    .sum(),
                apps: apps
                    .into_iter()
                    .map(|(app, aj)| AppSummary {
                        app: app.to_owned(),
                        jobs: aj.len(),
                        latency_mean_s: mean(aj.iter().map(|j| j.latency_s)),
                        cost_mean_usd: mean(aj.iter().map(|j| j.cost_usd)),
                        perf_per_dollar_mean: mean(aj.iter().map(|j| j.perf_per_dollar)),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The summaries of several runs (typically one per policy) as two text tables: per policy,
/// then per application.
pub fn render_table(reports: &[SimReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<7} {:>4} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>8} {:>5} {:>9}",
        "policy",
        "jobs",
        "makespan",
        "jobs/min",
        "lat mean",
        "lat p50",
        "lat p99",
        "queued",
        "total $",
        "$/job",
        "Perf/$",
        "fallb",
        "cold/hot"
    );
    for r in reports {
        for s in &r.summary {
            let _ = writeln!(
                out,
                "{:<7} {:>4} {:>8.1}s {:>8.2} {:>7.1}s {:>7.1}s {:>7.1}s {:>7.1}s {:>9.4} {:>10.6} {:>8.2} {:>5} {:>9}",
                s.policy.as_str(),
                s.jobs,
                s.makespan_s,
                s.throughput_jobs_per_min,
                s.latency_mean_s,
                s.latency_p50_s,
                s.latency_p99_s,
                s.queued_mean_s,
                s.cost_total_usd,
                s.cost_mean_usd,
                s.perf_per_dollar_mean,
                s.fallbacks,
                format!("{}/{}", s.cold_starts, s.hot_starts),
            );
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<16} {:<7} {:>4} {:>9} {:>10} {:>9}",
        "app", "policy", "jobs", "lat mean", "$/job", "Perf/$"
    );
    let mut rows: Vec<(&str, &PolicySummary, &AppSummary)> = Vec::new();
    for r in reports {
        for s in &r.summary {
            for a in &s.apps {
                rows.push((a.app.as_str(), s, a));
            }
        }
    }
    rows.sort_by(|a, b| a.0.cmp(b.0));
    for (app, s, a) in rows {
        let _ = writeln!(
            out,
            "{:<16} {:<7} {:>4} {:>8.1}s {:>10.6} {:>9.2}",
            app,
            s.policy.as_str(),
            a.jobs,
            a.latency_mean_s,
            a.cost_mean_usd,
            a.perf_per_dollar_mean
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
