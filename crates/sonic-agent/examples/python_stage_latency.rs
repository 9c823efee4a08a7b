//! Cold and hot latency of an echo handler run as a DAG stage (Sonic's Python runner under the
//! file ABI), in the Docker sandbox (`sonic-python:latest`) and in the process sandbox (the
//! host's `python3`), measured at the sandbox: from the run's request to its end, outputs
//! collected (docs/python.md).
//!
//! `cargo run -p sonic-agent --example python_stage_latency [hot] [cold] [import_ms]`
//!
//! A cold run has a new warm key (Docker: a new container; process: a new environment): it
//! starts the instance's warm Python runtime, which imports the handler; a hot run reuses the
//! key's warm container (environment) and its runtime: it starts the small client (`python3`)
//! that hands the call over, and `f.py` is not imported again. `import_ms` (0 by default) makes
//! importing the handler take that long (a sleep at module level, standing for a heavy import
//! such as numpy's). The process sandbox runs the interpreter behind the host's `python3`, as
//! the agent does (`sonic_agent::runner::host_python`).

use std::path::Path;
use std::time::{Duration, Instant};

use sonic_agent::sandbox::{
    DockerConfig, DockerSandbox, Mount, ProcessConfig, ProcessSandbox, RunSpec, Sandbox,
};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The echo handler, its import taking `import_ms`.
fn echo(import_ms: u64) -> String {
    format!(
        "import time\ntime.sleep({})\n\ndef f(event):\n    return event['inputs'][0]['value']\n",
        import_ms as f64 / 1000.0
    )
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

/// One run of the echo handler with warm key `key`; checks its result.
async fn run(
    sandbox: &dyn Sandbox,
    base: &Path,
    key: &str,
    docker: bool,
    n: usize,
) -> Res<Duration> {
    let code = base.join("code");
    let rt = base.join("runtime");
    let runner = sonic_openlambda::package::install_runtime(&rt)?;
    let input = base.join(format!("runs/{n}/in"));
    let output = base.join(format!("runs/{n}/out"));
    std::fs::create_dir_all(input.join("input"))?;
    std::fs::create_dir_all(&output)?;
    std::fs::write(input.join("input/event.json"), format!("{{\"n\": {n}}}"))?;
    let mut env = vec![
        ("SONIC_PARAMS".to_owned(), "{}".to_owned()),
        (
            "SONIC_HANDLER_ROUTES".into(),
            r#"{"result": "result"}"#.into(),
        ),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
    ];
    let (command, image, mounts) = if docker {
        env.push(("PYTHONPATH".into(), "/sonic/runtime".into()));
        (
            vec![
                "python3".to_owned(),
                "/sonic/runtime/sonic_dag_runner.py".into(),
                "/sonic/handler".into(),
            ],
            "sonic-python:latest".to_owned(),
            vec![
                Mount {
                    host: code.clone(),
                    container: "/sonic/handler".into(),
                },
                Mount {
                    host: rt.clone(),
                    container: "/sonic/runtime".into(),
                },
            ],
        )
    } else {
        env.push(("PYTHONPATH".into(), rt.display().to_string()));
        (
            vec![
                sonic_agent::runner::host_python().await.to_owned(),
                runner.display().to_string(),
                code.display().to_string(),
            ],
            String::new(),
            Vec::new(),
        )
    };
    let spec = RunSpec {
        run_id: format!("latency.{n}"),
        warm_key: key.to_owned(),
        image,
        command,
        env,
        input_dir: input,
        output_dir: output.clone(),
        memory_limit_bytes: 512 << 20,
        cpus: 1.0,
        timeout: Duration::from_secs(60),
        output_quota_bytes: 64 << 20,
        mounts,
    };
    let t = Instant::now();
    let outcome = sandbox.run(spec).await?;
    let took = t.elapsed();
    if !outcome.succeeded() {
        return Err(format!("run {n} failed: {:?}: {}", outcome.termination, outcome.log).into());
    }
    let got = std::fs::read_to_string(output.join("result/output.json"))?;
    let want = format!("{{\"n\": {n}}}");
    let v: serde_json::Value = serde_json::from_str(&got)?;
    if v != serde_json::from_str::<serde_json::Value>(&want)? {
        return Err(format!("run {n}: {got}").into());
    }
    std::fs::remove_dir_all(base.join(format!("runs/{n}")))?;
    Ok(took)
}

async fn measure(
    sandbox: &dyn Sandbox,
    base: &Path,
    hot: usize,
    cold: usize,
    import_ms: u64,
) -> Res {
    std::fs::create_dir_all(base.join("code"))?;
    std::fs::write(base.join("code/f.py"), echo(import_ms))?;
    let docker = sandbox.kind() == "docker";
    let mut n = 0;
    let mut colds = Vec::new();
    for i in 0..cold {
        n += 1;
        colds.push(run(sandbox, base, &format!("cold-{i}"), docker, n).await?);
    }
    let mut hots = Vec::new();
    // The first run of the hot key is cold: not counted.
    n += 1;
    run(sandbox, base, "hot", docker, n).await?;
    for _ in 0..hot {
        n += 1;
        hots.push(run(sandbox, base, "hot", docker, n).await?);
    }
    println!(
        "{}: cold p50 {:.1} ms p99 {:.1} ms ({} runs); hot p50 {:.1} ms p99 {:.1} ms ({} runs)",
        sandbox.kind(),
        pct(&mut colds, 0.5),
        pct(&mut colds, 0.99),
        colds.len(),
        pct(&mut hots, 0.5),
        pct(&mut hots, 0.99),
        hots.len()
    );
    sandbox.shutdown().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Res {
    let mut args = std::env::args().skip(1);
    let hot: usize = args.next().map_or(Ok(200), |s| s.parse())?;
    let cold: usize = args.next().map_or(Ok(30), |s| s.parse())?;
    let import_ms: u64 = args.next().map_or(Ok(0), |s| s.parse())?;
    let dir = tempfile::tempdir()?;
    let docker = DockerSandbox::connect_with(DockerConfig {
        work_dir: dir.path().join("containers"),
        ..DockerConfig::default()
    })
    .await?;
    measure(&docker, &dir.path().join("docker"), hot, cold, import_ms).await?;
    let process = ProcessSandbox::new(ProcessConfig {
        work_dir: dir.path().join("processes"),
        ..ProcessConfig::default()
    })?;
    measure(&process, &dir.path().join("process"), hot, cold, import_ms).await?;
    Ok(())
}
