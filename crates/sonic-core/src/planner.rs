//! The planner: for every stage a placement (VM type, VM count, concurrency) and for every edge
//! a data-passing method, chosen to maximize Perf/$ = 1 / (latency * cost) under the user's
//! bounds, exactly (see [`dp`] and docs/model.md), within a [`Budget`]; and the baseline
//! policies.

mod budget;
mod chain;
mod dp;
mod explain;
mod slo;

use std::cell::OnceCell;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dag::Bounds;
use crate::model::{Assignment, Method, Placement, PlanProblem, Prediction, ProblemError};

pub use budget::{
    Budget, CLOCK_EVERY, DEFAULT_MAX_MEMORY, Limit, Stopped, StoppedSearch, Stopwatch,
};
pub use explain::{MethodAlternative, OptionRow, StageDecision};

use budget::{Frozen, Meter};

/// How a job is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The exact planner: Perf/$ on means, or under a percentile SLO the cheapest plan whose
    /// predicted percentile latency meets it ([`plan_for_slo`]).
    Sonic,
    /// The planner as the SONIC paper describes it (means, Perf/$, no distributions), kept as a
    /// baseline: an SLO's latency is to it a bound on the mean.
    SonicMean,
    /// Every edge through the object store, one smallest-fitting VM per lambda (OpenLambda + S3).
    Remote,
    /// The whole job on one largest VM, every edge vm-storage, lambdas serialized as memory
    /// requires (SAND).
    Local,
    /// Every edge direct, one smallest-fitting VM per lambda.
    Direct,
    /// Every edge through the memory tier where it holds the edge (the store otherwise), one
    /// smallest-fitting VM per lambda (OpenLambda + Pocket, or AWS Lambda + ElastiCache, the
    /// SONIC paper's baselines). Without a tier in the catalog, every edge goes to the store.
    Memory,
    /// The planner fed with measured rather than predicted parameters (evaluation only): the
    /// same search as `sonic`; the caller supplies the measured parameters.
    Oracle,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::Sonic,
        Policy::SonicMean,
        Policy::Remote,
        Policy::Local,
        Policy::Direct,
        Policy::Memory,
        Policy::Oracle,
    ];

    /// The policies that place a job by a fixed rule (the baselines).
    pub const BASELINES: [Policy; 4] = [
        Policy::Remote,
        Policy::Direct,
        Policy::Local,
        Policy::Memory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Sonic => "sonic",
            Policy::SonicMean => "sonic-mean",
            Policy::Remote => "remote",
            Policy::Local => "local",
            Policy::Direct => "direct",
            Policy::Memory => "memory",
            Policy::Oracle => "oracle",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown policy {s:?} (sonic, sonic-mean, remote, local, direct, memory, oracle)"
                )
            })
    }
}

/// Where one stage runs, as `ofctl plan -o json` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStage {
    pub function: String,
    pub vm_type: String,
    pub vms: u32,
    /// Lambdas on the fullest VM (they are spread evenly).
    pub per_vm: u32,
    /// Lambdas that run at once on one VM.
    pub concurrent: u32,
    /// The CPUs each instance is given: its VM type's vCPUs over `concurrent`
    /// ([`PlanProblem::cores`]); a function that uses several cores runs faster with more
    /// (`parallel` in its parameters). 1 in plans made before instances were sized.
    #[serde(default = "one_core")]
    pub cores: f64,
    /// Its first batch starts in warm environments the pool holds (priced hot, not cold).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// Its containers are started while its senders run (prewarming): its first batch is priced
    /// without the cold start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prewarmed: bool,
}

fn one_core() -> f64 {
    1.0
}

/// How one edge's data moves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEdge {
    pub from: String,
    pub to: String,
    pub method: Method,
    /// Predicted data-passing time (upload + fetch).
    pub predicted_s: f64,
}

/// The model's prediction for a whole plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
    /// The part of `cost_usd` charged per store request (PUT, GET), which does not grow with
    /// time; the rest (VMs, storage by the second) does (a time-dilated cluster divides only
    /// that rest: docs/evaluation.md).
    #[serde(default)]
    pub requests_usd: f64,
    /// The predicted end-to-end latency distribution (interfaces.md §6), where the parameters
    /// give the functions' times as distributions ([`crate::tails`]); absent when only means
    /// are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_quantiles_s: Option<Quantiles>,
}

/// Latency quantiles, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Quantiles {
    /// The quantiles of `d`.
    pub fn of(d: &crate::dist::Dist) -> Quantiles {
        Quantiles {
            p50: d.quantile(0.5),
            p90: d.quantile(0.9),
            p95: d.quantile(0.95),
            p99: d.quantile(0.99),
        }
    }
}

