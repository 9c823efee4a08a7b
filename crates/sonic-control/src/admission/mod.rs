//! Admission: a submitted job checked (its DAG, parameters and input), its policy chosen (a
//! forced one, or the mode of its parameter setting: profiling or planned), planned under the
//! budget, recorded, and handed to the executor; a job cancelled; a job a restarted control
//! plane left unfinished planned again and resumed. Errors are [`AdmitError`]s, which the HTTP
//! layer maps to statuses (`crate::http::error`).

pub mod baselines;
pub mod triggers;

use std::sync::Arc;
use std::time::Duration;

use sonic_api::control::{JobAccepted, JobMode, JobPlan, JobStatus, SubmitJob};
use sonic_core::dag::{Dag, valid_dag_name};
use sonic_core::setting::Setting;
use tokio_util::sync::CancellationToken;

use crate::exec::requests::{JobInputFile, Policy};
use crate::exec::{Context, Runtime};
use crate::learn::{PlanFailure, Planned};
use crate::store::{Db, DeleteJob, JobRecord, Retry, StoreError};

/// Why a submission (or a cancel) was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The request is malformed: a bad name, parameter, input or policy.
    #[error("{0}")]
    Invalid(String),
    /// No such DAG or job.
    #[error("{0}")]
    NotFound(String),
    /// The DAG's models cannot predict yet (a forced `sonic` before they converged).
    #[error("{0}")]
    NotReady(String),
    /// Well-formed, but no plan meets the DAG's bounds (or the planning budget).
    #[error("{0}")]
    Infeasible(String),
    /// The job is not in a state the request needs (a retry of a job that has not failed).
    #[error("{0}")]
    Conflict(String),
    /// This control plane runs no jobs (it has no object store).
    #[error("{0}")]
    NoJobs(String),
    /// Too much is being planned at once: try again shortly.
    #[error("{0}")]
    Busy(String),
    /// Something failed on our side (the database, the object store).
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for AdmitError {
    fn from(e: StoreError) -> Self {
        AdmitError::Internal(e.to_string())
    }
}

/// A DAG name as the API takes it: lowercase letters, digits and `-`, at most 63.
pub fn checked_dag_name(name: String) -> Result<String, AdmitError> {
    if valid_dag_name(&name) {
        Ok(name)
    } else {
        Err(AdmitError::Invalid(
            "invalid dag name: lowercase letters, digits and '-', at most 63".into(),
        ))
    }
}

/// How a job runs, decided at submission.
struct Choice {
    policy: Policy,
    mode: JobMode,
    planned: Option<Planned>,
    /// Recorded with the job when planning failed and it profiles instead.
    plan: Option<JobPlan>,
    /// Why this mode (the job's `mode_reason`).
    reason: String,
}

/// What planning needs to see what the agents keep warm, taken into the database's thread.
struct WarmInputs {
    jobs: Option<Arc<Runtime>>,
    now_ms: i64,
    timeout: std::time::Duration,
    /// The code digest of each handler stage (by function index).
    digests: std::collections::BTreeMap<usize, String>,
}

impl WarmInputs {
    fn source(&self, db: &Db) -> Result<crate::learn::warm::Source<'_>, crate::store::StoreError> {
        crate::learn::warm::Source::alive(
            db,
            self.jobs.as_ref().map(|rt| &rt.warm),
            self.now_ms,
            self.timeout,
            self.jobs.as_ref().is_some_and(|rt| rt.config.prewarm),
            self.digests.clone(),
        )
    }
}

/// The code digest of each resolved handler stage, by function index.
fn digests_of(
    handlers: &std::collections::BTreeMap<usize, sonic_api::agent::HandlerRun>,
) -> std::collections::BTreeMap<usize, String> {
    handlers
        .iter()
        .map(|(i, h)| (*i, h.sha256.clone()))
        .collect()
}

fn warm_inputs(ctx: &Context, digests: std::collections::BTreeMap<usize, String>) -> WarmInputs {
    WarmInputs {
        jobs: ctx.jobs.clone(),
        now_ms: ctx.clock.now_ms(),
        timeout: ctx.heartbeat_timeout,
        digests,
    }
}

