//! Types on the wire between `ofctl`, the control plane and the agents, and nothing else.

pub mod agent;
pub mod control;
pub mod plan;
pub mod token;
