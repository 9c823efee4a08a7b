//! The control plane's HTTP API, driven through the router with `oneshot` (no sockets).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};
use sonic_api::agent::{BandwidthReport, Capacity, Heartbeat};
use sonic_control::{ControlState, Db, ManualClock, Settings, router, routes};
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789";
const TIMEOUT: Duration = Duration::from_secs(10);
const LIMIT: usize = 1024 * 1024;

/// The example of interfaces.md section 1.
const EXAMPLE: &str = r#"name: ml-pipeline                  # [a-z0-9-], unique per control plane
description: PCA, parallel tree training, combine
params:                            # user parameters, overridable per job
  trees: 6
functions:
  - name: pca
    image: sonic-lambdas:latest    # image for the Docker sandbox
    command: [ml-pipeline, pca]    # executable and arguments; the process sandbox runs the same command
    timeout: 300s
  - name: train
    image: sonic-lambdas:latest
    command: [ml-pipeline, train]
    instances: "{{ params.trees }}"   # a number, a parameter, or omitted: then it follows the edge
  - name: combine
    image: sonic-lambdas:latest
    command: [ml-pipeline, combine]
edges:
  - { from: pca, to: train, kind: broadcast }   # one | scatter | broadcast | gather | shuffle
  - { from: train, to: combine, kind: gather }
bounds:                            # optional, per job
  max_latency: 120s
  max_cost_usd: 0.05
"#;

struct Cp {
    app: Router,
    clock: Arc<ManualClock>,
    state: Arc<ControlState>,
}

fn open(dir: &Path, clock: Arc<ManualClock>) -> Cp {
    let db = Db::open_dir(dir).expect("open db");
    let settings = Settings {
        token: TOKEN.into(),
        join_token: String::new(),
        heartbeat_timeout: TIMEOUT,
        max_body_bytes: LIMIT,
    };
    let state = ControlState::new(db, clock.clone(), settings);
    Cp {
        app: router(state.clone()),
        clock,
        state,
    }
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Cp {
    async fn call(
        &self,
        method: Method,
        uri: &str,
        auth: Option<&str>,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body.into()).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body")
            .to_vec();
        Answer {
            status,
            content_type,
            body,
        }
    }

    async fn get(&self, uri: &str) -> Answer {
        self.call(Method::GET, uri, Some(&bearer()), None, Body::empty())
            .await
    }

    async fn apply(&self, method: Method, uri: &str, yaml: &str) -> Answer {
        self.call(
            method,
            uri,
            Some(&bearer()),
            Some("application/yaml"),
            yaml.to_owned(),
        )
        .await
    }

    async fn post_json(&self, uri: &str, body: &Value) -> Answer {
        self.call(
            Method::POST,
            uri,
            Some(&bearer()),
            Some("application/json"),
            body.to_string(),
        )
        .await
    }

    async fn register(&self, c: &Capacity) -> Answer {
        self.post_json(
            "/v1/agents/register",
            &serde_json::to_value(c).expect("json"),
        )
        .await
    }

    async fn beat(&self, id: &str, running: u32) -> Answer {
        let beat = Heartbeat {
            agent_id: id.into(),
            running,
            bandwidth: BandwidthReport::default(),
        };
        self.post_json(
            &format!("/v1/agents/{id}/heartbeat"),
            &serde_json::to_value(beat).expect("json"),
        )
        .await
    }

    /// `agent id -> alive`, from `GET /v1/agents`.
    async fn liveness(&self) -> Vec<(String, bool)> {
        let a = self.get("/v1/agents").await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let v = a.json();
        assert_eq!(v["heartbeat_timeout_ms"], 10_000);
        v["agents"]
            .as_array()
            .expect("agents")
            .iter()
            .map(|a| {
                (
                    a["agent_id"].as_str().expect("id").to_owned(),
                    a["alive"].as_bool().expect("alive"),
                )
            })
            .collect()
    }
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

fn capacity(id: &str) -> Capacity {
    Capacity {
        agent_id: id.into(),
        url: format!("http://127.0.0.1:7{:03}", id.len()),
        vm_type: "m5.large".into(),
        vcpus: 2,
        memory_mb: 8192,
        network_mbps: Some(750.0),
        sandbox: "process".into(),
        running: 0,
        bandwidth: BandwidthReport::default(),
    }
}

fn setup() -> (tempfile::TempDir, Cp) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = open(dir.path(), Arc::new(ManualClock::new(1_700_000_000_000)));
    (dir, cp)
}

