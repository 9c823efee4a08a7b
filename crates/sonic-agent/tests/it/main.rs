//! The agent's integration tests, one binary (one link, one place to look): each module was a test
//! file of its own.

mod access;
mod containment;
mod daemon;
mod handler_warm;
mod sandbox_docker;
mod sandbox_process;
mod transfer_paths;
mod transfer_rate;
mod transfer_security;
mod transfer_support;
