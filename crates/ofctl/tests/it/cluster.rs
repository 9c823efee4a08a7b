//! `ofctl` against a real cluster, as a user drives it: the built `ofctl up` (local store, process
//! sandbox, a free port, a temporary data folder and configuration home), then the other commands
//! as separate processes reading the configuration `up` saved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_testkit::lambda_dir;

const FAN: &str = r#"
name: fan
description: gen copies the input to two mids, sink gathers their copies into result/
params: { mids: 2 }
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 60s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: "{{ params.mids }}", timeout: 60s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 60s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

const BROKEN: &str = r#"
name: broken
functions:
  - { name: ok, image: sonic-lambdas:latest, command: [synthetic, run, --to, bad, --output-bytes, "1000"], timeout: 30s }
  - { name: bad, image: sonic-lambdas:latest, command: [synthetic, run, --exit-code, "3"], timeout: 30s }
edges:
  - { from: ok, to: bad, kind: one }
"#;

fn ofctl_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ofctl"))
}

/// What one ofctl run gave.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "ofctl failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", self.stdout))
    }

    /// Exit 1, nothing on stdout, one line on stderr.
    fn refused(&self) -> &str {
        assert_eq!(self.code, 1, "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        assert_eq!(self.stderr.trim().lines().count(), 1, "{self:?}");
        self.stderr.trim()
    }
}

/// A running `ofctl up` (local store, processes) and the configuration home its commands
/// share; `memory.rs` uses it too.
pub(crate) struct Up {
    pub(crate) child: Child,
    home: tempfile::TempDir,
    server: String,
    /// What it printed of itself, up to the server line.
    pub(crate) lines: Vec<String>,
}

impl Up {
    fn start(agents: u32) -> Up {
        Up::start_with(agents, &[])
    }

    /// With `agents` agents and `extra` arguments to `up`.
    pub(crate) fn start_with(agents: u32, extra: &[&str]) -> Up {
        let home = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(ofctl_exe())
            .args(["up", "--store", "local", "--sandbox", "process"])
            .args(["--listen", "127.0.0.1:0", "--agents", &agents.to_string()])
            .args(extra)
            .arg("--data-dir")
            .arg(home.path().join("data"))
            .arg("--lambdas")
            .arg(lambda_dir())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env_remove("SONIC_SERVER")
            .env_remove("SONIC_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ofctl up");
        // `up` prints the server line once every agent is registered.
        let stdout = child.stdout.take().expect("stdout");
        let mut reader = BufReader::new(stdout).lines();
        let mut server = None;
        let mut lines = Vec::new();
        // It prints the server, then the dashboard, then that it is ready.
        for line in reader.by_ref() {
            let line = line.expect("read ofctl up");
            if let Some(rest) = line.strip_prefix("server") {
                server = rest.split_whitespace().next().map(str::to_owned);
            }
            let ready = line.starts_with("ready:");
            lines.push(line);
            if ready {
                break;
            }
        }
        // Keep reading what follows, so that `up` never writes into a closed pipe.
        std::thread::spawn(move || reader.for_each(drop));
        let server = server.unwrap_or_else(|| {
            let _ = child.kill();
            panic!("ofctl up exited without printing its server: {lines:?}")
        });
        assert!(server.starts_with("http://127.0.0.1:"), "{server}");
        Up {
            child,
            home,
            server,
            lines,
        }
    }

    fn ofctl(&self, args: &[&str]) -> Ran {
        self.ofctl_env(args, &[])
    }

    fn ofctl_env(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let mut cmd = Command::new(ofctl_exe());
        cmd.args(args)
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env_remove("SONIC_SERVER")
            .env_remove("SONIC_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run ofctl");
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.home.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// SIGTERM, as Ctrl-C would: `up` stops everything and exits 0.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "ofctl up exited with {status}");
                break;
            }
            assert!(Instant::now() < deadline, "ofctl up did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        let addr = self.server.trim_start_matches("http://").to_owned();
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "the control plane still listens after up stopped"
        );
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} is not a string in {v}"))
}

