//! The control plane: DAG registry, agent registry, persistence and the HTTP API.
//!
//! In layers, each importing only those below it (a test checks, `layers`):
//!
//! - [`http`]: the API routes, the dashboard, the OpenLambda listener's glue; the one place
//!   where errors become statuses.
//! - [`admission`]: a submission checked, its policy chosen, planned under a budget.
//! - [`exec`]: the executor that runs a job's stages on the agents (`sonic_core::machine` decides,
//!   the dispatcher carries it out) and the domain [`exec::Context`] the layers above share.
//! - [`resources`]: the cluster's resource manager and how a plan is granted agents.
//! - [`learn`]: samples, models and modes, the warm ledger, the measured bandwidth.
//! - [`store`]: SQLite, the only module that writes rows.
//!
//! [`clock`] and [`metrics`] serve every layer; [`server`] and [`config`] put them together.

#![warn(missing_docs)]

pub mod admission;
pub mod clock;
pub mod config;
pub mod exec;
pub mod http;
pub mod learn;
pub mod metrics;
pub mod resources;
pub mod server;
pub mod store;

#[cfg(test)]
mod layers;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ControlArgs, ControlConfig};
pub use exec::{Context, JobsConfig, Runtime};
pub use http::api::{Access, ControlState, RouteInfo, Settings, router, routes};
pub use http::error::ApiError;
pub use server::{RunningControl, ServeError, serve, start, start_with_jobs};
pub use store::{Db, StoreError};
