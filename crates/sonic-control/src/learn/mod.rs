//! Online profiling and planning with what was learned: every finished job's sample refits the
//! models of its parameter setting ([`refit`]; `sonic_core::setting`: the values of the job
//! parameters that change the work); a job whose setting's models converged is planned for its
//! input size ([`plan_for`]); the models and plans as the API shows them. Each setting has its
//! own models, mode and drift detection: a job of one setting never counts against another.
//!
//! What a refit read and wrote is kept in memory per setting ([`Memory`], in the [`Db`]): the
//! next job's refit reads only the samples recorded since, and [`current`] and [`mode_of`]
//! answer from it without decoding the stored models.
//!
//! Everything here blocks (fitting, reading samples, planning); async code calls it
//! through [`crate::store::Db::run`], on the blocking pool. Planning stops inside its searches
//! at the job runtime's budget ([`crate::JobsConfig::planning`]), so a request holds a
//! blocking thread for at most that long.

pub mod bandwidth;
pub mod warm;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sonic_api::control::{
    DagModeView, DagModelsView, DriftWatch, JobMode, ModelView, SettingModelsView,
};
use sonic_api::plan::{PlanReport, TypeBandwidth};
use sonic_core::catalog::Catalog;
use sonic_core::dag::{Dag, Fanout};
use sonic_core::mode::{self, DagMode, Mode};
use sonic_core::model::PlanProblem;
use sonic_core::params::{EdgeParams, Params};
use sonic_core::planner::{self, Budget, PlanError, PlanOutcome, Policy};
use sonic_core::regression::{Convergence, DagModels, FunctionSample, MAX_SAMPLES, Model};
use sonic_core::setting::Setting;
use sonic_core::units::ByteSize;

use crate::store::{Db, Derived, ModelRecord, SampleRecord, StoreError};

/// Seeds the models' cross-validation folds: a fit is a pure function of its samples.
pub const SEED: u64 = 0x5013_1c5e_ed00_0001;

/// How long planning one job may take by default (`plan_budget`).
pub const PLAN_TIME: Duration = Duration::from_secs(2);

/// The memory one planning search may take by default (`plan_memory`): 256 MiB.
pub const PLAN_MEMORY: u64 = 256 << 20;

/// Memory limit given to an instance while nothing was learned about the function.
pub const DEFAULT_MEMORY_MB: u64 = 1024;

/// Memory limit headroom over the predicted peak: predictions have errors.
pub const MEMORY_HEADROOM: f64 = 1.5;

/// Per DAG function: the memory limit of one lambda, the predicted peak with headroom.
pub fn memory_limits(dag: &Dag, params: &Params) -> Vec<u64> {
    dag.functions
        .iter()
        .map(|f| {
            let predicted = params.functions.get(&f.name).map_or(0.0, |p| p.memory_mb);
            let want = (predicted * MEMORY_HEADROOM).ceil();
            if want.is_finite() && want > DEFAULT_MEMORY_MB as f64 {
                want as u64
            } else {
                DEFAULT_MEMORY_MB
            }
        })
        .collect()
}

/// The planning budget of a control plane configured with the defaults.
pub fn default_budget() -> Budget {
    Budget {
        time: Some(PLAN_TIME),
        max_memory_bytes: Some(PLAN_MEMORY),
        max_expansions: None,
    }
}

