//! A Python handler stage's warm runtime (docs/python.md, "Warm instances"): in both sandboxes,
//! the runs of one warm instance share one imported module (module state persists, `f.py` is not
//! imported again); a new instance (after the keep-alive, or a new code version, which is a new
//! warm key) imports afresh; a run that times out takes the runtime with it; and a hot run's
//! outputs are those of a cold run.
//!
//! The process sandbox runs the host's `python3`; the Docker sandbox needs a running engine and
//! the image `sonic-python:latest` (`bash deploy/build-python-image.sh`) and fails saying so.
//! Every Docker test removes its containers (`shutdown`) before it asserts anything.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use sonic_agent::sandbox::{
    CgroupMode, DockerConfig, DockerSandbox, Mount, ProcessConfig, ProcessSandbox, RunOutcome,
    RunSpec, Sandbox, Termination,
};

const PYTHON_IMAGE: &str = "sonic-python:latest";

/// Counts its calls and remembers when it was imported; returns its input unchanged (so a hot
/// run's result is a cold run's) and writes its module state as a second result file.
const HANDLER: &str = r#"
import os, time, sonic
calls = 0
imported = time.time_ns()
print("importing f.py", flush=True)

def f(event):
    global calls
    calls += 1
    value = event["inputs"][0]["value"]
    if value.get("exit"):
        os._exit(3)
    if value.get("sleep"):
        time.sleep(value["sleep"])
    sonic.write_json("result", "state.json", {"calls": calls, "imported": imported, "pid": os.getpid()})
    print("call", calls)
    return value
"#;

struct Env {
    dir: tempfile::TempDir,
    docker: bool,
    runtime: PathBuf,
}

impl Env {
    fn new(docker: bool) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let runtime =
            sonic_openlambda::package::install_runtime(&dir.path().join("runtime")).unwrap();
        for v in ["v1", "v2"] {
            std::fs::create_dir_all(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join("f.py"), HANDLER).unwrap();
        }
        Env {
            dir,
            docker,
            runtime,
        }
    }

    /// A run of code version `version` under warm key `key`, with `event` as its input.
    fn spec(&self, n: usize, key: &str, version: &str, event: &str, timeout: Duration) -> RunSpec {
        let base = self.dir.path().join(format!("runs/{n}"));
        let input = base.join("in");
        std::fs::create_dir_all(input.join("input")).unwrap();
        std::fs::write(input.join("input/event.json"), event).unwrap();
        let mut env = vec![
            ("SONIC_PARAMS".to_owned(), "{}".to_owned()),
            (
                "SONIC_HANDLER_ROUTES".into(),
                r#"{"result": "result"}"#.into(),
            ),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ("PYTHONUNBUFFERED".into(), "1".into()),
        ];
        let code = self.dir.path().join(version);
        let (command, image, mounts) = if self.docker {
            env.push(("PYTHONPATH".into(), "/sonic/runtime".into()));
            let mounts = vec![
                Mount {
                    host: code,
                    container: "/sonic/handler".into(),
                },
                Mount {
                    host: self.runtime.parent().unwrap().to_path_buf(),
                    container: "/sonic/runtime".into(),
                },
            ];
            let command = vec![
                "python3".to_owned(),
                "/sonic/runtime/sonic_dag_runner.py".into(),
                "/sonic/handler".into(),
            ];
            (command, PYTHON_IMAGE.to_owned(), mounts)
        } else {
            let rt = self.runtime.parent().unwrap().display().to_string();
            env.push(("PYTHONPATH".into(), rt));
            env.push(("SONIC_AGENT_PID".into(), std::process::id().to_string()));
            let command = vec![
                "python3".to_owned(),
                self.runtime.display().to_string(),
                code.display().to_string(),
            ];
            (command, String::new(), Vec::new())
        };
        RunSpec {
            run_id: format!("warm.{n}"),
            warm_key: key.to_owned(),
            image,
            command,
            env,
            input_dir: input,
            output_dir: base.join("out"),
            memory_limit_bytes: 256 << 20,
            cpus: 1.0,
            timeout,
            output_quota_bytes: 16 << 20,
            mounts,
        }
    }
}

