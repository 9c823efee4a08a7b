//! The plan document a planned job records (`JobSummary.plan.report`) and
//! `GET /v1/dags/{name}/plan` answers: `ofctl plan -o json`'s document (interfaces.md §3) with
//! what the control plane knew when it planned.
//!
//! One type, built once where the job is planned and filled in by field where the control plane
//! learns more (the baselines at admission, the pool's limits at a re-plan, the plan that ran at
//! placement); never patched by key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sonic_core::planner::{self, Plan, Policy, Predicted};
use utoipa::ToSchema;

/// A planned job's plan document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PlanReport {
    /// What `ofctl plan -o json` prints: the plan that runs (its stages, edges, prediction and
    /// timing at the top level), the second-best plan, the planning time, whether it is exact.
    #[serde(flatten)]
    #[schema(schema_with = crate::schema::planner_report)]
    pub plan: planner::PlanReport,
    /// The job's input size the plan was made for.
    #[serde(default)]
    pub input_bytes: u64,
    /// Whether the DAG's models had converged (absent for a plan from given parameters, such as
    /// the oracle's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_converged: Option<bool>,
    /// Per VM type, the bandwidth planned with and where it came from.
    #[serde(default)]
    pub network_mbps: BTreeMap<String, TypeBandwidth>,
    /// What the alive agents kept warm for the DAG's functions when it was planned (what `warm`
    /// on stages was priced on): per function, one entry per agent keeping idle warm
    /// environments of it.
    #[serde(default)]
    pub warm_pool: BTreeMap<String, Vec<WarmAgent>>,
    /// What each baseline policy would predict at the same parameters (`remote`, `direct`,
    /// `local`): why this plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, Baseline>>)]
    pub baselines: Option<BTreeMap<Policy, Baseline>>,
    /// The most VMs of each type a stage could have when the plan was made again under the
    /// resource manager's pool (absent when it was not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_limits: Option<BTreeMap<String, u32>>,
    /// With `vm_limits`: the plan the policy asked for before the pool's limits, what a cluster
    /// with enough VMs of each type would have run (its stages' `vms` against the agents the job
    /// ran on show how far the plan was squeezed; docs/evaluation.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::plan)]
    pub unlimited: Option<Plan>,
    /// When the job ran its second-best plan (the top level), the best plan it was planned with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::plan)]
    pub best: Option<Plan>,
    /// What makes the prediction less sure than usual, in words: an input outside the sizes the
    /// models learned from (they extrapolate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl PlanReport {
    /// The document for `plan`, made for an input of `input_bytes`.
    pub fn new(plan: planner::PlanReport, input_bytes: u64) -> PlanReport {
        PlanReport {
            warnings: Vec::new(),
            plan,
            input_bytes,
            models_converged: None,
            network_mbps: BTreeMap::new(),
            warm_pool: BTreeMap::new(),
            baselines: None,
            vm_limits: None,
            unlimited: None,
            best: None,
        }
    }

    /// The plan that runs (the top level), as a [`Plan`].
    pub fn running(&self) -> Plan {
        Plan {
            stages: self.plan.stages.clone(),
            edges: self.plan.edges.clone(),
            predicted: self.plan.predicted,
            timing: self.plan.timing.clone(),
        }
    }

    /// The plan the policy asked for: [`PlanReport::unlimited`] when the pool's limits made it
    /// plan again, else the plan that runs.
    pub fn asked(&self) -> Plan {
        self.unlimited.clone().unwrap_or_else(|| self.running())
    }

    /// What the plan that runs predicts.
    pub fn predicted(&self) -> Predicted {
        self.plan.predicted
    }

    /// The document of a job that runs the second-best plan: `second` at the top level, the
    /// best plan under `best`.
    pub fn running_second_best(mut self, second: Plan) -> PlanReport {
        let best = Plan {
            stages: std::mem::replace(&mut self.plan.stages, second.stages),
            edges: std::mem::replace(&mut self.plan.edges, second.edges),
            predicted: std::mem::replace(&mut self.plan.predicted, second.predicted),
            timing: std::mem::replace(&mut self.plan.timing, second.timing),
        };
        self.best = Some(best);
        self
    }
}

