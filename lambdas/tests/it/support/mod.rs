//! Shared helpers of the integration tests: the built binaries, the DAG files, a local run.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sonic_core::dag::Dag;
use sonic_lambdas::local::{self, JobRun, RunConfig};

/// The binaries of this package that DAG commands name, and the local executor's `sonic-time`.
pub fn programs() -> BTreeMap<String, PathBuf> {
    [
        ("mapreduce-sort", env!("CARGO_BIN_EXE_mapreduce-sort")),
        ("ml-pipeline", env!("CARGO_BIN_EXE_ml-pipeline")),
        ("video-analytics", env!("CARGO_BIN_EXE_video-analytics")),
        ("sonic-gen", env!("CARGO_BIN_EXE_sonic-gen")),
        ("synthetic", env!("CARGO_BIN_EXE_synthetic")),
        ("sonic-time", env!("CARGO_BIN_EXE_sonic-time")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
    .collect()
}

pub fn dags_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dags")
}

/// A DAG file of `dags/`, parsed.
pub fn dag(name: &str) -> Dag {
    let path = dags_dir().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Dag::from_yaml(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `dag` locally in `work` with `params` over its defaults and `inputs` as the job input.
pub fn run(
    dag: &Dag,
    work: &Path,
    params: &[(&str, serde_json::Value)],
    inputs: &[PathBuf],
) -> JobRun {
    try_run(dag, work, params, inputs).unwrap_or_else(|e| panic!("{}: {e}", dag.name))
}

/// [`run`], its error returned.
pub fn try_run(
    dag: &Dag,
    work: &Path,
    params: &[(&str, serde_json::Value)],
    inputs: &[PathBuf],
) -> Result<JobRun, local::LocalError> {
    let mut config = RunConfig::new(work);
    config.job_id = format!("test-{}", dag.name);
    config.programs = programs();
    config.inputs = inputs.to_vec();
    config.params = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    local::run_dag(dag, &config)
}

/// Checks every function of `runs` (small to large): CPU time and peak RSS non-decreasing up to
/// noise (20% or 20 ms of CPU, 10% or 1 MiB of memory), and strictly larger CPU time from the
/// smallest to the largest input for the functions in `growing`.
pub fn check_trend(app: &str, sizes: &[String], runs: &[JobRun], growing: &[&str]) {
    let functions: Vec<String> = runs[0].fanouts.iter().map(|(f, _)| f.clone()).collect();
    eprintln!("\n{app}: per function, at {}", sizes.join(" / "));
    eprintln!(
        "{:<10} {:>28} {:>30} {:>30}",
        "function", "instances", "cpu s (all instances)", "peak RSS MiB (largest)"
    );
    for f in &functions {
        let s: Vec<_> = runs.iter().map(|r| r.stage(f)).collect();
        let fmt = |v: Vec<String>| v.join(" / ");
        eprintln!(
            "{:<10} {:>28} {:>30} {:>30}",
            f,
            fmt(s.iter().map(|x| x.instances.to_string()).collect()),
            fmt(s.iter().map(|x| format!("{:.3}", x.cpu_s)).collect()),
            fmt(s
                .iter()
                .map(|x| format!("{:.1}", x.peak_rss_kib as f64 / 1024.0))
                .collect()),
        );
        for w in s.windows(2) {
            assert!(
                w[1].cpu_s >= w[0].cpu_s * 0.8 - 0.02,
                "{app}/{f}: CPU time fell from {:.3}s to {:.3}s with a larger input",
                w[0].cpu_s,
                w[1].cpu_s
            );
            assert!(
                w[1].peak_rss_kib as f64 >= w[0].peak_rss_kib as f64 * 0.9 - 1024.0,
                "{app}/{f}: peak memory fell from {} to {} KiB with a larger input",
                w[0].peak_rss_kib,
                w[1].peak_rss_kib
            );
        }
        if growing.contains(&f.as_str()) {
            let (first, last) = (s[0], s[s.len() - 1]);
            assert!(
                last.cpu_s > first.cpu_s * 1.5,
                "{app}/{f}: CPU time {:.3}s -> {:.3}s for a much larger input",
                first.cpu_s,
                last.cpu_s
            );
        }
    }
    let walls: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.wall_s)).collect();
    eprintln!("job wall s: {}", walls.join(" / "));
}
