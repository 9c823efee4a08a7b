//! Prediction quality: for every planned job, what its plan predicted against what it measured,
//! end to end and per stage (`predictions.csv`), and the distribution of the errors per
//! application (`report.md`, "Prediction quality"; docs/evaluation.md).

use std::fmt::Write as _;

use super::explain::{JobTimes, Term, Terms};

/// The latency goal on the median error of planned jobs (issue 14).
pub const LATENCY_GOAL: f64 = 0.15;

/// The distribution of errors of one quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Errors {
    pub n: usize,
    /// Of the absolute errors.
    pub median: f64,
    pub p90: f64,
    pub max: f64,
    /// The mean signed error (predicted - measured): negative when the model predicts too
    /// little.
    pub bias: f64,
}

/// The `q` quantile (0..=1) of sorted values, linearly interpolated between ranks.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
            sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

/// The distribution of `errors` (signed); `None` when there are none.
pub fn distribution(errors: &[f64]) -> Option<Errors> {
    let errs: Vec<f64> = errors.iter().copied().filter(|e| e.is_finite()).collect();
    if errs.is_empty() {
        return None;
    }
    let mut abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    Some(Errors {
        n: errs.len(),
        median: quantile(&abs, 0.5),
        p90: quantile(&abs, 0.9),
        max: abs[abs.len() - 1],
        bias: errs.iter().sum::<f64>() / errs.len() as f64,
    })
}

/// `(predicted - measured) / measured`, `None` when nothing was measured.
pub fn relative(predicted: f64, measured: f64) -> Option<f64> {
    (measured > 0.0 && predicted.is_finite()).then(|| (predicted - measured) / measured)
}

/// The jobs whose plan predicted them: planned, with a predicted latency.
pub fn planned<'a>(jobs: &'a [JobTimes]) -> impl Iterator<Item = &'a JobTimes> + 'a {
    jobs.iter()
        .filter(|j| j.planned && j.predicted_latency_s.is_some())
}

/// Relative errors of the jobs' latency and cost.
pub fn job_errors<'a>(
    jobs: impl Iterator<Item = &'a JobTimes>,
) -> (Option<Errors>, Option<Errors>) {
    let (mut lat, mut cost) = (Vec::new(), Vec::new());
    for j in jobs {
        lat.extend(j.predicted_latency_s.and_then(|p| relative(p, j.latency_s)));
        cost.extend(j.predicted_cost_usd.and_then(|p| relative(p, j.cost_usd)));
    }
    (distribution(&lat), distribution(&cost))
}

/// Per stage of one application: the errors of its end (relative), and of each term: compute
/// relative, data passing and waiting in seconds (either may be 0 measured).
#[derive(Debug, Clone, PartialEq)]
pub struct StageErrors {
    pub app: String,
    pub stage: String,
    pub end: Option<Errors>,
    pub compute: Option<Errors>,
    pub data_s: Option<Errors>,
    pub wait_s: Option<Errors>,
}