/// The parameters a sample's job ran with (its defaults and overrides), as the scheduler records
/// them in `measured.params`; none for samples recorded before settings existed.
pub fn sample_params(s: &SampleRecord) -> BTreeMap<String, serde_json::Value> {
    s.measured["params"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// The setting a sample belongs to under work parameters `work` (`Dag::work_params`): a sample
/// recorded before settings existed is the empty setting.
pub fn sample_setting(work: Option<&[String]>, s: &SampleRecord) -> Setting {
    Setting::of_work(work, &sample_params(s))
}

/// The setting of a job of `dag` with these parameter overrides.
pub fn job_setting<'a>(
    dag: &Dag,
    overrides: impl IntoIterator<Item = (&'a String, &'a serde_json::Value)>,
) -> Setting {
    let overrides: BTreeMap<String, serde_json::Value> = overrides
        .into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Setting::of(dag, &dag.job_params(&overrides))
}

/// The setting of a job of `dag` that overrides nothing (what `ofctl run` without parameters,
/// the plan route and the models view's top level use).
pub fn default_setting(dag: &Dag) -> Setting {
    Setting::of(dag, &dag.params)
}

/// `dag`'s samples of one setting, oldest first.
pub fn setting_samples(
    db: &Db,
    dag: &Dag,
    setting: &Setting,
) -> Result<Vec<SampleRecord>, StoreError> {
    Ok(db
        .samples(&dag.name)?
        .into_iter()
        .filter(|s| sample_setting(dag.work_params.as_deref(), s) == *setting)
        .collect())
}

/// One stored sample as the models take it: per function measurements, per edge bytes.
pub fn sample_parts(s: &SampleRecord) -> (BTreeMap<String, FunctionSample>, Vec<EdgeParams>) {
    let mut functions = BTreeMap::new();
    if let Some(map) = s.measured["functions"].as_object() {
        for (name, m) in map {
            let num = |k: &str| m[k].as_f64().filter(|v| v.is_finite());
            // Each instance's time over the job's mean (absent from older samples).
            let spread = |k: &str| {
                m[k].as_array().map(|a| {
                    a.iter()
                        .filter_map(serde_json::Value::as_f64)
                        .filter(|v| v.is_finite() && *v > 0.0)
                        .collect::<Vec<f64>>()
                })
            };
            functions.insert(
                name.clone(),
                FunctionSample {
                    memory_mb: num("memory_mb"),
                    cold_s: num("cold_s"),
                    hot_s: num("hot_s"),
                    overhead_s: num("overhead_s"),
                    overhead_hot_s: num("overhead_hot_s"),
                    start_s: num("start_s"),
                    // A stage that ran no instance measured no fanout.
                    instances: m["instances"]
                        .as_u64()
                        .filter(|n| *n > 0)
                        .and_then(|n| u32::try_from(n).ok()),
                    cold_spread: spread("cold_spread"),
                    hot_spread: spread("hot_spread"),
                    // The CPUs its instances were given (absent from older samples: one).
                    cores: num("cores").filter(|k| *k >= 1.0),
                },
            );
        }
    }
    let edges = s.measured["edges"]
        .as_array()
        .map(|es| {
            es.iter()
                .filter_map(|e| {
                    Some(EdgeParams {
                        from: e["from"].as_str()?.to_owned(),
                        to: e["to"].as_str()?.to_owned(),
                        bytes: ByteSize(e["bytes"].as_u64()?),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    (functions, edges)
}

/// Whether stored models describe exactly this DAG's functions and edges.
fn same_shape(m: &DagModels, dag: &Dag) -> bool {
    let names: BTreeSet<&str> = dag.functions.iter().map(|f| f.name.as_str()).collect();
    let edges: Vec<(&str, &str)> = dag
        .edges
        .iter()
        .map(|e| {
            (
                dag.functions[e.from].name.as_str(),
                dag.functions[e.to].name.as_str(),
            )
        })
        .collect();
    m.functions
        .keys()
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        == names
        && m.edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect::<Vec<_>>()
            == edges
}

/// Fits fresh models on every sample, each model once. Measurements of functions or edges the
/// DAG no longer has are left out.
pub fn fit_all<'a>(
    dag: &Dag,
    samples: impl IntoIterator<Item = &'a SampleRecord>,
    rule: Convergence,
) -> DagModels {
    let mut models = DagModels::new(dag, rule, SEED);
    for s in samples {
        let x = s.input_bytes as f64;
        let (functions, edges) = sample_parts(s);
        for (name, f) in &functions {
            let Some(m) = models.functions.get_mut(name) else {
                continue;
            };
            // Cold and hot times with the cores they were measured on (right-sizing), as
            // `DagModels::add_sample` records them; settled once below.
            let _ = m.push_runs(x, f);
            let pairs = [
                (&mut m.memory_mb, f.memory_mb),
                (&mut m.instances, f.instances.map(f64::from)),
                (&mut m.overhead_s, f.overhead_s),
                (&mut m.overhead_hot_s, f.overhead_hot_s),
                (&mut m.start_s, f.start_s),
            ];
            for (model, y) in pairs {
                if let Some(y) = y {
                    // Not finite: already filtered out; an error here only skips the value.
                    let _ = model.add_sample(x, y);
                }
            }
            m.add_spreads(f);
        }
        for e in &edges {
            if let Some(m) = models
                .edges
                .iter_mut()
                .find(|m| m.from == e.from && m.to == e.to)
            {
                let _ = m.bytes.add_sample(x, e.bytes.0 as f64);
            }
        }
        models.jobs += 1;
    }
    let mut all: Vec<&mut Model> = Vec::new();
    for f in models.functions.values_mut() {
        f.settle_cores();
        all.extend([
            &mut f.memory_mb,
            &mut f.cold_s,
            &mut f.hot_s,
            &mut f.instances,
            &mut f.overhead_s,
            &mut f.overhead_hot_s,
            &mut f.start_s,
        ]);
    }
    all.extend(models.edges.iter_mut().map(|e| &mut e.bytes));
    for m in all {
        if !m.samples.is_empty() {
            let _ = m.fit();
        }
    }
    models
}

/// Decodes a stored fit; `None` when the record is from another shape of the DAG or does not
/// decode (it is then refitted from the samples).
pub fn decode(record: &ModelRecord) -> Option<DagModels> {
    serde_json::from_value(record.models.clone()).ok()
}

/// A setting's recorded mode, or the state of a setting with none recorded yet (planned when
/// `models` converged: a DAG learned before modes were recorded keeps planning).
pub fn mode_of(
    db: &Db,
    dag: &str,
    setting: &Setting,
    models: &DagModels,
    now_ms: i64,
) -> Result<DagMode, StoreError> {
    if let Some(mode) = memory(db).mode(dag, setting) {
        return Ok(mode);
    }
    Ok(db
        .get_dag_mode(dag, setting.key())?
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_else(|| DagMode::new(models.converged(), now_ms)))
}

/// The samples the models are fitted on: every sample, or since a drift those from the first
/// drifting job on (when that job's sample is gone, every sample), less the planned jobs held
/// out as off their prediction.
pub fn live_samples(samples: Vec<SampleRecord>, mode: &DagMode) -> Vec<SampleRecord> {
    let from = mode
        .fitted_from
        .as_ref()
        .and_then(|job| samples.iter().position(|s| &s.job == job))
        .unwrap_or(0);
    samples
        .into_iter()
        .skip(from)
        .filter(|s| !mode.held_out.contains(&s.job))
        .collect()
}

/// The samples of one setting of `dag` its models are fitted on, under the setting's recorded
/// mode.
pub fn fitted_samples(
    db: &Db,
    dag: &Dag,
    setting: &Setting,
) -> Result<Vec<SampleRecord>, StoreError> {
    let samples = setting_samples(db, dag, setting)?;
    Ok(
        match db
            .get_dag_mode(&dag.name, setting.key())?
            .and_then(|v| serde_json::from_value::<DagMode>(v).ok())
        {
            Some(m) => live_samples(samples, &m),
            None => samples,
        },
    )
}

/// The job whose sample was just recorded, as the mode's rules need it.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its id.
    pub job: String,
    /// How it ran: only planned jobs are held to the models' predictions.
    pub mode: JobMode,
    /// The fanouts its parameters fixed, by function (the plan used them, not the models').
    pub known_fanouts: BTreeMap<String, u32>,
}

/// What a refit recorded.
#[derive(Debug, Clone)]
pub struct Refitted {
    /// The stored models.
    pub record: ModelRecord,
    /// The DAG's mode after this job.
    pub mode: DagMode,
    /// Why the mode changed with this job, if it did (also logged).
    pub changed: Option<String>,
}

/// Brings the stored models and mode of one setting of a DAG up to date after a job of that
/// setting added its sample (`finished`; `None` refits without deciding anything about the
/// mode). Only the setting's own samples count.
///
/// While the DAG is planned, a planned job's measurements are first compared with what the
/// models predicted at its input size (before its own sample is added: `sonic_core::mode`); a
/// sustained error sends the DAG back to profiling, its models refitted from the first drifting
/// job on. Then the newest sample is added to the stored fit when the fit holds every older live
/// sample and matches the DAG; otherwise everything live is refitted. A profiling DAG whose
/// models converged becomes planned; a planned one stays planned (hysteresis). Persists the
/// models and the mode.
pub fn refit(
    db: &Db,
    dag: &Dag,
    setting: &Setting,
    rule: Convergence,
    now_ms: i64,
    finished: Option<&Finished>,
) -> Result<Refitted, StoreError> {
    // What was read and written last time (none after a restart, a change of the DAG or of the
    // rule), brought up to date with the samples recorded since; else read from the database.
    let mut learned = match memory(db).take(dag, setting, rule) {
        Some(l) => l,
        None => Learned::load(db, dag, setting, rule)?,
    };
    learned.catch_up(db, memory(db).window())?;
    let all = &learned.samples;
    let dropped_live = learned.dropped_live;
    let stored = learned
        .models
        .take()
        .filter(|m| same_shape(m, dag) && m.convergence == rule);
    let mut state = match learned.mode.take() {
        Some(mode) => mode,
        None => DagMode::new(
            match &stored {
                Some(m) => m.converged(),
                None => fit_all(dag, all, rule).converged(),
            },
            now_ms,
        ),
    };
    let mut changed = None;
    if let Some(f) = finished
        && state.mode == Mode::Planned
        && f.mode == JobMode::Planned
        && let Some(newest) = all.iter().rfind(|s| s.job == f.job)
    {
        // What the models predicted for this job: fitted on the live samples before its own.
        let before = || live(all, &state).filter(|s| s.job != f.job);
        let earlier = earlier_live(all, dropped_live, &state);
        let fitted;
        let models = match &stored {
            Some(m) if m.jobs == earlier + before().count() => m,
            _ => {
                fitted = fit_kept(dag, before(), earlier, rule);
                &fitted
            }
        };
        let (functions, edges) = sample_parts(newest);
        let checks = mode::checks(
            models,
            newest.input_bytes as f64,
            &functions,
            &edges,
            &f.known_fanouts,
        );
        if let Some(why) = state.observe_planned(&f.job, &checks, &rule, now_ms) {
            tracing::warn!(dag = %dag.name, setting = %setting, job = %f.job, reason = %why, "drift: the dag profiles again");
            changed = Some(why);
        }
    }
    let samples: Vec<&SampleRecord> = live(all, &state).collect();
    let earlier = earlier_live(all, dropped_live, &state);
    let models = match (stored.filter(|_| changed.is_none()), samples.split_last()) {
        // This job was held out: the fit stays as it was.
        (Some(m), _) if m.jobs == earlier + samples.len() => m,
        (Some(mut m), Some((newest, older))) if m.jobs == earlier + older.len() => {
            let (functions, edges) = sample_parts(newest);
            let functions: BTreeMap<String, FunctionSample> = functions
                .into_iter()
                .filter(|(k, _)| m.functions.contains_key(k))
                .collect();
            match m.add_sample(newest.input_bytes as f64, &functions, &edges) {
                Ok(()) => m,
                Err(e) => {
                    tracing::warn!(dag = %dag.name, error = %e, "sample not added; refitting all");
                    fit_kept(dag, samples.iter().copied(), earlier, rule)
                }
            }
        }
        _ => fit_kept(dag, samples.iter().copied(), earlier, rule),
    };
    // Not in the refit that drifted: at least one job profiles before the DAG plans again.
    if let Some(f) = finished
        && changed.is_none()
        && state.observe_models(&f.job, &models, now_ms)
    {
        let why = state.reason(&models);
        tracing::info!(dag = %dag.name, setting = %setting, job = %f.job, reason = %why, "the dag's models converged: its jobs run planned");
        changed = Some(why);
    }
    let record = ModelRecord {
        dag: dag.name.clone(),
        setting: setting.key().to_owned(),
        models: serde_json::to_value(&models).map_err(|source| StoreError::Encode {
            what: "models",
            source,
        })?,
        converged: models.converged(),
        samples: models.jobs as u64,
        updated_ms: now_ms,
    };
    db.put_model(&record)?;
    let encoded = serde_json::to_value(&state).map_err(|source| StoreError::Encode {
        what: "dag mode",
        source,
    })?;
    db.put_dag_mode(&dag.name, setting.key(), &encoded, now_ms)?;
    tracing::info!(dag = %dag.name, setting = %setting, samples = record.samples, converged = record.converged, mode = ?state.mode, "models refitted");
    // What the database now holds, kept for the next job (only once it is written: an error
    // above leaves nothing kept, and the next refit reads the database again).
    learned.models = Some(models);
    learned.mode = Some(state.clone());
    memory(db).keep(learned);
    Ok(Refitted {
        record,
        mode: state,
        changed,
    })
}

/// [`fit_all`] on the live samples [`Memory`] keeps, counting as jobs also the `earlier` live
/// ones it no longer keeps (each model keeps only its newest [`MAX_SAMPLES`] anyway).
fn fit_kept<'a>(
    dag: &Dag,
    samples: impl IntoIterator<Item = &'a SampleRecord>,
    earlier: usize,
    rule: Convergence,
) -> DagModels {
    let mut models = fit_all(dag, samples, rule);
    models.jobs += earlier;
    models
}

/// How many live samples precede the kept ones (`dropped_live`, counted by [`Learned::trim`]),
/// under `mode`: none when the mode's first fitted job is among the kept ones, as everything
/// before it is not live.
fn earlier_live(kept: &[SampleRecord], dropped_live: usize, mode: &DagMode) -> usize {
    match &mode.fitted_from {
        Some(job) if kept.iter().any(|s| &s.job == job) => 0,
        _ => dropped_live,
    }
}

/// The live samples (see [`live_samples`]), borrowed.
fn live<'a>(
    samples: &'a [SampleRecord],
    mode: &'a DagMode,
) -> impl Iterator<Item = &'a SampleRecord> + 'a {
    let from = mode
        .fitted_from
        .as_ref()
        .and_then(|job| samples.iter().position(|s| &s.job == job))
        .unwrap_or(0);
    samples[from..]
        .iter()
        .filter(|s| !mode.held_out.contains(&s.job))
}

/// What [`refit`] last read and wrote for one setting of a DAG: the setting's newest samples
/// (decoded, oldest first, up to row `last_id` of the DAG's samples; see [`Learned::trim`]), the
/// models and the mode it stored. Kept while the DAG and the convergence rule stay the same.
#[derive(Debug, Clone)]
struct Learned {
    /// The DAG it was read under: its work parameters chose the samples, its shape the models.
    dag: Dag,
    setting_key: String,
    rule: Convergence,
    samples: Vec<SampleRecord>,
    /// Of the samples older than `samples`, no longer kept: how many are live, counted from the
    /// mode's first fitted job when that one was among them ([`earlier_live`] uses it).
    dropped_live: usize,
    last_id: i64,
    /// The stored models as decoded (none: no record, or one that does not decode).
    models: Option<DagModels>,
    /// The stored mode as decoded.
    mode: Option<DagMode>,
    /// When it was last kept ([`Memory`]'s count of refits): the oldest goes first.
    kept: u64,
}

impl Learned {
    /// Everything from the database.
    fn load(
        db: &Db,
        dag: &Dag,
        setting: &Setting,
        rule: Convergence,
    ) -> Result<Learned, StoreError> {
        let models = db
            .get_model(&dag.name, setting.key())?
            .as_ref()
            .and_then(decode);
        let mode = db
            .get_dag_mode(&dag.name, setting.key())?
            .and_then(|v| serde_json::from_value(v).ok());
        Ok(Learned {
            dag: dag.clone(),
            setting_key: setting.key().to_owned(),
            rule,
            samples: Vec::new(),
            dropped_live: 0,
            last_id: 0,
            models,
            mode,
            kept: 0,
        })
    }

    /// Adds the setting's samples recorded since the last read (all of them on the first), then
    /// keeps the newest `window` ([`Learned::trim`]).
    fn catch_up(&mut self, db: &Db, window: usize) -> Result<(), StoreError> {
        for (id, s) in db.samples_after(&self.dag.name, self.last_id)? {
            self.last_id = self.last_id.max(id);
            if sample_setting(self.dag.work_params.as_deref(), &s).key() == self.setting_key {
                self.samples.push(s);
            }
        }
        self.trim(window);
        Ok(())
    }

    /// Drops the oldest samples past `window`, counting the live ones among them (under the
    /// stored mode, which is the one the next refit starts from) in `dropped_live`. Keeps more
    /// when needed: every job of a drift streak (the first becomes the first fitted job at a
    /// drift) and at least `drift_jobs` + 1 samples. Each model keeps only its newest
    /// [`MAX_SAMPLES`] samples, so the dropped ones matter only to a fit from scratch (after
    /// the DAG's shape or the rule changed): that one uses the kept samples.
    fn trim(&mut self, window: usize) {
        let window = window.max(self.rule.drift_jobs + 1);
        let mut excess = self.samples.len().saturating_sub(window);
        if excess == 0 {
            return;
        }
        let empty = DagMode::new(false, 0);
        let mode = self.mode.as_ref().unwrap_or(&empty);
        let position = |job: &String| self.samples.iter().position(|s| &s.job == job);
        if let Some(streaking) = mode
            .streaks
            .values()
            .flat_map(|s| &s.jobs)
            .filter_map(position)
            .min()
        {
            excess = excess.min(streaking);
        }
        let from = mode.fitted_from.as_ref().and_then(position);
        for (i, s) in self.samples.drain(..excess).enumerate() {
            match from {
                // Before the first fitted job: not live.
                Some(from) if i < from => continue,
                // The first fitted job itself: every sample dropped before it was not live.
                Some(from) if i == from => self.dropped_live = 0,
                _ => {}
            }
            if !mode.held_out.contains(&s.job) {
                self.dropped_live += 1;
            }
        }
    }
}

/// What the learning code keeps in memory per (DAG, setting): the setting's decoded samples and
/// its models (a private `Learned`). Only [`refit`] adds to it, after writing the database;
/// [`Db::put_model`] and [`Db::put_dag_mode`] drop the setting's entry, and [`Db::put_sample`]
/// drops everything when it replaces a job's sample.
/// Readers ([`current`], [`mode_of`]) answer from it when it holds the setting under the same
/// DAG, else from the database. The control plane is the only writer of these tables. At most
/// [`KEPT_SETTINGS`] settings are kept; past it the one refitted least recently goes (and is read
/// from the database again at its next refit). Of each setting's samples, the newest
/// [`KEPT_SAMPLES`] are kept (counting the older live ones), so that a control plane running
/// a DAG for a long time does not grow with its history.
#[derive(Debug)]
pub struct Memory {
    entries: std::sync::Mutex<std::collections::HashMap<(String, String), Learned>>,
    refits: std::sync::atomic::AtomicU64,
    window: std::sync::atomic::AtomicUsize,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory {
            entries: std::sync::Mutex::default(),
            refits: std::sync::atomic::AtomicU64::default(),
            window: std::sync::atomic::AtomicUsize::new(KEPT_SAMPLES),
        }
    }
}

/// Retention of samples: of each setting of each applied DAG, the samples older than
/// `before_ms` past the newest [`KEPT_SAMPLES`] (which is all the learning code keeps: each
/// model fits its newest [`MAX_SAMPLES`]) are deleted; how many. What the models know does not
/// change; the count of jobs a DAG learned from, read again from the database, counts the kept
/// ones. Samples of DAGs no longer applied stay (a DAG applied again keeps what was learned).
pub fn prune_samples(db: &Db, before_ms: i64) -> Result<usize, StoreError> {
    let mut doomed = Vec::new();
    for record in db.list_dags()? {
        let Ok(dag) = serde_json::from_value::<Dag>(record.parsed.clone()) else {
            continue;
        };
        let samples = db.samples(&dag.name)?;
        if samples.len() <= KEPT_SAMPLES {
            continue;
        }
        let mut by_setting: BTreeMap<String, Vec<&SampleRecord>> = BTreeMap::new();
        for s in &samples {
            by_setting
                .entry(
                    sample_setting(dag.work_params.as_deref(), s)
                        .key()
                        .to_owned(),
                )
                .or_default()
                .push(s);
        }
        for kept in by_setting.values() {
            let beyond = kept.len().saturating_sub(KEPT_SAMPLES);
            doomed.extend(
                kept[..beyond]
                    .iter()
                    .filter(|s| s.created_ms < before_ms)
                    .map(|s| s.job.clone()),
            );
        }
    }
    db.delete_samples(&doomed)
}

/// How many plannings wait for a slot at most, by default, before submissions are refused.
pub const PLANNING_QUEUE: usize = 64;

/// Bounds planning: at most `slots` plannings run at once (each may take the planning budget's
/// time and memory: 2 s and 256 MiB by default), at most `queue` more wait for a slot, and a
/// planning past them is refused at once ([`PlanningBusy`]) rather than left to pile up threads
/// and memory.
#[derive(Debug)]
pub struct PlanningGate {
    slots: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
    size: usize,
    queue: usize,
}

/// A planning refused by a full [`PlanningGate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the control plane is planning {slots} jobs and {queue} more wait for it: try again shortly"
)]
pub struct PlanningBusy {
    /// Plannings that run at once.
    pub slots: usize,
    /// Plannings that may wait.
    pub queue: usize,
}

