//! The paper's Fig. 9 scenario (§5.5.1): equal portions of the three applications running
//! concurrently on 52 VMs, every policy on the same jobs. The applications are the DAG files of
//! `dags/` with the parameters of `scenarios/fig9/*.params.yaml` (their sources are written in
//! them); both can be replaced.

use std::sync::Arc;

use sonic_core::dag::{Bounds, Dag};
use sonic_core::params::Params;
use sonic_core::planner::Policy;
use sonic_core::units::ByteSize;

use crate::input::{Cluster, JobSpec, SimConfig};
use crate::report::SimReport;
use crate::rng::SplitMix64;
use crate::{SimError, simulate};

/// The paper's cluster: 52 m5.large (2 vCPUs each).
pub const PAPER_CLUSTER: &str = "m5.large=52";

/// 52 VMs of the default catalog's four types.
pub const MIXED_CLUSTER: &str = "m5.large=34,m5.xlarge=8,m5.2xlarge=4,t2.large=6";

/// The built-in DAG files and parameters, by application name.
pub const BUILTIN: [(&str, &str, &str); 3] = [
    (
        "video-analytics",
        include_str!("../../../dags/video-analytics.yaml"),
        include_str!("../scenarios/fig9/video-analytics.params.yaml"),
    ),
    (
        "ml-pipeline",
        include_str!("../../../dags/ml-pipeline.yaml"),
        include_str!("../scenarios/fig9/ml-pipeline.params.yaml"),
    ),
    (
        "mapreduce-sort",
        include_str!("../../../dags/mapreduce-sort.yaml"),
        include_str!("../scenarios/fig9/mapreduce-sort.params.yaml"),
    ),
];

/// One application: its DAG and its true parameters at the scenario's input size.
#[derive(Debug, Clone)]
pub struct App {
    pub dag: Arc<Dag>,
    pub params: Params,
}

impl App {
    pub fn from_yaml(name: &str, dag_yaml: &str, params_yaml: &str) -> Result<App, SimError> {
        let dag = Dag::from_yaml(name, dag_yaml).map_err(|e| SimError::Scenario(e.to_string()))?;
        let params = Params::from_yaml(params_yaml)
            .map_err(|e| SimError::Scenario(format!("{name}: {e}")))?;
        Ok(App {
            dag: Arc::new(dag),
            params,
        })
    }

    /// Functions one job of this application runs.
    pub fn functions(&self) -> u32 {
        self.params.functions.values().map(|f| f.instances).sum()
    }
}

/// The three applications with their built-in parameters.
pub fn builtin_apps() -> Result<Vec<App>, SimError> {
    BUILTIN
        .iter()
        .map(|(name, dag, params)| App::from_yaml(name, dag, params))
        .collect()
}

/// How the Fig. 9 workload is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Jobs in all, the applications taking turns (60 in the paper's largest point).
    pub jobs: usize,
    /// Arrivals are uniform in `[0, spread_s)` ("concurrent invocations").
    pub spread_s: f64,
    /// Relative error of the predicted times and bytes: each is the truth times `1 + u`,
    /// `u` uniform in `[-error, error]` (the paper's predictors reach MAPE <= 15%, §5.6.1).
    /// `sonic` and the baselines plan with the prediction, `oracle` with the truth.
    pub error: f64,
    pub seed: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            jobs: 60,
            spread_s: 5.0,
            error: 0.1,
            seed: 1,
        }
    }
}

/// `params` with every time and byte count off by a random relative error (fanouts and memory
/// kept: see [`JobSpec::predicted`]).
pub fn perturb(params: &Params, error: f64, rng: &mut SplitMix64) -> Params {
    let mut p = params.clone();
    let mut f = |x: f64| x * (1.0 + rng.uniform(-error, error));
    for fp in p.functions.values_mut() {
        fp.cold_s = f(fp.cold_s).max(0.0);
        fp.hot_s = f(fp.hot_s).max(0.0);
    }
    for e in &mut p.edges {
        e.bytes = ByteSize(f(e.bytes.0 as f64).max(0.0).round() as u64);
    }
    p
}

/// The jobs of the workload under one policy. The arrivals and predictions depend on the seed
/// only, so every policy gets the same jobs.
pub fn jobs(apps: &[App], policy: Policy, w: &Workload) -> Vec<JobSpec> {
    let mut rng = SplitMix64::new(w.seed ^ 0x5157_0000_0000_0009);
    (0..w.jobs)
        .filter_map(|i| {
            let app = apps.get(i % apps.len().max(1))?;
            let arrival_s = rng.uniform(0.0, w.spread_s.max(0.0));
            let predicted = (w.error > 0.0).then(|| perturb(&app.params, w.error, &mut rng));
            Some(JobSpec {
                name: format!("{}-{:03}", app.dag.name, i),
                dag: app.dag.clone(),
                params: app.params.clone(),
                predicted,
                arrival_s,
                policy,
                bounds: Bounds::default(),
            })
        })
        .collect()
}

/// Runs the workload once per policy, each on a fresh cluster.
pub fn run(
    cluster: &Cluster,
    apps: &[App],
    w: &Workload,
    policies: &[Policy],
    config: &SimConfig,
) -> Result<Vec<SimReport>, SimError> {
    policies
        .iter()
        .map(|&p| simulate(cluster, &jobs(apps, p, w), config))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_apps_run_their_functions() {
        let apps = builtin_apps().unwrap();
        assert_eq!(apps.len(), 3);
        // mapreduce-sort and ml-pipeline run 8 functions; video-analytics 9 (split, then 4
        // chunks through extract -> classify).
        let counts: Vec<(&str, u32)> = apps
            .iter()
            .map(|a| (a.dag.name.as_str(), a.functions()))
            .collect();
        assert_eq!(
            counts,
            [
                ("video-analytics", 9),
                ("ml-pipeline", 8),
                ("mapreduce-sort", 8)
            ]
        );
        let js = jobs(&apps, Policy::Sonic, &Workload::default());
        assert_eq!(js.len(), 60);
        let functions: u32 = js
            .iter()
            .map(|j| {
                j.params
                    .functions
                    .values()
                    .map(|f| f.instances)
                    .sum::<u32>()
            })
            .sum();
        // 20 jobs of each application (the Fig. 9 mix): 20 x (8 + 8 + 9).
        assert_eq!(functions, 500);
    }

    #[test]
    fn perturbation_is_bounded_and_keeps_shape() {
        let apps = builtin_apps().unwrap();
        let mut rng = SplitMix64::new(3);
        let p = perturb(&apps[1].params, 0.1, &mut rng);
        for (name, f) in &p.functions {
            let t = &apps[1].params.functions[name];
            assert_eq!(f.instances, t.instances);
            assert_eq!(f.memory_mb, t.memory_mb);
            assert!((f.cold_s / t.cold_s - 1.0).abs() <= 0.1 + 1e-12);
        }
    }
}
