//! The event loop. Jobs are planned up front; then arrivals, transfers and lambdas move the
//! simulated clock from one completion to the next.
//!
//! Execution rules (docs/simulator.md gives the reasons):
//! - A stage becomes *ready* when every sender stage has ended and every `remote` or `memory`
//!   input is durable (atomic visibility), and, when it runs on the VMs of an earlier stage
//!   (vm-storage), when those VMs have finished that stage.
//! - The plan's `n` VMs of a stage are *slots*: slot `j` holds a contiguous block of instances
//!   (the first `K mod n` slots one more), needs `min(c, size) * memory` MB on one VM of the
//!   plan's type, and is granted by the resource manager (first fit in FIFO order with
//!   backfilling, preferring a VM that does not already host this stage, then a VM with a warm
//!   container of the function, then the VM with the fewest holders, then a seeded order);
//!   a slot also holds one vCPU slot per lambda it runs at once while its stage computes
//!   (`SimConfig::vcpu_slots`), as the control plane's resource manager accounts them.
//! - A granted slot fetches its inputs (direct: one flow per sender VM; remote or memory: one
//!   download), then runs its instances `c` at a time; an instance is hot when its VM holds an
//!   idle warm container of the same function (DAG, function name and definition), else cold.
//!   The warm rule is the system's (`sonic_core::warm`): a job whose DAG's cold-time models
//!   have not converged when it arrives uses and leaves warm containers of its own only; later
//!   jobs share them across jobs (`SimConfig::cold_samples`).
//! - When a slot's instances are done it uploads its `remote` and `memory` outputs. Its VM
//!   stays *held* by the job while it computes, uploads, serves a `direct` edge not yet
//!   fetched, or keeps a file for a vm-storage receiver (which also keeps its memory).
//! - Transfers are flows over links (`crate::net`): each VM has an egress and an ingress link
//!   (its NIC) and a write and a read connection to the object store; the store's aggregate
//!   (`aggregate_mbps`, when the catalog gives one) is one more link every VM's store transfers
//!   share. A direct copy crosses the sender's egress and the receiver's ingress; a `remote`
//!   upload the sender's egress, its write connection and the aggregate, a download the
//!   aggregate, the receiver's read connection and its ingress. The memory tier (the catalog's
//!   `memory_tier`, one node) is one link of its network's rate, shared by every VM's `memory`
//!   transfers: an upload crosses the sender's egress and the node, a download the node and
//!   the receiver's ingress. A store or tier transfer starts after its requests' delay (the
//!   latency of one, plus the requests over the rate the store or node serves).
//! - A vm-storage receiver runs on its sender's VMs. If they lack the memory it needs, a job
//!   with a second-best plan switches to it for every stage not yet started; a job without
//!   one waits (its groups reserved up front the most memory their planned stages need, so
//!   waiting cannot deadlock).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use serde::Serialize;
use sonic_core::catalog::{SECONDS_PER_MONTH, mbps_to_bytes_per_s};
use sonic_core::dag::EdgeKind;
use sonic_core::machine::{self, Action, Event, JobMachine, Shape, Spread, Warmth};
use sonic_core::model::{Assignment, Method, Placement, PlanProblem, perf_per_dollar};
use sonic_core::planner::{Policy, Predicted, plan};
use sonic_core::regression::{Convergence, DagModels, FunctionSample};

use crate::SimError;
use crate::input::{Cluster, JobSpec, SimConfig};
use crate::net::{Net, finish_time, time_tolerance};
use crate::report::{
    ClusterStats, EdgeReport, JobCost, JobReport, SimReport, StageReport, summarize,
};
use crate::rng::SplitMix64;

const NONE: usize = usize::MAX;

/// Simulates `jobs` on `cluster`. Each job is planned with its policy against the cluster's
/// catalog, then all run together. Jobs are reported in the order given.
pub fn simulate(
    cluster: &Cluster,
    jobs: &[JobSpec],
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    simulate_plans(cluster, jobs, &[], config)
}

/// [`simulate`], with the plan of some jobs given (`forced[i]` for `jobs[i]`, in the indices of
/// the cluster's catalog) instead of planned: the experiments force methods this way.
pub(crate) fn simulate_plans(
    cluster: &Cluster,
    jobs: &[JobSpec],
    forced: &[Option<Assignment>],
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    let mut sim = Sim::new(cluster, config, jobs, forced)?;
    sim.run()?;
    Ok(sim.report())
}

/// The consistency check: one job alone on an idle cluster, next to the model's prediction of
/// the plan it ran (`PlanProblem::evaluate` under the job's true parameters).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    pub job: JobReport,
    pub model_latency_s: f64,
    pub model_cost_usd: f64,
    /// `|simulated - model| / model`.
    pub latency_rel_error: f64,
    pub cost_rel_error: f64,
}

/// Simulates `job` alone (arriving at 0) on an idle `cluster` and compares with the model.
pub fn validate_alone(
    cluster: &Cluster,
    job: &JobSpec,
    config: &SimConfig,
) -> Result<Validation, SimError> {
    alone(cluster, job, None, config)
}

/// A plan by names, as the control plane's plan report gives it (`ofctl plan -o json`, the
/// evaluation's `plans/`: `stages` with `function`, `vm_type`, `vms`, `concurrent`; `edges`
/// with `from`, `to`, `method`; other fields are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PlanShape {
    pub stages: Vec<StageShape>,
    pub edges: Vec<EdgeShape>,
}

/// Where one stage of a [`PlanShape`] runs.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StageShape {
    pub function: String,
    pub vm_type: String,
    pub vms: u32,
    pub concurrent: u32,
}

/// How one edge of a [`PlanShape`] passes its data.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct EdgeShape {
    pub from: String,
    pub to: String,
    pub method: Method,
}

impl PlanShape {
    /// The plan in `pb`'s indices (its stages and edges, its catalog's VM types); an error
    /// names what the plan lacks or what `pb` does not know.
    pub fn assignment(&self, pb: &PlanProblem) -> Result<Assignment, String> {
        let mut placements = Vec::with_capacity(pb.stages().len());
        for st in pb.stages() {
            let s = self
                .stages
                .iter()
                .find(|s| s.function == st.name)
                .ok_or_else(|| format!("the plan has no stage {:?}", st.name))?;
            let vm = pb
                .catalog()
                .vm_types
                .iter()
                .position(|v| v.name == s.vm_type)
                .ok_or_else(|| format!("the catalog has no VM type {:?}", s.vm_type))?;
            placements.push(Placement {
                vm,
                vms: s.vms,
                concurrent: s.concurrent,
            });
        }
        let mut methods = Vec::with_capacity(pb.edges().len());
        for e in pb.edges() {
            let (from, to) = (&pb.stages()[e.from].name, &pb.stages()[e.to].name);
            let m = self
                .edges
                .iter()
                .find(|x| &x.from == from && &x.to == to)
                .ok_or_else(|| format!("the plan has no edge {from} -> {to}"))?;
            methods.push(m.method);
        }
        Ok(Assignment {
            placements,
            methods,
        })
    }
}

/// [`validate_alone`] for a given plan instead of the one the job's policy would choose: the
/// evaluation simulates the plan the system ran. The plan must run on `cluster`'s catalog.
pub fn validate_plan(
    cluster: &Cluster,
    job: &JobSpec,
    plan: &PlanShape,
    config: &SimConfig,
) -> Result<Validation, SimError> {
    let a = given(cluster, job, plan, config)?;
    alone(cluster, job, Some(a), config)
}

/// [`simulate`], with the plan of some jobs given (`plans[i]` for `jobs[i]`; `None`, or no
/// entry: planned by the job's policy): jobs that run given plans together, as
/// [`validate_plan`] runs one alone. Each plan must run on `cluster`'s catalog.
pub fn simulate_given(
    cluster: &Cluster,
    jobs: &[JobSpec],
    plans: &[Option<PlanShape>],
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    let forced = jobs
        .iter()
        .zip(plans)
        .map(|(job, plan)| {
            plan.as_ref()
                .map(|p| given(cluster, job, p, config))
                .transpose()
        })
        .collect::<Result<Vec<_>, _>>()?;
    simulate_plans(cluster, jobs, &forced, config)
}

/// A given plan in the indices of `job` on `cluster`'s catalog.
fn given(
    cluster: &Cluster,
    job: &JobSpec,
    plan: &PlanShape,
    config: &SimConfig,
) -> Result<Assignment, SimError> {
    let pb = PlanProblem::from_dag(&job.dag, &job.params, cluster.catalog().clone(), job.bounds)
        .map(|pb| pb.with_prewarm(config.prewarm))
        .map_err(|e| job_err(&job.name, e))?;
    plan.assignment(&pb)
        .map_err(|e| job_err(&job.name, format!("the given plan: {e}")))
}

fn alone(
    cluster: &Cluster,
    job: &JobSpec,
    forced: Option<Assignment>,
    config: &SimConfig,
) -> Result<Validation, SimError> {
    let mut spec = job.clone();
    spec.arrival_s = 0.0;
    // Alone on an idle cluster nothing waits: load-aware admission would pick the plan best
    // alone anyway, after planning on every set of VM types.
    let config = SimConfig {
        load_aware: false,
        ..*config
    };
    let report = simulate_plans(cluster, &[spec], &[forced], &config)?;
    let job = report
        .jobs
        .into_iter()
        .next()
        .ok_or_else(|| SimError::Scenario("no job reported".into()))?;
    let rel = |sim: f64, model: f64| (sim - model).abs() / model.abs().max(f64::MIN_POSITIVE);
    Ok(Validation {
        model_latency_s: job.model_latency_s,
        model_cost_usd: job.model_cost_usd,
        latency_rel_error: rel(job.latency_s, job.model_latency_s),
        cost_rel_error: rel(job.cost_usd, job.model_cost_usd),
        job,
    })
}

// ---- events ----

#[derive(Debug, Clone, Copy)]
enum EvKind {
    Arrive(usize),
    /// A transfer's request latency is over: its bytes start to flow.
    Activate(usize),
    /// A lambda's per-instance overhead (`Stage::overhead_s`) is over: the instance ends.
    Overhead(Task),
}

#[derive(Debug, Clone, Copy)]
struct Ev {
    t: f64,
    seq: u64,
    kind: EvKind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    /// Reversed: the heap pops the earliest, then the first scheduled.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum FlowTag {
    Fetch {
        job: usize,
        stage: usize,
        slot: usize,
        edge: usize,
    },
    Upload {
        job: usize,
        stage: usize,
        slot: usize,
        edge: usize,
    },
}