impl Default for PlanningGate {
    /// As many slots as this machine's cores, [`PLANNING_QUEUE`] waiting.
    fn default() -> PlanningGate {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PlanningGate::new(cores, PLANNING_QUEUE)
    }
}

impl PlanningGate {
    /// `slots` at once (at least 1), `queue` waiting.
    pub fn new(slots: usize, queue: usize) -> PlanningGate {
        let size = slots.max(1);
        PlanningGate {
            slots: tokio::sync::Semaphore::new(size),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            size,
            queue,
        }
    }

    /// A slot to plan in, held until dropped: at once, after a wait among at most `queue`
    /// others, or refused.
    pub async fn enter(&self) -> Result<tokio::sync::SemaphorePermit<'_>, PlanningBusy> {
        use std::sync::atomic::Ordering;
        if let Ok(p) = self.slots.try_acquire() {
            return Ok(p);
        }
        let busy = PlanningBusy {
            slots: self.size,
            queue: self.queue,
        };
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy);
        }
        let permit = self.slots.acquire().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        permit.map_err(|_| busy)
    }
}

/// How many (DAG, setting) pairs [`Memory`] keeps at most: each holds the setting's decoded
/// samples and its models.
pub const KEPT_SETTINGS: usize = 64;

/// How many of a setting's samples [`Memory`] keeps decoded: the newest, four times what a
/// model keeps ([`MAX_SAMPLES`]; a function's hot starts, say, are not measured in every job).
pub const KEPT_SAMPLES: usize = 4 * MAX_SAMPLES;

impl Memory {
    fn window(&self) -> usize {
        self.window.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps `window` samples per setting from the next refit on (tests use a small one).
    #[cfg(test)]
    fn set_window(&self, window: usize) {
        self.window
            .store(window, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), Learned>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of this setting, taken out, when it was learned under this DAG and rule.
    fn take(&self, dag: &Dag, setting: &Setting, rule: Convergence) -> Option<Learned> {
        self.lock()
            .remove(&(dag.name.clone(), setting.key().to_owned()))
            .filter(|l| l.dag == *dag && l.rule == rule)
    }

    fn keep(&self, mut learned: Learned) {
        learned.kept = self
            .refits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = (learned.dag.name.clone(), learned.setting_key.clone());
        let mut map = self.lock();
        if !map.contains_key(&key)
            && map.len() >= KEPT_SETTINGS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, l)| l.kept)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(key, learned);
    }

    /// The stored models of this setting, when kept under this DAG and of its shape.
    fn models(&self, dag: &Dag, setting: &Setting) -> Option<DagModels> {
        let map = self.lock();
        let l = map.get(&(dag.name.clone(), setting.key().to_owned()))?;
        (l.dag == *dag)
            .then_some(l.models.as_ref())
            .flatten()
            .filter(|m| same_shape(m, dag))
            .cloned()
    }

    /// The stored mode of this setting, when kept.
    fn mode(&self, dag: &str, setting: &Setting) -> Option<DagMode> {
        self.lock()
            .get(&(dag.to_owned(), setting.key().to_owned()))?
            .mode
            .clone()
    }
}

impl Derived for Memory {
    fn forget(&self, dag: &str, setting: &str) {
        self.lock().remove(&(dag.to_owned(), setting.to_owned()));
    }

    fn forget_all(&self) {
        self.lock().clear();
    }
}

/// What `db` keeps in memory for the learning code.
fn memory(db: &Db) -> &Memory {
    db.derived::<Memory>()
}

/// The models of one setting of the DAG under the rule in force (the stored ones, or empty
/// ones before any job of the setting).
pub fn current(
    db: &Db,
    dag: &Dag,
    setting: &Setting,
    rule: Convergence,
) -> Result<DagModels, StoreError> {
    if let Some(mut m) = memory(db).models(dag, setting) {
        m.convergence = rule;
        return Ok(m);
    }
    Ok(
        match db
            .get_model(&dag.name, setting.key())?
            .as_ref()
            .and_then(decode)
        {
            Some(mut m) if same_shape(&m, dag) => {
                m.convergence = rule;
                m
            }
            // The DAG changed shape since the fit, or the setting has samples but no fit (the
            // work parameters changed): what fits comes from the samples.
            _ => fit_all(dag, &fitted_samples(db, dag, setting)?, rule),
        },
    )
}

/// Why a job of `setting` runs in the setting's mode: the mode's reason, after which setting
/// and how many jobs its models learned from (nothing added for the empty setting).
pub fn reason(setting: &Setting, state: &DagMode, models: &DagModels) -> String {
    let why = state.reason(models);
    if setting.is_empty() {
        why
    } else {
        format!(
            "setting {setting} ({} {} learned): {why}",
            models.jobs,
            if models.jobs == 1 { "job" } else { "jobs" }
        )
    }
}

/// The mode view: how the DAG's unforced jobs run and why.
pub fn mode_view(state: &DagMode, models: &DagModels) -> DagModeView {
    DagModeView {
        mode: match state.mode {
            Mode::Profiling => JobMode::Profiling,
            Mode::Planned => JobMode::Planned,
        },
        reason: state.reason(models),
        since_ms: state.since_ms,
        since_job: state.since_job.clone(),
        fitted_from: state.fitted_from.clone(),
        drifts: state.drifts,
        watch: state
            .streaks
            .iter()
            .map(|(p, s)| DriftWatch {
                parameter: p.clone(),
                predicted: s.last.predicted,
                measured: s.last.measured,
                error: s.last.error,
                jobs: s.jobs.len(),
            })
            .collect(),
        drift_error: models.convergence.drift_error,
        drift_jobs: models.convergence.drift_jobs,
    }
}

fn model_views(models: &DagModels) -> Vec<ModelView> {
    models
        .summary()
        .into_iter()
        .map(|m| ModelView {
            parameter: m.parameter,
            equation: m.equation,
            degree: m.degree,
            cv_mape: m.cv_mape,
            samples: m.samples,
            converged: m.converged,
        })
        .collect()
}

