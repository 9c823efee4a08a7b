//! The Docker sandbox against the real engine of this machine.
//!
//! Needs a running Docker engine and the image `sonic-lambdas:latest`, built with
//! `bash deploy/build-images.sh --debug`; without them these tests fail and say so.
//! Every test removes the containers it made (`shutdown`) before it asserts anything.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sonic_agent::sandbox::{
    DockerConfig, DockerSandbox, RunOutcome, RunSpec, Sandbox, SandboxError, Termination,
};

const IMAGE: &str = "sonic-lambdas:latest";
const MIB: u64 = 1 << 20;

struct Setup {
    sandbox: DockerSandbox,
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = DockerConfig {
        work_dir: dir.path().join("work"),
        ..DockerConfig::default()
    };
    let sandbox = match DockerSandbox::connect_with(config).await {
        Ok(s) => s,
        Err(e) => panic!(
            "these tests need a running Docker engine: {e}. Start it (e.g. `service docker start`)."
        ),
    };
    match sandbox.image_exists(IMAGE).await {
        Ok(true) => {}
        Ok(false) => {
            panic!("image {IMAGE} is missing: build it with `bash deploy/build-images.sh --debug`")
        }
        Err(e) => panic!("cannot inspect image {IMAGE}: {e}"),
    }
    Setup { sandbox, dir }
}

impl Setup {
    /// A spec whose input and output folders are fresh folders named after `run`.
    fn spec(&self, run: &str, key: &str, command: &[&str]) -> RunSpec {
        let base = self.dir.path().join(run);
        RunSpec {
            run_id: format!("test/{run}"),
            warm_key: key.to_string(),
            image: IMAGE.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: vec![
                ("SONIC_JOB_ID".into(), "j-test".into()),
                ("SONIC_FUNCTION".into(), "f".into()),
                ("SONIC_INSTANCE".into(), "1".into()),
                ("SONIC_INSTANCES".into(), "2".into()),
                ("SONIC_PARAMS".into(), r#"{"compute_ms": 1}"#.into()),
            ],
            input_dir: base.join("in"),
            output_dir: base.join("out"),
            memory_limit_bytes: 256 * MIB,
            cpus: 1.0,
            timeout: Duration::from_secs(30),
            output_quota_bytes: 1 << 30,
            mounts: Vec::new(),
        }
    }

    async fn run(&self, spec: RunSpec) -> RunOutcome {
        match self.sandbox.run(spec.clone()).await {
            Ok(o) => o,
            Err(e) => {
                let _ = self.sandbox.shutdown().await;
                panic!("run {} failed to run: {e}", spec.run_id)
            }
        }
    }

    /// Removes every container of this sandbox, and checks that none is left (the folders stay
    /// until `self` is dropped, for the assertions).
    async fn finish(&self) {
        self.sandbox.shutdown().await.expect("shutdown");
        assert!(
            self.sandbox.live_containers().is_empty(),
            "containers left: {:?}",
            self.sandbox.live_containers()
        );
    }
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn files_under(root: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn links(path: &PathBuf) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().nlink()
}

#[tokio::test]
async fn lambda_reads_inputs_and_its_outputs_appear_in_output_dir() {
    let s = setup().await;
    let spec = s.spec("abi", "abi", &["synthetic", "copy"]);
    write(&spec.input_dir.join("input/data.csv"), b"a,b\n1,2\n");
    write(&spec.input_dir.join("map/0/part-1"), &[7u8; 5000]);
    write(&spec.input_dir.join("map/1/part-1"), b"second sender");
    let generated = s.spec(
        "abi-gen",
        "abi",
        &["synthetic", "--output-bytes", "1000", "--to", "reduce"],
    );
    let copy = s.run(spec.clone()).await;
    let gen_out = s.run(generated.clone()).await;
    s.finish().await;

    assert_eq!(
        copy.termination,
        Termination::Exited(0),
        "log: {}",
        copy.log
    );
    assert!(
        copy.log.contains("function=f instance=1"),
        "log: {}",
        copy.log
    );
    assert_eq!(
        files_under(&spec.output_dir),
        vec![
            ("result/input/data.csv".to_string(), b"a,b\n1,2\n".to_vec()),
            ("result/map/0/part-1".to_string(), vec![7u8; 5000]),
            ("result/map/1/part-1".to_string(), b"second sender".to_vec()),
        ]
    );
    // The staged inputs are untouched, and the sandbox's hard links to them are gone.
    assert_eq!(
        fs::read(spec.input_dir.join("map/1/part-1")).unwrap(),
        b"second sender"
    );
    assert_eq!(links(&spec.input_dir.join("input/data.csv")), 1);

    assert_eq!(
        gen_out.termination,
        Termination::Exited(0),
        "log: {}",
        gen_out.log
    );
    let out = files_under(&generated.output_dir);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "reduce/out");
    assert_eq!(out[0].1.len(), 1000);
}

#[tokio::test]
async fn second_run_of_a_warm_key_is_hot() {
    let s = setup().await;
    let first = s.run(s.spec("hot-1", "hot", &["synthetic", "noop"])).await;
    let second = s.run(s.spec("hot-2", "hot", &["synthetic", "noop"])).await;
    let warm = s.sandbox.warm_containers();
    let other_key = s
        .run(s.spec("hot-3", "other", &["synthetic", "noop"]))
        .await;
    s.finish().await;

    assert_eq!(
        first.termination,
        Termination::Exited(0),
        "log: {}",
        first.log
    );
    assert!(first.cold);
    assert_eq!(
        second.termination,
        Termination::Exited(0),
        "log: {}",
        second.log
    );
    assert!(
        !second.cold,
        "the second run of the same warm key must reuse the container"
    );
    assert_eq!(warm, 1);
    assert!(other_key.cold, "another warm key gets its own container");
    // What stays warm for each run's key once it ended: `hot`'s one container, `other`'s one.
    assert_eq!(
        (first.warm_idle, second.warm_idle, other_key.warm_idle),
        (Some(1), Some(1), Some(1))
    );
    assert!(0 < first.warm_seq && first.warm_seq < second.warm_seq);
    // A cold run counts the container starts that shared the host with its own (at least
    // itself); a hot one started nothing.
    let c = first
        .start_contention
        .expect("a cold run's start contention");
    assert!(c.starts >= 1 && c.cores >= 1, "{c:?}");
    assert_eq!(second.start_contention, None);
}

#[tokio::test]
async fn concurrent_runs_of_one_key_get_their_own_containers() {
    let s = setup().await;
    let a = s.spec("conc-a", "conc", &["synthetic", "--sleep-ms", "300"]);
    let b = s.spec("conc-b", "conc", &["synthetic", "--sleep-ms", "300"]);
    let (ra, rb) = tokio::join!(s.sandbox.run(a), s.sandbox.run(b));
    let warm = s.sandbox.warm_containers();
    s.finish().await;
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra.cold && rb.cold);
    assert!(ra.succeeded() && rb.succeeded());
    assert_eq!(warm, 2);
    // The one that ended last saw both back.
    assert_eq!(ra.warm_idle.max(rb.warm_idle), Some(2));
    // Both containers started at once: each start counts the other.
    let starts = |r: &RunOutcome| r.start_contention.map_or(0, |c| c.starts);
    assert!(
        starts(&ra) >= 2 && starts(&rb) >= 2,
        "{:?} {:?}",
        ra.start_contention,
        rb.start_contention
    );
}

