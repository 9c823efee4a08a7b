//! Drives the OpenLambda listener with the requests OpenLambda's Python client
//! (`python/src/open_lambda.py`) and `scripts/test.py` send, against handlers run by the host's
//! `python3` (process sandbox) and, for the tests named `*_in_docker`, in containers of the
//! Python image (Docker sandbox: needs the engine and `sonic-python:latest`, built by
//! `bash deploy/build-python-image.sh`; they fail saying so). Docker tests check that their
//! containers are gone after the listener stops.

use std::path::Path;
use std::time::{Duration, Instant};

use sonic_openlambda::{OpenLambdaConfig, Running, StartError, WorkerSandbox};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const PYTHON_IMAGE: &str = "sonic-python:latest";

/// Where a test's `/run/` workers run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sb {
    Process,
    Docker,
}

fn config(dir: &Path) -> OpenLambdaConfig {
    config_in(dir, Sb::Process)
}

fn config_in(dir: &Path, sb: Sb) -> OpenLambdaConfig {
    let mut cfg = OpenLambdaConfig::new(([127, 0, 0, 1], 0).into(), dir.to_path_buf());
    cfg.timeout = Duration::from_secs(20);
    if sb == Sb::Docker {
        cfg.sandbox = WorkerSandbox::Docker {
            image: PYTHON_IMAGE.into(),
        };
    }
    cfg
}

/// The containers of the listener whose folder is `dir` (Docker sandbox).
fn containers_of(dir: &Path) -> Res<Vec<String>> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
        .arg(format!(
            "label=sonic.openlambda.registry={}",
            dir.join("registry").display()
        ))
        .output()?;
    assert!(out.status.success(), "docker ps failed");
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(str::to_owned)
        .collect())
}

/// Stops the listener; in Docker, checks that it had containers and that none is left.
async fn stop(ol: Running, dir: &Path, sb: Sb) -> Res {
    if sb == Sb::Docker {
        assert!(!containers_of(dir)?.is_empty(), "no worker containers");
    }
    ol.stop().await;
    if sb == Sb::Docker {
        assert_eq!(containers_of(dir)?, Vec::<String>::new(), "containers left");
    }
    Ok(())
}

/// A test in both sandboxes: `$process` with host processes, `$docker` in containers.
macro_rules! both {
    ($body:ident, $process:ident, $docker:ident) => {
        #[tokio::test]
        async fn $process() -> Res {
            $body(Sb::Process).await
        }

        #[tokio::test]
        async fn $docker() -> Res {
            $body(Sb::Docker).await
        }
    };
}

/// A `.tar.gz` made by Python's `tarfile`, as OpenLambda's scripts make them. `files` are
/// (name, content); `extra` is Python run with `tar` open (for hostile entries).
fn tarball(files: &[(&str, &str)], extra: &str) -> Res<Vec<u8>> {
    let spec = serde_json::to_string(files)?;
    let script = format!(
        "import tarfile, io, json, sys\nbuf = io.BytesIO()\nwith tarfile.open(fileobj=buf, mode='w:gz') as tar:\n    for name, text in json.loads(sys.argv[1]):\n        data = text.encode()\n        info = tarfile.TarInfo(name)\n        info.size = len(data)\n        tar.addfile(info, io.BytesIO(data))\n{}\nsys.stdout.buffer.write(buf.getvalue())\n",
        extra
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script, &spec])
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(out.stdout)
}

async fn upload(ol: &Running, name: &str, tgz: Vec<u8>) -> Res<(u16, String)> {
    let r = reqwest::Client::new()
        .post(format!("{}/registry/{name}", ol.url()))
        .body(tgz)
        .send()
        .await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// `/stats`' `pull-package.cnt`, if it has one.
async fn pulled(ol: &Running) -> Res<Option<serde_json::Value>> {
    let stats: serde_json::Value = reqwest::get(format!("{}/stats", ol.url()))
        .await?
        .json()
        .await?;
    Ok(stats.get("pull-package.cnt").cloned())
}

/// What `OpenLambda.run` does: POST the JSON-encoded args to /run/<name>.
async fn run(ol: &Running, name: &str, args: &serde_json::Value) -> Res<(u16, String)> {
    let r = reqwest::Client::new()
        .post(format!("{}/run/{name}", ol.url()))
        .body(serde_json::to_vec(args)?)
        .send()
        .await?;
    Ok((r.status().as_u16(), r.text().await?))
}

const ECHO: &str = "def f(event):\n    return event\n";

/// A WSGI app (PEP 3333, no framework) in `app.py`, named by `OL_ENTRY_FILE` as OpenLambda's
/// `flask-entry-test` is: `/` answers 418 with its own header, `/echo` its body as sent,
/// `/info` what it was handed, `/boom` raises.
const WSGI_APP: &str = r#"import json

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Type", environ.get("CONTENT_TYPE", "text/plain"))])
        return [body]
    if path == "/info":
        info = {"script": environ["SCRIPT_NAME"], "path": path,
                "query": environ["QUERY_STRING"], "method": environ["REQUEST_METHOD"],
                "x": environ.get("HTTP_X_THING"), "entry": __file__.rsplit("/", 1)[-1]}
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(info).encode()]
    if path == "/boom":
        raise RuntimeError("boom")
    start_response("418 I'm a teapot", [("A", "B"), ("Content-Type", "text/plain")])
    return [b"hi\n"]
"#;

/// An ASGI app (no framework): a JSON greeting, and its request body back under `/echo`.
const ASGI_APP: &str = r#"import json