/// The model's timing of one stage of a plan, split into the terms an evaluation compares with
/// what a job measured (docs/evaluation.md, "Prediction quality"): from `ready_s` (its last
/// sender ended) to `end_s` = `ready_s` + `upload_s` + `wait_s` + `fetch_s` + `compute_s`.
/// `wait_s` holds what is neither data passing nor compute: the VMs busy with an earlier stage
/// (before `start_s`) and the per-instance overhead (`overhead_s`, after the compute), as an
/// evaluation measures waiting (a stage's time that is neither).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTiming {
    pub function: String,
    /// When its last sender's lambdas ended (0 for a stage without inputs).
    pub ready_s: f64,
    /// When every input was durable and its VMs were free: it starts fetching.
    pub start_s: f64,
    /// The part of `start_s - ready_s` spent uploading a sender's outputs to the store (the
    /// `remote` edge that made the inputs durable last).
    pub upload_s: f64,
    /// The rest of `start_s - ready_s` (its VMs still busy with an earlier stage, vm-storage),
    /// plus `overhead_s`.
    pub wait_s: f64,
    /// The part of `wait_s` that is the per-instance overhead of its batches
    /// (`batches * overhead_s` of the function): sending, the job's input, outputs and results
    /// registered and uploaded, the report. 0 in plans recorded before it was modeled.
    #[serde(default)]
    pub overhead_s: f64,
    /// Fetching its inputs onto its VMs (the slowest incoming edge).
    pub fetch_s: f64,
    /// Compute of the fullest VM: `cold + (batches - 1) * hot`.
    pub compute_s: f64,
    pub end_s: f64,
    pub batches: u32,
}

/// A plan: placements, methods, prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub stages: Vec<PlanStage>,
    pub edges: Vec<PlanEdge>,
    pub predicted: Predicted,
    /// Per stage, in the plan's stage order, the predicted timing (empty in plans recorded
    /// before it was reported).
    #[serde(default)]
    pub timing: Vec<StageTiming>,
}

/// What the planner returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanOutcome {
    pub best: Plan,
    /// The best plan without vm-storage on the edges where `best` uses it (the resource manager
    /// may veto vm-storage); `None` when `best` uses no vm-storage or no such plan meets the
    /// bounds.
    pub second_best: Option<Plan>,
    /// Per stage, what was considered and why the choice was made.
    pub table: Vec<StageDecision>,
    /// Whether `best` is what the policy asks for exactly: for `sonic` and `oracle`, the
    /// optimum, proven by a search that ran to its end within the budget.
    pub exact: bool,
    /// The limit that cut a search short, and which search, when one did.
    pub stopped: Option<Stopped>,
    /// The percentile objective the plan was made for, and whether its prediction meets it.
    pub slo: Option<SloVerdict>,
}

/// A plan against a percentile objective (interfaces.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloVerdict {
    pub percentile: f64,
    /// The objective's latency, seconds.
    pub latency_s: f64,
    /// The plan's predicted latency at the percentile.
    pub predicted_s: f64,
    /// Whether `predicted_s` is at most `latency_s`; `false` only where the plan runs anyway
    /// (`--slo-best-effort`, or a baseline policy, which plans by its own rule).
    pub met: bool,
}

/// The document `ofctl plan -o json` prints (interfaces.md §3). Read back with the defaults of
/// documents recorded before a field was added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    pub dag: String,
    pub policy: Policy,
    pub stages: Vec<PlanStage>,
    pub edges: Vec<PlanEdge>,
    pub predicted: Predicted,
    /// Per stage, the predicted timing of the plan above.
    #[serde(default)]
    pub timing: Vec<StageTiming>,
    #[serde(default)]
    pub second_best: Option<Plan>,
    #[serde(default)]
    pub planning_time_us: u64,
    /// Whether the plan is proven optimal (`false`: a limit of the planning budget stopped the
    /// search and this is the best plan found within it; `stopped` says which).
    #[serde(default = "proven")]
    pub exact: bool,
    /// The limit that stopped a search (`null` when none did).
    #[serde(default)]
    pub stopped: Option<Stopped>,
    /// The percentile objective the plan was made for (absent when none was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<SloVerdict>,
}

/// Plans recorded before planning had a budget were all searched to the end.
fn proven() -> bool {
    true
}

impl PlanOutcome {
    /// The `ofctl plan -o json` document for this outcome.
    pub fn report(&self, dag: &str, policy: Policy, planning_time_us: u64) -> PlanReport {
        PlanReport {
            dag: dag.to_owned(),
            policy,
            stages: self.best.stages.clone(),
            edges: self.best.edges.clone(),
            predicted: self.best.predicted,
            timing: self.best.timing.clone(),
            second_best: self.second_best.clone(),
            planning_time_us,
            exact: self.exact,
            stopped: self.stopped,
            slo: self.slo,
        }
    }
}

