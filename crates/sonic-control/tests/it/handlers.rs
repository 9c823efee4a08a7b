//! OpenLambda handlers as DAG stages, across hosts: a control plane started from its own
//! configuration with the OpenLambda listener (the registry), agents that know only its URL and
//! the join token (their own data folders: they fetch the handlers' code from the object store,
//! SeaweedFS when `SONIC_S3_ENDPOINT` names one, as in CI). A DAG mixing Python handlers and the
//! Rust `synthetic` lambda runs under every policy with byte-identical results; bad handler
//! outputs fail the instance with a clear error; an unregistered handler refuses the job.
//!
//! The `*_in_docker` tests run the same in the Docker sandbox: handler stages in containers of
//! `sonic-python:latest` (`bash deploy/build-python-image.sh --debug`), the Rust stages in
//! `sonic-lambdas:latest` (`bash deploy/build-images.sh --debug`). Like the repository's other
//! Docker tests they need the engine and the images, and fail saying so without them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sonic_agent::config::SandboxChoice;
use sonic_api::control::{JobMode, JobStatus};
use sonic_core::regression::Convergence;
use sonic_core::units::ByteSize;

use crate::support::{Cluster, TOKEN, base64, sized_input};

/// split (Python) writes the job input as two binary parts with the `sonic` module (large
/// data); copy (Rust) copies each part on; count (Python) gathers them, reads the files and
/// returns JSON, which becomes the job's result.
const DAG: &str = r#"
name: mixed
params: { label: hello }
functions:
  - { name: split, handler: py-split, timeout: 30s }
  - { name: copy, image: sonic-lambdas:latest, command: [synthetic, copy, --to, count], timeout: 30s }
  - { name: count, handler: py-count, timeout: 30s }
edges:
  - { from: split, to: copy, kind: scatter }
  - { from: copy, to: count, kind: gather }
"#;

const SPLIT: &str = r#"
import sonic

def f(event):
    [data] = [i for i in sonic.inputs() if i.sender == "input"]
    raw = data.read_bytes()
    assert event["inputs"][0]["size"] == len(raw)
    half = len(raw) // 2
    with sonic.output("copy", "part-0.bin") as out:
        out.write(raw[:half])
    sonic.write_bytes("copy", "part-1.bin", raw[half:])
    return None
"#;

const COUNT: &str = r#"
import hashlib, os, sonic

def f(event):
    files = sonic.inputs("copy")
    joined = b"".join(i.read_bytes() for i in files)
    return {
        "label": event["params"]["label"],
        "greeting": os.environ.get("GREETING"),
        "parts": [i.rel for i in files],
        "bytes": len(joined),
        "sha256": hashlib.sha256(joined).hexdigest(),
        "instances": event["instances"],
    }
"#;

