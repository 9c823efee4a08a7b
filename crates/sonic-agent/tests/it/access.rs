//! Who may call what on an agent, walked from the route table (`server::routes()`, which includes
//! the file server's), so a new route is covered the day it is added: control-plane routes answer
//! 401 to a missing or wrong bearer token, file routes 403 to anything but a file token for the
//! very file (the control token included), health answers everyone. In-process, no sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use sonic_agent::config::local_config;
use sonic_agent::sandbox::{ProcessConfig, ProcessSandbox};
use sonic_agent::server::{AgentState, Guard, routes};
use sonic_agent::throttle::AgentThrottle;
use tower::ServiceExt;

const TOKEN: &str = "control-token-0123456789";
const FILE_KEY: &str = "file-key-0123456789abcdef";
const JOB: &str = "j-0000000000000001";

fn agent(dir: &std::path::Path, token: &str) -> Router {
    let cfg = local_config("a-1", &dir.join("agent"), token, FILE_KEY);
    let sandbox = ProcessSandbox::new(ProcessConfig {
        work_dir: dir.join("processes"),
        ..ProcessConfig::default()
    })
    .expect("process sandbox");
    let state = AgentState::new(cfg, Arc::new(sandbox), None, &AgentThrottle::unlimited())
        .expect("agent state");
    sonic_agent::server::router(Arc::new(state))
}

/// `{run_id}`, `{job}`, `{*path}`: any placeholder of a route template, filled with `value`.
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

