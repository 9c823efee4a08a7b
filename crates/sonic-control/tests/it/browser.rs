//! The dashboard in a real headless browser (Debian's `chromium`, driven by `chromedriver`
//! through WebDriver; the few commands needed are plain HTTP + JSON here, no client crate), on a
//! cluster in this process: log in through the form, open a DAG, start a job from its page,
//! watch the job's page reach `succeeded` without reloading, find every edge's method on it, use
//! it at phone width, and see every page refused without the token.
//!
//! Needs `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`;
//! `.ci/run` installs them). Without them it fails saying so, unless `SONIC_SKIP_BROWSER=1`
//! (which `.ci/run` sets, loudly, only when they cannot be installed). With
//! `SONIC_SCREENSHOTS=DIR` it writes the DAG, job and agents pages' screenshots there
//! (`docs/screenshots/`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Cluster, DAG, TOKEN};
use serde_json::{Value, json};
use sonic_api::control::JobStatus;
use sonic_control::http::dashboard::{PageAccess, pages};
use sonic_core::regression::Convergence;

/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one headless Chromium session.
struct Driver {
    http: reqwest::Client,
    /// The session's URL.
    base: String,
    port: u16,
    session: String,
    child: Child,
    _profile: tempfile::TempDir,
}

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/lib/chromium")]) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Driver {
    /// Starts chromedriver and a session; `None` (after saying so loudly) when the browser is
    /// missing and `SONIC_SKIP_BROWSER=1` allows it.
    async fn start() -> Option<Driver> {
        let driver = find_program(&["chromedriver"]);
        let browser = find_program(&["chromium", "chromium-browser", "google-chrome"]);
        let (Some(driver), Some(browser)) = (driver, browser) else {
            let why = "the browser test needs Chromium and its WebDriver: \
                       apt-get install -y chromium chromium-driver";
            // In CI nothing is skipped: a missing browser fails the run, saying what to install.
            if std::env::var("SONIC_SKIP_BROWSER").is_ok_and(|v| v == "1")
                && !crate::support::in_ci()
            {
                eprintln!(
                    "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                     !!! SKIPPED: the dashboard browser test did not run.\n\
                     !!! {why} (SONIC_SKIP_BROWSER=1 allowed the skip).\n\
                     !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
                );
                return None;
            }
            panic!("{why} (or set SONIC_SKIP_BROWSER=1 to skip it)");
        };
        let port = free_port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
        let profile = tempfile::tempdir().expect("tempdir");
        let mut d = Driver {
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{port}"),
            port,
            session: String::new(),
            child,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = d
                .http
                .get(format!("{}/status", d.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success());
            if ready.is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,1000", "--hide-scrollbars",
                    format!("--user-data-dir={}", d._profile.path().display()),
                ]
            }
        }}});
        let r: Value = d
            .http
            .post(format!("{}/session", d.base))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("json");
        let id = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {r}"))
            .to_owned();
        d.base = format!("{}/session/{id}", d.base);
        d.session = id;
        Some(d)
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        } else if method == reqwest::Method::POST {
            req = req.json(&json!({}));
        }
        let r: Value = req
            .send()
            .await
            .expect("webdriver")
            .json()
            .await
            .expect("json");
        if let Some(e) = r["value"]["error"].as_str() {
            panic!("webdriver {path}: {e}: {}", r["value"]["message"]);
        }
        r["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn url(&self) -> String {
        self.cmd(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn find(&self, css: &str) -> String {
        self.find_all(css)
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no element {css}"))
    }

    async fn text(&self, element: &str) -> String {
        self.cmd(
            reqwest::Method::GET,
            &format!("/element/{element}/text"),
            None,
        )
        .await
        .as_str()
        .unwrap_or("")
        .to_owned()
    }

    async fn click(&self, element: &str) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            None,
        )
        .await;
    }

    async fn type_into(&self, element: &str, text: &str) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            None,
        )
        .await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    async fn script(&self, js: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": js, "args": [] })),
        )
        .await
    }

    async fn resize(&self, width: u32, height: u32) {
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .await;
    }

    /// The whole page as a PNG (the window grown to the page's height first).
    async fn screenshot(&self, width: u32) -> Vec<u8> {
        let h = self
            .script("return document.documentElement.scrollHeight;")
            .await
            .as_u64()
            .unwrap_or(1000)
            .clamp(600, 6000) as u32;
        self.resize(width, h + 20).await;
        let b64 = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = sonic_control::exec::requests::decode_base64(b64.as_str().unwrap_or(""))
            .expect("a base64 screenshot");
        self.resize(width, 1000).await;
        png
    }

    async fn delete_cookies(&self) {
        self.cmd(reqwest::Method::DELETE, "/cookie", None).await;
    }

    /// Waits until `check` holds (polling, with a deadline).
    async fn until<F, Fut>(&self, what: &str, secs: u64, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !check().await {
            if Instant::now() > deadline {
                let at = self.url().await;
                let text = self
                    .script("return document.body ? document.body.innerText : '';")
                    .await;
                panic!(
                    "timed out waiting for {what}; the browser is at {at}, showing:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Driver {
    /// Ends the session (chromedriver then stops the browser), also after a failed assertion,
    /// then chromedriver itself.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        if !self.session.is_empty()
            && let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port))
        {
            let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
            let req = format!(
                "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session, self.port
            );
            if s.write_all(req.as_bytes()).is_ok() {
                let mut answer = Vec::new();
                let _ = s.read_to_end(&mut answer);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where screenshots go, if asked for (relative paths from the workspace's root).
fn screenshots() -> Option<PathBuf> {
    let dir = std::env::var_os("SONIC_SCREENSHOTS")?;
    let dir = PathBuf::from(dir);
    let dir = if dir.is_absolute() {
        dir
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir)
    };
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    Some(dir)
}

fn save(dir: &Option<PathBuf>, name: &str, png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
    if let Some(d) = dir {
        std::fs::write(d.join(name), png).expect("write screenshot");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_runs_a_job_and_watches_it_succeed() {
    let Some(driver) = Driver::start().await else {
        return;
    };
    let d = &driver;
    let shots = screenshots();
    let c = Cluster::start(Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    // Three profiling jobs first, so that the DAG's models converge and the job started from
    // the page runs planned (its page then has a plan to explain).
    for n in [20_000, 60_000, 100_000] {
        let id = c.submit_sized(None, n).await;
        assert_eq!(c.wait(&id).await.status, JobStatus::Succeeded);
    }
    let base_url = c.url();
    let base = base_url.as_str();

    // Without the token, every page sends the browser to the login page.
    for r in pages().iter().filter(|r| r.guard == PageAccess::SignedIn) {
        let path = r
            .path
            .replace("{name}", "fan")
            .replace("{id}", "j-0000000000000001")
            .replace("{*key}", "sink/0/out.bin");
        if r.method == axum::http::Method::GET
            && !path.ends_with(".js")
            && !path.ends_with("/events")
        {
            d.goto(&format!("{base}{path}")).await;
            let at = d.url().await;
            assert!(
                at.starts_with(&format!("{base}/login")),
                "{path} was not refused: the browser is at {at}"
            );
            assert!(
                !d.find_all("#token").await.is_empty(),
                "{path}: no login form"
            );
        }
        // And any client without it (the script, the event stream, the forms): 401.
        let (status, _) = if r.method == axum::http::Method::GET {
            c.get_text(&format!("{base}{path}"), None).await
        } else {
            let r = c
                .http
                .post(format!("{base}{path}"))
                .send()
                .await
                .expect("post");
            (r.status().as_u16(), String::new())
        };
        assert_eq!(status, 401, "{path} without the token");
    }

    // Log in through the form: back to the DAG's page the browser asked for.
    d.goto(&format!("{base}/dags/fan")).await;
    assert!(d.url().await.contains("/login?next="), "{}", d.url().await);
    let field = d.find("#token").await;
    d.type_into(&field, "not-the-token-0123456789").await;
    d.click(&d.find("button[type=submit].primary").await).await;
    d.until(
        "the login form to say the token is wrong",
        10,
        || async move { !d.find_all("[role=alert]").await.is_empty() },
    )
    .await;
    assert!(
        d.text(&d.find("[role=alert]").await)
            .await
            .contains("not the control plane's token")
    );
    let field = d.find("#token").await;
    d.type_into(&field, TOKEN).await;
    d.click(&d.find("button[type=submit].primary").await).await;
    d.until("the DAG's page", 10, || async move {
        d.url().await == format!("{base}/dags/fan")
    })
    .await;

    // The DAG: its graph, its models' curves; every form field has a label.
    assert_eq!(d.find_all("svg.dag path.edge").await.len(), 2);
    assert!(d.find_all("svg polyline").await.len() >= 5, "fitted curves");
    let unlabelled = d
        .script(
            "return Array.from(document.querySelectorAll('input:not([type=hidden]),select,textarea'))\
             .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).length;",
        )
        .await;
    assert_eq!(unlabelled, 0, "inputs without a label");
    save(&shots, "dag.png", &d.screenshot(1280).await);

    // The form lists the DAG's parameter with its default.
    assert_eq!(
        d.script("return document.getElementById('param-mids').value;")
            .await,
        "2"
    );

    // Start a job from the page, its input a file uploaded from this machine.
    let upload_dir = tempfile::tempdir().expect("dir");
    let upload = upload_dir.path().join("records.txt");
    let data: Vec<u8> = (0..80_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&upload, &data).expect("write");
    let file = d.find("#input_file").await;
    d.type_into(&file, upload.to_str().expect("path")).await;
    d.click(&d.find("#run").await).await;
    d.until("the job's page", 10, || async move {
        d.url().await.starts_with(&format!("{base}/jobs/j-"))
    })
    .await;
    let job = d.url().await.rsplit('/').next().unwrap_or("").to_owned();
    // A mark that a reload would erase: the page must follow the job without one.
    d.script("window.sonicMark = 'kept'; return null;").await;
    // Read in the page (its script replaces parts of it as the job moves on).
    d.until("the job to succeed on its page", 120, || async move {
        d.script("const b = document.querySelector('#job-status .badge'); return b ? b.textContent : '';")
            .await
            == "succeeded"
    })
    .await;
    // The details arrive with the end (the page's script fetches them).
    d.until("the edges' methods", 20, || async move {
        d.script(
            "return document.querySelectorAll('[data-edge]').length > 0 \
             && document.getElementById('timeline-t') !== null \
             && document.querySelector('[data-edge]').textContent !== 'pending';",
        )
        .await
            == true
    })
    .await;
    assert_eq!(
        d.script("return window.sonicMark || null;").await,
        "kept",
        "the page was reloaded"
    );
    let summary = c.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(summary["status"], "succeeded");
    assert_eq!(summary["policy"], "sonic", "{summary}");
    let edges = summary["edges"].as_array().expect("edges");
    let shown = d
        .script(
            "const m = {}; document.querySelectorAll('[data-edge]')\
             .forEach(e => { m[e.getAttribute('data-edge')] = e.textContent; }); return m;",
        )
        .await;
    let shown = shown.as_object().expect("edges on the page");
    assert_eq!(shown.len(), edges.len(), "one method per edge: {shown:?}");
    for e in edges {
        let key = format!(
            "{}->{}",
            e["from"].as_str().unwrap(),
            e["to"].as_str().unwrap()
        );
        let method = shown[&key].as_str().unwrap_or("");
        assert_eq!(method, e["method"].as_str().unwrap(), "{key}");
        assert!(["vm-storage", "direct", "remote"].contains(&method));
    }
    let body = d.text(&d.find("main").await).await;
    for part in [
        "Predicted and measured",
        "Why this plan",
        "baseline remote",
        "Instances",
    ] {
        assert!(body.contains(part), "{part} missing on the job's page");
    }
    assert_eq!(summary["input_bytes"], 80_000, "the uploaded file");
    // Every function's node says it is done.
    assert_eq!(
        d.find_all("svg.dag g.node[data-state=done]").await.len(),
        3,
        "node states"
    );
    // The results download from the page, by the session.
    let downloaded = d
        .script(
            "const a = document.querySelector('ul.results a'); if (!a) return null;\
             const x = new XMLHttpRequest(); x.open('GET', a.href, false); x.send();\
             return [x.status, x.responseText.length, x.responseText.slice(0, 26)];",
        )
        .await;
    assert_eq!(
        downloaded,
        serde_json::json!([200, 80_000, "abcdefghijklmnopqrstuvwxyz"]),
        "a result downloaded from the page"
    );
    save(&shots, "job.png", &d.screenshot(1280).await);

    // At phone width no page scrolls sideways (wide tables scroll in their own box).
    d.resize(390, 844).await;
    save(&shots, "job-phone.png", &d.screenshot(390).await);
    for path in [
        format!("/jobs/{job}"),
        "/".into(),
        "/dags/fan".into(),
        "/jobs".into(),
        "/agents".into(),
    ] {
        d.goto(&format!("{base}{path}")).await;
        let overflow = d
            .script("return document.documentElement.scrollWidth - window.innerWidth;")
            .await
            .as_i64()
            .unwrap_or(999);
        if overflow > 0 {
            let wide = d
                .script(
                    "return Array.from(document.querySelectorAll('body *'))\
                     .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)\
                     .filter(e => !e.closest('.scroll'))\
                     .slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + (e.textContent || '').slice(0, 60));",
                )
                .await;
            panic!("{path} is {overflow}px too wide for a phone: {wide}");
        }
        // Nothing a badge or a fact says is cut off.
        let cut = d
            .script(
                "return Array.from(document.querySelectorAll('.badge, dl.facts dd, .card b'))\
                 .filter(e => !e.closest('.scroll'))\
                 .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > window.innerWidth + 1)\
                 .slice(0, 8).map(e => e.className + ' ' + (e.textContent || '').slice(0, 60));",
            )
            .await;
        assert_eq!(cut, serde_json::json!([]), "{path}: cut off at phone width");
    }
    d.resize(1280, 1000).await;

    // A failed job's page shows where it failed: the node, the attempts on the timeline.
    c.apply(
        "name: broken\nfunctions:\n  - { name: ok, image: sonic-lambdas:latest, command: [synthetic, run, --to, bad, --output-bytes, \"100\"], timeout: 30s }\n  - { name: bad, image: sonic-lambdas:latest, command: [synthetic, run, --exit-code, \"3\"], timeout: 30s, retries: { limit: 1, backoff: 1ms } }\nedges:\n  - { from: ok, to: bad, kind: one }\n",
    )
    .await;
    let failed = c
        .submit(serde_json::json!({ "dag": "broken", "policy": "remote" }))
        .await;
    assert_eq!(c.wait(&failed).await.status, JobStatus::Failed);
    d.goto(&format!("{base}/jobs/{failed}")).await;
    assert_eq!(
        d.find_all("svg.dag g.node[data-state=failed]").await.len(),
        1
    );
    assert!(
        d.text(&d.find("main").await)
            .await
            .contains("Attempts that failed")
    );
    save(&shots, "job-failed.png", &d.screenshot(1280).await);

    // The agents.
    d.goto(&format!("{base}/agents")).await;
    let text = d.text(&d.find("main").await).await;
    for a in ["a-1", "a-2", "m5.large", "m5.xlarge"] {
        assert!(text.contains(a), "{a} on the agents' page");
    }
    save(&shots, "agents.png", &d.screenshot(1280).await);

    // Logging out ends it: the pages want the token again.
    d.click(&d.find("header form button").await).await;
    d.until("the login page", 10, || async move {
        d.url().await.contains("/login")
    })
    .await;
    d.goto(&format!("{base}/jobs/{job}")).await;
    assert!(d.url().await.contains("/login"));
    d.delete_cookies().await;
    c.stop().await;
}