async def app(scope, receive, send):
    message = await receive()
    if scope["path"] == "/echo":
        body = message.get("body", b"")
    else:
        body = json.dumps({"message": "hello world", "path": scope["path"],
                           "root": scope["root_path"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
"#;

both!(
    apps_in,
    wsgi_and_asgi_apps_answer_for_themselves,
    wsgi_and_asgi_apps_answer_for_themselves_in_docker
);

/// App lambdas, as OpenLambda's runtime runs them: a WSGI app in the file `OL_ENTRY_FILE` names
/// controls its status, headers and body, gets the raw body, its path, query and headers; a
/// WSGI entry named by `OL_WSGI_ENTRY`; an ASGI `app`. A raising app is a 500 with its
/// traceback and the next call is served; an entry file that is missing or not a top-level
/// `.py` is refused at upload.
async fn apps_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    let http = reqwest::Client::new();
    let yaml = |env: &str| {
        format!("triggers:\n  http:\n    - method: GET\n    - method: POST\nenvironment:\n{env}")
    };
    let wsgi = tarball(
        &[
            ("app.py", WSGI_APP),
            ("ol.yaml", &yaml("  OL_ENTRY_FILE: \"app.py\"\n")),
        ],
        "",
    )?;
    assert_eq!(upload(&ol, "wsgi", wsgi).await?.0, 201);
    let r = http.get(format!("{}/run/wsgi", ol.url())).send().await?;
    assert_eq!(r.status().as_u16(), 418);
    assert_eq!(r.headers()["A"], "B");
    assert_eq!(r.text().await?, "hi\n");
    for body in ["hello world", "{\"key\": \"value\"}", "{not json"] {
        let r = http
            .post(format!("{}/run/wsgi/echo", ol.url()))
            .header("Content-Type", "text/plain")
            .body(body)
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200, "{body}");
        assert_eq!(r.headers()["content-type"], "text/plain");
        assert_eq!(r.text().await?, body);
    }
    let info: serde_json::Value = http
        .get(format!("{}/run/wsgi/info?a=1&b=2", ol.url()))
        .header("X-Thing", "yes")
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(
        info,
        serde_json::json!({"script": "/run/wsgi", "path": "/info", "query": "a=1&b=2",
            "method": "GET", "x": "yes", "entry": "app.py"})
    );
    let r = http
        .get(format!("{}/run/wsgi/boom", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 500);
    assert!(r.text().await?.contains("RuntimeError: boom"));
    assert_eq!(
        http.get(format!("{}/run/wsgi", ol.url()))
            .send()
            .await?
            .status()
            .as_u16(),
        418,
        "served after the app raised"
    );

    let named = tarball(
        &[
            ("main.py", &WSGI_APP.replace("def app(", "def my_wsgi_app(")),
            (
                "ol.yaml",
                &yaml("  OL_ENTRY_FILE: \"main.py\"\n  OL_WSGI_ENTRY: \"my_wsgi_app\"\n"),
            ),
        ],
        "",
    )?;
    assert_eq!(upload(&ol, "named", named).await?.0, 201);
    let r = http.get(format!("{}/run/named/", ol.url())).send().await?;
    assert_eq!((r.status().as_u16(), r.text().await?), (418, "hi\n".into()));

    assert_eq!(
        upload(&ol, "asgi", tarball(&[("f.py", ASGI_APP)], "")?)
            .await?
            .0,
        201
    );
    let r = http
        .get(format!("{}/run/asgi/x/y", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await?,
        serde_json::json!({"message": "hello world", "path": "/x/y", "root": "/run/asgi"})
    );
    let r = http
        .post(format!("{}/run/asgi/echo", ol.url()))
        .body("raw bytes")
        .send()
        .await?;
    assert_eq!(r.text().await?, "raw bytes");

    for (env, why) in [
        ("  OL_ENTRY_FILE: \"missing.py\"\n", "no missing.py"),
        (
            "  OL_ENTRY_FILE: \"../app.py\"\n",
            "OL_ENTRY_FILE must name",
        ),
        ("  OL_ENTRY_FILE: \"app.txt\"\n", "OL_ENTRY_FILE must name"),
    ] {
        let tgz = tarball(&[("app.py", WSGI_APP), ("ol.yaml", &yaml(env))], "")?;
        let (status, body) = upload(&ol, "bad-entry", tgz).await?;
        assert_eq!(status, 400, "{env}: {body}");
        assert!(body.contains(why), "{env}: {body}");
    }
    stop(ol, dir.path(), sb).await
}

both!(
    echo_status_stats_and_registry_in,
    echo_status_stats_and_registry,
    echo_status_stats_and_registry_in_docker
);

async fn echo_status_stats_and_registry_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{}/status", ol.url()))
            .send()
            .await?
            .text()
            .await?,
        "ready\n"
    );
    let (status, _) = upload(&ol, "echo", tarball(&[("f.py", ECHO)], "")?).await?;
    assert_eq!(status, 201);
    let (status, body) = run(&ol, "echo", &serde_json::json!("hello world")).await?;
    assert_eq!((status, body.as_str()), (200, "\"hello world\""));
    // An extra path after the name reaches the same lambda.
    let r = http
        .post(format!("{}/run/echo/a/b", ol.url()))
        .body("[1, 2]")
        .send()
        .await?;
    assert_eq!(
        r.headers()[reqwest::header::CONTENT_TYPE],
        "application/json"
    );
    assert_eq!(
        r.json::<serde_json::Value>().await?,
        serde_json::json!([1, 2])
    );
    let names: Vec<String> = http
        .get(format!("{}/registry", ol.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(names, vec!["echo".to_string()]);
    let cfg: serde_json::Value = http
        .get(format!("{}/registry/echo/config", ol.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(cfg["Triggers"]["HTTP"][0]["Method"], "*");
    let stats: serde_json::Value = http
        .get(format!("{}/stats", ol.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(stats["web-request.cnt"], 2);
    assert!(stats["web-request.ms-avg"].is_u64());
    // No body is the empty object, as OpenLambda's runtime hands it to `f`.
    for method in [reqwest::Method::POST, reqwest::Method::GET] {
        let r = http
            .request(method.clone(), format!("{}/run/echo", ol.url()))
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200, "{method}");
        assert_eq!(r.json::<serde_json::Value>().await?, serde_json::json!({}));
    }
    let (status, body) = run(&ol, "nope", &serde_json::json!(1)).await?;
    assert_eq!(status, 404, "{body}");
    let r = http
        .delete(format!("{}/registry/echo", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(run(&ol, "echo", &serde_json::json!(1)).await?.0, 404);
    ol.stop().await;
    if sb == Sb::Docker {
        // The removed lambda's container went with it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !containers_of(dir.path())?.is_empty() {
            assert!(Instant::now() < deadline, "containers left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

both!(
    warm_worker_in,
    warm_worker_keeps_its_import_and_sees_ol_yaml,
    warm_worker_keeps_its_import_and_sees_ol_yaml_in_docker
);

async fn warm_worker_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    let code = "import os\nimports = globals().get('imports', 0) + 1\ncalls = 0\ndef f(event):\n    global calls\n    calls += 1\n    return {'imports': imports, 'calls': calls, 'env': {k: os.environ.get(k) for k in ['MY_ENV_VAR', 'DEBUG_MODE', 'SONIC_SECRET']}}\n";
    let yaml = "triggers:\n  http:\n    - method: GET\n    - method: POST\nenvironment:\n  MY_ENV_VAR: Hello from environment\n  DEBUG_MODE: true\n";
    assert_eq!(
        upload(
            &ol,
            "env-test",
            tarball(&[("f.py", code), ("ol.yaml", yaml)], "")?
        )
        .await?
        .0,
        201
    );
    let (_, first) = run(&ol, "env-test", &serde_json::json!({})).await?;
    let (status, second) = run(&ol, "env-test", &serde_json::json!({})).await?;
    assert_eq!(status, 200, "{second}");
    let first: serde_json::Value = serde_json::from_str(&first)?;
    let second: serde_json::Value = serde_json::from_str(&second)?;
    assert_eq!(first["calls"], 1);
    assert_eq!(
        second["calls"], 2,
        "the second call reached the same warm module"
    );
    assert_eq!(second["imports"], 1);
    assert_eq!(ol.handlers.cold_starts(), 1);
    assert_eq!(second["env"]["MY_ENV_VAR"], "Hello from environment");
    assert_eq!(second["env"]["DEBUG_MODE"], "true");
    assert_eq!(second["env"]["SONIC_SECRET"], serde_json::Value::Null);

    // Method restrictions, with OpenLambda's exact message.
    let http = reqwest::Client::new();
    let r = http
        .put(format!("{}/run/env-test", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(
        r.text().await?,
        "HTTP method not allowed. Sent: PUT, Allowed: [GET POST]\n"
    );
    let r = http
        .get(format!("{}/run/env-test", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    let cfg: serde_json::Value = http
        .get(format!("{}/registry/env-test/config", ol.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(cfg["Environment"]["MY_ENV_VAR"], "Hello from environment");
    assert_eq!(cfg["Triggers"]["HTTP"][1]["Method"], "POST");
    stop(ol, dir.path(), sb).await
}

both!(
    allocates_without_bound_in,
    a_handler_that_allocates_without_bound_fails_with_memory_error,
    a_handler_that_allocates_without_bound_fails_with_memory_error_in_docker
);

/// A handler that allocates without bound meets its worker's memory bound (`worker_memory`,
/// RLIMIT_AS): the call fails with `MemoryError` in its traceback, the host keeps its memory,
/// and the worker answers the next call.
async fn allocates_without_bound_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config_in(dir.path(), sb);
    cfg.worker_memory = 512 << 20;
    let ol = sonic_openlambda::start(cfg).await?;
    let code = "import resource\nhoard = []\ndef f(event):\n    if event == 'limit':\n        return resource.getrlimit(resource.RLIMIT_AS)\n    if event == 'hog':\n        while True:\n            hoard.append(bytearray(16 << 20))\n    hoard.clear()\n    return 'ok'\n";
    assert_eq!(
        upload(&ol, "hog", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let limit = 512u64 << 20;
    assert_eq!(
        run(&ol, "hog", &serde_json::json!("limit")).await?,
        (200, format!("[{limit},{limit}]"))
    );
    let (status, body) = run(&ol, "hog", &serde_json::json!("hog")).await?;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("MemoryError"), "{body}");
    assert_eq!(
        run(&ol, "hog", &serde_json::json!("x")).await?,
        (200, "\"ok\"".into())
    );
    assert_eq!(ol.handlers.cold_starts(), 1);
    stop(ol, dir.path(), sb).await
}

/// Each worker runs under its CPU bound (`worker_cpus`): a cgroup of its own whose CFS quota is
/// that many CPUs, which the handler sees from inside. Needs root and cgroup v1's `cpu`
/// controller (this project's machines).
#[tokio::test]
async fn a_worker_runs_under_its_cpu_bound() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path());
    cfg.worker_cpus = 0.5;
    let ol = sonic_openlambda::start(cfg).await?;
    let code = "def f(event):\n    [path] = [l.split(':', 2)[2].strip() for l in open('/proc/self/cgroup') if l.split(':')[1] in ('cpu', 'cpu,cpuacct', 'cpuacct,cpu')]\n    base = '/sys/fs/cgroup/cpu' + path\n    return {'group': path, 'quota': int(open(base + '/cpu.cfs_quota_us').read()), 'period': int(open(base + '/cpu.cfs_period_us').read())}\n";
    assert_eq!(
        upload(&ol, "cpu", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let (status, body) = run(&ol, "cpu", &serde_json::json!(null)).await?;
    assert_eq!(
        status, 200,
        "{body} (needs root and cgroup v1's cpu controller)"
    );
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert!(
        v["group"]
            .as_str()
            .is_some_and(|g| g.contains("sonic-openlambda-")),
        "{v}"
    );
    assert_eq!(v["quota"], 50_000, "{v}");
    assert_eq!(v["period"], 100_000, "{v}");
    let group = Path::new("/sys/fs/cgroup/cpu")
        .join(v["group"].as_str().unwrap_or("/").trim_start_matches('/'));
    ol.stop().await;
    // The worker's group goes with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!group.exists(), "{} left behind", group.display());
    Ok(())
}

both!(
    exceptions_in,
    exceptions_timeouts_and_output_bounds,
    exceptions_timeouts_and_output_bounds_in_docker
);

async fn exceptions_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config_in(dir.path(), sb);
    // The timeout includes a cold start: a container's takes longer than a process's.
    cfg.timeout = Duration::from_secs(if sb == Sb::Docker { 10 } else { 2 });
    cfg.max_output = 1 << 20;
    cfg.max_body = 1 << 20;
    let ol = sonic_openlambda::start(cfg).await?;
    let code = "import sys, time\ndef f(event):\n    if event == 'raise':\n        return 1 / 0\n    if event == 'hang':\n        while True:\n            time.sleep(1)\n    if event == 'print':\n        for _ in range(64):\n            print('x' * (1 << 20))\n        sys.stderr.write('y' * (1 << 20))\n        return 'printed'\n    if event == 'big':\n        return 'z' * (2 << 20)\n    return 'ok'\n";
    assert_eq!(
        upload(&ol, "h", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let (status, body) = run(&ol, "h", &serde_json::json!("raise")).await?;
    assert_eq!(status, 500);
    assert!(
        body.contains("Traceback") && body.contains("ZeroDivisionError"),
        "{body}"
    );
    // A handler that raised keeps its worker.
    assert_eq!(
        run(&ol, "h", &serde_json::json!("x")).await?,
        (200, "\"ok\"".into())
    );
    assert_eq!(ol.handlers.cold_starts(), 1);

    let (status, body) = run(&ol, "h", &serde_json::json!("hang")).await?;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("did not return"), "{body}");
    // The hung worker was replaced.
    assert_eq!(
        run(&ol, "h", &serde_json::json!("x")).await?,
        (200, "\"ok\"".into())
    );
    assert_eq!(ol.handlers.cold_starts(), 2);

    // 64 MiB of prints go nowhere; the call still answers.
    assert_eq!(
        run(&ol, "h", &serde_json::json!("print")).await?,
        (200, "\"printed\"".into())
    );
    let (status, body) = run(&ol, "h", &serde_json::json!("big")).await?;
    assert_eq!(status, 500);
    assert!(body.contains("larger than"), "{body}");
    assert_eq!(
        run(&ol, "h", &serde_json::json!("x")).await?,
        (200, "\"ok\"".into())
    );

    // Bodies: too large, not JSON.
    let big = serde_json::Value::String("a".repeat(2 << 20));
    assert_eq!(run(&ol, "h", &big).await?.0, 413);
    let r = reqwest::Client::new()
        .post(format!("{}/run/h", ol.url()))
        .body("{not json")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 400);
    stop(ol, dir.path(), sb).await
}

both!(
    code_update_in,
    code_update_is_picked_up_by_the_next_call,
    code_update_is_picked_up_by_the_next_call_in_docker
);

async fn code_update_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    for pos in 0..3 {
        let code = format!("def f(event):\n    return {pos}\n");
        assert_eq!(
            upload(&ol, "version", tarball(&[("f.py", &code)], "")?)
                .await?
                .0,
            201
        );
        assert_eq!(
            run(&ol, "version", &serde_json::Value::Null).await?,
            (200, pos.to_string())
        );
        assert_eq!(
            run(&ol, "version", &serde_json::Value::Null).await?,
            (200, pos.to_string())
        );
    }
    assert_eq!(ol.handlers.cold_starts(), 3);
    stop(ol, dir.path(), sb).await
}

#[tokio::test]
async fn an_idle_worker_that_died_is_replaced() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    let code = "import os\ndef f(event):\n    return os.getpid()\n";
    assert_eq!(
        upload(&ol, "pid", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let (status, pid) = run(&ol, "pid", &serde_json::Value::Null).await?;
    assert_eq!(status, 200, "{pid}");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()?;
    assert!(killed.success());
    // Dead once it is a zombie (the listener reaps it) or gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) if !stat.contains(") Z ") => {}
            _ => break,
        }
        assert!(Instant::now() < deadline, "the worker did not die");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, again) = run(&ol, "pid", &serde_json::Value::Null).await?;
    assert_eq!(status, 200, "{again}");
    assert_ne!(again, pid);
    assert_eq!(ol.handlers.cold_starts(), 2);
    ol.stop().await;
    Ok(())
}

both!(
    burst_in,
    a_burst_of_concurrent_calls,
    a_burst_of_concurrent_calls_in_docker
);

async fn burst_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config_in(dir.path(), sb);
    cfg.workers_per_lambda = 4;
    let ol = sonic_openlambda::start(cfg).await?;
    assert_eq!(
        upload(&ol, "echo", tarball(&[("f.py", ECHO)], "")?)
            .await?
            .0,
        201
    );
    let calls = (0..64).map(|i| {
        let ol = &ol;
        async move { run(ol, "echo", &serde_json::json!({ "i": i })).await }
    });
    let results = futures::future::join_all(calls).await;
    for (i, r) in results.into_iter().enumerate() {
        let (status, body) = r?;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body)?,
            serde_json::json!({ "i": i })
        );
    }
    assert!(
        ol.handlers.cold_starts() <= 4,
        "{} workers",
        ol.handlers.cold_starts()
    );
    stop(ol, dir.path(), sb).await
}

both!(
    runtime_exit_in,
    a_handler_that_ends_its_runtime_makes_the_next_call_cold,
    a_handler_that_ends_its_runtime_makes_the_next_call_cold_in_docker
);

/// A handler that ends its own runtime (`os._exit`) fails its call; the next call starts a new
/// worker and is counted as a cold start, and imports again.
async fn runtime_exit_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    let code = "import os, time\nimported = time.time_ns()\ndef f(event):\n    if event == 'exit':\n        os._exit(3)\n    return imported\n";
    assert_eq!(
        upload(&ol, "exit", tarball(&[("f.py", code)], "")?)
            .await?
            .0,
        201
    );
    let (status, first) = run(&ol, "exit", &serde_json::Value::Null).await?;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        run(&ol, "exit", &serde_json::Value::Null).await?,
        (200, first.clone())
    );
    assert_eq!(ol.handlers.cold_starts(), 1);
    let (status, body) = run(&ol, "exit", &serde_json::json!("exit")).await?;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("the Python worker failed"), "{body}");
    let (status, again) = run(&ol, "exit", &serde_json::Value::Null).await?;
    assert_eq!(status, 200, "{again}");
    assert_ne!(again, first, "the next call imported again");
    assert_eq!(ol.handlers.cold_starts(), 2, "the next call was cold");
    let stats: serde_json::Value = reqwest::get(format!("{}/stats", ol.url()))
        .await?
        .json()
        .await?;
    assert_eq!(stats["cold-start.cnt"], 2, "{stats}");
    stop(ol, dir.path(), sb).await
}

/// Each worker container runs under the CPU bound (`worker_cpus`) as Docker's CFS quota, which
/// the handler sees in its container's cgroup (cgroup v1's `cpu` controller).
#[tokio::test]
async fn a_worker_container_runs_under_its_cpu_bound_in_docker() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config_in(dir.path(), Sb::Docker);
    cfg.worker_cpus = 0.5;
    let ol = sonic_openlambda::start(cfg).await?;
    let code = "import os\ndef f(event):\n    base = '/sys/fs/cgroup/cpu'\n    return {'quota': int(open(base + '/cpu.cfs_quota_us').read()), 'period': int(open(base + '/cpu.cfs_period_us').read()), 'uid': os.getuid(), 'net': sorted(os.listdir('/sys/class/net'))}\n";
    assert_eq!(
        upload(&ol, "cpu", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let (status, body) = run(&ol, "cpu", &serde_json::json!(null)).await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        v["quota"]
            .as_f64()
            .zip(v["period"].as_f64())
            .map(|(q, p)| q / p),
        Some(0.5),
        "{v}"
    );
    // No network but loopback.
    assert_eq!(v["net"], serde_json::json!(["lo"]), "{v}");
    stop(ol, dir.path(), Sb::Docker).await
}

/// A listener that exited without stopping (a test process, a killed daemon) leaves its
/// workers' CPU groups; the next listener to start removes those of dead processes and keeps
/// those of live ones. Needs root and cgroup v1's `cpu` controller.
#[tokio::test]
async fn stale_cpu_groups_of_dead_listeners_are_removed_at_start() -> Res {
    let root = Path::new("/sys/fs/cgroup/cpu");
    // A pid that ran and is gone.
    let mut child = std::process::Command::new("true").spawn()?;
    let dead = child.id();
    child.wait()?;
    let stale = root.join(format!("sonic-openlambda-{dead}-7"));
    let live = root.join(format!("sonic-openlambda-{}-999999", std::process::id()));
    std::fs::create_dir(&stale)
        .map_err(|e| format!("cannot make {} (needs root): {e}", stale.display()))?;
    std::fs::create_dir(&live)?;
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await;
    let (stale_left, live_left) = (stale.exists(), live.exists());
    let _ = std::fs::remove_dir(&stale);
    let _ = std::fs::remove_dir(&live);
    ol?.stop().await;
    assert!(!stale_left, "{} was not removed", stale.display());
    assert!(
        live_left,
        "{} of a live process was removed",
        live.display()
    );
    Ok(())
}

/// Likewise the containers of a listener that is gone: one labelled with a dead pid of this pid
/// namespace is removed when a Docker listener starts.
#[tokio::test]
async fn stale_containers_of_dead_listeners_are_removed_at_start_in_docker() -> Res {
    let mut child = std::process::Command::new("true").spawn()?;
    let dead = child.id();
    child.wait()?;
    let ns: String = std::fs::read_link("/proc/self/ns/pid")?
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let name = format!("sonic-ol-test-stale-{}", std::process::id());
    let made = std::process::Command::new("docker")
        .args(["create", "--pull", "never", "--name", &name, "--label"])
        .arg(format!(
            "{}={ns}-{dead}",
            sonic_openlambda::worker::OWNER_LABEL
        ))
        .args([PYTHON_IMAGE, "true"])
        .output()?;
    assert!(
        made.status.success(),
        "docker create: {} (build the image: bash deploy/build-python-image.sh)",
        String::from_utf8_lossy(&made.stderr)
    );
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), Sb::Docker)).await;
    let left = std::process::Command::new("docker")
        .args(["inspect", &name])
        .output()?
        .status
        .success();
    if left {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &name])
            .output();
    }
    ol?.stop().await;
    assert!(!left, "the stale container {name} was not removed");
    Ok(())
}

#[tokio::test]
async fn a_full_queue_gives_429() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path());
    cfg.workers_per_lambda = 1;
    cfg.queue_per_lambda = 1;
    let ol = sonic_openlambda::start(cfg).await?;
    let gate = dir.path().join("gate");
    let code = "import os, time\ndef f(event):\n    open(event + '.started', 'w').close()\n    while not os.path.exists(event + '.release'):\n        time.sleep(0.01)\n    return 'released'\n";
    assert_eq!(
        upload(&ol, "gate", tarball(&[("f.py", code)], "")?)
            .await?
            .0,
        201
    );
    let event = serde_json::json!(gate.to_string_lossy());
    let first = tokio::spawn({
        let url = format!("{}/run/gate", ol.url());
        let body = serde_json::to_vec(&event)?;
        async move {
            reqwest::Client::new()
                .post(url)
                .body(body)
                .send()
                .await?
                .text()
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gate.with_extension("started").exists() {
        assert!(Instant::now() < deadline, "the first call never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = run(&ol, "gate", &event).await?;
    assert_eq!(status, 429, "{body}");
    std::fs::write(gate.with_extension("release"), b"")?;
    assert_eq!(first.await??, "\"released\"");
    ol.stop().await;
    Ok(())
}

#[tokio::test]
async fn hostile_tarballs_are_refused_and_change_nothing() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    assert_eq!(
        upload(&ol, "echo", tarball(&[("f.py", ECHO)], "")?)
            .await?
            .0,
        201
    );
    let bad = [
        (b"def f(event): return 1\n".to_vec(), "not a gzip"),
        (
            tarball(&[("f.py", ECHO), ("../evil.py", "x")], "")?,
            "stay inside",
        ),
        (
            tarball(&[("f.py", ECHO), ("/tmp/evil.py", "x")], "")?,
            "stay inside",
        ),
        (
            tarball(
                &[("f.py", ECHO)],
                "info = tarfile.TarInfo('out')\ninfo.type = tarfile.SYMTYPE\ninfo.linkname = '/etc'\ntar.addfile(info)",
            )?,
            "symlink",
        ),
        (
            tarball(
                &[("f.py", ECHO)],
                "info = tarfile.TarInfo('sub/up')\ninfo.type = tarfile.SYMTYPE\ninfo.linkname = '../..'\ntar.addfile(info)",
            )?,
            "symlink",
        ),
        (tarball(&[("README", "no handler")], "")?, "no f.py"),
        (
            tarball(&[("f.py", ECHO), ("ol.yaml", "triggers: [")], "")?,
            "ol.yaml",
        ),
    ];
    for (tgz, why) in bad {
        let (status, body) = upload(&ol, "echo", tgz).await?;
        assert_eq!(status, 400, "{why}: {body}");
        assert!(body.contains(why), "expected `{why}` in: {body}");
        // The installed version still answers, and nothing else appeared.
        assert_eq!(
            run(&ol, "echo", &serde_json::json!(7)).await?,
            (200, "7".into())
        );
    }
    let (status, _) = upload(&ol, "../x", tarball(&[("f.py", ECHO)], "")?).await?;
    assert!(status == 400 || status == 404, "{status}");
    let registry: Vec<_> =
        std::fs::read_dir(dir.path().join("registry"))?.collect::<Result<_, _>>()?;
    assert_eq!(registry.len(), 1, "{registry:?}");
    assert!(!Path::new("/tmp/evil.py").exists());
    ol.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_token_off_loopback_and_when_set() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path());
    cfg.listen = ([0, 0, 0, 0], 0).into();
    assert!(matches!(
        sonic_openlambda::start(cfg).await,
        Err(StartError::TokenRequired(_))
    ));
    let mut cfg = config(dir.path());
    cfg.token = "a-long-enough-openlambda-token".into();
    let ol = sonic_openlambda::start(cfg).await?;
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{}/status", ol.url()))
            .send()
            .await?
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        http.get(format!("{}/registry", ol.url()))
            .send()
            .await?
            .status()
            .as_u16(),
        401
    );
    let r = http
        .get(format!("{}/registry", ol.url()))
        .bearer_auth("a-long-enough-openlambda-token")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    ol.stop().await;
    Ok(())
}

/// The folders under `<dir>/venvs/` (one per requirements set built).
fn venvs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("venvs"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn unpinned_requirements_are_refused_and_change_nothing() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    let v1 = "def f(event):\n    return 'v1'\n";
    assert_eq!(
        upload(&ol, "pins", tarball(&[("f.py", v1)], "")?).await?.0,
        201
    );
    let v2 = "def f(event):\n    return 'v2'\n";
    for (reqs, says) in [
        ("six\n", "line 1: `six` is not pinned as name==version"),
        ("# ok\nsix>=1.16\n", "line 2: `six>=1.16` is not pinned"),
        ("--index-url http://example.com/simple\n", "not pinned"),
        ("six==1.16.0\nsix==1.17.0\n", "pins six more than once"),
    ] {
        let tgz = tarball(&[("f.py", v2), ("requirements.txt", reqs)], "")?;
        let (status, body) = upload(&ol, "pins", tgz).await?;
        assert_eq!(status, 400, "{reqs}: {body}");
        assert!(body.contains(says), "{reqs}: {body}");
    }
    // Nothing changed: the old code answers, and no environment was made.
    assert_eq!(
        run(&ol, "pins", &serde_json::json!(null)).await?,
        (200, "\"v1\"".into())
    );
    assert!(venvs(dir.path()).is_empty());
    // A requirements.txt of comments only pins nothing: no environment either.
    let tgz = tarball(&[("f.py", v2), ("requirements.txt", "# none yet\n\n")], "")?;
    assert_eq!(upload(&ol, "pins", tgz).await?.0, 201);
    assert_eq!(
        run(&ol, "pins", &serde_json::json!(null)).await?,
        (200, "\"v2\"".into())
    );
    assert!(venvs(dir.path()).is_empty());
    ol.stop().await;
    Ok(())
}

/// Installs a tiny pure-Python wheel (`six`, 11 kB) from PyPI: needs the network, a few seconds.
#[tokio::test]
async fn requirements_install_from_pypi_into_a_shared_venv() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    let code = "import sys, six\ndef f(event):\n    return {'six': six.__version__, 'prefix': sys.prefix, 'tag': TAG}\n";
    let with = |tag: &str, reqs: &str| {
        tarball(
            &[
                ("f.py", &format!("TAG = '{tag}'\n{code}")),
                ("requirements.txt", reqs),
            ],
            "",
        )
    };
    // Two lambdas with the same pins, uploaded at once: one build, one environment.
    let (a, b) = tokio::join!(
        upload(&ol, "six-a", with("a", "six==1.16.0\n")?),
        upload(&ol, "six-b", with("b", "# same\nSix == 1.16.0\n")?)
    );
    let (a, b) = (a?, b?);
    assert_eq!((a.0, b.0), (201, 201), "{a:?} {b:?}");
    let built = venvs(dir.path());
    assert_eq!(built.len(), 1, "{built:?}");
    assert!(dir.path().join("pip-cache").is_dir());
    // `/stats` counts a package when a run first needs it (OpenLambda pulls it then): none yet,
    // one after the first run, still one after the second lambda with the same pin.
    assert_eq!(pulled(&ol).await?, None);
    for (i, name) in ["six-a", "six-b"].into_iter().enumerate() {
        let (status, body) = run(&ol, name, &serde_json::json!(null)).await?;
        assert_eq!(pulled(&ol).await?, Some(1.into()), "after run {i}");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body)?;
        assert_eq!(v["six"], "1.16.0");
        let prefix = v["prefix"].as_str().unwrap_or_default();
        assert!(
            Path::new(prefix).ends_with(Path::new("venvs").join(&built[0])),
            "{prefix}"
        );
    }
    // A version that does not exist: 400 with pip's last lines, and the old code still serves.
    let (status, body) = upload(&ol, "six-a", with("a2", "six==99.0.0\n")?).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("pip install of requirements.txt failed"),
        "{body}"
    );
    assert!(body.contains("six==99.0.0"), "{body}");
    assert_eq!(venvs(dir.path()), built, "a failed build leaves nothing");
    let (status, body) = run(&ol, "six-a", &serde_json::json!(null)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["tag"],
        "a"
    );
    // New pins, new environment; the other lambda keeps its own.
    let (status, body) = upload(&ol, "six-a", with("a3", "six==1.17.0\n")?).await?;
    assert_eq!(status, 201, "{body}");
    assert_eq!(venvs(dir.path()).len(), 2);
    let (_, body) = run(&ol, "six-a", &serde_json::json!(null)).await?;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["six"],
        "1.17.0"
    );
    assert_eq!(pulled(&ol).await?, Some(2.into()), "a new pin");
    let (_, body) = run(&ol, "six-b", &serde_json::json!(null)).await?;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["six"],
        "1.16.0"
    );
    ol.stop().await;
    // After a restart the lambdas run in their environments again, without building.
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    let (_, body) = run(&ol, "six-a", &serde_json::json!(null)).await?;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["six"],
        "1.17.0"
    );
    assert_eq!(venvs(dir.path()).len(), 2);
    ol.stop().await;
    Ok(())
}

