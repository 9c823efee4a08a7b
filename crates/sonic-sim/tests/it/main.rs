//! The simulator's integration tests, one binary: each module was a test file of its own.

mod experiments;
mod sim;