async fn call(
    app: &Router,
    method: axum::http::Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn every_route_refuses_missing_and_wrong_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = agent(dir.path(), TOKEN);
    let table = routes();
    let guards: Vec<Guard> = table.iter().map(|r| r.guard).collect();
    assert!(guards.contains(&Guard::ControlToken) && guards.contains(&Guard::FileToken));
    assert_eq!(
        table
            .iter()
            .filter(|r| r.guard == Guard::Public)
            .map(|r| r.path)
            .collect::<Vec<_>>(),
        ["/v1/health"],
        "health is the only public route"
    );
    let bearer = format!("Bearer {TOKEN}");
    let other_file_token =
        sonic_api::token::issue(FILE_KEY.as_bytes(), JOB, "other/0/x/file", u64::MAX / 2);
    let forged = sonic_api::token::issue(b"not-the-file-key-0123", JOB, "x", u64::MAX / 2);
    let credentials: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("nothing", vec![]),
        (
            "another bearer token",
            vec![("authorization", "Bearer wrong-token-0123456789".into())],
        ),
        (
            "the token with a suffix",
            vec![("authorization", format!("{bearer}0"))],
        ),
        (
            "a prefix of the token",
            vec![("authorization", bearer[..bearer.len() - 1].to_owned())],
        ),
        (
            "the token without a scheme",
            vec![("authorization", TOKEN.into())],
        ),
        (
            "the token as Basic",
            vec![("authorization", format!("Basic {TOKEN}"))],
        ),
        ("an empty bearer", vec![("authorization", "Bearer ".into())]),
        (
            "a file token for another file",
            vec![("x-sonic-token", other_file_token)],
        ),
        ("a forged file token", vec![("x-sonic-token", forged)]),
        (
            "the control token as a file token",
            vec![("x-sonic-token", TOKEN.into())],
        ),
    ];
    let values = [JOB, "..%2F..%2Fetc%2Fpasswd", "%00", "x%27%3B--"];
    let mut failures = Vec::new();
    for r in &table {
        for value in values {
            let uri = fill(r.path, value);
            for (what, headers) in &credentials {
                let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let (status, body) = call(&app, r.method.clone(), &uri, &h, b"{}".to_vec()).await;
                let ok = match r.guard {
                    Guard::Public => status == StatusCode::OK,
                    Guard::ControlToken => {
                        status == StatusCode::UNAUTHORIZED
                            && body["error"] == "missing or wrong token"
                    }
                    // A hostile job id or path is refused as such (400) before any token is read;
                    // a well-formed one without a valid token for it is forbidden.
                    Guard::FileToken => {
                        body["error"].is_string()
                            && (status == StatusCode::FORBIDDEN
                                || (value != JOB && status == StatusCode::BAD_REQUEST))
                    }
                };
                if !ok {
                    failures.push(format!("{} {uri} with {what}: {status} {body}", r.method));
                }
            }
        }
        // The control token opens control routes only.
        let uri = fill(r.path, JOB);
        let (status, _) = call(
            &app,
            r.method.clone(),
            &uri,
            &[("authorization", &bearer)],
            b"{}".to_vec(),
        )
        .await;
        let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if (r.guard == Guard::FileToken) != refused {
            failures.push(format!(
                "{} {uri} with the control token: {status}",
                r.method
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn an_agent_with_an_empty_token_accepts_no_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = agent(dir.path(), "");
    for r in routes().iter().filter(|r| r.guard == Guard::ControlToken) {
        let uri = fill(r.path, JOB);
        for auth in ["Bearer ", "Bearer", ""] {
            let (status, _) = call(
                &app,
                r.method.clone(),
                &uri,
                &[("authorization", auth)],
                b"{}".to_vec(),
            )
            .await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{} {uri} with {auth:?}",
                r.method
            );
        }
    }
}

#[tokio::test]
async fn prewarm_checks_its_input_and_starts_nothing_it_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = local_config("a-1", &dir.path().join("agent"), TOKEN, FILE_KEY);
    cfg.memory_mb = 1024;
    cfg.vcpus = 2;
    let sandbox = ProcessSandbox::new(ProcessConfig {
        work_dir: dir.path().join("processes"),
        ..ProcessConfig::default()
    })
    .expect("process sandbox");
    let state = Arc::new(
        AgentState::new(cfg, Arc::new(sandbox), None, &AgentThrottle::unlimited())
            .expect("agent state"),
    );
    let app = sonic_agent::server::router(state.clone());
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let good = serde_json::json!({
        "function_key": "d.f@0011223344556677", "image": "i", "command": ["true"],
        "count": 2, "memory_limit_mb": 256, "cpus": 1.0,
    });
    let check = |edit: fn(&mut Value), expect: &'static str| {
        let mut body = good.clone();
        edit(&mut body);
        (body, expect)
    };
    let bad = [
        check(|b| b["count"] = 0.into(), "count"),
        check(|b| b["count"] = 65.into(), "count"),
        check(|b| b["memory_limit_mb"] = 0.into(), "memory_limit_mb"),
        check(|b| b["memory_limit_mb"] = 2048.into(), "memory_limit_mb"),
        check(|b| b["cpus"] = 0.0.into(), "cpus"),
        check(|b| b["cpus"] = 3.0.into(), "cpus"),
        check(|b| b["command"] = serde_json::json!([]), "command"),
        check(|b| b["function_key"] = "".into(), "function_key"),
        check(|b| b["function_key"] = "a b".into(), "function_key"),
        check(|b| b["output_quota_mb"] = 0.into(), "output_quota_mb"),
    ];
    for (body, expect) in bad {
        let (status, answer) = call(
            &app,
            axum::http::Method::POST,
            "/v1/prewarm",
            &auth,
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(expect), "{body}: {error}");
    }
    // JSON of the wrong shape: 422.
    let (status, _) = call(
        &app,
        axum::http::Method::POST,
        "/v1/prewarm",
        &auth,
        br#"{"count": "two"}"#.to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        state.sandbox.warm(),
        Some(0),
        "a refused request starts nothing"
    );

    // Four asked at 256 MB each on a 1,024 MB agent: four; then five asked, still four.
    let mut four = good.clone();
    four["count"] = 4.into();
    let (status, answer) = call(
        &app,
        axum::http::Method::POST,
        "/v1/prewarm",
        &auth,
        four.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, serde_json::json!({"started": 4, "warm": 4}));
    four["count"] = 5.into();
    let (_, answer) = call(
        &app,
        axum::http::Method::POST,
        "/v1/prewarm",
        &auth,
        four.to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        answer,
        serde_json::json!({"started": 0, "warm": 4}),
        "capped at what the agent's memory holds"
    );
    let text = state.metrics.render(&state);
    assert!(
        text.contains("sonic_agent_prewarmed_total{state=\"started\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("sonic_agent_prewarmed_total{state=\"used\"} 0"),
        "{text}"
    );
    state.sandbox.shutdown().await.expect("shutdown");
}
