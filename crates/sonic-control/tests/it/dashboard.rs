//! The web dashboard: who may see it (walked from its route table, so a new page is covered the
//! day it is added), the login cookie and its flags, cross-site posts, and its pages on a cluster
//! in this process (a DAG's graph and models, a job started from the run form, its methods, the
//! agents).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::support::{Cluster, DAG, TOKEN};
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use sonic_api::control::JobStatus;
use sonic_control::http::dashboard::{COOKIE, PageAccess, pages};
use sonic_control::{ControlState, Db, ManualClock, Settings, router};
use sonic_core::regression::Convergence;
use tower::ServiceExt;

fn app() -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open_dir(dir.path()).expect("db");
    let settings = Settings {
        token: TOKEN.into(),
        join_token: String::new(),
        heartbeat_timeout: Duration::from_secs(10),
        max_body_bytes: 1024 * 1024,
    };
    let state = ControlState::new(db, Arc::new(ManualClock::new(1_700_000_000_000)), settings);
    (dir, router(state))
}

/// `{name}`, `{id}`: any placeholder of a route template, filled in.
fn fill(template: &str) -> String {
    template
        .replace("{name}", "fan")
        .replace("{id}", "j-0000000000000001")
        .replace("{*key}", "sink/0/out.bin")
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// An `application/x-www-form-urlencoded` body.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn every_page_refuses_a_request_without_the_token() {
    let (_dir, app) = app();
    let table = pages();
    assert!(table.len() >= 10, "{table:?}");
    let wrong_cookie = format!("{COOKIE}={}", hex("wrong-token-0123456789"));
    let almost = format!("{COOKIE}={}", hex(&TOKEN[..TOKEN.len() - 1]));
    for r in table.iter().filter(|r| r.guard == PageAccess::SignedIn) {
        let uri = fill(r.path);
        let method = r.method.clone();
        for (what, headers) in [
            ("nothing", vec![]),
            (
                "a wrong bearer",
                vec![("authorization", "Bearer wrong-token-0123456789")],
            ),
            ("a wrong cookie", vec![("cookie", wrong_cookie.as_str())]),
            (
                "a cookie one character short",
                vec![("cookie", almost.as_str())],
            ),
            (
                "the token as the cookie, not hex",
                vec![("cookie", &*format!("{COOKIE}={TOKEN}"))],
            ),
            ("a token in the query", vec![]),
        ] {
            let uri = if what == "a token in the query" {
                format!("{uri}?token={TOKEN}")
            } else {
                uri.clone()
            };
            // A script: 401, and nothing of the page.
            let a = call(&app, method.clone(), &uri, &headers, "").await;
            assert_eq!(
                a.status,
                StatusCode::UNAUTHORIZED,
                "{} {uri} with {what}",
                r.method
            );
            assert!(!a.body.contains("<html"), "{uri}: {}", a.body);
            // A browser: sent to the login page, which brings it back.
            let mut browser = headers.clone();
            browser.push(("accept", "text/html,application/xhtml+xml"));
            let a = call(&app, method.clone(), &uri, &browser, "").await;
            assert_eq!(
                a.status,
                StatusCode::SEE_OTHER,
                "{} {uri} with {what} (browser)",
                r.method
            );
            let to = a.headers[header::LOCATION].to_str().expect("location");
            assert!(to.starts_with("/login"), "{uri} -> {to}");
            assert!(a.body.is_empty(), "{uri}: {}", a.body);
        }
    }
    // The open routes are the login page, the login and the logout.
    let open: Vec<&str> = table
        .iter()
        .filter(|r| r.guard == PageAccess::Open)
        .map(|r| r.path)
        .collect();
    assert_eq!(open, ["/login", "/login", "/logout"]);
    let login = call(&app, Method::GET, "/login?next=/jobs", &[], "").await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(login.body.contains("<label for=\"token\">Token</label>"));
    assert!(login.body.contains("name=\"next\" value=\"/jobs\""));
}