/// Per application and stage (first seen first), over the planned jobs with a per-stage
/// prediction.
pub fn stage_errors(jobs: &[JobTimes]) -> Vec<StageErrors> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for j in planned(jobs) {
        for s in &j.stages {
            let k = (j.app.clone(), s.function.clone());
            if s.predicted.is_some() && !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys.into_iter()
        .map(|(app, stage)| {
            let (mut end, mut compute, mut data, mut wait) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for s in planned(jobs)
                .filter(|j| j.app == app)
                .flat_map(|j| j.stages.iter().filter(|s| s.function == stage))
            {
                let (Some(p), Some(pe)) = (s.predicted, s.predicted_end_s) else {
                    continue;
                };
                end.extend(relative(pe, s.end_s));
                compute.extend(relative(p.compute_s, s.measured.compute_s));
                data.push(p.data_s - s.measured.data_s);
                wait.push(p.wait_s - s.measured.wait_s);
            }
            StageErrors {
                app,
                stage,
                end: distribution(&end),
                compute: distribution(&compute),
                data_s: distribution(&data),
                wait_s: distribution(&wait),
            }
        })
        .collect()
}

/// One row per planned job and stage, and one per job (`stage` = `(job)`: latency, cost and the
/// critical path's terms).
pub fn csv(jobs: &[JobTimes]) -> String {
    let mut s = String::from(
        "experiment,app,variant,policy,job_id,stage,critical,predicted_end_s,measured_end_s,predicted_compute_s,measured_compute_s,predicted_data_s,measured_data_s,predicted_wait_s,measured_wait_s,predicted_cost_usd,measured_cost_usd,dilation\n",
    );
    let opt = |v: Option<f64>, digits: usize| v.map_or(String::new(), |x| format!("{x:.digits$}"));
    let terms = |p: Option<Terms>, m: &Terms| {
        Term::ALL
            .iter()
            .map(|&t| format!("{},{:.4}", opt(p.map(|p| p.get(t)), 4), m.get(t)))
            .collect::<Vec<_>>()
            .join(",")
    };
    for j in planned(jobs) {
        let head = format!(
            "{},{},{},{},{}",
            j.experiment, j.app, j.variant, j.policy, j.job_id
        );
        for st in &j.stages {
            let _ = writeln!(
                s,
                "{head},{},{},{},{:.4},{},,,{}",
                st.function,
                st.critical,
                opt(st.predicted_end_s, 4),
                st.end_s,
                terms(st.predicted, &st.measured),
                j.dilation
            );
        }
        let _ = writeln!(
            s,
            "{head},(job),true,{},{:.4},{},{},{:.8},{}",
            opt(j.predicted_latency_s, 4),
            j.latency_s,
            terms(j.predicted, &j.measured),
            opt(j.predicted_cost_usd, 8),
            j.cost_usd,
            j.dilation
        );
    }
    s
}

fn pct(e: Option<&Errors>, f: impl Fn(&Errors) -> f64) -> String {
    e.map_or_else(|| "-".into(), |e| format!("{:.0}%", 100.0 * f(e)))
}

fn secs(e: Option<&Errors>, f: impl Fn(&Errors) -> f64) -> String {
    e.map_or_else(|| "-".into(), |e| format!("{:+.2}", f(e)))
}

/// The report's section (nothing without a planned job).
pub fn report(s: &mut String, jobs: &[JobTimes]) {
    if planned(jobs).next().is_none() {
        return;
    }
    s.push_str("## Prediction quality\n\nEvery planned job (mode `planned`: `sonic`, `oracle`, and the static baselines placed by the planner), what its plan predicted against what it measured ([predictions.csv](predictions.csv): per job and stage). The error is (predicted - measured) / measured; the table gives the median, 90th percentile and largest absolute error, and the bias (the mean signed error: below 0, the model predicts too little).\n\n| app | policy | planned jobs | latency: median | p90 | max | bias | cost: median | p90 | max | bias |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut apps: Vec<&str> = Vec::new();
    for j in planned(jobs) {
        if !apps.contains(&j.app.as_str()) {
            apps.push(&j.app);
        }
    }
    let mut goal = Vec::new();
    for app in &apps {
        let mut policies: Vec<&str> = Vec::new();
        for j in planned(jobs).filter(|j| j.app == *app) {
            if !policies.contains(&j.policy.as_str()) {
                policies.push(&j.policy);
            }
        }
        let rows = policies
            .iter()
            .map(|p| {
                (
                    *p,
                    planned(jobs)
                        .filter(|j| j.app == *app && j.policy == *p)
                        .count(),
                )
            })
            .chain(std::iter::once(("all", 0)));
        for (policy, _) in rows {
            let mine =
                planned(jobs).filter(|j| j.app == *app && (policy == "all" || j.policy == policy));
            let (lat, cost) = job_errors(mine);
            let n = lat.map_or(0, |e| e.n);
            let name = if policy == "all" {
                "**all planned**"
            } else {
                policy
            };
            let _ = writeln!(
                s,
                "| {app} | {name} | {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
                pct(lat.as_ref(), |e| e.median),
                pct(lat.as_ref(), |e| e.p90),
                pct(lat.as_ref(), |e| e.max),
                pct(lat.as_ref(), |e| e.bias),
                pct(cost.as_ref(), |e| e.median),
                pct(cost.as_ref(), |e| e.p90),
                pct(cost.as_ref(), |e| e.max),
                pct(cost.as_ref(), |e| e.bias),
            );
            if policy == "all"
                && let Some(l) = lat
            {
                goal.push(format!(
                    "{app} {:.0}% ({})",
                    100.0 * l.median,
                    if l.median <= LATENCY_GOAL {
                        "met"
                    } else {
                        "**not met**"
                    }
                ));
            }
        }
    }
    let _ = writeln!(
        s,
        "\nThe goal, a median absolute error of the predicted job latency of planned jobs at most {:.0}%: {}.\n",
        100.0 * LATENCY_GOAL,
        goal.join("; ")
    );
    let stages = stage_errors(jobs);
    if !stages.is_empty() {
        s.push_str("Per stage, over the same jobs (the stage's terms as docs/evaluation.md defines them: its end since the job started, relative; compute, relative; data passing and waiting in seconds, predicted - measured, since either can be 0):\n\n| app | stage | jobs | end: median | bias | compute: median | bias | data passing s: median abs | bias | waiting s: median abs | bias |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        for e in &stages {
            let _ = writeln!(
                s,
                "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                e.app,
                e.stage,
                e.end.map_or(0, |x| x.n),
                pct(e.end.as_ref(), |x| x.median),
                pct(e.end.as_ref(), |x| x.bias),
                pct(e.compute.as_ref(), |x| x.median),
                pct(e.compute.as_ref(), |x| x.bias),
                e.data_s
                    .map_or_else(|| "-".into(), |x| format!("{:.2}", x.median)),
                secs(e.data_s.as_ref(), |x| x.bias),
                e.wait_s
                    .map_or_else(|| "-".into(), |x| format!("{:.2}", x.median)),
                secs(e.wait_s.as_ref(), |x| x.bias),
            );
        }
        s.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::StageTime;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn quantiles_and_distribution() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!(close(quantile(&v, 0.5), 3.0));
        assert!(close(quantile(&v, 0.9), 4.6));
        assert!(close(quantile(&[2.0], 0.9), 2.0));
        assert!(quantile(&[], 0.5).is_nan());
        let d = distribution(&[-0.2, 0.1, 0.4, -0.1, f64::NAN]).expect("errors");
        assert_eq!(d.n, 4);
        // |e| sorted: 0.1 0.1 0.2 0.4.
        assert!(close(d.median, 0.15) && close(d.max, 0.4), "{d:?}");
        assert!(close(d.p90, 0.2 + 0.7 * 0.2), "{d:?}");
        assert!(close(d.bias, 0.05), "{d:?}");
        assert_eq!(distribution(&[]), None);
        assert_eq!(relative(1.0, 0.0), None);
        assert!(close(relative(1.5, 1.0).unwrap(), 0.5));
    }

    fn job(
        app: &str,
        policy: &str,
        planned: bool,
        (pl, l): (f64, f64),
        (pc, c): (f64, f64),
    ) -> JobTimes {
        let terms = |x: f64| Terms {
            compute_s: x,
            data_s: 0.5,
            wait_s: 0.1,
        };
        JobTimes {
            experiment: "fig7".into(),
            app: app.into(),
            variant: String::new(),
            policy: policy.into(),
            job_id: format!("j-{policy}-{l}"),
            planned,
            latency_s: l,
            cost_usd: c,
            predicted_latency_s: planned.then_some(pl),
            predicted_cost_usd: planned.then_some(pc),
            stages: vec![StageTime {
                function: "f".into(),
                critical: true,
                end_s: l,
                measured: terms(l - 0.6),
                predicted: Some(terms(pl - 0.6)),
                predicted_end_s: Some(pl),
                predicted_critical: true,
            }],
            measured: terms(l - 0.6),
            predicted: Some(terms(pl - 0.6)),
            dilation: 1.0,
        }
    }

    #[test]
    fn errors_per_application_and_stage_from_planned_jobs_only() {
        let jobs = vec![
            job("a", "sonic", true, (1.0, 2.0), (1.0, 1.0)),
            job("a", "sonic", true, (3.0, 2.0), (1.0, 2.0)),
            job("a", "local", true, (2.0, 2.0), (2.0, 2.0)),
            // Not planned: not counted, even with a wild figure.
            job("a", "remote", false, (100.0, 1.0), (1.0, 1.0)),
            job("b", "sonic", true, (1.1, 1.0), (1.0, 1.0)),
        ];
        let (lat, cost) = job_errors(planned(&jobs).filter(|j| j.app == "a"));
        let lat = lat.expect("latency");
        // -0.5, +0.5, 0: median 0.5, bias 0.
        assert_eq!(lat.n, 3);
        assert!(close(lat.median, 0.5) && close(lat.bias, 0.0) && close(lat.max, 0.5));
        let cost = cost.expect("cost");
        assert!(
            close(cost.median, 0.0) && close(cost.bias, -0.5 / 3.0),
            "{cost:?}"
        );
        let st = stage_errors(&jobs);
        assert_eq!(st.len(), 2);
        assert_eq!((st[0].app.as_str(), st[0].stage.as_str()), ("a", "f"));
        assert_eq!(st[0].end.unwrap().n, 3);
        // Compute 0.4, 2.4, 1.4 predicted, 1.4 measured: relative -1/1.4, +1/1.4, 0.
        assert!(close(st[0].compute.unwrap().max, 1.0 / 1.4), "{:?}", st[0]);
        assert!(close(st[0].data_s.unwrap().median, 0.0));
        let text = csv(&jobs);
        // A header, per planned job one stage row and one job row.
        assert_eq!(text.lines().count(), 1 + 4 * 2);
        assert!(text.contains("fig7,a,,sonic,j-sonic-2,(job),true,1.0000,2.0000,0.4000,1.4000,0.5000,0.5000,0.1000,0.1000,1.00000000,1.00000000,1"), "{text}");
        assert!(!text.contains("remote"));
        let mut md = String::new();
        report(&mut md, &jobs);
        assert!(
            md.contains("| a | **all planned** | 3 | 50% | 50% | 50% | 0% |"),
            "{md}"
        );
        assert!(md.contains("a 50% (**not met**); b 10% (met)"), "{md}");
        // Nothing planned: no section.
        let mut none = String::new();
        report(&mut none, &jobs[3..4]);
        assert!(none.is_empty());
    }
}
