//! What Sonic's daemons (`sonic-control`, `sonic-agent`) and `ofctl` share:
//!
//! - [`config`]: one loader for every daemon's configuration: defaults, then a YAML file, then
//!   flags and environment variables (clap folds both into the same arguments), each layer
//!   overriding the one before it, with errors that name the file or the flag.
//! - [`secret`]: secrets from files, generated secrets kept in a data folder.
//! - [`tls`]: HTTPS for the daemons' servers (rustls) and clients that verify a private CA.
//! - [`net`]: listening sockets with an accept queue for bursts of connections.
//! - [`logging`]: text or JSON log lines (`--log-format`), with the job and run spans.
//! - [`metrics`]: a per-daemon registry of counters, gauges and histograms in the Prometheus
//!   text format.
//! - [`routes`]: a daemon's route table (method, path, guard, handler), its router and its list.

pub mod config;
pub mod cron;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod routes;
pub mod secret;
pub mod tls;

pub use config::{ConfigError, Layers};
pub use tls::{TlsFiles, serve};
