//! The local executor itself: what it measures, how it enforces timeouts and routing rules.

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use crate::support;

use sonic_core::dag::Dag;
use sonic_lambdas::local::{self, RunConfig};

fn config(work: &std::path::Path) -> RunConfig {
    let mut c = RunConfig::new(work);
    c.programs = support::programs();
    c
}

fn dag(yaml: &str) -> Dag {
    Dag::from_yaml("inline.yaml", yaml).unwrap()
}

#[test]
fn peak_memory_is_the_lambdas_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dag(r#"
name: hold
functions:
  - name: hold
    image: sonic-lambdas:latest
    command: [synthetic, run, --alloc-mb, "40", --compute-ms, "50"]
"#);
    // The test process is larger than the lambda would be: its size must not leak into the measure.
    let ballast = vec![1u8; 96 << 20];
    std::hint::black_box(&ballast);
    let run = local::run_dag(&d, &config(dir.path())).unwrap();
    let r = &run.instances[0];
    let mib = r.peak_rss_kib as f64 / 1024.0;
    assert!(
        (40.0..60.0).contains(&mib),
        "peak {mib:.1} MiB for a 40 MiB lambda"
    );
    assert!(r.user_s + r.sys_s >= 0.03, "{r:?}");
    assert!(r.wall_s >= r.user_s * 0.5, "{r:?}");
}

#[test]
fn a_lambda_past_its_timeout_is_killed_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dag(r#"
name: slow
functions:
  - name: slow
    image: sonic-lambdas:latest
    command: [synthetic, run, --sleep-ms, "60000"]
    timeout: 300ms
"#);
    let err = local::run_dag(&d, &config(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("slow/0 failed (timed out"), "{err}");
}

#[test]
fn a_shuffle_sender_must_write_parts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dag(r#"
name: bad-shuffle
params: { n: 2 }
functions:
  - name: a
    image: sonic-lambdas:latest
    command: [synthetic, copy, --to, b]
  - name: b
    image: sonic-lambdas:latest
    command: [synthetic, noop]
    instances: "{{ params.n }}"
edges:
  - { from: a, to: b, kind: shuffle }
"#);
    let input = dir.path().join("data");
    std::fs::write(&input, b"x").unwrap();
    let mut c = config(&dir.path().join("job"));
    c.inputs = vec![input];
    let err = local::run_dag(&d, &c).unwrap_err().to_string();
    assert!(
        err.contains("a shuffle sender writes part-<j>, j < 2"),
        "{err}"
    );
}

#[test]
fn outputs_for_unknown_functions_are_refused_and_programs_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let d = dag(r#"
name: stray
functions:
  - name: a
    image: sonic-lambdas:latest
    command: [synthetic, run, --to, nobody, --output-bytes, "10"]
"#);
    let err = local::run_dag(&d, &config(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not downstream"), "{err}");

    let d = dag(r#"
name: missing
functions:
  - name: a
    image: sonic-lambdas:latest
    command: [no-such-program-here]
"#);
    let err = local::run_dag(&d, &config(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("program \"no-such-program-here\" not found"),
        "{err}"
    );
}

#[test]
fn one_edges_pair_instances_and_the_abi_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let d = dag(r#"
name: pairs
functions:
  - name: a
    image: sonic-lambdas:latest
    command: [synthetic, run, --to, b, --output-bytes, "100"]
    instances: 3
  - name: b
    image: sonic-lambdas:latest
    command: [synthetic, copy, --to, result]
edges:
  - { from: a, to: b, kind: one }
"#);
    let run = local::run_dag(&d, &config(dir.path())).unwrap();
    assert_eq!(run.fanout("b"), Some(3));
    // b/i got exactly a/i's file, under a/<i>/.
    let mut names: Vec<(u32, String)> = run
        .results
        .iter()
        .map(|r| (r.instance, r.name.clone()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            (0, "a/0/out".into()),
            (1, "a/1/out".into()),
            (2, "a/2/out".into())
        ]
    );
    for r in &run.results {
        let bytes = std::fs::read(&r.path).unwrap();
        let src = std::fs::read(dir.path().join(format!("a/{}/out/b/out", r.instance))).unwrap();
        assert_eq!(bytes, src);
    }
}