#[tokio::test]
async fn allocation_over_the_limit_is_out_of_memory_and_not_reused() {
    let s = setup().await;
    let mut spec = s.spec("oom", "oom", &["synthetic", "--alloc-mb", "200"]);
    spec.memory_limit_bytes = 64 * MIB;
    let oom = s.run(spec).await;
    let mut after = s.spec("oom-after", "oom", &["synthetic", "noop"]);
    after.memory_limit_bytes = 64 * MIB;
    let after = s.run(after).await;
    s.finish().await;

    assert_eq!(
        oom.termination,
        Termination::OutOfMemory,
        "log: {}",
        oom.log
    );
    assert!(after.succeeded(), "log: {}", after.log);
    assert!(
        after.cold,
        "a container that saw an OOM kill must not be reused"
    );
}

#[tokio::test]
async fn a_lambda_past_its_timeout_is_killed() {
    let s = setup().await;
    let mut spec = s.spec("timeout", "timeout", &["synthetic", "--sleep-ms", "30000"]);
    spec.timeout = Duration::from_secs(1);
    let out = s.run(spec).await;
    let after = s
        .run(s.spec("timeout-after", "timeout", &["synthetic", "noop"]))
        .await;
    s.finish().await;

    assert_eq!(out.termination, Termination::TimedOut, "log: {}", out.log);
    assert!(out.duration < Duration::from_secs(20), "{:?}", out.duration);
    assert!(
        after.succeeded() && after.cold,
        "a timed-out container must not be reused"
    );
}

