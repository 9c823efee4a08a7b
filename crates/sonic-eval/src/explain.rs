//! Where a job's time went, per stage, predicted against measured; and, for every case where
//! Sonic does not win against the best static policy, which term made the difference. Computed
//! from the job summaries alone (docs/evaluation.md, "Why Sonic does not win").
//!
//! A stage's time is counted from when it was *ready* (its last sender's last instance ended;
//! the job's start for a stage without senders) to its *end* (its last instance's report), in
//! three terms:
//! - **data passing**: fetching its inputs (the summary's per-edge staging time of its slowest
//!   receiver, summed over its incoming edges); the plan's prediction adds the upload to the
//!   store that made the inputs durable (`remote`); a measured upload is inside the sender's
//!   instances and so in the sender's *waiting*;
//! - **compute**: the lambdas' own time (`seconds`) on the busiest agent, at the plan's
//!   concurrency per VM: `max(longest instance, sum of instances / concurrency)` (a lower bound
//!   of the agent's busy time, equal to the model's `cold + (batches - 1) x hot` when every
//!   instance takes as long);
//! - **waiting**: the rest: dispatch after the inputs were ready (admission, scheduling, the
//!   control plane between stages), container starts and uploads outside the lambdas' own
//!   time, instances ending unevenly. The model's waiting is the time its VMs stay busy with an
//!   earlier stage (vm-storage).
//!
//! The job's terms add up its *critical path* (from the last stage to end, back through the
//! sender that ended last) and, in its waiting, the time from the last stage's end to the job's.
//!
//! On a dilated cluster, instants are in emulated time as the bench counts a job's latency
//! ([`super::harness::Clock`]: the control plane's part as measured, the agents' divided by D),
//! durations inside instances (lambda time, staging) divided by D, predictions divided by D.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sonic_api::control::JobSummary;
use sonic_core::planner::StageTiming;

/// One of the three terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    Compute,
    Data,
    Wait,
}

impl Term {
    pub const ALL: [Term; 3] = [Term::Compute, Term::Data, Term::Wait];

    pub fn as_str(self) -> &'static str {
        match self {
            Term::Compute => "compute",
            Term::Data => "data passing",
            Term::Wait => "waiting",
        }
    }
}

/// Seconds in each term.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Terms {
    pub compute_s: f64,
    pub data_s: f64,
    pub wait_s: f64,
}

impl Terms {
    pub fn get(&self, t: Term) -> f64 {
        match t {
            Term::Compute => self.compute_s,
            Term::Data => self.data_s,
            Term::Wait => self.wait_s,
        }
    }

    pub fn total(&self) -> f64 {
        self.compute_s + self.data_s + self.wait_s
    }

    fn add(&mut self, o: &Terms) {
        self.compute_s += o.compute_s;
        self.data_s += o.data_s;
        self.wait_s += o.wait_s;
    }

    fn scaled(&self, k: f64) -> Terms {
        Terms {
            compute_s: self.compute_s * k,
            data_s: self.data_s * k,
            wait_s: self.wait_s * k,
        }
    }
}

/// One stage of one job.
#[derive(Debug, Clone, PartialEq)]
pub struct StageTime {
    pub function: String,
    /// On the measured critical path.
    pub critical: bool,
    /// Measured end (its last instance's report), seconds since the job started.
    pub end_s: f64,
    pub measured: Terms,
    /// What the plan predicted for the stage (`None` without a plan, or from a control plane
    /// whose plans have no `timing`).
    pub predicted: Option<Terms>,
    pub predicted_end_s: Option<f64>,
    /// On the predicted critical path.
    pub predicted_critical: bool,
}

/// One measured job, per stage, in emulated time.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTimes {
    pub experiment: String,
    pub app: String,
    pub variant: String,
    pub policy: String,
    pub job_id: String,
    /// Ran a plan (mode `planned`).
    pub planned: bool,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub predicted_latency_s: Option<f64>,
    pub predicted_cost_usd: Option<f64>,
    /// In topological order.
    pub stages: Vec<StageTime>,
    /// The critical path's terms, the time after the last stage in `wait_s`: they add up to
    /// the latency (up to a negative waiting clamped at 0).
    pub measured: Terms,
    /// The predicted critical path's terms (`None` without a per-stage prediction).
    pub predicted: Option<Terms>,
    pub dilation: f64,
}

