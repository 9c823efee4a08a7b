//! When a DAG's unforced jobs are planned and when they profile: convergence with hysteresis,
//! and drift detection (docs/model.md#when-a-dag-is-planned).
//!
//! A DAG starts profiling. When its models converge it becomes *planned*, and stays planned
//! whatever the models' cross-validated error does later (a new input size can raise it above
//! the threshold for a job or two: that is no reason to profile again). It leaves planned mode only
//! on *drift*: after each planned job, every parameter the job measured is compared with what the
//! models predicted at its input size (before its sample is added); a parameter is *off* when
//! `|measured - predicted| > drift_error * max(|predicted|, floor)`. When one parameter is off in
//! `drift_jobs` consecutive planned jobs that measured it, the DAG profiles again, the models are
//! refitted on the samples from the first of those jobs on (the older ones describe a lambda
//! that no longer exists), and the reason names the parameter, both values and the jobs. A job
//! that measures a parameter within tolerance resets that parameter's count: a single outlier
//! never flips the mode. A planned job with a parameter off is held out of the fit until a drift
//! confirms it, so that one outlier does not bend the models and put the next normal job off.
//!
//! Everything here is a pure function of its arguments (the time comes in as `now_ms`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::params::EdgeParams;
use crate::regression::{Convergence, DagModels, FunctionSample, Model, Quantity};

/// How a DAG's unforced jobs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `remote`, spread over the agents, measuring the parameters.
    Profiling,
    /// `sonic`, planned with the models' predictions.
    Planned,
}

/// The smallest magnitude a parameter's error is measured against: a 5 ms lambda taking 10 ms is
/// not a 100% error that matters to a plan, nor is 2 MB of memory against 1 MB.
pub fn floor(q: Quantity) -> f64 {
    match q {
        Quantity::Memory => 32.0,
        Quantity::Time => 0.25,
        Quantity::Fanout => 1.0,
        Quantity::Bytes => 65_536.0,
    }
}

/// One parameter of one planned job: what the models predicted against what the job measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// `mid.cold_s`, `gen->mid.bytes` (the names of the models view).
    pub parameter: String,
    pub predicted: f64,
    pub measured: f64,
    /// `|measured - predicted| / max(|predicted|, floor)`.
    pub error: f64,
}

impl Check {
    fn new(parameter: String, q: Quantity, predicted: f64, measured: f64) -> Check {
        Check {
            parameter,
            predicted,
            measured,
            error: (measured - predicted).abs() / predicted.abs().max(floor(q)),
        }
    }

    /// Off its prediction by more than the rule allows.
    pub fn off(&self, rule: &Convergence) -> bool {
        self.error > rule.drift_error
    }
}