#[test]
fn a_user_session_against_ofctl_up() {
    let up = Up::start(2);

    // The saved configuration is the user's only, and names the server `up` printed.
    let config = up.home.path().join("config/sonic/config.json");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&config).expect("config"))
        .expect("config json");
    assert_eq!(saved["server"], up.server.as_str());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&config)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "config readable by others: {mode:o}");
    }

    // It says where the dashboard is and where the token to log in with is.
    let dashboard = format!(
        "dashboard {}/  (log in with the \"token\" saved in {})",
        up.server,
        config.display()
    );
    assert!(up.lines.contains(&dashboard), "{:?}", up.lines);
    // Its logs carry no colours into a pipe (or a file).
    let r = up.ofctl_env(&["get", "agents"], &[("RUST_LOG", "debug")]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stderr.is_empty() && !r.stderr.contains('\x1b'), "{r:?}");

    // apply: created, then applied again with the same revision.
    let dag = up.file("fan.yaml", FAN);
    let r = up.ofctl(&["apply", "-f", dag.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("dag fan created"), "{r:?}");
    let applied = up
        .ofctl(&["apply", "-f", dag.to_str().unwrap(), "-o", "json"])
        .json();
    assert_eq!(applied["name"], "fan");
    assert_eq!(applied["revision"], 1);

    // run --wait -o json: the summary of interfaces.md section 3.
    let input: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let input_path = up.home.path().join("data.bin");
    std::fs::write(&input_path, &input).expect("input");
    let summary = up
        .ofctl(&[
            "run",
            "fan",
            "--input",
            input_path.to_str().unwrap(),
            "--param",
            "mids=2",
            "--wait",
            "-o",
            "json",
        ])
        .json();
    for k in [
        "job_id",
        "dag",
        "status",
        "policy",
        "mode",
        "input_bytes",
        "latency_s",
        "cost_usd",
        "perf_per_dollar",
        "edges",
        "functions",
        "outputs",
    ] {
        assert!(summary.get(k).is_some(), "summary lacks {k}: {summary}");
    }
    assert_eq!(summary["status"], "succeeded", "{summary}");
    assert_eq!(summary["dag"], "fan");
    assert_eq!(summary["input_bytes"], input.len() as u64);
    assert!(["profiling", "planned"].contains(&str_of(&summary, "mode")));
    let job = str_of(&summary, "job_id").to_owned();
    assert!(job.starts_with("j-"), "{job}");
    let functions = summary["functions"].as_array().expect("functions");
    assert_eq!(functions.len(), 4, "gen, two mids, sink: {summary}");
    for f in functions {
        for k in [
            "name", "instance", "agent", "vm_type", "cold", "seconds", "attempts",
        ] {
            assert!(f.get(k).is_some(), "function lacks {k}: {f}");
        }
    }
    for e in summary["edges"].as_array().expect("edges") {
        assert!(["vm-storage", "direct", "remote"].contains(&str_of(e, "method")));
    }
    let outputs = summary["outputs"].as_array().expect("outputs");
    assert!(!outputs.is_empty(), "no outputs: {summary}");

    // get: the DAG, the job and both agents, alive, of two VM types.
    let dags = up.ofctl(&["get", "dags", "-o", "json"]).json();
    assert!(
        dags["dags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "fan")
    );
    // get dag NAME: its revision and the revisions kept (interfaces.md section 7), its file.
    assert_eq!(summary["dag_revision"], 1, "{summary}");
    let one = up.ofctl(&["get", "dag", "fan", "-o", "json"]).json();
    assert_eq!(
        (&one["revision"], &one["revisions"]),
        (&json!(1), &json!([1])),
        "{one}"
    );
    let r = up.ofctl(&["get", "dag", "fan"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("revision:   1 (kept: 1)"), "{r:?}");
    assert!(r.stdout.contains(FAN.trim()), "the file as applied: {r:?}");
    let r = up.ofctl(&["get", "dag", "fan", "--revision", "7"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("no dag named fan with a revision 7"),
        "{r:?}"
    );
    let r = up.ofctl(&["get", "dag"]);
    assert_eq!(r.code, 2, "a usage error: {r:?}");
    let jobs = up.ofctl(&["get", "jobs", "-o", "json"]).json();
    assert!(
        jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["job_id"] == job.as_str())
    );
    let agents = up.ofctl(&["get", "agents", "-o", "json"]).json();
    let agents = agents["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 2, "{agents:?}");
    assert!(agents.iter().all(|a| a["alive"] == true), "{agents:?}");
    let mut types: Vec<&str> = agents.iter().map(|a| str_of(a, "vm_type")).collect();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), 2, "mixed VM types: {agents:?}");
    let table = up.ofctl(&["get", "agents"]);
    assert!(
        table.stdout.contains("AGENT") && table.stdout.contains("process"),
        "{table:?}"
    );

    // describe: the same summary; the table has the functions.
    let described = up.ofctl(&["describe", "job", &job, "-o", "json"]).json();
    assert_eq!(described, summary);
    let table = up.ofctl(&["describe", "job", &job]);
    assert!(
        table.stdout.contains("FUNCTIONS") && table.stdout.contains("sink"),
        "{table:?}"
    );

    // logs: one per instance of the function asked for; the table names each.
    let v = up.ofctl(&["logs", &job, "mid", "-o", "json"]).json();
    assert_eq!(v["job_id"], job.as_str());
    let entries = v["logs"].as_array().expect("logs");
    assert_eq!(entries.len(), 2, "{v}");
    assert!(entries.iter().all(|l| l["function"] == "mid"), "{v}");
    let table = up.ofctl(&["logs", &job]);
    assert_eq!(table.code, 0, "{table:?}");
    for f in ["gen[0]", "mid[1]", "sink[0]"] {
        assert!(table.stdout.contains(f), "{f} missing: {table:?}");
    }

    // models: the DAG's parameters, one job learned.
    let m = up.ofctl(&["models", "fan", "-o", "json"]).json();
    assert_eq!(m["dag"], "fan");
    assert!(m["models"].as_array().is_some_and(|v| !v.is_empty()), "{m}");
    assert!(up.ofctl(&["models", "nope"]).refused().contains("nope"));

    // fetch: every result, byte for byte the input (each stage copies what it got).
    let to = up.home.path().join("results");
    let fetched = up
        .ofctl(&["fetch", &job, "--to", to.to_str().unwrap(), "-o", "json"])
        .json();
    let files = fetched["files"].as_array().expect("files");
    assert_eq!(files.len(), outputs.len(), "{fetched}");
    for f in files {
        let path = PathBuf::from(str_of(f, "path"));
        assert!(path.starts_with(&to), "{path:?} outside {to:?}");
        assert_eq!(std::fs::read(&path).expect("result"), input, "{path:?}");
    }

    // run without --wait: the job id at once; in a table, the bare id on stdout (scripts).
    let accepted = up.ofctl(&["run", "fan", "-o", "json"]).json();
    assert!(str_of(&accepted, "job_id").starts_with("j-"));
    // With a percentile objective (the server reads it; a profiling job is not planned for
    // it, so its summary has none).
    let with_slo = up
        .ofctl(&[
            "run",
            "fan",
            "--slo",
            "p95=1h",
            "--slo-best-effort",
            "--wait",
            "-o",
            "json",
        ])
        .json();
    assert_eq!(with_slo["status"], "succeeded", "{with_slo}");
    assert_eq!(with_slo["mode"], "profiling", "{with_slo}");
    assert!(with_slo.get("slo").is_none(), "{with_slo}");
    let bare = up.ofctl(&["run", "fan", "--key", "cluster-test"]);
    assert_eq!(bare.code, 0, "{bare:?}");
    let id = bare.stdout.trim().to_owned();
    assert!(id.starts_with("j-") && !id.contains(' '), "{bare:?}");
    // The same key: the same job, nothing new.
    let again = up.ofctl(&["run", "fan", "--key", "cluster-test"]);
    assert_eq!(
        (again.code, again.stdout.trim()),
        (0, id.as_str()),
        "{again:?}"
    );
    // get jobs filters; a filter on another kind is bad usage; logs of no such function fail.
    let listed = up
        .ofctl(&["get", "jobs", "--dag", "fan", "--limit", "2", "-o", "json"])
        .json();
    let jobs = listed["jobs"].as_array().expect("jobs");
    assert!(
        jobs.len() <= 2 && jobs.iter().all(|j| j["dag"] == "fan"),
        "{listed}"
    );
    assert_eq!(up.ofctl(&["get", "dags", "--status", "failed"]).code, 2);
    assert!(
        up.ofctl(&["logs", &id, "no_such_function"])
            .refused()
            .contains("has no function no_such_function")
    );

    // A failed job: its summary on stdout, exit 1, the reason on stderr's last line.
    let broken = up.file("broken.yaml", BROKEN);
    assert_eq!(up.ofctl(&["apply", "-f", broken.to_str().unwrap()]).code, 0);
    let failed = up.ofctl(&["run", "broken", "--wait", "-o", "json"]);
    assert_eq!(failed.code, 1, "{failed:?}");
    let v: Value = serde_json::from_str(&failed.stdout).expect("summary of the failed job");
    assert_eq!(v["status"], "failed");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("bad")),
        "{v}"
    );
    let last = failed.stderr.trim().lines().last().unwrap_or("");
    assert!(last.contains("failed"), "{failed:?}");

    // Refusals: exit 1, one line.
    assert!(up.ofctl(&["run", "nope"]).refused().contains("nope"));
    assert!(
        up.ofctl(&["describe", "job", "j-0000"])
            .refused()
            .contains("j-0000")
    );
    let fetch_failed = up.ofctl(&["fetch", str_of(&v, "job_id"), "--to", to.to_str().unwrap()]);
    assert!(
        fetch_failed.refused().contains("failed"),
        "{fetch_failed:?}"
    );
    let invalid = up.file("invalid.yaml", "name: t\nfunctions: []\n");
    let line = up.ofctl(&["apply", "-f", invalid.to_str().unwrap()]);
    assert!(line.refused().contains("invalid.yaml:2:"), "{line:?}");
    let wrong = up.ofctl_env(
        &["get", "dags"],
        &[("SONIC_TOKEN", "0000000000000000000000")],
    );
    assert!(wrong.refused().contains("token"), "{wrong:?}");

    // The environment overrides the saved configuration.
    let elsewhere = up.ofctl_env(&["get", "dags"], &[("SONIC_SERVER", "http://127.0.0.1:9")]);
    assert!(elsewhere.refused().contains("127.0.0.1:9"), "{elsewhere:?}");
    let token = str_of(&saved, "token").to_owned();
    let by_env = up.ofctl_env(
        &["get", "dags", "-o", "json", "--server", &up.server],
        &[("XDG_CONFIG_HOME", "/nonexistent"), ("SONIC_TOKEN", &token)],
    );
    assert!(by_env.json()["dags"].is_array());

    // Bad usage: exit 2.
    assert_eq!(up.ofctl(&["get", "things"]).code, 2);
    assert_eq!(up.ofctl(&["run", "fan", "--param", "novalue"]).code, 2);
    assert_eq!(up.ofctl(&["run", "fan", "--slo", "p95"]).code, 2);
    assert_eq!(up.ofctl(&["run", "fan", "--slo", "p20=1s"]).code, 2);
    assert_eq!(up.ofctl(&["describe", "job"]).code, 2);
    assert_eq!(up.ofctl(&["fetch", &job]).code, 2);

    up.stop();
}

