//! A discrete-event simulator of Sonic on a shared cluster (docs/simulator.md).
//!
//! Every job is planned with [`sonic_core::planner::plan`] and then executed on a fixed set of
//! VMs shared by all jobs: a resource manager grants each stage's VMs by free memory (queueing
//! when the cluster is full, falling back to the planner's second-best plan when a vm-storage
//! placement cannot be granted), NICs, the object store and the memory tier are shared fairly
//! by concurrent transfers (max-min fair processor sharing), vCPUs are shared by the lambdas on
//! a VM, and warm containers make later runs of a function hot. Costs follow the model's
//! accounting (`docs/model.md`), with a VM's price split among the jobs that hold it at each
//! instant.
//!
//! The simulator takes time and randomness as inputs (a seed) and does no I/O: the same inputs
//! give the same report, bit for bit.

mod engine;
pub mod experiments;
mod input;
mod net;
mod report;
mod rng;
pub mod scenario;

pub use engine::{
    EdgeShape, PlanShape, StageShape, Validation, simulate, simulate_given, validate_alone,
    validate_plan,
};
pub use input::{Cluster, JobSpec, SimConfig};
pub use report::{
    AppSummary, ClusterStats, EdgeReport, JobCost, JobReport, PolicySummary, SimReport,
    StageReport, render_table,
};
pub use rng::SplitMix64;

/// Why a simulation could not run or finish.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("job {job:?}: {message}")]
    Job { job: String, message: String },
    #[error(
        "the simulation stalled at {at_s:.3} s with {unfinished} unfinished jobs (requests that can never be granted)"
    )]
    Stalled { at_s: f64, unfinished: usize },
    #[error("scenario: {0}")]
    Scenario(String),
}