/// Every parameter a job measured that the models can be held to, predicted at `input_bytes`:
/// a model with at least `min_samples` samples and a fit (hot times too, once measured that
/// often; before, the plan used the cold time and a hot run says nothing about it). A fanout the
/// job's parameters fix (`known_fanouts`) is what the plan used, so it is the prediction.
pub fn checks(
    models: &DagModels,
    input_bytes: f64,
    functions: &BTreeMap<String, FunctionSample>,
    edges: &[EdgeParams],
    known_fanouts: &BTreeMap<String, u32>,
) -> Vec<Check> {
    let rule = &models.convergence;
    let usable = |m: &Model| m.samples.len() >= rule.min_samples;
    let mut out = Vec::new();
    let one = |name: String, q: Quantity, m: &Model, measured: Option<f64>| match (
        measured.filter(|y| y.is_finite()),
        m.predict(input_bytes),
    ) {
        (Some(y), Some(p)) if usable(m) => Some(Check::new(name, q, p, y)),
        _ => None,
    };
    for (name, f) in &models.functions {
        let Some(s) = functions.get(name) else {
            continue;
        };
        out.extend(one(
            format!("{name}.memory_mb"),
            Quantity::Memory,
            &f.memory_mb,
            s.memory_mb,
        ));
        // The models hold times on one core; the job's were measured on the cores its
        // instances were given (right-sizing), and are held to the models as such.
        let start = s.start_s.filter(|t| t.is_finite()).unwrap_or(0.0);
        let cold_one = |y: f64| f.cold_on_one_core(y, start, s.cores);
        let hot_one = |y: f64| f.hot_on_one_core(y, s.cores);
        out.extend(one(
            format!("{name}.cold_s"),
            Quantity::Time,
            &f.cold_s,
            s.cold_s.map(cold_one),
        ));
        out.extend(one(
            format!("{name}.hot_s"),
            Quantity::Time,
            &f.hot_s,
            s.hot_s.map(hot_one),
        ));
        // The tail: the job's slowest run against the slowest of as many runs drawn from the
        // learned spread (its median), cold and hot; a sustained shift of the stage's tail
        // (one straggler more, a skewed partition) drifts even when the mean moves less.
        for (what, model, shape, mean, spread) in [
            ("cold", &f.cold_s, &f.cold_shape, s.cold_s, &s.cold_spread),
            ("hot", &f.hot_s, &f.hot_shape, s.hot_s, &s.hot_spread),
        ] {
            let (Some(mean), Some(spread)) = (mean.filter(|m| m.is_finite()), spread) else {
                continue;
            };
            if !usable(model) || shape.len() < crate::regression::MIN_SHAPE || spread.len() < 2 {
                continue;
            }
            let Some(predicted_mean) = model.predict(input_bytes) else {
                continue;
            };
            let slowest = spread.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let measured = if what == "cold" {
                cold_one(slowest * mean)
            } else {
                hot_one(slowest * mean)
            };
            if let Some(ratio) = slowest_of(shape, spread.len()) {
                out.push(Check::new(
                    format!("{name}.slowest_{what}_s"),
                    Quantity::Time,
                    ratio * predicted_mean,
                    measured,
                ));
            }
        }
        let measured = s.instances.map(f64::from);
        match (known_fanouts.get(name), measured) {
            (Some(&k), Some(y)) => out.push(Check::new(
                format!("{name}.instances"),
                Quantity::Fanout,
                f64::from(k),
                y,
            )),
            (Some(_), None) => {}
            (None, _) => out.extend(one(
                format!("{name}.instances"),
                Quantity::Fanout,
                &f.instances,
                measured,
            )),
        }
    }
    for e in &models.edges {
        if let Some(b) = edges.iter().find(|b| b.from == e.from && b.to == e.to) {
            out.extend(one(
                format!("{}->{}.bytes", e.from, e.to),
                Quantity::Bytes,
                &e.bytes,
                Some(b.bytes.0 as f64),
            ));
        }
    }
    out
}

/// The median of the slowest of `n` ratios drawn from `shape` (each instance's time over its
/// job's mean): the empirical quantile of `shape` at `0.5^(1/n)` (the slowest of `n` is at most
/// `x` with probability `F(x)^n`). `None` for an empty shape.
fn slowest_of(shape: &[f64], n: usize) -> Option<f64> {
    let mut sorted: Vec<f64> = shape.iter().copied().filter(|r| r.is_finite()).collect();
    if n == 0 {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    crate::dist::nearest_rank(&sorted, 0.5f64.powf(1.0 / n as f64))
}

/// A parameter off its prediction in consecutive planned jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Streak {
    /// The jobs, oldest first.
    pub jobs: Vec<String>,
    /// The latest of them.
    pub last: Check,
}

/// A DAG's mode and what decides when it changes; kept by the control plane across restarts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DagMode {
    pub mode: Mode,
    /// When it entered this mode, Unix ms.
    pub since_ms: i64,
    /// The job whose sample made the change (`None` for the initial state).
    pub since_job: Option<String>,
    /// Why it profiles again, after a drift (until it converges again).
    pub drift: Option<String>,
    /// The models are fitted on this job's sample and the later ones (`None`: every sample).
    pub fitted_from: Option<String>,
    /// Parameters off their prediction in the latest planned jobs, by parameter.
    pub streaks: BTreeMap<String, Streak>,
    /// Planned jobs that measured some parameter off its prediction: their samples stay out of
    /// the fit (an outlier must not bend the models, which would put the next normal job off),
    /// unless a drift confirms them as the new behaviour.
    #[serde(default)]
    pub held_out: Vec<String>,
    /// Times the DAG drifted back to profiling.
    pub drifts: u32,
    /// Why it plans with models that did not converge: it reached the profiling cap
    /// (`Convergence::max_profiling_jobs`); `None` when they converged.
    #[serde(default)]
    pub capped: Option<String>,
}

