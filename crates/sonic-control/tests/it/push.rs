//! Agents push run reports when runs end (`POST /v1/agents/{id}/runs/{run_id}/report`): jobs
//! finish on pushes alone, forged and stale reports are refused and change nothing, and a lost
//! push costs the slow fallback poll, not the job. A cluster in this process (support/).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::support::{Cluster, DAG, TOKEN};
use serde_json::json;
use sonic_api::agent::{RunReport, RunStatus};
use sonic_api::control::{JobStatus, JobSummary};
use sonic_daemon::metrics::sample;

/// One function that sleeps long enough for a test to see its run waiting.
const SLOW: &str = r#"
name: slow
functions:
  - { name: nap, image: sonic-lambdas:latest, command: [synthetic, run, --sleep-ms, "1500", --to, result, --output-bytes, "10"], timeout: 30s }
"#;

/// One no-op instance: what a job costs the executor beyond the lambda's own time.
const NOOP: &str = r#"
name: noop
functions:
  - { name: only, image: sonic-lambdas:latest, command: [synthetic, noop], timeout: 30s }
"#;

/// The control plane's `sonic_run_reports_total{via}`.
async fn reports(c: &Cluster, via: &str) -> f64 {
    let (status, text) = c
        .get_text(&format!("{}/metrics", c.url()), Some(TOKEN))
        .await;
    assert_eq!(status, 200);
    sample(&text, "sonic_run_reports_total", &[("via", via)])
        .unwrap_or_else(|| panic!("no sonic_run_reports_total{{via={via}}} in\n{text}"))
}

/// An agent's `sonic_agent_reports_pushed_total{outcome}`, summed over the agents.
async fn pushed(c: &Cluster, outcome: &str) -> f64 {
    let mut sum = 0.0;
    for a in &c.agents {
        let (status, text) = c
            .get_text(&format!("{}/metrics", a.url()), Some(TOKEN))
            .await;
        assert_eq!(status, 200);
        sum += sample(
            &text,
            "sonic_agent_reports_pushed_total",
            &[("outcome", outcome)],
        )
        .unwrap_or_else(|| panic!("no sonic_agent_reports_pushed_total in\n{text}"));
    }
    sum
}

fn report(run_id: &str, status: RunStatus) -> RunReport {
    RunReport {
        cold: Some(false),
        seconds: Some(0.0),
        exit_code: Some(0),
        log: "forged".into(),
        ..RunReport::new(run_id.into(), status)
    }
}

