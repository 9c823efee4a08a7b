//! Observability on a cluster in this process: both `/metrics` endpoints (the control plane's
//! and every agent's) move when jobs run, profiling and planned.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{Cluster, DAG, TOKEN};
use sonic_api::control::{JobMode, JobStatus};
use sonic_core::regression::Convergence;
use sonic_daemon::metrics::sample;

fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
}

/// The sum of every sample of `name` (over all its label values).
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_metrics_endpoints_move_when_jobs_run() {
    // Lambda times of milliseconds are noise: the samples converge the models here.
    let c = Cluster::start(Convergence {
        max_mape: 1000.0,
        min_samples: 3,
        ..Convergence::default()
    })
    .await;
    c.apply(DAG).await;
    let control_metrics = format!("{}/metrics", c.url());

    // Before any job: every family is there, at zero.
    let (status, before) = c.get_text(&control_metrics, Some(TOKEN)).await;
    assert_eq!(status, 200);
    for name in [
        "sonic_jobs_ended_total",
        "sonic_data_passing_bytes_total",
        "sonic_instances_queued",
        "sonic_store_retries_total",
        "sonic_planning_seconds",
        "sonic_prediction_error_ratio",
    ] {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} undeclared"
        );
    }
    assert_eq!(total(&before, "sonic_jobs_ended_total"), 0.0);
    assert_eq!(
        value(&before, "sonic_cluster_vcpus", &[("vm_type", "m5.xlarge")]),
        4.0
    );

    // Three profiling jobs, then a planned one.
    let mut instances = 0;
    for n in [20_000, 60_000, 100_000] {
        let id = c.submit_sized(None, n).await;
        let s = c.wait(&id).await;
        assert_eq!(
            (s.status, s.mode),
            (JobStatus::Succeeded, JobMode::Profiling),
            "{s:?}"
        );
        instances += s.functions.len();
    }
    let id = c.submit_sized(None, 80_000).await;
    let planned = c.wait(&id).await;
    assert_eq!(
        (planned.status, planned.mode, planned.policy.as_str()),
        (JobStatus::Succeeded, JobMode::Planned, "sonic"),
        "{planned:?}"
    );
    instances += planned.functions.len();

    let (_, text) = c.get_text(&control_metrics, Some(TOKEN)).await;
    let jobs = |name: &str, labels: &[(&str, &str)]| value(&text, name, labels);
    assert_eq!(
        jobs(
            "sonic_jobs_submitted_total",
            &[("policy", "remote"), ("mode", "profiling")]
        ),
        3.0
    );
    assert_eq!(
        jobs(
            "sonic_jobs_submitted_total",
            &[("policy", "sonic"), ("mode", "planned")]
        ),
        1.0
    );
    assert_eq!(
        jobs(
            "sonic_jobs_ended_total",
            &[("status", "succeeded"), ("policy", "remote")]
        ),
        3.0
    );
    assert_eq!(
        jobs(
            "sonic_jobs_ended_total",
            &[("status", "succeeded"), ("policy", "sonic")]
        ),
        1.0
    );
    assert_eq!(jobs("sonic_jobs", &[("status", "running")]), 0.0);
    assert_eq!(
        jobs(
            "sonic_job_duration_seconds_count",
            &[("dag", "fan"), ("policy", "remote")]
        ),
        3.0
    );
    for f in ["gen", "mid", "sink"] {
        assert_eq!(
            jobs(
                "sonic_stage_duration_seconds_count",
                &[("dag", "fan"), ("function", f)]
            ),
            4.0,
            "{f}"
        );
    }
    assert_eq!(
        total(&text, "sonic_instances_started_total"),
        instances as f64
    );
    assert!(jobs("sonic_instances_started_total", &[("start", "cold")]) > 0.0);
    assert!(jobs("sonic_data_passing_bytes_total", &[("method", "remote")]) > 0.0);
    assert!(jobs("sonic_data_passing_seconds_total", &[("method", "remote")]) > 0.0);
    assert_eq!(
        jobs("sonic_planning_seconds_count", &[("policy", "sonic")]),
        1.0
    );
    assert_eq!(
        jobs(
            "sonic_prediction_error_ratio_count",
            &[("quantity", "latency")]
        ),
        1.0
    );
    assert_eq!(
        jobs(
            "sonic_prediction_error_ratio_count",
            &[("quantity", "cost")]
        ),
        1.0
    );
    assert_eq!(jobs("sonic_instances_queued", &[]), 0.0);
    assert_eq!(jobs("sonic_store_retries_total", &[]), 0.0);
    assert!(
        jobs(
            "sonic_http_requests_total",
            &[("route", "/v1/jobs"), ("status", "202")]
        ) >= 4.0
    );
    // Bounded labels: no job id anywhere.
    assert!(!text.contains("j-"), "a job id became a label:\n{text}");

    // Every agent: its runs, cold and hot starts, data passing, capacity; only with the token.
    let mut runs = 0.0;
    let mut starts = 0.0;
    let mut staged = 0.0;
    for a in &c.agents {
        let url = format!("{}/metrics", a.url());
        let (status, _) = c.get_text(&url, None).await;
        assert_eq!(status, 401, "agent metrics without the token");
        let (status, _) = c.get_text(&url, Some("wrong-token-0123456789")).await;
        assert_eq!(status, 401);
        let (status, t) = c.get_text(&url, Some(TOKEN)).await;
        assert_eq!(status, 200);
        runs += value(&t, "sonic_agent_runs_total", &[("status", "succeeded")]);
        starts += total(&t, "sonic_agent_instances_started_total");
        staged += total(&t, "sonic_agent_data_passing_bytes_total");
        assert_eq!(
            value(&t, "sonic_agent_vcpus", &[]),
            f64::from(a.state.config.vcpus)
        );
        assert_eq!(value(&t, "sonic_agent_running_instances", &[]), 0.0);
        assert_eq!(value(&t, "sonic_agent_capacity_in_use_ratio", &[]), 0.0);
        assert!(value(&t, "sonic_agent_nominal_bandwidth_bytes_per_second", &[]) > 0.0);
        assert!(value(&t, "sonic_agent_warm_environments", &[]) >= 0.0);
        assert_eq!(value(&t, "sonic_agent_store_retries_total", &[]), 0.0);
        assert!(value(&t, "sonic_agent_run_duration_seconds_count", &[]) > 0.0);
        assert!(!t.contains("j-"), "a job id became a label:\n{t}");
    }
    assert_eq!(runs, instances as f64, "every instance ran once");
    assert_eq!(starts, instances as f64);
    assert!(staged > 0.0);
    c.stop().await;
}
