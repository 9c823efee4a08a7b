//! Malformed and hostile requests against the control plane, through the router in-process: each
//! gets a 4xx with a JSON `{"error": ...}` that says what is wrong, and changes nothing (the DAG,
//! job and agent lists, every database row and every stored object are the same afterwards).
//! Then every route of the table, without the token or with a wrong one, under hostile paths and
//! bodies: 401 before anything is read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};
use sonic_api::agent::{BandwidthReport, Capacity};
use sonic_control::{ControlState, Db, JobsConfig, ManualClock, Runtime, Settings, router, routes};
use sonic_storage::ObjectStore;
use sonic_storage::memory::MemoryStore;
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789";
const LIMIT: usize = 64 * 1024;

const DAG: &str = r#"name: ml-pipeline
description: PCA, parallel tree training, combine
params:
  trees: 6
functions:
  - { name: pca, image: "sonic-lambdas:latest", command: [ml-pipeline, pca], timeout: 300s }
  - { name: train, image: "sonic-lambdas:latest", command: [ml-pipeline, train], instances: "{{ params.trees }}" }
  - { name: combine, image: "sonic-lambdas:latest", command: [ml-pipeline, combine] }
edges:
  - { from: pca, to: train, kind: broadcast }
  - { from: train, to: combine, kind: gather }
"#;

const BILLION_LAUGHS: &str =
    include_str!("../../../../tests/fixtures/bad-dags/billion-laughs.yaml");

