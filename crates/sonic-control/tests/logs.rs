//! JSON logs of a job on a cluster in this process: every event of the executor and of the
//! agents' runners carries the job's id from its span (the control plane's `job` and `run`
//! spans, the agent's `run` span), including events that do not name the job themselves.
//!
//! Its own test binary: it installs the process's global logger.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "it/support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sonic_api::control::JobStatus;
use sonic_core::regression::Convergence;
use sonic_daemon::logging::{LogFormat, subscriber};
use support::{Cluster, DAG};
use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Buffer {
        self.clone()
    }
}

/// The spans of a JSON line, outermost first.
fn spans(l: &Value) -> Vec<&Value> {
    l["spans"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn in_job(l: &Value, job: &str) -> bool {
    spans(l).iter().any(|s| s["job"] == job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_of_a_job_carries_its_id_from_the_span() {
    let buf = Buffer::default();
    let filter = tracing_subscriber::EnvFilter::new("warn,sonic_control=debug,sonic_agent=debug");
    tracing::subscriber::set_global_default(subscriber(
        LogFormat::Json,
        filter,
        buf.clone(),
        false,
    ))
    .expect("install the logger");

    let c = Cluster::start(Convergence::default()).await;
    c.apply(DAG).await;
    let id = c.submit_sized(Some("direct"), 30_000).await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
    c.stop().await;

    let text = String::from_utf8(buf.0.lock().unwrap().clone()).expect("utf-8");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let message = |l: &Value| l["fields"]["message"].as_str().unwrap_or("").to_owned();
    let find = |m: &str| -> Vec<&Value> { lines.iter().filter(|l| message(l) == m).collect() };

    // The executor: its stage events are in the job's span.
    let stages = find("stage starts");
    assert_eq!(stages.len(), 3, "{text}");
    for l in &stages {
        let outer = spans(l)[0];
        assert_eq!(
            (outer["name"].as_str(), outer["job"].as_str()),
            (Some("job"), Some(id.as_str())),
            "{l}"
        );
        assert_eq!(outer["dag"], "fan");
        assert_eq!(outer["policy"], "direct");
    }
    // Each instance's events are in a run span inside the job's: function and instance.
    let ended = find("instance ended");
    assert_eq!(ended.len(), 4, "gen, two mids, sink: {text}");
    for l in &ended {
        assert!(in_job(l, &id), "{l}");
        assert_eq!(l["span"]["name"], "run", "{l}");
        assert!(l["span"]["function"].is_string() && l["span"]["instance"].is_number());
        assert!(
            l["fields"].get("job").is_none(),
            "the job comes from the span: {l}"
        );
    }
    // The agents: every run's events carry the job from the agent's run span, though the event
    // itself names only its status.
    let runs = find("run ended");
    assert_eq!(runs.len(), 4, "{text}");
    for l in &runs {
        assert_eq!(l["span"]["name"], "run");
        assert_eq!(l["span"]["job"], id.as_str(), "{l}");
        assert!(l["span"]["attempt"].is_number(), "{l}");
        assert!(l["fields"].get("job").is_none(), "{l}");
    }
    // And nothing the executor or a runner said while the job ran escapes its span.
    for l in &lines {
        let target = l["target"].as_str().unwrap_or("");
        if target.starts_with("sonic_control::exec") || target.starts_with("sonic_agent::runner") {
            assert!(in_job(l, &id), "an event outside the job's span: {l}");
        }
    }
}