/// Each stage's predicted timing, split into terms (see [`StageTiming`]).
pub fn timing(pb: &PlanProblem, pred: &Prediction) -> Vec<StageTiming> {
    pb.stages()
        .iter()
        .enumerate()
        .map(|(s, st)| {
            let sp = &pred.stages[s];
            let inputs = pb.incoming(s);
            let end_of = |e: usize| pred.stages.get(pb.edges()[e].from).map_or(0.0, |x| x.end_s);
            let ready = inputs.iter().map(|&e| end_of(e)).fold(0.0, f64::max);
            let durable = inputs
                .iter()
                .map(|&e| end_of(e) + pred.edges.get(e).map_or(0.0, |t| t.upload_s))
                .fold(ready, f64::max);
            let gap = (sp.start_s - ready).max(0.0);
            let upload = (durable - ready).clamp(0.0, gap);
            StageTiming {
                function: st.name.clone(),
                ready_s: ready,
                start_s: sp.start_s,
                upload_s: upload,
                wait_s: gap - upload + sp.overhead_s,
                overhead_s: sp.overhead_s,
                fetch_s: sp.fetch_s,
                compute_s: sp.compute_s,
                end_s: sp.end_s,
                batches: sp.batches,
            }
        })
        .collect()
}

/// Why no plan came out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error("no plan meets the latency bound of {bound_s} s: the fastest plan takes {best_s:.3} s")]
    Latency { bound_s: f64, best_s: f64 },
    #[error("no plan meets the cost bound of ${bound_usd}: the cheapest plan costs ${best_usd:.6}")]
    Cost { bound_usd: f64, best_usd: f64 },
    #[error(
        "no plan meets both bounds ({bound_s} s, ${bound_usd}): the cheapest plan within {bound_s} s costs ${best_usd:.6}"
    )]
    Both {
        bound_s: f64,
        bound_usd: f64,
        best_usd: f64,
    },
    #[error(
        "no plan meets the SLO p{percentile} <= {latency_s} s: the lowest p{percentile} latency reachable is {best_s:.3} s (--slo-best-effort runs that plan)"
    )]
    Slo {
        percentile: f64,
        latency_s: f64,
        best_s: f64,
    },
    #[error("the plan does not match the problem: {0}")]
    Mismatch(String),
    #[error("stage {stage:?} has {edges} incoming edges; the exact planner handles at most {max}")]
    TooManyInputs {
        stage: String,
        edges: usize,
        max: usize,
    },
    #[error(
        "planning stopped at {limit} before {what} ({stages} stages, {edges} edges, up to {placements} placements of a stage, {evaluated} candidates evaluated); raise the planning budget or loosen the bounds"
    )]
    Budget {
        limit: Limit,
        /// What the search had not found yet.
        what: String,
        stages: usize,
        edges: usize,
        /// The most (VM type, VM count) placements of one stage.
        placements: usize,
        evaluated: u64,
    },
    /// A baseline policy's fixed rule cannot place the job (e.g. `direct` within a pool's VM
    /// limits: a receiver and the senders it fetches from need more VMs of a type at once).
    #[error("the {policy} plan cannot run: {why}")]
    Baseline { policy: Policy, why: String },
    /// Under a pool's VM limits, every plan holds more VMs of a type at once than the pool has
    /// (`PlanProblem::over_pool`).
    #[error(
        "no plan fits the pool ({limits}): every plan holds more VMs of a type at the same time (branches that run at once, or direct senders until their receivers fetch)"
    )]
    Pool { limits: String },
    #[error("internal error: {0}")]
    Internal(String),
}

