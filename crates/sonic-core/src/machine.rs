//! A job's execution as a state machine: events in, actions out, no I/O and no clock.
//!
//! The control plane's executor (`sonic_control::exec`) feeds [`JobMachine::handle`] what happened (the job began, a
//! stage's instances are known, a run ended or failed, the job was cancelled) and carries out the
//! [`Action`]s it gets back (open a stage, start a run, stop the runs, finish). Every decision of
//! *when* something runs is made here, so it is tested without a network: table tests below and
//! property tests against random event orders (`tests` module).
//!
//! The rules:
//! - a stage opens when every stage it reads from has ended; a stage fed only by `one` edges
//!   (its fanout known) opens when its first instance can start, and each instance starts as soon
//!   as the sender instances it reads from ended (`sonic_control::exec::requests::starts_per_instance`);
//! - a failed run is started again, with exponential backoff, up to the attempt limit, when its
//!   kind of failure allows ([`Failure::retryable`]: every failure of the run or its agent, not a
//!   cancel or a refusal); then the job fails, and every run still going is stopped;
//! - an instance a previous control plane saw succeed is restored, not run; one it had sent is
//!   started again by the same attempt (the agent answers with the run it has);
//! - where an instance runs ([`Spread`]): a planned stage's instance `k` of `K` runs on VM
//!   [`vm_of`]`(k, K, vms)` of the plan's `vms` (contiguous blocks, as evenly as the model spreads
//!   lambdas), and a planned job's stages open when their senders ended, as the model prices
//!   them ([`Shape::planned`]); an unplanned job's instances go round the agents, shifted by the
//!   stage, or all to the first agent under `local`;
//! - warm containers ([`Warmth`]): a job whose runs share the agents' warm containers with other
//!   jobs (`crate::warm`) claims, at its start, those its plan priced its stages' first batches
//!   on ([`Action::ClaimWarm`]); each run's report is the agent's word on what it keeps and ends
//!   the job's claim there ([`Action::WarmReported`]); the stages reading from a stage are
//!   prewarmed once, when the first of their senders opens, each after the plan's delay for that
//!   pair ([`Action::Prewarm`]). A job whose runs share containers only among themselves (it
//!   measures cold starts) claims and prewarms nothing;
//! - events that do not match the machine's state (a run it did not start, a repeated end, anything
//!   after the job finished) change nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::dag::{Dag, EdgeKind, Fanout, Retries, RetryOn};

/// What the machine needs of a job's DAG: per stage, whom it reads from and how it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Per stage: the stages it reads from.
    senders: Vec<Vec<usize>>,
    /// Per stage: its instance count when each instance starts on its own (every edge into it
    /// is `one` and its fanout is known).
    per_instance: Vec<Option<u32>>,
    /// Per stage: where its instances run.
    spread: Vec<Spread>,
}

/// Where a stage's instances run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// On the plan's `vms` VMs of the stage, in contiguous blocks ([`vm_of`]).
    Blocks {
        /// The plan's VMs for the stage.
        vms: u32,
    },
    /// Round the job's `agents` agents, instance `k` on agent `(shift + k) mod agents`: the
    /// stage index shifts consecutive stages of a chain onto different agents (a `direct`
    /// edge then really crosses machines). One agent puts everything on it.
    Rotate {
        /// How many agents the job runs on.
        agents: u32,
        /// The stage's shift.
        shift: u32,
    },
}

impl Spread {
    /// The VM (of the plan's, for [`Spread::Blocks`]) or agent instance `k` of `instances` runs on.
    pub fn place(self, k: u32, instances: u32) -> u32 {
        match self {
            Spread::Blocks { vms } => vm_of(k, instances, vms),
            Spread::Rotate { agents, shift } => {
                if agents == 0 {
                    0
                } else {
                    ((u64::from(shift) + u64::from(k)) % u64::from(agents)) as u32
                }
            }
        }
    }
}

/// The instances VM `j` of `vms` runs of a stage's `instances`, as `(first, count)`:
/// contiguous blocks, the first `instances mod vms` VMs one more (lambdas spread as evenly as
/// the model assumes). The executor places by it through the machine, and the simulator sizes
/// its VMs' work by it, so the two put every instance on the same VM.
pub fn block(j: u32, instances: u32, vms: u32) -> (u32, u32) {
    let vms = vms.max(1);
    let (q, r) = (instances / vms, instances % vms);
    let size = q + u32::from(j < r);
    let first = j * q + j.min(r);
    (first, size)
}

/// The VM of `vms` instance `k` of `instances` runs on: the one whose [`block`] holds it.
/// Instances past the count (a fanout learned later) wrap round.
pub fn vm_of(k: u32, instances: u32, vms: u32) -> u32 {
    let vms = vms.max(1);
    let instances = instances.max(1);
    let k = k % instances;
    let (q, r) = (instances / vms, instances % vms);
    // The first `r` VMs hold `q + 1` each, the rest `q`.
    let big = r * (q + 1);
    if k < big {
        k / (q + 1)
    } else {
        r + (k - big) / q.max(1)
    }
}

impl Shape {
    /// The shape of `dag` with the job's fanouts.
    pub fn of(dag: &Dag, fanouts: &[Fanout]) -> Shape {
        let n = dag.functions.len();
        Shape {
            senders: (0..n)
                .map(|i| {
                    let s: BTreeSet<usize> = dag.incoming(i).map(|e| e.from).collect();
                    s.into_iter().collect()
                })
                .collect(),
            per_instance: (0..n)
                .map(|i| {
                    let one = dag.incoming(i).all(|e| e.kind == EdgeKind::One);
                    match fanouts.get(i) {
                        Some(Fanout::Known(k))
                            if one && *k > 0 && dag.incoming(i).next().is_some() =>
                        {
                            Some(*k)
                        }
                        _ => None,
                    }
                })
                .collect(),
            spread: vec![
                Spread::Rotate {
                    agents: 1,
                    shift: 0
                };
                n
            ],
        }
    }

    /// The shape of a planned job: every stage opens when all the stages it reads from ended (the
    /// model prices a stage after its senders, it does not overlap them), and stage `i`'s
    /// instances run on the plan's `vms[i]` VMs in blocks ([`vm_of`]).
    pub fn planned(dag: &Dag, vms: &[u32]) -> Shape {
        let n = dag.functions.len();
        let mut shape = Shape::of(dag, &[]);
        shape.per_instance = vec![None; n];
        shape.spread = (0..n)
            .map(|i| Spread::Blocks {
                vms: vms.get(i).copied().unwrap_or(1).max(1),
            })
            .collect();
        shape
    }

    /// The shape with an unplanned job's placement: instances round `agents` agents, each stage
    /// shifted by its index, or all on the first one (`together`, the `local` policy).
    pub fn on_agents(mut self, agents: u32, together: bool) -> Shape {
        self.spread = (0..self.senders.len())
            .map(|i| Spread::Rotate {
                agents: if together { 1 } else { agents },
                shift: i as u32,
            })
            .collect();
        self
    }

