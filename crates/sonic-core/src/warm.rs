//! The warm-container rule the control plane and the agents follow, shared with the simulator
//! (`sonic-sim`) so that both apply the same one:
//!
//! - A warm container serves later runs of the same function: its identity across jobs is the
//!   DAG's name, the function's name and its definition (`sonic_api::agent::function_key` hashes
//!   the definition), so a DAG applied again with a changed function gets containers of its own.
//! - Until every function's cold-time model of the DAG has converged, a job's runs share warm
//!   containers only among themselves (so every profiling job measures cold and hot starts);
//!   from then on they share them with every job of the function ([`shares_across_jobs`]). The
//!   control plane also shares them for every planned job, whatever the models' state when it
//!   starts (its plan was priced with the warm containers the pool keeps); the simulator plans
//!   every job and applies the convergence rule only.
//! - An idle warm container is kept [`DEFAULT_KEEP_ALIVE_S`] seconds after its last run (the
//!   agent's `warm_idle_s` default).

use crate::regression::DagModels;

/// How long an agent keeps an idle warm container after its last run, by default (seconds):
/// `sonic-agent`'s `warm_idle_s` default (docs/agent.md, warm starts).
pub const DEFAULT_KEEP_ALIVE_S: u64 = 60;

/// Whether a job of this DAG shares warm containers with the other jobs of its functions (true)
/// or only among its own runs (false): true once every function's cold-time model has
/// converged under the models' convergence rule.
pub fn shares_across_jobs(models: &DagModels) -> bool {
    let rule = &models.convergence;
    models.functions.values().all(|f| f.cold_s.converged(rule))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regression::{Convergence, FunctionSample};
    use std::collections::BTreeMap;

    fn sample(cold: f64) -> BTreeMap<String, FunctionSample> {
        let mut m = BTreeMap::new();
        m.insert(
            "f".to_string(),
            FunctionSample {
                cold_s: Some(cold),
                ..Default::default()
            },
        );
        m
    }

    #[test]
    fn jobs_share_only_once_cold_times_converged() {
        let rule = Convergence::default();
        let mut m = DagModels::for_names(&["f".to_string()], &[], rule, 1);
        for k in 0..rule.min_samples {
            assert!(!shares_across_jobs(&m), "shared after {k} samples");
            m.add_sample(1e6 * (1 + k % 2) as f64, &sample(2.0), &[])
                .unwrap();
        }
        assert!(shares_across_jobs(&m));
    }
}