impl Plan {
    /// The named plan of an assignment with its prediction.
    pub fn new(pb: &PlanProblem, a: &Assignment, pred: &Prediction) -> Plan {
        let stages = pb
            .stages()
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let pl = a.placements[s];
                PlanStage {
                    function: st.name.clone(),
                    vm_type: pb.catalog().vm_types[pl.vm].name.clone(),
                    vms: pl.vms,
                    per_vm: pb.per_vm(s, pl.vms),
                    concurrent: pl.concurrent,
                    cores: pb.cores(pl),
                    warm: pb.warm_start(s, pl),
                    prewarmed: pb.prewarmed(s, pl),
                }
            })
            .collect();
        let edges = pb
            .edges()
            .iter()
            .enumerate()
            .map(|(i, e)| PlanEdge {
                from: pb.stages()[e.from].name.clone(),
                to: pb.stages()[e.to].name.clone(),
                method: a.methods[i],
                predicted_s: pred.edges[i].seconds,
            })
            .collect();
        Plan {
            stages,
            edges,
            predicted: Predicted {
                latency_s: pred.latency_s,
                cost_usd: pred.cost_usd,
                perf_per_dollar: pred.perf_per_dollar,
                requests_usd: pred.cost.requests_usd,
                latency_quantiles_s: None,
            },
            timing: timing(pb, pred),
        }
    }

    /// The assignment this plan stands for in `pb` (by function and VM type names), e.g. to
    /// re-evaluate it under other parameters.
    pub fn assignment(&self, pb: &PlanProblem) -> Result<Assignment, PlanError> {
        let mismatch = |m: String| PlanError::Mismatch(m);
        let mut placements = Vec::with_capacity(pb.stages().len());
        for (s, st) in pb.stages().iter().enumerate() {
            let ps = self
                .stages
                .iter()
                .find(|p| p.function == st.name)
                .ok_or_else(|| mismatch(format!("no placement for {:?}", st.name)))?;
            let vm = pb
                .catalog()
                .vm_types
                .iter()
                .position(|v| v.name == ps.vm_type)
                .ok_or_else(|| mismatch(format!("unknown VM type {:?}", ps.vm_type)))?;
            let pl = Placement {
                vm,
                vms: ps.vms,
                concurrent: ps.concurrent,
            };
            pb.check_placement(s, pl)
                .map_err(|e| mismatch(e.to_string()))?;
            placements.push(pl);
        }
        let mut methods = Vec::with_capacity(pb.edges().len());
        for e in pb.edges() {
            let (from, to) = (&pb.stages()[e.from].name, &pb.stages()[e.to].name);
            let pe = self
                .edges
                .iter()
                .find(|pe| &pe.from == from && &pe.to == to)
                .ok_or_else(|| mismatch(format!("no method for edge {from} -> {to}")))?;
            methods.push(pe.method);
        }
        Ok(Assignment {
            placements,
            methods,
        })
    }
}

/// Plans a job under `policy` within the default [`Budget`] (no time limit, a cap on memory).
/// Baseline policies ignore the bounds (they are what they are); `sonic` and `oracle` meet them
/// or say which one cannot be met and what is achievable.
pub fn plan(pb: &PlanProblem, policy: Policy) -> Result<PlanOutcome, PlanError> {
    plan_within(pb, policy, Budget::default(), &Frozen)
}

/// [`plan`] within `budget`, its time read from `clock` (e.g. the [`std::time::Instant`]
/// planning started at). The searches check the budget as they go; past it, the best plan
/// found so far comes back with `exact: false` and the limit in `stopped`, or, when none meets
/// the bounds yet, [`PlanError::Budget`].
pub fn plan_within(
    pb: &PlanProblem,
    policy: Policy,
    budget: Budget,
    clock: &dyn Stopwatch,
) -> Result<PlanOutcome, PlanError> {
    match policy {
        Policy::Sonic | Policy::SonicMean | Policy::Oracle => {
            plan_exact(pb, &Meter::new(budget, clock))
        }
        Policy::Remote | Policy::Direct | Policy::Local | Policy::Memory => {
            let a = baseline(pb, policy);
            let pred = pb.evaluate(&a).map_err(|e| PlanError::Baseline {
                policy,
                why: e.to_string(),
            })?;
            let table = explain::table(pb, &a, &pred, None, false);
            Ok(PlanOutcome {
                best: Plan::new(pb, &a, &pred),
                second_best: None,
                table,
                exact: true,
                stopped: None,
                slo: None,
            })
        }
    }
}