/// A 100 MB body (past the default 64 MiB `max_body`) gets 413 on `/run/` and on the registry,
/// and changes nothing: the installed lambda keeps answering.
#[tokio::test]
async fn a_100_mb_body_gets_413_and_changes_nothing() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    assert_eq!(
        upload(&ol, "echo", tarball(&[("f.py", ECHO)], "")?)
            .await?
            .0,
        201
    );
    let huge = vec![b' '; 100_000_000];
    let http = reqwest::Client::new();
    for route in ["run/echo", "registry/echo"] {
        let r = http
            .post(format!("{}/{route}", ol.url()))
            .body(huge.clone())
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 413, "{route}");
    }
    assert_eq!(
        run(&ol, "echo", &serde_json::json!("still")).await?,
        (200, "\"still\"".into())
    );
    let names: Vec<String> = http
        .get(format!("{}/registry", ol.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(names, vec!["echo".to_string()]);
    ol.stop().await;
    Ok(())
}

/// In the Docker sandbox a lambda's `requirements.txt` environment is built in a container of
/// the Python image (`<dir>/docker-venvs/<sha256>/`, as the agents build theirs) at upload, and
/// its workers run that environment's Python, bound at `/sonic/venv`; a pin that does not exist
/// is refused at upload and the installed version keeps serving. Needs PyPI.
#[tokio::test]
async fn requirements_install_from_pypi_into_an_image_venv_in_docker() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config_in(dir.path(), Sb::Docker)).await?;
    let code = "import sys, six\ndef f(event):\n    return {'six': six.__version__, 'prefix': sys.prefix, 'exe': sys.executable, 'tag': TAG}\n";
    let with = |tag: &str, reqs: &str| {
        tarball(
            &[
                ("f.py", &format!("TAG = '{tag}'\n{code}")),
                ("requirements.txt", reqs),
            ],
            "",
        )
    };
    let (status, body) = upload(&ol, "six", with("a", "six==1.16.0\n")?).await?;
    assert_eq!(status, 201, "{body}");
    let listed = |sub: &str| -> Vec<String> {
        std::fs::read_dir(dir.path().join(sub))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        listed("docker-venvs").len(),
        1,
        "one environment, built in the image"
    );
    assert!(venvs(dir.path()).is_empty(), "none on the host");
    let (status, body) = run(&ol, "six", &serde_json::json!(null)).await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["six"], "1.16.0", "{v}");
    assert_eq!(v["prefix"], "/sonic/venv", "{v}");
    let (status, body) = upload(&ol, "six", with("b", "six==99.0.0\n")?).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("pip install of requirements.txt failed"),
        "{body}"
    );
    let (status, body) = run(&ol, "six", &serde_json::json!(null)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["tag"],
        "a"
    );
    stop(ol, dir.path(), Sb::Docker).await?;
    let builds = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", "label=sonic.venv-build"])
        .output()?;
    assert!(builds.stdout.is_empty(), "build containers left");
    Ok(())
}