/// One setting's models and mode, as the models view lists them.
pub fn setting_view(
    setting: &Setting,
    models: &DagModels,
    mode: Option<&DagMode>,
) -> SettingModelsView {
    SettingModelsView {
        setting: setting.key().to_owned(),
        label: setting.label(),
        params: setting.values().into_iter().collect(),
        converged: models.converged(),
        jobs: models.jobs,
        models: model_views(models),
        mode: mode.map(|m| {
            let mut v = mode_view(m, models);
            v.reason = reason(setting, m, models);
            v
        }),
    }
}

/// Every setting of `dag` with stored models, each under the rule in force and with its mode.
pub fn settings_view(
    db: &Db,
    dag: &Dag,
    rule: Convergence,
    now_ms: i64,
) -> Result<Vec<SettingModelsView>, StoreError> {
    let mut out = Vec::new();
    for record in db.models(&dag.name)? {
        let Some(setting) = Setting::from_key(&record.setting) else {
            tracing::warn!(dag = %dag.name, setting = %record.setting, "a stored setting key does not decode; left out");
            continue;
        };
        let models = current(db, dag, &setting, rule)?;
        let mode = mode_of(db, &dag.name, &setting, &models, now_ms)?;
        out.push(setting_view(&setting, &models, Some(&mode)));
    }
    Ok(out)
}

/// `GET /v1/dags/{name}/models`: one setting's models (the default parameters'), the samples
/// they are fitted on and its mode; `settings` lists every setting learned.
pub fn view(
    dag: &str,
    setting: &Setting,
    models: &DagModels,
    samples: &[SampleRecord],
    mode: Option<&DagMode>,
    settings: Vec<SettingModelsView>,
) -> DagModelsView {
    DagModelsView {
        mode: mode.map(|m| {
            let mut v = mode_view(m, models);
            v.reason = reason(setting, m, models);
            v
        }),
        dag: dag.to_owned(),
        setting: setting.key().to_owned(),
        params: setting.values().into_iter().collect(),
        settings,
        converged: models.converged(),
        max_mape: models.convergence.max_mape,
        jobs: models.jobs,
        models: model_views(models),
        samples: samples
            .iter()
            .map(|s| {
                serde_json::json!({
                    "job": s.job,
                    "input_bytes": s.input_bytes,
                    "measured": s.measured,
                    "created_ms": s.created_ms,
                })
            })
            .collect(),
    }
}

/// Why a DAG could not be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanFailure {
    /// The models cannot predict yet (a parameter was never measured).
    #[error(
        "dag {dag} cannot be planned yet: {why}; run it (unforced, or with policy remote) to profile it"
    )]
    NotReady {
        /// The DAG.
        dag: String,
        /// Which parameter cannot be predicted.
        why: String,
    },
    /// The models predict, but no plan is possible (bounds, memory).
    #[error("dag {dag} has no plan at {input_bytes} input bytes: {why}")]
    Infeasible {
        /// The DAG.
        dag: String,
        /// The job's input size.
        input_bytes: u64,
        /// What rules every plan out.
        why: String,
    },
    /// No plan meets the job's percentile objective (and it is not best effort).
    #[error("dag {dag} has no plan at {input_bytes} input bytes: {why}")]
    Slo {
        /// The DAG.
        dag: String,
        /// The job's input size.
        input_bytes: u64,
        /// The objective and the best percentile latency reachable.
        why: String,
    },
    /// The planning budget ran out before any plan meeting the bounds was found.
    #[error("dag {dag} could not be planned at {input_bytes} input bytes: {why}")]
    Budget {
        /// The DAG.
        dag: String,
        /// The job's input size.
        input_bytes: u64,
        /// Which limit stopped the search.
        why: String,
    },
}

/// A plan for one job.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The planner's best and second-best plans.
    pub outcome: PlanOutcome,
    /// The parameters predicted at the job's input size (fanouts the job fixes replaced).
    pub params: Params,
    /// The `ofctl plan -o json` document, with `input_bytes`, `models_converged` and
    /// `network_mbps` (each VM type's bandwidth and where it came from) added.
    pub report: PlanReport,
    /// What the agents kept warm for the DAG's functions when it was planned (stages the plan
    /// prices hot: `PlanStage::warm`); the resource manager prefers those agents.
    pub warm: crate::learn::warm::WarmPool,
}

/// Plans `dag` for a job of `input_bytes` with the fitted models. `fanouts` are the job's own
/// (from its parameters): a known fanout replaces the predicted one. `catalog` already carries
/// the measured bandwidths described by `bandwidth`. Planning stops at `budget`, counted from
/// this call.
#[allow(clippy::too_many_arguments)]
pub fn plan_for(
    dag: &Dag,
    models: &DagModels,
    input_bytes: u64,
    fanouts: &[Fanout],
    catalog: Catalog,
    bandwidth: &BTreeMap<String, TypeBandwidth>,
    policy: Policy,
    budget: Budget,
    warm: &crate::learn::warm::Source<'_>,
) -> Result<Planned, PlanFailure> {
    let started = Instant::now();
    let params = models
        .params_for(input_bytes as f64)
        .map_err(|e| PlanFailure::NotReady {
            dag: dag.name.clone(),
            why: e.to_string(),
        })?;
    let mut planned = plan_with(
        dag,
        params,
        input_bytes,
        fanouts,
        catalog,
        bandwidth,
        policy,
        budget,
        started,
        warm,
    )?;
    planned.report.models_converged = Some(models.converged());
    planned
        .report
        .warnings
        .extend(extrapolation(models, input_bytes));
    Ok(planned)
}

/// How far out of the learned range an input may be before the plan warns: a tenth.
const EXTRAPOLATION_SLACK: f64 = 1.1;

/// A warning when `input_bytes` lies outside the input sizes `models` learned from (by more
/// than a tenth): the regression extrapolates, and a polynomial fitted on small inputs can be
/// far off on a large one (a job at 5 times the largest profiled input ran 74% over its
/// prediction, with nothing said). `None` inside the range, or before any sample.
pub fn extrapolation(models: &DagModels, input_bytes: u64) -> Option<String> {
    let (lo, hi) = models.learned_inputs()?;
    let x = input_bytes as f64;
    let mb = |b: f64| b / 1e6;
    if hi > 0.0 && x > hi * EXTRAPOLATION_SLACK {
        Some(format!(
            "input {:.1} MB is {:.1}x the largest the models learned from ({:.1} MB): they extrapolate, and the prediction may be far off; a job or two at this size (profiling, or planned) teaches them",
            mb(x),
            x / hi,
            mb(hi)
        ))
    } else if x * EXTRAPOLATION_SLACK < lo {
        Some(format!(
            "input {:.1} MB is below the smallest the models learned from ({:.1} MB): they extrapolate, and the prediction may be far off",
            mb(x),
            mb(lo)
        ))
    } else {
        None
    }
}

/// The reason of a job whose policy was forced and not planned (admission gives it): the
/// executor tells such a baseline from a profiling job by it.
pub fn forced_unplanned(policy: Policy) -> String {
    format!("policy {policy} forced: instances spread over the agents")
}

/// The oracle's parameters: what earlier jobs of `dag` *measured* at exactly `input_bytes`
/// (means over those samples), instead of what the regression predicts. An evaluation
/// baseline (the paper's Oracle-SONIC): it knows the parameters of this very input.
pub fn measured_params(
    dag: &Dag,
    samples: &[SampleRecord],
    input_bytes: u64,
) -> Result<Params, PlanFailure> {
    let at: Vec<&SampleRecord> = samples
        .iter()
        .filter(|s| s.input_bytes == input_bytes)
        .collect();
    let not_ready = |why: String| PlanFailure::NotReady {
        dag: dag.name.clone(),
        why,
    };
    if at.is_empty() {
        return Err(not_ready(format!(
            "oracle: no job of this dag was measured at {input_bytes} input bytes"
        )));
    }
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let parts: Vec<_> = at.iter().map(|s| sample_parts(s)).collect();
    // How much of each function's time spreads over the cores it is given, as every sample
    // tells it (the oracle knows this input's times, measured on the cores their plans gave).
    let shares = fit_all(dag, samples, Convergence::default());
    let mut params = Params::default();
    for f in &dag.functions {
        let pick = |get: &dyn Fn(&FunctionSample) -> Option<f64>| -> Vec<f64> {
            parts
                .iter()
                .filter_map(|(fs, _)| fs.get(&f.name).and_then(get))
                .collect()
        };
        let share = shares.functions.get(&f.name);
        let parallel = share.map_or(0.0, |m| m.cores.parallel);
        let memory = mean(&pick(&|s| s.memory_mb));
        // Times on one core, as the model takes them.
        let cold = mean(&pick(&|s| {
            let start = s.start_s.unwrap_or(0.0);
            s.cold_s
                .map(|y| share.map_or(y, |m| m.cold_on_one_core(y, start, s.cores)))
        }));
        let hot = mean(&pick(&|s| {
            s.hot_s
                .map(|y| share.map_or(y, |m| m.hot_on_one_core(y, s.cores)))
        }));
        let overhead = mean(&pick(&|s| s.overhead_s));
        let overhead_hot = mean(&pick(&|s| s.overhead_hot_s));
        let start = mean(&pick(&|s| s.start_s));
        let instances = pick(&|s| s.instances.map(f64::from))
            .into_iter()
            .fold(0.0_f64, f64::max);
        let (Some(memory_mb), Some(cold_s)) = (memory, cold.or(hot)) else {
            return Err(not_ready(format!(
                "oracle: {} has no measured memory or time at {input_bytes} input bytes",
                f.name
            )));
        };
        let start_s = start.map_or(0.0, |t| t.clamp(0.0, cold_s));
        params.functions.insert(
            f.name.clone(),
            sonic_core::params::FunctionParams {
                memory_mb,
                cold_s,
                // Never run hot at this size: the cold time less the cold start, as the models
                // guess it (`DagModels::params_for`).
                hot_s: hot.unwrap_or(cold_s - start_s),
                instances: (instances.round() as u32).max(1),
                overhead_s: overhead.unwrap_or(0.0),
                overhead_hot_s: overhead_hot,
                start_s,
                parallel,
                cold_dist: None,
                hot_dist: None,
            },
        );
    }
    for e in &dag.edges {
        let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
        let bytes: Vec<f64> = parts
            .iter()
            .filter_map(|(_, es)| {
                es.iter()
                    .find(|x| &x.from == from && &x.to == to)
                    .map(|x| x.bytes.0 as f64)
            })
            .collect();
        params.edges.push(EdgeParams {
            from: from.clone(),
            to: to.clone(),
            bytes: ByteSize(mean(&bytes).unwrap_or(0.0).round() as u64),
        });
    }
    Ok(params)
}