/// Plans a job for a percentile objective (interfaces.md §6), within `budget` (its time read
/// from `clock`), the functions' instance times being `times` (one per stage,
/// [`crate::tails::stage_times`]).
///
/// - `sonic` and `oracle`: the cheapest plan whose predicted `slo.percentile` latency is at most
///   `slo.latency_s` and that meets the problem's bounds on the means ([`slo::search`], exact
///   unless the budget stops it); when no plan does, the plan with the lowest percentile
///   latency if `slo.best_effort`, else [`PlanError::Slo`] naming that latency.
/// - `sonic-mean`: the mean planner with the objective's latency as a bound on the mean.
/// - the baselines: their own plan.
///
/// Every outcome says how its plan stands against the objective (`slo`).
pub fn plan_for_slo(
    pb: &PlanProblem,
    policy: Policy,
    times: &[crate::tails::StageTimes],
    slo: crate::slo::Slo,
    budget: Budget,
    clock: &dyn Stopwatch,
) -> Result<PlanOutcome, PlanError> {
    let p = slo.probability();
    let internal = |what: &str, e: &dyn fmt::Display| PlanError::Internal(format!("{what}: {e}"));
    let latency = |a: &Assignment| {
        crate::tails::latency(pb, a, times)
            .map_err(|e| internal("the plan's latency distribution", &e))
    };
    let verdict = |q: f64| SloVerdict {
        percentile: slo.percentile,
        latency_s: slo.latency_s,
        predicted_s: q,
        met: q <= slo.latency_s,
    };
    match policy {
        Policy::Sonic | Policy::Oracle => {}
        Policy::SonicMean | Policy::Remote | Policy::Direct | Policy::Local | Policy::Memory => {
            let problem = if policy == Policy::SonicMean {
                let b = pb.bounds();
                let bound = b
                    .max_latency_s
                    .map_or(slo.latency_s, |x| x.min(slo.latency_s));
                pb.with_bounds(Bounds {
                    max_latency_s: Some(bound),
                    ..b
                })?
            } else {
                pb.clone()
            };
            let mut out = plan_within(&problem, policy, budget, clock)?;
            let d = latency(&out.best.assignment(pb)?)?;
            out.slo = Some(verdict(d.job.quantile(p)));
            return Ok(out);
        }
    }
    // Seeds: the baselines and the mean planner's plan, when its search fits the budget.
    let mut seeds: Vec<Assignment> = Policy::BASELINES
        .into_iter()
        .map(|b| baseline(pb, b))
        .collect();
    if let Ok(mean) = plan_exact(pb, &Meter::new(budget, clock))
        && let Ok(a) = mean.best.assignment(pb)
    {
        seeds.push(a);
    }
    let meter = Meter::new(budget, clock);
    let goal = slo::Goal::Cheapest {
        target_s: slo.latency_s,
    };
    let found = match slo::search(pb, times, p, goal, &seeds, &[], &meter).best {
        Some(f) => f,
        None => {
            let fastest = slo::search(pb, times, p, slo::Goal::Fastest, &seeds, &[], &meter);
            let cut = |limit| {
                Solvers::new(pb, &meter).budget_error(limit, "finding a plan that meets the SLO")
            };
            match (fastest.best, meter.stopped()) {
                (Some(f), _) if slo.best_effort => f,
                (_, Some(limit)) => return Err(cut(limit)),
                (Some(f), None) => {
                    return Err(PlanError::Slo {
                        percentile: slo.percentile,
                        latency_s: slo.latency_s,
                        best_s: f.quantile_s,
                    });
                }
                // No plan at all: the mean planner says why (the pool, the bounds).
                (None, None) => {
                    return Err(plan_exact(pb, &Meter::new(budget, clock))
                        .err()
                        .unwrap_or_else(|| PlanError::Internal("no plan can run".into())));
                }
            }
        }
    };
    let a = found.assignment;
    let pred = pb
        .evaluate(&a)
        .map_err(|e| internal("planned an infeasible plan", &e))?;
    let cut_best = meter.stopped();
    let d = latency(&a)?;
    let met = d.job.quantile(p) <= slo.latency_s;
    let mut best = Plan::new(pb, &a, &pred);
    best.predicted.latency_quantiles_s = Some(Quantiles::of(&d.job));
    // The second best, which a resource manager that vetoes vm-storage runs: the same search
    // without vm-storage on the edges where the best uses it (the fastest such plan where the
    // best does not meet the objective either).
    let banned: Vec<bool> = a.methods.iter().map(|m| *m == Method::VmStorage).collect();
    let second_best = if banned.iter().any(|&b| b) {
        let goal2 = if met { goal } else { slo::Goal::Fastest };
        match slo::search(pb, times, p, goal2, &seeds, &banned, &meter).best {
            Some(f) => {
                let p2 = pb
                    .evaluate(&f.assignment)
                    .map_err(|e| internal("second-best infeasible", &e))?;
                let d2 = latency(&f.assignment)?;
                let mut second = Plan::new(pb, &f.assignment, &p2);
                second.predicted.latency_quantiles_s = Some(Quantiles::of(&d2.job));
                Some(second)
            }
            None => None,
        }
    } else {
        None
    };
    let stopped = stopped_search(cut_best, meter.stopped());
    Ok(PlanOutcome {
        best,
        second_best,
        table: explain::table(pb, &a, &pred, None, cut_best.is_some()),
        exact: cut_best.is_none(),
        stopped,
        slo: Some(verdict(d.job.quantile(p))),
    })
}

/// The exact searches of one problem, built when first needed, and the budget they share.
struct Solvers<'a> {
    pb: &'a PlanProblem,
    meter: &'a Meter<'a>,
    chain: Option<chain::Chain<'a>>,
    search: OnceCell<Result<dp::Search<'a>, PlanError>>,
    /// The chain search without bans, which warm-starts the searches with bans.
    unbanned: OnceCell<Option<chain::ChainResult>>,
}

impl<'a> Solvers<'a> {
    fn new(pb: &'a PlanProblem, meter: &'a Meter<'a>) -> Self {
        Solvers {
            pb,
            meter,
            // The chain's sweeps price each edge's placements apart; under VM limits a
            // `direct` edge's two ends share the pool's VMs ([`PlanProblem::direct_fits`]),
            // which only the label search checks.
            chain: (chain::is_chain(pb) && !pb.has_vm_limits()).then(|| chain::Chain::new(pb)),
            search: OnceCell::new(),
            unbanned: OnceCell::new(),
        }
    }