both!(
    limits_in,
    a_worker_and_its_children_stay_within_their_process_and_memory_bounds,
    a_worker_and_its_children_stay_within_their_process_and_memory_bounds_in_docker
);

/// Forks a chain of `n` processes (each forks the next) and returns how many it made: `fork`
/// fails once the worker's process bound is reached.
const FORK_CHAIN: &str = r#"import os

def chain(n):
    if n == 0:
        return 0
    try:
        pid = os.fork()
    except OSError:
        return 0
    if pid:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    os._exit(min(1 + chain(n - 1), 255))

def f(event):
    return chain(event["times"])
"#;

/// Tries ever larger allocations, each in a child of its own, and returns the largest that
/// succeeded, in MiB (or, with `{"here": MB}`, allocates in the worker itself).
const ALLOC_IN_CHILDREN: &str = r#"import os

def attempt(mb):
    pid = os.fork()
    if pid == 0:
        data = bytearray(mb << 20)
        for i in range(0, len(data), 4096):
            data[i] = 1
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status == 0

def f(event):
    if "here" in event:
        data = bytearray(event["here"] << 20)
        for i in range(0, len(data), 4096):
            data[i] = 1
        return len(data) >> 20
    for mb in range(1, 512):
        if not attempt(mb):
            return mb - 1
    return 512
