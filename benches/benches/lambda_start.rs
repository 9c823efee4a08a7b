//! Start latency of a no-op lambda: Docker hot (warm container), Docker cold (new container), and
//! the process sandbox. Prints a table of the start latency (request to command started) and
//! of the whole run (request to the end of the no-op), in milliseconds.
//!
//! ```text
//! bash deploy/build-images.sh            # the image, with release binaries
//! cargo bench -p sonic-benches --bench lambda_start [-- RUNS]
//! ```
//!
//! The process rows use `target/release/synthetic`, built by this bench with cargo. Without a
//! Docker engine or the image, the Docker rows are skipped with a message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sonic_agent::sandbox::{
    DockerConfig, DockerSandbox, ProcessConfig, ProcessSandbox, RunOutcome, RunSpec, Sandbox,
};

const IMAGE: &str = "sonic-lambdas:latest";

fn spec(dir: &Path, n: usize, key: &str) -> RunSpec {
    let base = dir.join(format!("run-{key}-{n}"));
    RunSpec {
        run_id: format!("bench/{key}/{n}"),
        warm_key: key.to_string(),
        image: IMAGE.to_string(),
        command: vec!["synthetic".into(), "noop".into()],
        env: vec![
            ("SONIC_JOB_ID".into(), "bench".into()),
            ("SONIC_FUNCTION".into(), "noop".into()),
            ("SONIC_INSTANCE".into(), "0".into()),
            ("SONIC_INSTANCES".into(), "1".into()),
        ],
        input_dir: base.join("in"),
        output_dir: base.join("out"),
        memory_limit_bytes: 256 << 20,
        cpus: 1.0,
        timeout: Duration::from_secs(60),
        output_quota_bytes: u64::MAX,
        mounts: Vec::new(),
    }
}

#[derive(Default)]
struct Samples {
    start_ms: Vec<f64>,
    total_ms: Vec<f64>,
    cold: usize,
}

impl Samples {
    fn add(&mut self, o: &RunOutcome) -> anyhow::Result<()> {
        anyhow::ensure!(o.succeeded(), "run failed: {:?}: {}", o.termination, o.log);
        self.start_ms.push(o.start_latency.as_secs_f64() * 1e3);
        self.total_ms.push(o.duration.as_secs_f64() * 1e3);
        self.cold += usize::from(o.cold);
        Ok(())
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn row(name: &str, target_ms: f64, s: &Samples) {
    let med = quantile(&s.start_ms, 0.5);
    println!(
        "{name:<14} {:>4} {:>4} | {:>9.2} {:>7.2} {:>7.2} | {:>9.2} {:>7.2} | {:>7} {}",
        s.start_ms.len(),
        s.cold,
        med,
        quantile(&s.start_ms, 0.9),
        quantile(&s.start_ms, 0.0),
        quantile(&s.total_ms, 0.5),
        quantile(&s.total_ms, 0.9),
        format!("< {target_ms}"),
        if med < target_ms { "met" } else { "NOT met" },
    );
}

fn build_lambdas() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = std::process::Command::new(cargo)
        .args(["build", "--release", "-p", "sonic-lambdas", "--bins"])
        .current_dir(&workspace)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "cargo build --release -p sonic-lambdas failed"
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    Ok(target.join("release"))
}

async fn docker_rows(runs: usize, dir: &Path) -> anyhow::Result<Option<(Samples, Samples)>> {
    let config = DockerConfig {
        work_dir: dir.join("docker"),
        ..DockerConfig::default()
    };
    let sandbox = match DockerSandbox::connect_with(config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("docker rows skipped: {e}");
            return Ok(None);
        }
    };
    if !sandbox.image_exists(IMAGE).await? {
        eprintln!("docker rows skipped: no {IMAGE} (run bash deploy/build-images.sh)");
        return Ok(None);
    }
    let result = async {
        let mut hot = Samples::default();
        // The first run makes the container; the measured ones reuse it.
        sandbox.run(spec(dir, 0, "hot")).await?;
        for n in 1..=runs {
            hot.add(&sandbox.run(spec(dir, n, "hot")).await?)?;
        }
        let mut cold = Samples::default();
        for n in 0..runs {
            cold.add(&sandbox.run(spec(dir, n, &format!("cold-{n}"))).await?)?;
            // One container at a time, as a fresh agent would see it.
            sandbox.shutdown().await?;
        }
        anyhow::Ok((hot, cold))
    }
    .await;
    sandbox.shutdown().await?;
    result.map(Some)
}

async fn process_rows(runs: usize, dir: &Path, bin: PathBuf) -> anyhow::Result<(Samples, Samples)> {
    let sandbox = ProcessSandbox::new(ProcessConfig {
        work_dir: dir.join("process"),
        path: vec![bin],
        ..ProcessConfig::default()
    })?;
    let mut hot = Samples::default();
    sandbox.run(spec(dir, 0, "p-hot")).await?;
    for n in 1..=runs {
        hot.add(&sandbox.run(spec(dir, n, "p-hot")).await?)?;
    }
    let mut cold = Samples::default();
    for n in 0..runs {
        cold.add(&sandbox.run(spec(dir, n, &format!("p-cold-{n}"))).await?)?;
    }
    println!(
        "process sandbox: memory cgroups {}",
        if sandbox.uses_cgroups() {
            "on (one per run)"
        } else {
            "off"
        }
    );
    sandbox.shutdown().await?;
    Ok((hot, cold))
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a number among the arguments sets the runs.
    let runs = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(30);
    let bin = build_lambdas()?;
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (docker, process) = rt.block_on(async {
        let docker = docker_rows(runs, dir.path()).await?;
        let process = process_rows(runs, dir.path(), bin).await?;
        anyhow::Ok((docker, process))
    })?;
    println!();
    println!("start latency of a no-op lambda, {runs} runs each (ms)");
    println!(
        "{:<14} {:>4} {:>4} | {:>9} {:>7} {:>7} | {:>9} {:>7} | {:>7}",
        "sandbox", "runs", "cold", "start p50", "p90", "min", "total p50", "p90", "target"
    );
    if let Some((hot, cold)) = &docker {
        row("docker hot", 15.0, hot);
        row("docker cold", 500.0, cold);
    }
    row("process hot", 5.0, &process.0);
    row("process cold", 5.0, &process.1);
    Ok(())
}
