//! The control plane: DAG registry, agent registry, persistence and the HTTP API.
//!
//! Jobs run through [`scheduler`] with decisions from [`jobs`]. Every finished job refits its
//! DAG's models ([`learning`]); once they converge, jobs are planned for their input size and
//! placed by the resource manager ([`planned`]) with the bandwidth the agents measure
//! ([`bandwidth`]). The web [`dashboard`] shares the API's port and token.

#![warn(missing_docs)]

pub mod agent_client;
pub mod api;
pub mod bandwidth;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod executor;
pub mod handlers;
pub mod jobs;
pub mod learning;
pub mod machine;
pub mod metrics;
pub mod openapi;
pub mod planned;
pub mod prewarm;
pub mod reports;
pub mod resources;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod warm;

pub use api::{ControlState, RouteInfo, Settings, Verb, router, routes};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ControlArgs, ControlConfig};
pub use error::ApiError;
pub use scheduler::{JobsConfig, Runtime};
pub use server::{RunningControl, ServeError, serve, start, start_with_jobs};
pub use store::{Db, StoreError};
