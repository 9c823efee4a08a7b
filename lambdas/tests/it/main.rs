//! The lambdas' integration tests, one binary: each module was a test file of its own.

mod support;

mod apps;
mod dags;
mod local;
mod sizes;
mod trends;