/// A `.tar.gz` made by Python's `tarfile`, as OpenLambda's scripts make them.
fn tarball(files: &[(&str, &str)]) -> Vec<u8> {
    let spec = serde_json::to_string(files).expect("json");
    let script = "import tarfile, io, json, sys\nbuf = io.BytesIO()\nwith tarfile.open(fileobj=buf, mode='w:gz') as tar:\n    for name, text in json.loads(sys.argv[1]):\n        data = text.encode()\n        info = tarfile.TarInfo(name)\n        info.size = len(data)\n        tar.addfile(info, io.BytesIO(data))\nsys.stdout.buffer.write(buf.getvalue())\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, &spec])
        .output()
        .expect("python3 (needed to run handlers)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Agents with this sandbox (Docker: checked first, `support::docker_ready`); lambda times of
/// milliseconds are noise: a few samples converge the models.
async fn cluster(sandbox: SandboxChoice) -> Cluster {
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    cluster_with(sandbox, rule, 2).await
}

/// A control plane started from its own configuration with the OpenLambda listener (the
/// registry) and job inputs inline up to 16 MiB (the ML pipeline's larger CSVs); two agents
/// (m5.large, m5.xlarge) that join, each a host of its own, with this sandbox and output quota;
/// the models converging under `convergence`, two attempts per instance.
async fn cluster_with(
    sandbox: SandboxChoice,
    convergence: Convergence,
    output_quota_mb: u64,
) -> Cluster {
    builder(sandbox, convergence, output_quota_mb).start().await
}

/// What [`cluster_with`] starts, before it starts (for a test that tunes it further).
fn builder(
    sandbox: SandboxChoice,
    convergence: Convergence,
    output_quota_mb: u64,
) -> crate::support::Builder {
    Cluster::builder()
        .joined()
        .openlambda()
        .store_bucket("sonic-handlers")
        .max_body(ByteSize(16 << 20))
        .sandbox(sandbox)
        .convergence(convergence)
        .tune(|jobs| {
            jobs.max_attempts = 2;
            jobs.backoff = Duration::from_millis(20);
            // The plan route is asked for an exact plan below. In CI (2 cores, every test
            // binary at once) its search has run past the default 2 s budget on some learned
            // states, where the same DAG plans in about 0.5 ms on an idle machine: the cause
            // is not found (docs/testing.md). A longer budget lets it finish; exactness is
            // still what is asserted.
            jobs.planning.time = Some(Duration::from_secs(30));
        })
        .tune_agents(move |agent| agent.output_quota_mb = output_quota_mb)
}

impl Cluster {
    /// Uploads the lambda `name` to the registry.
    pub async fn upload(&self, name: &str, files: &[(&str, &str)]) {
        let r = self
            .http
            .post(self.openlambda_url(&format!("/registry/{name}")))
            .body(tarball(files))
            .send()
            .await
            .expect("upload");
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }
}

fn job(policy: Option<&str>, data: &[u8]) -> Value {
    let mut body = json!({
        "dag": "mixed",
        "input": { "name": "data.bin", "base64": base64(data) },
    });
    if let Some(p) = policy {
        body["policy"] = json!(p);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_of_handlers_and_executables_runs_alike_under_every_policy() {
    mixed_dag_under_every_policy(SandboxChoice::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_of_handlers_and_executables_runs_alike_under_every_policy_in_docker() {
    mixed_dag_under_every_policy(SandboxChoice::Docker).await;
}

async fn mixed_dag_under_every_policy(sandbox: SandboxChoice) {
    let c = cluster(sandbox).await;
    c.upload("py-split", &[("f.py", SPLIT)]).await;
    c.upload(
        "py-count",
        &[
            ("f.py", COUNT),
            ("ol.yaml", "environment:\n  GREETING: hi from ol.yaml\n"),
        ],
    )
    .await;
    c.apply(DAG).await;

    // Profiling at three sizes, so that the models converge and a later job is planned.
    for n in [20_000, 60_000, 100_000] {
        let (v, s) = c.run(job(None, &sized_input(n))).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    }
    let data = sized_input(80_000);
    let want = json!({
        "label": "hello",
        "greeting": "hi from ol.yaml",
        "parts": ["copy/0/split/0/part-0.bin", "copy/1/split/0/part-1.bin"],
        "bytes": data.len(),
        "sha256": sha256_hex(&data),
        "instances": 1,
    });
    let mut all = Vec::new();
    for policy in ["remote", "direct", "local", "sonic"] {
        let (v, s) = c.run(job(Some(policy), &data)).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        let method = match policy {
            "local" => Some("vm-storage"),
            "sonic" => None,
            p => Some(p),
        };
        if let Some(m) = method {
            assert!(
                s.edges.iter().all(|e| e.method.as_str() == m),
                "{policy}: {v}"
            );
        } else {
            assert_eq!(s.mode, JobMode::Planned, "sonic plans once converged: {v}");
        }
        let files = c.results(&s).await;
        assert_eq!(files.len(), 1, "{policy}: {v}");
        assert_eq!(files[0].0, "output.json", "{policy}");
        let got: Value = serde_json::from_slice(&files[0].1).expect("the result is JSON");
        assert_eq!(got, want, "{policy}");
        all.push(files);
    }
    for (i, files) in all.iter().enumerate().skip(1) {
        assert_eq!(files, &all[0], "policy {i} differs from remote");
    }
    // The jobs above left their stages' containers warm; the plan route reads the handler
    // stages' code digests from the registry, so it counts theirs as a job's plan would. An
    // exact plan places the stages where the planned job ran them; one cut at the planning
    // budget (a starved machine: seen at 2 s in CI) may not, so it is asked again.
    let mut plan = Value::Null;
    for _ in 0..5 {
        plan = c
            .get_json_status(&format!("/v1/dags/mixed/plan?input_bytes={}", data.len()))
            .await
            .1;
        if plan["exact"] == json!(true) {
            break;
        }
    }
    assert_eq!(plan["exact"], json!(true), "never an exact plan: {plan}");
    // The route says what it priced on (`warm_pool`): the handler stages' containers are in it,
    // which they could not be if it did not know their code (their key carries its digest).
    // Whether the planner then puts a stage on those agents depends on the timings learned (on
    // a starved machine a cheaper cold type can win), so that is not asserted; only that no
    // stage is priced warm without a warm container of its function on its VM type.
    let pool = plan["warm_pool"].as_object().expect("warm_pool");
    for h in ["split", "count"] {
        let on = pool
            .get(h)
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("{h} not in warm_pool: {plan}"));
        assert!(
            on.iter().all(|a| a["idle"].as_u64().unwrap_or(0) > 0
                && a["agent"].is_string()
                && a["vm_type"].is_string()),
            "{h}: {plan}"
        );
    }
    for s in plan["stages"].as_array().expect("stages") {
        if s["warm"] != json!(true) {
            continue;
        }
        let f = s["function"].as_str().unwrap_or("");
        let on = pool.get(f).and_then(Value::as_array);
        assert!(
            on.is_some_and(|on| on.iter().any(|a| a["vm_type"] == s["vm_type"])),
            "{f} priced warm on {} with no warm container there: {plan}",
            s["vm_type"]
        );
    }
    c.stop().await;
}

fn sha256_hex(data: &[u8]) -> String {
    sonic_openlambda::package::sha256_hex(data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handlers_and_outputs_fail_with_a_clear_error() {
    bad_handlers(SandboxChoice::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handlers_and_outputs_fail_with_a_clear_error_in_docker() {
    bad_handlers(SandboxChoice::Docker).await;
}

async fn bad_handlers(sandbox: SandboxChoice) {
    let c = cluster(sandbox).await;
    let one = |handler: &str| {
        format!(
            "name: bad-{handler}\nfunctions:\n  - {{ name: only, handler: {handler}, timeout: 30s }}\n"
        )
    };
    // A handler that is not registered refuses the job: nothing is stored.
    c.apply(&one("missing")).await;
    let r = c.post_job(json!({ "dag": "bad-missing" })).await;
    let (status, v) = (r.status().as_u16(), r.json().await.unwrap_or(Value::Null));
    assert_eq!(status, 400, "{v}");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("handler `missing` is not registered") && msg.contains("function only"),
        "{v}"
    );
    assert_eq!(
        c.get_json_status("/v1/jobs").await.1["jobs"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );

    for (name, code, expect) in [
        (
            "unjson",
            "def f(event):\n    return {1, 2}\n",
            "not JSON-serializable",
        ),
        (
            "raises",
            "def f(event):\n    raise ValueError('no such thing')\n",
            "the handler raised ValueError: no such thing",
        ),
        (
            "big",
            "def f(event):\n    return 'x' * (3 << 20)\n",
            "quota",
        ),
        (
            "bigfile",
            "import sonic\ndef f(event):\n    sonic.write_bytes('result', 'big.bin', b'x' * (3 << 20))\n",
            "quota",
        ),
    ] {
        c.upload(name, &[("f.py", code)]).await;
        c.apply(&one(name)).await;
        let (v, s) = c.run(json!({ "dag": format!("bad-{name}") })).await;
        assert_eq!(s.status, JobStatus::Failed, "{name}: {v}");
        let err = s.error.clone().unwrap_or_default();
        assert!(err.contains(expect), "{name}: expected {expect:?} in {err}");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_is_invocable_like_a_lambda() {
    let c = cluster(SandboxChoice::Process).await;
    c.upload(
        "py-double",
        &[(
            "f.py",
            "def f(event):\n    [i] = event['inputs']\n    return {'doubled': i['value']['n'] * 2}\n",
        )],
    )
    .await;
    c.upload(
        "py-boom",
        &[("f.py", "def f(event):\n    raise RuntimeError('boom')\n")],
    )
    .await;
    // The last function is the Rust lambda: it copies the handler's output.json to result/.
    c.apply(
        "name: double\nfunctions:\n  - { name: twice, handler: py-double, timeout: 30s }\n  - { name: copy, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }\nedges:\n  - { from: twice, to: copy, kind: one }\n",
    )
    .await;
    c.apply("name: boom\nfunctions:\n  - { name: only, handler: py-boom, timeout: 30s }\n")
        .await;
    let call = |method: reqwest::Method, name: &str, body: &str| {
        c.http
            .request(method, c.openlambda_url(&format!("/run/{name}")))
            .body(body.to_owned())
            .send()
    };
    let r = call(reqwest::Method::POST, "double", r#"{"n": 21}"#)
        .await
        .expect("run");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap_or_default(),
        "application/json"
    );
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({"doubled": 42})
    );
    // It ran as a job of the DAG, recorded as any other.
    let jobs = c.get_json_status("/v1/jobs?dag=double").await.1;
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(1), "{jobs}");

    // A failed job: 500 with its error.
    let r = call(reqwest::Method::POST, "boom", "{}")
        .await
        .expect("run");
    assert_eq!(r.status(), 500);
    let text = r.text().await.expect("text");
    assert!(text.contains("RuntimeError: boom"), "{text}");

    // Only POST runs a DAG; a body that is not JSON is refused before any job.
    let r = call(reqwest::Method::PUT, "double", "{}")
        .await
        .expect("run");
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.text().await.expect("text"),
        "HTTP method not allowed. Sent: PUT, Allowed: [POST]\n"
    );
    let r = call(reqwest::Method::POST, "double", "{nope")
        .await
        .expect("run");
    assert_eq!(r.status(), 400);
    let jobs = c.get_json_status("/v1/jobs?dag=double").await.1;
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(1), "{jobs}");

    // Lambdas keep OpenLambda's behaviour: a registered one runs, an unknown name is 404.
    let r = call(
        reqwest::Method::POST,
        "py-double",
        r#"{"inputs": [{"value": {"n": 1}}]}"#,
    )
    .await
    .expect("run");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({"doubled": 2})
    );
    let r = call(reqwest::Method::POST, "nope", "{}")
        .await
        .expect("run");
    assert_eq!(r.status(), 404);
    assert!(
        r.text()
            .await
            .expect("text")
            .contains("not in the registry")
    );
    c.stop().await;
}

/// A handler stage with a `requirements.txt` runs in the environment the agent built from its
/// tarball (a tiny wheel from PyPI: needs the network, a few seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_stage_runs_in_its_requirements_environment() {
    let c = cluster(SandboxChoice::Process).await;
    c.upload(
        "py-six",
        &[
            (
                "f.py",
                "import sys, six\ndef f(event):\n    return {'six': six.__version__, 'prefix': sys.prefix}\n",
            ),
            ("requirements.txt", "six==1.16.0\n"),
        ],
    )
    .await;
    // Built at upload in the control plane's folder: one environment, named by the pins' digest.
    let venvs: Vec<String> = std::fs::read_dir(c.dir().join("control/openlambda/venvs"))
        .expect("venvs")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(venvs.len(), 1, "{venvs:?}");
    c.apply("name: six\nfunctions:\n  - { name: only, handler: py-six, timeout: 120s }\n")
        .await;
    for _ in 0..2 {
        let r = c
            .http
            .post(c.openlambda_url("/run/six"))
            .body("{}")
            .send()
            .await
            .expect("run");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["six"], "1.16.0", "{v}");
        // The agent's own environment, in its data folder, under the same digest.
        let prefix = PathBuf::from(v["prefix"].as_str().unwrap_or_default());
        let agent = ["a-1", "a-2"]
            .iter()
            .find(|a| prefix.starts_with(c.dir().join(a)))
            .unwrap_or_else(|| panic!("{v}"));
        assert_eq!(
            prefix,
            c.dir().join(agent).join("handlers/venvs").join(&venvs[0]),
            "{v}"
        );
    }
    c.stop().await;
}

/// A handler stage is prewarmed like an executable's: while the stage before it runs, its agent
/// starts the instance's Python runtime, which imports `f.py`, so that the stage's run finds it
/// warm: it is hot (no runtime started), and its module was imported before it was called, by
/// the runtime that then served the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarmed_handler_stage_finds_its_runtime_started() {
    // Prewarmed at once when `first` starts (not timed to when the plan needs the runtime,
    // which `jobs::a_planned_jobs_next_stage_is_prewarmed_when_the_plan_needs_it` covers): the
    // import then happens well before the call, which is what this test tells apart from an
    // import by the run.
    let rule = Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    };
    let c = builder(SandboxChoice::Process, rule, 2)
        .tune(|jobs| jobs.prewarm_timed = false)
        .start()
        .await;
    // `first` sleeps 3 s only in the job that tells the import's time apart (the last); the
    // jobs that learn the cold times need not wait.
    let slow = |secs: u32| {
        format!(
            "import time\ndef f(event):\n    time.sleep({secs})\n    return {{'slept': {secs}}}\n"
        )
    };
    c.upload("py-slow", &[("f.py", slow(0).as_str())]).await;
    let imports = |version: u32| {
        format!(
            "import os, time\nIMPORTED = time.time()\ntime.sleep(0.5)  # an import that takes a while\ncalls = 0\nVERSION = {version}\n\ndef f(event):\n    global calls\n    calls += 1\n    return {{'since_import_s': time.time() - IMPORTED, 'calls': calls, 'version': VERSION}}\n"
        )
    };
    c.upload("py-imports", &[("f.py", imports(1).as_str())])
        .await;
    c.apply(
        "name: warmup\nfunctions:\n  - { name: first, handler: py-slow, timeout: 30s }\n  - { name: second, handler: py-imports, timeout: 30s }\nedges:\n  - { from: first, to: second, kind: one }\n",
    )
    .await;
    // Jobs that measure cold starts have nothing prewarmed: these learn the cold times.
    for _ in 0..3 {
        let (v, s) = c.run(json!({ "dag": "warmup" })).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    }
    // A new version of `second`: no warm instance of it is left by the jobs before (a new
    // digest, a new warm key), so its run is hot only if it was prewarmed.
    c.upload("py-imports", &[("f.py", imports(2).as_str())])
        .await;
    c.upload("py-slow", &[("f.py", slow(3).as_str())]).await;
    let (v, s) = c.run(json!({ "dag": "warmup" })).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let second = s
        .functions
        .iter()
        .find(|f| f.name == "second")
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!second.cold, "the prewarmed runtime served the run: {v}");
    let files = c.results(&s).await;
    let got: Value = serde_json::from_slice(&files[0].1).expect("json");
    assert_eq!(got["calls"], 1, "{got}");
    assert_eq!(got["version"], 2, "{got}");
    // Imported while `first` slept (3 s), not by the run (which would call at once after
    // the import's 0.5 s).
    let since = got["since_import_s"].as_f64().unwrap_or(0.0);
    assert!(since > 1.5, "imported {since} s before the call: {got}");
    c.stop().await;
}

/// Uploads the ML pipeline's three lambdas (`lambdas/python/ml-pipeline/`) and applies
/// `dags/ml-pipeline-py.yaml`.
async fn ml_pipeline(c: &Cluster) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lambdas/python/ml-pipeline");
    for stage in ["pca", "train", "combine"] {
        let read =
            |f: &str| std::fs::read_to_string(root.join(stage).join(f)).expect("lambda file");
        let (code, reqs) = (read("f.py"), read("requirements.txt"));
        c.upload(
            &format!("ml-py-{stage}"),
            &[("f.py", code.as_str()), ("requirements.txt", reqs.as_str())],
        )
        .await;
    }
    let dag = std::fs::read_to_string(root.join("../../../dags/ml-pipeline-py.yaml")).expect("dag");
    c.apply(&dag).await;
}