/// The job's stages with their predicted and measured terms, every time divided by `dilation`
/// (>= 1); `None` when the summary does not say when its instances ran (a summary recorded
/// before `started_s`/`ended_s` were).
pub fn job_times(
    (experiment, variant, policy): (&str, &str, &str),
    s: &JobSummary,
    dilation: f64,
) -> Option<JobTimes> {
    let d = if dilation.is_finite() && dilation >= 1.0 {
        dilation
    } else {
        1.0
    };
    if s.functions.is_empty() {
        return None;
    }
    // Per function: (first start, last end, per agent: (lambda seconds, instances)).
    struct Acc {
        start: f64,
        end: f64,
        agents: BTreeMap<String, Vec<f64>>,
    }
    // Instants as the bench counts a job's latency on a dilated cluster (the control plane's
    // part as measured, the agents' divided by `d`); durations inside instances divided by `d`.
    let clock = super::harness::Clock::of(s, d)?;
    let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
    for f in &s.functions {
        let (start, end) = (clock.at(f.started_s?), clock.at(f.ended_s?));
        let a = acc.entry(f.name.as_str()).or_insert(Acc {
            start,
            end,
            agents: BTreeMap::new(),
        });
        a.start = a.start.min(start);
        a.end = a.end.max(end);
        a.agents
            .entry(f.agent.clone())
            .or_default()
            .push(f.seconds.max(0.0) / d);
    }
    let senders = |to: &str| -> Vec<&str> {
        s.edges
            .iter()
            .filter(|e| e.to == to && acc.contains_key(e.from.as_str()))
            .map(|e| e.from.as_str())
            .collect()
    };
    let order = topological(acc.keys().copied().collect(), |f| senders(f))?;
    let plan = s.plan.as_ref();
    // Lambdas at once on one agent: the plan's concurrency per VM times the plan's VMs the
    // agent stands for (1 without a plan).
    let concurrency = |function: &str, agent: &str| -> f64 {
        plan.and_then(|p| p.stages.iter().find(|h| h.function == function))
            .map_or(1.0, |h| {
                let vms = h.agents.iter().filter(|a| *a == agent).count().max(1);
                f64::from(h.concurrent.max(1)) * vms as f64
            })
    };
    let predicted: BTreeMap<String, (Terms, f64)> = plan
        .and_then(|p| p.report.as_ref())
        .map(|r| {
            r.plan
                .timing
                .iter()
                .filter_map(|t| predicted_stage(t, d))
                .collect()
        })
        .unwrap_or_default();
    let mut ends: BTreeMap<&str, f64> = BTreeMap::new();
    let mut stages = Vec::new();
    for f in &order {
        let a = &acc[f];
        let ready = senders(f)
            .iter()
            .map(|g| ends.get(g).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        let span = (a.end - ready).max(0.0);
        // A fold from +0 (an empty `sum` of floats is -0, printed "-0.0000").
        let data = s
            .edges
            .iter()
            .filter(|e| e.to == *f)
            .map(|e| e.seconds.max(0.0) / d)
            .fold(0.0, |a, x| a + x);
        let data = data.min(span);
        let compute = a
            .agents
            .iter()
            .map(|(agent, secs)| {
                let longest = secs.iter().copied().fold(0.0, f64::max);
                longest.max(secs.iter().sum::<f64>() / concurrency(f, agent))
            })
            .fold(0.0, f64::max)
            .min(span - data);
        ends.insert(f, a.end);
        let p = predicted.get(*f);
        stages.push(StageTime {
            function: (*f).to_owned(),
            critical: false,
            end_s: a.end,
            measured: Terms {
                compute_s: compute,
                data_s: data,
                wait_s: (span - data - compute).max(0.0),
            },
            predicted: p.map(|x| x.0),
            predicted_end_s: p.map(|x| x.1),
            predicted_critical: false,
        });
    }
    // The critical paths, measured and predicted: back from the stage that ended last.
    let mark = |stages: &mut Vec<StageTime>, end: &dyn Fn(&StageTime) -> Option<f64>, m: bool| {
        let mut at = stages
            .iter()
            .enumerate()
            .filter_map(|(i, x)| Some((i, end(x)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|x| x.0);
        while let Some(i) = at {
            if m {
                stages[i].critical = true;
            } else {
                stages[i].predicted_critical = true;
            }
            let from = senders(&stages[i].function);
            at = stages
                .iter()
                .enumerate()
                .filter(|(_, x)| from.contains(&x.function.as_str()))
                .filter_map(|(j, x)| Some((j, end(x)?)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|x| x.0);
        }
    };
    mark(&mut stages, &|x| Some(x.end_s), true);
    let has_prediction = !stages.is_empty() && stages.iter().all(|x| x.predicted.is_some());
    if has_prediction {
        mark(&mut stages, &|x| x.predicted_end_s, false);
    }
    let e = super::harness::emulated(s, d);
    let latency = e.latency_s;
    let mut measured = Terms::default();
    for x in stages.iter().filter(|x| x.critical) {
        measured.add(&x.measured);
    }
    let last = stages.iter().map(|x| x.end_s).fold(0.0, f64::max);
    measured.wait_s += (latency - last).max(0.0);
    let predicted = has_prediction.then(|| {
        let mut t = Terms::default();
        for x in stages.iter().filter(|x| x.predicted_critical) {
            t.add(&x.predicted.unwrap_or_default());
        }
        t
    });
    Some(JobTimes {
        experiment: experiment.to_owned(),
        app: s.dag.clone(),
        variant: variant.to_owned(),
        policy: policy.to_owned(),
        job_id: s.job_id.clone(),
        planned: s.mode == sonic_api::control::JobMode::Planned,
        latency_s: latency,
        cost_usd: e.cost_usd,
        predicted_latency_s: e.predicted_latency_s,
        predicted_cost_usd: e.predicted_cost_usd,
        stages,
        measured,
        predicted,
        dilation: d,
    })
}

/// A plan's `timing` entry as (function, (terms, end)), divided by `d`; `None` when a figure
/// is not finite.
fn predicted_stage(t: &StageTiming, d: f64) -> Option<(String, (Terms, f64))> {
    let n = |x: f64| x.is_finite().then_some(x / d);
    Some((
        t.function.clone(),
        (
            Terms {
                compute_s: n(t.compute_s)?,
                data_s: n(t.upload_s)? + n(t.fetch_s)?,
                wait_s: n(t.wait_s)?,
            },
            n(t.end_s)?,
        ),
    ))
}

/// Kahn's order of `nodes` given each one's senders (ties by name); `None` on a cycle.
fn topological<'a>(
    nodes: Vec<&'a str>,
    senders: impl Fn(&str) -> Vec<&'a str>,
) -> Option<Vec<&'a str>> {
    let mut out: Vec<&str> = Vec::with_capacity(nodes.len());
    while out.len() < nodes.len() {
        let next = nodes
            .iter()
            .find(|n| !out.contains(n) && senders(n).iter().all(|s| out.contains(s)))?;
        out.push(next);
    }
    Some(out)
}

/// One side of a comparison: a cell's jobs, per stage and in all, averaged.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    pub policy: String,
    pub jobs: usize,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub predicted_latency_s: Option<f64>,
    pub predicted_cost_usd: Option<f64>,
    /// Mean critical-path terms, measured and predicted.
    pub measured: Terms,
    pub predicted: Option<Terms>,
    /// Per stage (topological order of the first job): measured and predicted means.
    pub stages: Vec<(String, Terms, Option<Terms>)>,
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / n as f64)
}