"#;

/// OpenLambda's `fork_bomb` and `max_mem_alloc` cases, written anew: with a process bound of 10
/// a handler forks at most 10 processes, and with a memory bound of 50 MiB its children
/// allocate between 34 and 50 MiB (the worker's own memory counts too), as OpenLambda's tests
/// expect of its sandboxes. A worker that itself goes over the bound is killed, the call fails
/// saying so (process sandbox: its memory group counted the kill), and the next call gets a new
/// worker.
async fn limits_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config_in(dir.path(), sb);
    cfg.worker_procs = 10;
    cfg.worker_resident = 50 << 20;
    let ol = sonic_openlambda::start(cfg).await?;
    for (name, code) in [("fbomb", FORK_CHAIN), ("mem", ALLOC_IN_CHILDREN)] {
        let up = upload(&ol, name, tarball(&[("f.py", code)], "")?).await?;
        assert_eq!(up.0, 201, "{up:?}");
    }
    let (status, body) = run(&ol, "fbomb", &serde_json::json!({"times": 20})).await?;
    assert_eq!(status, 200, "{body}");
    let forked: u32 = body.trim().parse()?;
    assert!(
        (1..=10).contains(&forked),
        "forked {forked} with a bound of 10"
    );
    let (status, body) = run(&ol, "mem", &serde_json::json!({})).await?;
    assert_eq!(status, 200, "{body}");
    let mb: u32 = body.trim().parse()?;
    assert!(
        (34..=50).contains(&mb),
        "allocated {mb} MiB with a bound of 50"
    );
    let (status, body) = run(&ol, "mem", &serde_json::json!({"here": 200})).await?;
    assert_eq!(status, 500, "{body}");
    if sb == Sb::Process {
        assert!(body.contains("memory bound of 50 MiB"), "{body}");
    }
    assert_eq!(
        run(&ol, "mem", &serde_json::json!({"here": 1})).await?,
        (200, "1".into())
    );
    stop(ol, dir.path(), sb).await
}