#[tokio::test]
async fn the_token_opens_every_page_as_a_bearer_or_a_cookie() {
    let (_dir, app) = app();
    let bearer = format!("Bearer {TOKEN}");
    // Wrong token: the form again, 401, no cookie.
    let a = call(
        &app,
        Method::POST,
        "/login",
        &[("content-type", "application/x-www-form-urlencoded")],
        "token=nope-0123456789&next=%2Fagents",
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.headers.get(header::SET_COOKIE).is_none());
    assert!(a.body.contains("role=\"alert\""), "{}", a.body);
    // The token: a cookie with its flags, and back where the browser was going.
    let form = format!("token={TOKEN}&next=%2Fagents");
    let a = call(
        &app,
        Method::POST,
        "/login",
        &[("content-type", "application/x-www-form-urlencoded")],
        &form,
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.headers[header::LOCATION], "/agents");
    let set = a.headers[header::SET_COOKIE]
        .to_str()
        .expect("cookie")
        .to_owned();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = set.split(';').next().expect("name=value").to_owned();
    // Behind a TLS proxy the cookie is Secure; `next` never leaves the site.
    let a = call(
        &app,
        Method::POST,
        "/login",
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("x-forwarded-proto", "https"),
        ],
        &format!("token={TOKEN}&next=%2F%2Fevil.example%2F"),
    )
    .await;
    assert!(
        a.headers[header::SET_COOKIE]
            .to_str()
            .expect("cookie")
            .contains("; Secure")
    );
    assert_eq!(a.headers[header::LOCATION], "/");

    for r in pages()
        .iter()
        .filter(|r| r.guard == PageAccess::SignedIn && r.method == Method::GET)
    {
        if r.path.contains("{") {
            continue; // pages of one DAG or job: below, on a cluster
        }
        for auth in [
            ("authorization", bearer.as_str()),
            ("cookie", cookie.as_str()),
        ] {
            let a = call(&app, Method::GET, r.path, &[auth], "").await;
            assert_eq!(a.status, StatusCode::OK, "{} with {}", r.path, auth.0);
            let csp = a.headers["content-security-policy"].to_str().expect("csp");
            assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
            assert_eq!(a.headers["cache-control"], "no-store");
        }
    }
    // Logged in, the login page sends the browser on; logging out forgets the cookie.
    let a = call(
        &app,
        Method::GET,
        "/login?next=/jobs",
        &[("cookie", cookie.as_str())],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.headers[header::LOCATION], "/jobs");
    let a = call(
        &app,
        Method::POST,
        "/logout",
        &[("cookie", cookie.as_str())],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(
        a.headers[header::SET_COOKIE]
            .to_str()
            .expect("cookie")
            .contains("Max-Age=0")
    );

    // A form posted from another site is refused, even with the cookie.
    for headers in [
        vec![
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:7000"),
        ],
        vec![("sec-fetch-site", "cross-site")],
    ] {
        let mut h = headers.clone();
        h.push(("cookie", cookie.as_str()));
        h.push(("content-type", "application/x-www-form-urlencoded"));
        let a = call(&app, Method::POST, "/dags/fan/run", &h, "input_bytes=10").await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{headers:?}");
    }
    // The API is unchanged: the cookie does not open it.
    let a = call(
        &app,
        Method::GET,
        "/v1/dags",
        &[("cookie", cookie.as_str())],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
}

/// Logs in through the form, as a browser does: the cookie.
async fn log_in(c: &Cluster) -> String {
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .post(format!("{}/login", c.url()))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&[("token", TOKEN), ("next", "/")]))
        .send()
        .await
        .expect("login");
    assert_eq!(r.status(), 303);
    let set = r.headers()[header::SET_COOKIE]
        .to_str()
        .expect("cookie")
        .to_owned();
    set.split(';').next().expect("name=value").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_show_a_dag_a_job_started_from_the_form_and_the_agents() {
    let c = Cluster::start(Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    let cookie = log_in(&c).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let get = |path: &str| {
        let req = http
            .get(format!("{}{path}", c.url()))
            .header(header::COOKIE, cookie.clone());
        async move {
            let r = req.send().await.expect("get");
            (r.status().as_u16(), r.text().await.expect("text"))
        }
    };

    // The DAG: its graph, its edges' kinds, its run form.
    let (status, page) = get("/dags/fan").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<svg") && page.contains("class=\"edge\""),
        "graph"
    );
    for f in ["gen", "mid", "sink"] {
        assert!(page.contains(&format!(">{f}</text>")), "{f} in the graph");
    }
    assert!(page.contains("broadcast") && page.contains("gather"));
    assert!(page.contains("action=\"/dags/fan/run\""));
    assert!(page.contains("Nothing learned yet"));

    // Three jobs from the run form (the models converge on the third), then one planned.
    let mut ids = Vec::new();
    for n in [20_000, 60_000, 100_000, 80_000] {
        let r = http
            .post(format!("{}/dags/fan/run", c.url()))
            .header(header::COOKIE, cookie.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form(&[
                ("policy", ""),
                ("input_bytes", &n.to_string()),
                ("key", ""),
                ("params", "mids=2"),
            ]))
            .send()
            .await
            .expect("run");
        assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
        let to = r.headers()[header::LOCATION]
            .to_str()
            .expect("location")
            .to_owned();
        let id = to.strip_prefix("/jobs/").expect("a job page").to_owned();
        let s = c.wait(&id).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
        ids.push((id, s));
    }
    let (planned, s) = &ids[3];
    assert_eq!(s.policy.as_str(), "sonic", "{s:?}");

    // The job's page: its status, every edge's method, the timeline, the plan and why.
    let (status, page) = get(&format!("/jobs/{planned}")).await;
    assert_eq!(status, 200);
    assert!(page.contains("data-status=\"succeeded\""), "status");
    for e in &s.edges {
        let cell = format!("data-edge=\"{}-&gt;{}\">{}</span>", e.from, e.to, e.method);
        assert!(page.contains(&cell), "{cell} missing");
    }
    assert!(
        page.contains("Instances on a timeline by agent"),
        "timeline"
    );
    assert!(page.contains("Predicted and measured"));
    assert!(page.contains("Why this plan"));
    for baseline in ["baseline remote", "baseline direct", "baseline local"] {
        assert!(page.contains(baseline), "{baseline}");
    }
    // The objective said; every plan that did not run says why not (faster but costlier,
    // cheaper but slower, or both worse), with its Perf/$ below the one that ran.
    assert!(
        page.contains("Perf/$ = 1 / (latency × cost)"),
        "the objective"
    );
    assert!(page.contains(">Why not</th>") && page.contains(">ran</td>"));
    let why_nots = page.matches(" lower</td>").count();
    assert!(why_nots >= 3, "a reason per baseline: {why_nots}");
    // Per stage, predicted against measured, signed.
    assert!(page.contains("Per stage: when the plan predicted it would run"));
    for f in ["gen", "mid", "sink"] {
        assert!(page.contains(&format!("<td>{f}</td>")), "{f}'s row");
    }
    // Where each stage ran, and how the plan priced its start, as the job's plan says.
    assert!(page.contains(">Start</th>"), "the stages' start");
    let plan = s.plan.as_ref().expect("a planned job's plan");
    for st in &plan.stages {
        let prewarmed = crate::support::report_json(plan)["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x["function"] == st.function.as_str() && x["prewarmed"] == true);
        let start = match (st.warm, prewarmed) {
            (true, _) => "warm",
            (false, true) => "prewarmed",
            (false, false) => "cold",
        };
        let row = format!("<td>{}</td><td>{}</td>", start, st.agents.join(", "));
        assert!(page.contains(&row), "{}: {row} missing", st.function);
    }
    let (_, live) = get(&format!("/jobs/{planned}/live")).await;
    assert!(
        live.contains("job-status") && !live.contains("<html"),
        "a fragment"
    );

    // Its event stream opens with the cookie (what the page's EventSource does).
    let r = http
        .get(format!("{}/jobs/{planned}/events", c.url()))
        .header(header::COOKIE, cookie.clone())
        .send()
        .await
        .expect("events");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.expect("stream");
    assert!(text.contains("\"status\":\"succeeded\""), "{text}");

    // The DAG's models now: a chart per parameter, converged.
    let (_, page) = get("/dags/fan").await;
    assert!(page.contains("<polyline"), "fitted curves");
    assert!(
        page.contains("Jobs without a forced policy run <strong>planned</strong>: planned: the models converged"),
        "{page}"
    );
    assert!(page.contains("gen.cold_s"));
    // The planned job held against its plan's prediction.
    assert!(
        page.contains("Planned jobs: predicted against measured")
            && page.contains("Over the last 1 planned jobs that succeeded"),
        "{page}"
    );
    assert!(
        page.contains(&format!("<a href=\"/jobs/{planned}\">")),
        "{page}"
    );

    // The jobs list and its filters.
    let (_, page) = get("/jobs?status=succeeded&policy=sonic").await;
    assert!(page.contains(planned.as_str()));
    assert!(
        !page.contains(ids[0].0.as_str()),
        "a profiling job under policy=sonic"
    );
    let (status, _) = get("/jobs?status=bogus").await;
    assert_eq!(status, 400);

    // The agents: VM types, capacity, warm environments from their own metrics, bandwidth.
    let (_, page) = get("/agents").await;
    for a in ["a-1", "a-2", "m5.large", "m5.xlarge", "alive"] {
        assert!(page.contains(a), "{a}");
    }
    assert!(page.contains("<meter"), "capacity in use");
    assert!(
        !page.contains(">unknown<"),
        "every alive agent told its warm environments"
    );
    assert!(page.contains("Mbit/s"));

    // A bad form is refused on the DAG's page, saying why.
    let r = http
        .post(format!("{}/dags/fan/run", c.url()))
        .header(header::COOKIE, cookie.clone())
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&[("input_bytes", "lots")]))
        .send()
        .await
        .expect("run");
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("is not a number of bytes"));
    let (status, page) = get("/jobs/j-ffffffffffffffff").await;
    assert_eq!(status, 404);
    assert!(page.contains("no job j-ffffffffffffffff"));
    // A succeeded job can be deleted from its page, not retried; deleted, it is gone.
    let (first, _) = &ids[0];
    let (_, page) = get(&format!("/jobs/{first}")).await;
    assert!(
        page.contains(&format!("action=\"/jobs/{first}/delete\"")),
        "{page}"
    );
    assert!(!page.contains("Retry the job"), "{page}");
    let r = http
        .post(format!("{}/jobs/{first}/retry", c.url()))
        .header(header::COOKIE, cookie.clone())
        .send()
        .await
        .expect("retry");
    assert_eq!(r.status(), 409, "a succeeded job is not retried");
    let r = http
        .post(format!("{}/jobs/{first}/delete", c.url()))
        .header(header::COOKIE, cookie.clone())
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()[header::LOCATION], "/jobs");
    let (status, _) = get(&format!("/jobs/{first}")).await;
    assert_eq!(status, 404);
    c.stop().await;
}