/// A labelled CSV of `rows` rows: two classes around two centres in 4 features, labels last;
/// a little noise.
fn ml_csv(rows: u64) -> String {
    let mut csv = String::from("a,b,c,d,label\n");
    for i in 0..rows {
        let class = i % 2;
        let jitter = |k: u64| ((i * 7919 + k * 104_729) % 1000) as f64 / 250.0 - 2.0;
        let centre = if class == 0 { -1.0 } else { 1.0 };
        csv.push_str(&format!(
            "{:.3},{:.3},{:.3},{:.3},{class}\n",
            centre + jitter(1),
            centre * 0.5 + jitter(2),
            jitter(3),
            -centre + jitter(4)
        ));
    }
    csv
}

/// The ML pipeline's parameters in these tests: 3 trees (train instances), 3 components.
fn ml_params() -> Value {
    json!({ "trees": 3, "components": 3 })
}

fn ml_job(rows: u64, policy: Option<&str>) -> Value {
    let mut body = json!({
        "dag": "ml-pipeline-py",
        "input": { "name": "data.csv", "base64": base64(ml_csv(rows).as_bytes()) },
        "params": ml_params(),
    });
    if let Some(p) = policy {
        body["policy"] = json!(p);
    }
    body
}

/// The ML pipeline as Python handlers (`lambdas/python/ml-pipeline/`, `dags/ml-pipeline-py.yaml`)
/// with numpy from PyPI: the forest beats the majority baseline by far. Ignored: it installs
/// numpy (18 MB) from PyPI on the control plane and on each agent that runs a stage (22 s here).
/// `cargo test -p sonic-control --test it -- --ignored handlers::ml_pipeline`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs numpy (18 MB) from PyPI on every host: 22 s here"]
async fn the_ml_pipeline_as_python_handlers() {
    let c = cluster(SandboxChoice::Process).await;
    ml_pipeline(&c).await;
    let (v, s) = c.run(ml_job(3000, None)).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{v}");
    let files = c.results(&s).await;
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["accuracy.json", "model.json"], "{v}");
    let report: Value = serde_json::from_slice(&files[0].1).expect("accuracy.json");
    assert_eq!(report["trees"], 3, "{report}");
    assert_eq!(report["test_rows"], 600, "{report}");
    let (acc, base) = (
        report["accuracy"].as_f64().unwrap_or(0.0),
        report["majority_baseline"].as_f64().unwrap_or(1.0),
    );
    assert!(acc > base + 0.2, "{report}");
    c.stop().await;
}