struct Cp {
    app: Router,
    dir: tempfile::TempDir,
    store: Arc<MemoryStore>,
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// A control plane that runs jobs (an in-memory store, no agents), with one DAG and one agent.
async fn setup() -> Cp {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open_dir(dir.path()).expect("open db");
    let settings = Settings {
        token: TOKEN.into(),
        join_token: String::new(),
        heartbeat_timeout: Duration::from_secs(3600),
        max_body_bytes: LIMIT,
    };
    let store = Arc::new(MemoryStore::new());
    let runtime = Runtime::new(
        store.clone(),
        None,
        JobsConfig::new("agent-token-0123456789", b"file-key-0123456789".to_vec()),
    );
    let state = ControlState::with_jobs(
        db,
        Arc::new(ManualClock::new(1_700_000_000_000)),
        settings,
        Some(Arc::new(runtime)),
    );
    let cp = Cp {
        app: router(state),
        dir,
        store,
    };
    let a = cp
        .call(
            Method::PUT,
            "/v1/dags",
            Some(&bearer()),
            Some("application/yaml"),
            DAG.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let agent = Capacity {
        agent_id: "a-1".into(),
        url: "http://127.0.0.1:7001".into(),
        vm_type: "m5.large".into(),
        vcpus: 2,
        memory_mb: 8192,
        network_mbps: Some(750.0),
        sandbox: "process".into(),
        running: 0,
        bandwidth: BandwidthReport::default(),
    };
    let a = cp
        .call(
            Method::POST,
            "/v1/agents/register",
            Some(&bearer()),
            Some("application/json"),
            serde_json::to_vec(&agent).expect("json"),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    cp
}

impl Cp {
    async fn call(
        &self,
        method: Method,
        uri: &str,
        auth: Option<&str>,
        content_type: Option<&str>,
        body: Vec<u8>,
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
            .oneshot(req.body(Body::from(body)).expect("request"))
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

    async fn list(&self, uri: &str) -> Value {
        let a = self
            .call(Method::GET, uri, Some(&bearer()), None, Vec::new())
            .await;
        assert_eq!(a.status, StatusCode::OK, "{uri}: {}", a.text());
        serde_json::from_slice(&a.body).expect("json")
    }

    /// Everything a request could have changed: what the API lists, every row of every table,
    /// every object in the store.
    async fn snapshot(&self) -> (Value, Vec<String>, Vec<String>) {
        let mut api = json!({
            "dags": self.list("/v1/dags").await["dags"],
            "dag": self.list("/v1/dags/ml-pipeline").await,
            "jobs": self.list("/v1/jobs").await["jobs"],
            "agents": self.list("/v1/agents").await["agents"],
        });
        // Ages follow the manual clock, which does not move here; keep the comparison exact.
        api["agents"][0]["heartbeat_age_ms"] = json!(null);
        let rows = dump_database(self.dir.path());
        let objects = self
            .store
            .list("")
            .await
            .expect("list the store")
            .into_iter()
            .map(|o| o.key)
            .collect();
        (api, rows, objects)
    }
}

/// Every row of every table, as text, sorted.
fn dump_database(dir: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open_with_flags(
        dir.join(sonic_control::store::DB_FILE),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the database read-only");
    let mut tables: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .expect("tables")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("names");
    tables.sort();
    let mut out = Vec::new();
    for t in tables {
        let mut stmt = db
            .prepare(&format!("SELECT * FROM \"{t}\""))
            .expect("select");
        let columns = stmt.column_count();
        let mut rows: Vec<String> = stmt
            .query_map([], |r| {
                let cells: Vec<String> = (0..columns)
                    .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i)))
                    .collect();
                Ok(format!("{t}: {}", cells.join(" | ")))
            })
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("row");
        rows.sort();
        out.extend(rows);
    }
    out
}

/// One malformed request and what it must get.
struct Case {
    what: &'static str,
    method: Method,
    uri: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: StatusCode,
    /// A fragment the `error` message must contain.
    says: &'static str,
}

fn case(
    what: &'static str,
    method: Method,
    uri: impl Into<String>,
    content_type: Option<&'static str>,
    body: impl Into<Vec<u8>>,
    status: StatusCode,
    says: &'static str,
) -> Case {
    Case {
        what,
        method,
        uri: uri.into(),
        content_type,
        body: body.into(),
        status,
        says,
    }
}

const JSON: Option<&str> = Some("application/json");
const YAML: Option<&str> = Some("application/yaml");
const BAD: StatusCode = StatusCode::BAD_REQUEST;

fn job(body: Value) -> Vec<u8> {
    body.to_string().into_bytes()
}

fn cases() -> Vec<Case> {
    use Method as M;
    let huge_yaml = format!("{DAG}# {}\n", "x".repeat(LIMIT));
    let huge_json = json!({"dag": "ml-pipeline", "pad": "y".repeat(LIMIT)}).to_string();
    let deep_json = format!(
        "{{\"dag\": \"ml-pipeline\", \"params\": {{\"a\": {}{}}}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let register = |patch: Value| {
        let mut c = json!({
            "agent_id": "a-2", "url": "http://127.0.0.1:7002", "vm_type": "m5.large",
            "vcpus": 2, "memory_mb": 8192, "network_mbps": 750.0, "sandbox": "process",
            "running": 0, "bandwidth": {"samples": 0}
        });
        for (k, v) in patch.as_object().expect("object") {
            c[k] = v.clone();
        }
        c.to_string().into_bytes()
    };
    let beat = |id: &str, running: Value| {
        json!({"agent_id": id, "running": running, "bandwidth": {"samples": 0}})
            .to_string()
            .into_bytes()
    };
    let ok_input = json!({"base64": "aGVsbG8="});
    vec![
        // ---- sizes
        case(
            "a DAG over the body limit",
            M::PUT,
            "/v1/dags",
            YAML,
            huge_yaml,
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit",
        ),
        case(
            "a job over the body limit",
            M::POST,
            "/v1/jobs",
            JSON,
            huge_json.clone(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit",
        ),
        case(
            "a registration over the body limit",
            M::POST,
            "/v1/agents/register",
            JSON,
            huge_json,
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit",
        ),
        case(
            "an alias bomb as the DAG",
            M::PUT,
            "/v1/dags",
            YAML,
            BILLION_LAUGHS,
            BAD,
            "budget breached",
        ),
        case(
            "JSON nested 10,000 deep",
            M::POST,
            "/v1/jobs",
            JSON,
            deep_json,
            BAD,
            "recursion limit",
        ),
        // ---- bodies that are not JSON, or not the right JSON
        case(
            "an empty job body",
            M::POST,
            "/v1/jobs",
            JSON,
            "",
            BAD,
            "invalid JSON body",
        ),
        case(
            "a job body that is not UTF-8",
            M::POST,
            "/v1/jobs",
            JSON,
            vec![0xff, 0xfe, b'{'],
            BAD,
            "invalid JSON body",
        ),
        case(
            "a form-encoded job",
            M::POST,
            "/v1/jobs",
            Some("application/x-www-form-urlencoded"),
            "dag=ml-pipeline",
            BAD,
            "invalid JSON body",
        ),
        case(
            "a job that is a list",
            M::POST,
            "/v1/jobs",
            JSON,
            "[\"ml-pipeline\"]",
            BAD,
            "expected an object",
        ),
        case(
            "a job without its dag",
            M::POST,
            "/v1/jobs",
            JSON,
            "{}",
            BAD,
            "missing field `dag`",
        ),
        case(
            "a dag that is a number",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": 5})),
            BAD,
            "invalid type",
        ),
        case(
            "a job with an unknown field",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "priority": 9})),
            BAD,
            "unknown field `priority`",
        ),
        case(
            "a job with its dag twice",
            M::POST,
            "/v1/jobs",
            JSON,
            "{\"dag\": \"ml-pipeline\", \"dag\": \"other\"}",
            BAD,
            "duplicate field",
        ),
        case(
            "params that are a list",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "params": [1, 2]})),
            BAD,
            "invalid type",
        ),
        case(
            "an unknown policy",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "policy": "fastest"})),
            BAD,
            "unknown policy",
        ),
        case(
            "SQL in the policy",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "policy": "sonic'; DROP TABLE jobs; --"})),
            BAD,
            "unknown policy",
        ),
        case(
            "a traversal as the dag",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "../../etc/passwd"})),
            BAD,
            "invalid dag name",
        ),
        case(
            "SQL as the dag",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "x'); DROP TABLE jobs; --"})),
            BAD,
            "invalid dag name",
        ),
        case(
            "a right-to-left override in the dag",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml\u{202e}pipeline"})),
            BAD,
            "invalid dag name",
        ),
        case(
            "a negative fanout",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "params": {"trees": -1}})),
            BAD,
            "params",
        ),
        case(
            "a fanout past u64",
            M::POST,
            "/v1/jobs",
            JSON,
            "{\"dag\": \"ml-pipeline\", \"params\": {\"trees\": 18446744073709551616}}",
            BAD,
            "params",
        ),
        case(
            "a fanout past f64",
            M::POST,
            "/v1/jobs",
            JSON,
            "{\"dag\": \"ml-pipeline\", \"params\": {\"trees\": 1e400}}",
            BAD,
            "invalid JSON body",
        ),
        case(
            "a fanout that is a word",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "params": {"trees": "many"}})),
            BAD,
            "params",
        ),
        case(
            "input that is not base64",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": {"base64": "!!not base64!!"}})),
            BAD,
            "input.base64",
        ),
        case(
            "an input name that climbs",
            M::POST,
            "/v1/jobs",
            JSON,
            job(
                json!({"dag": "ml-pipeline", "input": {"base64": "aGVsbG8=", "name": "../../etc/passwd"}}),
            ),
            BAD,
            "input.name",
        ),
        case(
            "an input name with NUL",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": {"base64": "aGVsbG8=", "name": "a\u{0}b"}})),
            BAD,
            "input.name",
        ),
        case(
            "an input name with a newline",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": {"base64": "aGVsbG8=", "name": "a\nb"}})),
            BAD,
            "input.name",
        ),
        case(
            "input both inline and by key",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": {"base64": "aGVsbG8=", "key": "jobs/x"}})),
            BAD,
            "exactly one",
        ),
        case(
            "an input key that climbs",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": {"key": "../../secret"}})),
            BAD,
            "input.key",
        ),
        case(
            "an input with an unknown field",
            M::POST,
            "/v1/jobs",
            JSON,
            job(json!({"dag": "ml-pipeline", "input": ok_input, "path": "/etc/passwd"})),
            BAD,
            "unknown field `path`",
        ),
        // ---- DAG files
        case(
            "a DAG as an image",
            M::PUT,
            "/v1/dags",
            Some("image/png"),
            DAG,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/yaml",
        ),
        case(
            "a DAG as octet-stream",
            M::POST,
            "/v1/dags",
            Some("application/octet-stream"),
            DAG,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/yaml",
        ),
        case(
            "a DAG that is not UTF-8",
            M::PUT,
            "/v1/dags",
            YAML,
            vec![b'n', b'a', 0xff, 0xfe],
            BAD,
            "UTF-8",
        ),
        case(
            "a DAG with an unknown query parameter",
            M::PUT,
            "/v1/dags?colour=red",
            YAML,
            DAG,
            BAD,
            "colour",
        ),
        case(
            "a DAG named by a traversal",
            M::PUT,
            "/v1/dags?file=..%2F..%2Fetc%2Fpasswd",
            YAML,
            DAG.replace("name: ml-pipeline", "name: ../x"),
            BAD,
            "not a valid DAG name",
        ),
        case(
            "a DAG that replaces a function name with SQL",
            M::PUT,
            "/v1/dags",
            YAML,
            DAG.replace("name: pca,", "name: \"pca'; DROP TABLE dags; --\","),
            BAD,
            "not a valid function name",
        ),
        case(
            "a DAG with an escape sequence in its image",
            M::PUT,
            "/v1/dags",
            YAML,
            DAG.replace(
                "image: \"sonic-lambdas:latest\", command: [ml-pipeline, pca]",
                "image: \"sonic\\e[2J\", command: [ml-pipeline, pca]",
            ),
            BAD,
            "not an image reference",
        ),
        // ---- names and ids in paths
        case(
            "a dag path that climbs",
            M::GET,
            "/v1/dags/..%2F..%2Fetc%2Fpasswd",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "a dag path with NUL",
            M::GET,
            "/v1/dags/ml-pipeline%00",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "a dag path with SQL",
            M::DELETE,
            "/v1/dags/ml-pipeline%27%20OR%20%271%27%3D%271",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "an uppercase dag path",
            M::DELETE,
            "/v1/dags/ML-PIPELINE",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "a dag path in odd unicode",
            M::GET,
            "/v1/dags/ml%E2%80%AEpipeline",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "a dag path that is not UTF-8",
            M::GET,
            "/v1/dags/ml%FFpipeline",
            None,
            "",
            BAD,
            "",
        ),
        case(
            "models of a traversal",
            M::GET,
            "/v1/dags/..%2F..%2Fetc/models",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "a plan without an input size",
            M::GET,
            "/v1/dags/ml-pipeline/plan",
            None,
            "",
            BAD,
            "input_bytes",
        ),
        case(
            "a plan for a negative input",
            M::GET,
            "/v1/dags/ml-pipeline/plan?input_bytes=-5",
            None,
            "",
            BAD,
            "input_bytes",
        ),
        case(
            "a plan for an input past u64",
            M::GET,
            "/v1/dags/ml-pipeline/plan?input_bytes=18446744073709551616",
            None,
            "",
            BAD,
            "input_bytes",
        ),
        case(
            "a plan with an unknown policy",
            M::GET,
            "/v1/dags/ml-pipeline/plan?input_bytes=1000&policy=fastest",
            None,
            "",
            BAD,
            "policy",
        ),
        case(
            "a job id that climbs",
            M::GET,
            "/v1/jobs/..%2F..%2Fetc",
            None,
            "",
            BAD,
            "invalid job id",
        ),
        case(
            "a job id with NUL",
            M::GET,
            "/v1/jobs/j-%00",
            None,
            "",
            BAD,
            "invalid job id",
        ),
        case(
            "a job id with SQL",
            M::POST,
            "/v1/jobs/j-1%27%3B%20DELETE%20FROM%20jobs%3B--/cancel",
            None,
            "",
            BAD,
            "invalid job id",
        ),
        case(
            "events of a job id with a slash",
            M::GET,
            "/v1/jobs/j-..%2Fx/events",
            None,
            "",
            BAD,
            "invalid job id",
        ),
        case(
            "logs of a function that climbs",
            M::GET,
            "/v1/jobs/j-0000000000000001/logs?function=..%2F..%2Fx",
            None,
            "",
            BAD,
            "invalid function name",
        ),
        case(
            "a result key that climbs",
            M::GET,
            "/v1/jobs/j-0000000000000001/results/..%2F..%2Fother%2Fsecret",
            None,
            "",
            BAD,
            "invalid result key",
        ),
        case(
            "a result key with NUL",
            M::GET,
            "/v1/jobs/j-0000000000000001/results/a%00b",
            None,
            "",
            BAD,
            "invalid result key",
        ),
        // ---- query strings
        case(
            "a negative job limit",
            M::GET,
            "/v1/jobs?limit=-1",
            None,
            "",
            BAD,
            "limit",
        ),
        case(
            "a job limit past u32",
            M::GET,
            "/v1/jobs?limit=99999999999",
            None,
            "",
            BAD,
            "limit",
        ),
        case(
            "SQL in the job filter",
            M::GET,
            "/v1/jobs?dag=x%27%3B%20DROP%20TABLE%20jobs%3B--",
            None,
            "",
            BAD,
            "invalid dag name",
        ),
        case(
            "an unknown job filter",
            M::GET,
            "/v1/jobs?owner=root",
            None,
            "",
            BAD,
            "owner",
        ),
        // ---- agents
        case(
            "an agent id in odd unicode",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"agent_id": "a\u{202e}2"})),
            BAD,
            "agent_id",
        ),
        case(
            "an agent id with SQL",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"agent_id": "a'; DELETE FROM agents; --"})),
            BAD,
            "agent_id",
        ),
        case(
            "a negative vcpu count",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"vcpus": -1})),
            BAD,
            "invalid value",
        ),
        case(
            "memory past u64",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"memory_mb": 1e30})),
            BAD,
            "invalid type",
        ),
        case(
            "an agent URL with a query",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"url": "http://evil.example/?x=1"})),
            BAD,
            "url",
        ),
        case(
            "an agent URL to a file",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"url": "file:///etc/passwd"})),
            BAD,
            "url",
        ),
        case(
            "a negative network speed",
            M::POST,
            "/v1/agents/register",
            JSON,
            register(json!({"network_mbps": -750.0})),
            BAD,
            "network_mbps",
        ),
        case(
            "a negative running count",
            M::POST,
            "/v1/agents/a-1/heartbeat",
            JSON,
            beat("a-1", json!(-5)),
            BAD,
            "invalid value",
        ),
        case(
            "a heartbeat for another agent",
            M::POST,
            "/v1/agents/a-1/heartbeat",
            JSON,
            beat("a-2", json!(0)),
            BAD,
            "does not match",
        ),
        case(
            "a heartbeat path that climbs",
            M::POST,
            "/v1/agents/..%2F..%2Fetc/heartbeat",
            JSON,
            beat("../../etc", json!(0)),
            BAD,
            "agent_id",
        ),
    ]
}

