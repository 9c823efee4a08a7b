//! The control plane's metrics (`GET /metrics`, Prometheus text format): requests and their
//! time, jobs, stages, instances, data passing, planning, prediction error, queue, cluster
//! capacity, store retries.
//!
//! Built on [`sonic_daemon::metrics::Registry`] (one per control plane, so that `ofctl up`'s
//! agents in the same process keep their own). Every name is documented in docs/api.md. Label
//! values come from bounded sets: route templates, statuses, policies, modes, methods, VM types,
//! and DAG and function names (as many as the DAGs applied); never a job id or a raw path.

use std::collections::BTreeMap;

use sonic_api::control::{JobStatus, JobSummary};
use sonic_daemon::metrics::{Desc, RATIO_BUCKETS, Registry, SECONDS_BUCKETS};

pub use sonic_daemon::metrics::CONTENT_TYPE;

/// The `sonic_http_requests_total` counter: HTTP requests answered, by method, route template and status.
pub const HTTP_REQUESTS: Desc = Desc::counter(
    "sonic_http_requests_total",
    "HTTP requests answered, by method, route template and status.",
    &["method", "route", "status"],
);
/// Bucket bounds for the time the control plane takes to answer a request, in seconds.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// The `sonic_http_request_duration_seconds` histogram: time from a request's routing to its
/// response's head, by method and route template.
pub const HTTP_REQUEST_SECONDS: Desc = Desc::histogram(
    "sonic_http_request_duration_seconds",
    "Time from a request's routing to its response's head (a streamed body not included), by method and route template.",
    &["method", "route"],
    REQUEST_BUCKETS,
);
/// The `sonic_dags` gauge: DAGs registered.
pub const DAGS: Desc = Desc::gauge("sonic_dags", "DAGs registered.", &[]);
/// The `sonic_agents` gauge: Agents registered, by liveness.
pub const AGENTS: Desc = Desc::gauge(
    "sonic_agents",
    "Agents registered, by liveness.",
    &["state"],
);
/// The `sonic_jobs` gauge: Jobs this control plane is executing now, by status (queued, running).
pub const JOBS: Desc = Desc::gauge(
    "sonic_jobs",
    "Jobs this control plane is executing now, by status (queued, running).",
    &["status"],
);
/// The `sonic_jobs_submitted_total` counter: Jobs accepted, by policy and mode.
pub const JOBS_SUBMITTED: Desc = Desc::counter(
    "sonic_jobs_submitted_total",
    "Jobs accepted, by policy and mode.",
    &["policy", "mode"],
);
/// The `sonic_jobs_ended_total` counter: Jobs that ended, by status (succeeded, failed) and policy.
pub const JOBS_ENDED: Desc = Desc::counter(
    "sonic_jobs_ended_total",
    "Jobs that ended, by status (succeeded, failed) and policy.",
    &["status", "policy"],
);
/// The `sonic_job_duration_seconds` histogram: Latency of the jobs that succeeded, from start to end, by DAG and policy.
pub const JOB_SECONDS: Desc = Desc::histogram(
    "sonic_job_duration_seconds",
    "Latency of the jobs that succeeded, from start to end, by DAG and policy.",
    &["dag", "policy"],
    SECONDS_BUCKETS,
);
/// The `sonic_stage_duration_seconds` histogram: Latency of the stages that succeeded, from their first instance sent to their last one ended, by DAG and function.
pub const STAGE_SECONDS: Desc = Desc::histogram(
    "sonic_stage_duration_seconds",
    "Latency of the stages that succeeded, from their first instance sent to their last one ended, by DAG and function.",
    &["dag", "function"],
    SECONDS_BUCKETS,
);
/// The `sonic_instances_started_total` counter: Instances that ran to a report in jobs that ended, by start (cold: a new container or process environment; hot: a warm one) and VM type.
pub const INSTANCES_STARTED: Desc = Desc::counter(
    "sonic_instances_started_total",
    "Instances that ran to a report in jobs that ended, by start (cold: a new container or process environment; hot: a warm one) and VM type.",
    &["start", "vm_type"],
);
/// The `sonic_data_passing_bytes_total` counter: Bytes the receivers of an edge staged, by the edge's data-passing method, in jobs that ended.
pub const PASSING_BYTES: Desc = Desc::counter(
    "sonic_data_passing_bytes_total",
    "Bytes the receivers of an edge staged, by the edge's data-passing method, in jobs that ended.",
    &["method"],
);
/// The `sonic_data_passing_seconds_total` counter: Seconds of data passing per edge (the slowest receiving instance's staging), by method, in jobs that ended.
pub const PASSING_SECONDS: Desc = Desc::counter(
    "sonic_data_passing_seconds_total",
    "Seconds of data passing per edge (the slowest receiving instance's staging), by method, in jobs that ended.",
    &["method"],
);
/// The `sonic_planning_seconds` histogram: Time the planner took for a planned job at submission, by policy.
pub const PLANNING_SECONDS: Desc = Desc::histogram(
    "sonic_planning_seconds",
    "Time the planner took for a planned job at submission, by policy.",
    &["policy"],
    &[
        0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
    ],
);
/// The `sonic_prediction_error_ratio` histogram: Relative error of the plan's prediction, |predicted - measured| / measured, of planned jobs that succeeded, by quantity (latency, cost).
pub const PREDICTION_ERROR: Desc = Desc::histogram(
    "sonic_prediction_error_ratio",
    "Relative error of the plan's prediction, |predicted - measured| / measured, of planned jobs that succeeded, by quantity (latency, cost).",
    &["quantity"],
    RATIO_BUCKETS,
);
/// The `sonic_instances_queued` gauge: Instances waiting for a concurrency slot on their agent (the plan's concurrency, or one per vCPU).
pub const INSTANCES_QUEUED: Desc = Desc::gauge(
    "sonic_instances_queued",
    "Instances waiting for a concurrency slot on their agent (the plan's concurrency, or one per vCPU).",
    &[],
);
/// The `sonic_cluster_running_instances` gauge: Instances running on the alive agents (their last heartbeats), by VM type.
pub const CLUSTER_RUNNING: Desc = Desc::gauge(
    "sonic_cluster_running_instances",
    "Instances running on the alive agents (their last heartbeats), by VM type.",
    &["vm_type"],
);
/// The `sonic_cluster_vcpus` gauge: vCPUs of the alive agents, by VM type.
pub const CLUSTER_VCPUS: Desc = Desc::gauge(
    "sonic_cluster_vcpus",
    "vCPUs of the alive agents, by VM type.",
    &["vm_type"],
);
/// The `sonic_store_retries_total` counter: Object-store operations of the control plane tried again during an outage.
pub const STORE_RETRIES: Desc = Desc::counter(
    "sonic_store_retries_total",
    "Object-store operations of the control plane tried again during an outage.",
    &[],
);