    fn search(&self) -> Result<&dp::Search<'a>, PlanError> {
        self.search
            .get_or_init(|| dp::Search::new(self.pb))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The best plan meeting the bounds with no vm-storage on `banned` edges. A chain is solved
    /// by its hull search; when that optimum breaks a bound, the label search decides, seeded
    /// with every hull vertex found as a candidate. When the budget stops a search, the best
    /// complete plan known (`self.meter.stopped()` says so).
    fn best(&self, banned: &[bool]) -> Result<Option<(Assignment, dp::Stats)>, PlanError> {
        let b = self.pb.bounds();
        let meter = self.meter;
        let mut extra = Vec::new();
        let chain_result = self.chain.as_ref().and_then(|c| {
            if banned.iter().any(|&x| x) {
                let no_ban = vec![false; banned.len()];
                let warm = self.unbanned.get_or_init(|| c.run(&no_ban, None, meter));
                c.run(banned, warm.as_ref(), meter)
            } else {
                self.unbanned
                    .get_or_init(|| c.run(banned, None, meter))
                    .clone()
            }
        });
        if let Some(res) = chain_result {
            let found = res
                .points
                .iter()
                .find(|p| p.2 == res.best)
                .map(|p| (p.0, p.1));
            // A stopped hull search's best is only a candidate among the baselines.
            if let Some((l, c)) = found
                && meets(&b, l, c)
                && meter.stopped().is_none()
            {
                return Ok(Some((res.best, res.stats)));
            }
            extra = res
                .points
                .into_iter()
                .filter(|p| meets(&b, p.0, p.1))
                .map(|p| p.2)
                .collect();
        }
        let solved = self.search()?.solve(banned, true, &extra, meter);
        Ok(solved.best.map(|a| (a, solved.stats)))
    }

    /// The budget stopped the searches before they found `what`.
    fn budget_error(&self, limit: Limit, what: &str) -> PlanError {
        let pb = self.pb;
        let types = pb.catalog().vm_types.len();
        let placements = (0..pb.stages().len())
            .map(|s| {
                let fits = (0..types).filter(|&v| pb.max_concurrent(s, v) > 0).count();
                fits * pb.vm_counts(s).len()
            })
            .max()
            .unwrap_or(0);
        PlanError::Budget {
            limit,
            what: what.to_owned(),
            stages: pb.stages().len(),
            edges: pb.edges().len(),
            placements,
            evaluated: self.meter.expansions(),
        }
    }

