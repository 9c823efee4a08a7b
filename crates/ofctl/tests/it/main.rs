//! ofctl's integration tests, one binary: each module was a test file of its own.

mod apps;
mod cluster;
mod firstrun;
mod memory;
mod plan;
mod python_client;