/// The policy of a job: a forced one wins; otherwise `sonic`, planned for this input size, once
/// the models of the job's parameter setting converged, and `remote` (profiling) before. A
/// forced `sonic` plans with whatever the setting's models predict, and is refused when they
/// cannot predict or nothing is feasible. `digests`: the code digest of each handler stage (by
/// function index), for what the agents keep warm of it.
#[allow(clippy::too_many_arguments)]
async fn choose(
    ctx: &Context,
    dag: &Dag,
    setting: Setting,
    forced: Option<Policy>,
    planned_baseline: bool,
    input_bytes: u64,
    fanouts: Vec<sonic_core::dag::Fanout>,
    digests: std::collections::BTreeMap<usize, String>,
) -> Result<Choice, AdmitError> {
    let profiling = |policy: Policy, plan: Option<JobPlan>, reason: String| Choice {
        policy,
        mode: JobMode::Profiling,
        planned: None,
        plan,
        reason,
    };
    let baseline = forced.filter(|p| Policy::BASELINES.contains(p));
    if forced == Some(Policy::Memory)
        && ctx
            .jobs
            .as_ref()
            .is_none_or(|rt| rt.config.memory_tier.is_none())
    {
        return Err(AdmitError::Invalid(
            "policy memory passes every edge through the memory tier, and this control plane has none: start it with --memory-tier redis://HOST:PORT (SONIC_MEMORY_TIER)".into(),
        ));
    }
    if let (Some(p), Some(base)) = (forced, baseline) {
        if !planned_baseline {
            return Ok(profiling(p, None, crate::learn::forced_unplanned(p)));
        }
        let rule = ctx.convergence();
        let (catalog, bandwidth) = ctx.planning_catalog();
        let budget = ctx.plan_budget();
        let dag = dag.clone();
        let warm = warm_inputs(ctx, digests.clone());
        let _slot = ctx
            .planning
            .enter()
            .await
            .map_err(|e| AdmitError::Busy(e.to_string()))?;
        let planned = ctx
            .db
            .run(move |db| {
                let models = crate::learn::current(db, &dag, &setting, rule)?;
                let warm = warm.source(db)?;
                Ok(crate::learn::plan_for(
                    &dag,
                    &models,
                    input_bytes,
                    &fanouts,
                    catalog,
                    &bandwidth,
                    base,
                    budget,
                    &warm,
                ))
            })
            .await?
            .map_err(plan_error)?;
        return Ok(Choice {
            policy: p,
            mode: JobMode::Planned,
            planned: Some(planned),
            plan: None,
            reason: format!("policy {p} forced, planned as the planner places it"),
        });
    }
    if planned_baseline {
        return Err(AdmitError::Invalid(
            "planned: only with a forced remote, direct or local policy".into(),
        ));
    }
    let rule = ctx.convergence();
    let (catalog, bandwidth) = ctx.planning_catalog();
    let budget = ctx.plan_budget();
    let dag = dag.clone();
    let warm = warm_inputs(ctx, digests);
    if forced == Some(Policy::Oracle) {
        let _slot = ctx
            .planning
            .enter()
            .await
            .map_err(|e| AdmitError::Busy(e.to_string()))?;
        let planned = ctx
            .db
            .run(move |db| {
                let samples = crate::learn::fitted_samples(db, &dag, &setting)?;
                let warm = warm.source(db)?;
                Ok(
                    crate::learn::measured_params(&dag, &samples, input_bytes).and_then(|params| {
                        crate::learn::plan_with(
                            &dag,
                            params,
                            input_bytes,
                            &fanouts,
                            catalog,
                            &bandwidth,
                            Policy::Oracle,
                            budget,
                            std::time::Instant::now(),
                            &warm,
                        )
                    }),
                )
            })
            .await?
            .map_err(plan_error)?;
        return Ok(Choice {
            policy: Policy::Oracle,
            mode: JobMode::Planned,
            planned: Some(planned),
            plan: None,
            reason: "policy oracle forced: planned with the parameters measured at this input size"
                .into(),
        });
    }
    let forced_sonic = forced.is_some();
    // `sonic`, or the paper's planner (`sonic-mean`) when forced.
    let policy = forced.unwrap_or(Policy::Sonic);
    let now = ctx.clock.now_ms();
    // Whether it plans is the setting's mode's call (cheap); the planning itself takes a slot
    // of the planning gate (bounded: a submission past its queue is refused, 503).
    let (decide_dag, decide_setting) = (dag.clone(), setting.clone());
    let (reason, plans) = ctx
        .db
        .run(move |db| {
            let (dag, setting) = (decide_dag, decide_setting);
            let models = crate::learn::current(db, &dag, &setting, rule)?;
            // The setting's mode decides, not the models' error of the moment (hysteresis).
            let mode = crate::learn::mode_of(db, &dag.name, &setting, &models, now)?;
            let reason = if forced_sonic {
                format!("policy {policy} forced: planned with what the models predict")
            } else {
                crate::learn::reason(&setting, &mode, &models)
            };
            Ok((
                reason,
                forced_sonic || mode.mode != sonic_core::mode::Mode::Profiling,
            ))
        })
        .await?;
    let outcome = if plans {
        let _slot = ctx
            .planning
            .enter()
            .await
            .map_err(|e| AdmitError::Busy(e.to_string()))?;
        let planned = ctx
            .db
            .run(move |db| {
                let models = crate::learn::current(db, &dag, &setting, rule)?;
                let warm = warm.source(db)?;
                Ok(crate::learn::plan_for(
                    &dag,
                    &models,
                    input_bytes,
                    &fanouts,
                    catalog,
                    &bandwidth,
                    policy,
                    budget,
                    &warm,
                ))
            })
            .await?;
        Some(planned)
    } else {
        None
    };
    match outcome {
        None => Ok(profiling(Policy::Remote, None, reason)),
        Some(Ok(planned)) => Ok(Choice {
            policy,
            mode: JobMode::Planned,
            planned: Some(planned),
            plan: None,
            reason,
        }),
        Some(Err(e)) if forced_sonic => Err(plan_error(e)),
        // An objective no plan meets refuses the job before it runs (interfaces.md §6).
        Some(Err(e @ crate::learn::PlanFailure::Slo { .. })) => Err(plan_error(e)),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "planned dag, but no plan: the job profiles");
            Ok(profiling(
                Policy::Remote,
                Some(JobPlan {
                    used: sonic_api::control::PlanUsed::None,
                    notes: vec![format!("{e}: the job profiles with remote instead")],
                    report: None,
                    stages: Vec::new(),
                    exact: None,
                }),
                format!("{reason}; but no plan ({e}): the job profiles with remote instead"),
            ))
        }
    }
}