/// The planner learns and decides for Python functions: the ML pipeline as Python handlers,
/// under the default convergence rule (cross-validated error under 15%, at least 5 samples),
/// profiles at a spread of input sizes until every model planning needs has converged, and
/// then its unforced jobs run planned, with results identical to `remote`'s. Ignored as the
/// one above (numpy from PyPI), and it runs up to 28 jobs. The cold times of these sub-second
/// stages measure the machine's load as much as their input: here it converged after 5 or 6 jobs
/// at load averages 2.6 to 5 and not within 24 at 5 to 6 on two cores (docs/python.md).
/// `cargo test -p sonic-control --test it -- --ignored --nocapture handlers::learned_then_planned`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "installs numpy from PyPI on every host and runs up to 28 jobs; needs a quiet machine"]
async fn the_ml_pipeline_as_python_handlers_is_learned_then_planned() {
    let c = cluster_with(SandboxChoice::Process, Convergence::default(), 64).await;
    ml_pipeline(&c).await;
    let models_url = reqwest::Url::parse_with_params(
        &c.url_for("/v1/dags/ml-pipeline-py/models"),
        &[("params", ml_params().to_string())],
    )
    .expect("url");
    let models = || async {
        c.http
            .get(models_url.clone())
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("models")
            .json::<Value>()
            .await
            .expect("json")
    };
    // Input sizes from 0.56 to 4.5 MB of CSV, in an order that spreads them from the start: at
    // 2,000 to 16,000 rows the stages' cold times were their runtime's start (python3, numpy's
    // import) and did not grow with the input.
    let sizes = [
        20_000, 160_000, 80_000, 40_000, 120_000, 60_000, 140_000, 100_000,
    ];
    let mut profiled = 0;
    loop {
        let rows = sizes[profiled % sizes.len()];
        let (v, s) = c.run(ml_job(rows, None)).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{v}");
        assert_eq!(s.mode, JobMode::Profiling, "{v}");
        profiled += 1;
        let m = models().await;
        let errors: Vec<String> = m["models"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} {}",
                    p["parameter"].as_str().unwrap_or_default(),
                    p["cv_mape"]
                        .as_f64()
                        .map_or("-".to_owned(), |e| format!("{:.1}%", e * 100.0))
                )
            })
            .collect();
        eprintln!(
            "profiling job {profiled}: {rows} rows, {:.2} s; {}",
            s.latency_s,
            errors.join(", ")
        );
        if profiled == 1 {
            // The first job built numpy's environment on its agents (pip, seconds): a one-off
            // setup, not the stages' per-instance overhead.
            for f in ["pca", "train", "combine"] {
                let o = &m["samples"][0]["measured"]["functions"][f]["overhead_s"];
                assert!(o.as_f64().is_some_and(|o| o < 1.0), "{f}: {o} in {m}");
            }
        }
        if m["converged"] == json!(true) {
            break;
        }
        assert!(profiled < 24, "not converged after {profiled} jobs: {m}");
    }
    for rows in [5_000, 11_000] {
        let (v, planned) = c.run(ml_job(rows, None)).await;
        assert_eq!(planned.status, JobStatus::Succeeded, "{v}");
        assert_eq!(planned.mode, JobMode::Planned, "{v}");
        let (v, remote) = c.run(ml_job(rows, Some("remote"))).await;
        assert_eq!(remote.status, JobStatus::Succeeded, "{v}");
        let (a, b) = (c.results(&planned).await, c.results(&remote).await);
        assert_eq!(a.len(), 2, "{v}");
        assert_eq!(a, b, "{rows} rows: planned and remote results differ");
        eprintln!(
            "{rows} rows: planned {:.2} s, remote {:.2} s",
            planned.latency_s, remote.latency_s
        );
    }
    c.stop().await;
}

