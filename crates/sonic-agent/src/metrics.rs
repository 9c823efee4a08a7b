//! The agent's metrics (`GET /metrics` with the control plane's token, Prometheus text format):
//! runs, cold and hot starts, data passing per method, capacity in use, warm environments,
//! bandwidth measured against nominal, store retries.
//!
//! One [`Registry`] per agent (several agents may share a process under `ofctl up`). Every name
//! is documented in docs/api.md; labels come from fixed sets (statuses, methods, directions).

use sonic_api::agent::{RunReport, RunStatus};
use sonic_daemon::metrics::{Desc, Registry, SECONDS_BUCKETS};

use crate::server::AgentState;

pub const RUNS: Desc = Desc::counter(
    "sonic_agent_runs_total",
    "Runs (instance attempts) that ended on this agent, by status.",
    &["status"],
);
pub const STARTS: Desc = Desc::counter(
    "sonic_agent_instances_started_total",
    "Instances started in the sandbox, by start (cold: a new container or process environment; hot: a warm one).",
    &["start"],
);
pub const RUN_SECONDS: Desc = Desc::histogram(
    "sonic_agent_run_duration_seconds",
    "Time in the sandbox per instance, start included, by start.",
    &["start"],
    SECONDS_BUCKETS,
);
pub const START_SECONDS: Desc = Desc::histogram(
    "sonic_agent_start_latency_seconds",
    "Time from the request to the sandbox until the lambda's command started, by start.",
    &["start"],
    SECONDS_BUCKETS,
);
pub const PASSING_BYTES: Desc = Desc::counter(
    "sonic_agent_data_passing_bytes_total",
    "Bytes moved by data passing, by method and direction (in: inputs staged for an instance; out: outputs uploaded to the store).",
    &["method", "direction"],
);
pub const PASSING_SECONDS: Desc = Desc::counter(
    "sonic_agent_data_passing_seconds_total",
    "Seconds spent on data passing (summed over files), by method and direction.",
    &["method", "direction"],
);
pub const RUNNING: Desc = Desc::gauge(
    "sonic_agent_running_instances",
    "Instances running in the sandbox now.",
    &[],
);
pub const VCPUS: Desc = Desc::gauge(
    "sonic_agent_vcpus",
    "vCPUs of the VM type this agent stands for.",
    &[],
);
pub const IN_USE: Desc = Desc::gauge(
    "sonic_agent_capacity_in_use_ratio",
    "Running instances per vCPU.",
    &[],
);
pub const WARM: Desc = Desc::gauge(
    "sonic_agent_warm_environments",
    "Warm containers (or process environments) idle and kept for reuse; absent when the sandbox does not know.",
    &[],
);
pub const PREWARMED: Desc = Desc::counter(
    "sonic_agent_prewarmed_total",
    "Containers (or process environments) started ahead of their runs by POST /v1/prewarm (state started), and those a run then took (state used); absent when the sandbox does not prewarm.",
    &["state"],
);
pub const BANDWIDTH: Desc = Desc::gauge(
    "sonic_agent_bandwidth_bytes_per_second",
    "Measured bandwidth (moving average over completed transfers), by direction; absent before the first transfer.",
    &["direction"],
);
pub const NOMINAL: Desc = Desc::gauge(
    "sonic_agent_nominal_bandwidth_bytes_per_second",
    "The VM type's nominal bandwidth (the agent's limit); absent when unlimited.",
    &[],
);
pub const STORE_RETRIES: Desc = Desc::counter(
    "sonic_agent_store_retries_total",
    "Object-store operations of this agent tried again during an outage.",
    &[],
);

pub const REPORTS_PUSHED: Desc = Desc::counter(
    "sonic_agent_reports_pushed_total",
    "Run reports pushed to the control plane when a run ended, by outcome (taken; refused: a 4xx, the control plane waits for no such run; failed: unreachable after the retries, the control plane's slow poll finds the report).",
    &["outcome"],
);

const FAMILIES: &[Desc] = &[
    RUNS,
    REPORTS_PUSHED,
    STARTS,
    RUN_SECONDS,
    START_SECONDS,
    PASSING_BYTES,
    PASSING_SECONDS,
    RUNNING,
    VCPUS,
    IN_USE,
    WARM,
    PREWARMED,
    BANDWIDTH,
    NOMINAL,
    STORE_RETRIES,
];

/// The agent's metrics.
#[derive(Debug)]
pub struct AgentMetrics {
    reg: Registry,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let reg = Registry::new(FAMILIES);
        for m in ["vm-storage", "direct", "remote"] {
            reg.touch(&PASSING_BYTES, &[m, "in"]);
            reg.touch(&PASSING_SECONDS, &[m, "in"]);
        }
        reg.touch(&PASSING_BYTES, &["remote", "out"]);
        reg.touch(&PASSING_SECONDS, &["remote", "out"]);
        for s in ["cold", "hot"] {
            reg.touch(&STARTS, &[s]);
        }
        for o in PUSH_OUTCOMES {
            reg.touch(&REPORTS_PUSHED, &[o]);
        }
        AgentMetrics { reg }
    }
}

fn status_name(s: &RunStatus) -> &'static str {
    match s {
        RunStatus::Running => "running",
        RunStatus::Succeeded => "succeeded",
        RunStatus::Failed => "failed",
        RunStatus::OutOfMemory => "out_of_memory",
        RunStatus::TimedOut => "timed_out",
        RunStatus::Error => "error",
        RunStatus::DiskFull => "disk_full",
        RunStatus::Unrunnable => "unrunnable",
    }
}