    /// A shape from its parts (`senders[i]`: the stages stage `i` reads from; `per_instance[i]`:
    /// its instance count when its instances start one by one). For tests and simulations.
    pub fn new(senders: Vec<Vec<usize>>, per_instance: Vec<Option<u32>>) -> Shape {
        let spread = vec![
            Spread::Rotate {
                agents: 1,
                shift: 0
            };
            senders.len()
        ];
        Shape {
            senders,
            per_instance,
            spread,
        }
    }

    /// The shape with stage `i`'s instances placed by `spread[i]` (stages past its end keep
    /// theirs).
    pub fn with_spread(mut self, spread: &[Spread]) -> Shape {
        for (own, s) in self.spread.iter_mut().zip(spread) {
            *own = *s;
        }
        self
    }

    /// The number of stages.
    pub fn stages(&self) -> usize {
        self.senders.len()
    }

    /// The stages stage `i` reads from.
    pub fn senders(&self, i: usize) -> &[usize] {
        &self.senders[i]
    }

    /// Whether stage `i`'s instances start one by one, and how many there are.
    pub fn per_instance(&self, i: usize) -> Option<u32> {
        self.per_instance[i]
    }

    /// Where stage `i`'s instances run.
    pub fn spread(&self, i: usize) -> Spread {
        self.spread[i]
    }
}

/// What happened, as the executor tells the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The job's execution begins.
    Begin,
    /// A stage the machine opened has `instances` instances (the executor built their requests).
    StageOpened {
        /// The stage.
        stage: usize,
        /// How many instances it runs.
        instances: u32,
    },
    /// A run ended well; its files are recorded.
    RunEnded {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
        /// The attempt that ended.
        attempt: u32,
    },
    /// A run failed.
    RunFailed {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
        /// The attempt that failed.
        attempt: u32,
        /// Why, in words.
        error: String,
        /// What kind of failure: the machine decides from it whether to try again.
        kind: Failure,
    },
    /// The job is cancelled.
    Cancel,
}

/// Why a run failed, as the executor saw it. The machine decides from it whether another
/// attempt may help ([`Failure::retryable`]). On the wire (a failed job's summary, `failure`)
/// by its snake-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The lambda exited with an error or was killed by a signal.
    Exit,
    /// It ran past its time limit.
    Timeout,
    /// It ran out of memory.
    OutOfMemory,
    /// Its agent could not stage its inputs or route its outputs.
    Error,
    /// Its agent's disk is full.
    DiskFull,
    /// No report came: the agent was unreachable, refused the request or answered nonsense.
    NoReport,
    /// The job was cancelled while the attempt waited or ran.
    Cancelled,
    /// What the attempt waited on was closed (the job is ending) or refused it.
    Refused,
    /// The lambda could not be started at all (its image missing, its command not found or not
    /// executable): another attempt cannot start it.
    Unrunnable,
}

impl Failure {
    /// Every kind, in the order of their names on the wire.
    pub const ALL: [Failure; 9] = [
        Failure::Exit,
        Failure::Timeout,
        Failure::OutOfMemory,
        Failure::Error,
        Failure::DiskFull,
        Failure::NoReport,
        Failure::Cancelled,
        Failure::Refused,
        Failure::Unrunnable,
    ];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Exit => "exit",
            Failure::Timeout => "timeout",
            Failure::OutOfMemory => "out_of_memory",
            Failure::Error => "error",
            Failure::DiskFull => "disk_full",
            Failure::NoReport => "no_report",
            Failure::Cancelled => "cancelled",
            Failure::Refused => "refused",
            Failure::Unrunnable => "unrunnable",
        }
    }

    /// Whether another attempt may help: every failure of the run or its agent, not a cancel,
    /// a refusal or a lambda that cannot start.
    pub fn retryable(self) -> bool {
        !matches!(
            self,
            Failure::Cancelled | Failure::Refused | Failure::Unrunnable
        )
    }

    /// The kind a retry policy names it by ([`RetryOn`]); `None` for those never retried.
    pub fn retry_kind(self) -> Option<RetryOn> {
        match self {
            Failure::Exit | Failure::Error | Failure::DiskFull => Some(RetryOn::Error),
            Failure::Timeout => Some(RetryOn::Timeout),
            Failure::OutOfMemory => Some(RetryOn::Oom),
            Failure::NoReport => Some(RetryOn::Lost),
            Failure::Cancelled | Failure::Refused | Failure::Unrunnable => None,
        }
    }
}

/// When a stage's failed runs are tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// The wait before the first retry, doubled before each next one.
    pub backoff: Duration,
    /// The kinds of failure tried again.
    pub on: BTreeSet<RetryOn>,
}

impl RetryPolicy {
    /// Up to `attempts` attempts in all, every retryable kind of failure.
    pub fn new(attempts: u32, backoff: Duration) -> RetryPolicy {
        RetryPolicy {
            attempts: attempts.max(1),
            backoff,
            on: RetryOn::ALL.into_iter().collect(),
        }
    }

    /// A function's `retries:` over this default: each field it gives replaces the default's.
    pub fn with(&self, retries: Option<&Retries>) -> RetryPolicy {
        let Some(r) = retries else {
            return self.clone();
        };
        RetryPolicy {
            attempts: r.limit.map_or(self.attempts, |l| l.saturating_add(1)),
            backoff: r
                .backoff_s
                .map_or(self.backoff, |s| Duration::from_secs_f64(s.max(0.0))),
            on: r
                .on
                .as_ref()
                .map_or_else(|| self.on.clone(), |on| on.iter().copied().collect()),
        }
    }

    /// Whether a run that failed so is tried again under this policy.
    pub fn retries(&self, kind: Failure) -> bool {
        kind.retry_kind().is_some_and(|k| self.on.contains(&k))
    }
}

/// How a job's runs use the warm containers the agents keep (`crate::warm`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Warmth {
    /// Its runs share containers only among themselves (a job that measures cold starts):
    /// nothing is claimed, reported to the pool or prewarmed.
    #[default]
    Own,
    /// Its runs share the agents' containers with every job of their functions.
    Shared {
        /// Its plan priced its stages' first batches with the containers the pool keeps: it
        /// claims them at its start ([`Action::ClaimWarm`]).
        claims: bool,
        /// Prewarming: `None` is off; else the stages reading from an opened stage are
        /// prewarmed, each after its (sender, receiver) delay here (absent: at once).
        prewarm: Option<BTreeMap<(usize, usize), Duration>>,
    },
}

impl Warmth {
    /// Whether the job's runs share containers with other jobs.
    pub fn shared(&self) -> bool {
        matches!(self, Warmth::Shared { .. })
    }
}

