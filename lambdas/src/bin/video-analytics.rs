//! `video-analytics`: the video analytics lambdas.
//!
//! ```text
//! video-analytics split [--to extract]     # Y4M -> <to>/chunk-<k>.y4m (scatter), `chunk_seconds`
//! video-analytics extract [--to collect]   # chunk -> representative frame -> <to>/label.json
//! video-analytics collect                  # labels -> result/labels.json
//! video-analytics score --labels labels.json --truth truth.json   # against `sonic-gen video --truth`
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use sonic_lambda::Context;
use sonic_lambdas::video;

#[derive(Parser)]
#[command(about = "Video analytics lambdas (split, extract, collect) and a scorer")]
enum Cmd {
    /// Cut the video into chunks of `chunk_seconds`, one per extract instance.
    Split {
        #[arg(long, default_value = "extract")]
        to: String,
    },
    /// Pick a chunk's representative frame and classify it with the embedded model.
    Extract {
        #[arg(long, default_value = "collect")]
        to: String,
    },
    /// Gather one label per chunk into result/labels.json.
    Collect,
    /// Compare result/labels.json with a generated video's truth (prints JSON).
    Score {
        #[arg(long)]
        labels: PathBuf,
        #[arg(long)]
        truth: PathBuf,
    },
}

fn read_json<T: serde::de::DeserializeOwned>(path: &PathBuf) -> anyhow::Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{}", path.display()))
}

fn run() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::Split { to } => {
            let chunks = video::split_stage(&Context::from_env()?, &to)?;
            println!("{{\"chunks\":{chunks}}}");
        }
        Cmd::Extract { to } => {
            let l = video::extract_stage(&Context::from_env()?, &to)?;
            println!("{}", serde_json::to_string(&l)?);
        }
        Cmd::Collect => {
            let l = video::collect_stage(&Context::from_env()?)?;
            println!("{{\"chunks\":{}}}", l.chunks);
        }
        Cmd::Score { labels, truth } => {
            let labels: video::Labels = read_json(&labels)?;
            let truth: video::Truth = read_json(&truth)?;
            let (right, total) = truth.score(&labels);
            let accuracy = if total == 0 {
                0.0
            } else {
                right as f64 / total as f64
            };
            println!(
                "{}",
                serde_json::json!({ "right": right, "chunks": total, "accuracy": accuracy })
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    sonic_lambdas::init_tracing();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "video-analytics failed");
            ExitCode::FAILURE
        }
    }
}