#[derive(Debug, Clone)]
struct PendingFlow {
    bytes: f64,
    links: Vec<u32>,
    tag: FlowTag,
}

// ---- the cluster ----

#[derive(Debug)]
struct Vm {
    free_mb: f64,
    /// vCPU slots no granted slot holds (`SimConfig::vcpu_slots`).
    free_cpus: f64,
    vcpus: f64,
    usd_per_s: f64,
    running: u32,
    holders: u32,
    /// Sum of the holders' weights (reserved MB).
    weight: f64,
    /// Dollars per unit of weight accumulated since the start (integral of price / weight).
    acc: f64,
    last: f64,
    busy_s: f64,
    /// Idle warm containers: (function key, owner, expiry); the owner is the job whose runs
    /// alone may use it, `None` for a container shared across jobs (`sonic_core::warm`).
    warm: Vec<(u32, Option<usize>, f64)>,
    rank: usize,
}

/// Memory a stage of an admitted job is predicted to take on one VM, and when.
#[derive(Debug, Clone, Copy)]
struct Booking {
    job: usize,
    stage: usize,
    start: f64,
    end: f64,
    mb: f64,
    /// Lambdas at once: the model runs one per vCPU.
    cpus: f64,
}

/// Bookings of a plan being fitted: (VM, booking).
type Placed = Vec<(usize, Booking)>;

/// How long a stage still running past its predicted end is expected to keep its memory.
const OVERRUN_S: f64 = 1.0;

#[derive(Debug, Clone, Copy)]
struct Task {
    remaining: f64,
    vm: usize,
    job: usize,
    stage: usize,
    slot: usize,
    /// It runs in a warm container: it pays the stage's hot-batch overhead.
    hot: bool,
}

// ---- jobs ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Done,
}

#[derive(Debug, Clone)]
struct Slot {
    size: u32,
    first: u32,
    conc: u32,
    /// MB its lambdas need at once.
    need: f64,
    /// MB the slot asks the resource manager for (more when reserving up front).
    reserve: f64,
    vm: usize,
    granted: f64,
    fetch_left: u32,
    started: u32,
    running: u32,
    done: u32,
    finished: bool,
    /// Lambdas run with the true memory: learned from a first OOM kill (or no need).
    learned: bool,
    /// Its instances' uploads still going (their runs end, for the job machine, after them).
    uploads: u32,
}