both!(
    registry_folder_in,
    lambdas_are_pulled_from_a_registry_folder_within_its_cache_interval,
    lambdas_are_pulled_from_a_registry_folder_within_its_cache_interval_in_docker
);

/// A lambda returning `n`, as a `.tar.gz` of its `f.py`.
fn version(n: u32) -> Res<Vec<u8>> {
    tarball(&[("f.py", &format!("def f(event):\n    return {n}\n"))], "")
}

/// OpenLambda's registry folder (its `update_code` and `call_each_once` cases, written anew):
/// lambdas kept there as `<name>.tar.gz`, `<name>.py` or `<name>/` are installed when called;
/// a new version is used once the cache interval has passed since the folder was last looked
/// at, not before; uploads are kept there and deletes remove them; a version that cannot be
/// installed leaves the one before serving. The interval is an hour or zero here, so that
/// nothing depends on how fast the machine is.
async fn registry_folder_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder)?;
    std::fs::write(folder.join("version.tar.gz"), version(0)?)?;
    let start = |cache: Duration, data: &str| {
        let mut cfg = config_in(&dir.path().join(data), sb);
        cfg.registry_folder = Some(folder.clone());
        cfg.registry_cache = cache;
        sonic_openlambda::start(cfg)
    };
    let hour = start(Duration::from_secs(3600), "a").await?;
    assert_eq!(
        run(&hour, "version", &serde_json::json!(null)).await?,
        (200, "0".into())
    );
    std::fs::write(folder.join("version.tar.gz"), version(1)?)?;
    assert_eq!(
        run(&hour, "version", &serde_json::json!(null)).await?,
        (200, "0".into()),
        "within the cache interval the code pulled before is used"
    );
    stop(hour, &dir.path().join("a"), sb).await?;

    let now = start(Duration::ZERO, "b").await?;
    assert_eq!(
        run(&now, "version", &serde_json::json!(null)).await?,
        (200, "1".into())
    );
    let stats: serde_json::Value = reqwest::get(format!("{}/stats", now.url()))
        .await?
        .json()
        .await?;
    assert_eq!(stats["pull-lambda.cnt"], 1, "{stats}");
    std::fs::write(folder.join("version.tar.gz"), version(2)?)?;
    assert_eq!(
        run(&now, "version", &serde_json::json!(null)).await?,
        (200, "2".into()),
        "past the interval the new version is pulled"
    );
    // Ten lambdas, as `call_each_once` makes them.
    for n in 0..10 {
        std::fs::write(folder.join(format!("L{n}.tar.gz")), version(n)?)?;
    }
    for n in 0..10 {
        assert_eq!(
            run(&now, &format!("L{n}"), &serde_json::json!({"alloc_mb": 1})).await?,
            (200, n.to_string())
        );
    }
    // A lone script, and a folder.
    std::fs::write(
        folder.join("script.py"),
        "def f(event):\n    return 'script'\n",
    )?;
    std::fs::create_dir(folder.join("tree"))?;
    std::fs::write(
        folder.join("tree/f.py"),
        "import helper\ndef f(event):\n    return helper.NAME\n",
    )?;
    std::fs::write(folder.join("tree/helper.py"), "NAME = 'tree'\n")?;
    assert_eq!(
        run(&now, "script", &serde_json::json!(null)).await?,
        (200, "\"script\"".into())
    );
    assert_eq!(
        run(&now, "tree", &serde_json::json!(null)).await?,
        (200, "\"tree\"".into())
    );
    // A version that cannot be installed: the one before serves; with none before, the call
    // says why.
    std::fs::write(folder.join("script.py"), "")?;
    std::fs::write(folder.join("script.tar.gz"), b"not gzip")?;
    assert_eq!(
        run(&now, "script", &serde_json::json!(null)).await?,
        (200, "\"script\"".into())
    );
    std::fs::write(folder.join("broken.tar.gz"), b"not gzip")?;
    let (status, body) = run(&now, "broken", &serde_json::json!(null)).await?;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("not a gzip file"), "{body}");
    // Uploads are kept in the folder; deletes remove every form of the lambda.
    assert_eq!(upload(&now, "uploaded", version(7)?).await?.0, 201);
    assert!(folder.join("uploaded.tar.gz").is_file());
    assert_eq!(
        run(&now, "uploaded", &serde_json::json!(null)).await?,
        (200, "7".into())
    );
    let listed: Vec<String> = reqwest::get(format!("{}/registry", now.url()))
        .await?
        .json()
        .await?;
    for name in ["L9", "broken", "script", "tree", "uploaded", "version"] {
        assert!(listed.iter().any(|n| n == name), "{name} not in {listed:?}");
    }
    for name in ["uploaded", "script"] {
        let r = reqwest::Client::new()
            .delete(format!("{}/registry/{name}", now.url()))
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(run(&now, name, &serde_json::json!(null)).await?.0, 404);
    }
    assert!(!folder.join("uploaded.tar.gz").exists());
    assert!(!folder.join("script.py").exists() && !folder.join("script.tar.gz").exists());
    // A lambda removed from the folder is gone.
    std::fs::remove_file(folder.join("L0.tar.gz"))?;
    assert_eq!(run(&now, "L0", &serde_json::json!(null)).await?.0, 404);
    stop(now, &dir.path().join("b"), sb).await
}