impl DagMode {
    /// The state of a DAG with no recorded mode: planned when its models converged (a DAG
    /// learned before modes were recorded keeps planning), profiling otherwise.
    pub fn new(converged: bool, now_ms: i64) -> DagMode {
        DagMode {
            mode: if converged {
                Mode::Planned
            } else {
                Mode::Profiling
            },
            since_ms: now_ms,
            since_job: None,
            drift: None,
            fitted_from: None,
            streaks: BTreeMap::new(),
            held_out: Vec::new(),
            drifts: 0,
            capped: None,
        }
    }

    /// A planned job's checks, while the DAG is planned: updates the streaks and, when one
    /// reaches `drift_jobs`, switches to profiling and returns why. Parameters the job did not
    /// measure keep their streak.
    pub fn observe_planned(
        &mut self,
        job: &str,
        checks: &[Check],
        rule: &Convergence,
        now_ms: i64,
    ) -> Option<String> {
        if self.mode != Mode::Planned {
            return None;
        }
        for c in checks {
            if c.off(rule) {
                let s = self
                    .streaks
                    .entry(c.parameter.clone())
                    .or_insert_with(|| Streak {
                        jobs: Vec::new(),
                        last: c.clone(),
                    });
                s.jobs.push(job.to_owned());
                s.last = c.clone();
            } else {
                self.streaks.remove(&c.parameter);
            }
        }
        let need = rule.drift_jobs.max(1);
        let Some(worst) = self
            .streaks
            .values()
            .filter(|s| s.jobs.len() >= need)
            .max_by(|a, b| a.last.error.total_cmp(&b.last.error))
            .cloned()
        else {
            if checks.iter().any(|c| c.off(rule)) {
                self.held_out.push(job.to_owned());
            }
            return None;
        };
        let jobs = &worst.jobs[worst.jobs.len() - need..];
        let c = &worst.last;
        let why = format!(
            "drift: {} measured {} against {} predicted ({:+.0}%, more than {:.0}% off) in each of the last {} planned jobs ({}); profiling again, models refitted from job {}",
            c.parameter,
            number(c.measured),
            number(c.predicted),
            (c.measured - c.predicted) / c.predicted.abs().max(f64::MIN_POSITIVE) * 100.0,
            rule.drift_error * 100.0,
            need,
            jobs.join(", "),
            jobs[0],
        );
        self.mode = Mode::Profiling;
        self.since_ms = now_ms;
        self.since_job = Some(job.to_owned());
        self.fitted_from = Some(jobs[0].clone());
        self.drift = Some(why.clone());
        self.streaks.clear();
        // From `fitted_from` on, every sample is the new behaviour; older ones are not fitted.
        self.held_out.clear();
        self.drifts += 1;
        Some(why)
    }

    /// The models after a job's sample: a profiling DAG whose models converged becomes planned
    /// (returns true), and so does one that profiled `Convergence::max_profiling_jobs` jobs
    /// with models that predict, unconverged (`capped` says so). A planned DAG stays planned
    /// whatever the models say (hysteresis).
    pub fn observe_models(&mut self, job: &str, models: &DagModels, now_ms: i64) -> bool {
        if self.mode != Mode::Profiling {
            return false;
        }
        let cap = models.convergence.max_profiling_jobs;
        self.capped = match models.unconverged() {
            None => None,
            Some(why) if cap > 0 && models.jobs >= cap && models.predicts() => Some(format!(
                "profiling stopped at its cap of {cap} jobs with models that did not converge ({why}): its plans may be off by that much; raise the control plane's max_profiling_jobs to profile longer"
            )),
            Some(_) => return false,
        };
        self.mode = Mode::Planned;
        self.since_ms = now_ms;
        self.since_job = Some(job.to_owned());
        self.drift = None;
        self.streaks.clear();
        true
    }