/// Where a VM type's bandwidth in a plan came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BandwidthSource {
    /// The agents' moving average of their peer transfers.
    Measured,
    /// Nobody measured it yet: the catalog's nominal figure.
    Catalog,
}

impl BandwidthSource {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BandwidthSource::Measured => "measured",
            BandwidthSource::Catalog => "catalog",
        }
    }
}

/// The bandwidth a plan used for one VM type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TypeBandwidth {
    /// Megabits per second.
    pub network_mbps: f64,
    /// Where it came from.
    pub source: BandwidthSource,
    /// Agent reports averaged (0 for `catalog`).
    pub reports: u64,
}

/// One agent keeping idle warm environments of a function when a job was planned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WarmAgent {
    /// The agent's id.
    pub agent: String,
    /// Its VM type.
    pub vm_type: String,
    /// How many idle warm environments of the function it keeps.
    pub idle: u32,
}

/// What one baseline policy would predict at a job's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Baseline {
    /// Its plan's prediction.
    Predicted {
        latency_s: f64,
        cost_usd: f64,
        perf_per_dollar: f64,
    },
    /// Why the baseline has no plan.
    Failed { error: String },
}

impl Baseline {
    /// The figures of a plan's prediction.
    pub fn of(p: &Predicted) -> Baseline {
        Baseline::Predicted {
            latency_s: p.latency_s,
            cost_usd: p.cost_usd,
            perf_per_dollar: p.perf_per_dollar,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_what_it_wrote_and_keeps_the_documents_keys() {
        let json = serde_json::json!({
            "dag": "d",
            "policy": "sonic",
            "stages": [{ "function": "f", "vm_type": "m5.large", "vms": 1, "per_vm": 1, "concurrent": 1, "cores": 1.0 }],
            "edges": [],
            "predicted": { "latency_s": 1.5, "cost_usd": 0.001, "perf_per_dollar": 666.0, "requests_usd": 0.0 },
            "timing": [],
            "second_best": null,
            "planning_time_us": 12,
            "exact": true,
            "stopped": null,
            "input_bytes": 1000,
            "models_converged": true,
            "network_mbps": { "m5.large": { "network_mbps": 750.0, "source": "catalog", "reports": 0 } },
            "warm_pool": { "f": [{ "agent": "a-1", "vm_type": "m5.large", "idle": 2 }] },
            "baselines": {
                "remote": { "latency_s": 2.0, "cost_usd": 0.002, "perf_per_dollar": 250.0 },
                "local": { "error": "no VM type fits" }
            }
        });
        let r: PlanReport = serde_json::from_value(json.clone()).expect("reads");
        assert_eq!(r.input_bytes, 1000);
        assert_eq!(r.predicted().latency_s, 1.5);
        assert_eq!(r.warm_pool["f"][0].idle, 2);
        assert_eq!(
            r.baselines.as_ref().map(|b| b[&Policy::Local].clone()),
            Some(Baseline::Failed {
                error: "no VM type fits".into()
            })
        );
        assert_eq!(serde_json::to_value(&r).expect("writes"), json);
    }

    #[test]
    fn a_second_best_run_keeps_the_best_plan_under_best() {
        let plan = |latency_s: f64| Plan {
            stages: Vec::new(),
            edges: Vec::new(),
            predicted: Predicted {
                latency_s,
                cost_usd: 1.0,
                perf_per_dollar: 1.0 / latency_s,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: Vec::new(),
        };
        let best = plan(1.0);
        let report = planner::PlanReport {
            dag: "d".into(),
            policy: Policy::Sonic,
            stages: best.stages.clone(),
            edges: best.edges.clone(),
            predicted: best.predicted,
            timing: Vec::new(),
            second_best: Some(plan(2.0)),
            planning_time_us: 1,
            exact: true,
            stopped: None,
            slo: None,
        };
        let r = PlanReport::new(report, 5).running_second_best(plan(2.0));
        assert_eq!(r.predicted().latency_s, 2.0);
        assert_eq!(r.best.map(|b| b.predicted.latency_s), Some(1.0));
    }
}