/// Plans a planned job again as it was chosen at submission (its policy, its input size, its
/// parameters), with the models and bandwidths there are now: a job a restarted control plane
/// resumes.
pub async fn plan_again(ctx: &Context, job: &JobRecord) -> Result<Planned, String> {
    let parsed = ctx
        .db
        .parsed_dag_at(&job.dag, job.dag_revision)
        .await
        .map_err(|e| format!("database: {e}"))?
        .ok_or_else(|| job.dag_missing())?;
    // Planned again for the objective it was submitted with.
    let dag = &sonic_core::dag::Dag {
        slo: job.slo,
        ..parsed.dag.clone()
    };
    let overrides = job.params.clone().into_iter().collect();
    let fanouts = dag.fanouts(&dag.job_params(&overrides))?;
    let setting = crate::learn::job_setting(dag, &job.params);
    let policy = job.policy;
    let baseline = Policy::BASELINES.contains(&policy);
    // The execution resolves the handlers again (and fails if one is gone); here an unresolved
    // one only counts as keeping nothing warm.
    let digests = match &ctx.jobs {
        Some(rt) => crate::exec::handlers::resolve(rt, dag)
            .await
            .map(|h| digests_of(&h))
            .unwrap_or_default(),
        None => Default::default(),
    };
    let choice = choose(
        ctx,
        dag,
        setting,
        Some(policy),
        baseline,
        job.input_bytes,
        fanouts,
        digests,
    )
    .await
    .map_err(|e| e.to_string())?;
    choice
        .planned
        .ok_or_else(|| format!("{} plans nothing", job.policy))
}

