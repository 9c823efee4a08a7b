//! `ml-pipeline`: the ML pipeline lambdas (the paper's LightGBM application).
//!
//! ```text
//! ml-pipeline pca [--to train]          # CSV (or `dataset`) -> train.bin, test.bin, projection.json
//! ml-pipeline train [--to combine]      # one decision tree on a 90% sample -> tree.json
//! ml-pipeline combine                   # forest -> result/model.json, result/accuracy.json
//! ml-pipeline evaluate --model model.json --data FILE.csv
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sonic_lambda::Context;
use sonic_lambdas::ml;

#[derive(Parser)]
#[command(about = "ML pipeline lambdas (pca, train, combine) and a model evaluator")]
enum Cmd {
    /// Hold out a test set, standardise, fit PCA, and broadcast the projected data.
    Pca {
        #[arg(long, default_value = "train")]
        to: String,
    },
    /// Fit one decision tree on a random sample seeded by the instance index.
    Train {
        #[arg(long, default_value = "combine")]
        to: String,
    },
    /// Vote with every tree on the test set; write the model and its accuracy.
    Combine,
    /// Score a result/model.json on a labelled CSV of raw features (prints JSON).
    Evaluate {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        data: PathBuf,
    },
}

fn run() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::Pca { to } => ml::pca_stage(&Context::from_env()?, &to)?,
        Cmd::Train { to } => {
            ml::train_stage(&Context::from_env()?, &to)?;
        }
        Cmd::Combine => {
            let r = ml::combine_stage(&Context::from_env()?)?;
            println!("{}", serde_json::to_string(&r)?);
        }
        Cmd::Evaluate { model, data } => {
            let (accuracy, rows) = ml::evaluate(&model, &data)?;
            println!(
                "{}",
                serde_json::json!({ "accuracy": accuracy, "rows": rows })
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
            tracing::error!(error = format!("{e:#}"), "ml-pipeline failed");
            ExitCode::FAILURE
        }
    }
}
