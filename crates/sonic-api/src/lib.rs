//! Types on the wire between `ofctl`, the control plane and the agents, and nothing else; each
//! control-plane type describes itself for the OpenAPI document (`utoipa::ToSchema`, [`schema`]
//! for the `sonic-core` types it holds).

pub mod agent;
pub mod control;
pub mod plan;
pub mod schema;
pub mod token;