#[derive(Debug, Clone)]
struct StageRun {
    state: State,
    pl: Placement,
    group: usize,
    ready: f64,
    first_grant: f64,
    /// When the job machine had its containers started (`Action::Prewarm`), if it did.
    prewarmed: f64,
    end: f64,
    slots: Vec<Slot>,
    slots_done: usize,
    cold: u32,
    hot: u32,
    batched: u32,
    /// Per instance, the VM of the plan the job machine placed it on (once the stage opened).
    placed: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
struct EdgeRun {
    /// What the sender did with its output (set when the sender starts).
    sender_method: Option<Method>,
    /// How the receiver got it (set when the receiver starts).
    method: Option<Method>,
    uploads_left: u32,
    sender_end: f64,
    durable: f64,
    recv_slots_left: u32,
    fetch_flows_left: u32,
    fetched: Option<f64>,
    upload_s: f64,
    fetch_s: f64,
}

#[derive(Debug, Clone)]
struct Lease {
    vm: usize,
    reserved: f64,
    /// vCPU slots it holds while its stage computes.
    cpus: f64,
    weight: f64,
    holding: bool,
    mark: f64,
    uploads: u32,
    /// When the job first and last had an instance on this VM (from the grant of its first
    /// instance's slot to its last instance's end, uploads included): what the control plane's
    /// job summary charges (`JobCost::summary_usd`).
    span: Option<(f64, f64)>,
}

/// The VMs one stage took, reused by later stages through vm-storage (the model's group).
#[derive(Debug, Clone)]
struct Group {
    vm_type: usize,
    n: u32,
    leases: Vec<Lease>,
    stages: Vec<usize>,
    running: Option<usize>,
    /// Reserved the most memory its planned stages need at its first grant.
    upfront: bool,
}

#[derive(Debug, PartialEq, PartialOrd, Clone, Copy)]
enum Need {
    Nothing,
    Hold,
    Memory,
}

#[derive(Debug)]
struct Job {
    name: String,
    app: String,
    policy: Policy,
    arrival: f64,
    pb: PlanProblem,
    first: Assignment,
    assign: Assignment,
    second: Option<Assignment>,
    planned: Predicted,
    model_latency: f64,
    model_cost: f64,
    fn_keys: Vec<u32>,
    /// Shares warm containers across jobs (its DAG's cold-time models had converged when it
    /// arrived); else only among its own runs.
    shares_warm: bool,
    /// Its cold-time sample, recorded in its DAG's models when it ends: (input size, per
    /// function the true cold time).
    cold_sample: (f64, BTreeMap<String, FunctionSample>),
    /// The memory per lambda the plan was made with (the prediction): what slots reserve.
    pred_mem: Vec<f64>,
    /// The plans the job may run, best alone first (load-aware admission picks one).
    candidates: Vec<Candidate>,
    stages: Vec<StageRun>,
    edges: Vec<EdgeRun>,
    groups: Vec<Group>,
    stages_done: usize,
    finish: Option<f64>,
    cost: JobCost,
    fell_back: bool,
    /// The control plane's job machine (`sonic_core::machine`) for this job: it decides when
    /// each stage opens and where its instances run, as it does in the system.
    machine: JobMachine,
}

impl Job {
    fn can_fall_back(&self) -> bool {
        self.second.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Request {
    Slot {
        job: usize,
        stage: usize,
        slot: usize,
    },
    Grow {
        job: usize,
        stage: usize,
    },
}

struct Sim<'a> {
    cluster: &'a Cluster,
    cfg: SimConfig,
    now: f64,
    seq: u64,
    events: BinaryHeap<Ev>,
    handled: u64,
    net: Net<FlowTag>,
    pending: Vec<Option<PendingFlow>>,
    vms: Vec<Vm>,
    by_type: Vec<Vec<usize>>,
    /// The resource manager's book: per VM, the memory the admitted jobs' unfinished stages
    /// are predicted to take and when (load-aware admission reads it).
    bookings: Vec<Vec<Booking>>,
    usable_mb: Vec<f64>,
    tasks: Vec<Option<Task>>,
    active_tasks: Vec<usize>,
    jobs: Vec<Job>,
    queue: Vec<Request>,
    /// Per DAG, its models' cold-time samples (`SimConfig::cold_samples`); `None`: converged
    /// before the run.
    models: Option<BTreeMap<String, DagModels>>,
    /// A job's cold-time sample its DAG's models refused (the run stops with it).
    model_error: Option<SimError>,
    /// Requests or free memory changed since the resource manager last looked.
    rm_dirty: bool,
    aggregate_link: Option<u32>,
    /// The memory tier's node, when the catalog has one: one link every VM's `memory`
    /// transfers share.
    memory_link: Option<u32>,
    unfinished: usize,
    running_total: u64,
    peak_running: u64,
    instances: u64,
    local_price: f64,
    remote_price: f64,
    /// The memory tier's price per byte-second (0 without one).
    memory_price: f64,
}

fn overlap(a: (u32, u32), b: (u32, u32)) -> u32 {
    let lo = a.0.max(b.0);
    let hi = (a.0 + a.1).min(b.0 + b.1);
    hi.saturating_sub(lo)
}

fn job_err(job: &str, message: impl std::fmt::Display) -> SimError {
    SimError::Job {
        job: job.to_owned(),
        message: message.to_string(),
    }
}

/// Whether the sender of an edge passed this way uploads its output when its slot is done
/// (to the object store or to the memory tier), the receiver downloading it.
fn uploads(m: Method) -> bool {
    matches!(m, Method::Remote | Method::Memory)
}

/// Refuses a plan with a `memory` edge the memory tier cannot take: the catalog has none, or
/// the edge's bytes do not fit it (as the model refuses it).
fn check_memory(pb: &PlanProblem, a: &Assignment) -> Result<(), String> {
    for (e, &m) in a.methods.iter().enumerate() {
        if m != Method::Memory || pb.memory_fits(e) {
            continue;
        }
        let edge = &pb.edges()[e];
        let (from, to) = (&pb.stages()[edge.from].name, &pb.stages()[edge.to].name);
        return Err(match &pb.catalog().memory_tier {
            None => format!("edge {from} -> {to} is memory but the catalog has no memory tier"),
            Some(t) => format!(
                "edge {from} -> {to} is memory but its {:.0} bytes do not fit the memory tier's {} MB",
                edge.bytes, t.capacity_mb
            ),
        });
    }
    Ok(())
}

/// One plan a job may run: the planner's best on some of the cluster's VM types, with its
/// fallback, the prediction it was chosen on and its stages' predicted windows.
#[derive(Debug, Clone)]
struct Candidate {
    first: Assignment,
    second: Option<Assignment>,
    planned: Predicted,
    /// Predicted `(start, end)` of every stage, seconds after the job starts.
    windows: Vec<(f64, f64)>,
    model_latency: f64,
    model_cost: f64,
}

/// The sets of VM types load-aware admission plans on: every non-empty subset of the cluster's
/// types (up to 6 types; beyond, the whole catalog and each type alone), the whole catalog
/// first.
fn type_subsets(types: usize) -> Vec<Vec<usize>> {
    let all: Vec<usize> = (0..types).collect();
    let mut out = vec![all];
    if types <= 1 {
        return out;
    }
    if types <= 6 {
        for mask in 1u32..(1 << types) - 1 {
            out.push((0..types).filter(|t| mask & (1 << t) != 0).collect());
        }
    } else {
        out.extend((0..types).map(|t| vec![t]));
    }
    out
}

/// Plans one job and sets up its run state.
fn prepare(
    spec: &JobSpec,
    cluster: &Cluster,
    cfg: &SimConfig,
    forced: Option<Assignment>,
    fn_ids: &mut BTreeMap<(String, String, String), u32>,
) -> Result<Job, SimError> {
    let name = &spec.name;
    if !(spec.arrival_s.is_finite() && spec.arrival_s >= 0.0) {
        return Err(job_err(name, format!("arrival {} s", spec.arrival_s)));
    }
    let catalog = cluster.catalog().clone();
    // As the control plane re-plans a job under the capacity the resource manager has
    // (`resources::planned::allocate`, `Answer::Capacity`): a stage never uses more VMs of a type than the
    // cluster has. The best plan within the limits is the best plan whenever that fits.
    let limits: BTreeMap<String, u32> = cluster.counts().into_iter().collect();
    let limited = |pb: PlanProblem| {
        pb.with_vm_limits(&limits)
            .map(|pb| pb.with_prewarm(cfg.prewarm))
    };
    let pb = PlanProblem::from_dag(&spec.dag, &spec.params, catalog.clone(), spec.bounds)
        .and_then(limited)
        .map_err(|e| job_err(name, e))?;
    let told = match spec.policy {
        Policy::Oracle => &spec.params,
        _ => spec.predicted.as_ref().unwrap_or(&spec.params),
    };
    let plan_pb = PlanProblem::from_dag(&spec.dag, told, catalog.clone(), spec.bounds)
        .and_then(limited)
        .map_err(|e| job_err(name, e))?;
    for (a, b) in pb.stages().iter().zip(plan_pb.stages()) {
        if a.name != b.name || a.instances != b.instances {
            return Err(job_err(
                name,
                format!(
                    "predicted parameters of {:?} differ in fanout from the true ones (the simulator perturbs times, bytes and memory only)",
                    a.name
                ),
            ));
        }
    }
    let load_aware = cfg.load_aware
        && forced.is_none()
        && matches!(
            spec.policy,
            Policy::Sonic | Policy::SonicMean | Policy::Oracle
        );
    let subsets = if load_aware {
        type_subsets(catalog.vm_types.len())
    } else {
        vec![(0..catalog.vm_types.len()).collect()]
    };
    let mut candidates: Vec<Candidate> = Vec::new();
    for (k, types) in subsets.iter().enumerate() {
        let sub_pb = if k == 0 {
            plan_pb.clone()
        } else {
            let mut sub = catalog.clone();
            sub.vm_types = types.iter().map(|&t| catalog.vm_types[t].clone()).collect();
            match PlanProblem::from_dag(&spec.dag, told, sub, spec.bounds).and_then(limited) {
                Ok(p) => p,
                Err(_) => continue,
            }
        };
        let out = match forced.as_ref() {
            Some(a) => {
                let pred = plan_pb
                    .evaluate(a)
                    .map_err(|e| job_err(name, format!("the given plan does not run: {e}")))?;
                Ok(sonic_core::planner::PlanOutcome {
                    best: sonic_core::planner::Plan::new(&plan_pb, a, &pred),
                    second_best: None,
                    table: Vec::new(),
                    exact: true,
                    stopped: None,
                    slo: None,
                })
            }
            None => plan(&sub_pb, spec.policy),
        };
        let out = match out {
            Ok(o) => o,
            Err(e) if k == 0 => return Err(job_err(name, e)),
            Err(_) => continue, // these types cannot run the job
        };
        let mut plans = vec![(out.best.clone(), out.second_best.clone())];
        if load_aware && let Some(sb) = out.second_best {
            plans.push((sb, None));
        }
        for (p, fb) in plans {
            let first = p.assignment(&plan_pb).map_err(|e| job_err(name, e))?;
            if candidates.iter().any(|c| c.first == first) {
                continue;
            }
            let second = fb
                .map(|q| q.assignment(&plan_pb))
                .transpose()
                .map_err(|e| job_err(name, e))?;
            for a in std::iter::once(&first).chain(&second) {
                check_memory(&plan_pb, a)
                    .map_err(|e| job_err(name, format!("the plan does not run: {e}")))?;
            }
            let pred = plan_pb
                .evaluate(&first)
                .map_err(|e| job_err(name, format!("the plan does not run: {e}")))?;
            // Under the truth a plan made with too little memory may not fit its VMs (the
            // simulator then runs it in smaller batches): the model has no figure for it.
            let (model_latency, model_cost) = pb
                .evaluate(&first)
                .map_or((f64::NAN, f64::NAN), |m| (m.latency_s, m.cost_usd));
            candidates.push(Candidate {
                windows: pred.stages.iter().map(|s| (s.start_s, s.end_s)).collect(),
                planned: Predicted {
                    latency_s: pred.latency_s,
                    cost_usd: pred.cost_usd,
                    perf_per_dollar: pred.perf_per_dollar,
                    requests_usd: pred.cost.requests_usd,
                    latency_quantiles_s: None,
                },
                first,
                second,
                model_latency,
                model_cost,
            });
        }
    }
    let c0 = candidates[0].clone();
    let app = spec.dag.name.clone();
    let fn_keys = pb
        .stages()
        .iter()
        .map(|s| {
            let next = fn_ids.len() as u32;
            // The function's identity across jobs, as `sonic_api::agent::function_key`: the
            // DAG's name, the function's and its definition.
            let definition = spec
                .dag
                .functions
                .iter()
                .find(|f| f.name == s.name)
                .and_then(|f| serde_json::to_string(f).ok())
                .unwrap_or_default();
            *fn_ids
                .entry((app.clone(), s.name.clone(), definition))
                .or_insert(next)
        })
        .collect();
    let stages = c0
        .first
        .placements
        .iter()
        .map(|&pl| StageRun {
            state: State::Waiting,
            pl,
            group: NONE,
            ready: 0.0,
            first_grant: f64::INFINITY,
            prewarmed: f64::INFINITY,
            end: 0.0,
            slots: Vec::new(),
            slots_done: 0,
            cold: 0,
            hot: 0,
            batched: 0,
            placed: Vec::new(),
        })
        .collect();
    let machine = JobMachine::new(planned_shape(&pb, &c0.first), 1, std::time::Duration::ZERO);
    Ok(Job {
        name: name.clone(),
        app,
        policy: spec.policy,
        arrival: spec.arrival_s,
        edges: vec![EdgeRun::default(); pb.edges().len()],
        pred_mem: plan_pb.stages().iter().map(|s| s.memory_mb).collect(),
        pb,
        assign: c0.first.clone(),
        first: c0.first,
        second: c0.second,
        planned: c0.planned,
        model_latency: c0.model_latency,
        model_cost: c0.model_cost,
        candidates,
        fn_keys,
        shares_warm: true,
        cold_sample: (
            spec.params.edges.iter().map(|e| e.bytes.0 as f64).sum(),
            spec.params
                .functions
                .iter()
                .map(|(n, f)| {
                    (
                        n.clone(),
                        FunctionSample {
                            cold_s: Some(f.cold_s),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        ),
        stages,
        groups: Vec::new(),
        stages_done: 0,
        finish: None,
        cost: JobCost::default(),
        fell_back: false,
        machine,
    })
}

/// The job machine's shape of a planned job, as the control plane builds it
/// (`Shape::planned`): each stage opens when the stages it reads from ended, and its instances
/// run on its VMs of `a` in blocks.
fn planned_shape(pb: &PlanProblem, a: &Assignment) -> Shape {
    let senders = (0..pb.stages().len())
        .map(|r| {
            let mut s: Vec<usize> = pb.incoming(r).iter().map(|&e| pb.edges()[e].from).collect();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    let n = pb.stages().len();
    Shape::new(senders, vec![None; n]).with_spread(&spreads(a))
}

/// Per stage, where the plan `a` runs its instances.
fn spreads(a: &Assignment) -> Vec<Spread> {
    a.placements
        .iter()
        .map(|pl| Spread::Blocks { vms: pl.vms })
        .collect()
}

impl<'a> Sim<'a> {
    fn new(
        cluster: &'a Cluster,
        cfg: &SimConfig,
        specs: &[JobSpec],
        forced: &[Option<Assignment>],
    ) -> Result<Self, SimError> {
        let catalog = cluster.catalog();
        let n = cluster.vms().len();
        let mut rng = SplitMix64::new(cfg.seed);
        let perm = rng.permutation(n);
        let mut rank = vec![0; n];
        for (r, &v) in perm.iter().enumerate() {
            rank[v] = r;
        }
        let store = &catalog.remote_storage;
        let mut caps = Vec::with_capacity(4 * n + 2);
        let mut vms = Vec::with_capacity(n);
        let mut by_type = vec![Vec::new(); catalog.vm_types.len()];
        for (i, &t) in cluster.vms().iter().enumerate() {
            let ty = &catalog.vm_types[t];
            caps.extend([
                ty.bandwidth_bps(),
                ty.bandwidth_bps(),
                mbps_to_bytes_per_s(store.write_mbps),
                mbps_to_bytes_per_s(store.read_mbps),
            ]);
            vms.push(Vm {
                free_mb: catalog.usable_mb(ty),
                free_cpus: f64::from(ty.vcpus),
                vcpus: f64::from(ty.vcpus),
                usd_per_s: ty.usd_per_second(),
                running: 0,
                holders: 0,
                weight: 0.0,
                acc: 0.0,
                last: 0.0,
                busy_s: 0.0,
                warm: Vec::new(),
                rank: rank[i],
            });
            by_type[t].push(i);
        }
        let aggregate_link = store.aggregate_mbps.map(|a| {
            caps.push(mbps_to_bytes_per_s(a));
            (caps.len() - 1) as u32
        });
        let memory_link = catalog.memory_tier.as_ref().map(|m| {
            caps.push(mbps_to_bytes_per_s(m.network_mbps));
            (caps.len() - 1) as u32
        });
        let mut fn_ids = BTreeMap::new();
        let jobs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                prepare(
                    s,
                    cluster,
                    cfg,
                    forced.get(i).cloned().flatten(),
                    &mut fn_ids,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut sim = Sim {
            cluster,
            cfg: *cfg,
            now: 0.0,
            seq: 0,
            events: BinaryHeap::new(),
            handled: 0,
            net: Net::new(caps),
            pending: Vec::new(),
            vms,
            by_type,
            bookings: vec![Vec::new(); n],
            usable_mb: cluster
                .vms()
                .iter()
                .map(|&t| catalog.usable_mb(&catalog.vm_types[t]))
                .collect(),
            tasks: Vec::new(),
            active_tasks: Vec::new(),
            unfinished: jobs.len(),
            jobs,
            queue: Vec::new(),
            models: None,
            model_error: None,
            rm_dirty: false,
            aggregate_link,
            memory_link,
            running_total: 0,
            peak_running: 0,
            instances: 0,
            local_price: catalog.local_storage.usd_per_gb_month / SECONDS_PER_MONTH / 1e9,
            remote_price: store.usd_per_gb_month / SECONDS_PER_MONTH / 1e9,
            memory_price: catalog
                .memory_tier
                .as_ref()
                .map_or(0.0, |m| m.usd_per_byte_second()),
        };
        if let Some(n) = cfg.cold_samples {
            let mut models: BTreeMap<String, DagModels> = BTreeMap::new();
            for (j, spec) in specs.iter().enumerate() {
                if models.contains_key(&sim.jobs[j].app) {
                    continue;
                }
                let mut m = DagModels::new(&spec.dag, Convergence::default(), cfg.seed);
                let (x, sample) = &sim.jobs[j].cold_sample;
                for _ in 0..n {
                    m.add_sample(*x, sample, &[])
                        .map_err(|e| job_err(&spec.name, format!("cold-time sample: {e}")))?;
                }
                models.insert(sim.jobs[j].app.clone(), m);
            }
            sim.models = Some(models);
        }
        for j in 0..sim.jobs.len() {
            let t = sim.jobs[j].arrival;
            sim.push(t, EvKind::Arrive(j));
        }
        Ok(sim)
    }

    fn push(&mut self, t: f64, kind: EvKind) {
        self.seq += 1;
        self.events.push(Ev {
            t,
            seq: self.seq,
            kind,
        });
    }

    fn task_rate(&self, vm: usize) -> f64 {
        let v = &self.vms[vm];
        if self.cfg.cpu_sharing && f64::from(v.running) > v.vcpus {
            v.vcpus / f64::from(v.running)
        } else {
            1.0
        }
    }

    fn run(&mut self) -> Result<(), SimError> {
        loop {
            self.net.update_rates();
            let t_ev = self.events.peek().map(|e| e.t);
            let t_flow = self.net.next_finish(self.now);
            let t_task = self
                .active_tasks
                .iter()
                .filter_map(|&id| self.tasks[id])
                .map(|t| finish_time(self.now, t.remaining, self.task_rate(t.vm)))
                .min_by(f64::total_cmp);
            let Some(t) = [t_ev, t_flow, t_task]
                .into_iter()
                .flatten()
                .filter(|t| t.is_finite())
                .min_by(f64::total_cmp)
            else {
                break;
            };
            let t = t.max(self.now);
            let flows_done = self.net.advance(self.now, t);
            let tasks_done = self.advance_tasks(t);
            self.now = t;
            for (_, tag) in flows_done {
                self.flow_done(tag);
            }
            for task in tasks_done {
                self.task_done(task);
            }
            while let Some(ev) = self.events.peek().copied() {
                if ev.t > self.now + time_tolerance(self.now) {
                    break;
                }
                self.events.pop();
                self.handled += 1;
                match ev.kind {
                    EvKind::Arrive(j) => self.arrive(j),
                    EvKind::Activate(p) => {
                        if let Some(pf) = self.pending[p].take() {
                            self.net.start(pf.bytes, &pf.links, pf.tag);
                        }
                    }
                    EvKind::Overhead(t) => self.instance_done(t),
                }
            }
            if self.rm_dirty {
                self.schedule();
            }
            if let Some(e) = self.model_error.take() {
                return Err(e);
            }
        }
        if self.unfinished > 0 {
            return Err(SimError::Stalled {
                at_s: self.now,
                unfinished: self.unfinished,
            });
        }
        Ok(())
    }

    fn advance_tasks(&mut self, until: f64) -> Vec<Task> {
        let dt = until - self.now;
        let mut done = Vec::new();
        for i in 0..self.active_tasks.len() {
            let id = self.active_tasks[i];
            let Some(t) = self.tasks[id] else { continue };
            let rate = self.task_rate(t.vm);
            if finish_time(self.now, t.remaining, rate) <= until + time_tolerance(until) {
                done.push(t);
                self.tasks[id] = None;
            } else if let Some(t) = self.tasks[id].as_mut() {
                t.remaining -= rate * dt;
            }
        }
        if !done.is_empty() {
            self.active_tasks.retain(|&id| self.tasks[id].is_some());
        }
        done
    }

    // ---- jobs and stages ----

    fn arrive(&mut self, j: usize) {
        // As the control plane decides when a job starts (`exec::run`).
        self.jobs[j].shares_warm = match &self.models {
            None => true,
            Some(m) => m
                .get(&self.jobs[j].app)
                .is_none_or(sonic_core::warm::shares_across_jobs),
        };
        self.admit(j);
        // As the executor: a job sharing warm containers prewarms its stages (no pool ledger
        // here, so no claims); one measuring cold starts does not.
        let warmth = if self.jobs[j].shares_warm {
            Warmth::Shared {
                claims: false,
                prewarm: self.cfg.prewarm.then(BTreeMap::new),
            }
        } else {
            Warmth::Own
        };
        self.jobs[j].machine.set_warmth(warmth);
        self.machine(j, Event::Begin);
    }

    /// Tells job `j`'s machine what happened and carries its actions out: an opened stage
    /// starts when its VMs allow (`try_ready`), the instances it places run on those VMs.
    fn machine(&mut self, j: usize, event: Event) {
        let mut events = std::collections::VecDeque::from([event]);
        let mut opened = Vec::new();
        while let Some(event) = events.pop_front() {
            for action in self.jobs[j].machine.handle(event) {
                match action {
                    // The stage's instances are placed once it starts (`start_stage`), as the
                    // executor answers once it built the stage's requests.
                    Action::OpenStage { stage } => opened.push(stage),
                    Action::StartRun {
                        stage,
                        instance,
                        vm,
                        ..
                    } => {
                        let placed = &mut self.jobs[j].stages[stage].placed;
                        if placed.len() <= instance as usize {
                            placed.resize(instance as usize + 1, 0);
                        }
                        placed[instance as usize] = vm;
                    }
                    // Its containers start now, after the delay.
                    Action::Prewarm { stage, delay } => {
                        let st = &mut self.jobs[j].stages[stage];
                        st.prewarmed = st.prewarmed.min(self.now + delay.as_secs_f64());
                    }
                    // Nothing is recorded before, nothing fails or is cancelled: the job ends
                    // when its last stage does (`stage_done`); no pool ledger is kept.
                    Action::Restore { .. }
                    | Action::StopRuns
                    | Action::Finish(_)
                    | Action::ClaimWarm { .. }
                    | Action::WarmReported { .. } => {}
                }
            }
        }
        for r in opened {
            self.try_ready(j, r);
        }
    }

    /// The runs of slot `i` of stage `r` ended, their uploads done: the job machine hears it.
    fn slot_ended(&mut self, j: usize, r: usize, i: usize) {
        let s = &self.jobs[j].stages[r].slots[i];
        let (first, size) = (s.first, s.size);
        for k in first..first + size {
            self.machine(
                j,
                Event::RunEnded {
                    stage: r,
                    instance: k,
                    attempt: 1,
                },
            );
        }
    }

    // ---- load-aware admission ----

    /// When a booking is expected to end: a stage running late keeps its memory a little more.
    fn booking_end(&self, b: &Booking) -> f64 {
        if b.end > self.now {
            b.end
        } else {
            self.now + OVERRUN_S
        }
    }

    /// The most memory and lambdas booked on `vm` at once during `[a, b)`, counting `extra`.
    fn booked_peak(&self, vm: usize, a: f64, b: f64, extra: &[(usize, Booking)]) -> (f64, f64) {
        let on: Vec<(f64, f64, f64, f64)> = self.bookings[vm]
            .iter()
            .map(|x| (x.start, self.booking_end(x), x.mb, x.cpus))
            .chain(
                extra
                    .iter()
                    .filter(|(v, _)| *v == vm)
                    .map(|(_, x)| (x.start, x.end, x.mb, x.cpus)),
            )
            .filter(|&(s, e, _, _)| s < b && e > a)
            .collect();
        let (mut mb, mut cpus) = (0.0f64, 0.0f64);
        for p in on.iter().map(|x| x.0).chain(std::iter::once(a)) {
            let p = p.max(a);
            let at = on.iter().filter(|&&(s, e, _, _)| s <= p && e > p);
            mb = mb.max(at.clone().map(|x| x.2).sum());
            cpus = cpus.max(at.map(|x| x.3).sum());
        }
        (mb, cpus)
    }

    /// Where candidate `k` of job `j` would fit in the book if it started at `t0`, slot by
    /// slot (first fit, a stage's slots on distinct VMs when possible); `None` if it does not.
    fn fit(&self, j: usize, k: usize, t0: f64) -> Option<Vec<(usize, Booking)>> {
        let job = &self.jobs[j];
        let c = &job.candidates[k];
        let mut placed: Vec<(usize, Booking)> = Vec::new();
        for (s, (&pl, &(ws, we))) in c.first.placements.iter().zip(&c.windows).enumerate() {
            let (a, b) = (t0 + ws, (t0 + we).max(t0 + ws + 1e-6));
            let mut used: Vec<usize> = Vec::new();
            for i in 0..pl.vms {
                let (_, _, conc, need) = Self::slot_need(&job.pb, job.pred_mem[s], s, pl, i);
                let cpus = f64::from(conc);
                let fits = |v: usize| {
                    let (mb, used) = self.booked_peak(v, a, b, &placed);
                    self.usable_mb[v] - mb + 1e-9 >= need
                        && (!self.cfg.cpu_sharing || self.vms[v].vcpus - used + 1e-9 >= cpus)
                };
                let by = &self.by_type[pl.vm];
                let v = by
                    .iter()
                    .copied()
                    .find(|v| !used.contains(v) && fits(*v))
                    .or_else(|| by.iter().copied().find(|&v| fits(v)))?;
                used.push(v);
                placed.push((
                    v,
                    Booking {
                        job: j,
                        stage: s,
                        start: a,
                        end: b,
                        mb: need,
                        cpus,
                    },
                ));
            }
        }
        Some(placed)
    }

    /// Picks the plan job `j` runs (the best predicted Perf/$ once the wait for its VMs is
    /// counted) and books it.
    fn admit(&mut self, j: usize) {
        let now = self.now;
        let mut ends: Vec<f64> = self
            .bookings
            .iter()
            .flatten()
            .map(|b| self.booking_end(b))
            .filter(|&e| e > now)
            .collect();
        ends.sort_by(f64::total_cmp);
        ends.dedup();
        let delays: Vec<f64> = std::iter::once(0.0)
            .chain(ends.iter().map(|e| e - now))
            .collect();
        let mut best: Option<(usize, f64, Placed)> = None;
        for k in 0..self.jobs[j].candidates.len() {
            let p = self.jobs[j].candidates[k].planned;
            let score = |d: f64| 1.0 / ((p.latency_s + d) * p.cost_usd);
            for &d in &delays {
                if best.as_ref().is_some_and(|b| score(d) <= b.1) {
                    break;
                }
                if let Some(placed) = self.fit(j, k, now + d) {
                    best = Some((k, score(d), placed));
                    break;
                }
            }
        }
        // Nothing ever fits (a plan asks for more VMs than the cluster has): run the best
        // plan unbooked, as before.
        let (k, placed) = best.map_or((0, Vec::new()), |b| (b.0, b.2));
        let c = self.jobs[j].candidates[k].clone();
        let job = &mut self.jobs[j];
        for (st, &pl) in job.stages.iter_mut().zip(&c.first.placements) {
            st.pl = pl;
        }
        job.machine = JobMachine::new(
            planned_shape(&job.pb, &c.first),
            1,
            std::time::Duration::ZERO,
        );
        job.assign = c.first.clone();
        job.first = c.first;
        job.second = c.second;
        job.planned = c.planned;
        job.model_latency = c.model_latency;
        job.model_cost = c.model_cost;
        for (v, b) in placed {
            self.bookings[v].push(b);
        }
    }

    /// A stage ended: its bookings are over.
    fn unbook(&mut self, j: usize, r: usize) {
        for b in &mut self.bookings {
            b.retain(|x| !(x.job == j && x.stage == r));
        }
    }

    /// Starts stage `r` once the job machine opened it (every stage it reads from ended, their
    /// uploads included, as a run in the system reports after its uploads).
    fn try_ready(&mut self, j: usize, r: usize) {
        let job = &self.jobs[j];
        if job.stages[r].state != State::Waiting || !job.machine.opened(r) {
            return;
        }
        self.start_stage(j, r);
    }

    /// The runtime method of each incoming edge and where the stage runs.
    fn resolve(&self, j: usize, r: usize) -> (Vec<(usize, Method)>, Option<usize>) {
        let job = &self.jobs[j];
        let pl = job.assign.placements[r];
        let mut methods: Vec<(usize, Method)> = job
            .pb
            .incoming(r)
            .iter()
            .map(|&e| {
                let m = match job.edges[e].sender_method {
                    Some(m @ (Method::Remote | Method::Memory)) => m,
                    Some(Method::VmStorage) if job.assign.methods[e] == Method::VmStorage => {
                        Method::VmStorage
                    }
                    // The file is on the sender's disk: one copy is the cheapest way to move it.
                    _ => Method::Direct,
                };
                (e, m)
            })
            .collect();
        let groups: Vec<usize> = methods
            .iter()
            .filter(|(_, m)| *m == Method::VmStorage)
            .map(|&(e, _)| job.stages[job.pb.edges()[e].from].group)
            .collect();
        let Some(&g) = groups.first() else {
            return (methods, None);
        };
        let grp = &job.groups[g];
        let ok = groups.iter().all(|&x| x == g)
            && grp.vm_type == pl.vm
            && grp.n == pl.vms
            && (grp.n == 1
                || methods
                    .iter()
                    .filter(|(_, m)| *m == Method::VmStorage)
                    .all(|&(e, _)| job.pb.edges()[e].kind == EdgeKind::One));
        if ok {
            (methods, Some(g))
        } else {
            for (_, m) in &mut methods {
                if *m == Method::VmStorage {
                    *m = Method::Direct;
                }
            }
            (methods, None)
        }
    }

    /// A slot's instances and the memory it reserves (`mem` per lambda: the prediction).
    fn slot_need(
        pb: &PlanProblem,
        mem: f64,
        s: usize,
        pl: Placement,
        j: u32,
    ) -> (u32, u32, u32, f64) {
        let st = &pb.stages()[s];
        let (first, size) = machine::block(j, st.instances, pl.vms);
        let conc = pl.concurrent.min(size).max(1);
        (first, size, conc, f64::from(conc) * mem)
    }

    /// The most memory slot `j` of stage `r`'s group needs over the stages planned on it.
    fn upfront_need(&self, j: usize, r: usize, slot: u32) -> f64 {
        let job = &self.jobs[j];
        let mut need =
            Self::slot_need(&job.pb, job.pred_mem[r], r, job.assign.placements[r], slot).3;
        let mut stack = vec![r];
        while let Some(s) = stack.pop() {
            for &e in job.pb.outgoing(s) {
                if job.assign.methods[e] == Method::VmStorage {
                    let t = job.pb.edges()[e].to;
                    let pl = job.assign.placements[t];
                    if pl.vms == job.assign.placements[r].vms {
                        need = need.max(Self::slot_need(&job.pb, job.pred_mem[t], t, pl, slot).3);
                    }
                    stack.push(t);
                }
            }
        }
        need
    }

    fn start_stage(&mut self, j: usize, r: usize) {
        self.start_stage_on_vms(j, r);
        self.placed(j, r);
    }

    fn start_stage_on_vms(&mut self, j: usize, r: usize) {
        let (methods, host) = self.resolve(j, r);
        if let Some(g) = host
            && self.jobs[j].groups[g].running.is_some()
        {
            return; // retried when the group's current stage ends
        }
        let now = self.now;
        let pl = self.jobs[j].assign.placements[r];
        let upfront = !self.jobs[j].can_fall_back();
        let mut slots = Vec::with_capacity(pl.vms as usize);
        for i in 0..pl.vms {
            let job = &self.jobs[j];
            let (first, size, conc, need) = Self::slot_need(&job.pb, job.pred_mem[r], r, pl, i);
            let learned = job.pb.stages()[r].memory_mb <= job.pred_mem[r] * (1.0 + 1e-9);
            let reserve = if upfront && host.is_none() {
                self.upfront_need(j, r, i)
            } else {
                need
            };
            slots.push(Slot {
                size,
                first,
                conc,
                need,
                reserve,
                vm: NONE,
                granted: 0.0,
                fetch_left: 0,
                started: 0,
                running: 0,
                done: 0,
                finished: false,
                learned,
                uploads: 0,
            });
        }
        let job = &mut self.jobs[j];
        for &(e, m) in &methods {
            let er = &mut job.edges[e];
            er.method = Some(m);
            if m == Method::VmStorage {
                er.fetched = Some(now);
            } else {
                er.recv_slots_left = pl.vms;
            }
        }
        for &e in job.pb.outgoing(r) {
            // The tier refuses an output larger than it (planned with predicted bytes that
            // fit, the true ones do not): it goes to the store instead.
            let m = match job.assign.methods[e] {
                Method::Memory if !job.pb.memory_fits(e) => Method::Remote,
                m => m,
            };
            job.edges[e].sender_method = Some(m);
        }
        let st = &mut job.stages[r];
        st.state = State::Running;
        st.pl = pl;
        st.ready = now;
        st.slots = slots;
        match host {
            None => {
                let g = job.groups.len();
                job.groups.push(Group {
                    vm_type: pl.vm,
                    n: pl.vms,
                    leases: (0..pl.vms)
                        .map(|_| Lease {
                            vm: NONE,
                            reserved: 0.0,
                            cpus: 0.0,
                            weight: 0.0,
                            holding: false,
                            mark: 0.0,
                            uploads: 0,
                            span: None,
                        })
                        .collect(),
                    stages: vec![r],
                    running: Some(r),
                    upfront,
                });
                job.stages[r].group = g;
                for slot in 0..pl.vms as usize {
                    self.rm_dirty = true;
                    self.queue.push(Request::Slot {
                        job: j,
                        stage: r,
                        slot,
                    });
                }
            }
            Some(g) => {
                job.stages[r].group = g;
                job.groups[g].stages.push(r);
                job.groups[g].running = Some(r);
                if self.can_grow(j, r) {
                    self.grant_continue(j, r);
                } else if self.jobs[j].can_fall_back() {
                    self.undo_start(j, r, g);
                    self.fall_back(j);
                    self.start_stage(j, r);
                } else {
                    self.rm_dirty = true;
                    self.queue.push(Request::Grow { job: j, stage: r });
                }
            }
        }
    }

    /// A stage started on its VMs: the job machine places its instances, which must be the
    /// slots' blocks the stage was started with.
    fn placed(&mut self, j: usize, r: usize) {
        if self.jobs[j].stages[r].state != State::Running
            || !self.jobs[j].stages[r].placed.is_empty()
        {
            return;
        }
        let instances = self.jobs[j].pb.stages()[r].instances;
        self.machine(
            j,
            Event::StageOpened {
                stage: r,
                instances,
            },
        );
        let st = &self.jobs[j].stages[r];
        debug_assert!(
            st.slots
                .iter()
                .enumerate()
                .all(|(i, sl)| (sl.first..sl.first + sl.size)
                    .all(|k| st.placed.get(k as usize) == Some(&(i as u32)))),
            "the machine placed stage {r} where its slots run: {:?}",
            st.placed
        );
    }

    /// Takes back a vm-storage start the resource manager refused.
    fn undo_start(&mut self, j: usize, r: usize, g: usize) {
        let job = &mut self.jobs[j];
        job.groups[g].stages.pop();
        job.groups[g].running = None;
        let st = &mut job.stages[r];
        st.state = State::Waiting;
        st.group = NONE;
        st.slots.clear();
        for &e in job.pb.incoming(r) {
            let er = &mut job.edges[e];
            er.method = None;
            er.fetched = None;
            er.recv_slots_left = 0;
        }
        for &e in job.pb.outgoing(r) {
            job.edges[e].sender_method = None;
        }
    }

    /// The job switches to its second-best plan for every stage not started yet.
    fn fall_back(&mut self, j: usize) {
        let job = &mut self.jobs[j];
        if let Some(second) = job.second.take() {
            // The stages not started yet run where the second plan puts them.
            let spreads = spreads(&second);
            for (r, sp) in spreads.into_iter().enumerate() {
                if job.stages[r].state == State::Waiting {
                    job.machine.respread(r, sp);
                }
            }
            job.assign = second;
            job.fell_back = true;
        }
        for g in 0..self.jobs[j].groups.len() {
            self.refresh_group(j, g);
        }
    }

    /// Whether every VM of a continuing stage's group has the memory it needs.
    fn can_grow(&self, j: usize, r: usize) -> bool {
        let job = &self.jobs[j];
        let grp = &job.groups[job.stages[r].group];
        job.stages[r].slots.iter().zip(&grp.leases).all(|(s, l)| {
            s.need - l.reserved <= self.vms[l.vm].free_mb + 1e-9
                && self.cpus_for(s.conc, l.vm) - l.cpus <= self.vms[l.vm].free_cpus + 1e-9
        })
    }

    /// The vCPU slots a slot running `conc` lambdas at once holds on `vm`, as the control
    /// plane's resource manager reserves them (one per lambda, at most the VM's vCPUs); none
    /// when `SimConfig::vcpu_slots` is off.
    fn cpus_for(&self, conc: u32, vm: usize) -> f64 {
        if self.cfg.vcpu_slots {
            f64::from(conc).min(self.vms[vm].vcpus)
        } else {
            0.0
        }
    }

    fn grant_continue(&mut self, j: usize, r: usize) {
        let g = self.jobs[j].stages[r].group;
        for i in 0..self.jobs[j].stages[r].slots.len() {
            let need = self.jobs[j].stages[r].slots[i].need;
            let lease = &self.jobs[j].groups[g].leases[i];
            let (vm, old) = (lease.vm, lease.reserved);
            let new = if self.jobs[j].groups[g].upfront {
                need.max(old)
            } else {
                need
            };
            self.vms[vm].free_mb -= new - old;
            if new < old {
                self.rm_dirty = true;
            }
            self.jobs[j].groups[g].leases[i].reserved = new;
            let cpus = self.cpus_for(self.jobs[j].stages[r].slots[i].conc, vm);
            let old_cpus = self.jobs[j].groups[g].leases[i].cpus;
            self.vms[vm].free_cpus -= cpus - old_cpus;
            self.jobs[j].groups[g].leases[i].cpus = cpus;
            self.set_weight(j, g, i, new);
            let slot = &mut self.jobs[j].stages[r].slots[i];
            slot.vm = vm;
            slot.granted = self.now;
            let st = &mut self.jobs[j].stages[r];
            st.first_grant = st.first_grant.min(self.now);
        }
        for i in 0..self.jobs[j].stages[r].slots.len() {
            self.start_fetch(j, r, i);
        }
    }

    // ---- the resource manager ----

    fn schedule(&mut self) {
        while self.rm_dirty {
            self.rm_dirty = false;
            let mut i = 0;
            while i < self.queue.len() {
                if self.try_grant(self.queue[i]) {
                    self.queue.remove(i);
                } else {
                    i += 1;
                }
            }
        }
    }

    fn try_grant(&mut self, req: Request) -> bool {
        match req {
            Request::Grow { job, stage } => {
                if self.can_grow(job, stage) {
                    self.grant_continue(job, stage);
                    true
                } else {
                    false
                }
            }
            Request::Slot { job, stage, slot } => {
                let jb = &self.jobs[job];
                let st = &jb.stages[stage];
                let reserve = st.slots[slot].reserve;
                let key = jb.fn_keys[stage];
                let now = self.now;
                let best = self.by_type[st.pl.vm]
                    .iter()
                    .copied()
                    .filter(|&v| self.vms[v].free_mb + 1e-9 >= reserve)
                    .filter(|&v| {
                        self.vms[v].free_cpus + 1e-9 >= self.cpus_for(st.slots[slot].conc, v)
                    })
                    .min_by_key(|&v| {
                        let vm = &self.vms[v];
                        let same_stage = st.slots.iter().any(|s| s.vm == v);
                        let owner = (!jb.shares_warm).then_some(job);
                        let warm = vm
                            .warm
                            .iter()
                            .any(|&(k, o, exp)| k == key && o == owner && exp >= now);
                        (same_stage, !warm, vm.holders, vm.rank)
                    });
                match best {
                    Some(v) => {
                        self.grant_slot(job, stage, slot, v);
                        true
                    }
                    None => false,
                }
            }
        }
    }

    fn grant_slot(&mut self, j: usize, r: usize, i: usize, vm: usize) {
        let now = self.now;
        let g = self.jobs[j].stages[r].group;
        let reserve = self.jobs[j].stages[r].slots[i].reserve;
        let cpus = self.cpus_for(self.jobs[j].stages[r].slots[i].conc, vm);
        self.vms[vm].free_mb -= reserve;
        self.vms[vm].free_cpus -= cpus;
        {
            let lease = &mut self.jobs[j].groups[g].leases[i];
            lease.vm = vm;
            lease.reserved = reserve;
            lease.cpus = cpus;
            lease.weight = 0.0;
            lease.holding = true;
            lease.span = Some(lease.span.map_or((now, now), |(a, b)| (a.min(now), b)));
        }
        self.settle(vm);
        self.vms[vm].holders += 1;
        self.jobs[j].groups[g].leases[i].mark = self.vms[vm].acc;
        self.set_weight(j, g, i, reserve);
        let st = &mut self.jobs[j].stages[r];
        st.first_grant = st.first_grant.min(now);
        let slot = &mut st.slots[i];
        slot.vm = vm;
        slot.granted = now;
        self.start_fetch(j, r, i);
    }

    // ---- money ----

    fn settle(&mut self, vm: usize) {
        let now = self.now;
        let v = &mut self.vms[vm];
        if v.weight > 0.0 && now > v.last {
            v.acc += v.usd_per_s * (now - v.last) / v.weight;
            v.busy_s += now - v.last;
        }
        v.last = now;
    }

    /// Changes a lease's share weight, charging the job for the time at the old weight.
    fn set_weight(&mut self, j: usize, g: usize, i: usize, w: f64) {
        let vm = self.jobs[j].groups[g].leases[i].vm;
        self.settle(vm);
        let acc = self.vms[vm].acc;
        let job = &mut self.jobs[j];
        let lease = &mut job.groups[g].leases[i];
        job.cost.vm_usd += lease.weight * (acc - lease.mark);
        lease.mark = acc;
        self.vms[vm].weight += w - lease.weight;
        lease.weight = w;
    }

    /// The job's instance on lease `i` of group `g` ran until now.
    fn extend_span(&mut self, j: usize, g: usize, i: usize) {
        let now = self.now;
        let lease = &mut self.jobs[j].groups[g].leases[i];
        lease.span = Some(lease.span.map_or((now, now), |(a, b)| (a, b.max(now))));
    }

    fn release_holder(&mut self, j: usize, g: usize, i: usize) {
        self.set_weight(j, g, i, 0.0);
        let lease = &mut self.jobs[j].groups[g].leases[i];
        lease.holding = false;
        let vm = lease.vm;
        self.vms[vm].holders -= 1;
        if self.vms[vm].holders == 0 {
            self.vms[vm].weight = 0.0; // no float residue on an idle VM
        }
    }

    /// What a group must keep: its VMs (a transfer it serves), also their memory (a file a
    /// vm-storage receiver will run on), or nothing.
    fn group_need(&self, j: usize, g: usize) -> Need {
        let job = &self.jobs[j];
        let mut need = Need::Nothing;
        for &s in &job.groups[g].stages {
            for &e in job.pb.outgoing(s) {
                let er = &job.edges[e];
                let to = job.pb.edges()[e].to;
                let n = match er.sender_method {
                    Some(Method::Direct) if er.fetched.is_none() => Need::Hold,
                    Some(Method::VmStorage) => match job.stages[to].state {
                        State::Waiting if job.assign.methods[e] == Method::VmStorage => {
                            Need::Memory
                        }
                        State::Waiting => Need::Hold,
                        _ if er.method != Some(Method::VmStorage) && er.fetched.is_none() => {
                            Need::Hold
                        }
                        _ => Need::Nothing,
                    },
                    _ => Need::Nothing,
                };
                if n > need {
                    need = n;
                }
            }
        }
        need
    }

    /// Releases what a group no longer needs, VM by VM.
    fn refresh_group(&mut self, j: usize, g: usize) {
        let need = self.group_need(j, g);
        for i in 0..self.jobs[j].groups[g].leases.len() {
            let job = &self.jobs[j];
            let grp = &job.groups[g];
            let lease = &grp.leases[i];
            if !lease.holding {
                continue;
            }
            let busy = grp
                .running
                .is_some_and(|r| job.stages[r].slots.get(i).is_none_or(|s| !s.finished));
            if busy {
                continue;
            }
            let (vm, reserved, uploads) = (lease.vm, lease.reserved, lease.uploads);
            if lease.cpus > 0.0 {
                self.vms[vm].free_cpus += lease.cpus;
                self.jobs[j].groups[g].leases[i].cpus = 0.0;
                self.rm_dirty = true;
            }
            if need != Need::Memory && reserved > 0.0 {
                self.vms[vm].free_mb += reserved;
                self.jobs[j].groups[g].leases[i].reserved = 0.0;
                self.rm_dirty = true;
            }
            if need == Need::Nothing && uploads == 0 {
                self.release_holder(j, g, i);
            }
        }
    }

    // ---- transfers ----

    fn links_of(&self, first: [u32; 2], vm_side_first: bool) -> Vec<u32> {
        let mut l = first.to_vec();
        if let Some(a) = self.aggregate_link {
            if vm_side_first {
                l.push(a);
            } else {
                l.insert(0, a);
            }
        }
        l
    }

    /// The links of a transfer of `vm` through the object store (`Method::Remote`) or the
    /// memory tier (`Method::Memory`): an upload (`up`) leaves by the VM's egress, a download
    /// enters by its ingress.
    fn store_links(&self, method: Method, vm: usize, up: bool) -> Vec<u32> {
        let vm = 4 * vm as u32;
        match (method, up) {
            (Method::Memory, true) => [Some(vm), self.memory_link].into_iter().flatten().collect(),
            (Method::Memory, false) => [self.memory_link, Some(vm + 1)]
                .into_iter()
                .flatten()
                .collect(),
            (_, true) => self.links_of([vm, vm + 2], true),
            (_, false) => self.links_of([vm + 3, vm + 1], false),
        }
    }

    fn start_flow(&mut self, delay: f64, bytes: f64, links: Vec<u32>, tag: FlowTag) {
        if delay > 0.0 {
            let p = self.pending.len();
            self.pending.push(Some(PendingFlow { bytes, links, tag }));
            self.push(self.now + delay, EvKind::Activate(p));
        } else {
            self.net.start(bytes, &links, tag);
        }
    }

    /// Bytes the receiving slot `rj` of edge `e` reads from sending slot `si`.
    fn pair_bytes(&self, j: usize, e: usize, si: usize, rj: usize) -> f64 {
        let job = &self.jobs[j];
        let edge = job.pb.edges()[e];
        let (s, r) = (&job.stages[edge.from], &job.stages[edge.to]);
        let (ks, kr) = (
            f64::from(job.pb.stages()[edge.from].instances),
            f64::from(job.pb.stages()[edge.to].instances),
        );
        let a = (s.slots[si].first, s.slots[si].size);
        let b = (r.slots[rj].first, r.slots[rj].size);
        let t = edge.bytes;
        match edge.kind {
            EdgeKind::One => f64::from(overlap(a, b)) * t / ks,
            EdgeKind::Scatter => f64::from(b.1) * t / kr,
            EdgeKind::Broadcast => t,
            EdgeKind::Gather => f64::from(a.1) * t / ks,
            EdgeKind::Shuffle => f64::from(a.1) * f64::from(b.1) * t / (ks * kr),
        }
    }

    /// The model's flow of edge `e` with the placements that ran (requests and landed bytes).
    fn edge_flow(&self, j: usize, e: usize) -> sonic_core::model::Flow {
        let job = &self.jobs[j];
        let edge = job.pb.edges()[e];
        let (ps, pr) = (job.stages[edge.from].pl, job.stages[edge.to].pl);
        job.pb.flow(
            e,
            job.pb.per_vm(edge.from, ps.vms),
            pr.vms,
            job.pb.per_vm(edge.to, pr.vms),
        )
    }

    /// How long `requests` to the object store (`Method::Remote`) or the memory tier
    /// (`Method::Memory`) take before the bytes flow: one request's latency, plus the requests
    /// over the rate it serves.
    fn request_delay(&self, method: Method, requests: f64) -> f64 {
        let catalog = self.cluster.catalog();
        match (method, &catalog.memory_tier) {
            (Method::Memory, Some(m)) => m.request_latency_ms / 1e3 + requests / m.requests_per_s,
            // A memory edge without a tier never runs (`check_memory`).
            (Method::Memory, None) => 0.0,
            _ => {
                let st = &catalog.remote_storage;
                st.request_latency_ms / 1e3 + requests / st.requests_per_s
            }
        }
    }

    fn start_fetch(&mut self, j: usize, r: usize, rj: usize) {
        let incoming: Vec<usize> = self.jobs[j].pb.incoming(r).to_vec();
        let vm_r = self.jobs[j].stages[r].slots[rj].vm;
        let mut count = 0u32;
        for e in incoming {
            let method = self.jobs[j].edges[e].method.unwrap_or(Method::Direct);
            let from = self.jobs[j].pb.edges()[e].from;
            let mut n = 0u32;
            match method {
                Method::VmStorage => continue,
                Method::Direct => {
                    for si in 0..self.jobs[j].stages[from].slots.len() {
                        let bytes = self.pair_bytes(j, e, si, rj);
                        let vm_s = self.jobs[j].stages[from].slots[si].vm;
                        if bytes <= 0.0 || vm_s == vm_r {
                            continue; // nothing to move, or already on this VM's disk
                        }
                        let tag = FlowTag::Fetch {
                            job: j,
                            stage: r,
                            slot: rj,
                            edge: e,
                        };
                        let links = vec![4 * vm_s as u32, 4 * vm_r as u32 + 1];
                        self.start_flow(0.0, bytes, links, tag);
                        n += 1;
                    }
                }
                Method::Remote | Method::Memory => {
                    let bytes: f64 = (0..self.jobs[j].stages[from].slots.len())
                        .map(|si| self.pair_bytes(j, e, si, rj))
                        .sum();
                    // A broadcast file is read once per VM, not once per sender slot.
                    let bytes = if self.jobs[j].pb.edges()[e].kind == EdgeKind::Broadcast {
                        self.jobs[j].pb.edges()[e].bytes
                    } else {
                        bytes
                    };
                    let delay = self.request_delay(method, self.edge_flow(j, e).gets);
                    let links = self.store_links(method, vm_r, false);
                    let tag = FlowTag::Fetch {
                        job: j,
                        stage: r,
                        slot: rj,
                        edge: e,
                    };
                    self.start_flow(delay, bytes, links, tag);
                    n += 1;
                }
            }
            let er = &mut self.jobs[j].edges[e];
            er.fetch_flows_left += n;
            er.recv_slots_left = er.recv_slots_left.saturating_sub(1);
            count += n;
            self.check_fetched(j, e);
        }
        self.jobs[j].stages[r].slots[rj].fetch_left = count;
        if count == 0 {
            self.launch(j, r, rj);
        }
    }

    fn check_fetched(&mut self, j: usize, e: usize) {
        let er = &mut self.jobs[j].edges[e];
        if er.fetched.is_none() && er.recv_slots_left == 0 && er.fetch_flows_left == 0 {
            er.fetched = Some(self.now);
            let from = self.jobs[j].pb.edges()[e].from;
            let g = self.jobs[j].stages[from].group;
            self.refresh_group(j, g);
        }
    }

    fn flow_done(&mut self, tag: FlowTag) {
        match tag {
            FlowTag::Fetch {
                job,
                stage,
                slot,
                edge,
            } => {
                let granted = self.jobs[job].stages[stage].slots[slot].granted;
                let er = &mut self.jobs[job].edges[edge];
                er.fetch_flows_left -= 1;
                er.fetch_s = er.fetch_s.max(self.now - granted);
                self.check_fetched(job, edge);
                let s = &mut self.jobs[job].stages[stage].slots[slot];
                s.fetch_left -= 1;
                if s.fetch_left == 0 {
                    self.launch(job, stage, slot);
                }
            }
            FlowTag::Upload {
                job,
                stage,
                slot,
                edge,
            } => {
                let g = self.jobs[job].stages[stage].group;
                self.jobs[job].groups[g].leases[slot].uploads -= 1;
                let s = &mut self.jobs[job].stages[stage].slots[slot];
                s.uploads -= 1;
                let slot_ended = s.uploads == 0;
                // The upload is part of the sender's instance in the system.
                self.extend_span(job, g, slot);
                let done = self.jobs[job].stages[stage].state == State::Done;
                let er = &mut self.jobs[job].edges[edge];
                er.uploads_left -= 1;
                if er.uploads_left == 0 && done {
                    er.durable = self.now;
                    er.upload_s = self.now - er.sender_end;
                }
                self.refresh_group(job, g);
                if slot_ended {
                    self.slot_ended(job, stage, slot);
                }
            }
        }
    }

    // ---- lambdas ----

    /// Starts as many of the slot's instances as its concurrency allows.
    fn launch(&mut self, j: usize, r: usize, i: usize) {
        if !self.jobs[j].stages[r].slots[i].learned {
            self.fit_true_memory(j, r, i);
        }
        loop {
            let s = &self.jobs[j].stages[r].slots[i];
            if s.running >= s.conc || s.started >= s.size {
                break;
            }
            let vm = s.vm;
            let key = self.jobs[j].fn_keys[r];
            let owner = (!self.jobs[j].shares_warm).then_some(j);
            let now = self.now;
            let warm = &mut self.vms[vm].warm;
            warm.retain(|&(_, _, exp)| exp >= now);
            let hot = match warm.iter().position(|&(k, o, _)| k == key && o == owner) {
                Some(p) => {
                    warm.remove(p);
                    true
                }
                None => false,
            };
            let stage = &self.jobs[j].pb.stages()[r];
            // On the cores the plan gives each instance, as the executor does (right-sizing):
            // the lambda's time scaled, a cold start not.
            let g = stage.on_cores(self.jobs[j].pb.cores(self.jobs[j].assign.placements[r]));
            let mut work = if hot {
                stage.hot_s * g
            } else {
                stage.cold_on(g)
            };
            // Prewarmed: the container started when the job machine said (once the first
            // sender started); the start not yet over by now is all this cold run still pays
            // of it.
            let prewarmed = self.jobs[j].stages[r].prewarmed;
            if !hot && prewarmed.is_finite() {
                let start = stage.start_s.clamp(0.0, stage.cold_s);
                let left = (prewarmed + start - now).clamp(0.0, start);
                work = (stage.cold_s - start) * g + left;
            }
            let st = &mut self.jobs[j].stages[r];
            if hot {
                st.hot += 1;
            } else {
                st.cold += 1;
            }
            let s = &mut st.slots[i];
            s.running += 1;
            s.started += 1;
            self.vms[vm].running += 1;
            self.running_total += 1;
            self.peak_running = self.peak_running.max(self.running_total);
            self.tasks.push(Some(Task {
                remaining: work,
                vm,
                job: j,
                stage: r,
                slot: i,
                hot,
            }));
            self.active_tasks.push(self.tasks.len() - 1);
        }
    }

    /// A lambda's compute is over: it gives back its vCPU share, then pays its function's
    /// per-instance overhead (`Stage::overhead_s`: sending, registering outputs, the report) in
    /// wall time, holding its place in the slot's concurrency, as the model charges each batch
    /// once (`PlanProblem::overhead_s`); the instance ends after it.
    fn task_done(&mut self, t: Task) {
        self.vms[t.vm].running -= 1;
        self.running_total -= 1;
        // As the model charges batches: a hot run its stage's hot-batch overhead.
        let stage = &self.jobs[t.job].pb.stages()[t.stage];
        let overhead = if t.hot {
            stage.hot_overhead_s()
        } else {
            stage.overhead_s
        };
        if overhead > 0.0 {
            let at = self.now + overhead;
            self.push(at, EvKind::Overhead(t));
        } else {
            self.instance_done(t);
        }
    }

    /// An instance ended: its container stays warm, the slot runs its next instance or is done.
    fn instance_done(&mut self, t: Task) {
        let key = self.jobs[t.job].fn_keys[t.stage];
        let owner = (!self.jobs[t.job].shares_warm).then_some(t.job);
        self.vms[t.vm]
            .warm
            .push((key, owner, self.now + self.cfg.keep_alive_s));
        self.instances += 1;
        let s = &mut self.jobs[t.job].stages[t.stage].slots[t.slot];
        s.running -= 1;
        s.done += 1;
        if s.started < s.size {
            self.launch(t.job, t.stage, t.slot);
        } else if s.done == s.size {
            self.slot_done(t.job, t.stage, t.slot);
        }
    }

    /// The slot's lambdas need more memory than it was granted (memory under-predicted): its
    /// VM admits them by their true footprint, as its memory allows. The slot takes what the
    /// VM has free up to its planned concurrency at the true memory, and runs fewer lambdas at
    /// once if that is not enough (at least one: the VM is then overcommitted until the slot
    /// releases it). `batched` counts the lambdas that wait for a later batch because of it.
    fn fit_true_memory(&mut self, j: usize, r: usize, i: usize) {
        let true_mb = self.jobs[j].pb.stages()[r].memory_mb;
        let g = self.jobs[j].stages[r].group;
        let vm = self.jobs[j].stages[r].slots[i].vm;
        let old = self.jobs[j].groups[g].leases[i].reserved;
        let avail = old + self.vms[vm].free_mb.max(0.0);
        let planned = self.jobs[j].stages[r].slots[i].conc;
        let conc = (((avail + 1e-9) / true_mb).floor() as u32).clamp(1, planned);
        let new = old.max(f64::from(conc) * true_mb);
        self.vms[vm].free_mb -= new - old;
        self.jobs[j].groups[g].leases[i].reserved = new;
        self.set_weight(j, g, i, new);
        let st = &mut self.jobs[j].stages[r];
        st.batched += planned - conc;
        let s = &mut st.slots[i];
        s.learned = true;
        s.conc = conc;
        s.need = new;
    }

    fn slot_done(&mut self, j: usize, r: usize, i: usize) {
        self.jobs[j].stages[r].slots[i].finished = true;
        self.jobs[j].stages[r].slots_done += 1;
        let g = self.jobs[j].stages[r].group;
        self.extend_span(j, g, i);
        let vm = self.jobs[j].stages[r].slots[i].vm;
        let outgoing: Vec<usize> = self.jobs[j].pb.outgoing(r).to_vec();
        for e in outgoing {
            let Some(method) = self.jobs[j].edges[e].sender_method.filter(|&m| uploads(m)) else {
                continue;
            };
            let edge = self.jobs[j].pb.edges()[e];
            let s = &self.jobs[j].stages[r].slots[i];
            let ks = f64::from(self.jobs[j].pb.stages()[r].instances);
            let bytes = match edge.kind {
                EdgeKind::Scatter | EdgeKind::Broadcast => edge.bytes,
                EdgeKind::One | EdgeKind::Gather | EdgeKind::Shuffle => {
                    f64::from(s.size) * edge.bytes / ks
                }
            };
            // The receiver's placement is not known yet; the PUTs do not depend on it.
            let puts = match edge.kind {
                EdgeKind::One | EdgeKind::Gather => ks,
                EdgeKind::Broadcast => 1.0,
                EdgeKind::Scatter => f64::from(self.jobs[j].pb.stages()[edge.to].instances),
                EdgeKind::Shuffle => ks * f64::from(self.jobs[j].pb.stages()[edge.to].instances),
            };
            let delay = self.request_delay(method, puts);
            let links = self.store_links(method, vm, true);
            self.jobs[j].edges[e].uploads_left += 1;
            self.jobs[j].groups[g].leases[i].uploads += 1;
            self.jobs[j].stages[r].slots[i].uploads += 1;
            let tag = FlowTag::Upload {
                job: j,
                stage: r,
                slot: i,
                edge: e,
            };
            self.start_flow(delay, bytes, links, tag);
        }
        if self.jobs[j].stages[r].slots_done == self.jobs[j].stages[r].slots.len() {
            self.stage_done(j, r);
        } else {
            self.refresh_group(j, g);
        }
        if self.jobs[j].stages[r].slots[i].uploads == 0 {
            self.slot_ended(j, r, i);
        }
    }

    fn stage_done(&mut self, j: usize, r: usize) {
        let now = self.now;
        let job = &mut self.jobs[j];
        let g = job.stages[r].group;
        job.stages[r].state = State::Done;
        job.stages[r].end = now;
        job.stages_done += 1;
        job.groups[g].running = None;
        // Its lambdas are done: the vCPU slots are free (a vm-storage receiver on these VMs
        // asks for its own).
        for i in 0..job.groups[g].leases.len() {
            let lease = &mut job.groups[g].leases[i];
            if lease.cpus > 0.0 {
                self.vms[lease.vm].free_cpus += lease.cpus;
                lease.cpus = 0.0;
                self.rm_dirty = true;
            }
        }
        self.unbook(j, r);
        let job = &mut self.jobs[j];
        for &e in job.pb.outgoing(r) {
            let er = &mut job.edges[e];
            er.sender_end = now;
            if !er.sender_method.is_some_and(uploads) || er.uploads_left == 0 {
                er.durable = now;
            }
        }
        let incoming: Vec<usize> = job.pb.incoming(r).to_vec();
        for e in incoming {
            self.account_storage(j, e);
        }
        for s in 0..self.jobs[j].stages.len() {
            self.try_ready(j, s);
        }
        self.refresh_group(j, g);
        if self.jobs[j].stages_done == self.jobs[j].stages.len() {
            self.jobs[j].finish = Some(now);
            self.unfinished -= 1;
            self.record_cold_sample(j);
        }
    }

    /// Adds job `j`'s cold times to its DAG's models, as the control plane does when a job
    /// ends (one sample per function).
    fn record_cold_sample(&mut self, j: usize) {
        let job = &self.jobs[j];
        let Some(m) = self.models.as_mut().and_then(|m| m.get_mut(&job.app)) else {
            return;
        };
        let (x, sample) = &job.cold_sample;
        if let Err(e) = m.add_sample(*x, sample, &[]) {
            self.model_error
                .get_or_insert_with(|| job_err(&job.name, format!("cold-time sample: {e}")));
        }
    }

    /// Storage and requests of edge `e`, charged when its receiver ends (docs/model.md, Cost).
    fn account_storage(&mut self, j: usize, e: usize) {
        let flow = self.edge_flow(j, e);
        let (lp, rp, mp) = (self.local_price, self.remote_price, self.memory_price);
        let store = &self.cluster.catalog().remote_storage;
        let (put, get) = (store.put_usd_per_1k / 1e3, store.get_usd_per_1k / 1e3);
        let job = &mut self.jobs[j];
        let edge = job.pb.edges()[e];
        let r = &job.stages[edge.to];
        let er = &job.edges[e];
        let bytes = edge.bytes;
        let fetched = er.fetched.unwrap_or(r.end);
        let c = &mut job.cost;
        match er.method.unwrap_or(Method::Direct) {
            Method::VmStorage => c.local_storage_usd += bytes * (r.end - er.sender_end) * lp,
            Method::Direct => {
                c.local_storage_usd +=
                    bytes * (fetched - er.sender_end) * lp + flow.fetched * (r.end - r.ready) * lp;
            }
            Method::Remote => {
                c.local_storage_usd += bytes * (er.durable - er.sender_end) * lp
                    + flow.fetched * (r.end - r.ready) * lp;
                c.remote_storage_usd += bytes * (fetched - er.durable) * rp;
                c.requests_usd += flow.puts * put + flow.gets * get;
            }
            // As remote, the tier holding the bytes from durable to fetched; no requests.
            Method::Memory => {
                c.local_storage_usd += bytes * (er.durable - er.sender_end) * lp
                    + flow.fetched * (r.end - r.ready) * lp;
                c.memory_tier_usd += bytes * (fetched - er.durable) * mp;
            }
        }
    }

    // ---- the report ----

    fn report(mut self) -> SimReport {
        for v in 0..self.vms.len() {
            self.settle(v);
        }
        let catalog = self.cluster.catalog();
        let jobs: Vec<JobReport> = self
            .jobs
            .iter()
            .map(|job| {
                let finish = job.finish.unwrap_or(self.now);
                let latency = finish - job.arrival;
                let cost = job.cost.total();
                let mut job_cost = job.cost;
                job_cost.summary_usd = job
                    .groups
                    .iter()
                    .flat_map(|g| {
                        let usd_per_s = catalog.vm_types[g.vm_type].usd_per_second();
                        g.leases
                            .iter()
                            .filter_map(move |l| l.span.map(|(a, b)| usd_per_s * (b - a)))
                    })
                    .sum::<f64>()
                    + job.cost.local_storage_usd
                    + job.cost.remote_storage_usd
                    + job.cost.requests_usd
                    + job.cost.memory_tier_usd;
                let stages = job
                    .pb
                    .stages()
                    .iter()
                    .zip(&job.stages)
                    .map(|(s, st)| StageReport {
                        function: s.name.clone(),
                        vm_type: catalog.vm_types[st.pl.vm].name.clone(),
                        vms: st.pl.vms,
                        concurrent: st.pl.concurrent,
                        ready_s: st.ready - job.arrival,
                        start_s: st.first_grant - job.arrival,
                        end_s: st.end - job.arrival,
                        instances_run: st.cold + st.hot,
                        cold: st.cold,
                        hot: st.hot,
                        batched: st.batched,
                        on_vms: st.slots.iter().map(|s| s.vm).collect(),
                        instance_vms: st.placed.clone(),
                    })
                    .collect();
                let edges = job
                    .pb
                    .edges()
                    .iter()
                    .zip(&job.edges)
                    .enumerate()
                    .map(|(i, (e, er))| EdgeReport {
                        from: job.pb.stages()[e.from].name.clone(),
                        to: job.pb.stages()[e.to].name.clone(),
                        kind: e.kind,
                        bytes: e.bytes,
                        planned: job.first.methods[i],
                        method: er.method.unwrap_or(job.first.methods[i]),
                        upload_s: er.upload_s,
                        fetch_s: er.fetch_s,
                        seconds: er.upload_s + er.fetch_s,
                    })
                    .collect();
                JobReport {
                    name: job.name.clone(),
                    app: job.app.clone(),
                    policy: job.policy,
                    arrival_s: job.arrival,
                    finish_s: finish,
                    latency_s: latency,
                    cost_usd: cost,
                    cost: job_cost,
                    perf_per_dollar: perf_per_dollar(latency, cost),
                    planned: job.planned,
                    model_latency_s: job.model_latency,
                    model_cost_usd: job.model_cost,
                    fell_back: job.fell_back,
                    queued_s: job
                        .stages
                        .iter()
                        .map(|s| (s.first_grant - s.ready).max(0.0))
                        .sum(),
                    stages,
                    edges,
                }
            })
            .collect();
        SimReport {
            config: self.cfg,
            cluster: ClusterStats {
                vms: self.vms.len(),
                spec: self.cluster.spec(),
                events: self.handled,
                flows: self.net.started() as u64,
                instances: self.instances,
                end_s: self.now,
                busy_vm_s: self.vms.iter().map(|v| v.busy_s).sum(),
                busy_usd: self.vms.iter().map(|v| v.busy_s * v.usd_per_s).sum(),
                peak_running: self.peak_running,
            },
            summary: summarize(&jobs),
            jobs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_instance_once() {
        for k in 1..40u32 {
            for n in 1..=k {
                let mut next = 0;
                for j in 0..n {
                    let (first, size) = machine::block(j, k, n);
                    assert_eq!(first, next);
                    assert!(size >= 1 && size <= k.div_ceil(n));
                    next += size;
                }
                assert_eq!(next, k);
            }
        }
        assert_eq!(overlap((0, 3), (2, 3)), 1);
        assert_eq!(overlap((0, 2), (2, 3)), 0);
    }
}
