//! `mapreduce-sort`: the MapReduce sort lambdas and the validator of their output.
//!
//! ```text
//! mapreduce-sort split [--to map]       # job input -> <to>/slice-<k> (scatter), `mappers` slices
//! mapreduce-sort map [--to reduce]      # slice -> <to>/part-<j> (shuffle), SONIC_FANOUT_<TO> parts
//! mapreduce-sort reduce                 # parts -> result/part-<instance>, sorted
//! mapreduce-sort validate --input FILE [--input FILE]... OUTPUT...   # a folder, or the parts
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use sonic_lambda::Context;
use sonic_lambdas::sort;

#[derive(Parser)]
#[command(about = "MapReduce sort lambdas (split, map, reduce) and the validator")]
enum Cmd {
    /// Cut the job input into `mappers` slices of whole records, one per mapper.
    Split {
        #[arg(long, default_value = "map")]
        to: String,
    },
    /// Partition a slice by key range into one sorted part per reducer.
    Map {
        #[arg(long, default_value = "reduce")]
        to: String,
    },
    /// Sort every part received and write result/part-<instance>.
    Reduce,
    /// Check that the outputs, in order, are the input sorted (prints a JSON summary).
    Validate {
        /// The job's input file (repeat the flag for several, in order).
        #[arg(long, required = true)]
        input: Vec<PathBuf>,
        /// A folder holding part-<j> files (any depth), or the part files in order.
        #[arg(required = true)]
        output: Vec<PathBuf>,
    },
}

fn run() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::Split { to } => {
            let r = sort::split(&Context::from_env()?, &to)?;
            println!("{}", serde_json::to_string(&r)?);
        }
        Cmd::Map { to } => {
            let r = sort::map(&Context::from_env()?, &to)?;
            println!("{}", serde_json::to_string(&r)?);
        }
        Cmd::Reduce => {
            let n = sort::reduce(&Context::from_env()?)?;
            println!("{{\"records\":{n}}}");
        }
        Cmd::Validate { input, output } => {
            let parts = match output.as_slice() {
                [dir] if dir.is_dir() => sort::result_parts(dir)?,
                files => files.to_vec(),
            };
            let v = sort::validate(&input, &parts).context("the output is not the sorted input")?;
            println!("{}", serde_json::to_string(&v)?);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    sonic_lambdas::init_tracing();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "mapreduce-sort failed");
            ExitCode::FAILURE
        }
    }
}