#[tokio::test]
async fn what_users_wrote_is_shown_as_text_never_as_markup() {
    let (_dir, app) = app();
    let bearer = format!("Bearer {TOKEN}");
    let yaml = "name: xss\ndescription: \"<script>alert(1)</script> & <img src=x onerror=alert(2)>\"\nfunctions:\n  - { name: f, image: i, command: [x] }\n";
    let a = call(
        &app,
        Method::PUT,
        "/v1/dags",
        &[
            ("authorization", &bearer),
            ("content-type", "application/yaml"),
        ],
        yaml,
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    for page in ["/", "/dags", "/dags/xss"] {
        let a = call(&app, Method::GET, page, &[("authorization", &bearer)], "").await;
        assert_eq!(a.status, StatusCode::OK, "{page}");
        assert!(
            !a.body.contains("<script>alert"),
            "{page} runs the description"
        );
        assert!(
            !a.body.contains("<img src=x"),
            "{page} renders the description"
        );
        assert!(
            a.body
                .contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp;"),
            "{page}"
        );
    }
    // The login page's way back is a value, escaped.
    let a = call(
        &app,
        Method::GET,
        "/login?next=/%22%3E%3Cscript%3E",
        &[],
        "",
    )
    .await;
    assert!(!a.body.contains("\"><script>"), "{}", a.body);
}

/// Over the network: the cookie holds a session's id, never the token; logging out ends the
/// session on the server (the same cookie no longer opens a page); failed logins from one
/// address are cut off with 429 and `Retry-After`, the right token too until the window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_at_logout_and_failed_logins_are_limited() {
    use sonic_control::http::dashboard::LOGIN_FAILURES;
    let c = Cluster::builder().agents(&[]).start().await;
    let cookie = log_in(&c).await;
    let value = cookie.split_once('=').expect("name=value").1;
    assert!(
        !value.contains(&hex(TOKEN)) && !value.contains(TOKEN),
        "{cookie}"
    );
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let agents = async |cookie: &str| {
        http.get(format!("{}/agents", c.url()))
            .header(header::COOKIE, cookie)
            .send()
            .await
            .expect("get")
            .status()
            .as_u16()
    };
    assert_eq!(agents(&cookie).await, 200);
    let r = http
        .post(format!("{}/logout", c.url()))
        .header(header::COOKIE, cookie.as_str())
        .send()
        .await
        .expect("logout");
    assert_eq!(r.status(), 303);
    assert_eq!(
        agents(&cookie).await,
        401,
        "the session ended on the server"
    );

    let login = async |token: &str| {
        http.post(format!("{}/login", c.url()))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form(&[("token", token), ("next", "/")]))
            .send()
            .await
            .expect("login")
    };
    for _ in 0..LOGIN_FAILURES {
        assert_eq!(login("wrong-token-0123456789").await.status(), 401);
    }
    let r = login(TOKEN).await;
    assert_eq!(r.status(), 429, "locked out, even with the token");
    let wait: u64 = r.headers()[header::RETRY_AFTER]
        .to_str()
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=300).contains(&wait), "{wait}");
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("Too many failed logins")
    );
    // The API's bearer token is not the login form: it still opens everything.
    let r = http
        .get(format!("{}/agents", c.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
}

/// A `multipart/form-data` body of text fields and one file, as a browser posts the run form.
fn multipart(boundary: &str, fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    if let Some((name, bytes)) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"input_file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

/// The run form lists the DAG's parameters and uploads an input (the page's multipart form);
/// a succeeded job's results download from its page by the session; a failed job shows where
/// it failed (its function's node, the failed attempts on the timeline and in a table); a long
/// job is summarized per function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_form_uploads_results_download_and_failures_show_where_they_happened() {
    let c = Cluster::start(Convergence::default()).await;
    c.apply(DAG).await;
    let cookie = log_in(&c).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let get = |path: String| {
        let req = http
            .get(format!("{}{path}", c.url()))
            .header(header::COOKIE, cookie.clone());
        async move {
            let r = req.send().await.expect("get");
            let status = r.status().as_u16();
            let disposition = r
                .headers()
                .get(header::CONTENT_DISPOSITION)
                .map(|v| v.to_str().unwrap_or("").to_owned());
            (
                status,
                disposition,
                r.bytes().await.expect("bytes").to_vec(),
            )
        }
    };

    // The form: a file field, and a field per declared parameter with its default.
    let (_, _, page) = get("/dags/fan".into()).await;
    let page = String::from_utf8(page).unwrap();
    assert!(page.contains("enctype=\"multipart/form-data\""), "{page}");
    assert!(page.contains("type=\"file\""));
    assert!(
        page.contains("name=\"param.mids\"") && page.contains("value=\"2\""),
        "the DAG's parameter with its default"
    );

    // Uploaded: the job's input is the file, under its own (safe) name; mids from its field.
    let data: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let boundary = "sonic-test-boundary-7f3a";
    let r = http
        .post(format!("{}/dags/fan/run", c.url()))
        .header(header::COOKIE, cookie.clone())
        .header(
            header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(multipart(
            boundary,
            &[
                ("policy", "remote"),
                ("input_bytes", "100000"),
                ("key", ""),
                ("param.mids", "3"),
            ],
            Some(("my records.csv", &data)),
        ))
        .send()
        .await
        .expect("run");
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
    let id = r.headers()[header::LOCATION]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(s.input_bytes, data.len() as u64);
    assert_eq!(s.functions.iter().filter(|f| f.name == "mid").count(), 3);
    let (_, _, page) = get(format!("/jobs/{id}")).await;
    let page = String::from_utf8(page).unwrap();
    assert_eq!(
        page.matches("data-state=\"done\"").count(),
        3,
        "every node done"
    );
    // Each result links to its download, which the session opens.
    let links: Vec<String> = page
        .match_indices(&format!("href=\"/jobs/{id}/results/"))
        .map(|(at, _)| {
            let rest = &page[at + 6..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect();
    assert_eq!(links.len(), s.outputs.len(), "{page}");
    for link in &links {
        let (status, disposition, bytes) = get(link.clone()).await;
        assert_eq!(status, 200, "{link}");
        assert!(
            disposition
                .as_deref()
                .is_some_and(|d| d.contains("attachment; filename=\"my_records.csv\"")),
            "{disposition:?}"
        );
        assert_eq!(bytes, data, "{link}: the uploaded file, copied through");
    }
    // Without the session: refused, no bytes.
    let r = http
        .get(format!("{}{}", c.url(), links[0]))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 401);

    // A long job: per function, every instance folded away.
    let r = http
        .post(format!("{}/dags/fan/run", c.url()))
        .header(header::COOKIE, cookie.clone())
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&[
            ("policy", "remote"),
            ("input_bytes", "1000"),
            ("params", "mids=30"),
        ]))
        .send()
        .await
        .expect("run");
    assert_eq!(r.status(), 303);
    let long = r.headers()[header::LOCATION]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(c.wait(&long).await.status, JobStatus::Succeeded);
    let (_, _, page) = get(format!("/jobs/{long}")).await;
    let page = String::from_utf8(page).unwrap();
    assert!(
        page.contains("Per function") && page.contains("All 32 instances"),
        "summarized"
    );

    // A failed job: its failing function's node, its failed attempts drawn and listed.
    c.apply(
        "name: broken\nfunctions:\n  - { name: ok, image: sonic-lambdas:latest, command: [synthetic, run, --to, bad, --output-bytes, \"100\"], timeout: 30s }\n  - { name: bad, image: sonic-lambdas:latest, command: [synthetic, run, --exit-code, \"3\"], timeout: 30s, retries: { limit: 1, backoff: 1ms } }\nedges:\n  - { from: ok, to: bad, kind: one }\n",
    )
    .await;
    let failed = c
        .submit(serde_json::json!({ "dag": "broken", "policy": "remote" }))
        .await;
    let s = c.wait(&failed).await;
    assert_eq!(s.status, JobStatus::Failed);
    assert_eq!(
        s.failed_attempts.len(),
        2,
        "both attempts: {:?}",
        s.failed_attempts
    );
    for (k, a) in s.failed_attempts.iter().enumerate() {
        assert_eq!(
            (a.name.as_str(), a.instance, a.attempt),
            ("bad", 0, k as u32 + 1)
        );
        assert!(a.error.contains("exit code 3"), "{}", a.error);
        assert!(a.started_s.is_some() && a.ended_s >= a.started_s);
    }
    let (_, _, page) = get(format!("/jobs/{failed}")).await;
    let page = String::from_utf8(page).unwrap();
    assert_eq!(
        page.matches("data-state=\"failed\"").count(),
        1,
        "bad's node"
    );
    assert_eq!(page.matches("data-state=\"done\"").count(), 1, "ok's node");
    assert!(page.contains("Attempts that failed"), "the table");
    assert!(
        page.contains("bad[0] ✗1") && page.contains("bad[0] ✗2"),
        "on the timeline"
    );
    assert!(
        !page.contains("/results/"),
        "a failed job offers no download"
    );
    c.stop().await;
}