/// What the executor is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Take, from the pool's account of warm containers, those the plan priced stage `stage`'s
    /// first batch on, on each of its VMs (the plan's instances at once there), so that other
    /// jobs' plans no longer count them; they are given back as its runs report
    /// ([`Action::WarmReported`]) or when the job ends.
    ClaimWarm {
        /// The stage.
        stage: usize,
    },
    /// The run of `instance` of `stage` ended well: its report's word on what its agent keeps
    /// warm for the function goes to the pool's account, and the job's claim on that agent ends.
    WarmReported {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
    },
    /// Start stage `stage`'s containers on the VMs it will run on, after `delay`: it reads from a
    /// stage that just opened.
    Prewarm {
        /// The receiving stage.
        stage: usize,
        /// How long to wait before asking.
        delay: Duration,
    },
    /// Build the stage's requests and answer with [`Event::StageOpened`].
    OpenStage {
        /// The stage.
        stage: usize,
    },
    /// Send a run to its agent after `delay` (the backoff of a retried attempt, else zero).
    StartRun {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
        /// Which attempt.
        attempt: u32,
        /// How long to wait before sending it.
        delay: Duration,
        /// Where it runs ([`Shape::spread`]): the stage's VM of the plan (a planned job) or the
        /// job's agent (an unplanned one), by index.
        vm: u32,
    },
    /// The instance already succeeded in an earlier control plane's run of this execution: record
    /// it from what was recorded and answer with [`Event::RunEnded`] for `attempt`.
    Restore {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
        /// The attempt that succeeded.
        attempt: u32,
        /// Where it ran by the placement rule (as [`Action::StartRun`]'s `vm`).
        vm: u32,
    },
    /// Stop every run still going (the job is ending without them).
    StopRuns,
    /// The job's execution is over.
    Finish(Outcome),
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every instance of every stage ended well.
    Succeeded,
    /// The job was cancelled.
    Cancelled,
    /// An instance failed for good.
    Failed {
        /// The stage.
        stage: usize,
        /// The instance.
        instance: u32,
        /// Its last attempt.
        attempts: u32,
        /// Why its last attempt failed.
        error: String,
        /// Whether it ran out of attempts (`false`: the failure allowed no retry).
        exhausted: bool,
    },
    /// Nothing runs and some stage can never start (its senders wait on it).
    Stuck,
}

/// Where an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Instance {
    Pending,
    Running(u32),
    Done,
}

/// Where a stage is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    Closed,
    Opening,
    Open(Vec<Instance>),
    Ended,
}

/// What an earlier control plane recorded of an instance in this execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// It succeeded by this attempt.
    Succeeded(u32),
    /// This attempt was sent and not seen to end.
    Sent(u32),
}

/// One job execution's decisions.
#[derive(Debug, Clone)]
pub struct JobMachine {
    shape: Shape,
    stages: Vec<Stage>,
    /// Per stage: when its failed runs are tried again.
    policies: Vec<RetryPolicy>,
    recorded: BTreeMap<(usize, u32), Recorded>,
    warmth: Warmth,
    /// Per stage: whether it was prewarmed.
    prewarmed: Vec<bool>,
    finished: bool,
}

impl JobMachine {
    /// A machine for a job of `shape` whose failed runs are tried again up to `max_attempts`
    /// attempts in all, waiting `backoff`, twice that, and so on between them.
    pub fn new(shape: Shape, max_attempts: u32, backoff: Duration) -> JobMachine {
        let n = shape.stages();
        JobMachine {
            shape,
            stages: vec![Stage::Closed; n],
            policies: vec![RetryPolicy::new(max_attempts, backoff); n],
            recorded: BTreeMap::new(),
            warmth: Warmth::Own,
            prewarmed: vec![false; n],
            finished: false,
        }
    }

    /// How the job's runs use warm containers (by default [`Warmth::Own`]).
    pub fn with_warmth(mut self, warmth: Warmth) -> JobMachine {
        self.set_warmth(warmth);
        self
    }

    /// As [`JobMachine::with_warmth`], before [`Event::Begin`].
    pub fn set_warmth(&mut self, warmth: Warmth) {
        self.warmth = warmth;
    }

    /// How the job's runs use warm containers.
    pub fn warmth(&self) -> &Warmth {
        &self.warmth
    }

    /// Stage `i`'s failed runs are tried again by `policies[i]` (a function's `retries:` over
    /// the default, [`RetryPolicy::with`]); stages past the list keep the machine's default.
    pub fn with_policies(mut self, policies: Vec<RetryPolicy>) -> JobMachine {
        for (i, p) in policies.into_iter().enumerate() {
            if let Some(slot) = self.policies.get_mut(i) {
                *slot = p;
            }
        }
        self
    }

    /// Stage `i`'s retry policy.
    pub fn policy(&self, i: usize) -> Option<&RetryPolicy> {
        self.policies.get(i)
    }

    /// Goes on from what an earlier control plane recorded of this execution, by (stage,
    /// instance).
    pub fn with_recorded(mut self, recorded: BTreeMap<(usize, u32), Recorded>) -> JobMachine {
        self.recorded = recorded;
        self
    }

    /// Where the instances of stage `i` run from now on, if it did not open yet (the simulator's
    /// fall back to the second-best plan for the stages not started). An opened stage keeps its
    /// placement.
    pub fn respread(&mut self, i: usize, spread: Spread) {
        if matches!(self.stages.get(i), Some(Stage::Closed | Stage::Opening)) {
            self.shape.spread[i] = spread;
        }
    }

    /// Whether the machine finished (it ignores every event from now on).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Whether stage `i` opened (its instances were or are being started).
    pub fn opened(&self, i: usize) -> bool {
        !matches!(self.stages[i], Stage::Closed)
    }

    /// Whether stage `i` ended (all its instances ended well).
    pub fn ended(&self, i: usize) -> bool {
        self.stages[i] == Stage::Ended
    }

    /// Whether instance `k` of stage `i` ended well.
    pub fn done(&self, i: usize, k: u32) -> bool {
        match &self.stages[i] {
            Stage::Ended => true,
            Stage::Open(insts) => insts.get(k as usize) == Some(&Instance::Done),
            _ => false,
        }
    }

    /// Whether instance `k` of stage `i` may start: every sender it reads from ended (or, for a
    /// stage whose instances start one by one, the sender's instance `k`).
    pub fn inputs_complete(&self, i: usize, k: u32) -> bool {
        let own = self.shape.per_instance(i).is_some();
        self.shape
            .senders(i)
            .iter()
            .all(|&s| self.ended(s) || (own && self.done(s, k)))
    }