both!(
    scratch_in,
    a_worker_writes_to_a_tmp_of_its_own,
    a_worker_writes_to_a_tmp_of_its_own_in_docker
);

/// Writes a file named by the event into `/tmp` and says whether one named by the event's
/// `seen` is there.
const TMP_WRITER: &str = r#"import os, tempfile

def f(event):
    if "write" in event:
        with open("/tmp/" + event["write"], "w") as out:
            out.write("x")
    return {"seen": os.path.exists("/tmp/" + event.get("seen", "-")),
            "tmpdir": tempfile.gettempdir()}
"#;

/// A handler's `/tmp` is its worker's own: a file it writes there is not on the host and not
/// seen by another lambda's worker. The listener's folder is outside `/tmp` here (a worker's own
/// `/tmp` hides the host's); in Docker, `/tmp` is the container's tmpfs.
async fn scratch_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let ol = sonic_openlambda::start(config_in(dir.path(), sb)).await?;
    for name in ["w1", "w2"] {
        assert_eq!(
            upload(&ol, name, tarball(&[("f.py", TMP_WRITER)], "")?)
                .await?
                .0,
            201
        );
    }
    let marker = format!(
        "sonic-scratch-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    );
    let event = serde_json::json!({ "write": marker, "seen": marker });
    let (status, body) = run(&ol, "w1", &event).await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["seen"], true, "the handler sees what it wrote: {v}");
    assert_eq!(v["tmpdir"], "/tmp", "{v}");
    assert!(
        !Path::new("/tmp").join(&marker).exists(),
        "the handler's file is on the host's /tmp"
    );
    let (status, body) = run(&ol, "w2", &serde_json::json!({ "seen": marker })).await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["seen"], false, "another worker sees it: {v}");
    stop(ol, dir.path(), sb).await
}

/// Where a worker cannot have a `/tmp` of its own (the listener's folder is under `/tmp`, as a
/// test's temporary folder is), its `TMPDIR` is a folder of its own, removed when it stops.
#[tokio::test]
async fn a_worker_without_a_tmp_of_its_own_gets_a_scratch_folder() -> Res {
    let dir = tempfile::tempdir()?;
    let ol = sonic_openlambda::start(config(dir.path())).await?;
    let code = "import os, tempfile\ndef f(event):\n    d = tempfile.gettempdir()\n    open(os.path.join(d, 'x'), 'w').write('x')\n    return d\n";
    assert_eq!(
        upload(&ol, "s", tarball(&[("f.py", code)], "")?).await?.0,
        201
    );
    let (status, body) = run(&ol, "s", &serde_json::json!(null)).await?;
    assert_eq!(status, 200, "{body}");
    let scratch: String = serde_json::from_str(&body)?;
    assert!(
        Path::new(&scratch).starts_with(dir.path().join("scratch")),
        "{scratch}"
    );
    assert!(Path::new(&scratch).join("x").is_file());
    ol.stop().await;
    assert!(!Path::new(&scratch).exists(), "{scratch} left behind");
    Ok(())
}

