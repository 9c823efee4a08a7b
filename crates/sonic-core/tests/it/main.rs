//! sonic-core's integration tests, one binary: each module was a test file of its own.

mod dag_files;
mod dag_props;
mod findings;
mod fuzz_parsers;
mod planner_budget;
mod planner_props;
