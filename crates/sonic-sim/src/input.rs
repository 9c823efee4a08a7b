//! What a simulation takes: the cluster (VMs of catalog types), the jobs, and the knobs.

use std::sync::Arc;

use serde::Serialize;
use sonic_core::catalog::{Catalog, VmType};
use sonic_core::dag::{Bounds, Dag};
use sonic_core::params::Params;
use sonic_core::planner::Policy;

use crate::SimError;

/// A fixed set of VMs. Its catalog holds only the VM types the cluster has (in the order of the
/// catalog it was built from): that is the catalog every job is planned with, since the resource
/// manager can grant no other type. Storage prices and the object store come from it too.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    catalog: Catalog,
    /// Index into `catalog.vm_types` of every VM.
    vms: Vec<usize>,
}

impl Cluster {
    /// A cluster with `count` VMs of each named type, VMs numbered in the order given.
    pub fn new(catalog: &Catalog, counts: &[(String, u32)]) -> Result<Cluster, SimError> {
        catalog
            .check()
            .map_err(|e| SimError::Cluster(e.to_string()))?;
        for (name, _) in counts {
            if catalog.vm_type(name).is_none() {
                let known: Vec<&str> = catalog.vm_types.iter().map(|v| v.name.as_str()).collect();
                return Err(SimError::Cluster(format!(
                    "unknown VM type {name:?} (the catalog has {})",
                    known.join(", ")
                )));
            }
        }
        let present: Vec<&VmType> = catalog
            .vm_types
            .iter()
            .filter(|v| counts.iter().any(|(n, c)| *n == v.name && *c > 0))
            .collect();
        if present.is_empty() {
            return Err(SimError::Cluster("a cluster needs at least one VM".into()));
        }
        let mut restricted = catalog.clone();
        restricted.vm_types = present.into_iter().cloned().collect();
        let mut vms = Vec::new();
        for (name, count) in counts {
            if let Some(t) = restricted.vm_types.iter().position(|v| v.name == *name) {
                vms.extend(std::iter::repeat_n(t, *count as usize));
            }
        }
        Ok(Cluster {
            catalog: restricted,
            vms,
        })
    }

    /// Parses `m5.large=36,m5.xlarge=10` (type=count, comma-separated).
    pub fn from_spec(catalog: &Catalog, spec: &str) -> Result<Cluster, SimError> {
        let mut counts = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, n) = part.split_once('=').ok_or_else(|| {
                SimError::Cluster(format!("{part:?} is not TYPE=COUNT (e.g. m5.large=52)"))
            })?;
            let n: u32 = n.trim().parse().map_err(|_| {
                SimError::Cluster(format!("{part:?}: {n:?} is not a number of VMs"))
            })?;
            counts.push((name.trim().to_owned(), n));
        }
        Cluster::new(catalog, &counts)
    }

    /// The catalog jobs are planned with: the cluster's VM types only.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The type (index into [`Cluster::catalog`]) of every VM.
    pub fn vms(&self) -> &[usize] {
        &self.vms
    }

    /// `(type name, count)` for every type, in catalog order.
    pub fn counts(&self) -> Vec<(String, u32)> {
        self.catalog
            .vm_types
            .iter()
            .enumerate()
            .map(|(t, v)| {
                let n = self.vms.iter().filter(|&&x| x == t).count() as u32;
                (v.name.clone(), n)
            })
            .collect()
    }

    /// `m5.large=36,m5.xlarge=10`: what [`Cluster::from_spec`] reads.
    pub fn spec(&self) -> String {
        self.counts()
            .iter()
            .map(|(n, c)| format!("{n}={c}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// One job: a DAG at one input size, when it arrives and how it is planned.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub name: String,
    pub dag: Arc<Dag>,
    /// What the job really needs and moves: the simulator runs these; `oracle` plans with them.
    pub params: Params,
    /// What the planner is told for `sonic` and the baselines (the regression's prediction);
    /// `None`: the truth. Must have the same functions, edges and fanouts as `params`. Times,
    /// bytes and memory may differ: slots reserve the predicted memory; when the true footprint
    /// is larger, a VM runs only as many lambdas at once as its memory really holds
    /// (docs/simulator.md, Memory mispredictions).
    pub predicted: Option<Params>,
    pub arrival_s: f64,
    pub policy: Policy,
    pub bounds: Bounds,
}

/// The simulator's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimConfig {
    /// Breaks ties between equally good VMs (a seeded permutation of the VMs).
    pub seed: u64,
    /// How long an idle warm container of a function stays on its VM (seconds).
    pub keep_alive_s: f64,
    /// Lambdas on one VM share its vCPUs: with more running than vCPUs, each computes at
    /// `vcpus / running` of full speed. Off: compute never slows down.
    pub cpu_sharing: bool,
    /// Load-aware admission of `sonic` and `oracle` jobs (docs/simulator.md): at arrival the
    /// job runs the plan, among the planner's best on each set of the cluster's VM types, with
    /// the best predicted Perf/$ once the wait for its VMs is counted (the resource manager's
    /// book of the admitted jobs' predicted stages says when they free up). Off: every job
    /// runs the planner's best plan for the whole cluster, as if alone.
    pub load_aware: bool,
    /// The warm-container rule of the system (`sonic_core::warm`): jobs of a DAG share warm
    /// containers across jobs only once every function's cold-time model has converged.
    /// `None` (default): converged before the run (every job here is planned, which the system
    /// does only after its models converged), so every job shares. `Some(n)`: each DAG's models
    /// start with `n` jobs' cold-time samples and each job that ends adds one; a job that
    /// arrives before they converge (`Convergence::default()`: 5 samples) runs in warm
    /// containers of its own only.
    pub cold_samples: Option<usize>,
    /// The control plane's resource manager accounts vCPU slots besides memory: a granted slot
    /// holds one vCPU per lambda it runs at once (at most its VM's vCPUs) while its stage
    /// computes, and a slot that does not fit waits rather than oversubscribing the VM. Off:
    /// slots are granted by memory alone, and lambdas beyond the vCPUs share them.
    pub vcpu_slots: bool,
    /// Prewarming, as the control plane's executor does it (`JobsConfig::prewarm`): a stage that
    /// reads from other stages gets its containers started on its VMs once the first of its
    /// senders starts, so its cold instances pay their cold start (`start_s`) only as far as
    /// that start is not yet over when they run; the planner prices it
    /// (`PlanProblem::with_prewarm`). Off (default): every cold instance pays its cold time.
    pub prewarm: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            // The agents' default (`warm_idle_s`).
            keep_alive_s: sonic_core::warm::DEFAULT_KEEP_ALIVE_S as f64,
            cpu_sharing: true,
            load_aware: true,
            cold_samples: None,
            vcpu_slots: true,
            prewarm: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_restriction() {
        let cat = Catalog::default();
        let c = Cluster::from_spec(&cat, "m5.xlarge=2, m5.large=3").unwrap();
        // Catalog order is kept; absent types are dropped.
        assert_eq!(c.catalog().vm_types.len(), 2);
        assert_eq!(c.catalog().vm_types[0].name, "m5.large");
        assert_eq!(c.spec(), "m5.large=3,m5.xlarge=2");
        assert_eq!(c.vms(), &[1, 1, 0, 0, 0]);
        assert!(Cluster::from_spec(&cat, "m9.huge=1").is_err());
        assert!(Cluster::from_spec(&cat, "m5.large").is_err());
        assert!(Cluster::from_spec(&cat, "m5.large=0").is_err());
    }
}