/// POSTs `body` as a report of `run_id` from `agent`: the status.
async fn push(c: &Cluster, agent: &str, run_id: &str, token: Option<&str>, body: String) -> u16 {
    let mut req = c
        .http
        .post(format!(
            "{}/v1/agents/{agent}/runs/{run_id}/report",
            c.url()
        ))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("push").status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_finishes_on_pushed_reports_alone() {
    // The slow poll would first read a report after ten minutes: only pushes end this job.
    let c = Cluster::builder()
        .tune(|j| {
            j.fallback_poll = Duration::from_secs(600);
        })
        .start()
        .await;
    c.apply(DAG).await;
    let id = c.submit_sized(Some("direct"), 2048).await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
    // gen, two mids, sink.
    assert_eq!(reports(&c, "push").await, 4.0);
    assert_eq!(reports(&c, "poll").await, 0.0);
    assert_eq!(pushed(&c, "taken").await, 4.0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_malformed_reports_are_refused_and_change_nothing() {
    let c = Cluster::builder()
        .tune(|j| {
            j.fallback_poll = Duration::from_secs(600);
        })
        .start()
        .await;
    let ok = serde_json::to_string(&report("j-1.f.0.1", RunStatus::Succeeded)).unwrap();
    // Nobody waits for an unknown run.
    assert_eq!(
        push(&c, "a-1", "j-1.f.0.1", Some(TOKEN), ok.clone()).await,
        404
    );
    // No token, a wrong one.
    assert_eq!(push(&c, "a-1", "j-1.f.0.1", None, ok.clone()).await, 401);
    assert_eq!(
        push(
            &c,
            "a-1",
            "j-1.f.0.1",
            Some("wrong-token-0123456789"),
            ok.clone()
        )
        .await,
        401
    );
    // Malformed bodies are 400s, never a panic.
    for bad in [
        "",
        "{",
        "[]",
        "null",
        r#"{"run_id": "j-1.f.0.1"}"#,
        r#"{"run_id": "j-1.f.0.1", "status": "exploded"}"#,
        r#"{"run_id": 7, "status": "succeeded"}"#,
    ] {
        assert_eq!(
            push(&c, "a-1", "j-1.f.0.1", Some(TOKEN), bad.into()).await,
            400,
            "{bad:?}"
        );
    }
    assert_eq!(
        push(&c, "not an id", "x", Some(TOKEN), ok.clone()).await,
        400
    );

    c.apply(SLOW).await;
    let job = c.submit(json!({ "dag": "slow", "policy": "remote" })).await;
    let run_id = format!("{job}.nap.0.1");
    // Which agent runs it: the one that knows the run.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (runner, other) = loop {
        let mut found = None;
        for (i, a) in c.agents.iter().enumerate() {
            let (status, text) = c
                .get_text(&format!("{}/v1/runs/{run_id}", a.url()), Some(TOKEN))
                .await;
            if status == 200 {
                let r: RunReport = serde_json::from_str(&text).unwrap();
                assert_eq!(r.status, RunStatus::Running, "the lambda sleeps 1.5 s");
                found = Some(i);
            }
        }
        if let Some(i) = found {
            break (
                c.agents[i].state.config.id.clone(),
                c.agents[1 - i].state.config.id.clone(),
            );
        }
        assert!(Instant::now() < deadline, "run {run_id} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let forged = serde_json::to_string(&report(&run_id, RunStatus::Succeeded)).unwrap();
    // From an agent the run was not sent to.
    assert_eq!(
        push(&c, &other, &run_id, Some(TOKEN), forged.clone()).await,
        403
    );
    // A stale (or future) attempt, another job.
    let stale = format!("{job}.nap.0.2");
    let body = serde_json::to_string(&report(&stale, RunStatus::Failed)).unwrap();
    assert_eq!(push(&c, &runner, &stale, Some(TOKEN), body).await, 404);
    let foreign = "j-0000000000000000.nap.0.1";
    let body = serde_json::to_string(&report(foreign, RunStatus::Failed)).unwrap();
    assert_eq!(push(&c, &runner, foreign, Some(TOKEN), body).await, 404);
    // The body names another run than the path; a run still going is no report.
    assert_eq!(
        push(&c, &runner, &run_id, Some(TOKEN), ok.clone()).await,
        400
    );
    let running = serde_json::to_string(&report(&run_id, RunStatus::Running)).unwrap();
    assert_eq!(push(&c, &runner, &run_id, Some(TOKEN), running).await, 400);

    // The job is unaffected: it ends on the agent's own push, with the real log.
    let s: JobSummary = c.wait(&job).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
    let logs = c.get_json(&format!("/v1/jobs/{job}/logs")).await;
    let text = logs.to_string();
    assert!(!text.contains("forged"), "{text}");
    assert!(text.contains("sleep_ms=1500"), "{text}");
    // The run reported: a late push of it finds nobody.
    assert_eq!(push(&c, &runner, &run_id, Some(TOKEN), forged).await, 404);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_push_costs_the_fallback_poll_not_the_job() {
    // The agents are told to push where every connection is dropped unanswered. The port stays
    // bound for the whole test (a port closed at once could be given to another test's
    // control plane, which would then answer the pushes).
    let dropper = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}", dropper.local_addr().unwrap());
    let dropping = tokio::spawn(async move {
        loop {
            if let Ok((conn, _)) = dropper.accept().await {
                drop(conn);
            }
        }
    });
    let c = Cluster::builder()
        .tune(move |j| {
            j.report_url = Some(dead.clone());
            j.fallback_poll = Duration::from_millis(200);
        })
        .start()
        .await;
    c.apply(DAG).await;
    let id = c.submit_sized(Some("remote"), 2048).await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
    assert_eq!(reports(&c, "push").await, 0.0);
    // Every instance's report was read by the slow poll: one per attempt that ended (an
    // attempt is retried only when a starved machine makes one fail, which the summary says).
    let attempts: u32 = s.functions.iter().map(|f| f.attempts).sum();
    let polled = reports(&c, "poll").await;
    assert!(
        (4.0..=f64::from(attempts)).contains(&polled),
        "{polled} reports polled for 4 instances, {attempts} attempts: {s:?}"
    );
    // The agents gave up on their pushes (each after its retries) or are still retrying.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let failed = pushed(&c, "failed").await;
        if failed >= polled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agents never gave up: {failed} pushes failed, {} taken, {} refused",
            pushed(&c, "taken").await,
            pushed(&c, "refused").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(pushed(&c, "taken").await, 0.0);
    assert_eq!(pushed(&c, "refused").await, 0.0);
    dropping.abort();
    c.stop().await;
}

/// Not a test: the latency of one-instance no-op jobs with pushed reports and with the old
/// polling, printed (`cargo test -p sonic-control --test it -- --ignored --nocapture push::`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn measure_noop_job_latency() {
    for push_reports in [false, true] {
        let c = Cluster::builder()
            .tune(move |j| j.push_reports = push_reports)
            .start()
            .await;
        c.apply(NOOP).await;
        let mut latencies = Vec::new();
        let mut walls = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            let id = c.submit(json!({ "dag": "noop", "policy": "remote" })).await;
            let s = wait_fast(&c, &id).await;
            walls.push(t.elapsed().as_secs_f64());
            assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
            latencies.push(s.latency_s);
        }
        latencies.sort_by(f64::total_cmp);
        walls.sort_by(f64::total_cmp);
        let mid = latencies.len() / 2;
        println!(
            "push_reports={push_reports}: 30 one-instance no-op jobs, job latency p50 {:.1} ms \
             (min {:.1}, max {:.1}); submit to ended seen p50 {:.1} ms",
            latencies[mid] * 1e3,
            latencies[0] * 1e3,
            latencies[latencies.len() - 1] * 1e3,
            walls[mid] * 1e3
        );
        c.stop().await;
    }
}

/// Polls the job every 2 ms (the support's wait polls every 50 ms, too coarse to measure).
async fn wait_fast(c: &Cluster, id: &str) -> JobSummary {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = c.get_json(&format!("/v1/jobs/{id}")).await;
        let s: JobSummary = serde_json::from_value(v).expect("summary");
        if s.status.is_terminal() {
            return s;
        }
        assert!(Instant::now() < deadline, "job {id} did not end");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