/// What `GET /v1/dags/{name}/plan` answers: the plan a job of DAG `name` would get at
/// `input_bytes` under `policy`, with the DAG's default parameters (their setting's models
/// predict what they do not fix), priced on what the agents keep warm.
pub async fn plan_dag(
    ctx: &Context,
    name: String,
    input_bytes: u64,
    policy: Policy,
    objective: Objective,
) -> Result<Planned, AdmitError> {
    if policy == Policy::Oracle {
        return Err(AdmitError::Invalid(
            "oracle plans with measured parameters: use `ofctl plan --params FILE --policy oracle`"
                .into(),
        ));
    }
    let rule = ctx.convergence();
    let budget = ctx.plan_budget();
    let (catalog, bandwidth) = ctx.planning_catalog();
    let lookup = name.clone();
    let mut warm = warm_inputs(ctx, Default::default());
    let _slot = ctx
        .planning
        .enter()
        .await
        .map_err(|e| AdmitError::Busy(e.to_string()))?;
    let planned = ctx
        .db
        .run(move |db| {
            let Some(parsed) = db.load_dag(&lookup)? else {
                return Ok(None);
            };
            let dag = &sonic_core::dag::Dag {
                slo: objective.of(parsed.dag.slo),
                ..parsed.dag.clone()
            };
            // The code digest of each handler stage, read from the registry (nothing is
            // stored), so that their warm containers count as a job's would.
            if let Some(rt) = &warm.jobs {
                warm.digests = crate::exec::handlers::digests(rt, dag);
            }
            // The DAG's default parameters: their setting's models, and they fix what fanouts
            // they can; the models predict the rest.
            let models = crate::learn::current(db, dag, &crate::learn::default_setting(dag), rule)?;
            let fanouts = dag
                .fanouts(&dag.job_params(&Default::default()))
                .unwrap_or_default();
            Ok(Some(
                crate::learn::plan_for(
                    dag,
                    &models,
                    input_bytes,
                    &fanouts,
                    catalog,
                    &bandwidth,
                    policy,
                    budget,
                    &warm.source(db)?,
                )
                .map_err(plan_error),
            ))
        })
        .await?
        .ok_or_else(|| AdmitError::NotFound(format!("no dag named {name}")))??;
    Ok(planned)
}

/// A request's percentile objective: its own (`slo`), else its DAG's; best effort if either
/// says so.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Objective {
    /// The request's own objective.
    pub slo: Option<sonic_core::slo::Slo>,
    /// Run (or plan) the lowest percentile latency where no plan meets the objective.
    pub best_effort: bool,
}

impl Objective {
    /// The objective that applies, given the DAG's own.
    pub fn of(&self, dag: Option<sonic_core::slo::Slo>) -> Option<sonic_core::slo::Slo> {
        self.slo
            .or(dag)
            .map(|s| s.best_effort(s.best_effort || self.best_effort))
    }
}

fn plan_error(e: PlanFailure) -> AdmitError {
    match e {
        PlanFailure::NotReady { .. } => AdmitError::NotReady(e.to_string()),
        PlanFailure::Infeasible { .. } | PlanFailure::Budget { .. } | PlanFailure::Slo { .. } => {
            AdmitError::Infeasible(e.to_string())
        }
    }
}

/// Checks, plans and starts a job: what `POST /v1/jobs` and the dashboard's run form do.
pub async fn submit(ctx: &Arc<Context>, req: SubmitJob) -> Result<JobAccepted, AdmitError> {
    Ok(submit_keyed(ctx, req, None).await?.accepted)
}

/// What a submission came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The job.
    pub accepted: JobAccepted,
    /// Its submission key had already made it: nothing new was started.
    pub existed: bool,
}

/// The most characters of a submission key.
pub const MAX_KEY_CHARS: usize = 255;

/// Checks a submission key: 1 to [`MAX_KEY_CHARS`] visible ASCII characters.
pub fn check_key(key: &str) -> Result<(), AdmitError> {
    if !key.is_empty() && key.len() <= MAX_KEY_CHARS && key.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(AdmitError::Invalid(format!(
            "Idempotency-Key: 1 to {MAX_KEY_CHARS} visible ASCII characters (no spaces)"
        )))
    }
}