/// What one run left: its outcome, its result bytes and the module state it reported (the pid
/// is the container's own in Docker: compare import times across instances).
struct Ran {
    outcome: RunOutcome,
    result: Vec<u8>,
    calls: u64,
    imported: u64,
    pid: u64,
    /// The runner reported that this run started the instance's runtime (`runtime_started`,
    /// which the agent reports as a cold start).
    runtime_started: bool,
}

async fn run(sandbox: &dyn Sandbox, spec: RunSpec) -> Ran {
    let out = spec.output_dir.clone();
    let outcome = sandbox.run(spec).await.unwrap();
    assert_eq!(
        outcome.termination,
        Termination::Exited(0),
        "log: {}",
        outcome.log
    );
    let result = std::fs::read(out.join("result/output.json")).unwrap();
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("result/state.json")).unwrap()).unwrap();
    let usage = out.join(".sonic-handler-usage.json");
    let peak: serde_json::Value = serde_json::from_slice(&std::fs::read(&usage).unwrap()).unwrap();
    assert!(
        peak["peak_kib"].as_u64().unwrap() > 1024,
        "the runtime's peak is reported: {peak}"
    );
    Ran {
        outcome,
        result,
        calls: state["calls"].as_u64().unwrap(),
        imported: state["imported"].as_u64().unwrap(),
        pid: state["pid"].as_u64().unwrap(),
        runtime_started: peak["runtime_started"].as_bool().unwrap(),
    }
}