#[tokio::test]
async fn malformed_requests_get_a_clear_4xx_and_change_nothing() {
    let cp = setup().await;
    let before = cp.snapshot().await;
    assert_eq!(before.0["agents"].as_array().map(Vec::len), Some(1));
    assert_eq!(before.0["jobs"], json!([]));
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let a = cp
            .call(
                c.method.clone(),
                &c.uri,
                Some(&bearer()),
                c.content_type,
                c.body.clone(),
            )
            .await;
        let mut why = Vec::new();
        if a.status != c.status {
            why.push(format!("status {}, expected {}", a.status, c.status));
        }
        if !a.status.is_client_error() {
            why.push("not a 4xx".to_owned());
        }
        if !a.content_type.starts_with("application/json") {
            why.push(format!("content type {:?}", a.content_type));
        }
        match serde_json::from_slice::<Value>(&a.body) {
            Ok(v) => match v["error"].as_str() {
                Some(e) if !e.is_empty() && e.contains(c.says) => {
                    if e.contains("internal") || e.contains("rusqlite") || e.contains("sqlite") {
                        why.push(format!("leaks internals: {e:?}"));
                    }
                }
                _ => why.push(format!("no error saying {:?} in {v}", c.says)),
            },
            Err(_) => why.push(format!("body is not JSON: {}", a.text())),
        }
        let after = cp.snapshot().await;
        if after != before {
            why.push("the request changed the state".to_owned());
        }
        if !why.is_empty() {
            failures.push(format!(
                "{} ({} {}): {}",
                c.what,
                c.method,
                c.uri.chars().take(100).collect::<String>(),
                why.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} requests:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `{name}`, `{id}`, `{*key}`: any placeholder of a route template, filled with `value`.
fn fill(template: &str, value: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |i| open + i + 1);
        out.push_str(value);
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

#[tokio::test]
async fn every_guarded_route_refuses_bad_credentials_before_reading_anything() {
    let cp = setup().await;
    let before = cp.snapshot().await;
    let table = routes();
    let public: Vec<&str> = table
        .iter()
        .filter(|r| !r.guard.needs_token())
        .map(|r| r.path)
        .collect();
    assert_eq!(public, ["/v1/health"], "health is the only public route");
    let credentials: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        (
            "another token",
            Some("Bearer wrong-token-0123456789".into()),
        ),
        ("the token with a suffix", Some(format!("Bearer {TOKEN}0"))),
        (
            "a prefix of the token",
            Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        ),
        ("the token without a scheme", Some(TOKEN.to_owned())),
        ("the token as Basic", Some(format!("Basic {TOKEN}"))),
        ("an empty bearer", Some("Bearer ".into())),
        ("a bearer of spaces", Some("Bearer      ".into())),
        (
            "the token twice",
            Some(format!("Bearer {TOKEN}, Bearer {TOKEN}")),
        ),
    ];
    // Hostile path values: the guard answers before any of them is looked at.
    let values = [
        "ml-pipeline",
        "j-0000000000000001",
        "..%2F..%2Fetc",
        "x%27%3B--",
        "%00",
    ];
    let huge = vec![b'{'; 2 * LIMIT];
    let mut failures = Vec::new();
    for r in &table {
        for value in values {
            let uri = fill(r.path, value);
            for (what, auth) in &credentials {
                for body in [Vec::new(), huge.clone()] {
                    let a = cp
                        .call(r.method.clone(), &uri, auth.as_deref(), JSON, body.clone())
                        .await;
                    let expected = if r.guard.needs_token() {
                        StatusCode::UNAUTHORIZED
                    } else {
                        StatusCode::OK
                    };
                    let json_ok = serde_json::from_slice::<Value>(&a.body).is_ok_and(|v| {
                        !r.guard.needs_token() || v == json!({"error": "missing or wrong token"})
                    });
                    if a.status != expected || !json_ok {
                        failures.push(format!(
                            "{} {uri} with {what}, {} byte body: {} {}",
                            r.method,
                            body.len(),
                            a.status,
                            a.text().chars().take(120).collect::<String>()
                        ));
                    }
                }
            }
        }
        // The token itself in the query string is not a credential.
        let uri = fill(r.path, "ml-pipeline");
        let sep = if uri.contains('?') { '&' } else { '?' };
        let a = cp
            .call(
                r.method.clone(),
                &format!("{uri}{sep}token={TOKEN}"),
                None,
                JSON,
                Vec::new(),
            )
            .await;
        if r.guard.needs_token() && a.status != StatusCode::UNAUTHORIZED {
            failures.push(format!(
                "{} {uri} with the token in the query: {}",
                r.method, a.status
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        cp.snapshot().await,
        before,
        "refused requests changed the state"
    );
}