/// Idle workers go: after `keep_alive` without a call, and past `max_warm` warm workers in all
/// (the one idle longest first), so that a listener that served many lambdas does not keep a
/// Python process for each.
#[tokio::test]
async fn idle_workers_are_stopped_after_their_keep_alive_and_past_the_warm_bound() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(&dir.path().join("a"));
    cfg.keep_alive = Duration::from_millis(300);
    let ol = sonic_openlambda::start(cfg).await?;
    assert_eq!(
        upload(&ol, "a", tarball(&[("f.py", ECHO)], "")?).await?.0,
        201
    );
    assert_eq!(
        run(&ol, "a", &serde_json::json!(1)).await?,
        (200, "1".into())
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while ol.handlers.evictions() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((ol.handlers.evictions(), ol.handlers.warm()), (1, 0));
    let stats: serde_json::Value = reqwest::get(format!("{}/stats", ol.url()))
        .await?
        .json()
        .await?;
    assert_eq!(stats["evict.cnt"], 1, "{stats}");
    assert_eq!(stats["LambdaInstance-RoundTrip.cnt"], 1, "{stats}");
    assert_eq!(
        run(&ol, "a", &serde_json::json!(2)).await?,
        (200, "2".into())
    );
    assert_eq!(
        ol.handlers.cold_starts(),
        2,
        "the call after the keep-alive is cold"
    );
    ol.stop().await;

    let mut cfg = config(&dir.path().join("b"));
    cfg.max_warm = 2;
    let ol = sonic_openlambda::start(cfg).await?;
    for name in ["a", "b", "c"] {
        assert_eq!(
            upload(&ol, name, tarball(&[("f.py", ECHO)], "")?).await?.0,
            201
        );
        assert_eq!(run(&ol, name, &serde_json::json!(0)).await?.0, 200);
    }
    assert_eq!((ol.handlers.warm(), ol.handlers.evictions()), (2, 1));
    // `a` waited longest and went; `c` is still warm.
    assert_eq!(run(&ol, "c", &serde_json::json!(0)).await?.0, 200);
    assert_eq!(ol.handlers.cold_starts(), 3);
    assert_eq!(run(&ol, "a", &serde_json::json!(0)).await?.0, 200);
    assert_eq!(ol.handlers.cold_starts(), 4);
    assert_eq!(ol.handlers.warm(), 2);
    ol.stop().await;
    Ok(())
}

both!(
    cron_in,
    a_lambdas_cron_trigger_calls_it_on_schedule,
    a_lambdas_cron_trigger_calls_it_on_schedule_in_docker
);

/// `/stats`' `cron-run.cnt`: how many times cron triggers called lambdas.
async fn cron_runs(ol: &Running) -> Res<u64> {
    let stats: serde_json::Value = reqwest::get(format!("{}/stats", ol.url()))
        .await?
        .json()
        .await?;
    Ok(stats["cron-run.cnt"].as_u64().unwrap_or(0))
}

/// An `ol.yaml` cron trigger calls the lambda with `{}` on its schedule (here every second, a
/// pattern with seconds), as OpenLambda's boss does, whatever HTTP methods the lambda allows;
/// the lambda's removal stops it; a schedule that is not one is refused at upload.
async fn cron_in(sb: Sb) -> Res {
    let dir = tempfile::tempdir()?;
    // One worker, so that every call (the trigger's and the test's) counts on the same one.
    let mut cfg = config_in(dir.path(), sb);
    cfg.workers_per_lambda = 1;
    let ol = sonic_openlambda::start(cfg).await?;
    let code = "ticks = 0\ndef f(event):\n    global ticks\n    if event == {}:\n        ticks += 1\n    return ticks\n";
    let yaml = "triggers:\n  http:\n    - method: GET\n  cron:\n    - schedule: \"* * * * * *\"\n";
    let up = upload(
        &ol,
        "tick",
        tarball(&[("f.py", code), ("ol.yaml", yaml)], "")?,
    )
    .await?;
    assert_eq!(up.0, 201, "{up:?}");
    assert_eq!(ol.handlers.scheduled(), ["tick"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cron_runs(&ol).await? < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cron_runs(&ol).await? >= 3,
        "the trigger did not fire three times"
    );
    // Over HTTP only GET is allowed; the trigger's calls counted.
    let r = reqwest::Client::new()
        .get(format!("{}/run/tick", ol.url()))
        .body("{\"ask\": 1}")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    let ticks: u64 = r.text().await?.trim().parse()?;
    assert!(ticks >= 3, "the handler counted {ticks} calls with {{}}");
    assert_eq!(run(&ol, "tick", &serde_json::json!({})).await?.0, 405);
    let r = reqwest::Client::new()
        .delete(format!("{}/registry/tick", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert!(ol.handlers.scheduled().is_empty());
    let bad = "triggers:\n  cron:\n    - schedule: \"every morning\"\n";
    let (status, body) = upload(
        &ol,
        "bad",
        tarball(&[("f.py", ECHO), ("ol.yaml", bad)], "")?,
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not a cron schedule"), "{body}");
    assert_eq!(run(&ol, "bad", &serde_json::json!(null)).await?.0, 404);
    // A warm worker for `stop`'s check that the listener's workers go with it.
    assert_eq!(
        upload(&ol, "echo", tarball(&[("f.py", ECHO)], "")?)
            .await?
            .0,
        201
    );
    assert_eq!(run(&ol, "echo", &serde_json::json!(1)).await?.0, 200);
    stop(ol, dir.path(), sb).await
}

/// OpenLambda's Flask and FastAPI cases (`flask_test`, `wsgi_post_echo_test`,
/// `flask_entry_test`, `fastapi_test`), written anew with the same requests and expectations:
/// real Flask and FastAPI apps, their packages installed from PyPI by the lambdas'
/// `requirements.txt`. The app sets its status, headers and body; a POST body reaches it as
/// sent; an `OL_ENTRY_FILE` app answers its routes below `/run/<name>`.
#[tokio::test]
async fn flask_and_fastapi_apps_from_pypi_answer_as_openlambda_expects() -> Res {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path());
    cfg.pip_timeout = Duration::from_secs(600);
    let ol = sonic_openlambda::start(cfg).await?;
    let flask_reqs = "flask==3.0.3\n";
    let flask_app = "from flask import Flask, Response, request\napp = Flask('t')\n@app.route('/', methods=['GET', 'POST'])\ndef index():\n    if request.method == 'POST':\n        return request.get_data()\n    return Response('hi\\n', status=418, headers={'A': 'B'})\n@app.route('/info')\ndef info():\n    return {'entry_file': __file__.rsplit('/', 1)[-1], 'root': request.script_root}\n";
    let up = upload(
        &ol,
        "flask-app",
        tarball(&[("f.py", flask_app), ("requirements.txt", flask_reqs)], "")?,
    )
    .await?;
    assert_eq!(up.0, 201, "{up:?}");
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/run/flask-app", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 418);
    assert_eq!(
        r.headers().get("A").and_then(|v| v.to_str().ok()),
        Some("B")
    );
    assert_eq!(r.text().await?, "hi\n");
    for (body, kind) in [
        ("hello world", "text/plain"),
        ("{\"key\": \"value\"}", "application/json"),
    ] {
        let r = client
            .post(format!("{}/run/flask-app", ol.url()))
            .header("Content-Type", kind)
            .body(body)
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(r.text().await?, body);
    }
    // The same app from an entry file of another name, and a route below the lambda.
    let up = upload(
        &ol,
        "flask-entry",
        tarball(
            &[
                ("app.py", flask_app),
                ("requirements.txt", flask_reqs),
                ("ol.yaml", "environment:\n  OL_ENTRY_FILE: app.py\n"),
            ],
            "",
        )?,
    )
    .await?;
    assert_eq!(up.0, 201, "{up:?}");
    let r = client
        .get(format!("{}/run/flask-entry/info", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    let info: serde_json::Value = r.json().await?;
    assert_eq!(info["entry_file"], "app.py", "{info}");
    assert_eq!(info["root"], "/run/flask-entry", "{info}");
    let fastapi_app = "from fastapi import FastAPI\napp = FastAPI()\n@app.get('/')\ndef hello():\n    return {'message': 'hello world'}\n";
    let up = upload(
        &ol,
        "fastapi-app",
        tarball(
            &[
                ("f.py", fastapi_app),
                ("requirements.txt", "fastapi==0.115.0\n"),
            ],
            "",
        )?,
    )
    .await?;
    assert_eq!(up.0, 201, "{up:?}");
    let r = client
        .get(format!("{}/run/fastapi-app", ol.url()))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await?,
        serde_json::json!({"message": "hello world"})
    );
    ol.stop().await;
    Ok(())
}