    /// Why unforced jobs run the way they do now, for a job's record and the models view.
    pub fn reason(&self, models: &DagModels) -> String {
        match (self.mode, &self.drift) {
            (Mode::Planned, _) if self.capped.is_some() => {
                let since = self
                    .since_job
                    .as_deref()
                    .map_or(String::new(), |j| format!(" at job {j}"));
                format!(
                    "planned{since}: {}",
                    self.capped.as_deref().unwrap_or_default()
                )
            }
            (Mode::Planned, _) => {
                let since = self
                    .since_job
                    .as_deref()
                    .map_or(String::new(), |j| format!(" at job {j}"));
                match models.unconverged() {
                    None => format!("planned: the models converged{since}"),
                    Some(why) => format!(
                        "planned: the models converged{since}; now {why}, which does not stop planning (only a drift does)"
                    ),
                }
            }
            (Mode::Profiling, Some(drift)) => match models.unconverged() {
                Some(why) => format!("{drift}; {why}"),
                None => drift.clone(),
            },
            (Mode::Profiling, None) => {
                let cap = models.convergence.max_profiling_jobs;
                let progress = if cap > 0 {
                    format!(
                        " ({} of at most {cap} profiling jobs; then it plans with the models as they are)",
                        models.jobs
                    )
                } else {
                    String::new()
                };
                format!(
                    "profiling{progress}: the models have not converged ({}); `--policy sonic` plans a job with them now",
                    models
                        .unconverged()
                        .unwrap_or_else(|| "no job has finished yet".into())
                )
            }
        }
    }
}