/// What OpenLambda's `scripts/test.py` asks of a worker, through `POST /run/<dag>` with DAGs of
/// one handler each, in the Docker sandbox: an echo installed from a tarball with `ol.yaml`'s
/// environment (it runs in a container of the Python image, its code bound read-only at
/// `/sonic/handler`), a handler that raises, a code update picked up by the next call, a burst
/// of concurrent calls, and a handler that never returns (its timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openlambda_requests_run_handler_stages_in_docker() {
    let c = cluster(SandboxChoice::Docker).await;
    let call = |name: &str, body: String| {
        c.http
            .post(c.openlambda_url(&format!("/run/{name}")))
            .body(body)
            .send()
    };
    const ECHO: &str = r#"
import os, sys
def f(event):
    [i] = event["inputs"]
    probe = "/sonic/probe"
    try:
        open(probe, "w").close()
        read_only = False
    except OSError:
        read_only = True
    return {"echo": i["value"], "greeting": os.environ.get("GREETING"), "file": __file__,
            "python": sys.executable, "code_read_only": not os.access("/sonic/handler", os.W_OK),
            "root_read_only": read_only, "input": i["path"].startswith("/sonic/in/")}
"#;
    let (status, text) = run_handler(
        &c,
        "echo",
        &[
            ("f.py", ECHO),
            ("ol.yaml", "environment:\n  GREETING: hello from ol.yaml\n"),
        ],
        "30s",
        r#"{"x": 1}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).expect("json"),
        json!({
            "echo": {"x": 1},
            "greeting": "hello from ol.yaml",
            "file": "/sonic/handler/f.py",
            "python": "/usr/bin/python3",
            "code_read_only": true,
            "root_read_only": true,
            "input": true,
        })
    );

    // A burst of concurrent calls, each answered with its own event.
    let calls = (0..6).map(|i| call("dag-echo", format!(r#"{{"x": {i}}}"#)));
    for (i, r) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        let r = r.expect("run");
        assert_eq!(r.status(), 200, "call {i}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["echo"], json!({"x": i}), "call {i}");
    }

    // A code update: the next call runs the new code (a new digest, new containers).
    c.upload(
        "echo",
        &[("f.py", "def f(event):\n    return {'version': 2}\n")],
    )
    .await;
    let r = call("dag-echo", "{}".into()).await.expect("run");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({"version": 2})
    );

    // A handler that raises: 500 with its error.
    let boom = "def f(event):\n    raise RuntimeError('boom')\n";
    let (status, text) = run_handler(&c, "boom", &[("f.py", boom)], "30s", "{}").await;
    assert_eq!(status, 500);
    assert!(text.contains("RuntimeError: boom"), "{text}");

    // A handler that never returns: killed at its timeout, the call fails saying so.
    let sleeper = "import time\ndef f(event):\n    time.sleep(3600)\n";
    let (status, text) = run_handler(&c, "sleeper", &[("f.py", sleeper)], "2s", "{}").await;
    assert_eq!(status, 500);
    assert!(text.contains("timeout"), "{text}");

    // One that allocates without bound: stopped at its container's memory limit (the default
    // 1024 MB of a stage), the host unharmed.
    let hog = "def f(event):\n    hoard = []\n    while True:\n        hoard.append(bytearray(16 << 20))\n";
    let (status, text) = run_handler(&c, "hog", &[("f.py", hog)], "60s", "{}").await;
    assert_eq!(status, 500);
    assert!(text.contains("memory limit"), "{text}");
    c.stop().await;
}

/// Uploads the lambda `name`, applies the DAG `dag-<name>` of one stage running it with
/// `timeout` (a DAG named apart from its lambda: a lambda of the DAG's name would answer
/// instead), calls `POST /run/dag-<name>` with `body` and answers its status and text.
async fn run_handler(
    c: &Cluster,
    name: &str,
    files: &[(&str, &str)],
    timeout: &str,
    body: &str,
) -> (u16, String) {
    c.upload(name, files).await;
    c.apply(&format!(
        "name: dag-{name}\nfunctions:\n  - {{ name: only, handler: {name}, timeout: {timeout} }}\n"
    ))
    .await;
    let r = c
        .http
        .post(c.openlambda_url(&format!("/run/dag-{name}")))
        .body(body.to_owned())
        .send()
        .await
        .expect("run");
    let status = r.status().as_u16();
    (status, r.text().await.expect("text"))
}

/// A handler stage with a `requirements.txt` in the Docker sandbox: the agent builds its
/// environment with the Python image's own python and pip (in a container, from PyPI: needs the
/// network), in its data folder, and the stage's container sees it read-only at `/sonic/venv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_stage_runs_in_its_requirements_environment_in_docker() {
    let c = cluster(SandboxChoice::Docker).await;
    c.upload(
        "py-six",
        &[
            (
                "f.py",
                "import sys, six\ndef f(event):\n    return {'six': six.__version__, 'prefix': sys.prefix}\n",
            ),
            ("requirements.txt", "six==1.16.0\n"),
        ],
    )
    .await;
    c.apply("name: six\nfunctions:\n  - { name: only, handler: py-six, timeout: 120s }\n")
        .await;
    let mut built = Vec::new();
    for _ in 0..2 {
        let r = c
            .http
            .post(c.openlambda_url("/run/six"))
            .body("{}")
            .send()
            .await
            .expect("run");
        let status = r.status();
        let text = r.text().await.expect("text");
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v, json!({"six": "1.16.0", "prefix": "/sonic/venv"}));
        for agent in ["a-1", "a-2"] {
            let root = c.dir().join(agent).join("handlers/docker-venvs");
            if let Ok(entries) = std::fs::read_dir(&root) {
                built.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
    }
    built.sort();
    built.dedup();
    assert!(
        !built.is_empty(),
        "no environment in an agent's docker-venvs"
    );
    for dir in &built {
        assert!(
            dir.join("bin/python").exists() && dir.join(".sonic-ready").is_file(),
            "{}",
            dir.display()
        );
    }
    c.stop().await;
}