    /// No plan meets the bounds: which bound fails, and what is achievable.
    fn bound_error(&self) -> Result<PlanError, PlanError> {
        let b = self.pb.bounds();
        let no_ban = vec![false; self.pb.edges().len()];
        let meter = self.meter;
        let what = "finding what the bounds allow (no plan meets them)";
        let cut = |limit| self.budget_error(limit, what);
        let extremes = self.chain.as_ref().and_then(|c| c.extremes(&no_ban, meter));
        if let Some(limit) = meter.stopped() {
            return Ok(cut(limit));
        }
        let (min_latency, min_cost) = match extremes {
            Some(x) => x,
            None => {
                let front = match self.search()?.front(&no_ban, Bounds::default(), meter) {
                    Ok(front) => front,
                    Err(limit) => return Ok(cut(limit)),
                };
                let pb = self.pb;
                if front.is_empty() && pb.has_vm_limits() {
                    let limits = (0..pb.catalog().vm_types.len())
                        .filter_map(|vm| {
                            let n = pb.vm_limit(vm)?;
                            Some(format!("{n} {}", pb.catalog().vm_types[vm].name))
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Ok(PlanError::Pool { limits });
                }
                (
                    front.iter().map(|x| x.0).fold(f64::INFINITY, f64::min),
                    front.iter().map(|x| x.1).fold(f64::INFINITY, f64::min),
                )
            }
        };
        Ok(match (b.max_latency_s, b.max_cost_usd) {
            (Some(l), _) if min_latency > l => PlanError::Latency {
                bound_s: l,
                best_s: min_latency,
            },
            (_, Some(c)) if min_cost > c => PlanError::Cost {
                bound_usd: c,
                best_usd: min_cost,
            },
            (Some(l), Some(c)) => {
                let within = match self.search()?.front(
                    &no_ban,
                    Bounds {
                        max_latency_s: Some(l),
                        max_cost_usd: None,
                    },
                    meter,
                ) {
                    Ok(within) => within,
                    Err(limit) => return Ok(cut(limit)),
                };
                let best_usd = within.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                PlanError::Both {
                    bound_s: l,
                    bound_usd: c,
                    best_usd,
                }
            }
            _ => PlanError::Internal("no plan found although the problem has no bounds".into()),
        })
    }
}

fn plan_exact(pb: &PlanProblem, meter: &Meter<'_>) -> Result<PlanOutcome, PlanError> {
    let solvers = Solvers::new(pb, meter);
    let no_ban = vec![false; pb.edges().len()];
    let Some((best, stats)) = solvers.best(&no_ban)? else {
        if let Some(limit) = meter.stopped() {
            return Err(solvers.budget_error(limit, "finding a plan that meets the bounds"));
        }
        return Err(solvers.bound_error()?);
    };
    let cut_best = meter.stopped();
    let pred = pb
        .evaluate(&best)
        .map_err(|e| PlanError::Internal(format!("planned an infeasible plan: {e}")))?;
    let banned: Vec<bool> = best
        .methods
        .iter()
        .map(|m| *m == Method::VmStorage)
        .collect();
    let second_best = if banned.iter().any(|&b| b) {
        match solvers.best(&banned)? {
            Some((a2, _)) => {
                let p2 = pb
                    .evaluate(&a2)
                    .map_err(|e| PlanError::Internal(format!("second-best infeasible: {e}")))?;
                Some(Plan::new(pb, &a2, &p2))
            }
            None => None,
        }
    } else {
        None
    };
    let stopped = stopped_search(cut_best, meter.stopped());
    let table = explain::table(pb, &best, &pred, Some(&stats), cut_best.is_some());
    Ok(PlanOutcome {
        best: Plan::new(pb, &best, &pred),
        second_best,
        table,
        exact: cut_best.is_none(),
        stopped,
        slo: None,
    })
}

/// Which search a limit stopped: the best plan's (`cut_best`, the limit passed when it ended),
/// else the second best's (`now`, passed since).
fn stopped_search(cut_best: Option<Limit>, now: Option<Limit>) -> Option<Stopped> {
    match (cut_best, now) {
        (Some(limit), _) => Some(Stopped {
            limit,
            search: StoppedSearch::Best,
        }),
        (None, Some(limit)) => Some(Stopped {
            limit,
            search: StoppedSearch::SecondBest,
        }),
        (None, None) => None,
    }
}

fn meets(b: &Bounds, latency: f64, cost: f64) -> bool {
    b.max_latency_s.is_none_or(|x| latency <= x) && b.max_cost_usd.is_none_or(|x| cost <= x)
}

/// The smallest VM type (memory, then price) stage `s` fits.
fn smallest_fitting(pb: &PlanProblem, s: usize) -> usize {
    fitting_smallest_first(pb, s).first().copied().unwrap_or(0)
}

/// The VM types stage `s` fits, smallest first (memory, then price; ties in catalog order).
fn fitting_smallest_first(pb: &PlanProblem, s: usize) -> Vec<usize> {
    let vms = &pb.catalog().vm_types;
    let mut types: Vec<usize> = (0..vms.len())
        .filter(|&v| pb.max_concurrent(s, v) > 0)
        .collect();
    types.sort_by(|&a, &b| {
        vms[a]
            .memory_mb
            .cmp(&vms[b].memory_mb)
            .then(vms[a].usd_per_hour.total_cmp(&vms[b].usd_per_hour))
    });
    types
}

/// The largest VM type (memory, then vCPUs, then the cheaper).
fn largest(pb: &PlanProblem) -> usize {
    let vms = &pb.catalog().vm_types;
    (0..vms.len())
        .filter(|&v| pb.vm_limit(v) != Some(0))
        .max_by(|&a, &b| {
            vms[a]
                .memory_mb
                .cmp(&vms[b].memory_mb)
                .then(vms[a].vcpus.cmp(&vms[b].vcpus))
                .then(vms[b].usd_per_hour.total_cmp(&vms[a].usd_per_hour))
        })
        .unwrap_or(0)
}

/// The assignment of a baseline policy.
pub fn baseline(pb: &PlanProblem, policy: Policy) -> Assignment {
    let n = pb.stages().len();
    match policy {
        Policy::Local => local_on(pb, largest(pb)).unwrap_or_else(|| {
            // Every stage fits the largest type by construction; this is unreachable but kept total.
            baseline(pb, Policy::Remote)
        }),
        Policy::Direct
        | Policy::Remote
        | Policy::Memory
        | Policy::Sonic
        | Policy::SonicMean
        | Policy::Oracle => {
            let method = if policy == Policy::Direct {
                Method::Direct
            } else {
                Method::Remote
            };
            // One VM per lambda, or as many as the type's VM limit allows.
            let place = |s: usize, vm: usize, vms: u32| Placement {
                vm,
                vms,
                concurrent: pb.per_vm(s, vms).min(pb.max_concurrent(s, vm)).max(1),
            };
            let mut placements: Vec<Placement> = Vec::with_capacity(n);
            for s in 0..n {
                let vm = smallest_fitting(pb, s);
                let mut pl = place(s, vm, pb.fit_vms(s, vm, pb.stages()[s].instances));
                if method == Method::Direct && pb.has_vm_limits() {
                    pl = direct_within_limits(pb, s, &placements).unwrap_or(pl);
                }
                placements.push(pl);
            }
            within_pool(
                pb,
                Assignment {
                    placements,
                    methods: (0..pb.edges().len())
                        .map(|e| {
                            if policy == Policy::Memory && pb.memory_fits(e) {
                                Method::Memory
                            } else {
                                method
                            }
                        })
                        .collect(),
                },
            )
        }
    }
}

/// A baseline (every stage on VMs of its own) whose stages held at the same time need more VMs
/// of a type than the pool has ([`PlanProblem::over_pool`]), with fewer VMs for the largest of
/// them, one step at a time, until it fits or none can shrink (the model then says why it
/// cannot run).
fn within_pool(pb: &PlanProblem, mut a: Assignment) -> Assignment {
    while let Some((vm, most)) = pb.over_pool(&a) {
        // Every stage is its own group in a baseline without vm-storage.
        let groups = pb.groups_of(&a);
        let shrink = most
            .groups
            .iter()
            .filter_map(|&g| groups.stages(g).next())
            .filter(|&s| a.placements[s].vm == vm && a.placements[s].vms > 1)
            .max_by_key(|&s| (a.placements[s].vms, std::cmp::Reverse(s)));
        let Some(s) = shrink else { break };
        let vms = pb.fit_vms(s, vm, a.placements[s].vms - 1);
        if vms == 0 || vms >= a.placements[s].vms {
            break;
        }
        a.placements[s] = Placement {
            vm,
            vms,
            concurrent: pb.per_vm(s, vms).min(pb.max_concurrent(s, vm)).max(1),
        };
    }
    a
}

/// The `direct` baseline's placement of stage `s` under VM limits, its senders placed: the
/// smallest type it fits (memory, then price) with the most VMs up to one per lambda that the
/// pool holds beside its senders' (a direct sender's VMs are held until the receiver has
/// fetched, [`PlanProblem::direct_fits`]); a stage with receivers takes at most half the
/// type's limit (at least one VM), leaving them room. `None` when no type has room.
fn direct_within_limits(pb: &PlanProblem, s: usize, placed: &[Placement]) -> Option<Placement> {
    let senders: Vec<crate::model::Sender> = pb
        .incoming(s)
        .iter()
        .map(|&e| {
            let from = pb.edges()[e].from;
            let sp = placed[from];
            crate::model::Sender {
                edge: e,
                method: Method::Direct,
                end: 0.0,
                vm: sp.vm,
                vms: sp.vms,
                per_vm: pb.per_vm(from, sp.vms),
                group: from,
            }
        })
        .collect();
    let k = pb.stages()[s].instances;
    let sends = !pb.outgoing(s).is_empty();
    for vm in fitting_smallest_first(pb, s) {
        let mut limit = pb.vm_limit(vm).unwrap_or(u32::MAX);
        if sends {
            limit = (limit / 2).max(1);
        }
        for vms in pb.vm_counts(s).into_iter().filter(|&c| c <= k.min(limit)) {
            let pl = Placement {
                vm,
                vms,
                concurrent: pb.per_vm(s, vms).min(pb.max_concurrent(s, vm)).max(1),
            };
            if pb.direct_fits(pl, crate::model::Host::New, &senders) {
                return Some(pl);
            }
        }
    }
    None
}

/// Every stage on one VM of type `vm`, as many at once as fit; each stage with senders runs on
/// the VM of its first sender's group (vm-storage from every sender there, direct from others,
/// which only happens with several roots). `None` when a stage does not fit `vm`.
pub(crate) fn local_on(pb: &PlanProblem, vm: usize) -> Option<Assignment> {
    let n = pb.stages().len();
    let mut placements = Vec::with_capacity(n);
    let mut group = vec![0usize; n];
    let mut methods = vec![Method::Direct; pb.edges().len()];
    for s in 0..n {
        let cmax = pb.max_concurrent(s, vm);
        if cmax == 0 {
            return None;
        }
        placements.push(Placement {
            vm,
            vms: 1,
            concurrent: cmax.min(pb.stages()[s].instances),
        });
        match pb.incoming(s).first() {
            None => group[s] = s,
            Some(&first) => {
                group[s] = group[pb.edges()[first].from];
                for &e in pb.incoming(s) {
                    if group[pb.edges()[e].from] == group[s] {
                        methods[e] = Method::VmStorage;
                    }
                }
            }
        }
    }
    Some(Assignment {
        placements,
        methods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        assert!("fastest".parse::<Policy>().is_err());
    }
}