fn mean_terms<'a>(ts: impl Iterator<Item = &'a Terms>) -> Option<Terms> {
    let (n, mut s) = ts.fold((0usize, Terms::default()), |(n, mut s), t| {
        s.add(t);
        (n + 1, s)
    });
    if n == 0 {
        return None;
    }
    s = s.scaled(1.0 / n as f64);
    Some(s)
}

/// The jobs of one cell, averaged; `None` without a job.
pub fn side(policy: &str, jobs: &[&JobTimes]) -> Option<Side> {
    let first = jobs.first()?;
    let stages = first
        .stages
        .iter()
        .map(|st| {
            let of = |j: &&JobTimes| j.stages.iter().find(|x| x.function == st.function).cloned();
            let all: Vec<StageTime> = jobs.iter().filter_map(of).collect();
            (
                st.function.clone(),
                mean_terms(all.iter().map(|x| &x.measured)).unwrap_or_default(),
                mean_terms(all.iter().filter_map(|x| x.predicted.as_ref())),
            )
        })
        .collect();
    Some(Side {
        policy: policy.to_owned(),
        jobs: jobs.len(),
        latency_s: mean(jobs.iter().map(|j| j.latency_s))?,
        cost_usd: mean(jobs.iter().map(|j| j.cost_usd))?,
        predicted_latency_s: mean(jobs.iter().filter_map(|j| j.predicted_latency_s)),
        predicted_cost_usd: mean(jobs.iter().filter_map(|j| j.predicted_cost_usd)),
        measured: mean_terms(jobs.iter().map(|j| &j.measured))?,
        predicted: mean_terms(jobs.iter().filter_map(|j| j.predicted.as_ref())),
        stages,
    })
}