#[test]
fn commands_without_a_cluster() {
    let home = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        let out = Command::new(ofctl_exe())
            .args(args)
            .env("XDG_CONFIG_HOME", home.path())
            .env_remove("SONIC_SERVER")
            .env_remove("SONIC_TOKEN")
            .output()
            .expect("run ofctl");
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    // No configuration saved and no --server: one line that says what to do.
    let r = run(&["get", "dags"]);
    assert!(r.refused().contains("ofctl up"), "{r:?}");
    // Nothing listens there.
    let r = run(&["--server", "http://127.0.0.1:9", "get", "jobs"]);
    assert!(r.refused().contains("cannot reach"), "{r:?}");
    assert_eq!(run(&[]).code, 2);
    assert_eq!(run(&["up", "--agents", "0"]).code, 2);
    assert_eq!(run(&["up", "--sandbox", "vm"]).code, 2);
    assert_eq!(run(&["frobnicate"]).code, 2);
}

#[test]
fn demo_learns_plans_and_prints_one_json_document() {
    crate::memory::need_redis();
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(ofctl_exe())
        .args([
            "demo",
            "-o",
            "json",
            "--store",
            "local",
            "--sandbox",
            "process",
        ])
        .args(["--agents", "2", "--max-jobs", "6", "--planned-jobs", "1"])
        .arg("--data-dir")
        .arg(home.path().join("data"))
        .arg("--lambdas")
        .arg(lambda_dir())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .output()
        .expect("run ofctl demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ofctl demo failed: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let dags = doc["dags"].as_array().expect("dags");
    let names: Vec<&str> = dags.iter().map(|d| str_of(d, "dag")).collect();
    assert_eq!(names, ["synthetic-chain", "mapreduce-sort"]);
    for d in dags {
        let profiled = d["profiling_jobs"].as_array().expect("profiling jobs");
        assert!(!profiled.is_empty() && profiled.len() <= 6, "{d}");
        assert!(profiled.iter().all(|j| j["status"] == "succeeded"), "{d}");
    }
    // One planned `direct` baseline job per DAG, every edge direct, beside the planned ones.
    for d in dags {
        let base = d["baseline_jobs"].as_array().expect("baseline jobs");
        assert_eq!(base.len(), 1, "{d}");
        assert_eq!(base[0]["status"], "succeeded", "{d}");
        assert_eq!(base[0]["policy"], "direct", "{d}");
        assert_eq!(base[0]["mode"], "planned", "{d}");
        let edges = base[0]["edges"].as_array().expect("edges");
        assert!(
            !edges.is_empty() && edges.iter().all(|e| e["method"] == "direct"),
            "{d}"
        );
    }
    let planned = doc["planned_jobs"].as_array().expect("planned jobs");
    assert_eq!(planned.len(), 2, "{doc}");
    for j in planned {
        assert_eq!(j["status"], "succeeded", "{j}");
        assert!(
            j["outputs"].as_array().is_some_and(|o| !o.is_empty()),
            "{j}"
        );
    }
    assert_eq!(doc["cluster"]["sandbox"], "process");
    assert_eq!(doc["cluster"]["agents"].as_array().map(Vec::len), Some(2));
    // Its memory tier (redis-server is installed: tests/it/memory.rs), stopped with it.
    let tier = str_of(&doc["cluster"], "memory");
    assert!(
        str_of(&doc["cluster"], "memory_reason").starts_with("started redis-server"),
        "{}",
        doc["cluster"]
    );
    crate::memory::assert_gone(crate::memory::port_of(tier), "ofctl demo");
    // It stopped everything: the cluster's port no longer answers.
    let server = str_of(&doc["cluster"], "server")
        .trim_start_matches("http://")
        .to_owned();
    assert!(std::net::TcpStream::connect(server).is_err());
}

/// One slow function: long enough to be cancelled while it runs.
const SLOW: &str = r#"
name: slow
functions:
  - { name: nap, image: sonic-lambdas:latest, command: [synthetic, run, --sleep-ms, "20000"], timeout: 60s }
"#;

#[test]
fn cancel_delete_and_open() {
    let up = Up::start(1);

    // open: the dashboard is the control plane's own root.
    let open = up.ofctl(&["open"]);
    assert_eq!(open.code, 0, "{open:?}");
    assert_eq!(open.stdout.trim(), format!("{}/", up.server));
    let open = up.ofctl(&["open", "-o", "json"]).json();
    assert_eq!(open["url"], format!("{}/", up.server));

    // cancel: a running job ends failed, "cancelled".
    let slow = up.file("slow.yaml", SLOW);
    assert_eq!(up.ofctl(&["apply", "-f", slow.to_str().unwrap()]).code, 0);
    let accepted = up.ofctl(&["run", "slow", "-o", "json"]).json();
    let job = str_of(&accepted, "job_id").to_owned();
    let cancelled = up.ofctl(&["cancel", &job, "-o", "json"]).json();
    assert_eq!(cancelled["job_id"], job.as_str(), "{cancelled}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let ended = loop {
        let v = up.ofctl(&["describe", "job", &job, "-o", "json"]).json();
        if v["status"] == "failed" || v["status"] == "succeeded" {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled job did not end: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(ended["status"], "failed", "{ended}");
    assert!(
        ended["error"]
            .as_str()
            .is_some_and(|e| e.contains("cancelled")),
        "{ended}"
    );
    // The table form says what happens; a job that ended cannot be cancelled again (exit 1).
    let again = up.ofctl(&["cancel", &job]);
    assert!(again.refused().contains("already failed"), "{again:?}");
    assert!(up.ofctl(&["cancel", "j-0000"]).refused().contains("j-0000"));

    // retry: the cancelled job is queued again under its id (printed bare), and can be
    // cancelled again; a job that has not failed cannot be retried (exit 1).
    let wait_end = |job: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = up.ofctl(&["describe", "job", job, "-o", "json"]).json();
            if v["status"] == "failed" || v["status"] == "succeeded" {
                break v;
            }
            assert!(Instant::now() < deadline, "the job did not end: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let retried = up.ofctl(&["retry", &job]);
    assert_eq!(
        (retried.code, retried.stdout.trim()),
        (0, job.as_str()),
        "{retried:?}"
    );
    let again = up.ofctl(&["retry", &job]);
    assert!(
        again.refused().contains("only a failed or cancelled job"),
        "{again:?}"
    );
    assert_eq!(up.ofctl(&["cancel", &job]).code, 0);
    let ended = wait_end(&job);
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(up.ofctl(&["retry"]).code, 2);

    // delete dag: gone from the list; its job stays; a second delete is refused.
    let deleted = up.ofctl(&["delete", "dag", "slow", "-o", "json"]).json();
    assert_eq!(deleted["deleted"], "slow");
    let dags = up.ofctl(&["get", "dags", "-o", "json"]).json();
    assert!(
        dags["dags"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["name"] != "slow"),
        "{dags}"
    );
    let kept = up.ofctl(&["describe", "job", &job, "-o", "json"]).json();
    assert_eq!(kept["job_id"], job.as_str());
    assert!(
        up.ofctl(&["delete", "dag", "slow"])
            .refused()
            .contains("slow")
    );
    let table = up.ofctl(&["apply", "-f", slow.to_str().unwrap()]);
    assert_eq!(table.code, 0, "{table:?}");
    let table = up.ofctl(&["delete", "dag", "slow"]);
    assert!(table.stdout.contains("dag slow deleted"), "{table:?}");

    // delete job: an ended job goes with its results; a second delete is refused.
    let deleted = up.ofctl(&["delete", "job", &job, "-o", "json"]).json();
    assert_eq!(deleted["deleted"], job.as_str());
    assert!(
        up.ofctl(&["describe", "job", &job])
            .refused()
            .contains(&job)
    );
    assert!(up.ofctl(&["delete", "job", &job]).refused().contains(&job));
    assert!(
        up.ofctl(&["delete", "job", "x"])
            .refused()
            .contains("invalid job id")
    );

    // Secrets: set from a file or a literal, listed without their values, deleted.
    let secret_file = up.file("db-pass.txt", "s3cr3t-from-file");
    let set = up.ofctl(&[
        "create",
        "secret",
        "db-pass",
        "--from-file",
        secret_file.to_str().unwrap(),
    ]);
    assert!(
        set.code == 0 && set.stdout.contains("secret db-pass set (16 bytes)"),
        "{set:?}"
    );
    let set = up.ofctl(&[
        "create",
        "secret",
        "api",
        "--from-literal",
        "lit-value",
        "-o",
        "json",
    ]);
    assert_eq!(set.json()["bytes"], 9);
    let listed = up.ofctl(&["get", "secrets"]);
    assert!(
        listed.stdout.contains("db-pass") && listed.stdout.contains("api"),
        "{listed:?}"
    );
    assert!(
        !listed.stdout.contains("s3cr3t") && !listed.stdout.contains("lit-value"),
        "{listed:?}"
    );
    let listed = up.ofctl(&["get", "secrets", "-o", "json"]).json();
    assert_eq!(listed["secrets"][0]["name"], "api", "{listed}");
    assert_eq!(
        up.ofctl(&["create", "secret", "x"]).code,
        2,
        "a value is needed"
    );
    assert!(
        up.ofctl(&["create", "secret", ".bad", "--from-literal", "v"])
            .refused()
            .contains("invalid secret name")
    );
    assert_eq!(up.ofctl(&["delete", "secret", "api"]).code, 0);
    assert!(
        up.ofctl(&["delete", "secret", "api"])
            .refused()
            .contains("no secret api")
    );

    // Bad usage: exit 2.
    assert_eq!(up.ofctl(&["delete", "jobs", "x"]).code, 2);
    assert_eq!(up.ofctl(&["cancel"]).code, 2);

    up.stop();
}
