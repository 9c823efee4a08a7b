//! `video-analytics`: the video analytics lambdas.
//!
//! ```text
//! video-analytics split [--to extract]      # Y4M -> <to>/chunk-<k>.y4m (scatter), `chunk_seconds`
//! video-analytics extract [--to classify]   # chunk -> <to>/frame.y4m + <to>/frame.json
//! video-analytics classify                  # frame -> result/label-<k>.json
//! video-analytics score --labels RESULT_DIR_OR_FILES... --truth truth.json   # against `sonic-gen video --truth`
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use sonic_lambda::Context;
use sonic_lambdas::video;

#[derive(Parser)]
#[command(about = "Video analytics lambdas (split, extract, classify) and a scorer")]
enum Cmd {
    /// Cut the video into chunks of `chunk_seconds`, one per extract instance.
    Split {
        #[arg(long, default_value = "extract")]
        to: String,
    },
    /// Pick a chunk's representative frame and send it (frame.y4m, frame.json).
    Extract {
        #[arg(long, default_value = "classify")]
        to: String,
    },
    /// Classify the frame with the embedded model into result/label-<chunk>.json.
    Classify,
    /// Compare a job's label files (result/label-*.json, or the folder holding them) with a
    /// generated video's truth (prints JSON); fails unless there is one label per chunk.
    Score {
        #[arg(long, num_args = 1.., required = true)]
        labels: Vec<PathBuf>,
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
        Cmd::Classify => {
            let l = video::classify_stage(&Context::from_env()?)?;
            println!("{}", serde_json::to_string(&l)?);
        }
        Cmd::Score { labels, truth } => {
            let labels = video::Labels::read(&labels)?;
            let truth: video::Truth = read_json(&truth)?;
            let covered: u64 = labels.labels.iter().map(|l| l.frames).sum();
            anyhow::ensure!(
                covered == truth.frames,
                "the labels cover {covered} of the video's {} frames",
                truth.frames
            );
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
