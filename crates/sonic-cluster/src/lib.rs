//! Sonic's cluster as a library: a whole cluster started in this process ([`cluster`]: control
//! plane, agents standing for the catalog's VMs, the object store, the memory tier), and the typed HTTP client of
//! a control plane ([`client`], [`jobs`]) found through the saved context ([`config`]).
//!
//! `ofctl up` and `ofctl demo` run on it, and so does the evaluation (`sonic-eval`): one harness
//! for all of them (docs/ofctl.md, docs/evaluation.md).

pub mod client;
pub mod cluster;
pub mod config;
pub mod jobs;
pub mod progress;

pub use client::Client;
pub use cluster::{
    Cluster, ClusterInfo, ClusterOptions, MemoryArg, MemoryTierInfo, OpenLambdaOptions, SandboxArg,
    StoreArg,
};