    /// The actions `event` calls for.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match event {
            Event::Begin => {
                if let Warmth::Shared { claims: true, .. } = self.warmth {
                    out.extend((0..self.stages.len()).map(|stage| Action::ClaimWarm { stage }));
                }
            }
            Event::StageOpened { stage, instances } => {
                if self.stages.get(stage) != Some(&Stage::Opening) {
                    return out;
                }
                self.stages[stage] = if instances == 0 {
                    Stage::Ended
                } else {
                    self.prewarm_after(stage, &mut out);
                    Stage::Open(vec![Instance::Pending; instances as usize])
                };
            }
            Event::RunEnded {
                stage,
                instance,
                attempt,
            } => {
                let Some(slot) = self.running(stage, instance, attempt) else {
                    return out;
                };
                *slot = Instance::Done;
                if self.warmth.shared() {
                    out.push(Action::WarmReported { stage, instance });
                }
                if let Stage::Open(insts) = &self.stages[stage]
                    && insts.iter().all(|s| *s == Instance::Done)
                {
                    self.stages[stage] = Stage::Ended;
                }
            }
            Event::RunFailed {
                stage,
                instance,
                attempt,
                error,
                kind,
            } => {
                let retry =
                    kind.retryable() && self.policies.get(stage).is_some_and(|p| p.retries(kind));
                let limit = self.limit(stage, instance);
                let backoff = self
                    .policies
                    .get(stage)
                    .map_or(Duration::ZERO, |p| p.backoff);
                let vm = if stage < self.stages.len() {
                    self.vm(stage, instance)
                } else {
                    0
                };
                let Some(slot) = self.running(stage, instance, attempt) else {
                    return out;
                };
                if retry && attempt < limit {
                    *slot = Instance::Running(attempt + 1);
                    out.push(Action::StartRun {
                        stage,
                        instance,
                        attempt: attempt + 1,
                        delay: backoff.saturating_mul(2u32.saturating_pow(attempt - 1)),
                        vm,
                    });
                    return out;
                }
                return self.finish(Outcome::Failed {
                    stage,
                    instance,
                    attempts: attempt,
                    error,
                    exhausted: retry,
                });
            }
            Event::Cancel => return self.finish(Outcome::Cancelled),
        }
        self.advance(&mut out);
        out
    }

    /// Prewarms the stages reading from `sender`, which opens now, that no earlier sender
    /// prewarmed and that did not open: once each, after the delay for the pair.
    fn prewarm_after(&mut self, sender: usize, out: &mut Vec<Action>) {
        let Warmth::Shared {
            prewarm: Some(delays),
            ..
        } = &self.warmth
        else {
            return;
        };
        for j in 0..self.stages.len() {
            if self.prewarmed[j]
                || self.stages[j] != Stage::Closed
                || !self.shape.senders(j).contains(&sender)
            {
                continue;
            }
            self.prewarmed[j] = true;
            out.push(Action::Prewarm {
                stage: j,
                delay: delays.get(&(sender, j)).copied().unwrap_or(Duration::ZERO),
            });
        }
    }

    /// The attempt limit of an instance: the machine's, or more when an earlier control plane
    /// already sent a later attempt.
    fn limit(&self, i: usize, k: u32) -> u32 {
        let attempts = self.policies.get(i).map_or(1, |p| p.attempts);
        match self.recorded.get(&(i, k)) {
            Some(Recorded::Sent(a) | Recorded::Succeeded(a)) => attempts.max(*a),
            None => attempts,
        }
    }

    /// Where instance `k` of stage `i` runs.
    fn vm(&self, i: usize, k: u32) -> u32 {
        let instances = match &self.stages[i] {
            Stage::Open(insts) => insts.len() as u32,
            _ => k + 1,
        };
        self.shape.spread(i).place(k, instances)
    }

    /// The instance's slot when `attempt` of it is the one running.
    fn running(&mut self, i: usize, k: u32, attempt: u32) -> Option<&mut Instance> {
        match self.stages.get_mut(i) {
            Some(Stage::Open(insts)) => insts
                .get_mut(k as usize)
                .filter(|s| **s == Instance::Running(attempt)),
            _ => None,
        }
    }

    fn finish(&mut self, outcome: Outcome) -> Vec<Action> {
        self.finished = true;
        let running = self.stages.iter().any(|s| match s {
            Stage::Open(insts) => insts.iter().any(|i| matches!(i, Instance::Running(_))),
            Stage::Opening => true,
            _ => false,
        });
        let mut out = Vec::new();
        if running {
            out.push(Action::StopRuns);
        }
        out.push(Action::Finish(outcome));
        out
    }

    /// Opens the stages and starts the instances whose inputs are complete; finishes the job
    /// when every stage ended, or when nothing runs and nothing can start.
    fn advance(&mut self, out: &mut Vec<Action>) {
        for i in 0..self.stages.len() {
            match &self.stages[i] {
                Stage::Closed => {
                    let ready = match self.shape.per_instance(i) {
                        Some(n) => (0..n).any(|k| self.inputs_complete(i, k)),
                        None => self.shape.senders(i).iter().all(|&s| self.ended(s)),
                    };
                    if ready {
                        self.stages[i] = Stage::Opening;
                        out.push(Action::OpenStage { stage: i });
                    }
                }
                Stage::Open(insts) => {
                    let start: Vec<u32> = insts
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| **s == Instance::Pending)
                        .map(|(k, _)| k as u32)
                        .filter(|&k| self.inputs_complete(i, k))
                        .collect();
                    for k in start {
                        let vm = self.vm(i, k);
                        let (state, action) = match self.recorded.get(&(i, k)) {
                            Some(Recorded::Succeeded(a)) => (
                                Instance::Running(*a),
                                Action::Restore {
                                    stage: i,
                                    instance: k,
                                    attempt: *a,
                                    vm,
                                },
                            ),
                            other => {
                                let attempt = match other {
                                    Some(Recorded::Sent(a)) => (*a).max(1),
                                    _ => 1,
                                };
                                (
                                    Instance::Running(attempt),
                                    Action::StartRun {
                                        stage: i,
                                        instance: k,
                                        attempt,
                                        delay: Duration::ZERO,
                                        vm,
                                    },
                                )
                            }
                        };
                        if let Stage::Open(insts) = &mut self.stages[i] {
                            insts[k as usize] = state;
                        }
                        out.push(action);
                    }
                }
                Stage::Opening | Stage::Ended => {}
            }
        }
        if self.stages.iter().all(|s| *s == Stage::Ended) {
            out.extend(self.finish(Outcome::Succeeded));
            return;
        }
        let moving = self.stages.iter().any(|s| match s {
            Stage::Opening => true,
            Stage::Open(insts) => insts.iter().any(|i| matches!(i, Instance::Running(_))),
            _ => false,
        });
        if !moving && out.is_empty() {
            out.extend(self.finish(Outcome::Stuck));
        }
    }
}

/// How one execution of a job ended without success, as the executor saw it: the input to
/// [`Executions::ended`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionEnd {
    /// A run failed for good ([`Outcome::Failed`]), or the job could not go on (`kind: None`:
    /// bad parameters, a stage that cannot be built, a plan that cannot run).
    Failed {
        /// Why, in words.
        message: String,
        /// The kind of the run's last failure, if a run failed.
        kind: Option<Failure>,
        /// The agent of that failure (empty when none).
        agent: String,
        /// The job's agents that did not answer a health probe after it.
        unreachable: Vec<String>,
    },
    /// A resumed job was granted another plan than its recorded runs ran under: nothing of them
    /// can be reused.
    PlanChanged(String),
    /// The job was cancelled.
    Cancelled(String),
}

/// What the job does after an execution ended without success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run the job again from its input, as execution `execution`, without the agents lost so
    /// far ([`Executions::lost`]); `why` says so.
    RunAgain {
        /// The next execution's number.
        execution: u32,
        /// The agents this end lost (already in [`Executions::lost`]).
        lost: Vec<String>,
        /// Why, for the job's progress and log.
        why: String,
    },
    /// The job fails with this message.
    Fail(String),
}

