//! Fuzzing the control plane's request decoding through the router, in-process: arbitrary and
//! structured job submissions, DAG files (mutations of a valid one), agent registrations and
//! heartbeats. Never a 5xx, never a panic; every refusal is JSON with an `error`; a DAG is
//! accepted exactly when the parser accepts the same text.
//!
//! CI runs proptest's default 256 cases per property. For a long run:
//! `PROPTEST_CASES=100000 cargo test --release -p sonic-control --test it -- fuzz_api::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use sonic_control::{ControlState, Db, JobsConfig, ManualClock, Runtime, Settings, router};
use sonic_core::dag::Dag;
use sonic_storage::memory::MemoryStore;
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789";
const LIMIT: usize = 64 * 1024;

const DAG: &str = r#"name: ml-pipeline
description: PCA, parallel tree training, combine
params:
  trees: 6
functions:
  - name: pca
    image: sonic-lambdas:latest
    command: [ml-pipeline, pca]
    timeout: 300s
  - name: train
    image: sonic-lambdas:latest
    command: [ml-pipeline, train]
    instances: "{{ params.trees }}"
  - name: combine
    image: sonic-lambdas:latest
    command: [ml-pipeline, combine]
edges:
  - { from: pca, to: train, kind: broadcast }
  - { from: train, to: combine, kind: gather }
bounds:
  max_latency: 120s
  max_cost_usd: 0.05
"#;

/// A control plane that runs jobs (in-memory store, no agents: an accepted job fails at once for
/// want of agents), with the DAG applied; and the runtime that drives it.
struct Harness {
    rt: tokio::runtime::Runtime,
    app: Router,
    _dir: tempfile::TempDir,
}

fn harness() -> Harness {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open_dir(dir.path()).expect("db");
    let settings = Settings {
        token: TOKEN.into(),
        join_token: String::new(),
        heartbeat_timeout: Duration::from_secs(3600),
        max_body_bytes: LIMIT,
    };
    let runtime = Runtime::new(
        Arc::new(MemoryStore::new()),
        None,
        JobsConfig::new("agent-token-0123456789", b"file-key-0123456789".to_vec()),
    );
    let state = ControlState::with_jobs(
        db,
        Arc::new(ManualClock::new(1_700_000_000_000)),
        settings,
        Some(Arc::new(runtime)),
    );
    let h = Harness {
        app: router(state),
        rt,
        _dir: dir,
    };
    let (status, _) = h.call(
        Method::PUT,
        "/v1/dags",
        Some("application/yaml"),
        DAG.as_bytes().to_vec(),
    );
    assert_eq!(status, StatusCode::CREATED);
    h
}

impl Harness {
    fn call(
        &self,
        method: Method,
        uri: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let req = req.body(Body::from(body)).expect("request");
        self.rt.block_on(async {
            let resp = self.app.clone().oneshot(req).await.expect("infallible");
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .expect("body");
            (status, bytes.to_vec())
        })
    }
}

/// Never a 5xx; a refusal is a JSON object with a non-empty `error`.
fn sane(status: StatusCode, body: &[u8]) -> Result<(), TestCaseError> {
    prop_assert!(
        !status.is_server_error(),
        "{} {}",
        status,
        String::from_utf8_lossy(body)
    );
    if status.is_client_error() {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| TestCaseError::fail(format!("{status}: not JSON ({e}): {body:?}")))?;
        prop_assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}: {}",
            status,
            v
        );
    }
    Ok(())
}

fn run<S: Strategy>(
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<(), String> {
    // `Config::default()` reads PROPTEST_CASES. A failure prints its input; nothing is saved.
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&strategy, test).map_err(|e| e.to_string())
}

