//! The `ofctl` commands as library calls, so tests run them without a process.

pub mod plan;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// For people.
    #[default]
    Table,
    /// One JSON document on stdout.
    Json,
}

#[derive(Debug, Parser)]
#[command(name = "ofctl", version, about = "Sonic: plan and run serverless DAGs")]
pub struct Cli {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Offline: the plan the optimizer picks for a DAG at given DAG parameters (no server needed).
    Plan {
        /// The DAG file (YAML).
        #[arg(long)]
        dag: PathBuf,
        /// The DAG parameters at one input size (YAML).
        #[arg(long)]
        params: PathBuf,
        /// The VM catalog (YAML); the built-in defaults when omitted.
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// sonic (the planner), remote, local, direct, or oracle.
        #[arg(long, default_value = "sonic")]
        policy: String,
    },
}

/// Runs one command, writing its answer to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan {
            dag,
            params,
            catalog,
            policy,
        } => plan::run(&dag, &params, catalog.as_deref(), &policy, cli.output, out),
    }
}
