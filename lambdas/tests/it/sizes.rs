//! The applications at the input sizes of `docs/applications.md` (ignored: minutes, hundreds of
//! MB on disk). Run in release and read the figures:
//!
//! ```text
//! cargo test --release -p sonic-lambdas --test it -- --ignored --nocapture --test-threads 1 sizes::
//! ```

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use crate::support;

use std::fs::File;
use std::path::PathBuf;

use serde_json::json;
use sonic_lambdas::{ml, sort, video};

#[test]
#[ignore = "minutes and 1 GB of disk: run in release with --ignored"]
fn mapreduce_sort_at_documented_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [10_000_000u64, 50_000_000, 200_000_000];
    let mut runs = Vec::new();
    for (i, bytes) in sizes.iter().enumerate() {
        let input = dir.path().join(format!("in-{i}.bin"));
        let mut w = std::io::BufWriter::new(File::create(&input).unwrap());
        sort::generate(&mut w, *bytes, 1).unwrap();
        drop(w);
        let run = support::run(
            &support::dag("mapreduce-sort"),
            &dir.path().join(format!("job-{i}")),
            &[("mappers", json!(4)), ("reducers", json!(4))],
            std::slice::from_ref(&input),
        );
        let mut parts: Vec<PathBuf> = run.results.iter().map(|r| r.path.clone()).collect();
        parts.sort_by_key(|p| sort::part_index(p).unwrap());
        let v = sort::validate(std::slice::from_ref(&input), &parts).unwrap();
        eprintln!("sort {bytes} B: {} records sorted and validated", v.records);
        std::fs::remove_file(&input).unwrap();
        runs.push(run);
        // Keep the disk use to one job at a time.
        std::fs::remove_dir_all(dir.path().join(format!("job-{i}"))).unwrap();
    }
    let labels: Vec<String> = sizes
        .iter()
        .map(|b| format!("{} MB", b / 1_000_000))
        .collect();
    support::check_trend(
        "mapreduce-sort",
        &labels,
        &runs,
        &["split", "map", "reduce"],
    );
}

#[test]
#[ignore = "minutes: run in release with --ignored"]
fn ml_pipeline_at_documented_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [20_000u64, 100_000, 400_000];
    let mut runs = Vec::new();
    for (i, rows) in sizes.iter().enumerate() {
        let input = dir.path().join(format!("in-{i}.csv"));
        let spec = ml::GenSpec {
            rows: *rows,
            seed: 1,
            features: 16,
            classes: 4,
        };
        ml::generate(&mut File::create(&input).unwrap(), &spec).unwrap();
        let run = support::run(
            &support::dag("ml-pipeline"),
            &dir.path().join(format!("job-{i}")),
            &[],
            std::slice::from_ref(&input),
        );
        let acc: ml::AccuracyReport = serde_json::from_slice(
            &std::fs::read(&run.result("accuracy.json").unwrap().path).unwrap(),
        )
        .unwrap();
        eprintln!(
            "ml {rows} rows ({} MB CSV): accuracy {:.4}, majority {:.4}, trees {:?}",
            std::fs::metadata(&input).unwrap().len() / 1_000_000,
            acc.accuracy,
            acc.majority_baseline,
            acc.tree_test_accuracy
        );
        runs.push(run);
    }
    let labels: Vec<String> = sizes.iter().map(|r| format!("{r} rows")).collect();
    support::check_trend("ml-pipeline", &labels, &runs, &["pca", "train"]);
}

#[test]
#[ignore = "a minute: run in release with --ignored"]
fn video_analytics_at_documented_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [30u32, 120, 480];
    let mut runs = Vec::new();
    for (i, seconds) in sizes.iter().enumerate() {
        let input = dir.path().join(format!("in-{i}.y4m"));
        let spec = video::VideoSpec {
            seconds: *seconds,
            seed: 1,
            ..video::VideoSpec::default()
        };
        let truth = video::generate(File::create(&input).unwrap(), &spec).unwrap();
        let run = support::run(
            &support::dag("video-analytics"),
            &dir.path().join(format!("job-{i}")),
            &[],
            std::slice::from_ref(&input),
        );
        let files: Vec<std::path::PathBuf> = run.results.iter().map(|r| r.path.clone()).collect();
        let labels = video::Labels::read(&files).unwrap();
        let (right, total) = truth.score(&labels);
        eprintln!(
            "video {seconds} s ({} MB): {right}/{total} chunks right",
            std::fs::metadata(&input).unwrap().len() / 1_000_000
        );
        assert_eq!(total, seconds.div_ceil(10) as usize);
        runs.push(run);
    }
    let labels: Vec<String> = sizes.iter().map(|s| format!("{s} s")).collect();
    support::check_trend("video-analytics", &labels, &runs, &["split", "extract"]);
}
