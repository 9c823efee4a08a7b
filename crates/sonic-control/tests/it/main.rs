//! The control plane's integration tests, one binary (one link, one place to look): each module
//! was a test file of its own. `logs.rs` stays a binary of its own: it installs the process's
//! global logger.

mod support;

/// The kit's agent processes (`support::Builder::agent_processes`): this binary re-run with
/// the agent's description in its environment runs only this test; otherwise it does nothing.
#[test]
fn agent_process_entry() {
    support::agent_process_main();
}

/// The kit's control plane process (`support::Builder::control_process`), as
/// [`agent_process_entry`].
#[test]
fn control_process_entry() {
    support::control_process_main();
}

// The example host platform (examples/host), which `embedding` runs: its modules name each other
// from the crate's root.
#[path = "../../examples/host/containers.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod containers;
#[path = "../../examples/host/on_demand.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod on_demand;
#[path = "../../examples/host/platform.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod platform;

mod api;
mod bad_requests;
mod browser;
mod dashboard;
mod embedding;
mod executor;
mod faults;
mod fuzz_api;
mod handlers;
mod jobs;
mod observe;
mod push;
mod resources;
mod standalone;
