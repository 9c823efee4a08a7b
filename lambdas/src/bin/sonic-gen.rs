//! `sonic-gen`: deterministic inputs for the applications, and the video model's trainer.
//!
//! ```text
//! sonic-gen sort  --bytes 10MB --seed 1 [--out FILE]              # 100-byte records
//! sonic-gen ml    --rows 20000 --seed 1 [--features 16] [--classes 4] [--out FILE]   # CSV
//! sonic-gen video --seconds 30 --seed 1 [--width 64 --height 48 --fps 10 --scene-seconds 10]
//!                 [--out FILE] [--truth FILE]                      # Y4M, truth as JSON
//! sonic-gen train-video-model [--frames 3000] [--seed 7] [--iterations 600] [--out FILE]
//! ```
//! Without `--out`, the data goes to standard output.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use sonic_core::units::ByteSize;
use sonic_lambdas::{ml, sort, video};

#[derive(Parser)]
#[command(about = "Deterministic inputs for the Sonic applications")]
enum Cmd {
    /// MapReduce sort input: gensort-like 100-byte records with 10-byte random keys.
    Sort {
        /// Size (B, KB, MB, GB, KiB, MiB, GiB), rounded down to whole records.
        #[arg(long)]
        bytes: ByteSize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// ML pipeline input: a labelled CSV (x0..x<F-1>,label).
    Ml {
        #[arg(long)]
        rows: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 16)]
        features: usize,
        #[arg(long, default_value_t = 4)]
        classes: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Video analytics input: a Y4M video of synthetic scenes.
    Video {
        #[arg(long)]
        seconds: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 64)]
        width: usize,
        #[arg(long, default_value_t = 48)]
        height: usize,
        #[arg(long, default_value_t = 10)]
        fps: u32,
        #[arg(long, default_value_t = 10)]
        scene_seconds: u32,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where to write the class of every scene (JSON), for `video-analytics score`.
        #[arg(long)]
        truth: Option<PathBuf>,
    },
    /// Train the video classifier on generated frames and write its weights (JSON).
    TrainVideoModel {
        #[arg(long, default_value_t = 3000)]
        frames: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        #[arg(long, default_value_t = 600)]
        iterations: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn output(path: &Option<PathBuf>) -> anyhow::Result<Box<dyn Write>> {
    Ok(match path {
        Some(p) => Box::new(BufWriter::with_capacity(
            1 << 20,
            File::create(p).with_context(|| format!("{}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    })
}

fn run() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::Sort { bytes, seed, out } => {
            let mut w = output(&out)?;
            let n = sort::generate(&mut w, bytes.0, seed)?;
            w.flush()?;
            tracing::info!(
                bytes = n,
                records = n / sort::RECORD as u64,
                seed,
                "sort input written"
            );
        }
        Cmd::Ml {
            rows,
            seed,
            features,
            classes,
            out,
        } => {
            let mut w = output(&out)?;
            let spec = ml::GenSpec {
                rows,
                seed,
                features,
                classes,
            };
            ml::generate(&mut w, &spec)?;
            w.flush()?;
            tracing::info!(rows, features, classes, seed, "ml input written");
        }
        Cmd::Video {
            seconds,
            seed,
            width,
            height,
            fps,
            scene_seconds,
            out,
            truth,
        } => {
            let spec = video::VideoSpec {
                width,
                height,
                fps,
                seconds,
                scene_seconds,
                seed,
            };
            let mut w = output(&out)?;
            let t = video::generate(&mut w, &spec)?;
            w.flush()?;
            if let Some(p) = truth {
                std::fs::write(&p, serde_json::to_vec_pretty(&t)?)
                    .with_context(|| format!("{}", p.display()))?;
            }
            tracing::info!(
                seconds,
                frames = t.frames,
                scenes = t.scenes.len(),
                seed,
                "video written"
            );
        }
        Cmd::TrainVideoModel {
            frames,
            seed,
            iterations,
            out,
        } => {
            let c = video::train(frames, seed, iterations);
            tracing::info!(
                train_accuracy = c.training.train_accuracy,
                holdout_accuracy = c.training.holdout_accuracy,
                frames,
                "video model trained"
            );
            let mut w = output(&out)?;
            serde_json::to_writer_pretty(&mut w, &c)?;
            writeln!(w)?;
            w.flush()?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    sonic_lambdas::init_tracing();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "sonic-gen failed");
            ExitCode::FAILURE
        }
    }
}
