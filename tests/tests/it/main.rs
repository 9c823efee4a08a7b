//! The cross-crate integration tests, one binary: each module was a test file of its own
//! (`containers.rs`, with its own harness, stays apart).

mod bad_dags;
mod cluster_plan;
mod core_is_pure;
mod yaml_bombs;