/// The `sonic_run_reports_total` counter: Run reports the executor received, by how (push: the agent posted it when the run ended; poll: the executor read it, the fallback when a push is lost).
pub const RUN_REPORTS: Desc = Desc::counter(
    "sonic_run_reports_total",
    "Run reports the executor received, by how (push: the agent posted it when the run ended; poll: the executor read it, the fallback when a push is lost).",
    &["via"],
);

const FAMILIES: &[Desc] = &[
    HTTP_REQUESTS,
    HTTP_REQUEST_SECONDS,
    DAGS,
    AGENTS,
    JOBS,
    JOBS_SUBMITTED,
    JOBS_ENDED,
    JOB_SECONDS,
    STAGE_SECONDS,
    INSTANCES_STARTED,
    PASSING_BYTES,
    PASSING_SECONDS,
    PLANNING_SECONDS,
    PREDICTION_ERROR,
    INSTANCES_QUEUED,
    CLUSTER_RUNNING,
    CLUSTER_VCPUS,
    STORE_RETRIES,
    RUN_REPORTS,
];

/// The data-passing methods, shown from the first scrape.
const METHODS: [&str; 3] = ["vm-storage", "direct", "remote"];

/// The control plane's metrics.
#[derive(Debug)]
pub struct Metrics {
    reg: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let reg = Registry::new(FAMILIES);
        for m in METHODS {
            reg.touch(&PASSING_BYTES, &[m]);
            reg.touch(&PASSING_SECONDS, &[m]);
        }
        for s in ["succeeded", "failed"] {
            for p in sonic_core::planner::Policy::ALL {
                reg.touch(&JOBS_ENDED, &[s, p.as_str()]);
            }
        }
        for s in ["queued", "running"] {
            reg.touch(&JOBS, &[s]);
        }
        for via in ["push", "poll"] {
            reg.touch(&RUN_REPORTS, &[via]);
        }
        Metrics { reg }
    }
}

/// Values read at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
    /// DAGs registered.
    pub dags: u64,
    /// Agents alive.
    pub agents_alive: u64,
    /// Agents registered but not heard from within the heartbeat timeout.
    pub agents_dead: u64,
    /// Jobs this control plane executes that wait for resources.
    pub jobs_queued: u64,
    /// Jobs this control plane executes that run.
    pub jobs_running: u64,
    /// Per VM type of the alive agents: instances running, vCPUs.
    pub capacity: BTreeMap<String, (u64, u64)>,
    /// The control plane's object store's retries so far.
    pub store_retries: u64,
}