/// A job's executions: when a failed one is worth another, without which agents. The rules:
/// - a lost agent (it did not answer a probe after the failure, or its disk was full) is worth
///   another execution without it, up to `max` executions in all; a lambda's own failure, a
///   job that cannot go on or a cancel is not;
/// - a resumed job granted another plan starts over as a new execution (it does not count
///   against `max`: nothing failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executions {
    execution: u32,
    max: u32,
    lost: BTreeSet<String>,
}

impl Executions {
    /// A job at execution `execution` (1 for a new one), allowed `max` in all, which already lost
    /// `lost` (a resumed job's record).
    pub fn new(execution: u32, max: u32, lost: impl IntoIterator<Item = String>) -> Executions {
        Executions {
            execution: execution.max(1),
            max: max.max(1),
            lost: lost.into_iter().collect(),
        }
    }

    /// The current execution's number.
    pub fn execution(&self) -> u32 {
        self.execution
    }

    /// Every agent lost so far: no later execution runs on them.
    pub fn lost(&self) -> &BTreeSet<String> {
        &self.lost
    }

    /// What follows `end`.
    pub fn ended(&mut self, end: ExecutionEnd) -> Next {
        match end {
            ExecutionEnd::Cancelled(message) => Next::Fail(message),
            ExecutionEnd::PlanChanged(why) => {
                self.execution += 1;
                Next::RunAgain {
                    execution: self.execution,
                    lost: Vec::new(),
                    why: format!(
                        "{why}: running the job again from its input (execution {})",
                        self.execution
                    ),
                }
            }
            ExecutionEnd::Failed {
                message,
                kind,
                agent,
                unreachable,
            } => {
                let mut gone = unreachable;
                if kind == Some(Failure::DiskFull) && !agent.is_empty() && !gone.contains(&agent) {
                    gone.push(agent);
                }
                if gone.is_empty() {
                    return Next::Fail(message);
                }
                if self.execution >= self.max {
                    return Next::Fail(format!("agent {} lost: {message}", gone.join(", ")));
                }
                self.execution += 1;
                self.lost.extend(gone.iter().cloned());
                Next::RunAgain {
                    execution: self.execution,
                    why: format!(
                        "agent {} lost ({message}); running the job again without it (execution {} of {})",
                        gone.join(", "),
                        self.execution,
                        self.max
                    ),
                    lost: gone,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const B: Duration = Duration::from_millis(100);

    fn start(stage: usize, instance: u32, attempt: u32) -> Action {
        Action::StartRun {
            stage,
            instance,
            attempt,
            delay: Duration::ZERO,
            vm: 0,
        }
    }

    fn ended(stage: usize, instance: u32, attempt: u32) -> Event {
        Event::RunEnded {
            stage,
            instance,
            attempt,
        }
    }

    fn failed(stage: usize, instance: u32, attempt: u32, retry: bool) -> Event {
        Event::RunFailed {
            stage,
            instance,
            attempt,
            error: "boom".into(),
            kind: kind(retry),
        }
    }

    /// A failure another attempt may help, or one it may not.
    fn kind(retry: bool) -> Failure {
        if retry {
            Failure::Exit
        } else {
            Failure::Cancelled
        }
    }

    fn opened(stage: usize, instances: u32) -> Event {
        Event::StageOpened { stage, instances }
    }

    /// Feeds `events` in order and checks the actions each one gives.
    fn check(machine: &mut JobMachine, steps: &[(Event, Vec<Action>)]) {
        for (n, (event, want)) in steps.iter().enumerate() {
            let got = machine.handle(event.clone());
            assert_eq!(&got, want, "step {n}: {event:?}");
        }
    }

    /// a -> b (gather) : a chain.
    fn chain() -> Shape {
        Shape::new(vec![vec![], vec![0]], vec![None, None])
    }

    #[test]
    fn a_chain_runs_stage_after_stage() {
        let mut m = JobMachine::new(chain(), 3, B);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 2), vec![start(0, 0, 1), start(0, 1, 1)]),
                (ended(0, 1, 1), vec![]),
                // A repeated or unknown end changes nothing.
                (ended(0, 1, 1), vec![]),
                (ended(0, 0, 2), vec![]),
                (ended(0, 0, 1), vec![Action::OpenStage { stage: 1 }]),
                (opened(1, 1), vec![start(1, 0, 1)]),
                (ended(1, 0, 1), vec![Action::Finish(Outcome::Succeeded)]),
                (Event::Cancel, vec![]),
            ],
        );
    }