/// A value as a reason prints it: 3 significant digits.
fn number(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v.abs() >= 1e6 || v.abs() < 1e-3 {
        format!("{v:.2e}")
    } else {
        let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
        format!("{v:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> Convergence {
        Convergence::default()
    }

    fn check(parameter: &str, predicted: f64, measured: f64) -> Check {
        let q = if parameter.ends_with("_s") {
            Quantity::Time
        } else {
            Quantity::Bytes
        };
        Check::new(parameter.into(), q, predicted, measured)
    }

    fn planned() -> DagMode {
        DagMode::new(true, 0)
    }

    /// Models of one function `a` after `jobs` samples, each twice the last's input; `noisy`:
    /// every other job's memory and cold time three times the line (never converges).
    fn models_after(jobs: usize, noisy: bool, rule: Convergence) -> DagModels {
        let mut m = DagModels::for_names(&["a".into()], &[], rule, 1);
        for j in 0..jobs {
            let x = 1e6 * (j + 1) as f64;
            let k = if noisy && j % 2 == 1 { 3.0 } else { 1.0 };
            let f = m.functions.get_mut("a").expect("a");
            for (model, y) in [
                (&mut f.memory_mb, (100.0 + x / 1e4) * k),
                (&mut f.cold_s, (1.0 + x / 1e6) * k),
                (&mut f.instances, 1.0),
            ] {
                model.add_sample(x, y).expect("sample");
                let _ = model.fit();
            }
            m.jobs += 1;
        }
        m
    }

    /// Profiling ends at the cap with models that predict, saying so; converged models plan
    /// without it; no cap, it profiles on; progress toward the cap is in the reason.
    #[test]
    fn profiling_stops_at_its_cap_and_says_so() {
        let capped = Convergence {
            max_profiling_jobs: 4,
            min_samples: 3,
            ..rule()
        };
        let mut m = DagMode::new(false, 0);
        let three = models_after(3, true, capped);
        assert!(
            three.predicts() && !three.converged(),
            "{:?}",
            three.unconverged()
        );
        assert!(!m.observe_models("j-3", &three, 3));
        let why = m.reason(&three);
        assert!(why.contains("3 of at most 4 profiling jobs"), "{why}");
        assert!(why.contains("--policy sonic"), "{why}");
        let four = models_after(4, true, capped);
        assert!(m.observe_models("j-4", &four, 4));
        assert_eq!(m.mode, Mode::Planned);
        let why = m.reason(&four);
        assert!(
            why.contains("cap of 4 jobs") && why.contains("j-4"),
            "{why}"
        );
        // Converged: planned, no cap said.
        let mut m = DagMode::new(false, 0);
        assert!(m.observe_models("j-6", &models_after(6, false, capped), 6));
        assert_eq!(m.capped, None);
        // No cap: it profiles on.
        let uncapped = Convergence {
            max_profiling_jobs: 0,
            ..capped
        };
        let mut m = DagMode::new(false, 0);
        assert!(!m.observe_models("j-9", &models_after(9, true, uncapped), 9));
        assert!(
            !m.reason(&models_after(9, true, uncapped))
                .contains("at most")
        );
    }

    #[test]
    fn errors_are_relative_above_a_floor() {
        let c = check("a.cold_s", 2.0, 3.5);
        assert!((c.error - 0.75).abs() < 1e-12);
        assert!(c.off(&rule()));
        // 10 ms against 20 ms is under the time floor's tolerance.
        let small = check("a.hot_s", 0.01, 0.02);
        assert!((small.error - 0.04).abs() < 1e-12);
        assert!(!small.off(&rule()));
        assert!(!check("a.cold_s", 2.0, 2.9).off(&rule()));
    }

    #[test]
    fn a_converged_dag_stays_planned_whatever_the_models_say() {
        let mut m = DagMode::new(false, 0);
        assert!(!m.observe_models("j-1", &models_after(1, false, rule()), 1));
        assert_eq!(m.mode, Mode::Profiling);
        assert!(m.observe_models("j-2", &models_after(6, false, rule()), 2));
        assert_eq!(
            (m.mode, m.since_job.as_deref()),
            (Mode::Planned, Some("j-2"))
        );
        // A new input size raises the cross-validated error: still planned.
        assert!(!m.observe_models("j-3", &models_after(1, false, rule()), 3));
        assert_eq!(m.mode, Mode::Planned);
        // Jobs that measure what was predicted change nothing.
        for i in 0..10 {
            let c = [check("a.cold_s", 2.0, 2.2), check("a->b.bytes", 1e6, 1.1e6)];
            assert_eq!(m.observe_planned(&format!("j-{i}"), &c, &rule(), 4), None);
        }
        assert_eq!(m.mode, Mode::Planned);
        assert!(m.streaks.is_empty());
    }

    #[test]
    fn a_single_outlier_does_not_flip_it() {
        let mut m = planned();
        let off = [check("a.cold_s", 2.0, 9.0)];
        let ok = [check("a.cold_s", 2.0, 2.1)];
        // off, off, ok, off, off, ok ...: never three in a row.
        for (i, c) in [&off, &off, &ok, &off, &off, &ok, &off]
            .into_iter()
            .enumerate()
        {
            assert_eq!(m.observe_planned(&format!("j-{i}"), c, &rule(), 1), None);
        }
        assert_eq!(m.mode, Mode::Planned);
        assert_eq!(m.streaks["a.cold_s"].jobs, ["j-6"]);
        assert_eq!(m.held_out, ["j-0", "j-1", "j-3", "j-4", "j-6"]);
        // Different parameters off in turn are not one sustained error either.
        let mut m = planned();
        for (i, p) in ["a.cold_s", "b.cold_s", "a.memory_mb"].iter().enumerate() {
            let c = [check(p, 2.0, 9.0)];
            assert_eq!(m.observe_planned(&format!("j-{i}"), &c, &rule(), 1), None);
        }
        assert_eq!(m.mode, Mode::Planned);
    }

    #[test]
    fn sustained_error_of_one_parameter_drifts_and_says_why() {
        let mut m = planned();
        let off = |b: f64| [check("a->b.bytes", 1e6, b), check("a.cold_s", 2.0, 2.0)];
        assert_eq!(m.observe_planned("j-1", &off(3e6), &rule(), 1), None);
        // A job that did not measure the parameter keeps its streak.
        assert_eq!(
            m.observe_planned("j-2", &[check("a.cold_s", 2.0, 2.0)], &rule(), 2),
            None
        );
        assert_eq!(m.observe_planned("j-3", &off(3e6), &rule(), 3), None);
        let why = m
            .observe_planned("j-4", &off(4e6), &rule(), 4)
            .expect("three planned jobs off");
        assert_eq!(m.mode, Mode::Profiling);
        assert_eq!(m.fitted_from.as_deref(), Some("j-1"));
        assert!(
            m.held_out.is_empty(),
            "the drifting jobs are the new behaviour"
        );
        assert_eq!((m.drifts, m.since_ms), (1, 4));
        assert!(why.contains("a->b.bytes"), "{why}");
        assert!(why.contains("4.00e6") && why.contains("1.00e6"), "{why}");
        assert!(
            why.contains("+300%") && why.contains("j-1, j-3, j-4"),
            "{why}"
        );
        assert!(m.streaks.is_empty());
        // While profiling, planned jobs (a forced sonic) are not held to the models.
        assert_eq!(m.observe_planned("j-5", &off(9e6), &rule(), 5), None);
        let models = DagModels::for_names(&["a".into()], &[], rule(), 1);
        assert!(m.reason(&models).starts_with("drift: a->b.bytes"));
        // Converged again: planned, the drift forgotten but counted.
        assert!(m.observe_models("j-9", &models_after(6, false, rule()), 9));
        assert_eq!(
            (m.mode, m.drift.as_deref(), m.drifts),
            (Mode::Planned, None, 1)
        );
    }

    #[test]
    fn the_rule_is_configurable() {
        let strict = Convergence {
            drift_error: 0.1,
            drift_jobs: 1,
            ..rule()
        };
        let mut m = planned();
        assert!(
            m.observe_planned("j-1", &[check("a.cold_s", 2.0, 2.3)], &strict, 1)
                .is_some()
        );
    }

    #[test]
    fn checks_hold_the_job_to_usable_models_only() {
        let mut dm = DagModels::for_names(
            &["a".into(), "b".into()],
            &[("a".into(), "b".into())],
            rule(),
            3,
        );
        let sample = |x: f64, cold: f64| {
            let f = FunctionSample {
                cores: None,
                memory_mb: Some(100.0 + x / 1e6),
                cold_s: Some(cold),
                hot_s: None,
                instances: Some(2),
                overhead_s: None,
                overhead_hot_s: None,
                start_s: None,
                cold_spread: None,
                hot_spread: None,
            };
            let fs: BTreeMap<String, FunctionSample> =
                [("a".to_owned(), f.clone()), ("b".to_owned(), f)].into();
            let es = vec![EdgeParams {
                from: "a".into(),
                to: "b".into(),
                bytes: crate::units::ByteSize(x as u64),
            }];
            (fs, es)
        };
        for i in 1..=5 {
            let x = i as f64 * 1e7;
            let (fs, es) = sample(x, 1.0);
            dm.add_sample(x, &fs, &es).expect("sample");
        }
        assert!(dm.converged());
        // A new size the models never saw, the same behaviour: nothing off.
        let (mut fs, es) = sample(8e7, 1.0);
        let none = BTreeMap::new();
        let cs = checks(&dm, 8e7, &fs, &es, &none);
        let names: Vec<&str> = cs.iter().map(|c| c.parameter.as_str()).collect();
        // hot_s was never measured: not checked.
        assert_eq!(
            names,
            [
                "a.memory_mb",
                "a.cold_s",
                "a.instances",
                "b.memory_mb",
                "b.cold_s",
                "b.instances",
                "a->b.bytes"
            ]
        );
        assert!(cs.iter().all(|c| !c.off(&rule())), "{cs:?}");
        // b now sleeps 3 s more, and the job asks for 5 instances of a.
        fs.get_mut("b").expect("b").cold_s = Some(4.0);
        fs.get_mut("a").expect("a").instances = Some(5);
        let known = BTreeMap::from([("a".to_owned(), 5u32)]);
        let cs = checks(&dm, 8e7, &fs, &es, &known);
        let off: Vec<&str> = cs
            .iter()
            .filter(|c| c.off(&rule()))
            .map(|c| c.parameter.as_str())
            .collect();
        assert_eq!(off, ["b.cold_s"], "{cs:?}");
    }

    /// A stage's tail shifts while its mean holds: one of its four instances now takes 2.2
    /// times the job's mean where the spread was within 5%. The mean is not off; the slowest
    /// run is, in every planned job, and the DAG drifts back to profiling naming it.
    #[test]
    fn a_sustained_shift_of_the_tail_drifts_though_the_mean_holds() {
        assert_eq!(slowest_of(&[], 4), None);
        // The median of the slowest of 4 of {1, 2, ..., 10}: the 0.84 quantile, 9.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(slowest_of(&ten, 4), Some(9.0));
        assert_eq!(slowest_of(&ten, 1), Some(5.0));
        let mut dm = DagModels::for_names(&["b".into()], &[], rule(), 3);
        let sample = |spread: [f64; 4]| {
            let f = FunctionSample {
                memory_mb: Some(100.0),
                cold_s: Some(1.0),
                instances: Some(4),
                cold_spread: Some(spread.to_vec()),
                ..FunctionSample::default()
            };
            BTreeMap::from([("b".to_owned(), f)])
        };
        for i in 1..=5 {
            dm.add_sample(i as f64 * 1e7, &sample([0.95, 1.0, 1.0, 1.05]), &[])
                .expect("sample");
        }
        assert!(dm.converged());
        let none = BTreeMap::new();
        // As learned: nothing off, and the tail is checked.
        let cs = checks(&dm, 3e7, &sample([0.96, 0.99, 1.0, 1.05]), &[], &none);
        let tail = cs
            .iter()
            .find(|c| c.parameter == "b.slowest_cold_s")
            .expect("the tail is checked");
        assert!((tail.predicted - 1.05).abs() < 1e-9, "{tail:?}");
        assert!(cs.iter().all(|c| !c.off(&rule())), "{cs:?}");
        // A straggler: the mean the same, the slowest 2.2 s.
        let straggler = sample([0.6, 0.6, 0.6, 2.2]);
        let cs = checks(&dm, 3e7, &straggler, &[], &none);
        let off: Vec<&str> = cs
            .iter()
            .filter(|c| c.off(&rule()))
            .map(|c| c.parameter.as_str())
            .collect();
        assert_eq!(off, ["b.slowest_cold_s"], "{cs:?}");
        let mut mode = planned();
        let mut why = None;
        for j in 0..rule().drift_jobs {
            assert!(why.is_none(), "drifted before {j} jobs");
            why = mode.observe_planned(&format!("j-{j}"), &cs, &rule(), 10);
        }
        let why = why.expect("a drift");
        assert!(
            why.contains("b.slowest_cold_s measured 2.20 against 1.05"),
            "{why}"
        );
        assert_eq!(mode.mode, Mode::Profiling);
        // Fewer than two runs, or a shape too small to say: not checked.
        let one = BTreeMap::from([(
            "b".to_owned(),
            FunctionSample {
                cold_s: Some(1.0),
                cold_spread: Some(vec![1.0]),
                ..FunctionSample::default()
            },
        )]);
        assert!(
            checks(&dm, 3e7, &one, &[], &none)
                .iter()
                .all(|c| !c.parameter.starts_with("b.slowest"))
        );
    }

    #[test]
    fn numbers_print_short() {
        assert_eq!(number(2.0), "2.00");
        assert_eq!(number(0.0123), "0.0123");
        assert_eq!(number(512.0), "512");
        assert_eq!(number(3e6), "3.00e6");
        assert_eq!(number(0.0), "0");
    }
}