/// [`submit`], idempotent under `key` (interfaces.md §7): a key that already made a job of the
/// DAG returns that job, whatever its state, and starts nothing. Two submissions with one key at
/// once make one job (the key is recorded with the job, in one transaction).
pub async fn submit_keyed(
    ctx: &Arc<Context>,
    req: SubmitJob,
    key: Option<&str>,
) -> Result<Submitted, AdmitError> {
    let rt = ctx.jobs.clone().ok_or_else(|| {
        AdmitError::NoJobs("this control plane runs no jobs: it has no object store".into())
    })?;
    let dag_name = checked_dag_name(req.dag.clone())?;
    if let Some(key) = key {
        check_key(key)?;
        let (dag, k) = (dag_name.clone(), key.to_owned());
        if let Some(id) = ctx.db.run(move |db| db.job_for_key(&dag, &k)).await? {
            return existing(ctx, id).await;
        }
    }
    // Read by name where the request was parsed (`SubmitJob::policy`).
    let forced: Option<Policy> = req.policy;
    // Parsed once per revision and kept (`Db::parsed_dag`): no blocking thread once looked up.
    let parsed = tracing::Instrument::instrument(
        ctx.db.parsed_dag(&dag_name),
        tracing::debug_span!("submit_dag"),
    )
    .await?
    .ok_or_else(|| AdmitError::NotFound(format!("no dag named {dag_name}")))?;
    // An older revision, when asked for: the DAG must still be registered.
    let parsed = match req.revision {
        Some(r) if r != parsed.revision => ctx
            .db
            .parsed_dag_at(&dag_name, Some(r))
            .await?
            .ok_or_else(|| {
                AdmitError::NotFound(format!(
                    "dag {dag_name} has no revision {r} (its revision now is {})",
                    parsed.revision
                ))
            })?,
        _ => parsed,
    };
    // The job's percentile objective: its own, else its DAG's; best effort if either says so.
    let slo = Objective {
        slo: req.slo,
        best_effort: req.slo_best_effort,
    }
    .of(parsed.dag.slo);
    let with_slo;
    let dag = if slo == parsed.dag.slo {
        &parsed.dag
    } else {
        with_slo = sonic_core::dag::Dag {
            slo,
            ..parsed.dag.clone()
        };
        &with_slo
    };
    if dag.input_required && req.input.is_none() {
        return Err(AdmitError::Invalid(format!(
            "DAG {} needs an input (its `input: required`): give one (ofctl run {} --input FILE)",
            dag.name, dag.name
        )));
    }
    let overrides = req.params.clone().into_iter().collect();
    dag.check_overrides(&overrides)
        .map_err(|e| AdmitError::Invalid(format!("params: {e}")))?;
    let fanouts = dag
        .fanouts(&dag.job_params(&overrides))
        .map_err(|e| AdmitError::Invalid(format!("params: {e}")))?;
    // A handler that is not registered refuses the job now, before anything is stored.
    let digests = digests_of(
        &crate::exec::handlers::resolve(&rt, dag)
            .await
            .map_err(AdmitError::Invalid)?,
    );
    // So does a secret its functions name that is nowhere (its value is read again when the
    // job runs, never kept with the job).
    let needed = crate::exec::secrets::needed(dag);
    if !needed.is_empty() {
        let dir = rt.config.secrets_dir.clone();
        ctx.db
            .run(move |db| Ok(crate::exec::secrets::resolve(db, dir.as_deref(), &needed)))
            .await?
            .map_err(|e| AdmitError::Invalid(format!("DAG {}: {e}", dag.name)))?;
    }
    let job_id = new_job_id();
    // The input is checked and measured first; it is stored once the job is accepted.
    let mut input: Option<(JobInputFile, Option<Vec<u8>>)> = None;
    let mut input_bytes = 0u64;
    if let Some(spec) = &req.input {
        let checked_name = |name: String| {
            if valid_file_name(&name) {
                Ok(name)
            } else {
                Err(AdmitError::Invalid(
                    "input.name: letters, digits, '.', '_' and '-'".into(),
                ))
            }
        };
        let (file, bytes, size) = match (&spec.base64, &spec.key) {
            (Some(data), None) => {
                let bytes = crate::exec::requests::decode_base64(data)
                    .map_err(|e| AdmitError::Invalid(format!("input.base64: {e}")))?;
                let name = checked_name(spec.name.clone().unwrap_or_else(|| "input".into()))?;
                let key = format!("jobs/{job_id}/input/{name}");
                let size = bytes.len() as u64;
                (JobInputFile { name, key }, Some(bytes), size)
            }
            (None, Some(key)) => {
                let size = rt
                    .store
                    .head(key)
                    .await
                    .map_err(|e| AdmitError::Invalid(format!("input.key: {e}")))?
                    .ok_or_else(|| AdmitError::Invalid(format!("input.key: no object {key}")))?;
                let name = checked_name(
                    spec.name
                        .clone()
                        .unwrap_or_else(|| key.rsplit('/').next().unwrap_or("input").to_owned()),
                )?;
                (
                    JobInputFile {
                        name,
                        key: key.clone(),
                    },
                    None,
                    size,
                )
            }
            _ => {
                return Err(AdmitError::Invalid(
                    "input: give exactly one of base64 and key".into(),
                ));
            }
        };
        input_bytes = size;
        input = Some((file, bytes));
    }
    let setting = crate::learn::job_setting(dag, &req.params);
    let mut choice = choose(
        ctx,
        dag,
        setting,
        forced,
        req.planned,
        input_bytes,
        fanouts,
        digests,
    )
    .await?;
    if let Some(p) = choice.planned.as_mut() {
        // Why this plan: what the baselines would predict at the same parameters.
        let (catalog, _) = ctx.planning_catalog();
        p.report.baselines = Some(baselines::baselines(dag, &p.params, catalog));
    }
    let mut inputs = Vec::new();
    if let Some((file, bytes)) = input {
        if let Some(bytes) = bytes {
            rt.store
                .put_bytes(&file.key, bytes::Bytes::from(bytes))
                .await
                .map_err(|e| AdmitError::Internal(format!("cannot store the input: {e}")))?;
        }
        inputs.push(file);
    }
    let now = ctx.clock.now_ms();
    let record = JobRecord {
        id: job_id.clone(),
        dag: dag.name.clone(),
        status: JobStatus::Queued,
        policy: choice.policy,
        mode: choice.mode,
        input_bytes,
        params: req.params,
        summary: None,
        error: None,
        created_ms: now,
        started_ms: None,
        finished_ms: None,
        updated_ms: now,
        plan: choice.plan,
        mode_reason: Some(choice.reason.clone()),
        slo: dag.slo,
        dag_revision: Some(parsed.revision),
        retried_ms: None,
    };
    let stored = record.clone();
    let owned_key = key.map(str::to_owned);
    let made_before = tracing::Instrument::instrument(
        ctx.db.commit(move |w| match &owned_key {
            Some(k) => w.insert_keyed_job(&stored, k),
            None => w.insert_job(&stored).map(|()| None),
        }),
        tracing::debug_span!("submit_record"),
    )
    .await?;
    if let Some(id) = made_before {
        // Another submission with the key made its job first: this one's input goes.
        for file in &inputs {
            if file.key.starts_with(&format!("jobs/{job_id}/")) {
                let _ = rt.store.delete(&file.key).await;
            }
        }
        return existing(ctx, id).await;
    }
    ctx.metrics
        .job_submitted(choice.policy.as_str(), choice.mode.as_str());
    if let Some(p) = &choice.planned {
        let us = p.report.plan.planning_time_us as f64;
        ctx.metrics.planned(choice.policy.as_str(), us / 1e6);
    }
    tracing::info!(job = %job_id, dag = %record.dag, policy = %choice.policy, mode = %choice.mode, reason = %choice.reason, input_bytes, "job submitted");
    // Registered before the task starts: a cancel that comes right after the 202 reaches it.
    let cancel = rt.register(&job_id);
    // Every event of the job (its stages, instances, cleanup) carries the job's span; a root
    // span, so that the submission's span ends with the submission.
    let span = tracing::info_span!(parent: None, "job", job = %job_id, dag = %record.dag, policy = %choice.policy);
    rt.spawn_job(tracing::Instrument::instrument(
        crate::exec::execute(
            ctx.clone(),
            rt.clone(),
            record,
            inputs,
            cancel,
            choice.planned,
        ),
        span,
    ));
    Ok(Submitted {
        accepted: JobAccepted {
            job_id,
            status: JobStatus::Queued,
        },
        existed: false,
    })
}

