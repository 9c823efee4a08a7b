//! Why a plan was chosen: what the paper's static policies (`remote`: OpenLambda + S3,
//! `direct`, `local`: SAND, and with a memory tier `memory`: OpenLambda + Pocket) would predict at the same DAG parameters, recorded with a planned
//! job's plan (`report.baselines`) so its page can compare them with the plan that ran.

use std::collections::BTreeMap;

use sonic_api::plan::Baseline;
use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::model::PlanProblem;
use sonic_core::params::Params;
use sonic_core::planner::{self, Policy};

/// Per baseline policy, its predicted latency, cost and Perf/$ (or why it has no plan).
/// Baselines ignore the DAG's bounds, as the planner's baselines do.
pub fn baselines(dag: &Dag, params: &Params, catalog: Catalog) -> BTreeMap<Policy, Baseline> {
    // `memory` only where the cluster has a tier (without one it is `remote`).
    let policies: Vec<Policy> = Policy::BASELINES
        .into_iter()
        .filter(|&p| p != Policy::Memory || catalog.memory_tier.is_some())
        .collect();
    let problem = match PlanProblem::from_dag(dag, params, catalog, dag.bounds) {
        Ok(p) => p,
        Err(e) => {
            let error = e.to_string();
            return policies
                .into_iter()
                .map(|p| {
                    (
                        p,
                        Baseline::Failed {
                            error: error.clone(),
                        },
                    )
                })
                .collect();
        }
    };
    policies
        .into_iter()
        .map(|policy| {
            let b = match planner::plan(&problem, policy) {
                Ok(o) => Baseline::of(&o.best.predicted),
                Err(e) => Baseline::Failed {
                    error: e.to_string(),
                },
            };
            (policy, b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_baseline_is_predicted() {
        let dag = Dag::from_yaml(
            "fan.yaml",
            "name: fan\nfunctions:\n  - { name: gen, image: i, command: [x] }\n  - { name: sink, image: i, command: [x] }\nedges:\n  - { from: gen, to: sink, kind: one }\n",
        )
        .expect("dag");
        let params = Params::from_yaml(
            "functions:\n  gen: { memory_mb: 256, cold_s: 1.0, hot_s: 0.9, instances: 1 }\n  sink: { memory_mb: 256, cold_s: 0.5, hot_s: 0.4, instances: 1 }\nedges:\n  - { from: gen, to: sink, bytes: 10MB }\n",
        )
        .expect("params");
        let v =
            serde_json::to_value(baselines(&dag, &params, Catalog::default())).expect("encodes");
        for p in ["remote", "direct", "local"] {
            assert!(
                v[p]["perf_per_dollar"].as_f64().is_some_and(|x| x > 0.0),
                "{p}: {v}"
            );
        }
    }
}