/// Plans `dag` with given parameters (predicted or measured); the job's known `fanouts`
/// replace the parameters' ones. Planning stops at `budget`, its time counted from `started`;
/// past it, the best plan found so far (its report says `"exact": false`), or
/// [`PlanFailure::Budget`] when none meets the bounds yet.
#[allow(clippy::too_many_arguments)]
pub fn plan_with(
    dag: &Dag,
    mut params: Params,
    input_bytes: u64,
    fanouts: &[Fanout],
    catalog: Catalog,
    bandwidth: &BTreeMap<String, TypeBandwidth>,
    policy: Policy,
    budget: Budget,
    started: Instant,
    warm: &crate::learn::warm::Source<'_>,
) -> Result<Planned, PlanFailure> {
    for (f, fanout) in dag.functions.iter().zip(fanouts) {
        if let (Fanout::Known(n), Some(p)) = (fanout, params.functions.get_mut(&f.name)) {
            p.instances = *n;
        }
    }
    let infeasible = |why: String| PlanFailure::Infeasible {
        dag: dag.name.clone(),
        input_bytes,
        why,
    };
    let pool = warm.pool(dag, &params);
    let problem = PlanProblem::from_dag(dag, &params, catalog, dag.bounds)
        .map(|p| p.with_warm(&pool.by_type()).with_prewarm(pool.prewarm))
        .map_err(|e| infeasible(e.to_string()))?;
    let (outcome, us, mut report) = solve(
        dag,
        input_bytes,
        &problem,
        &params,
        policy,
        budget,
        &started,
    )?;
    if let Some(stopped) = &outcome.stopped {
        tracing::warn!(
            dag = %dag.name,
            input_bytes,
            exact = outcome.exact,
            planning_time_us = us,
            stopped = %stopped,
            "planning stopped at its budget"
        );
    }
    report.network_mbps = bandwidth.clone();
    report.warm_pool = pool.report();
    Ok(Planned {
        outcome,
        params,
        report,
        warm: pool,
    })
}

/// Plans `problem` within `budget` (counted from `started`): the outcome, the planning time in
/// µs, and the outcome's report (the document `ofctl plan -o json` prints).
fn solve(
    dag: &Dag,
    input_bytes: u64,
    problem: &PlanProblem,
    params: &Params,
    policy: Policy,
    budget: Budget,
    started: &Instant,
) -> Result<(PlanOutcome, u64, PlanReport), PlanFailure> {
    let infeasible = |why: String| PlanFailure::Infeasible {
        dag: dag.name.clone(),
        input_bytes,
        why,
    };
    // A percentile objective (the job's or its DAG's): the functions' time distributions as
    // the models learned them (means only: points) decide.
    let planned = match dag.slo {
        None => planner::plan_within(problem, policy, budget, started),
        Some(slo) => {
            let times = sonic_core::tails::stage_times(problem, params)
                .map_err(|e| infeasible(format!("the functions' time distributions: {e}")))?;
            planner::plan_for_slo(problem, policy, &times, slo, budget, started)
        }
    };
    let outcome = planned.map_err(|e| match e {
        PlanError::Budget { .. } => PlanFailure::Budget {
            dag: dag.name.clone(),
            input_bytes,
            why: e.to_string(),
        },
        PlanError::Slo { .. } => PlanFailure::Slo {
            dag: dag.name.clone(),
            input_bytes,
            why: e.to_string(),
        },
        e => infeasible(e.to_string()),
    })?;
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let mut outcome = outcome;
    // Where the models learned how instances spread, the plans' latency distributions
    // (`predicted.latency_quantiles_s`); a failure here costs the report its quantiles only.
    let quantiles = |plan: &mut sonic_core::planner::Plan| match sonic_core::tails::quantiles_for(
        problem, plan, params,
    ) {
        Ok(q) => plan.predicted.latency_quantiles_s = q,
        Err(e) => tracing::warn!(dag = %dag.name, error = %e, "no latency distribution"),
    };
    quantiles(&mut outcome.best);
    if let Some(second) = outcome.second_best.as_mut() {
        quantiles(second);
    }
    let report = PlanReport::new(outcome.report(&dag.name, policy, us), input_bytes);
    Ok((outcome, us, report))
}

