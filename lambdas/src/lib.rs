//! The applications Sonic ships as lambdas, and the synthetic lambda for microbenchmarks.
//!
//! Each application is a library module whose stage functions take a [`sonic_lambda::Context`];
//! the binaries (`mapreduce-sort`, `ml-pipeline`, `video-analytics`, `sonic-gen`) only parse their
//! arguments and call them. [`local`] runs a whole DAG on this machine, for tests and benchmarks.

pub mod local;
pub mod ml;
pub mod rng;
pub mod sort;
pub mod video;
pub mod y4m;

use sonic_lambda::{Context, InputFile, LambdaError};

/// Every file this instance received: from each upstream function (sorted by function, sender,
/// name), or the job's input when the function is a first function.
pub fn input_files(ctx: &Context) -> Result<Vec<InputFile>, LambdaError> {
    let mut files = Vec::new();
    for from in ctx.upstreams()? {
        files.extend(ctx.inputs_from(&from)?);
    }
    if files.is_empty() {
        files = ctx.job_inputs()?;
    }
    Ok(files)
}

/// Structured logs on standard error (the instance's log), `info` unless `RUST_LOG` says otherwise.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