/// Counts one instance waiting for a concurrency slot while it lives.
#[derive(Debug)]
pub struct Waiting<'a>(&'a Registry);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.add(&INSTANCES_QUEUED, &[], -1.0);
    }
}

impl Metrics {
    /// The registry, to read a series back (tests, the dashboard).
    pub fn registry(&self) -> &Registry {
        &self.reg
    }

    /// Counts one answered request. `route` must be a route template (or a fixed word), never the
    /// raw path: raw paths would grow one series per URL a client invents.
    pub fn count_request(&self, method: &str, route: &str, status: u16) {
        self.reg
            .inc(&HTTP_REQUESTS, &[method, route, &status.to_string()]);
    }

    /// Records how long a request took to answer (its response's head), in seconds; `route`
    /// as in [`Metrics::count_request`].
    pub fn request_took(&self, method: &str, route: &str, seconds: f64) {
        self.reg
            .observe(&HTTP_REQUEST_SECONDS, &[method, route], seconds);
    }

    /// How many requests were counted for this method, route and status.
    pub fn requests(&self, method: &str, route: &str, status: u16) -> u64 {
        self.reg
            .value(&HTTP_REQUESTS, &[method, route, &status.to_string()]) as u64
    }

    /// A run's report came to the executor, `via` `push` or `poll`.
    pub fn report_received(&self, via: &'static str) {
        self.reg.inc(&RUN_REPORTS, &[via]);
    }

    /// A job was accepted.
    pub fn job_submitted(&self, policy: &str, mode: &str) {
        self.reg.inc(&JOBS_SUBMITTED, &[policy, mode]);
    }

    /// A job was planned at submission, in `seconds` of planner time.
    pub fn planned(&self, policy: &str, seconds: f64) {
        self.reg.observe(&PLANNING_SECONDS, &[policy], seconds);
    }

    /// A stage of a job succeeded after `seconds`.
    pub fn stage_ended(&self, dag: &str, function: &str, seconds: f64) {
        self.reg.observe(&STAGE_SECONDS, &[dag, function], seconds);
    }