/// The job a submission key made before, as a submission's answer.
async fn existing(ctx: &Context, id: String) -> Result<Submitted, AdmitError> {
    let job = job_record(ctx, &id).await?;
    Ok(Submitted {
        accepted: JobAccepted {
            job_id: job.id,
            status: job.status,
        },
        existed: true,
    })
}

/// Asks the executor to stop a job that has not ended (a job nothing executes ends now); the
/// job's record after.
pub async fn cancel(ctx: &Context, id: String) -> Result<JobRecord, AdmitError> {
    let job = job_record(ctx, &id).await?;
    if job.status.is_terminal() {
        return Err(AdmitError::Invalid(format!(
            "job {id} already {}",
            job.status
        )));
    }
    let running_here = ctx.jobs.as_ref().is_some_and(|rt| rt.cancel(&id));
    if !running_here {
        // Nothing executes it (it can only be a leftover): end it now.
        let now = ctx.clock.now_ms();
        let target = id.clone();
        ctx.db
            .run(move |db| db.finish_job(&target, JobStatus::Failed, None, Some("cancelled"), now))
            .await?;
    }
    tracing::info!(job = %id, "job cancel requested");
    let job = ctx
        .db
        .run(move |db| db.get_job(&id))
        .await?
        .ok_or_else(|| AdmitError::Internal("job vanished".into()))?;
    Ok(job)
}