/// Why Sonic did not beat the best static policy in one case, from the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub sonic: Side,
    pub best: Side,
    /// The share of the Perf/$ shortfall (its logarithm) due to latency; the rest is cost.
    /// `None` when Sonic was not behind on either (then nothing is short).
    pub latency_share: Option<f64>,
    /// The term whose measured time, Sonic's minus the best static's, grew the most (seconds,
    /// and the stage of Sonic's plan where that term is largest against the other's same
    /// stage, when both have it); `None` when Sonic was not slower.
    pub deciding: Option<(Term, f64, Option<String>)>,
    /// Where Sonic's own plan missed its prediction most: the term, measured minus predicted
    /// (seconds), and the stage that missed most in it.
    pub sonic_miss: Option<(Term, f64, Option<String>)>,
    /// The same for the best static policy's plan.
    pub best_miss: Option<(Term, f64, Option<String>)>,
}

/// The stage whose `f(stage)` is largest.
fn top_stage(
    stages: &[(String, Terms, Option<Terms>)],
    f: impl Fn(&(String, Terms, Option<Terms>)) -> Option<f64>,
) -> Option<String> {
    stages
        .iter()
        .filter_map(|s| Some((s, f(s)?)))
        .filter(|(_, v)| *v > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, _)| s.0.clone())
}

/// The term where `measured - predicted` is largest in absolute value, and its stage.
fn miss(side: &Side) -> Option<(Term, f64, Option<String>)> {
    let p = side.predicted?;
    let (term, by) = Term::ALL
        .iter()
        .map(|&t| (t, side.measured.get(t) - p.get(t)))
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))?;
    let sign = by.signum();
    let stage = top_stage(&side.stages, |(_, m, p)| {
        Some(sign * (m.get(term) - p.as_ref()?.get(term)))
    });
    Some((term, by, stage))
}

/// Sonic's cell against the best static policy's, from their jobs.
pub fn explain(sonic: &[&JobTimes], best: &[&JobTimes], best_policy: &str) -> Option<Explanation> {
    let sonic = side("sonic", sonic)?;
    let best = side(best_policy, best)?;
    let lat = (best.latency_s / sonic.latency_s).ln();
    let cost = (best.cost_usd / sonic.cost_usd).ln();
    // Only what Sonic lost counts as shortfall.
    let (lost_l, lost_c) = ((-lat).max(0.0), (-cost).max(0.0));
    let latency_share = (lost_l + lost_c > 0.0 && lat.is_finite() && cost.is_finite())
        .then(|| lost_l / (lost_l + lost_c));
    let deciding = (sonic.latency_s > best.latency_s)
        .then(|| {
            let (term, by) = Term::ALL
                .iter()
                .map(|&t| (t, sonic.measured.get(t) - best.measured.get(t)))
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            let stage = top_stage(&sonic.stages, |(name, m, _)| {
                let other = best
                    .stages
                    .iter()
                    .find(|(n, _, _)| n == name)
                    .map_or(0.0, |(_, t, _)| t.get(term));
                Some(m.get(term) - other)
            });
            Some((term, by, stage))
        })
        .flatten();
    Some(Explanation {
        sonic_miss: miss(&sonic),
        best_miss: miss(&best),
        sonic,
        best,
        latency_share,
        deciding,
    })
}

fn at(stage: &Option<String>) -> String {
    stage
        .as_ref()
        .map_or_else(String::new, |s| format!(", most in `{s}`"))
}