    /// One instance waits for a concurrency slot until the guard is dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        self.reg.add(&INSTANCES_QUEUED, &[], 1.0);
        Waiting(&self.reg)
    }

    /// A job ended: its status, latency, instances, edges and, for a planned job that succeeded,
    /// how far the plan's prediction was from what it measured.
    pub fn job_ended(&self, s: &JobSummary) {
        let policy = s.policy.as_str();
        self.reg.inc(&JOBS_ENDED, &[s.status.as_str(), policy]);
        for f in &s.functions {
            let start = if f.cold { "cold" } else { "hot" };
            self.reg.inc(&INSTANCES_STARTED, &[start, &f.vm_type]);
        }
        for e in &s.edges {
            self.reg
                .add(&PASSING_BYTES, &[e.method.as_str()], e.bytes as f64);
            self.reg
                .add(&PASSING_SECONDS, &[e.method.as_str()], e.seconds);
        }
        if s.status != JobStatus::Succeeded {
            return;
        }
        self.reg
            .observe(&JOB_SECONDS, &[&s.dag, policy], s.latency_s);
        let predicted = s
            .plan
            .as_ref()
            .and_then(|p| p.report.as_ref())
            .map(|r| r.predicted());
        if let Some(p) = predicted {
            for (quantity, measured, pred) in [
                ("latency", s.latency_s, p.latency_s),
                ("cost", s.cost_usd, p.cost_usd),
            ] {
                if measured > 0.0 {
                    self.reg.observe(
                        &PREDICTION_ERROR,
                        &[quantity],
                        (pred - measured).abs() / measured,
                    );
                }
            }
        }
    }

    /// The whole exposition, with the values read at scrape time.
    pub fn render(&self, g: Gauges) -> String {
        let r = &self.reg;
        r.set(&DAGS, &[], g.dags as f64);
        r.set(&AGENTS, &["alive"], g.agents_alive as f64);
        r.set(&AGENTS, &["dead"], g.agents_dead as f64);
        r.set(&JOBS, &["queued"], g.jobs_queued as f64);
        r.set(&JOBS, &["running"], g.jobs_running as f64);
        r.clear(&CLUSTER_RUNNING);
        r.clear(&CLUSTER_VCPUS);
        for (vm_type, (running, vcpus)) in &g.capacity {
            r.set(&CLUSTER_RUNNING, &[vm_type], *running as f64);
            r.set(&CLUSTER_VCPUS, &[vm_type], *vcpus as f64);
        }
        r.set(&STORE_RETRIES, &[], g.store_retries as f64);
        r.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_api::control::{EdgeRun, FunctionRun, JobMode, JobPlan};

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.count_request("GET", "/v1/dags", 200);
        m.count_request("GET", "/v1/dags", 200);
        m.count_request("PUT", "/v1/dags", 400);
        m.count_request("GET", "a\"b\\c\nd", 404);
        assert_eq!(m.requests("GET", "/v1/dags", 200), 2);
        let text = m.render(Gauges {
            dags: 3,
            agents_alive: 1,
            agents_dead: 2,
            capacity: [("m5.large".to_owned(), (1, 2))].into_iter().collect(),
            ..Gauges::default()
        });
        for line in [
            "sonic_http_requests_total{method=\"GET\",route=\"/v1/dags\",status=\"200\"} 2",
            "sonic_http_requests_total{method=\"PUT\",route=\"/v1/dags\",status=\"400\"} 1",
            "sonic_dags 3",
            "sonic_agents{state=\"dead\"} 2",
            "sonic_cluster_vcpus{vm_type=\"m5.large\"} 2",
            "sonic_data_passing_bytes_total{method=\"direct\"} 0",
            "sonic_instances_queued 0",
            "sonic_store_retries_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?}:\n{text}");
        }
        assert!(text.contains("route=\"a\\\"b\\\\c\\nd\""));
    }

    #[test]
    fn a_planned_job_moves_its_series() {
        let m = Metrics::default();
        m.job_submitted("sonic", "planned");
        m.planned("sonic", 0.002);
        m.stage_ended("fan", "gen", 0.5);
        {
            let _w = m.waiting();
            assert_eq!(m.registry().value(&INSTANCES_QUEUED, &[]), 1.0);
        }
        assert_eq!(m.registry().value(&INSTANCES_QUEUED, &[]), 0.0);
        let run = |cold| FunctionRun {
            reused: false,
            cpus: None,
            name: "gen".into(),
            instance: 0,
            agent: "a-1".into(),
            vm_type: "m5.large".into(),
            cold,
            seconds: 1.0,
            start_latency_s: None,
            start_contention: None,
            peak_memory_mb: None,
            attempts: 1,
            started_s: Some(0.0),
            ended_s: Some(1.0),
        };
        let summary = JobSummary { failed_attempts: Vec::new(), on_failure: None, dag_revision: None, bounds_missed: Vec::new(),
            job_id: "j-1".into(),
            dag: "fan".into(),
            status: JobStatus::Succeeded,
            policy: sonic_core::planner::Policy::Sonic,
            mode: JobMode::Planned,
            input_bytes: 10,
            latency_s: 2.0,
            cost_usd: 0.001,
            storage_usd: 0.0,
            requests_usd: 0.0,
            perf_per_dollar: 500.0,
            edges: vec![EdgeRun {
                from: "gen".into(),
                to: "mid".into(),
                method: sonic_core::model::Method::Direct,
                bytes: 1000,
                seconds: 0.25,
            }],
            functions: vec![run(true), run(false), run(false)],
            fetches: vec![],
            outputs: Vec::new(),
            error: None,
            failure: None,
            plan: Some(JobPlan {
                used: sonic_api::control::PlanUsed::Best,
                notes: Vec::new(),
                report: Some(
                    serde_json::from_value(serde_json::json!({
                        "dag": "d", "policy": "sonic", "stages": [], "edges": [],
                        "predicted": {"latency_s": 2.5, "cost_usd": 0.001, "perf_per_dollar": 400.0},
                    }))
                    .expect("a plan report"),
                ),
                stages: Vec::new(),
                exact: None,
            }),
            mode_reason: None,
            slo: None,
            submitted_ms: None,
            started_ms: None,
            ended_ms: None,
        };
        m.job_ended(&summary);
        let r = m.registry();
        assert_eq!(r.value(&JOBS_ENDED, &["succeeded", "sonic"]), 1.0);
        assert_eq!(r.value(&INSTANCES_STARTED, &["cold", "m5.large"]), 1.0);
        assert_eq!(r.value(&INSTANCES_STARTED, &["hot", "m5.large"]), 2.0);
        assert_eq!(r.value(&PASSING_BYTES, &["direct"]), 1000.0);
        assert_eq!(r.value(&PASSING_SECONDS, &["direct"]), 0.25);
        assert_eq!(r.value(&JOB_SECONDS, &["fan", "sonic"]), 1.0);
        assert_eq!(r.value(&PREDICTION_ERROR, &["latency"]), 1.0);
        assert_eq!(r.value(&PREDICTION_ERROR, &["cost"]), 1.0);
        let text = m.render(Gauges::default());
        assert!(
            text.contains(
                "sonic_prediction_error_ratio_bucket{quantity=\"latency\",le=\"0.25\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("sonic_planning_seconds_count{policy=\"sonic\"} 1\n"));
    }
}