/// Queues failed (or cancelled) job `id` again under its id (`ofctl retry`): it runs from what it
/// kept, its succeeded instances restored and not run again, with the revision, parameters,
/// policy and input it had; a planned job is planned again for its placement.
pub async fn retry(ctx: &Arc<Context>, id: String) -> Result<JobAccepted, AdmitError> {
    let rt = ctx.jobs.clone().ok_or_else(|| {
        AdmitError::NoJobs("this control plane runs no jobs: it has no object store".into())
    })?;
    let now = ctx.clock.now_ms();
    let target = id.clone();
    let retried = ctx.db.commit(move |w| w.retry_job(&target, now)).await?;
    let (job, reused) = match retried {
        Retry::Queued { job, reused } => (*job, reused),
        Retry::NotFound => return Err(AdmitError::NotFound(format!("no job {id}"))),
        Retry::NotFailed(status) => {
            return Err(AdmitError::Conflict(format!(
                "job {id} is {status}: only a failed or cancelled job can be retried"
            )));
        }
        Retry::NothingKept => {
            return Err(AdmitError::Conflict(format!(
                "job {id} cannot be retried: what it kept was deleted (a failed job keeps its files for the control plane's keep_failed); submit it again"
            )));
        }
    };
    tracing::info!(job = %id, reused, "job retried");
    let cancel = rt.register(&job.id);
    let span = tracing::info_span!(parent: None, "job", job = %job.id, dag = %job.dag, policy = %job.policy);
    rt.spawn_job(tracing::Instrument::instrument(
        resume(ctx.clone(), rt.clone(), job, cancel),
        span,
    ));
    Ok(JobAccepted {
        job_id: id,
        status: JobStatus::Queued,
    })
}

/// Deletes ended job `id` whole ([`crate::exec::delete_job`]); a job that has not ended is
/// refused (cancel it first).
pub async fn delete_job(ctx: &Arc<Context>, id: String) -> Result<(), AdmitError> {
    let rt = ctx.jobs.clone().ok_or_else(|| {
        AdmitError::NoJobs("this control plane runs no jobs: it has no object store".into())
    })?;
    match crate::exec::delete_job(ctx, &rt, &id).await? {
        DeleteJob::Deleted(_) => {
            tracing::info!(job = %id, "job deleted");
            Ok(())
        }
        DeleteJob::NotFound => Err(AdmitError::NotFound(format!("no job {id}"))),
        DeleteJob::NotEnded(status) => Err(AdmitError::Conflict(format!(
            "job {id} is {status}: cancel it first (ofctl cancel {id})"
        ))),
    }
}

/// The record of job `id`, or [`AdmitError::NotFound`].
pub async fn job_record(ctx: &Context, id: &str) -> Result<JobRecord, AdmitError> {
    let lookup = id.to_owned();
    ctx.db
        .run(move |db| db.get_job(&lookup))
        .await?
        .ok_or_else(|| AdmitError::NotFound(format!("no job {id}")))
}

fn valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn new_job_id() -> String {
    use rand::Rng;
    let n: u64 = rand::thread_rng().r#gen();
    format!("j-{n:016x}")
}

/// Goes on with a job a previous control plane left unfinished ([`crate::exec::resume`]): a
/// planned job is planned again first (the models and the catalog are in the database; the
/// resource manager is then asked for the agents it ran on before).
pub async fn resume(
    ctx: Arc<Context>,
    rt: Arc<Runtime>,
    job: JobRecord,
    cancel: CancellationToken,
) {
    let planned = if job.mode == JobMode::Planned {
        Some(plan_again(&ctx, &job).await)
    } else {
        None
    };
    crate::exec::resume(ctx, rt, job, cancel, planned).await;
}

/// A secret's name as the API takes it ([`sonic_core::dag::valid_secret_name`]).
fn checked_secret_name(name: &str) -> Result<(), AdmitError> {
    if sonic_core::dag::valid_secret_name(name) {
        Ok(())
    } else {
        Err(AdmitError::Invalid(
            "invalid secret name: letters, digits, '.', '_' and '-', not first a '.', at most 128"
                .into(),
        ))
    }
}

/// Sets the secret `name` in the store to `value` (checked: text, no NUL, at most 64 KiB).
pub async fn put_secret(ctx: &Context, name: String, value: &[u8]) -> Result<(), AdmitError> {
    checked_secret_name(&name)?;
    let value = crate::exec::secrets::check_value(value)
        .map_err(AdmitError::Invalid)?
        .to_owned();
    let now = ctx.clock.now_ms();
    ctx.db
        .commit(move |w| w.put_secret(&name, &value, now))
        .await?;
    Ok(())
}