impl Explanation {
    /// The explanation in words, every figure from the run.
    pub fn sentence(&self) -> String {
        let (a, b) = (&self.sonic, &self.best);
        let mut s = format!(
            "Measured: Sonic {:.2} s and ${:.7} per job, `{}` {:.2} s and ${:.7}.",
            a.latency_s, a.cost_usd, b.policy, b.latency_s, b.cost_usd
        );
        match self.latency_share {
            Some(x) => {
                let _ = write!(
                    s,
                    " Of the Perf/$ shortfall, {:.0}% is latency and {:.0}% cost.",
                    100.0 * x,
                    100.0 * (1.0 - x)
                );
            }
            None => s.push_str(" Sonic was neither slower nor costlier on the means."),
        }
        match &self.deciding {
            Some((t, by, stage)) => {
                let _ = write!(
                    s,
                    " Sonic's jobs took {:.2} s longer; the term that made the difference is **{}**: {:+.2} s against `{}` on the critical path{}.",
                    a.latency_s - b.latency_s,
                    t.as_str(),
                    by,
                    b.policy,
                    at(stage)
                );
            }
            None if a.cost_usd > b.cost_usd => {
                let _ = write!(
                    s,
                    " Sonic was not slower: its plan cost {:.0}% more, the VMs it held.",
                    100.0 * (a.cost_usd / b.cost_usd - 1.0)
                );
            }
            None => {}
        }
        if let (Some(pl), Some(pc)) = (a.predicted_latency_s, a.predicted_cost_usd) {
            let _ = write!(
                s,
                " The planner predicted {pl:.2} s and ${pc:.7} for Sonic's plan"
            );
            if let (Some(bl), Some(bc)) = (b.predicted_latency_s, b.predicted_cost_usd) {
                let _ = write!(s, ", {bl:.2} s and ${bc:.7} for `{}`'s", b.policy);
            }
            s.push('.');
        }
        for (who, m) in [
            ("Sonic's", &self.sonic_miss),
            (&*format!("`{}`'s", b.policy), &self.best_miss),
        ] {
            if let Some((t, by, stage)) = m {
                let _ = write!(
                    s,
                    " {who} plan missed its prediction most in {}: {:+.2} s measured against predicted{}.",
                    t.as_str(),
                    by,
                    at(stage)
                );
            }
        }
        s
    }