/// The whole story in one sandbox (its keep-alive `idle`).
async fn warm_runtime_story(sandbox: &dyn Sandbox, env: &Env, idle: Duration) {
    let long = Duration::from_secs(60);
    let ev = |n: usize| format!("{{\"n\": {n}, \"text\": \"caf\\u00e9\"}}");

    // A cold run of its own key: the reference output.
    let cold = run(sandbox, env.spec(0, "other", "v1", &ev(1), long)).await;
    assert!(cold.outcome.cold);
    assert_eq!(cold.calls, 1);

    // First run of the key: cold, imports; the second: hot, same module, no import.
    let first = run(sandbox, env.spec(1, "k1", "v1", &ev(1), long)).await;
    assert!(first.outcome.cold);
    assert_eq!(first.calls, 1);
    assert!(
        first.outcome.log.contains("importing f.py"),
        "{}",
        first.outcome.log
    );
    let second = run(sandbox, env.spec(2, "k1", "v1", &ev(1), long)).await;
    assert!(!second.outcome.cold);
    assert_eq!(
        second.calls, 2,
        "module state persists on the warm instance"
    );
    assert_eq!(
        second.imported, first.imported,
        "f.py was not imported again"
    );
    assert_eq!(second.pid, first.pid);
    assert!(
        !second.outcome.log.contains("importing f.py"),
        "{}",
        second.outcome.log
    );
    assert!(
        second.outcome.log.contains("call 2"),
        "the run's log has the handler's prints"
    );
    assert!(
        !second.outcome.log.contains("call 1"),
        "and only this run's"
    );
    assert_eq!(
        second.result, cold.result,
        "a hot run's output is a cold run's"
    );
    assert_eq!(second.result, first.result);
    assert!(first.runtime_started && !second.runtime_started);

    // A handler that ends its runtime (`os._exit`) fails its run; the next run of the
    // instance starts a new runtime, which imports again, and says so (the agent reports it
    // cold).
    let exit = env.spec(7, "k1", "v1", r#"{"exit": true}"#, long);
    let outcome = sandbox.run(exit).await.unwrap();
    assert_eq!(
        outcome.termination,
        Termination::Exited(1),
        "{}",
        outcome.log
    );
    assert!(
        outcome.log.contains("runtime ended during the call"),
        "{}",
        outcome.log
    );
    let revived = run(sandbox, env.spec(8, "k1", "v1", &ev(1), long)).await;
    assert!(revived.runtime_started, "a new runtime started");
    assert_eq!(revived.calls, 1);
    assert_ne!(revived.imported, first.imported, "imported again");
    assert!(revived.outcome.log.contains("importing f.py"));
    assert_eq!(revived.result, cold.result);

    // A new code version is a new warm key (the agent keys handler runs by the tarball's
    // digest): a fresh instance and module.
    let v2 = run(sandbox, env.spec(3, "k2", "v2", &ev(1), long)).await;
    assert!(v2.outcome.cold);
    assert_eq!(v2.calls, 1);
    assert_ne!(v2.imported, first.imported);

    // Past the keep-alive: a cold run, a fresh module.
    tokio::time::sleep(idle + Duration::from_millis(500)).await;
    let later = run(sandbox, env.spec(4, "k1", "v1", &ev(1), long)).await;
    assert!(later.outcome.cold, "past the keep-alive");
    assert_eq!(later.calls, 1, "a fresh module after the keep-alive");
    assert_ne!(later.imported, first.imported);
    assert_eq!(later.result, cold.result);

    // A run that times out takes the runtime (and the instance) with it: the next is cold.
    let stuck = env.spec(5, "k1", "v1", r#"{"sleep": 60}"#, Duration::from_secs(2));
    let outcome = sandbox.run(stuck).await.unwrap();
    assert_eq!(
        outcome.termination,
        Termination::TimedOut,
        "{}",
        outcome.log
    );
    let after = run(sandbox, env.spec(6, "k1", "v1", &ev(1), long)).await;
    assert!(after.outcome.cold, "the timed-out instance is not reused");
    assert_eq!(after.calls, 1);
    assert_ne!(after.imported, later.imported, "imported again");
}

/// Whether a process with this pid is alive on this host (a zombie is not).
fn alive(pid: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(Path::new(&format!("/proc/{pid}/stat"))) else {
        return false;
    };
    // `pid (comm) state ...`: the state follows the last `)`.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !matches!(
        state.and_then(|s| s.chars().next()),
        Some('Z') | Some('X') | None
    )
}

#[tokio::test]
async fn process_sandbox_keeps_the_imported_module_on_warm_instances() {
    for cgroups in [CgroupMode::Auto, CgroupMode::Off] {
        let env = Env::new(false);
        let idle = Duration::from_secs(2);
        let sandbox = ProcessSandbox::new(ProcessConfig {
            work_dir: env.dir.path().join("work"),
            // `sonic-time` among the lambda folders, as an agent has it: without it the
            // sandbox forks this test binary to start the runtime, and without cgroups the
            // runtime's peak starts from the binary's size at that moment (the module docs of
            // `sandbox::process`): other tests of this binary made it 448 MB once, over the
            // 256 MB limit, and the run was taken as out of memory.
            path: vec![sonic_testkit::lambda_dir().to_path_buf()],
            idle_timeout: idle,
            cgroups,
            ..ProcessConfig::default()
        })
        .unwrap();
        warm_runtime_story(&sandbox, &env, idle).await;
        // The runtimes end with their environments.
        let last = run(&sandbox, env.spec(9, "k9", "v1", r#"{"n": 9}"#, idle * 10)).await;
        assert!(alive(last.pid));
        sandbox.shutdown().await.unwrap();
        let mut waited = Duration::ZERO;
        while alive(last.pid) && waited < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
        assert!(
            !alive(last.pid),
            "the runtime ended after its environment was removed"
        );
    }
}

#[tokio::test]
async fn docker_sandbox_keeps_the_imported_module_on_warm_instances() {
    let env = Env::new(true);
    let idle = Duration::from_secs(3);
    let sandbox = match DockerSandbox::connect_with(DockerConfig {
        work_dir: env.dir.path().join("work"),
        idle_timeout: idle,
        ..DockerConfig::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => panic!("this test needs a running Docker engine: {e}"),
    };
    match sandbox.image_exists(PYTHON_IMAGE).await {
        Ok(true) => {}
        other => panic!(
            "image {PYTHON_IMAGE} is missing ({other:?}): build it with `bash deploy/build-python-image.sh`"
        ),
    }
    let story = tokio::spawn({
        let sandbox = std::sync::Arc::new(sandbox);
        let s = sandbox.clone();
        async move {
            let result = tokio::spawn(async move {
                let s: &DockerSandbox = &s;
                warm_runtime_story(s, &env, idle).await;
            })
            .await;
            sandbox.shutdown().await.unwrap();
            assert!(sandbox.live_containers().is_empty());
            result
        }
    });
    if let Err(panic) = story.await.unwrap() {
        std::panic::resume_unwind(panic.into_panic());
    }
}