/// `planned` again, with at most `limits[type]` VMs of each VM type in a stage (what the
/// resource manager's pool can give; a type not in the catalog's names keeps no limit), under
/// the same parameters, `policy` and `budget`. The report keeps what the first one added
/// (input size, bandwidths, convergence, baselines) and gains `vm_limits` and, in `unlimited`,
/// the plan asked for without them.
pub fn replan(
    dag: &Dag,
    planned: &Planned,
    catalog: Catalog,
    policy: Policy,
    budget: Budget,
    limits: &BTreeMap<String, u32>,
) -> Result<Planned, PlanFailure> {
    let started = Instant::now();
    let input_bytes = planned.report.input_bytes;
    let infeasible = |why: String| PlanFailure::Infeasible {
        dag: dag.name.clone(),
        input_bytes,
        why,
    };
    let problem = PlanProblem::from_dag(dag, &planned.params, catalog, dag.bounds)
        .map(|p| {
            p.with_warm(&planned.warm.by_type())
                .with_prewarm(planned.warm.prewarm)
        })
        .and_then(|p| p.with_vm_limits(limits))
        .map_err(|e| infeasible(e.to_string()))?;
    let (outcome, _, new) = solve(
        dag,
        input_bytes,
        &problem,
        &planned.params,
        policy,
        budget,
        &started,
    )?;
    let report = PlanReport {
        plan: new.plan,
        vm_limits: Some(limits.clone()),
        // What the policy asked for before the limits (kept across replans of a replan).
        unlimited: Some(planned.report.asked()),
        ..planned.report.clone()
    };
    Ok(Planned {
        outcome,
        params: planned.params.clone(),
        report,
        warm: planned.warm.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DAG: &str = r#"
name: fan
params: { mids: 2 }
functions:
  - { name: gen, image: i, command: [x] }
  - { name: mid, image: i, command: [x], instances: "{{ params.mids }}" }
  - { name: sink, image: i, command: [x] }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

    /// A job at `x` input bytes with exact linear parameters.
    fn sample(job: usize, x: u64) -> SampleRecord {
        let xf = x as f64;
        let f = |mem: f64, t: f64, k: u32| json!({"memory_mb": mem + xf / 1e6, "cold_s": t + xf / 1e7, "hot_s": null, "instances": k, "overhead_s": 0.1 + xf / 1e8});
        SampleRecord {
            dag: "fan".into(),
            job: format!("j-{job}"),
            input_bytes: x,
            measured: json!({
                "functions": { "gen": f(100.0, 1.0, 1), "mid": f(200.0, 2.0, 2), "sink": f(50.0, 0.5, 1) },
                "edges": [
                    { "from": "gen", "to": "mid", "bytes": x },
                    { "from": "mid", "to": "sink", "bytes": 2 * x },
                ],
            }),
            created_ms: job as i64,
        }
    }

    fn dag() -> Dag {
        Dag::from_yaml("fan.yaml", DAG).expect("dag")
    }

    /// The gate lets `slots` plan at once and `queue` wait; the next is refused, naming both;
    /// a slot freed lets a waiting one in.
    #[tokio::test]
    async fn planning_is_bounded_and_refused_past_its_queue() {
        let gate = std::sync::Arc::new(PlanningGate::new(1, 1));
        let first = gate.enter().await.expect("a slot");
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter().await.map(|_| ()) })
        };
        // The waiter is queued (yield until it is).
        for _ in 0..100 {
            if gate.waiting.load(std::sync::atomic::Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let refused = gate.enter().await.expect_err("past the queue");
        assert_eq!(refused, PlanningBusy { slots: 1, queue: 1 });
        assert!(refused.to_string().contains("try again"), "{refused}");
        drop(first);
        waiter
            .await
            .expect("join")
            .expect("let in once a slot freed");
        assert!(gate.enter().await.is_ok(), "free again");
    }

    /// Retention deletes a setting's samples past the newest [`KEPT_SAMPLES`] and older than the
    /// cutoff, never the kept ones nor younger ones; what the models fit is the same after.
    #[test]
    fn retention_prunes_only_samples_the_models_no_longer_keep() {
        let db = Db::open_in_memory().expect("db");
        let d = dag();
        db.put_dag("fan", DAG, &serde_json::to_value(&d).expect("json"), 0)
            .expect("dag");
        let n = KEPT_SAMPLES + 10;
        for j in 0..n {
            db.put_sample(&sample(j, 1_000 + (j as u64 % 7) * 1_000))
                .expect("sample");
        }
        let rule = Convergence::default();
        let fitted = |db: &Db| {
            let samples = db.samples("fan").expect("samples");
            let kept = &samples[samples.len().saturating_sub(KEPT_SAMPLES)..];
            fit_all(&d, kept.iter(), rule)
        };
        let before = fitted(&db);
        // Created at ms 0..n: a cutoff at 5 takes the 5 oldest only.
        assert_eq!(prune_samples(&db, 5).expect("prune"), 5);
        assert_eq!(db.samples("fan").expect("samples").len(), n - 5);
        // Past the cutoff or among the kept: nothing more, however old.
        assert_eq!(prune_samples(&db, i64::MAX).expect("prune"), 5);
        assert_eq!(db.samples("fan").expect("samples").len(), KEPT_SAMPLES);
        assert_eq!(prune_samples(&db, i64::MAX).expect("prune"), 0);
        let after = fitted(&db);
        assert_eq!(
            serde_json::to_value(&before.functions).expect("json"),
            serde_json::to_value(&after.functions).expect("json"),
            "the models fit the same samples"
        );
    }

    /// `sample`, with mid's cold time multiplied by `slow`.
    fn sample_slowed(job: &str, x: u64, slow: f64) -> SampleRecord {
        let mut s = sample(0, x);
        s.job = job.to_owned();
        let cold = &mut s.measured["functions"]["mid"]["cold_s"];
        *cold = json!(cold.as_f64().expect("cold") * slow);
        s
    }

    fn finished(job: &str, mode: JobMode) -> Finished {
        Finished {
            job: job.to_owned(),
            mode,
            known_fanouts: BTreeMap::from([("mid".to_owned(), 2)]),
        }
    }

    /// Records `s` as job `s.job` ran in `mode` and refits.
    fn run(db: &Db, rule: Convergence, s: SampleRecord, mode: JobMode) -> Refitted {
        db.put_sample(&s).expect("sample");
        refit(
            db,
            &dag(),
            &Setting::empty(),
            rule,
            s.created_ms,
            Some(&finished(&s.job, mode)),
        )
        .expect("refit")
    }

    #[test]
    fn a_converged_dag_stays_planned_until_a_sustained_drift_and_says_why() {
        let db = Db::open_in_memory().expect("db");
        let rule = Convergence {
            max_mape: 0.02,
            ..Convergence::default()
        };
        let mb = 1_000_000u64;
        // Profiling until the models converge (5 samples of exact lines).
        for i in 1..=5u64 {
            let r = run(
                &db,
                rule,
                sample_slowed(&format!("j-p{i}"), i * 10 * mb, 1.0),
                JobMode::Profiling,
            );
            assert_eq!(r.mode.mode == Mode::Planned, i == 5, "after {i} jobs");
            assert_eq!(r.changed.is_some(), i == 5);
        }
        let m = current(&db, &dag(), &Setting::empty(), rule).expect("models");
        let state = mode_of(&db, "fan", &Setting::empty(), &m, 0).expect("mode");
        assert_eq!(state.since_job.as_deref(), Some("j-p5"));
        assert!(
            state
                .reason(&m)
                .starts_with("planned: the models converged at job j-p5")
        );

        // New input sizes, the same lambda: planned. One of them 30% slow (within tolerance)
        // takes the models' error over the threshold: still planned (hysteresis).
        let r = run(
            &db,
            rule,
            sample_slowed("j-a", 70 * mb, 1.0),
            JobMode::Planned,
        );
        assert_eq!((r.mode.mode, r.changed.as_deref()), (Mode::Planned, None));
        let r = run(
            &db,
            rule,
            sample_slowed("j-b", 90 * mb, 1.3),
            JobMode::Planned,
        );
        assert!(
            !r.record.converged,
            "the 30% job raises the cv error over 2%"
        );
        assert_eq!((r.mode.mode, r.changed.as_deref()), (Mode::Planned, None));
        assert!(r.mode.streaks.is_empty());
        let m = current(&db, &dag(), &Setting::empty(), rule).expect("models");
        assert!(
            mode_of(&db, "fan", &Setting::empty(), &m, 0)
                .expect("mode")
                .reason(&m)
                .contains("which does not stop planning")
        );

        // One outlier (mid three times slower), then a normal job: no drift.
        let r = run(
            &db,
            rule,
            sample_slowed("j-c", 60 * mb, 3.0),
            JobMode::Planned,
        );
        assert_eq!(r.mode.streaks["mid.cold_s"].jobs, ["j-c"]);
        let r = run(
            &db,
            rule,
            sample_slowed("j-d", 40 * mb, 1.0),
            JobMode::Planned,
        );
        assert!(r.mode.streaks.is_empty());
        assert_eq!(r.mode.mode, Mode::Planned);

        // The lambda changes for good: three planned jobs off, and a forced remote one between
        // them (not held to the models).
        run(
            &db,
            rule,
            sample_slowed("j-e", 50 * mb, 3.0),
            JobMode::Planned,
        );
        let r = run(
            &db,
            rule,
            sample_slowed("j-f", 20 * mb, 3.0),
            JobMode::Profiling,
        );
        assert_eq!(r.mode.streaks["mid.cold_s"].jobs, ["j-e"]);
        run(
            &db,
            rule,
            sample_slowed("j-g", 80 * mb, 3.0),
            JobMode::Planned,
        );
        let r = run(
            &db,
            rule,
            sample_slowed("j-h", 30 * mb, 3.0),
            JobMode::Planned,
        );
        let why = r.changed.expect("drift");
        assert_eq!(r.mode.mode, Mode::Profiling);
        assert!(why.starts_with("drift: mid.cold_s measured"), "{why}");
        assert!(why.contains("j-e, j-g, j-h"), "{why}");
        assert_eq!(r.mode.fitted_from.as_deref(), Some("j-e"));
        // Refitted on the samples from the first drifting job on: j-e to j-h.
        assert_eq!(r.record.samples, 4);
        assert_eq!(
            fitted_samples(&db, &dag(), &Setting::empty())
                .expect("samples")
                .len(),
            4,
            "the view shows what the models are fitted on"
        );
        // The mode is recorded: what a restarted control plane reads.
        let m = current(&db, &dag(), &Setting::empty(), rule).expect("models");
        let state = mode_of(&db, "fan", &Setting::empty(), &m, 0).expect("mode");
        assert_eq!((state.mode, state.drifts), (Mode::Profiling, 1));
        let v = view("fan", &Setting::empty(), &m, &[], Some(&state), Vec::new());
        let mv = v.mode.expect("mode view");
        assert_eq!(mv.mode, JobMode::Profiling);
        assert!(mv.reason.starts_with("drift: mid.cold_s"), "{}", mv.reason);

        // Profiling the new behaviour converges again: planned.
        let r = run(
            &db,
            rule,
            sample_slowed("j-i", 100 * mb, 3.0),
            JobMode::Profiling,
        );
        assert_eq!(
            r.mode.mode,
            Mode::Planned,
            "5 exact samples of the new lambda"
        );
        let p = current(&db, &dag(), &Setting::empty(), rule)
            .expect("models")
            .params_for(10e6)
            .expect("predicts");
        let want = (2.0 + 1.0) * 3.0;
        assert!((p.functions["mid"].cold_s - want).abs() < 1e-6, "{p:?}");
    }

    /// `sample` of a job that ran with `mids` mid instances (its parameter), whose mid stage
    /// writes `per_mid` times the input to the sink per instance.
    fn sample_of(job: &str, x: u64, mids: u32, per_mid: u64) -> SampleRecord {
        let mut s = sample(0, x);
        s.job = job.to_owned();
        s.measured["functions"]["mid"]["instances"] = json!(mids);
        s.measured["edges"][1]["bytes"] = json!(u64::from(mids) * per_mid * x);
        s.measured["params"] = json!({ "mids": mids });
        s
    }

    /// Records a job of `mids` mid instances in `mode` and refits its setting.
    fn run_setting(db: &Db, rule: Convergence, s: SampleRecord, mode: JobMode) -> Refitted {
        let mids = s.measured["params"]["mids"].as_u64().expect("mids");
        let setting = job_setting(&dag(), &BTreeMap::from([("mids".to_owned(), json!(mids))]));
        assert_eq!(sample_setting(None, &s), setting);
        db.put_sample(&s).expect("sample");
        let mut f = finished(&s.job, mode);
        f.known_fanouts.insert("mid".into(), mids as u32);
        refit(db, &dag(), &setting, rule, s.created_ms, Some(&f)).expect("refit")
    }

    #[test]
    fn each_setting_converges_and_drifts_on_its_own() {
        let db = Db::open_in_memory().expect("db");
        let rule = Convergence::default();
        let mb = 1_000_000u64;
        let d = dag();
        let a = job_setting(&d, &serde_json::Map::new());
        let b = job_setting(&d, &BTreeMap::from([("mids".to_owned(), json!(8))]));
        assert_eq!((a.key(), b.key()), (r#"{"mids":2}"#, r#"{"mids":8}"#));
        // A (2 mids) converges.
        for i in 1..=5u64 {
            let r = run_setting(
                &db,
                rule,
                sample_of(&format!("a-{i}"), i * 10 * mb, 2, 1),
                JobMode::Profiling,
            );
            assert_eq!(r.mode.mode == Mode::Planned, i == 5, "A after {i} jobs");
        }
        // B (8 mids, each writing 5 times more: 20x A's bytes) starts from nothing and profiles
        // under its own key; A stays planned throughout, its models untouched.
        let a_models = current(&db, &d, &a, rule).expect("A");
        for i in 1..=5u64 {
            let r = run_setting(
                &db,
                rule,
                sample_of(&format!("b-{i}"), i * 10 * mb, 8, 5),
                JobMode::Profiling,
            );
            assert_eq!(r.mode.mode == Mode::Planned, i == 5, "B after {i} jobs");
            assert_eq!(r.record.setting, b.key());
            assert_eq!(r.record.samples, i);
            let m = current(&db, &d, &a, rule).expect("A");
            assert_eq!(m, a_models, "B's job {i} changed A's models");
            let state = mode_of(&db, "fan", &a, &m, 0).expect("A's mode");
            assert_eq!(
                state.mode,
                Mode::Planned,
                "A left planned mode at B's job {i}"
            );
            if i < 5 {
                let bm = current(&db, &d, &b, rule).expect("B");
                let why = reason(&b, &mode_of(&db, "fan", &b, &bm, 0).expect("B's mode"), &bm);
                assert!(
                    why.starts_with(&format!(
                        "setting mids=8 ({i} {} learned): profiling",
                        if i == 1 { "job" } else { "jobs" }
                    )),
                    "{why}"
                );
                assert!(
                    why.contains(&format!("{i} of the 5 samples needed")),
                    "{why}"
                );
            }
        }
        // Planned jobs of A and B in turn: neither counts as drift of the other.
        for i in 1..=4u64 {
            for (setting, mids, per_mid) in [(&a, 2, 1), (&b, 8, 5)] {
                let r = run_setting(
                    &db,
                    rule,
                    sample_of(&format!("{mids}-p{i}"), (i * 10 + 5) * mb, mids, per_mid),
                    JobMode::Planned,
                );
                assert_eq!((r.mode.mode, r.changed.as_deref()), (Mode::Planned, None));
                assert!(r.mode.streaks.is_empty(), "{setting}: {:?}", r.mode.streaks);
            }
        }
        // The view lists both settings, each converged and planned.
        let listed = settings_view(&db, &d, rule, 0).expect("settings");
        assert_eq!(
            listed
                .iter()
                .map(|v| (
                    v.label.as_str(),
                    v.jobs,
                    v.converged,
                    v.mode.as_ref().map(|m| m.mode)
                ))
                .collect::<Vec<_>>(),
            [
                ("mids=2", 9, true, Some(JobMode::Planned)),
                ("mids=8", 9, true, Some(JobMode::Planned))
            ]
        );
        // A's models predict A's bytes, B's B's.
        let at = |s: &Setting| {
            current(&db, &d, s, rule)
                .expect("models")
                .params_for(10e6)
                .expect("predicts")
                .edges[1]
                .bytes
                .0
        };
        assert_eq!((at(&a), at(&b)), (20_000_000, 400_000_000));
        // A lambda of B changing behaviour drifts B, not A.
        for i in 1..=3u64 {
            let r = run_setting(
                &db,
                rule,
                sample_of(&format!("b-d{i}"), i * 10 * mb, 8, 50),
                JobMode::Planned,
            );
            assert_eq!(
                r.mode.mode == Mode::Profiling,
                i == 3,
                "B after drift job {i}"
            );
        }
        let am = current(&db, &d, &a, rule).expect("A");
        assert_eq!(
            mode_of(&db, "fan", &a, &am, 0).expect("A").mode,
            Mode::Planned
        );
    }

    #[test]
    fn incremental_refits_equal_a_fit_of_everything() {
        let db = Db::open_in_memory().expect("db");
        let dag = dag();
        let rule = Convergence::default();
        let mut last = None;
        for (i, x) in [
            10_000_000u64,
            20_000_000,
            35_000_000,
            50_000_000,
            80_000_000,
            120_000_000,
        ]
        .into_iter()
        .enumerate()
        {
            db.put_sample(&sample(i, x)).expect("sample");
            last = Some(
                refit(&db, &dag, &Setting::empty(), rule, i as i64, None)
                    .expect("refit")
                    .record,
            );
        }
        let record = last.expect("fitted");
        assert_eq!(record.samples, 6);
        assert!(record.converged, "exact lines converge");
        let incremental = decode(&record).expect("decodes");
        let full = fit_all(&dag, &db.samples("fan").expect("samples"), rule);
        assert_eq!(incremental, full);
        let p = full.params_for(60_000_000.0).expect("predicts");
        assert!((p.functions["mid"].memory_mb - 260.0).abs() < 1e-6);
        assert_eq!(p.functions["mid"].instances, 2);
        assert_eq!(p.edges[1].bytes, ByteSize(120_000_000));
        // hot_s was never measured: it falls back to cold_s.
        assert_eq!(p.functions["gen"].hot_s, p.functions["gen"].cold_s);
        // The per-instance overhead is learned from the samples too.
        assert!((p.functions["mid"].overhead_s - 0.7).abs() < 1e-6);
        // An oracle plans with the mean measured at the size.
        let m = measured_params(&dag, &db.samples("fan").expect("samples"), 50_000_000)
            .expect("measured");
        assert!((m.functions["sink"].overhead_s - 0.6).abs() < 1e-9);
    }

    /// What one refit leaves, as JSON: the record as stored, the mode, why it changed, and what
    /// the readers (`current`, `mode_of`) answer afterwards.
    fn outcome(
        db: &Db,
        dag: &Dag,
        setting: &Setting,
        rule: Convergence,
        r: Refitted,
    ) -> serde_json::Value {
        let m = current(db, dag, setting, rule).expect("current");
        let mode = mode_of(db, &dag.name, setting, &m, 0).expect("mode");
        json!([r.record.models, r.mode, r.changed, m, mode])
    }

    /// Equal JSON, numbers within a relative 1e-12: serde_json reads a float back within one
    /// unit in the last place, so models decoded from the database can differ from the ones
    /// kept in memory in the last bit.
    fn assert_close(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
        use serde_json::Value as V;
        match (a, b) {
            (V::Number(x), V::Number(y)) => {
                let (x, y) = (x.as_f64().expect("x"), y.as_f64().expect("y"));
                assert!(
                    (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                    "{at}: {x} != {y}"
                );
            }
            (V::Array(x), V::Array(y)) => {
                assert_eq!(x.len(), y.len(), "{at}: {a} != {b}");
                for (i, (x, y)) in x.iter().zip(y).enumerate() {
                    assert_close(x, y, &format!("{at}[{i}]"));
                }
            }
            (V::Object(x), V::Object(y)) => {
                assert_eq!(
                    x.keys().collect::<Vec<_>>(),
                    y.keys().collect::<Vec<_>>(),
                    "{at}"
                );
                for (k, v) in x {
                    assert_close(v, &y[k], &format!("{at}.{k}"));
                }
            }
            _ => assert_eq!(a, b, "{at}"),
        }
    }

    #[test]
    fn a_setting_keeps_its_newest_samples_and_learns_as_from_all_of_them() {
        // `full` keeps every sample; `warm` its newest few; `cold` its newest few and forgets
        // them before every refit (a restart). Through convergence, held-out outliers, a drift
        // and the profiling after it, all three record the same models, modes and reasons.
        let dir = tempfile::tempdir().expect("tempdir");
        let open = |name: &str, window: usize| {
            let db = Db::open(&dir.path().join(name)).expect("db");
            memory(&db).set_window(window);
            db
        };
        let window = 5;
        let (full, warm, cold) = (
            open("full.db", usize::MAX),
            open("warm.db", window),
            open("cold.db", window),
        );
        let rule = Convergence {
            max_mape: 0.02,
            ..Convergence::default()
        };
        let (fan, empty) = (dag(), Setting::empty());
        let mb = 1_000_000u64;
        let mut jobs = Vec::new();
        let mut add = |n: usize, slow: f64, mode: JobMode| {
            for _ in 0..n {
                let i = jobs.len() as u64;
                let mut s = sample_slowed(&format!("j-{i}"), (10 + i % 7 * 5 + i) * mb, slow);
                s.created_ms = i as i64;
                jobs.push((s, mode));
            }
        };
        add(6, 1.0, JobMode::Profiling);
        add(6, 1.0, JobMode::Planned);
        add(1, 3.0, JobMode::Planned); // an outlier: held out
        add(6, 1.0, JobMode::Planned);
        add(rule.drift_jobs, 3.0, JobMode::Planned); // a drift
        add(9, 3.0, JobMode::Profiling);
        add(6, 3.0, JobMode::Planned);
        let (mut held_out, mut drifted) = (false, false);
        for (s, mode) in &jobs {
            let mut out = Vec::new();
            for (db, forget) in [(&full, false), (&warm, false), (&cold, true)] {
                db.put_sample(s).expect("sample");
                if forget {
                    memory(db).forget_all();
                }
                let r = refit(
                    db,
                    &fan,
                    &empty,
                    rule,
                    s.created_ms,
                    Some(&finished(&s.job, *mode)),
                )
                .expect("refit");
                out.push(json!([r.record.models, r.mode, r.changed]));
            }
            assert_close(&out[0], &out[1], &format!("warm at {}", s.job));
            assert_close(&out[0], &out[2], &format!("cold at {}", s.job));
            held_out |= out[0][1]["held_out"]
                .as_array()
                .is_some_and(|h| !h.is_empty());
            drifted |= out[0][1]["drifts"].as_u64().is_some_and(|n| n > 0);
        }
        assert!(held_out && drifted, "the jobs were held out and drifted");
        assert_eq!(
            memory(&full).lock()[&("fan".to_owned(), String::new())]
                .samples
                .len(),
            jobs.len()
        );
        let kept = memory(&warm).lock()[&("fan".to_owned(), String::new())]
            .samples
            .len();
        assert!(kept <= window + rule.drift_jobs, "{kept} samples kept");
        // Its models count the live jobs it no longer keeps.
        let last = warm.get_model("fan", "").expect("get").expect("stored");
        assert!(
            last.samples as usize > kept,
            "{} jobs counted",
            last.samples
        );
    }

    #[test]
    fn kept_learning_equals_a_refit_from_the_database() {
        // `warm` keeps what it learned between jobs; `cold` forgets it before every refit and
        // read, as a control plane restarted before each job would. Every step must agree.
        let dir = tempfile::tempdir().expect("tempdir");
        let warm = Db::open(&dir.path().join("warm.db")).expect("warm");
        let cold = Db::open(&dir.path().join("cold.db")).expect("cold");
        let rule = Convergence {
            max_mape: 0.02,
            ..Convergence::default()
        };
        let mb = 1_000_000u64;
        let step = |dag: &Dag, setting: &Setting, s: &SampleRecord, mode: JobMode| {
            let mut out = Vec::new();
            for (db, forget) in [(&warm, false), (&cold, true)] {
                db.put_sample(s).expect("sample");
                if forget {
                    memory(db).forget_all();
                }
                let r = refit(
                    db,
                    dag,
                    setting,
                    rule,
                    s.created_ms,
                    Some(&finished(&s.job, mode)),
                )
                .expect("refit");
                if forget {
                    memory(db).forget_all();
                }
                out.push(outcome(db, dag, setting, rule, r));
            }
            assert_close(&out[0], &out[1], &s.job);
            // What the readers answer is what the database holds.
            let record = warm
                .get_model(&dag.name, setting.key())
                .expect("get")
                .expect("stored");
            let mut stored = decode(&record).expect("decodes");
            stored.convergence = rule;
            assert_close(&out[0][3], &json!(stored), &s.job);
            out.swap_remove(0)
        };
        let fan = dag();
        let empty = Setting::empty();
        // Profiling to convergence, planned jobs, then a sustained drift and more jobs.
        let mut jobs = Vec::new();
        for i in 1..=5u64 {
            jobs.push((
                sample_slowed(&format!("j-p{i}"), i * 10 * mb, 1.0),
                JobMode::Profiling,
            ));
        }
        jobs.push((sample_slowed("j-a", 70 * mb, 1.0), JobMode::Planned));
        for i in 1..=3u64 {
            jobs.push((
                sample_slowed(&format!("j-s{i}"), (60 + i) * mb, 3.0),
                JobMode::Planned,
            ));
        }
        for i in 1..=2u64 {
            jobs.push((
                sample_slowed(&format!("j-q{i}"), (80 + i) * mb, 3.0),
                JobMode::Profiling,
            ));
        }
        let mut drifted = false;
        for (s, mode) in &jobs {
            let out = step(&fan, &empty, s, *mode);
            drifted |= out[4]["drifts"].as_u64().is_some_and(|n| n > 0);
        }
        assert!(drifted, "the slow jobs made the dag drift");

        // A job's sample recorded again (replaced in place): both agree on the new values.
        let mut again = sample_slowed("j-q2", 82 * mb, 1.0);
        again.created_ms = 99;
        step(&fan, &empty, &again, JobMode::Profiling);

        // The DAG re-applied with another shape (one more function): models from the samples.
        let grown = Dag::from_yaml(
            "fan.yaml",
            &DAG.replace(
                "  - { name: sink, image: i, command: [x] }",
                "  - { name: sink, image: i, command: [x] }\n  - { name: log, image: i, command: [x] }",
            ),
        )
        .expect("grown dag");
        assert_ne!(grown, fan);
        let out = step(
            &grown,
            &empty,
            &sample_slowed("j-g1", 85 * mb, 1.0),
            JobMode::Profiling,
        );
        assert!(out[0]["functions"].get("log").is_some(), "{out}");

        // Re-applied with `mids` a work parameter: the old samples are the setting mids=2.
        let work = Dag::from_yaml(
            "fan.yaml",
            &DAG.replace(
                "params: { mids: 2 }",
                "params: { mids: 2 }\nwork_params: [mids]",
            ),
        )
        .expect("dag with work params");
        let two = default_setting(&work);
        assert!(!two.is_empty());
        let mut s = sample_slowed("j-w1", 86 * mb, 1.0);
        s.measured["params"] = json!({"mids": 2});
        let out = step(&work, &two, &s, JobMode::Profiling);
        assert_eq!(
            out[0]["jobs"],
            json!(1),
            "only the sample of its setting: {out}"
        );
    }

    #[test]
    fn what_is_kept_goes_when_the_database_changes_under_it() {
        let db = Db::open_in_memory().expect("db");
        let (fan, empty, rule) = (dag(), Setting::empty(), Convergence::default());
        let kept = |db: &Db| {
            memory(db)
                .lock()
                .contains_key(&("fan".to_owned(), String::new()))
        };
        let put_and_refit = |s: &SampleRecord| {
            db.put_sample(s).expect("sample");
            refit(&db, &fan, &empty, rule, 0, None).expect("refit")
        };
        put_and_refit(&sample(1, 10_000_000));
        assert!(kept(&db), "a refit keeps what it wrote");
        // A new job's sample is read at the next refit: what is kept stays.
        db.put_sample(&sample(2, 20_000_000)).expect("sample");
        assert!(kept(&db));
        let r = refit(&db, &fan, &empty, rule, 0, None).expect("refit");
        assert_eq!(r.record.samples, 2);
        // A job's sample recorded again (its row keeps its place): everything kept goes.
        db.put_sample(&sample(2, 30_000_000)).expect("replaced");
        assert!(!kept(&db));
        let r = put_and_refit(&sample(3, 40_000_000));
        assert_eq!(r.record.samples, 3);
        let key = ("fan".to_owned(), String::new());
        assert_eq!(
            memory(&db).lock()[&key].samples[1].input_bytes,
            30_000_000,
            "the replaced sample is read again"
        );
        // Models or a mode written by anyone else: the setting's entry goes.
        assert!(kept(&db));
        db.put_model(&r.record).expect("model");
        assert!(!kept(&db));
        put_and_refit(&sample(4, 50_000_000));
        db.put_dag_mode("fan", "", &json!(r.mode), 0).expect("mode");
        assert!(!kept(&db));
    }

    #[test]
    fn at_most_kept_settings_are_kept_and_the_least_recently_refitted_goes() {
        let db = Db::open_in_memory().expect("db");
        let rule = Convergence::default();
        let work = Dag::from_yaml(
            "fan.yaml",
            &DAG.replace(
                "params: { mids: 2 }",
                "params: { mids: 2 }\nwork_params: [mids]",
            ),
        )
        .expect("dag");
        let setting = |mids: usize| {
            let overrides = BTreeMap::from([("mids".to_owned(), json!(mids))]);
            job_setting(&work, &overrides)
        };
        let refit_setting = |job: usize, mids: usize| {
            let mut s = sample(job, 10_000_000);
            s.measured["params"] = json!({"mids": mids});
            db.put_sample(&s).expect("sample");
            refit(&db, &work, &setting(mids), rule, 0, None).expect("refit")
        };
        for mids in 1..=KEPT_SETTINGS {
            refit_setting(mids, mids);
        }
        // The first setting refitted again: the second is now the least recently refitted.
        refit_setting(1000, 1);
        refit_setting(1001, KEPT_SETTINGS + 1);
        let map = memory(&db).lock();
        assert_eq!(map.len(), KEPT_SETTINGS);
        let kept =
            |mids: usize| map.contains_key(&("fan".to_owned(), setting(mids).key().to_owned()));
        assert!(kept(1) && kept(3) && kept(KEPT_SETTINGS + 1));
        assert!(!kept(2), "the least recently refitted went");
        drop(map);
        // It is read from the database again: its two samples.
        let r = refit_setting(1002, 2);
        assert_eq!(r.record.samples, 2);
    }

    #[test]
    fn a_stale_record_is_refitted_from_the_samples() {
        let db = Db::open_in_memory().expect("db");
        let dag = dag();
        for (i, x) in [1_000_000u64, 2_000_000, 3_000_000].into_iter().enumerate() {
            db.put_sample(&sample(i, x)).expect("sample");
        }
        // A record that does not decode (an older format) and one fitted on fewer samples.
        db.put_model(&ModelRecord {
            dag: "fan".into(),
            setting: String::new(),
            models: json!({"old": true}),
            converged: true,
            samples: 1,
            updated_ms: 0,
        })
        .expect("model");
        let r = refit(
            &db,
            &dag,
            &Setting::empty(),
            Convergence::default(),
            9,
            None,
        )
        .expect("refit")
        .record;
        assert_eq!(r.samples, 3);
        assert!(!r.converged, "3 samples are under min_samples");
        let loose = Convergence {
            max_mape: 0.15,
            min_samples: 3,
            ..Convergence::default()
        };
        let m = current(&db, &dag, &Setting::empty(), loose).expect("current");
        assert!(m.converged(), "the rule in force decides");
        let v = view(
            "fan",
            &Setting::empty(),
            &m,
            &db.samples("fan").expect("samples"),
            None,
            Vec::new(),
        );
        assert!(v.converged);
        assert_eq!((v.jobs, v.samples.len()), (3, 3));
        let mem = v
            .models
            .iter()
            .find(|m| m.parameter == "mid.memory_mb")
            .expect("model");
        assert!(
            mem.equation.as_deref().is_some_and(|e| e.contains('x')),
            "{mem:?}"
        );
    }

    #[test]
    fn plans_with_known_fanouts_and_says_when_it_cannot() {
        let dag = dag();
        let empty = DagModels::new(&dag, Convergence::default(), SEED);
        let fanouts = [Fanout::Known(1), Fanout::Known(3), Fanout::Known(1)];
        let (catalog, bw) =
            crate::learn::bandwidth::BandwidthBook::default().apply(&Catalog::default());
        let err = plan_for(
            &dag,
            &empty,
            1000,
            &fanouts,
            catalog.clone(),
            &bw,
            Policy::Sonic,
            default_budget(),
            &crate::learn::warm::Source::none(),
        )
        .expect_err("nothing fitted");
        assert!(matches!(err, PlanFailure::NotReady { .. }), "{err}");
        let samples: Vec<SampleRecord> = (0..5)
            .map(|i| sample(i, (i as u64 + 1) * 10_000_000))
            .collect();
        let models = fit_all(&dag, &samples, Convergence::default());
        let planned = plan_for(
            &dag,
            &models,
            25_000_000,
            &fanouts,
            catalog,
            &bw,
            Policy::Sonic,
            default_budget(),
            &crate::learn::warm::Source::none(),
        )
        .expect("plan");
        // The job asks for 3 mids; the models only ever saw 2.
        assert_eq!(planned.params.functions["mid"].instances, 3);
        let r = &serde_json::to_value(&planned.report).expect("encodes");
        assert_eq!(r["exact"], true, "within the default budget");
        assert_eq!(r["dag"], "fan");
        assert_eq!(r["policy"], "sonic");
        assert_eq!(r["input_bytes"], 25_000_000);
        assert_eq!(r["stages"].as_array().map(Vec::len), Some(3));
        assert_eq!(r["edges"].as_array().map(Vec::len), Some(2));
        assert!(
            r["predicted"]["latency_s"]
                .as_f64()
                .is_some_and(|l| l > 0.0),
            "{r}"
        );
        assert_eq!(r["network_mbps"]["m5.large"]["source"], "catalog");
        // Memory no VM type offers: no plan, and why.
        let mut huge = models.clone();
        for m in huge.functions.values_mut() {
            m.memory_mb = Model::new(sonic_core::regression::Quantity::Memory, 1);
            m.memory_mb.add_sample(1.0, 1e9).expect("sample");
            m.memory_mb.fit().expect("fit");
        }
        let (catalog, bw) =
            crate::learn::bandwidth::BandwidthBook::default().apply(&Catalog::default());
        let err = plan_for(
            &dag,
            &huge,
            25_000_000,
            &fanouts,
            catalog,
            &bw,
            Policy::Sonic,
            default_budget(),
            &crate::learn::warm::Source::none(),
        )
        .expect_err("does not fit");
        assert!(matches!(err, PlanFailure::Infeasible { .. }), "{err}");
    }

    #[test]
    fn a_spent_budget_plans_with_the_best_plan_known_and_says_so() {
        let dag = dag();
        let samples: Vec<SampleRecord> = (0..5)
            .map(|i| sample(i, (i as u64 + 1) * 10_000_000))
            .collect();
        let models = fit_all(&dag, &samples, Convergence::default());
        let (catalog, bw) =
            crate::learn::bandwidth::BandwidthBook::default().apply(&Catalog::default());
        let fanouts = [Fanout::Known(1), Fanout::Known(40), Fanout::Known(1)];
        // One candidate: the searches stop at their first step (deterministic, no clock).
        let spent = Budget {
            max_expansions: Some(1),
            ..default_budget()
        };
        let planned = plan_for(
            &dag,
            &models,
            25_000_000,
            &fanouts,
            catalog,
            &bw,
            Policy::Sonic,
            spent,
            &crate::learn::warm::Source::none(),
        )
        .expect("the best plan known");
        assert!(!planned.outcome.exact);
        let r = &serde_json::to_value(&planned.report).expect("encodes");
        assert_eq!(r["exact"], false);
        assert_eq!(r["stopped"]["limit"], "expansions");
        assert_eq!(r["stopped"]["search"], "best");
        assert_eq!(r["stages"].as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn a_plan_warns_when_the_input_lies_outside_what_the_models_learned_from() {
        let mut m = DagModels::for_names(&["f".into()], &[], Convergence::default(), 1);
        assert_eq!(
            extrapolation(&m, 5_000_000),
            None,
            "nothing learned: nothing to say"
        );
        for mb in [10u64, 14, 20] {
            let f = BTreeMap::from([(
                "f".to_owned(),
                FunctionSample {
                    cold_s: Some(1.0),
                    ..FunctionSample::default()
                },
            )]);
            m.add_sample((mb * 1_000_000) as f64, &f, &[])
                .expect("sample");
        }
        assert_eq!(m.learned_inputs(), Some((10e6, 20e6)));
        for inside in [10_000_000, 15_000_000, 21_000_000, 9_500_000] {
            assert_eq!(extrapolation(&m, inside), None, "{inside}");
        }
        let above = extrapolation(&m, 100_000_000).expect("above");
        assert!(
            above.contains("100.0 MB is 5.0x the largest") && above.contains("20.0 MB"),
            "{above}"
        );
        let below = extrapolation(&m, 2_000_000).expect("below");
        assert!(
            below.contains("below the smallest") && below.contains("10.0 MB"),
            "{below}"
        );
    }
}