/// What became of a pushed report: `REPORTS_PUSHED`'s labels.
const PUSH_OUTCOMES: [&str; 3] = ["taken", "refused", "failed"];

impl AgentMetrics {
    pub fn registry(&self) -> &Registry {
        &self.reg
    }

    /// A run's report was pushed to the control plane (or given up on).
    pub fn report_pushed(&self, outcome: &crate::register::PushOutcome) {
        let label = match outcome {
            crate::register::PushOutcome::Taken => PUSH_OUTCOMES[0],
            crate::register::PushOutcome::Refused(_) => PUSH_OUTCOMES[1],
            crate::register::PushOutcome::Failed(_) => PUSH_OUTCOMES[2],
        };
        self.reg.inc(&REPORTS_PUSHED, &[label]);
    }

    /// A run ended with this report.
    pub fn run_ended(&self, r: &RunReport) {
        let r_ = &self.reg;
        r_.inc(&RUNS, &[status_name(&r.status)]);
        if let Some(cold) = r.cold {
            let start = if cold { "cold" } else { "hot" };
            r_.inc(&STARTS, &[start]);
            if let Some(s) = r.seconds {
                r_.observe(&RUN_SECONDS, &[start], s);
            }
            if let Some(s) = r.start_latency_s {
                r_.observe(&START_SECONDS, &[start], s);
            }
        }
        for s in &r.staged {
            r_.add(&PASSING_BYTES, &[s.method.as_str(), "in"], s.bytes as f64);
            r_.add(&PASSING_SECONDS, &[s.method.as_str(), "in"], s.seconds);
        }
        for o in &r.outputs {
            if let Some(secs) = o.upload_seconds {
                r_.add(&PASSING_BYTES, &["remote", "out"], o.size as f64);
                r_.add(&PASSING_SECONDS, &["remote", "out"], secs);
            }
        }
    }

    /// The whole exposition, with the gauges read from the agent now.
    pub fn render(&self, state: &AgentState) -> String {
        let r = &self.reg;
        let running = f64::from(state.running.load(std::sync::atomic::Ordering::SeqCst));
        let vcpus = f64::from(state.config.vcpus);
        r.set(&RUNNING, &[], running);
        r.set(&VCPUS, &[], vcpus);
        r.set(
            &IN_USE,
            &[],
            if vcpus > 0.0 { running / vcpus } else { 0.0 },
        );
        r.clear(&WARM);
        if let Some(w) = state.sandbox.warm() {
            r.set(&WARM, &[], w as f64);
        }
        r.clear(&PREWARMED);
        if let Some(p) = state.sandbox.prewarm_stats() {
            r.set(&PREWARMED, &["started"], p.started as f64);
            r.set(&PREWARMED, &["used"], p.used as f64);
        }
        let bw = state.meter.report();
        r.clear(&BANDWIDTH);
        for (direction, v) in [("egress", bw.egress_bps), ("ingress", bw.ingress_bps)] {
            if let Some(v) = v {
                r.set(&BANDWIDTH, &[direction], v);
            }
        }
        r.clear(&NOMINAL);
        if let Some(mbps) = state.config.network_mbps {
            r.set(&NOMINAL, &[], crate::throttle::mbps_to_bytes_per_sec(mbps));
        }
        let retries = state.store.as_ref().map_or(0, |s| s.retries());
        r.set(&STORE_RETRIES, &[], retries as f64);
        r.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_api::agent::{OutputFile, StagedInput};

    #[test]
    fn a_report_moves_its_series() {
        let m = AgentMetrics::default();
        let report = RunReport {
            cpus: None,
            run_id: "j-1.f.0.1".into(),
            status: RunStatus::Succeeded,
            cold: Some(true),
            seconds: Some(0.5),
            start_latency_s: Some(0.1),
            start_contention: None,
            setup_s: None,
            warm: None,
            peak_memory_mb: None,
            exit_code: Some(0),
            error: None,
            staged: vec![StagedInput {
                dest: "gen/0/x".into(),
                method: sonic_core::model::Method::Direct,
                bytes: 100,
                seconds: 0.25,
                fetched: true,
            }],
            outputs: vec![OutputFile {
                file_path: "f/0/result/x".into(),
                to: "result".into(),
                name: "x".into(),
                size: 40,
                checksum: String::new(),
                key: Some("jobs/j-1/result/x".into()),
                upload_seconds: Some(0.125),
                in_memory: false,
                spilled: None,
            }],
            log: String::new(),
        };
        m.run_ended(&report);
        let r = m.registry();
        assert_eq!(r.value(&RUNS, &["succeeded"]), 1.0);
        assert_eq!(r.value(&STARTS, &["cold"]), 1.0);
        assert_eq!(r.value(&STARTS, &["hot"]), 0.0);
        assert_eq!(r.value(&PASSING_BYTES, &["direct", "in"]), 100.0);
        assert_eq!(r.value(&PASSING_SECONDS, &["direct", "in"]), 0.25);
        assert_eq!(r.value(&PASSING_BYTES, &["remote", "out"]), 40.0);
        assert_eq!(r.value(&RUN_SECONDS, &["cold"]), 1.0);
    }
}