const CONTENT_TYPES: &[Option<&str>] = &[
    None,
    Some("application/json"),
    Some("application/yaml"),
    Some("text/plain; charset=utf-8"),
    Some("application/x-www-form-urlencoded"),
    Some("multipart/form-data; boundary=x"),
    Some("application/octet-stream"),
    Some("APPLICATION/JSON; charset=\"latin-1\""),
];

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        Just(json!("ml-pipeline")),
        Just(json!("../../etc/passwd")),
        Just(json!("x'); DROP TABLE jobs; --")),
        Just(json!("aGVsbG8=")),
        Just(json!("sonic")),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A job body made of the fields the API knows, with values good, bad and arbitrary.
fn submit_body() -> impl Strategy<Value = Value> {
    let dag = prop_oneof![
        6 => Just(json!("ml-pipeline")),
        1 => Just(json!("no-such-dag")),
        1 => json_value()
    ];
    let trees = prop_oneof![
        4 => (1u64..20).prop_map(Value::from),
        1 => json_value(),
        1 => Just(json!("{{ params.trees }}")),
        1 => Just(json!(1e300)),
    ];
    let policy = prop_oneof![
        2 => Just(json!("sonic")),
        2 => Just(json!("remote")),
        2 => Just(json!("direct")),
        2 => Just(json!("local")),
        1 => json_value(),
    ];
    let input = (
        proptest::option::of(prop_oneof![Just(json!("aGVsbG8=")), json_value()]),
        proptest::option::of(prop_oneof![Just(json!("jobs/x/input/in")), json_value()]),
        proptest::option::of(prop_oneof![Just(json!("data.bin")), json_value()]),
    )
        .prop_map(|(b, k, n)| {
            let mut m = serde_json::Map::new();
            for (key, v) in [("base64", b), ("key", k), ("name", n)] {
                if let Some(v) = v {
                    m.insert(key.into(), v);
                }
            }
            Value::Object(m)
        });
    (
        proptest::option::of(dag),
        proptest::option::of(trees),
        proptest::option::of(policy),
        proptest::option::of(input),
        proptest::option::weighted(0.2, (".{0,10}", json_value())),
    )
        .prop_map(|(dag, trees, policy, input, extra)| {
            let mut m = serde_json::Map::new();
            if let Some(d) = dag {
                m.insert("dag".into(), d);
            }
            if let Some(t) = trees {
                m.insert("params".into(), json!({ "trees": t }));
            }
            if let Some(p) = policy {
                m.insert("policy".into(), p);
            }
            if let Some(i) = input {
                m.insert("input".into(), i);
            }
            if let Some((k, v)) = extra {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

#[test]
fn job_submissions_of_arbitrary_bytes() {
    let h = harness();
    run(
        (
            proptest::collection::vec(any::<u8>(), 0..512),
            any::<Index>(),
        ),
        |(body, ct)| {
            let ct = CONTENT_TYPES[ct.index(CONTENT_TYPES.len())];
            let (status, resp) = h.call(Method::POST, "/v1/jobs", ct, body);
            sane(status, &resp)
        },
    )
    .unwrap();
}

#[test]
fn job_submissions_of_structured_json() {
    let h = harness();
    run(submit_body(), |body| {
        let (status, resp) = h.call(
            Method::POST,
            "/v1/jobs",
            Some("application/json"),
            body.to_string().into_bytes(),
        );
        sane(status, &resp)?;
        if status == StatusCode::ACCEPTED {
            prop_assert_eq!(&body["dag"], &json!("ml-pipeline"), "accepted {}", body);
            let v: Value = serde_json::from_slice(&resp).expect("json");
            prop_assert!(v["job_id"].as_str().is_some_and(|id| id.starts_with("j-")));
        }
        Ok(())
    })
    .unwrap();
}

/// One edit of the DAG file's bytes.
fn mutated_dag() -> impl Strategy<Value = Vec<u8>> {
    const TOKENS: &[&str] = &[
        "&a ",
        "*a",
        "- ",
        ": ",
        "\n",
        "\n  ",
        "[",
        "]",
        "{",
        "}",
        "~",
        "-1",
        "1e999",
        "\"",
        "'",
        "\t",
        "# ",
        "!!str ",
        "---\n",
        "\u{202e}",
        "\u{0}",
        "../",
        "kind: gather",
        "instances: 0",
    ];
    proptest::collection::vec(
        prop_oneof![
            (any::<Index>(), 1usize..12).prop_map(|(i, n)| (0u8, i, n, 0u8)),
            (any::<Index>(), 0usize..TOKENS.len()).prop_map(|(i, t)| (1u8, i, t, 0u8)),
            (any::<Index>(), any::<u8>()).prop_map(|(i, b)| (2u8, i, 0, b)),
        ],
        1..6,
    )
    .prop_map(|edits| {
        let mut b = DAG.as_bytes().to_vec();
        for (kind, at, n, byte) in edits {
            match kind {
                0 if !b.is_empty() => {
                    let s = at.index(b.len());
                    let e = (s + n).min(b.len());
                    b.drain(s..e);
                }
                1 => {
                    let p = at.index(b.len() + 1);
                    b.splice(p..p, TOKENS[n].bytes());
                }
                2 if !b.is_empty() => {
                    let k = at.index(b.len());
                    b[k] = byte;
                }
                _ => {}
            }
        }
        b
    })
}

#[test]
fn dag_files_are_accepted_exactly_when_the_parser_accepts_them() {
    let h = harness();
    run(mutated_dag(), |body| {
        let (status, resp) = h.call(
            Method::PUT,
            "/v1/dags",
            Some("application/yaml"),
            body.clone(),
        );
        sane(status, &resp)?;
        let parsed = std::str::from_utf8(&body)
            .ok()
            .map(|t| Dag::from_yaml("request body", t));
        match parsed {
            Some(Ok(_)) => prop_assert!(status.is_success(), "{}", status),
            Some(Err(e)) => {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST);
                let v: Value = serde_json::from_slice(&resp).expect("json");
                let shown = e.to_string();
                prop_assert_eq!(v["error"].as_str(), Some(shown.as_str()));
                prop_assert_eq!(v["field"].as_str(), Some(e.field.as_str()));
            }
            None => prop_assert_eq!(status, StatusCode::BAD_REQUEST),
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn registrations_and_heartbeats_of_arbitrary_json() {
    let h = harness();
    let capacity = (
        proptest::option::of(prop_oneof![Just(json!("a-1")), json_value()]),
        proptest::option::of(prop_oneof![
            Just(json!("http://127.0.0.1:7001")),
            json_value()
        ]),
        proptest::option::of(json_value()),
        proptest::option::of(prop_oneof![(1u64..64).prop_map(Value::from), json_value()]),
        any::<bool>(),
    );
    run(capacity, |(id, url, vcpus, memory, beat)| {
        // A valid registration with some fields replaced.
        let mut m = json!({
            "agent_id": "a-1", "url": "http://127.0.0.1:7001", "vcpus": 2, "memory_mb": 8192,
            "vm_type": "m5.large", "sandbox": "process", "running": 0,
            "bandwidth": {"samples": 0}, "network_mbps": 750.0,
        });
        for (k, v) in [
            ("agent_id", id),
            ("url", url),
            ("vcpus", vcpus),
            ("memory_mb", memory),
        ] {
            if let Some(v) = v {
                m[k] = v;
            }
        }
        let (uri, body) = if beat {
            let id = m["agent_id"].as_str().unwrap_or("a-1").to_owned();
            let path_id: String = id.bytes().map(|b| format!("%{b:02X}")).collect();
            (
                format!("/v1/agents/{path_id}/heartbeat"),
                json!({"agent_id": id, "running": m["vcpus"].clone(), "bandwidth": {"samples": 0}}),
            )
        } else {
            ("/v1/agents/register".to_owned(), m)
        };
        let (status, resp) = h.call(
            Method::POST,
            &uri,
            Some("application/json"),
            body.to_string().into_bytes(),
        );
        sane(status, &resp)
    })
    .unwrap();
}
