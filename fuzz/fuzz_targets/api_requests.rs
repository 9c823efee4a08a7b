//! The control plane's request decoding, through its router in-process (SQLite, an in-memory
//! store, no agents): the first byte picks the route and content type, the rest is the body.
//! Never a panic and never a 5xx; every refusal is JSON with an `error`.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, header};
use libfuzzer_sys::fuzz_target;
use sonic_control::{ControlState, Db, JobsConfig, ManualClock, Runtime, Settings, router};
use sonic_storage::memory::MemoryStore;
use tower::ServiceExt;

const TOKEN: &str = "fuzz-token-0123456789";
const DAG: &str = "name: ml-pipeline\nparams:\n  trees: 3\nfunctions:\n  - name: pca\n    image: sonic-lambdas:latest\n    command: [ml-pipeline, pca]\n  - name: train\n    image: sonic-lambdas:latest\n    command: [ml-pipeline, train]\n    instances: \"{{ params.trees }}\"\nedges:\n  - { from: pca, to: train, kind: broadcast }\n";

struct Harness {
    rt: tokio::runtime::Runtime,
    app: Router,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("db");
        let settings = Settings {
            token: TOKEN.into(),
            heartbeat_timeout: Duration::from_secs(3600),
            max_body_bytes: 64 * 1024,
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
            DAG.into(),
        );
        assert_eq!(status, 201);
        h
    })
}

impl Harness {
    fn call(&self, method: Method, uri: &str, ct: Option<&str>, body: Vec<u8>) -> (u16, Vec<u8>) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        if let Some(ct) = ct {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let req = req.body(Body::from(body)).expect("request");
        self.rt.block_on(async {
            let resp = self.app.clone().oneshot(req).await.expect("infallible");
            let status = resp.status().as_u16();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .expect("body");
            (status, bytes.to_vec())
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let h = harness();
    let (method, uri, ct) = match pick % 6 {
        0 | 1 => (Method::POST, "/v1/jobs", Some("application/json")),
        2 => (
            Method::POST,
            "/v1/agents/register",
            Some("application/json"),
        ),
        3 => (
            Method::POST,
            "/v1/agents/a-1/heartbeat",
            Some("application/json"),
        ),
        4 => (Method::PUT, "/v1/dags", Some("application/yaml")),
        _ => (Method::POST, "/v1/jobs", None),
    };
    let (status, bytes) = h.call(method, uri, ct, body.to_vec());
    assert!(
        status < 500,
        "{uri}: {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    if status >= 400 {
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON error body");
        assert!(v.get("error").is_some(), "{uri}: {v}");
    }
});
