//! What one finished job's learning costs as a setting's samples grow: records `--jobs` samples
//! of a one-function no-op DAG (what `sonic-load`'s phase 1 runs) in a database file and refits
//! after each, as the scheduler does (`learn::refit` under its lock), then reads the models
//! as a planned submission and an execution's start do (`learn::current`, `mode_of`).
//! Prints the mean time per job over each block of jobs. A measurement, not a test:
//!
//! ```text
//! cargo run --release -p sonic-control --example refit_cost -- --jobs 1000 --block 100
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sonic_api::control::JobMode;
use sonic_control::learn::{self, Finished};
use sonic_control::store::{Db, SampleRecord};
use sonic_core::dag::Dag;
use sonic_core::regression::Convergence;

const DAG: &str = r#"
name: noop
functions:
  - { name: noop, image: i, command: [x] }
"#;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let jobs = arg("--jobs", 1000);
    let block = arg("--block", 100).max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("sonic.db")).expect("db");
    let dag = Dag::from_yaml("noop.yaml", DAG).expect("dag");
    let setting = learn::default_setting(&dag);
    let rule = Convergence::default();
    let (mut refit, mut read) = (Duration::ZERO, Duration::ZERO);
    let mut planned = 0usize;
    println!("jobs\trefit_ms_per_job\tcurrent+mode_ms_per_job\tplanned_in_block");
    for i in 0..jobs {
        // Small noise, as no-op jobs measure.
        let wobble = (i % 7) as f64 * 1e-3;
        let s = SampleRecord {
            dag: "noop".into(),
            job: format!("j-{i}"),
            input_bytes: 0,
            measured: json!({
                "functions": {"noop": {"memory_mb": 12.0 + wobble, "cold_s": 0.02 + wobble,
                    "hot_s": null, "overhead_s": 0.004 + wobble / 10.0, "instances": 1}},
                "edges": [],
                "params": {},
            }),
            created_ms: i as i64,
        };
        let t = Instant::now();
        let models = learn::current(&db, &dag, &setting, rule).expect("current");
        let mode = learn::mode_of(&db, "noop", &setting, &models, i as i64).expect("mode");
        read += t.elapsed();
        let job_mode = if mode.mode == sonic_core::mode::Mode::Planned {
            planned += 1;
            JobMode::Planned
        } else {
            JobMode::Profiling
        };
        let finished = Finished {
            job: s.job.clone(),
            mode: job_mode,
            known_fanouts: BTreeMap::new(),
        };
        let t = Instant::now();
        db.put_sample(&s).expect("sample");
        learn::refit(&db, &dag, &setting, rule, i as i64, Some(&finished)).expect("refit");
        refit += t.elapsed();
        if (i + 1) % block == 0 {
            let per = |d: Duration| d.as_secs_f64() * 1e3 / block as f64;
            println!("{}\t{:.3}\t{:.3}\t{planned}", i + 1, per(refit), per(read));
            (refit, read, planned) = (Duration::ZERO, Duration::ZERO, 0);
        }
    }
}