#[tokio::test]
async fn peak_memory_is_what_the_lambda_allocated() {
    let s = setup().await;
    let mut spec = s.spec("peak", "peak", &["synthetic", "--alloc-mb", "200"]);
    spec.memory_limit_bytes = 512 * MIB;
    let cold = s.run(spec.clone()).await;
    // Hot run in the same container: the peak must restart from the container's state.
    let mut hot = spec.clone();
    hot.run_id = "test/peak-hot".into();
    hot.output_dir = s.dir.path().join("peak-hot/out");
    let mut hot_small = hot.clone();
    let hot = s.run(hot).await;
    hot_small.command = vec!["synthetic".into(), "--alloc-mb".into(), "100".into()];
    hot_small.output_dir = s.dir.path().join("peak-hot-small/out");
    let hot_small = s.run(hot_small).await;
    s.finish().await;

    let near = |o: &RunOutcome, mib: u64| {
        let peak = o.peak_memory_bytes.expect("peak measured");
        let want = mib * MIB;
        assert!(
            peak.abs_diff(want) <= want / 10,
            "peak {} MiB is not within 10% of {mib} MiB",
            peak / MIB
        );
    };
    assert!(cold.succeeded(), "log: {}", cold.log);
    near(&cold, 200);
    assert!(!hot.cold && hot.succeeded(), "log: {}", hot.log);
    near(&hot, 200);
    assert!(!hot_small.cold && hot_small.succeeded());
    near(&hot_small, 100);
}

/// What a lambda writes is not memory it needs: the container's memory cgroup charges the page
/// cache of its outputs to the run, but the peak the profiler learns is the lambda's resident set.
#[tokio::test]
async fn written_outputs_are_not_the_lambdas_memory() {
    let s = setup().await;
    let mut spec = s.spec(
        "writer",
        "writer",
        &["synthetic", "--output-bytes", "157286400"],
    );
    spec.memory_limit_bytes = 1024 * MIB;
    let out_dir = spec.output_dir.clone();
    let out = s.run(spec).await;
    let written: u64 = files_under(&out_dir)
        .iter()
        .map(|(_, bytes)| bytes.len() as u64)
        .sum();
    s.finish().await;
    assert!(out.succeeded(), "log: {}", out.log);
    assert_eq!(written, 150 * MIB);
    let peak = out.peak_memory_bytes.expect("peak measured");
    assert!(
        peak < 32 * MIB,
        "a 150 MiB output counted as {} MiB of the lambda's memory",
        peak / MIB
    );
}

#[tokio::test]
async fn exit_codes_signals_and_missing_commands() {
    let s = setup().await;
    let failed = s
        .run(s.spec("exit", "exit", &["synthetic", "--exit-code", "3"]))
        .await;
    let missing = s.run(s.spec("missing", "exit", &["no-such-lambda"])).await;
    let after = s
        .run(s.spec("exit-after", "exit", &["synthetic", "noop"]))
        .await;
    s.finish().await;

    assert_eq!(failed.termination, Termination::Exited(3));
    assert!(failed.log.contains("exit_code=3"), "log: {}", failed.log);
    assert_eq!(missing.termination, Termination::Exited(127));
    assert!(
        missing.log.contains("no-such-lambda"),
        "log: {}",
        missing.log
    );
    // A failing lambda does not spoil its container.
    assert!(after.succeeded() && !after.cold);
}

#[tokio::test]
async fn a_missing_image_is_image_not_found() {
    let s = setup().await;
    let mut spec = s.spec("noimage", "noimage", &["synthetic"]);
    spec.image = "sonic-no-such-image:never".into();
    let result = s.sandbox.run(spec).await;
    s.finish().await;
    match result {
        Err(SandboxError::ImageNotFound(image)) => assert_eq!(image, "sonic-no-such-image:never"),
        other => panic!("expected ImageNotFound, got {other:?}"),
    }
}

/// A run of job `job`, instance `instance`, of the function whose warm key is `key`, copying
/// the one input it was given (`input/<job>.csv`) to its result.
fn job_run(s: &Setup, job: &str, instance: &str, key: &str) -> RunSpec {
    let mut spec = s.spec(
        &format!("{job}-run"),
        key,
        &["synthetic", "copy", "--cold-start-ms", "100"],
    );
    for (k, v) in spec.env.iter_mut() {
        match k.as_str() {
            "SONIC_JOB_ID" => *v = job.to_string(),
            "SONIC_INSTANCE" => *v = instance.to_string(),
            _ => {}
        }
    }
    write(
        &spec.input_dir.join(format!("input/{job}.csv")),
        job.as_bytes(),
    );
    spec
}