/// Every secret functions may name, without values.
pub async fn list_secrets(
    ctx: &Context,
) -> Result<Vec<sonic_api::control::SecretView>, AdmitError> {
    let dir = ctx
        .jobs
        .as_ref()
        .and_then(|rt| rt.config.secrets_dir.clone());
    Ok(ctx
        .db
        .run(move |db| crate::exec::secrets::list(db, dir.as_deref()))
        .await?)
}

/// Deletes the secret `name` from the store; one that only the secrets folder holds is the
/// operator's file to remove.
pub async fn delete_secret(ctx: &Context, name: String) -> Result<(), AdmitError> {
    checked_secret_name(&name)?;
    let gone = name.clone();
    if ctx.db.commit(move |w| w.delete_secret(&gone)).await? {
        return Ok(());
    }
    let in_dir = list_secrets(ctx)
        .await?
        .into_iter()
        .any(|s| s.name == name && s.source == "file");
    Err(if in_dir {
        AdmitError::Conflict(format!(
            "secret {name} is a file of the control plane's secrets folder: remove the file"
        ))
    } else {
        AdmitError::NotFound(format!("no secret {name}"))
    })
}

/// How long an apply waits for each agent's answer about the DAG's executables.
const RUNNABLE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the alive agents cannot start of `dag`'s executables (its `on_failure` function's
/// too), one line per executable: on which agents and why. Handlers are the OpenLambda
/// registry's (checked at submission). An agent that does not answer is said so; none alive,
/// nothing is checked.
pub async fn runnable_warnings(ctx: &Context, dag: &sonic_core::dag::Dag) -> Vec<String> {
    use sonic_api::agent::{Runnable, RunnableCheck};
    let Some(rt) = &ctx.jobs else {
        return Vec::new();
    };
    // Each executable once, with the functions that run it.
    let mut wanted: std::collections::BTreeMap<Runnable, Vec<&str>> = Default::default();
    for f in dag.functions.iter().chain(dag.on_failure.as_ref()) {
        if f.handler.is_some() {
            continue;
        }
        let Some(program) = f.command.first() else {
            continue;
        };
        wanted
            .entry(Runnable {
                image: f.image.clone(),
                program: program.clone(),
            })
            .or_default()
            .push(&f.name);
    }
    if wanted.is_empty() {
        return Vec::new();
    }
    let now = ctx.clock.now_ms();
    let timeout = ctx.heartbeat_timeout;
    let agents: Vec<crate::store::AgentSlot> = match ctx.db.run(|db| db.list_agents()).await {
        Ok(list) => list
            .into_iter()
            .filter(|a| a.alive(now, timeout))
            .map(crate::store::AgentSlot::from)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the agents to check a DAG's executables");
            return Vec::new();
        }
    };
    let check = RunnableCheck {
        runnables: wanted.keys().cloned().collect(),
    };
    let answers = futures::future::join_all(
        agents
            .iter()
            .map(|a| rt.runnable(a, &check, RUNNABLE_TIMEOUT)),
    )
    .await;
    // Per executable: the agents that cannot start it, with why.
    let mut missing: std::collections::BTreeMap<Runnable, Vec<String>> = Default::default();
    let mut warnings = Vec::new();
    for (agent, answer) in agents.iter().zip(answers) {
        match answer {
            Ok(report) => {
                for m in report.missing {
                    let key = Runnable {
                        image: m.image,
                        program: m.program,
                    };
                    missing
                        .entry(key)
                        .or_default()
                        .push(format!("{} ({})", agent.id, m.why));
                }
            }
            Err(e) => warnings.push(format!(
                "agent {} did not say whether it can start this DAG's executables: {e}",
                agent.id
            )),
        }
    }
    for (r, on) in missing {
        let functions = wanted.get(&r).map(|fs| fs.join(", ")).unwrap_or_default();
        let all = on.len() == agents.len();
        warnings.push(format!(
            "function {functions} ({} {}): {} of {} agents cannot start it: {}{}",
            r.image,
            r.program,
            on.len(),
            agents.len(),
            on.join("; "),
            if all {
                "; its jobs will fail unrunnable until it is there"
            } else {
                "; its runs placed there would fail unrunnable"
            }
        ));
    }
    warnings
}
