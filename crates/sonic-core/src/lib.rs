//! The pure core of Sonic: what a DAG is, what its execution costs, and the planner that decides
//! placement and data passing. No I/O: time and randomness come in as arguments.

pub mod catalog;
pub mod dag;
pub mod dist;
pub mod held;
pub mod machine;
pub mod mode;
pub mod model;
pub mod params;
pub mod planner;
pub mod regression;
pub mod schedule;
pub mod setting;
pub mod slo;
pub mod tails;
pub mod units;
pub mod warm;
mod yaml;