#[tokio::test]
async fn two_jobs_of_one_function_share_a_warm_container_and_see_only_their_own_files() {
    let s = setup().await;
    // The agent's warm key of a function across jobs (RunRequest::warm_key): one for both jobs.
    let key = "dag.f@0123456789abcdef|sonic-lambdas:latest|synthetic";
    let a = job_run(&s, "j-a", "0", key);
    let b = job_run(&s, "j-b", "1", key);
    let first = s.run(a.clone()).await;
    let second = s.run(b.clone()).await;
    let warm = s.sandbox.warm_containers();
    s.finish().await;
    assert!(first.succeeded() && first.cold, "log: {}", first.log);
    assert!(
        second.succeeded() && !second.cold,
        "the second job's run reuses the warm container: {}",
        second.log
    );
    assert_eq!(warm, 1);
    // Its environment is its own (instance 1, not the first job's 0)...
    assert!(second.log.contains("instance=1"), "log: {}", second.log);
    // ... its folders hold its own files only...
    assert_eq!(
        files_under(&b.output_dir),
        vec![("result/input/j-b.csv".to_string(), b"j-b".to_vec())]
    );
    assert_eq!(
        files_under(&a.output_dir),
        vec![("result/input/j-a.csv".to_string(), b"j-a".to_vec())]
    );
    // ... while the container's /tmp (the function's warm state) stayed: no second cold start.
    assert!(second.log.contains("cold=false"), "log: {}", second.log);
}

#[tokio::test]
async fn prewarmed_containers_serve_the_next_runs() {
    let s = setup().await;
    let key = "dag.g@0123456789abcdef|sonic-lambdas:latest|synthetic";
    let spec = job_run(&s, "j-p", "0", key);
    let prewarmed = s.sandbox.prewarm(&spec, 2).await;
    let again = s.sandbox.prewarm(&spec, 2).await;
    let warm = s.sandbox.warm_containers();
    let run = s.sandbox.run(spec.clone()).await;
    let stats = s.sandbox.prewarm_stats();
    let hot = s.sandbox.run(spec.clone()).await;
    // Another memory limit is another container: a prewarmed one does not serve it.
    let mut bigger = job_run(&s, "j-q", "0", key);
    bigger.memory_limit_bytes *= 2;
    let other = s.sandbox.run(bigger).await;
    let mut missing = spec.clone();
    missing.image = "sonic-no-such-image:latest".into();
    let refused = s.sandbox.prewarm(&missing, 1).await;
    s.finish().await;
    assert_eq!(prewarmed.unwrap(), (2, 2));
    assert_eq!(again.unwrap(), (0, 2), "two are warm already");
    assert_eq!(warm, 2);
    // The first run takes a prewarmed container: the function's first run in it, so it is
    // cold (it pays the function's initialization); the next run of the key is hot.
    let run = run.unwrap();
    assert!(run.succeeded() && run.cold, "log: {}", run.log);
    // Its container was started before it: its own start counted no contention.
    assert_eq!(run.start_contention, None);
    let stats = stats.unwrap();
    assert_eq!((stats.started, stats.used), (2, 1));
    let hot = hot.unwrap();
    assert!(hot.succeeded() && !hot.cold, "log: {}", hot.log);
    assert!(other.unwrap().cold);
    assert!(
        matches!(refused, Err(SandboxError::ImageNotFound(_))),
        "{refused:?}"
    );
}

/// The median of some milliseconds.
fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Not a test: the figures of docs/agent.md ("Warm starts"). Start latency (request to command
/// started) of a no-op lambda in a new container (cold), in a container `prewarm` started
/// (the first run of its key), and in a container an earlier run left (hot):
/// `cargo test -p sonic-agent --test it -- --ignored --nocapture sandbox_docker::start_latency`.
#[tokio::test]
#[ignore = "a measurement, not a test"]
async fn start_latency_cold_prewarmed_hot() {
    let s = setup().await;
    let runs = 10;
    let (mut cold, mut prewarmed, mut hot) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..runs {
        let key = format!("lat-{n}");
        let c = s
            .run(s.spec(&format!("c{n}"), &key, &["synthetic", "noop"]))
            .await;
        let h = s
            .run(s.spec(&format!("h{n}"), &key, &["synthetic", "noop"]))
            .await;
        let pkey = format!("pre-{n}");
        let spec = s.spec(&format!("p{n}"), &pkey, &["synthetic", "noop"]);
        s.sandbox.prewarm(&spec, 1).await.unwrap();
        let p = s.run(spec).await;
        assert!(c.cold && !h.cold && !p.cold);
        cold.push(c.start_latency.as_secs_f64() * 1e3);
        hot.push(h.start_latency.as_secs_f64() * 1e3);
        prewarmed.push(p.start_latency.as_secs_f64() * 1e3);
        // One container at a time, as a fresh agent would see it.
        s.sandbox.shutdown().await.unwrap();
    }
    s.finish().await;
    println!(
        "docker start latency p50 over {runs} runs (ms): cold {:.1}, prewarmed {:.2}, hot {:.2}",
        median_ms(cold),
        median_ms(prewarmed),
        median_ms(hot)
    );
}
