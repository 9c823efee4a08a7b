//! The control plane: DAG registry, agent registry, persistence and the HTTP API.
//!
//! Jobs run through [`scheduler`] with decisions from [`jobs`]; planning with fitted models is not
//! here yet (every job profiles).

pub mod api;
pub mod clock;
pub mod config;
pub mod error;
pub mod jobs;
pub mod metrics;
pub mod openapi;
pub mod scheduler;
pub mod server;
pub mod store;

pub use api::{ControlState, RouteInfo, Settings, Verb, router, routes};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ControlArgs, ControlConfig};
pub use error::ApiError;
pub use scheduler::{JobsConfig, Runtime};
pub use server::{RunningControl, ServeError, serve, start, start_with_jobs};
pub use store::{Db, StoreError};