    /// Warm containers: a job sharing them claims its stages' at its start, reports each run's
    /// word, and prewarms a stage once, when its first sender opens, after the pair's delay; a
    /// stage that opened is not prewarmed, nor are any under `Own` or with prewarming off.
    #[test]
    fn a_sharing_job_claims_reports_and_prewarms_each_receiver_once() {
        // 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3 (a diamond).
        let diamond = || Shape::new(vec![vec![], vec![0], vec![0], vec![1, 2]], vec![None; 4]);
        let delays = BTreeMap::from([((0, 2), Duration::from_millis(700))]);
        let mut m = JobMachine::new(diamond(), 3, B).with_warmth(Warmth::Shared {
            claims: true,
            prewarm: Some(delays.clone()),
        });
        let pre = |stage, ms| Action::Prewarm {
            stage,
            delay: Duration::from_millis(ms),
        };
        let reported = |stage, instance| Action::WarmReported { stage, instance };
        check(
            &mut m,
            &[
                (
                    Event::Begin,
                    vec![
                        Action::ClaimWarm { stage: 0 },
                        Action::ClaimWarm { stage: 1 },
                        Action::ClaimWarm { stage: 2 },
                        Action::ClaimWarm { stage: 3 },
                        Action::OpenStage { stage: 0 },
                    ],
                ),
                (opened(0, 1), vec![pre(1, 0), pre(2, 700), start(0, 0, 1)]),
                (
                    ended(0, 0, 1),
                    vec![
                        reported(0, 0),
                        Action::OpenStage { stage: 1 },
                        Action::OpenStage { stage: 2 },
                    ],
                ),
                // Stage 3 is prewarmed when the first of its senders opens, once.
                (opened(2, 1), vec![pre(3, 0), start(2, 0, 1)]),
                (opened(1, 1), vec![start(1, 0, 1)]),
                // A retried run reports only once it ends well.
                (
                    failed(1, 0, 1, true),
                    vec![Action::StartRun {
                        stage: 1,
                        instance: 0,
                        attempt: 2,
                        delay: B,
                        vm: 0,
                    }],
                ),
                (ended(1, 0, 2), vec![reported(1, 0)]),
                (
                    ended(2, 0, 1),
                    vec![reported(2, 0), Action::OpenStage { stage: 3 }],
                ),
                (opened(3, 1), vec![start(3, 0, 1)]),
                (
                    ended(3, 0, 1),
                    vec![reported(3, 0), Action::Finish(Outcome::Succeeded)],
                ),
            ],
        );

        // Shared without claims (an unplanned job) and with prewarming off: only the reports.
        let mut m = JobMachine::new(chain(), 3, B).with_warmth(Warmth::Shared {
            claims: false,
            prewarm: None,
        });
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (
                    ended(0, 0, 1),
                    vec![reported(0, 0), Action::OpenStage { stage: 1 }],
                ),
            ],
        );

        // Its own containers (a profiling job): none of it.
        let mut m = JobMachine::new(chain(), 3, B);
        assert_eq!(m.warmth(), &Warmth::Own);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (ended(0, 0, 1), vec![Action::OpenStage { stage: 1 }]),
            ],
        );
    }

    /// A stage's own retry policy: a function's `retries:` over the default. Stage 0 retries
    /// only timeouts, at most once, after 50 ms: an exit fails the job at once (not exhausted:
    /// its kind is not retried), a timeout is tried again once and then fails it (exhausted).
    /// `limit: 0` never retries; a policy leaves the other stages at the default.
    #[test]
    fn a_stages_retry_policy_decides_what_is_tried_again_and_when() {
        let default = RetryPolicy::new(3, B);
        let timeouts = Retries {
            limit: Some(1),
            backoff_s: Some(0.05),
            on: Some(vec![RetryOn::Timeout]),
        };
        let p = default.with(Some(&timeouts));
        assert_eq!(p.attempts, 2);
        assert_eq!(p.backoff, Duration::from_millis(50));
        assert!(p.retries(Failure::Timeout) && !p.retries(Failure::Exit));
        assert!(!p.retries(Failure::Cancelled) && !default.retries(Failure::Refused));
        assert!(default.retries(Failure::NoReport) && default.retries(Failure::OutOfMemory));
        let never = default.with(Some(&Retries {
            limit: Some(0),
            ..Retries::default()
        }));
        assert_eq!(
            (never.attempts, never.backoff),
            (1, B),
            "the rest is the default's"
        );
        assert_eq!(default.with(None), default);

        let exit = |attempt| Event::RunFailed {
            stage: 0,
            instance: 0,
            attempt,
            error: "boom".into(),
            kind: Failure::Exit,
        };
        let timeout = |attempt| Event::RunFailed {
            stage: 0,
            instance: 0,
            attempt,
            error: "slow".into(),
            kind: Failure::Timeout,
        };
        let fail = |attempts, error: &str, exhausted| {
            vec![
                Action::StopRuns,
                Action::Finish(Outcome::Failed {
                    stage: 0,
                    instance: 0,
                    attempts,
                    error: error.into(),
                    exhausted,
                }),
            ]
        };
        let machine = || JobMachine::new(chain(), 3, B).with_policies(vec![p.clone()]);
        let mut m = machine();
        assert_eq!(m.policy(1), Some(&default));
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (exit(1), fail(1, "boom", false)),
            ],
        );
        let mut m = machine();
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (
                    timeout(1),
                    vec![Action::StartRun {
                        stage: 0,
                        instance: 0,
                        attempt: 2,
                        delay: Duration::from_millis(50),
                        vm: 0,
                    }],
                ),
                (timeout(2), fail(2, "slow", true)),
            ],
        );
        let mut m = JobMachine::new(chain(), 3, B).with_policies(vec![never]);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (timeout(1), fail(1, "slow", true)),
            ],
        );
    }

    #[test]
    fn a_failed_run_is_retried_with_backoff_then_fails_the_job() {
        let mut m = JobMachine::new(chain(), 3, B);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 2), vec![start(0, 0, 1), start(0, 1, 1)]),
                (
                    failed(0, 0, 1, true),
                    vec![Action::StartRun {
                        stage: 0,
                        instance: 0,
                        attempt: 2,
                        delay: B,
                        vm: 0,
                    }],
                ),
                // The failure of an attempt that is not running is stale.
                (failed(0, 0, 1, true), vec![]),
                (
                    failed(0, 0, 2, true),
                    vec![Action::StartRun {
                        stage: 0,
                        instance: 0,
                        attempt: 3,
                        delay: B * 2,
                        vm: 0,
                    }],
                ),
                (
                    failed(0, 0, 3, true),
                    vec![
                        Action::StopRuns,
                        Action::Finish(Outcome::Failed {
                            stage: 0,
                            instance: 0,
                            attempts: 3,
                            error: "boom".into(),
                            exhausted: true,
                        }),
                    ],
                ),
                (ended(0, 1, 1), vec![]),
            ],
        );
    }

    #[test]
    fn a_failure_that_allows_no_retry_ends_the_job_at_once() {
        let mut m = JobMachine::new(chain(), 3, B);
        m.handle(Event::Begin);
        m.handle(opened(0, 1));
        assert_eq!(
            m.handle(failed(0, 0, 1, false)),
            vec![
                Action::StopRuns,
                Action::Finish(Outcome::Failed {
                    stage: 0,
                    instance: 0,
                    attempts: 1,
                    error: "boom".into(),
                    exhausted: false,
                })
            ]
        );
    }

    #[test]
    fn a_cancel_stops_the_runs() {
        let mut m = JobMachine::new(chain(), 3, B);
        m.handle(Event::Begin);
        m.handle(opened(0, 1));
        assert_eq!(
            m.handle(Event::Cancel),
            vec![Action::StopRuns, Action::Finish(Outcome::Cancelled)]
        );
        assert!(m.finished());
        assert_eq!(m.handle(ended(0, 0, 1)), vec![]);
    }

    #[test]
    fn a_diamonds_branches_open_together() {
        // a -> b, a -> c, b -> d, c -> d
        let shape = Shape::new(
            vec![vec![], vec![0], vec![0], vec![1, 2]],
            vec![None, None, None, None],
        );
        let mut m = JobMachine::new(shape, 1, B);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 1), vec![start(0, 0, 1)]),
                (
                    ended(0, 0, 1),
                    vec![
                        Action::OpenStage { stage: 1 },
                        Action::OpenStage { stage: 2 },
                    ],
                ),
                (opened(2, 1), vec![start(2, 0, 1)]),
                (opened(1, 1), vec![start(1, 0, 1)]),
                (ended(1, 0, 1), vec![]),
                (ended(2, 0, 1), vec![Action::OpenStage { stage: 3 }]),
            ],
        );
    }

    #[test]
    fn a_one_edge_starts_each_receiver_instance_after_its_own_sender() {
        // a (2 instances) -one-> b (2 instances)
        let shape = Shape::new(vec![vec![], vec![0]], vec![None, Some(2)]);
        let mut m = JobMachine::new(shape, 1, B);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 2), vec![start(0, 0, 1), start(0, 1, 1)]),
                (ended(0, 1, 1), vec![Action::OpenStage { stage: 1 }]),
                (opened(1, 2), vec![start(1, 1, 1)]),
                (ended(1, 1, 1), vec![]),
                (ended(0, 0, 1), vec![start(1, 0, 1)]),
                (ended(1, 0, 1), vec![Action::Finish(Outcome::Succeeded)]),
            ],
        );
    }

    #[test]
    fn a_resumed_execution_restores_what_succeeded_and_adopts_what_was_sent() {
        let recorded = BTreeMap::from([
            ((0, 0), Recorded::Succeeded(1)),
            ((0, 1), Recorded::Sent(2)),
        ]);
        let mut m = JobMachine::new(chain(), 2, B).with_recorded(recorded);
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (
                    opened(0, 2),
                    vec![
                        Action::Restore {
                            stage: 0,
                            instance: 0,
                            attempt: 1,
                            vm: 0,
                        },
                        start(0, 1, 2),
                    ],
                ),
                (ended(0, 0, 1), vec![]),
                (ended(0, 1, 2), vec![Action::OpenStage { stage: 1 }]),
            ],
        );
    }

    #[test]
    fn a_stage_that_waits_on_itself_is_stuck() {
        // b reads from c and c from b: neither can start once a ended.
        let shape = Shape::new(vec![vec![], vec![2], vec![1]], vec![None, None, None]);
        let mut m = JobMachine::new(shape, 1, B);
        m.handle(Event::Begin);
        m.handle(opened(0, 1));
        assert_eq!(
            m.handle(ended(0, 0, 1)),
            vec![Action::Finish(Outcome::Stuck)]
        );
    }

    #[test]
    fn an_empty_stage_ends_at_once() {
        let mut m = JobMachine::new(chain(), 1, B);
        m.handle(Event::Begin);
        assert_eq!(m.handle(opened(0, 0)), vec![Action::OpenStage { stage: 1 }]);
    }

    /// A random DAG (edges only forward, so acyclic) with per-instance stages where allowed.
    #[test]
    fn failure_kinds_go_on_the_wire_by_their_names() {
        for f in Failure::ALL {
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.as_str()));
            assert_eq!(serde_json::from_str::<Failure>(&json).unwrap(), f);
        }
    }

    #[test]
    fn blocks_cover_every_instance_once_and_vm_of_finds_its_block() {
        for instances in 0..40u32 {
            for vms in 1..9u32 {
                let mut next = 0;
                for j in 0..vms {
                    let (first, count) = block(j, instances, vms);
                    assert_eq!(first, next, "{instances} on {vms}: VM {j}");
                    // As even as can be: sizes differ by at most one, larger first.
                    assert!(count == instances / vms || count == instances / vms + 1);
                    for k in first..first + count {
                        assert_eq!(vm_of(k, instances, vms), j, "{k} of {instances} on {vms}");
                    }
                    next = first + count;
                }
                assert_eq!(next, instances);
            }
        }
    }

    #[test]
    fn a_planned_job_opens_stages_after_their_senders_and_places_by_blocks() {
        // a -> b over `one`, fanout 3, b planned on 2 VMs: b opens when all of a ended (the
        // model's rule), not instance by instance, and runs 0, 1 on VM 0 and 2 on VM 1.
        let dag = Dag::from_yaml(
            "p.yaml",
            "name: p\nfunctions:\n  - { name: a, image: i, command: [x] }\n  - { name: b, image: i, command: [x] }\nedges:\n  - { from: a, to: b, kind: one }\n",
        )
        .unwrap();
        let shape = Shape::planned(&dag, &[1, 2]);
        assert_eq!(shape.per_instance(1), None);
        let mut m = JobMachine::new(shape, 1, B);
        let on = |stage, instance, vm| Action::StartRun {
            stage,
            instance,
            attempt: 1,
            delay: Duration::ZERO,
            vm,
        };
        check(
            &mut m,
            &[
                (Event::Begin, vec![Action::OpenStage { stage: 0 }]),
                (opened(0, 3), vec![on(0, 0, 0), on(0, 1, 0), on(0, 2, 0)]),
                (ended(0, 0, 1), vec![]),
                (ended(0, 1, 1), vec![]),
                (ended(0, 2, 1), vec![Action::OpenStage { stage: 1 }]),
                (opened(1, 3), vec![on(1, 0, 0), on(1, 1, 0), on(1, 2, 1)]),
            ],
        );
    }

    #[test]
    fn an_unplanned_job_goes_round_the_agents_shifted_by_stage() {
        let shape = chain().on_agents(3, false);
        let mut m = JobMachine::new(shape, 1, B);
        let got = m.handle(Event::Begin);
        assert_eq!(got, vec![Action::OpenStage { stage: 0 }]);
        let vms = |actions: Vec<Action>| -> Vec<u32> {
            actions
                .into_iter()
                .filter_map(|a| match a {
                    Action::StartRun { vm, .. } => Some(vm),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(vms(m.handle(opened(0, 4))), vec![0, 1, 2, 0]);
        for k in 0..4 {
            m.handle(ended(0, k, 1));
        }
        assert_eq!(vms(m.handle(opened(1, 2))), vec![1, 2]);
        // `local`: every instance on the first agent.
        let mut m = JobMachine::new(chain().on_agents(3, true), 1, B);
        m.handle(Event::Begin);
        assert_eq!(vms(m.handle(opened(0, 3))), vec![0, 0, 0]);
    }

    fn failed_run(kind: Option<Failure>, agent: &str, unreachable: &[&str]) -> ExecutionEnd {
        ExecutionEnd::Failed {
            message: "boom".into(),
            kind,
            agent: agent.into(),
            unreachable: unreachable.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn a_lost_agent_runs_the_job_again_without_it_up_to_the_limit() {
        let mut x = Executions::new(1, 2, []);
        match x.ended(failed_run(Some(Failure::NoReport), "a-1", &["a-1"])) {
            Next::RunAgain {
                execution, lost, ..
            } => {
                assert_eq!(execution, 2);
                assert_eq!(lost, ["a-1"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(x.lost().contains("a-1"));
        // The limit reached: the job fails, saying which agent was lost.
        assert_eq!(
            x.ended(failed_run(Some(Failure::NoReport), "a-2", &["a-2"])),
            Next::Fail("agent a-2 lost: boom".into())
        );
        assert!(!x.lost().contains("a-2"));
    }

    #[test]
    fn a_full_disk_loses_its_agent_and_a_lambdas_own_failure_loses_none() {
        let mut x = Executions::new(1, 3, ["old".to_string()]);
        match x.ended(failed_run(Some(Failure::DiskFull), "a-2", &[])) {
            Next::RunAgain { lost, .. } => assert_eq!(lost, ["a-2"]),
            other => panic!("{other:?}"),
        }
        assert_eq!(x.lost().len(), 2);
        assert_eq!(
            x.ended(failed_run(Some(Failure::Exit), "a-1", &[])),
            Next::Fail("boom".into())
        );
        assert_eq!(
            x.ended(ExecutionEnd::Cancelled("cancelled".into())),
            Next::Fail("cancelled".into())
        );
        assert_eq!(x.execution(), 2);
    }

    #[test]
    fn a_changed_plan_starts_over_whatever_the_limit() {
        let mut x = Executions::new(4, 1, []);
        match x.ended(ExecutionEnd::PlanChanged("the plan changed".into())) {
            Next::RunAgain {
                execution,
                lost,
                why,
            } => {
                assert_eq!(execution, 5);
                assert!(lost.is_empty());
                assert!(
                    why.starts_with("the plan changed: running the job again"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    fn shapes() -> impl Strategy<Value = (Shape, Vec<u32>)> {
        (1usize..6)
            .prop_flat_map(|n| {
                (
                    proptest::collection::vec(proptest::collection::vec(any::<bool>(), n), n),
                    proptest::collection::vec(1u32..4, n),
                    proptest::collection::vec(any::<bool>(), n),
                )
            })
            .prop_map(|(adj, counts, one)| {
                let n = counts.len();
                let senders: Vec<Vec<usize>> = (0..n)
                    .map(|i| (0..i).filter(|&s| adj[s][i]).collect())
                    .collect();
                let per_instance = (0..n)
                    .map(|i| (one[i] && !senders[i].is_empty()).then_some(counts[i]))
                    .collect();
                (Shape::new(senders, per_instance), counts)
            })
    }

    /// What the simulated executor does with each outstanding thing: which to answer next, and
    /// whether a run fails.
    #[derive(Debug, Clone)]
    struct Choice {
        pick: usize,
        fail: bool,
        retry: bool,
    }

    fn choices() -> impl Strategy<Value = Vec<Choice>> {
        proptest::collection::vec(
            (any::<usize>(), proptest::bool::weighted(0.2), any::<bool>())
                .prop_map(|(pick, fail, retry)| Choice { pick, fail, retry }),
            0..400,
        )
    }

    proptest! {
        /// Against random event orders: no instance starts before its inputs are complete, no
        /// attempt starts twice, every job ends, and a job that succeeds ran every instance.
        /// A sharing job claims every stage once, at its start; prewarms a stage at most once,
        /// before it opens and after one of its senders opened; and reports each instance that
        /// ended well once, after it did.
        #[test]
        fn the_machine_keeps_its_invariants(
            (shape, counts) in shapes(),
            choices in choices(),
            cancel_at in proptest::option::of(0usize..400),
            max_attempts in 1u32..4,
            shared in any::<bool>(),
        ) {
            let warmth = if shared {
                Warmth::Shared { claims: true, prewarm: Some(BTreeMap::new()) }
            } else {
                Warmth::Own
            };
            let mut m = JobMachine::new(shape.clone(), max_attempts, B).with_warmth(warmth);
            let mut claimed: BTreeSet<usize> = BTreeSet::new();
            let mut prewarmed: BTreeSet<usize> = BTreeSet::new();
            let mut reported: BTreeSet<(usize, u32)> = BTreeSet::new();
            let mut ever_opened: BTreeSet<usize> = BTreeSet::new();
            let mut began = false;
            // Outstanding: stages to open, runs going (stage, instance, attempt).
            let mut opening: Vec<usize> = Vec::new();
            let mut running: Vec<(usize, u32, u32)> = Vec::new();
            let mut started: BTreeSet<(usize, u32, u32)> = BTreeSet::new();
            let mut succeeded: BTreeSet<(usize, u32)> = BTreeSet::new();
            let mut outcome: Option<Outcome> = None;
            let mut pending = vec![Event::Begin];
            let mut step = 0usize;
            let mut choices = choices.into_iter();
            loop {
                for event in std::mem::take(&mut pending) {
                    let beginning = event == Event::Begin;
                    for action in m.handle(event) {
                        prop_assert!(outcome.is_none(), "an action after the end: {action:?}");
                        match action {
                            Action::ClaimWarm { stage } => {
                                prop_assert!(shared && beginning && !began, "a claim after the start");
                                prop_assert!(claimed.insert(stage), "{stage} claimed twice");
                            }
                            Action::WarmReported { stage, instance } => {
                                prop_assert!(shared);
                                prop_assert!(succeeded.contains(&(stage, instance)),
                                    "{stage}/{instance} reported before it ended well");
                                prop_assert!(reported.insert((stage, instance)),
                                    "{stage}/{instance} reported twice");
                            }
                            Action::Prewarm { stage, .. } => {
                                prop_assert!(shared);
                                prop_assert!(!ever_opened.contains(&stage), "{stage} prewarmed once open");
                                prop_assert!(shape.senders(stage).iter().any(|s| ever_opened.contains(s)),
                                    "{stage} prewarmed before a sender opened");
                                prop_assert!(prewarmed.insert(stage), "{stage} prewarmed twice");
                            }
                            Action::OpenStage { stage } => {
                                prop_assert!(!opening.contains(&stage));
                                opening.push(stage);
                                ever_opened.insert(stage);
                            }
                            Action::StartRun { stage, instance, attempt, .. } => {
                                prop_assert!(
                                    shape.senders(stage).iter().all(|&s| {
                                        let whole = (0..counts[s]).all(|k| succeeded.contains(&(s, k)));
                                        whole || (shape.per_instance(stage).is_some()
                                            && succeeded.contains(&(s, instance)))
                                    }),
                                    "{stage}/{instance} started before its inputs were complete"
                                );
                                prop_assert!(started.insert((stage, instance, attempt)),
                                    "{stage}/{instance} attempt {attempt} started twice");
                                prop_assert!(attempt <= max_attempts);
                                running.push((stage, instance, attempt));
                            }
                            Action::Restore { .. } => prop_assert!(false, "nothing was recorded"),
                            Action::StopRuns => running.clear(),
                            Action::Finish(o) => outcome = Some(o),
                        }
                    }
                }
                began = true;
                if outcome.is_some() {
                    break;
                }
                if cancel_at == Some(step) {
                    pending.push(Event::Cancel);
                    step += 1;
                    continue;
                }
                step += 1;
                let outstanding = opening.len() + running.len();
                prop_assert!(outstanding > 0, "nothing outstanding and the job did not end");
                let c = choices.next().unwrap_or(Choice { pick: 0, fail: false, retry: true });
                let pick = c.pick % outstanding;
                if pick < opening.len() {
                    let stage = opening.remove(pick);
                    pending.push(opened(stage, counts[stage]));
                } else {
                    let (stage, instance, attempt) = running.remove(pick - opening.len());
                    if c.fail {
                        pending.push(Event::RunFailed {
                            stage, instance, attempt, error: "x".into(), kind: kind(c.retry),
                        });
                    } else {
                        succeeded.insert((stage, instance));
                        pending.push(ended(stage, instance, attempt));
                    }
                }
            }
            if outcome == Some(Outcome::Succeeded) {
                for (i, &n) in counts.iter().enumerate() {
                    for k in 0..n {
                        prop_assert!(succeeded.contains(&(i, k)), "{i}/{k} never ran");
                        prop_assert!(!shared || reported.contains(&(i, k)), "{i}/{k} not reported");
                    }
                }
                prop_assert!(!shared || claimed.len() == counts.len(), "stages left unclaimed");
            }
            prop_assert!(outcome != Some(Outcome::Stuck), "an acyclic DAG got stuck");
        }
    }
}