    /// Per stage, both sides' predicted and measured terms (markdown).
    pub fn table(&self, out: &mut String) {
        out.push_str("| stage | policy | compute s (pred / meas) | data passing s (pred / meas) | waiting s (pred / meas) |\n|---|---|---|---|---|\n");
        let cell = |p: Option<f64>, m: f64| match p {
            Some(p) => format!("{p:.2} / {m:.2}"),
            None => format!("- / {m:.2}"),
        };
        for side in [&self.sonic, &self.best] {
            let rows = side
                .stages
                .iter()
                .map(|(n, m, p)| (format!("`{n}`"), *m, *p))
                .chain(std::iter::once((
                    "job (critical path)".to_owned(),
                    side.measured,
                    side.predicted,
                )));
            for (name, m, p) in rows {
                let _ = writeln!(
                    out,
                    "| {name} | {} | {} | {} | {} |",
                    side.policy,
                    cell(p.map(|p| p.compute_s), m.compute_s),
                    cell(p.map(|p| p.data_s), m.data_s),
                    cell(p.map(|p| p.wait_s), m.wait_s)
                );
            }
        }
        out.push('\n');
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A planned job of the chain a -> b: a 2 instances on one agent (concurrency 2), b 2
    /// instances on two agents; times as given.
    pub(crate) fn summary(
        policy: &str,
        latency: f64,
        cost: f64,
        edge_s: f64,
        b_wait: f64,
    ) -> JobSummary {
        // a: dispatched at 0.1, lambdas 1.0 and 0.8 s, ends 1.2; b: dispatched b_wait after a,
        // stages edge_s then computes 2.0 s.
        let b_start = 1.2 + b_wait;
        let b_end = b_start + edge_s + 2.0;
        serde_json::from_value(json!({
            "job_id": format!("j-{policy}"), "dag": "chain", "status": "succeeded",
            "policy": policy, "mode": "planned", "input_bytes": 1, "latency_s": latency,
            "cost_usd": cost, "perf_per_dollar": 1.0 / (latency * cost),
            "edges": [{"from": "a", "to": "b", "method": "direct", "bytes": 10, "seconds": edge_s}],
            "functions": [
                {"name": "a", "instance": 0, "agent": "x", "vm_type": "m5.large", "cold": true,
                 "seconds": 1.0, "peak_memory_mb": null, "attempts": 1, "started_s": 0.1, "ended_s": 1.2},
                {"name": "a", "instance": 1, "agent": "x", "vm_type": "m5.large", "cold": true,
                 "seconds": 0.8, "peak_memory_mb": null, "attempts": 1, "started_s": 0.1, "ended_s": 1.0},
                {"name": "b", "instance": 0, "agent": "y", "vm_type": "m5.large", "cold": true,
                 "seconds": 2.0, "peak_memory_mb": null, "attempts": 1, "started_s": b_start, "ended_s": b_end},
                {"name": "b", "instance": 1, "agent": "z", "vm_type": "m5.large", "cold": true,
                 "seconds": 1.5, "peak_memory_mb": null, "attempts": 1, "started_s": b_start, "ended_s": b_end - 0.4}
            ],
            "outputs": [],
            "plan": {"used": "best", "notes": [], "stages": [
                {"function": "a", "vm_type": "m5.large", "agents": ["x"], "concurrent": 2, "memory_limit_mb": 512},
                {"function": "b", "vm_type": "m5.large", "agents": ["y", "z"], "concurrent": 1, "memory_limit_mb": 512}],
             "report": {"dag": "chain", "policy": "sonic", "stages": [], "edges": [],
                "predicted": {"latency_s": 3.0, "cost_usd": cost / 2.0, "perf_per_dollar": 1.0 / (1.5 * cost), "requests_usd": 0.0},
                "timing": [
                {"function": "a", "ready_s": 0.0, "start_s": 0.0, "upload_s": 0.0, "wait_s": 0.0,
                 "fetch_s": 0.0, "compute_s": 1.0, "end_s": 1.0, "batches": 1},
                {"function": "b", "ready_s": 1.0, "start_s": 1.2, "upload_s": 0.2, "wait_s": 0.0,
                 "fetch_s": 0.3, "compute_s": 1.5, "end_s": 3.0, "batches": 1}]}}
        }))
        .expect("a summary")
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_job_splits_into_compute_data_and_waiting_per_stage() {
        let s = summary("sonic", 5.0, 0.002, 0.5, 0.3);
        let j = job_times(("fig7", "", "sonic"), &s, 1.0).expect("times");
        assert_eq!(j.stages.len(), 2);
        let (a, b) = (&j.stages[0], &j.stages[1]);
        assert_eq!((a.function.as_str(), b.function.as_str()), ("a", "b"));
        // a: ready at 0, ends 1.2; two lambdas on one agent at concurrency 2: compute
        // max(1.0, 1.8 / 2) = 1.0; waiting the rest (dispatch at 0.1, imbalance).
        assert!(close(a.measured.compute_s, 1.0) && close(a.measured.data_s, 0.0));
        assert!(a.measured.data_s.is_sign_positive(), "no -0 in the CSV");
        assert!(close(a.measured.wait_s, 0.2), "{a:?}");
        // b: ready at 1.2, ends 1.2 + 0.3 + 0.5 + 2.0 = 4.0: data 0.5, compute 2.0 (its agents
        // run one lambda each), waiting 0.3.
        assert!(close(b.end_s, 4.0) && close(b.measured.data_s, 0.5));
        assert!(
            close(b.measured.compute_s, 2.0) && close(b.measured.wait_s, 0.3),
            "{b:?}"
        );
        assert!(a.critical && b.critical && b.predicted_critical);
        // The job: the critical path plus the 1.0 s after the last stage, in waiting.
        assert!(close(j.measured.total(), 5.0), "{:?}", j.measured);
        assert!(close(j.measured.wait_s, 0.2 + 0.3 + 1.0));
        // Predicted: b's upload and fetch are its data passing.
        let p = j.predicted.expect("predicted");
        assert!(close(p.data_s, 0.5) && close(p.compute_s, 2.5) && close(p.wait_s, 0.0));
        assert_eq!(b.predicted_end_s, Some(3.0));
        // Dilated by 2: the agents' part halves, the control plane's does not (0.1 s before
        // the first dispatch, 0.3 s between a's last report and b's first dispatch, 1.0 s after
        // b's): the terms still add up to the emulated latency.
        let h = job_times(("fig7", "", "sonic"), &s, 2.0).expect("times");
        let emulated = crate::harness::emulated(&s, 2.0).latency_s;
        assert!(close(emulated, 1.4 + (5.0 - 1.4) / 2.0), "{emulated}");
        assert!(close(h.latency_s, emulated) && close(h.measured.total(), emulated));
        assert!(close(h.stages[1].measured.data_s, 0.25));
        assert!(close(h.stages[1].measured.compute_s, 1.0));
        // b: ready at a's end (0.1 + 1.1 / 2 = 0.65), dispatched 0.3 s later (the control
        // plane's, as measured), then 2.5 s of agents' time, halved.
        assert!(
            close(h.stages[1].end_s, 0.65 + 0.3 + 1.25),
            "{:?}",
            h.stages[1]
        );
        assert!(close(h.predicted.unwrap().compute_s, 1.25));
        // A summary that does not say when instances ran has no breakdown.
        let mut old = s.clone();
        old.functions[0].started_s = None;
        assert_eq!(job_times(("fig7", "", "sonic"), &old, 1.0), None);
    }

    fn refs(v: &[JobTimes]) -> Vec<&JobTimes> {
        v.iter().collect()
    }

    #[test]
    fn the_term_that_made_the_difference_is_named() {
        // Sonic slower by its data passing (2.5 s against 0.5 s on b), same cost.
        let sonic: Vec<JobTimes> = [(7.0, 2.5), (7.2, 2.6)]
            .iter()
            .map(|&(l, e)| {
                job_times(
                    ("fig7", "", "sonic"),
                    &summary("sonic", l, 0.002, e, 0.3),
                    1.0,
                )
                .unwrap()
            })
            .collect();
        let local: Vec<JobTimes> = [(5.0, 0.5), (5.0, 0.5)]
            .iter()
            .map(|&(l, e)| {
                job_times(
                    ("fig7", "", "local"),
                    &summary("local", l, 0.002, e, 0.3),
                    1.0,
                )
                .unwrap()
            })
            .collect();
        let x = explain(&refs(&sonic), &refs(&local), "local").expect("explained");
        assert_eq!(x.latency_share, Some(1.0));
        let (term, by, stage) = x.deciding.clone().expect("slower");
        assert_eq!(term, Term::Data);
        assert!(close(by, 2.55 - 0.5), "{by}");
        assert_eq!(stage.as_deref(), Some("b"));
        // Sonic's plan missed most in data passing too (2.55 measured, 0.5 predicted), at b.
        let (t, by, st) = x.sonic_miss.clone().expect("missed");
        assert_eq!((t, st.as_deref()), (Term::Data, Some("b")));
        assert!(close(by, 2.05), "{by}");
        let text = x.sentence();
        assert!(text.contains("**data passing**"), "{text}");
        assert!(text.contains("100% is latency"), "{text}");
        let mut table = String::new();
        x.table(&mut table);
        assert!(
            table.contains("| `b` | sonic | 1.50 / 2.00 | 0.50 / 2.55 |"),
            "{table}"
        );

        // Same latency, Sonic twice the cost: the cost made the difference, no latency term.
        let dear: Vec<JobTimes> = (0..2)
            .map(|_| {
                job_times(
                    ("fig7", "", "sonic"),
                    &summary("sonic", 5.0, 0.004, 0.5, 0.3),
                    1.0,
                )
                .unwrap()
            })
            .collect();
        let x = explain(&refs(&dear), &refs(&local), "local").expect("explained");
        assert_eq!(x.latency_share, Some(0.0));
        assert_eq!(x.deciding, None);
        assert!(x.sentence().contains("cost 100% more"), "{}", x.sentence());
        // Waiting instead: b dispatched 2 s late.
        let late: Vec<JobTimes> = (0..2)
            .map(|_| {
                job_times(
                    ("fig7", "", "sonic"),
                    &summary("sonic", 7.0, 0.002, 0.5, 2.3),
                    1.0,
                )
                .unwrap()
            })
            .collect();
        let x = explain(&refs(&late), &refs(&local), "local").expect("explained");
        let (term, by, stage) = x.deciding.expect("slower");
        assert_eq!((term, stage.as_deref()), (Term::Wait, Some("b")));
        assert!(close(by, 2.0), "{by}");
    }
}