/// Every route with its placeholders filled in.
fn concrete(path: &str) -> String {
    path.replace("{name}", "ml-pipeline").replace("{id}", "a-1")
}

#[tokio::test]
async fn apply_list_get_delete() {
    let (_dir, cp) = setup();
    let a = cp.apply(Method::PUT, "/v1/dags", EXAMPLE).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let s = a.json();
    assert_eq!(s["name"], "ml-pipeline");
    assert_eq!(s["functions"], json!(["pca", "train", "combine"]));
    assert_eq!(
        (s["edges"].clone(), s["revision"].clone()),
        (json!(2), json!(1))
    );
    assert_eq!(s["description"], "PCA, parallel tree training, combine");

    // The same text again changes nothing; a different one is a new revision.
    let a = cp.apply(Method::POST, "/v1/dags", EXAMPLE).await;
    assert_eq!(
        (a.status, a.json()["revision"].clone()),
        (StatusCode::OK, json!(1))
    );
    let changed = EXAMPLE.replace("trees: 6", "trees: 8");
    cp.clock.advance(Duration::from_secs(1));
    let a = cp.apply(Method::POST, "/v1/dags", &changed).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let s = a.json();
    assert_eq!(s["revision"], 2);
    assert_eq!(
        s["updated_at_ms"].as_i64().expect("updated")
            - s["created_at_ms"].as_i64().expect("created"),
        1_000
    );

    let list = cp.get("/v1/dags").await;
    assert_eq!(list.status, StatusCode::OK);
    let names: Vec<Value> = list.json()["dags"]
        .as_array()
        .expect("dags")
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, [json!("ml-pipeline")]);

    let got = cp.get("/v1/dags/ml-pipeline").await;
    assert_eq!(got.status, StatusCode::OK);
    let d = got.json();
    assert_eq!(
        d["yaml"], changed,
        "the file is kept verbatim, comments included"
    );
    assert_eq!(d["parsed"]["params"]["trees"], 8);
    assert_eq!(
        d["parsed"]["functions"][1]["instances"],
        json!({"param": "trees"})
    );
    assert_eq!(d["parsed"]["functions"][0]["timeout_s"], 300.0);
    assert_eq!(d["parsed"]["bounds"]["max_cost_usd"], 0.05);
    assert_eq!(d["name"], "ml-pipeline", "the summary is flattened in");

    let del = cp
        .call(
            Method::DELETE,
            "/v1/dags/ml-pipeline",
            Some(&bearer()),
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    assert_eq!(
        cp.get("/v1/dags/ml-pipeline").await.status,
        StatusCode::NOT_FOUND
    );
    let again = cp
        .call(
            Method::DELETE,
            "/v1/dags/ml-pipeline",
            Some(&bearer()),
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(again.json()["error"], "no dag named ml-pipeline");
    assert_eq!(cp.get("/v1/dags").await.json()["dags"], json!([]));
}

#[tokio::test]
async fn a_bad_dag_is_refused_with_where_and_why_and_changes_nothing() {
    let (_dir, cp) = setup();
    assert_eq!(
        cp.apply(Method::PUT, "/v1/dags", EXAMPLE).await.status,
        StatusCode::CREATED
    );
    let typo = EXAMPLE.replace("    timeout: 300s", "    timeout: 300s\n    memroy: 3000");
    let unknown_edge = EXAMPLE.replace("{ from: train, to: combine", "{ from: train, to: combin");
    let bad_duration = EXAMPLE.replace("timeout: 300s", "timeout: 5 parsecs");
    let cases: [(&str, &str, &str); 3] = [
        (typo.as_str(), "memroy", "/v1/dags?file=ml.yaml"),
        (
            unknown_edge.as_str(),
            "edges[1].to",
            "/v1/dags?file=ml.yaml",
        ),
        (bad_duration.as_str(), "functions[0].timeout", "/v1/dags"),
    ];
    for (yaml, field, uri) in cases {
        let a = cp.apply(Method::PUT, uri, yaml).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
        let e = a.json();
        let file = if uri.contains("file=") {
            "ml.yaml"
        } else {
            "request body"
        };
        assert_eq!(e["file"], file, "{e}");
        assert!(e["line"].as_u64().is_some_and(|l| l > 1), "a line: {e}");
        assert!(e["column"].as_u64().is_some(), "a column: {e}");
        assert_eq!(e["field"], field, "{e}");
        let msg = e["error"].as_str().expect("error");
        assert!(msg.starts_with(&format!("{file}:{}:", e["line"])), "{msg}");
        assert!(msg.contains(field), "{msg}");
    }
    let broken = cp.apply(Method::PUT, "/v1/dags", "name: [unclosed\n").await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST);
    assert!(broken.json()["line"].is_u64(), "{}", broken.text());

    let d = cp.get("/v1/dags/ml-pipeline").await.json();
    assert_eq!(
        (d["yaml"].as_str(), d["revision"].as_u64()),
        (Some(EXAMPLE), Some(1))
    );
    assert_eq!(
        cp.get("/v1/dags").await.json()["dags"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

#[tokio::test]
async fn every_route_but_health_refuses_a_missing_or_wrong_token() {
    let (_dir, cp) = setup();
    let wrong = [
        None,
        Some("Bearer wrong-token-0123456789".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
        Some("Bearer ".to_owned()),
    ];
    let table = routes();
    assert!(table.len() >= 11);
    for r in &table {
        let uri = concrete(r.path);
        for auth in &wrong {
            let a = cp
                .call(
                    r.method.clone(),
                    &uri,
                    auth.as_deref(),
                    Some("application/json"),
                    "{}",
                )
                .await;
            if r.guard.needs_token() {
                assert_eq!(
                    a.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri} with {auth:?}",
                    r.method
                );
                assert_eq!(a.json(), json!({"error": "missing or wrong token"}));
            } else {
                assert_eq!(a.status, StatusCode::OK, "{uri} is public");
            }
        }
        let ok = cp
            .call(
                r.method.clone(),
                &uri,
                Some(&bearer()),
                Some("application/json"),
                "{}",
            )
            .await;
        assert_ne!(
            ok.status,
            StatusCode::UNAUTHORIZED,
            "{} {uri} with the token",
            r.method
        );
    }
    let h = cp
        .call(Method::GET, "/v1/health", None, None, Body::empty())
        .await
        .json();
    assert_eq!(h["status"], "ok");
}

#[tokio::test]
async fn agents_register_beat_and_die_by_the_clock() {
    let (_dir, cp) = setup();
    for id in ["a-1", "a-2"] {
        let a = cp.register(&capacity(id)).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let info = a.json();
        assert_eq!(
            (info["agent_id"].as_str(), info["alive"].as_bool()),
            (Some(id), Some(true))
        );
    }
    assert_eq!(
        cp.liveness().await,
        [("a-1".to_owned(), true), ("a-2".to_owned(), true)]
    );

    cp.clock.advance(Duration::from_secs(6));
    let b = cp.beat("a-1", 3).await;
    assert_eq!(b.status, StatusCode::OK, "{}", b.text());
    assert_eq!(b.json()["capacity"]["running"], 3);
    cp.clock.advance(Duration::from_secs(4));
    // a-2 was last heard exactly 10 s ago: still within the timeout.
    assert_eq!(
        cp.liveness().await,
        [("a-1".to_owned(), true), ("a-2".to_owned(), true)]
    );
    cp.clock.advance(Duration::from_millis(1));
    assert_eq!(
        cp.liveness().await,
        [("a-1".to_owned(), true), ("a-2".to_owned(), false)]
    );
    let listed = cp.get("/v1/agents").await.json();
    assert_eq!(listed["agents"][0]["capacity"]["running"], 3);
    assert_eq!(listed["agents"][1]["heartbeat_age_ms"], 10_001);

    // A heartbeat brings a silent agent back.
    assert_eq!(cp.beat("a-2", 0).await.status, StatusCode::OK);
    assert_eq!(
        cp.liveness().await,
        [("a-1".to_owned(), true), ("a-2".to_owned(), true)]
    );

    // Unknown agents are told to register; a body for another agent is refused.
    let ghost = cp.beat("ghost", 0).await;
    assert_eq!(ghost.status, StatusCode::NOT_FOUND);
    assert!(
        ghost.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("register"))
    );
    let mismatched = cp
        .post_json(
            "/v1/agents/a-1/heartbeat",
            &json!({"agent_id": "a-2", "running": 0, "bandwidth": {"samples": 0}}),
        )
        .await;
    assert_eq!(mismatched.status, StatusCode::BAD_REQUEST);

    // Re-registration (a restarted agent) replaces the capacity.
    let mut bigger = capacity("a-1");
    bigger.vm_type = "m5.xlarge".into();
    bigger.vcpus = 4;
    assert_eq!(cp.register(&bigger).await.status, StatusCode::OK);
    let listed = cp.get("/v1/agents").await.json();
    assert_eq!(listed["agents"].as_array().map(Vec::len), Some(2));
    assert_eq!(listed["agents"][0]["vm_type"], "m5.xlarge");
    assert_eq!(listed["agents"][0]["capacity"]["vcpus"], 4);
}

#[tokio::test]
async fn registration_is_validated() {
    let (_dir, cp) = setup();
    let mut cases: Vec<(Capacity, &str)> = Vec::new();
    let mut c = capacity("a-1");
    c.agent_id = "has space".into();
    cases.push((c, "agent_id"));
    let mut c = capacity("a-1");
    c.agent_id = String::new();
    cases.push((c, "agent_id"));
    let mut c = capacity("a-1");
    c.url = "not a url".into();
    cases.push((c, "url"));
    let mut c = capacity("a-1");
    c.url = "file:///etc/passwd".into();
    cases.push((c, "url"));
    let mut c = capacity("a-1");
    c.vm_type = "m5.large; rm -rf /".into();
    cases.push((c, "vm_type"));
    let mut c = capacity("a-1");
    c.vcpus = 0;
    cases.push((c, "vcpus"));
    for (c, word) in cases {
        let a = cp.register(&c).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{c:?}");
        let e = a.json()["error"].as_str().expect("error").to_owned();
        assert!(e.contains(word), "{e:?} should name {word}");
    }
    assert_eq!(cp.liveness().await, []);

    // Wrong JSON: a clear 400, never a 422 or a 500.
    let a = cp
        .call(
            Method::POST,
            "/v1/agents/register",
            Some(&bearer()),
            Some("application/json"),
            "{not json",
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.json()["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("invalid JSON body"))
    );
    let missing = cp
        .post_json("/v1/agents/register", &json!({"agent_id": "a-1"}))
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(
        missing.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("missing field")),
        "{}",
        missing.text()
    );
}

#[tokio::test]
async fn restart_keeps_dags_and_agents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    {
        let cp = open(dir.path(), clock.clone());
        assert_eq!(
            cp.apply(Method::PUT, "/v1/dags", EXAMPLE).await.status,
            StatusCode::CREATED
        );
        assert_eq!(cp.register(&capacity("a-1")).await.status, StatusCode::OK);
        assert_eq!(cp.beat("a-1", 2).await.status, StatusCode::OK);
        // Dropping the router and the state closes the database.
        drop(cp);
    }
    clock.advance(Duration::from_secs(3));
    let cp = open(dir.path(), clock);
    let d = cp.get("/v1/dags/ml-pipeline").await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(d.json()["yaml"], EXAMPLE);
    let agents = cp.get("/v1/agents").await.json();
    assert_eq!(agents["agents"][0]["agent_id"], "a-1");
    assert_eq!(agents["agents"][0]["capacity"]["running"], 2);
    assert_eq!(agents["agents"][0]["heartbeat_age_ms"], 3_000);
    assert_eq!(agents["agents"][0]["alive"], true);
    // A heartbeat after the restart finds the agent without a new registration.
    assert_eq!(cp.beat("a-1", 0).await.status, StatusCode::OK);
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused() {
    let (_dir, cp) = setup();
    let huge = format!("{EXAMPLE}# {}\n", "x".repeat(LIMIT + 1));
    let a = cp.apply(Method::PUT, "/v1/dags", &huge).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        a.json()["error"],
        format!("request body over the {LIMIT}-byte limit")
    );
    let big_json = json!({"agent_id": "a-1", "pad": "y".repeat(LIMIT)});
    assert_eq!(
        cp.post_json("/v1/agents/register", &big_json).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // A body streamed without a length is cut off at the limit too.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![b'#'; 128 * 1024])).collect();
    let stream = Body::from_stream(futures::stream::iter(chunks));
    let s = cp
        .call(
            Method::PUT,
            "/v1/dags",
            Some(&bearer()),
            Some("text/plain"),
            stream,
        )
        .await;
    assert_eq!(s.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Without the token the body is never read: 401, not 413.
    let anon = cp
        .call(
            Method::PUT,
            "/v1/dags",
            None,
            Some("application/yaml"),
            huge,
        )
        .await;
    assert_eq!(anon.status, StatusCode::UNAUTHORIZED);
    assert_eq!(cp.get("/v1/dags").await.json()["dags"], json!([]));
}

#[tokio::test]
async fn sql_metacharacters_are_refused_or_stored_verbatim() {
    let (_dir, cp) = setup();
    let evil = "x'); DROP TABLE dags; --";
    // As a DAG name: the parser refuses it.
    let named = EXAMPLE.replace("name: ml-pipeline ", &format!("name: \"{evil}\" "));
    let a = cp.apply(Method::PUT, "/v1/dags", &named).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());
    assert_eq!(a.json()["field"], "name");
    // As a description: stored and given back byte for byte.
    let described = EXAMPLE.replace(
        "description: PCA, parallel tree training, combine",
        &format!("description: \"{evil}\""),
    );
    let a = cp.apply(Method::PUT, "/v1/dags", &described).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    assert_eq!(a.json()["description"], evil);
    // In a path: refused before any query.
    let encoded = "x%27%29%3B%20DROP%20TABLE%20dags%3B%20--";
    assert_eq!(
        cp.get(&format!("/v1/dags/{encoded}")).await.status,
        StatusCode::BAD_REQUEST
    );
    let del = cp
        .call(
            Method::DELETE,
            &format!("/v1/dags/{encoded}"),
            Some(&bearer()),
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(del.status, StatusCode::BAD_REQUEST);
    // As an agent id (body or path): refused. As a free-text field: stored verbatim.
    let mut c = capacity("a-1");
    c.agent_id = evil.into();
    assert_eq!(cp.register(&c).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        cp.post_json(
            &format!("/v1/agents/{encoded}/heartbeat"),
            &json!({"agent_id": evil, "running": 0, "bandwidth": {"samples": 0}})
        )
        .await
        .status,
        StatusCode::BAD_REQUEST
    );
    let mut c = capacity("a-1");
    c.url = format!("http://127.0.0.1:7000/{}", "x%27%29%3B--");
    assert_eq!(cp.register(&c).await.status, StatusCode::OK);
    // Everything is still there.
    let dags = cp.get("/v1/dags").await.json();
    assert_eq!(dags["dags"][0]["description"], evil);
    let agents = cp.get("/v1/agents").await.json();
    assert_eq!(agents["agents"][0]["url"], c.url);
}

#[tokio::test]
async fn database_errors_do_not_leak() {
    let (dir, cp) = setup();
    assert_eq!(cp.register(&capacity("a-1")).await.status, StatusCode::OK);
    // Break the schema behind the server's back.
    let other = rusqlite::Connection::open(dir.path().join(sonic_control::store::DB_FILE))
        .expect("second connection");
    other.execute_batch("DROP TABLE agents").expect("drop");
    drop(other);
    let a = cp.get("/v1/agents").await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(a.json(), json!({"error": "internal error"}));
    assert!(!a.text().contains("agents"), "no table name leaks");
}

#[tokio::test]
async fn unknown_routes_methods_and_media_types() {
    let (_dir, cp) = setup();
    let nf = cp.get("/v1/nope").await;
    assert_eq!(nf.status, StatusCode::NOT_FOUND);
    assert_eq!(nf.json()["error"], "no such route");
    let na = cp
        .call(
            Method::PATCH,
            "/v1/dags",
            Some(&bearer()),
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(na.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(na.json()["error"].is_string());
    let bin = cp
        .call(
            Method::PUT,
            "/v1/dags",
            Some(&bearer()),
            Some("application/octet-stream"),
            EXAMPLE,
        )
        .await;
    assert_eq!(bin.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let not_utf8 = cp
        .call(
            Method::PUT,
            "/v1/dags",
            Some(&bearer()),
            Some("text/plain"),
            vec![0xff, 0xfe, 0x00],
        )
        .await;
    assert_eq!(not_utf8.status, StatusCode::BAD_REQUEST);
    // A text body without a content type is taken as the file.
    let plain = cp
        .call(Method::PUT, "/v1/dags", Some(&bearer()), None, EXAMPLE)
        .await;
    assert_eq!(plain.status, StatusCode::CREATED);
}

#[tokio::test]
async fn metrics_count_requests_and_registry_sizes() {
    let (_dir, cp) = setup();
    assert_eq!(
        cp.apply(Method::PUT, "/v1/dags", EXAMPLE).await.status,
        StatusCode::CREATED
    );
    assert_eq!(cp.register(&capacity("a-1")).await.status, StatusCode::OK);
    assert_eq!(cp.register(&capacity("a-22")).await.status, StatusCode::OK);
    cp.clock.advance(Duration::from_secs(8));
    assert_eq!(cp.beat("a-1", 0).await.status, StatusCode::OK);
    cp.clock.advance(Duration::from_secs(3));
    let anon = cp
        .call(
            Method::GET,
            "/v1/dags/ml-pipeline",
            None,
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(anon.status, StatusCode::UNAUTHORIZED);
    cp.get("/v1/unknown/thing").await;

    let m = cp.get("/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    assert!(
        m.content_type.starts_with("text/plain"),
        "{}",
        m.content_type
    );
    let text = m.text();
    for line in [
        "sonic_http_requests_total{method=\"PUT\",route=\"/v1/dags\",status=\"201\"} 1",
        "sonic_http_requests_total{method=\"POST\",route=\"/v1/agents/register\",status=\"200\"} 2",
        "sonic_http_requests_total{method=\"GET\",route=\"/v1/dags/{name}\",status=\"401\"} 1",
        "sonic_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1",
        // Every answered request is timed, by method and route template.
        "sonic_http_request_duration_seconds_count{method=\"PUT\",route=\"/v1/dags\"} 1",
        "sonic_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/agents/register\"} 2",
        "sonic_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/agents/register\",le=\"+Inf\"} 2",
        "sonic_http_request_duration_seconds_count{method=\"GET\",route=\"unmatched\"} 1",
        "sonic_dags 1",
        "sonic_agents{state=\"alive\"} 1",
        "sonic_agents{state=\"dead\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(
        !text.contains("/v1/unknown/thing"),
        "raw paths never become labels"
    );
    assert_eq!(
        cp.state
            .metrics
            .requests("POST", "/v1/agents/{id}/heartbeat", 200),
        1
    );
}

#[tokio::test]
async fn openapi_is_served_and_names_every_route() {
    let (_dir, cp) = setup();
    let a = cp.get("/v1/openapi.json").await;
    assert_eq!(a.status, StatusCode::OK);
    let doc = a.json();
    assert_eq!(doc["openapi"], "3.1.0");
    for r in routes() {
        let method = r.method.as_str().to_ascii_lowercase();
        let path = sonic_control::http::openapi::path_of(r.path);
        assert!(
            doc["paths"][path.as_str()][&method].is_object(),
            "{method} {}",
            r.path
        );
    }
}

#[tokio::test]
async fn models_plans_logs_and_events_before_any_job() {
    let (_dir, cp) = setup();
    assert_eq!(cp.get("/v1/dags/ml-pipeline/models").await.status, 404);
    let a = cp.apply(Method::PUT, "/v1/dags", EXAMPLE).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    // Every parameter has a model, none fitted yet.
    let a = cp.get("/v1/dags/ml-pipeline/models").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let m: sonic_api::control::DagModelsView = serde_json::from_value(a.json()).expect("view");
    assert_eq!(
        (m.dag.as_str(), m.converged, m.jobs),
        ("ml-pipeline", false, 0)
    );
    assert_eq!(m.max_mape, 0.15, "the default rule without a job runtime");
    // Per function memory, cold, hot, fanout, per-instance overhead (of its cold and of its
    // hot batches), cold start and parallel share; per edge bytes.
    assert_eq!(m.models.len(), 3 * 8 + 2, "{m:?}");
    assert!(m.models.iter().any(|x| x.parameter == "train.parallel"));
    assert!(m.models.iter().any(|x| x.parameter == "pca.overhead_hot_s"));
    assert!(
        m.models
            .iter()
            .all(|x| x.equation.is_none() && !x.converged)
    );
    assert!(m.models.iter().any(|x| x.parameter == "pca->train.bytes"));
    assert!(m.samples.is_empty());
    // Nothing to plan with: 409, and the error says what to do.
    let a = cp
        .get("/v1/dags/ml-pipeline/plan?input_bytes=1000000")
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.text());
    assert!(a.json()["error"].as_str().unwrap_or("").contains("profile"));
    for (uri, status) in [
        ("/v1/dags/ml-pipeline/plan", StatusCode::BAD_REQUEST),
        (
            "/v1/dags/ml-pipeline/plan?input_bytes=-1",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/dags/ml-pipeline/plan?input_bytes=1&policy=fast",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/dags/ml-pipeline/plan?input_bytes=1&policy=oracle",
            StatusCode::BAD_REQUEST,
        ),
        ("/v1/dags/nope/plan?input_bytes=1", StatusCode::NOT_FOUND),
        ("/v1/dags/Bad_Name/models", StatusCode::BAD_REQUEST),
        ("/v1/jobs/j-0000/logs", StatusCode::NOT_FOUND),
        ("/v1/jobs/j-0000/events", StatusCode::NOT_FOUND),
        ("/v1/jobs/nope/events", StatusCode::BAD_REQUEST),
        (
            "/v1/jobs/j-0000/logs?function=Bad%20F",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let a = cp.get(uri).await;
        assert_eq!(a.status, status, "{uri}: {}", a.text());
        assert!(a.json()["error"].is_string(), "{uri}");
    }
}
