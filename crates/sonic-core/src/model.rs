//! The latency and cost model of one job (docs/model.md): a [`PlanProblem`] (stages, edges, the
//! VM catalog, the user's bounds) and [`PlanProblem::evaluate`], which predicts the latency and
//! the cost of one [`Assignment`] (a placement per stage and a data-passing method per edge).
//!
//! Everything that predicts — the planner, the brute force of the property tests, the baseline
//! policies, the simulator — goes through [`PlanProblem::step`], the one place where a stage's
//! timing and the costs it adds are computed, so they cannot disagree.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::catalog::{Catalog, CatalogError, SECONDS_PER_MONTH, VmType, mbps_to_bytes_per_s};
use crate::dag::{Bounds, Dag, EdgeKind};
use crate::held::{self, Heaviest, Reach};
use crate::params::Params;

/// How an edge's data moves from the sending stage to the receiving stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The receiver runs on the VMs that hold the file: no copy.
    VmStorage,
    /// The receiver's VM fetches the file from the sender's VM: one network copy.
    Direct,
    /// Through the object store: upload, then download.
    Remote,
    /// Through the in-memory tier (the catalog's `memory_tier`, Redis): upload, then download,
    /// as `remote`, faster and priced by the bytes held per second instead of per request.
    Memory,
}

impl Method {
    pub const ALL: [Method; 4] = [
        Method::VmStorage,
        Method::Direct,
        Method::Remote,
        Method::Memory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Method::VmStorage => "vm-storage",
            Method::Direct => "direct",
            Method::Remote => "remote",
            Method::Memory => "memory",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!("{s:?} is not a data-passing method (vm-storage, direct, remote, memory)")
            })
    }
}

/// One stage: a function and its parallel instances, with the DAG parameters at the job's input
/// size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    /// Peak memory of one instance.
    pub memory_mb: f64,
    pub cold_s: f64,
    pub hot_s: f64,
    /// The fanout K.
    pub instances: u32,
    /// What each batch of its instances takes beyond compute and the modeled data passing
    /// (sending, the job's input, registering outputs, results, the report; learned per
    /// function like the times): a VM's batches take `B * overhead_s` more.
    #[serde(default)]
    pub overhead_s: f64,
    /// The per-batch overhead of a batch that runs hot, where it differs from `overhead_s`
    /// (then the cold first batch's): see [`PlanProblem::overhead_s`]. `None`: `overhead_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_hot_s: Option<f64>,
    /// Of `cold_s`, the cold start (creating the container); what prewarming takes off a
    /// stage's first batch ([`PlanProblem::with_prewarm`]).
    #[serde(default)]
    pub start_s: f64,
    /// The share of its compute that spreads over an instance's cores (Amdahl's law;
    /// `FunctionParams::parallel`): `cold_s` (less `start_s`) and `hot_s` are times on one
    /// core, and on `k` cores take [`Stage::on_cores`] of them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parallel: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Stage {
    /// What a batch that runs hot pays beyond its compute: `overhead_hot_s`, else `overhead_s`.
    pub fn hot_overhead_s(&self) -> f64 {
        self.overhead_hot_s.unwrap_or(self.overhead_s)
    }

    /// The factor its compute takes on `cores` cores against one (Amdahl's law):
    /// `1 - parallel + parallel / cores`; 1 for a single-threaded function, `1 / cores` for a
    /// perfectly parallel one. `cores` below 1 count as 1 (an instance has at least a core).
    pub fn on_cores(&self, cores: f64) -> f64 {
        let k = if cores.is_finite() {
            cores.max(1.0)
        } else {
            1.0
        };
        1.0 - self.parallel + self.parallel / k
    }

    /// A cold run's time where its lambda takes `g` of its one-core time
    /// ([`Stage::on_cores`]): the cold start as it is, the rest scaled (`cold_s` itself at 1).
    pub fn cold_on(&self, g: f64) -> f64 {
        if g == 1.0 {
            self.cold_s
        } else {
            self.start_s + (self.cold_s - self.start_s) * g
        }
    }
}

/// An edge as given to [`PlanProblem::new`], by function name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeSpec {
    pub from: String,
    pub to: String,
    pub kind: EdgeKind,
    /// Total bytes the sending stage writes on this edge (all its instances together).
    pub bytes: f64,
}

/// A checked edge, by stage index.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub kind: EdgeKind,
    pub bytes: f64,
}

/// Where one stage runs. Lambdas are spread evenly over the `vms` VMs, so the fullest VM holds
/// `per_vm = ceil(K / vms)`; a user's "p lambdas per VM" is the placement with
/// `vms = ceil(K / p)` (several `p` give the same VM count and hence the same placement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// Index into the catalog's `vm_types`.
    pub vm: usize,
    pub vms: u32,
    /// Lambdas that run at once on one VM; the rest wait in serial batches.
    pub concurrent: u32,
}

/// A whole plan in index form: one placement per stage, one method per edge (same order as the
/// problem's stages and edges).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assignment {
    pub placements: Vec<Placement>,
    pub methods: Vec<Method>,
}

/// A refused problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProblemError {
    #[error("a plan needs at least one function")]
    Empty,
    #[error("duplicate function {0:?}")]
    DuplicateStage(String),
    #[error("function {function:?}: {message}")]
    BadStage { function: String, message: String },
    #[error("edge {from} -> {to}: {message}")]
    BadEdge {
        from: String,
        to: String,
        message: String,
    },
    #[error("the edges form a cycle through {0}")]
    Cycle(String),
    #[error(
        "function {function:?} needs {memory_mb} MB per instance, more than any VM type offers (at most {usable_mb} MB on {vm_type}, after the {reserve_mb} MB reserve)"
    )]
    DoesNotFit {
        function: String,
        memory_mb: f64,
        vm_type: String,
        usable_mb: f64,
        reserve_mb: u64,
    },
    #[error("function {function:?} fits no VM type within the limits ({limits})")]
    NoVmWithinLimits { function: String, limits: String },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("parameters: {0}")]
    Params(String),
}

/// Why an assignment cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Infeasible {
    #[error("the plan has {got} {what}, the problem {want}")]
    Shape {
        what: &'static str,
        got: usize,
        want: usize,
    },
    #[error("stage {stage:?}: {message}")]
    Placement { stage: String, message: String },
    #[error("edge {from} -> {to}: {message}")]
    Edge {
        from: String,
        to: String,
        message: String,
    },
    /// Under a pool's VM limits, VM groups held at the same time need more VMs of a type than
    /// the pool has ([`crate::held`]).
    #[error(
        "{stages} hold {need} {vm_type} VMs at the same time (branches that run at once, or direct senders until their receivers fetch), the pool has {limit}"
    )]
    Pool {
        /// The stages of the groups held at once, named.
        stages: String,
        vm_type: String,
        need: u32,
        limit: u32,
    },
}

/// The user's optional bounds on one job, checked.
fn check_bounds(b: &Bounds) -> Result<(), ProblemError> {
    for (name, v) in [
        ("max latency", b.max_latency_s),
        ("max cost", b.max_cost_usd),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            return Err(ProblemError::Params(format!(
                "{name} bound {v} is not a positive number"
            )));
        }
    }
    Ok(())
}

/// Everything the model needs about one job: checked, in topological order.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanProblem {
    stages: Vec<Stage>,
    edges: Vec<Edge>,
    catalog: Catalog,
    bounds: Bounds,
    incoming: Vec<Vec<usize>>,
    outgoing: Vec<Vec<usize>>,
    /// Which stages come before which (the VM groups a plan holds at once, [`crate::held`]).
    reach: Reach,
    /// `[stage][vm]`: most lambdas of the stage that run at once on one VM of that type (memory
    /// and vCPUs); 0 when one does not fit.
    cmax: Vec<Vec<u32>>,
    /// Per VM type: the most VMs of that type one stage may use (the pool a resource manager
    /// can give), `None`: no limit. See [`PlanProblem::with_vm_limits`].
    vm_limits: Vec<Option<u32>>,
    /// `[stage][vm]`: the idle warm environments (containers, process environments) of the
    /// stage's function that the pool's VMs of that type hold, one count per VM, largest first;
    /// empty when none is known. See [`PlanProblem::with_warm`].
    warm: Vec<Vec<Vec<u32>>>,
    /// Whether a stage's containers are started while its senders run (prewarming). See
    /// [`PlanProblem::with_prewarm`].
    prewarm: bool,
    /// Local storage price per byte-second.
    local_price: f64,
    /// Remote storage price per byte-second.
    remote_price: f64,
    /// The memory tier's price per byte-second (0 without one: no edge may use it).
    memory_price: f64,
}

/// What one edge moves, per VM and in total, once both placements are known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flow {
    /// Bytes the busiest sending VM sends under `direct` (one copy per receiving VM for a
    /// broadcast).
    pub sent_per_vm: f64,
    /// Bytes the busiest sending VM uploads under `remote` (a broadcast file is uploaded once).
    pub upload_per_vm: f64,
    /// Bytes the busiest receiving VM receives (a broadcast file once per VM: its lambdas share it).
    pub recv_per_vm: f64,
    /// Bytes that land on receiving VMs' disks, all VMs together.
    pub fetched: f64,
    /// Objects written to the store under `remote` (one per file).
    pub puts: f64,
    /// Objects read from the store under `remote`.
    pub gets: f64,
}

/// The timing of one edge.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct EdgeTimes {
    /// Upload to the store (remote only): the sender's output is durable this long after the
    /// sending stage ends.
    pub upload_s: f64,
    /// Transfer into the receiving VMs once the receiving stage starts (direct copy or download).
    pub fetch_s: f64,
}

/// The VMs of one type a receiving stage holds at once with the senders it fetches from over
/// `direct` edges: its own `vms` and each direct sender's VM group once (`senders`: group and
/// its VM count, only the direct senders of the receiver's type), not counting the receiver's
/// own group. The one rule of how `direct` holds VMs, shared by the planner
/// ([`PlanProblem::evaluate`] under VM limits) and the resource manager that grants its plans:
/// a sender's VMs are held until the receiver has fetched, so the two never share a VM.
pub fn held_with_direct_senders<G: PartialEq + Copy>(
    vms: u32,
    own_group: G,
    senders: impl IntoIterator<Item = (G, u32)>,
) -> u32 {
    let mut seen: Vec<G> = Vec::new();
    let mut need = vms;
    for (g, n) in senders {
        if g == own_group || seen.contains(&g) {
            continue;
        }
        seen.push(g);
        need = need.saturating_add(n);
    }
    need
}

/// One stage's sender, as [`PlanProblem::step`] sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sender {
    pub edge: usize,
    pub method: Method,
    /// When the sending stage's last lambda ended.
    pub end: f64,
    pub vm: usize,
    pub vms: u32,
    pub per_vm: u32,
    /// The sender's VM group, as a handle into [`Groups`].
    pub group: usize,
}

/// Where a stage runs: on new VMs, or on the VMs of an existing group (vm-storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    New,
    Continue(usize),
}

/// The VM groups a step may touch, by handle.
pub(crate) struct Groups<'a> {
    /// Until when the group's VMs are held so far.
    pub hold: &'a mut [f64],
    /// When the group's latest stage ended (a VM runs one stage at a time).
    pub busy: &'a mut [f64],
    /// Dollars per second for all the group's VMs.
    pub rate: &'a [f64],
}

/// What one stage's step computed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct StepOut {
    pub start: f64,
    pub fetch: f64,
    pub compute: f64,
    /// The per-instance overhead of its batches (after the compute).
    pub overhead: f64,
    pub end: f64,
    /// Cost added by this step, all parts (the sum of the five below, in a fixed order).
    pub cost: f64,
    pub vm_usd: f64,
    pub local_usd: f64,
    pub remote_usd: f64,
    pub request_usd: f64,
    pub memory_usd: f64,
}

/// The predicted timing of one stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StagePrediction {
    /// When every input was durable (and new VMs were taken).
    pub start_s: f64,
    /// Time spent fetching inputs onto the stage's VMs.
    pub fetch_s: f64,
    /// Compute time of the fullest VM: `cold + (batches - 1) * hot`.
    pub compute_s: f64,
    /// Per-instance overhead of the fullest VM: `batches * overhead_s`; `end_s` is
    /// `start_s + fetch_s + compute_s + overhead_s`.
    pub overhead_s: f64,
    pub end_s: f64,
    pub batches: u32,
    /// Cost of this stage and every stage before it in topological order.
    pub cost_so_far_usd: f64,
}

/// The predicted timing of one edge.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EdgePrediction {
    pub method: Method,
    /// Data-passing time: upload + fetch (0 for vm-storage).
    pub seconds: f64,
    pub upload_s: f64,
    pub fetch_s: f64,
}

/// Where the money goes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct CostBreakdown {
    pub vm_usd: f64,
    pub local_storage_usd: f64,
    pub remote_storage_usd: f64,
    pub requests_usd: f64,
    /// The memory tier's share: bytes held over its capacity, times its price, per second.
    pub memory_tier_usd: f64,
}

/// What the model predicts for one assignment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub latency_s: f64,
    pub cost_usd: f64,
    /// `1 / (latency * cost)`.
    pub perf_per_dollar: f64,
    pub stages: Vec<StagePrediction>,
    pub edges: Vec<EdgePrediction>,
    pub cost: CostBreakdown,
}

/// `1 / (latency * cost)`, the objective; infinite for a free, instant job.
pub fn perf_per_dollar(latency_s: f64, cost_usd: f64) -> f64 {
    let p = latency_s * cost_usd;
    if p > 0.0 { 1.0 / p } else { f64::INFINITY }
}

pub(crate) fn ceil_div(a: u32, b: u32) -> u32 {
    a.div_ceil(b.max(1))
}

impl PlanProblem {
    /// Checks a problem: unique stage names, sane numbers, edges between known stages and
    /// consistent with the fanouts, no cycle, every stage fits some VM type. Stages are put in
    /// a topological order (stable: the given order where the edges allow it).
    pub fn new(
        stages: Vec<Stage>,
        edges: Vec<EdgeSpec>,
        catalog: Catalog,
        bounds: Bounds,
    ) -> Result<PlanProblem, ProblemError> {
        catalog.check()?;
        check_bounds(&bounds)?;
        if stages.is_empty() {
            return Err(ProblemError::Empty);
        }
        for (i, s) in stages.iter().enumerate() {
            if s.name.is_empty() {
                return Err(ProblemError::BadStage {
                    function: s.name.clone(),
                    message: "empty name".into(),
                });
            }
            if stages[..i].iter().any(|o| o.name == s.name) {
                return Err(ProblemError::DuplicateStage(s.name.clone()));
            }
            let bad = |message: String| ProblemError::BadStage {
                function: s.name.clone(),
                message,
            };
            if !(s.memory_mb.is_finite() && s.memory_mb > 0.0) {
                return Err(bad(format!(
                    "memory {} MB is not a positive number",
                    s.memory_mb
                )));
            }
            if !(s.cold_s.is_finite() && s.cold_s >= 0.0 && s.hot_s.is_finite() && s.hot_s >= 0.0) {
                return Err(bad(format!(
                    "times cold {} s, hot {} s must be numbers >= 0",
                    s.cold_s, s.hot_s
                )));
            }
            if let Some(h) = s.overhead_hot_s
                && !(h.is_finite() && h >= 0.0)
            {
                return Err(bad(format!("hot overhead {h} s must be a number >= 0")));
            }
            if !(s.overhead_s.is_finite() && s.overhead_s >= 0.0) {
                return Err(bad(format!(
                    "overhead {} s must be a number >= 0",
                    s.overhead_s
                )));
            }
            if !(s.start_s.is_finite() && s.start_s >= 0.0 && s.start_s <= s.cold_s) {
                return Err(bad(format!(
                    "cold start {} s must be a number from 0 to the cold time {} s",
                    s.start_s, s.cold_s
                )));
            }
            if s.instances == 0 {
                return Err(bad("needs at least one instance".into()));
            }
            if !(s.parallel.is_finite() && (0.0..=1.0).contains(&s.parallel)) {
                return Err(bad(format!(
                    "parallel share {} must be from 0 to 1",
                    s.parallel
                )));
            }
        }
        let index = |name: &str| stages.iter().position(|s| s.name == name);
        let mut raw = Vec::with_capacity(edges.len());
        for e in &edges {
            let bad = |message: String| ProblemError::BadEdge {
                from: e.from.clone(),
                to: e.to.clone(),
                message,
            };
            let from =
                index(&e.from).ok_or_else(|| bad(format!("unknown function {:?}", e.from)))?;
            let to = index(&e.to).ok_or_else(|| bad(format!("unknown function {:?}", e.to)))?;
            if from == to {
                return Err(bad("a function cannot send to itself".into()));
            }
            if raw.iter().any(|r: &Edge| r.from == from && r.to == to) {
                return Err(bad("duplicate edge".into()));
            }
            if !(e.bytes.is_finite() && e.bytes >= 0.0) {
                return Err(bad(format!("{} bytes is not a number >= 0", e.bytes)));
            }
            let (ks, kr) = (stages[from].instances, stages[to].instances);
            let why = match e.kind {
                EdgeKind::One if ks != kr => {
                    Some(format!("a one edge needs equal fanouts, not {ks} and {kr}"))
                }
                EdgeKind::Scatter | EdgeKind::Broadcast if ks != 1 => Some(format!(
                    "a {} sender must have one instance, not {ks}",
                    e.kind
                )),
                EdgeKind::Gather if kr != 1 => Some(format!(
                    "a gather receiver must have one instance, not {kr}"
                )),
                _ => None,
            };
            if let Some(why) = why {
                return Err(bad(why));
            }
            raw.push(Edge {
                from,
                to,
                kind: e.kind,
                bytes: e.bytes,
            });
        }

        // Stable topological order (Kahn, lowest index first).
        let n = stages.len();
        let mut indegree = vec![0usize; n];
        for e in &raw {
            indegree[e.to] += 1;
        }
        let mut order = Vec::with_capacity(n);
        let mut ready: std::collections::BTreeSet<usize> =
            (0..n).filter(|&i| indegree[i] == 0).collect();
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for e in raw.iter().filter(|e| e.from == i) {
                indegree[e.to] -= 1;
                if indegree[e.to] == 0 {
                    ready.insert(e.to);
                }
            }
        }
        if order.len() < n {
            let names: Vec<&str> = (0..n)
                .filter(|&i| indegree[i] > 0)
                .map(|i| stages[i].name.as_str())
                .collect();
            return Err(ProblemError::Cycle(names.join(", ")));
        }
        let mut position = vec![0usize; n];
        for (pos, &i) in order.iter().enumerate() {
            position[i] = pos;
        }
        let stages: Vec<Stage> = order.iter().map(|&i| stages[i].clone()).collect();
        let edges: Vec<Edge> = raw
            .into_iter()
            .map(|e| Edge {
                from: position[e.from],
                to: position[e.to],
                ..e
            })
            .collect();

        let usable: Vec<f64> = catalog
            .vm_types
            .iter()
            .map(|v| catalog.usable_mb(v))
            .collect();
        let mut cmax = Vec::with_capacity(n);
        for s in &stages {
            let row: Vec<u32> = catalog
                .vm_types
                .iter()
                .zip(&usable)
                .map(|(v, &u)| {
                    let by_memory = (u / s.memory_mb).floor();
                    if by_memory < 1.0 {
                        0
                    } else {
                        v.vcpus.min(by_memory.min(u32::MAX as f64) as u32)
                    }
                })
                .collect();
            if row.iter().all(|&c| c == 0) {
                let (best, &usable_mb) = usable
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .unwrap_or((0, &0.0));
                return Err(ProblemError::DoesNotFit {
                    function: s.name.clone(),
                    memory_mb: s.memory_mb,
                    vm_type: catalog
                        .vm_types
                        .get(best)
                        .map(|v| v.name.clone())
                        .unwrap_or_default(),
                    usable_mb,
                    reserve_mb: catalog.reserve_mb,
                });
            }
            cmax.push(row);
        }
        let mut incoming = vec![Vec::new(); n];
        let mut outgoing = vec![Vec::new(); n];
        for (i, e) in edges.iter().enumerate() {
            incoming[e.to].push(i);
            outgoing[e.from].push(i);
        }
        let local_price = catalog.local_storage.usd_per_gb_month / SECONDS_PER_MONTH / 1e9;
        let remote_price = catalog.remote_storage.usd_per_gb_month / SECONDS_PER_MONTH / 1e9;
        let memory_price = catalog
            .memory_tier
            .as_ref()
            .map_or(0.0, |m| m.usd_per_byte_second());
        let vm_limits = vec![None; catalog.vm_types.len()];
        let warm = vec![vec![Vec::new(); catalog.vm_types.len()]; n];
        let reach = Reach::new(n, edges.iter().map(|e| (e.from, e.to)));
        Ok(PlanProblem {
            stages,
            edges,
            catalog,
            bounds,
            incoming,
            outgoing,
            reach,
            cmax,
            vm_limits,
            warm,
            prewarm: false,
            local_price,
            remote_price,
            memory_price,
        })
    }

    /// A problem from a checked DAG and a parameters file: every function of the DAG needs its
    /// parameters, every edge its bytes, and the parameters may name nothing else.
    pub fn from_dag(
        dag: &Dag,
        params: &Params,
        catalog: Catalog,
        bounds: Bounds,
    ) -> Result<PlanProblem, ProblemError> {
        params
            .check()
            .map_err(|e| ProblemError::Params(e.to_string()))?;
        let mut stages = Vec::with_capacity(dag.functions.len());
        for f in &dag.functions {
            let p = params.functions.get(&f.name).ok_or_else(|| {
                ProblemError::Params(format!("no parameters for function {:?}", f.name))
            })?;
            stages.push(Stage {
                name: f.name.clone(),
                memory_mb: p.memory_mb,
                cold_s: p.cold_s,
                hot_s: p.hot_s,
                instances: p.instances,
                overhead_s: p.overhead_s,
                overhead_hot_s: p.overhead_hot_s,
                start_s: p.start_s,
                parallel: p.parallel,
            });
        }
        if let Some(extra) = params
            .functions
            .keys()
            .find(|k| dag.function_index(k).is_none())
        {
            return Err(ProblemError::Params(format!(
                "function {extra:?} is not in DAG {:?}",
                dag.name
            )));
        }
        let mut edges = Vec::with_capacity(dag.edges.len());
        for e in &dag.edges {
            let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
            let bytes = params
                .edge_bytes(from, to)
                .ok_or_else(|| ProblemError::Params(format!("no bytes for edge {from} -> {to}")))?;
            edges.push(EdgeSpec {
                from: from.clone(),
                to: to.clone(),
                kind: e.kind,
                bytes: bytes.0 as f64,
            });
        }
        if let Some(extra) = params.edges.iter().find(|pe| {
            !dag.edges
                .iter()
                .any(|e| dag.functions[e.from].name == pe.from && dag.functions[e.to].name == pe.to)
        }) {
            return Err(ProblemError::Params(format!(
                "edge {} -> {} is not in DAG {:?}",
                extra.from, extra.to, dag.name
            )));
        }
        PlanProblem::new(stages, edges, catalog, bounds)
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The same problem under other bounds.
    pub fn with_bounds(&self, bounds: Bounds) -> Result<PlanProblem, ProblemError> {
        check_bounds(&bounds)?;
        Ok(PlanProblem {
            bounds,
            ..self.clone()
        })
    }

    /// The same problem where a stage uses at most `limits[name]` VMs of the VM type `name`
    /// (e.g. the agents of that type a resource manager has); a limit of 0 removes the type.
    /// Types not named keep no limit; names the catalog does not know are ignored. Every
    /// search and [`PlanProblem::check_placement`] respect the limits. Fails when a stage
    /// then fits no VM type.
    pub fn with_vm_limits(
        &self,
        limits: &BTreeMap<String, u32>,
    ) -> Result<PlanProblem, ProblemError> {
        let mut pb = self.clone();
        for (vm, t) in pb.catalog.vm_types.iter().enumerate() {
            pb.vm_limits[vm] = limits.get(&t.name).copied();
        }
        for (s, row) in pb.cmax.iter_mut().enumerate() {
            for (vm, c) in row.iter_mut().enumerate() {
                if pb.vm_limits[vm] == Some(0) {
                    *c = 0;
                }
            }
            if row.iter().all(|&c| c == 0) {
                return Err(ProblemError::NoVmWithinLimits {
                    function: pb.stages[s].name.clone(),
                    limits: limits
                        .iter()
                        .map(|(t, n)| format!("{n} {t}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(pb)
    }

    /// The same problem knowing the warm environments the pool holds: `warm[function][vm_type]`
    /// lists, per VM of that type, how many idle warm environments of the function it holds
    /// (agents keep a function's containers warm across its jobs for a keep-alive). A stage
    /// whose VMs can all be VMs holding at least its first batch ([`PlanProblem::warm_start`])
    /// starts hot. Names the problem does not know are ignored.
    pub fn with_warm(mut self, warm: &BTreeMap<String, BTreeMap<String, Vec<u32>>>) -> PlanProblem {
        for (s, st) in self.stages.iter().enumerate() {
            let Some(by_type) = warm.get(&st.name) else {
                continue;
            };
            for (vm, t) in self.catalog.vm_types.iter().enumerate() {
                let mut counts: Vec<u32> = by_type
                    .get(&t.name)
                    .map(|c| c.iter().copied().filter(|&n| n > 0).collect())
                    .unwrap_or_default();
                counts.sort_unstable_by(|a, b| b.cmp(a));
                self.warm[s][vm] = counts;
            }
        }
        self
    }

    /// The same problem where the executor starts each stage's containers while the stages it
    /// reads from run (prewarming: the control plane's `JobsConfig::prewarm`): a stage with
    /// senders that does not start warm pays its cold start (`start_s`) off its first batch,
    /// assuming its senders run at least that long.
    pub fn with_prewarm(mut self, prewarm: bool) -> PlanProblem {
        self.prewarm = prewarm;
        self
    }

    /// Whether stage `s` under `pl` starts in prewarmed containers: prewarming is on, the stage
    /// reads from other stages, and it does not start warm ([`PlanProblem::warm_start`]).
    pub fn prewarmed(&self, s: usize, pl: Placement) -> bool {
        self.prewarm && !self.incoming[s].is_empty() && !self.warm_start(s, pl)
    }

    /// Whether stage `s` under `pl` starts hot: `pl.vms` VMs of its type each hold at least the
    /// first batch's lambdas (`min(per_vm, concurrent)`) in idle warm environments of its
    /// function.
    pub fn warm_start(&self, s: usize, pl: Placement) -> bool {
        let first = self.per_vm(s, pl.vms).min(pl.concurrent).max(1);
        // Largest first: the `vms`-th largest count covers the first batch, or fewer VMs do.
        let nth = (pl.vms as usize).checked_sub(1);
        nth.and_then(|k| self.warm[s][pl.vm].get(k))
            .is_some_and(|&n| n >= first)
    }

    /// Whether some VM type has a limit ([`PlanProblem::with_vm_limits`]).
    pub fn has_vm_limits(&self) -> bool {
        self.vm_limits.iter().any(Option::is_some)
    }

    /// The most VMs of type `vm` one stage may use (`None`: no limit).
    pub fn vm_limit(&self, vm: usize) -> Option<u32> {
        self.vm_limits.get(vm).copied().flatten()
    }

    /// The largest VM count of stage `s` (one of [`PlanProblem::vm_counts`]) that is at most
    /// `want` and within the limit of type `vm`.
    pub fn fit_vms(&self, s: usize, vm: usize, want: u32) -> u32 {
        let cap = self.vm_limit(vm).map_or(want, |l| want.min(l));
        self.vm_counts(s)
            .into_iter()
            .find(|&n| n <= cap)
            .unwrap_or(1)
    }

    pub fn stage_index(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name == name)
    }

    /// Indices of the edges into stage `s`.
    pub fn incoming(&self, s: usize) -> &[usize] {
        &self.incoming[s]
    }

    /// Indices of the edges out of stage `s`.
    pub fn outgoing(&self, s: usize) -> &[usize] {
        &self.outgoing[s]
    }

    /// Most lambdas of stage `s` that run at once on one VM of type `vm`: the VM's memory after
    /// the reserve, and one lambda per vCPU (lambdas are compute-bound). 0: does not fit.
    pub fn max_concurrent(&self, s: usize, vm: usize) -> u32 {
        self.cmax[s][vm]
    }

    /// Lambdas on the fullest VM when stage `s` runs on `vms` VMs.
    pub fn per_vm(&self, s: usize, vms: u32) -> u32 {
        ceil_div(self.stages[s].instances, vms)
    }

    /// The VM counts a stage can use: `ceil(K / p)` for `p` in `1..=K`, descending.
    pub fn vm_counts(&self, s: usize) -> Vec<u32> {
        let k = self.stages[s].instances;
        let mut out = Vec::new();
        let mut p = 1u32;
        while p <= k {
            let n = ceil_div(k, p);
            out.push(n);
            if n == 1 {
                break;
            }
            p = ceil_div(k, n - 1);
        }
        out
    }

    /// The placement a user's "p lambdas per VM, c at once" means.
    pub fn placement_from_per_vm(
        &self,
        s: usize,
        vm: usize,
        per_vm: u32,
        concurrent: u32,
    ) -> Placement {
        let vms = ceil_div(self.stages[s].instances, per_vm.max(1));
        let p = self.per_vm(s, vms);
        Placement {
            vm,
            vms,
            concurrent: concurrent.clamp(1, p),
        }
    }

    /// Serial batches on the fullest VM.
    pub fn batches(&self, s: usize, pl: Placement) -> u32 {
        ceil_div(self.per_vm(s, pl.vms), pl.concurrent)
    }

    /// The cores each instance of stage `s` is given under `pl`: its VM type's vCPUs shared
    /// by the lambdas that run at once (`vcpus / concurrent`, at least 1: `concurrent` never
    /// exceeds the vCPUs). The executor gives each instance this CPU limit.
    pub fn cores(&self, pl: Placement) -> f64 {
        let vcpus = self.catalog.vm_types[pl.vm].vcpus.max(1);
        (f64::from(vcpus) / f64::from(pl.concurrent.max(1))).max(1.0)
    }

    /// Compute time of the fullest VM: the first batch cold, the others hot (warm containers);
    /// every batch hot where the pool's warm environments cover the first one
    /// ([`PlanProblem::warm_start`]). Each lambda's time is its time on one core times
    /// [`Stage::on_cores`] of the cores it is given ([`PlanProblem::cores`]); a cold start is not.
    pub fn compute_s(&self, s: usize, pl: Placement) -> f64 {
        let st = &self.stages[s];
        let b = f64::from(self.batches(s, pl));
        let g = st.on_cores(self.cores(pl));
        let hot = st.hot_s * g;
        let cold_work = (st.cold_s - st.start_s) * g;
        if self.warm_start(s, pl) {
            b * hot
        } else if self.prewarm && !self.incoming[s].is_empty() {
            // Prewarmed ([`PlanProblem::prewarmed`], without asking `warm_start` again).
            cold_work + (b - 1.0) * hot
        } else {
            st.cold_on(g) + (b - 1.0) * hot
        }
    }

    /// Per-instance overhead of the fullest VM: every batch pays it once, as compute is
    /// charged: the first batch the cold one's (`overhead_s`), the later ones the hot one's
    /// (`overhead_hot_s`, else `overhead_s`); every batch the hot one's where the stage starts
    /// warm ([`PlanProblem::warm_start`]).
    pub fn overhead_s(&self, s: usize, pl: Placement) -> f64 {
        let st = &self.stages[s];
        let b = f64::from(self.batches(s, pl));
        let hot = st.hot_overhead_s();
        if self.warm_start(s, pl) {
            b * hot
        } else {
            st.overhead_s + (b - 1.0) * hot
        }
    }

    /// The least time the fullest VM can be busy with stage `s` under any placement: one
    /// batch, warm where the pool may hold its containers, prewarmed where prewarming is on.
    /// A lower bound for the planner's searches.
    pub fn least_busy_s(&self, s: usize) -> f64 {
        let st = &self.stages[s];
        // The most cores an instance can be given: one lambda at a time on the largest VM
        // type that holds it.
        let g = (0..self.catalog.vm_types.len())
            .filter(|&v| self.cmax[s][v] > 0)
            .map(|v| st.on_cores(f64::from(self.catalog.vm_types[v].vcpus)))
            .fold(1.0, f64::min);
        let first = if self.prewarm && !self.incoming[s].is_empty() {
            (st.cold_s - st.start_s) * g
        } else {
            st.cold_on(g)
        };
        let cold = first + st.overhead_s;
        let may_start_warm = self.warm[s]
            .iter()
            .any(|per_vm| per_vm.iter().any(|&n| n > 0));
        if may_start_warm {
            cold.min(st.hot_s * g + st.hot_overhead_s())
        } else {
            cold
        }
    }

    /// How long the fullest VM is busy with the stage once its inputs are fetched: compute and
    /// the per-instance overhead of every batch.
    pub fn busy_s(&self, s: usize, pl: Placement) -> f64 {
        self.compute_s(s, pl) + self.overhead_s(s, pl)
    }

    /// The concurrency that keeps stage `s` on `vms` VMs of type `vm` busy the least (0 where
    /// the type does not fit it). Nothing else in a plan depends on it, so on a chain it
    /// dominates every other (docs/model.md, "Chains"). A single-threaded function: the most
    /// at once (fewest batches). One that uses several cores: for each number of batches `B`,
    /// the fewest at once that make `B` batches (`ceil(p / B)`, each instance given the most
    /// cores), the least busy of them, the larger on a tie.
    pub fn best_concurrent(&self, s: usize, vm: usize, vms: u32) -> u32 {
        let p = self.per_vm(s, vms);
        let cmax = self.cmax[s][vm].min(p);
        if cmax == 0 || self.stages[s].parallel == 0.0 {
            return cmax;
        }
        let busy = |c: u32| {
            self.busy_s(
                s,
                Placement {
                    vm,
                    vms,
                    concurrent: c,
                },
            )
        };
        let mut best = (cmax, busy(cmax));
        let mut last = cmax;
        for b in 1..=p {
            let c = ceil_div(p, b);
            if c >= last {
                continue;
            }
            last = c;
            let t = busy(c);
            if t < best.1 * (1.0 - 1e-12) {
                best = (c, t);
            }
        }
        best.0
    }

    pub(crate) fn vm_type(&self, vm: usize) -> &VmType {
        &self.catalog.vm_types[vm]
    }

    /// Dollars per second for `vms` VMs of type `vm`.
    pub fn rate(&self, vm: usize, vms: u32) -> f64 {
        f64::from(vms) * self.vm_type(vm).usd_per_second()
    }

    pub(crate) fn local_price(&self) -> f64 {
        self.local_price
    }

    pub(crate) fn remote_price(&self) -> f64 {
        self.remote_price
    }

    pub(crate) fn memory_price(&self) -> f64 {
        self.memory_price
    }

    /// Whether edge `e` may pass through the memory tier: the catalog has one and the edge's
    /// bytes fit in it (a file the tier refuses at run time goes to the store instead, which
    /// the model does not price).
    pub fn memory_fits(&self, e: usize) -> bool {
        self.catalog.memory_tier.as_ref().is_some_and(|m| {
            self.edges
                .get(e)
                .is_some_and(|e| e.bytes <= m.capacity_bytes())
        })
    }

    /// The methods edge `e` may take when it does not run on its sender's VMs (vm-storage is
    /// decided with the receiver's host): `direct`, `remote`, and `memory` where it fits.
    pub(crate) fn moving_methods(&self, e: usize) -> &'static [Method] {
        if self.memory_fits(e) {
            &[Method::Direct, Method::Remote, Method::Memory]
        } else {
            &[Method::Direct, Method::Remote]
        }
    }

    /// What edge `e` moves given the sender's busiest-VM load and the receiver's placement.
    pub fn flow(
        &self,
        e: usize,
        sender_per_vm: u32,
        receiver_vms: u32,
        receiver_per_vm: u32,
    ) -> Flow {
        let edge = &self.edges[e];
        let t = edge.bytes;
        let ks = f64::from(self.stages[edge.from].instances);
        let kr = f64::from(self.stages[edge.to].instances);
        let (ps, nr, pr) = (
            f64::from(sender_per_vm),
            f64::from(receiver_vms),
            f64::from(receiver_per_vm),
        );
        match edge.kind {
            EdgeKind::One => {
                let f = t / ks;
                Flow {
                    sent_per_vm: ps * f,
                    upload_per_vm: ps * f,
                    recv_per_vm: pr * f,
                    fetched: t,
                    puts: ks,
                    gets: ks,
                }
            }
            EdgeKind::Scatter => Flow {
                sent_per_vm: t,
                upload_per_vm: t,
                recv_per_vm: pr * t / kr,
                fetched: t,
                puts: kr,
                gets: kr,
            },
            EdgeKind::Broadcast => Flow {
                sent_per_vm: t * nr,
                upload_per_vm: t,
                recv_per_vm: t,
                fetched: t * nr,
                puts: 1.0,
                gets: nr,
            },
            EdgeKind::Gather => {
                let f = ps * t / ks;
                Flow {
                    sent_per_vm: f,
                    upload_per_vm: f,
                    recv_per_vm: t,
                    fetched: t,
                    puts: ks,
                    gets: ks,
                }
            }
            EdgeKind::Shuffle => Flow {
                sent_per_vm: ps * t / ks,
                upload_per_vm: ps * t / ks,
                recv_per_vm: pr * t / kr,
                fetched: t,
                puts: ks * kr,
                gets: ks * kr,
            },
        }
    }

    /// Direct copy: every VM sends and receives over its own NIC; the slowest VM bounds it.
    pub fn direct_s(&self, flow: &Flow, sender_vm: usize, receiver_vm: usize) -> f64 {
        let bs = self.vm_type(sender_vm).bandwidth_bps();
        let br = self.vm_type(receiver_vm).bandwidth_bps();
        (flow.sent_per_vm / bs).max(flow.recv_per_vm / br)
    }

    /// Upload to the store: request latency + the busiest VM's bytes over min(NIC, connection
    /// write rate), at least total / aggregate throughput, plus the PUTs over the request rate.
    pub fn upload_s(&self, e: usize, flow: &Flow, sender_vm: usize) -> f64 {
        let r = &self.catalog.remote_storage;
        let bw = self
            .vm_type(sender_vm)
            .bandwidth_bps()
            .min(mbps_to_bytes_per_s(r.write_mbps));
        let mut t = r.request_latency_ms / 1e3 + flow.upload_per_vm / bw;
        if let Some(a) = r.aggregate_mbps {
            t = t.max(self.edges[e].bytes / mbps_to_bytes_per_s(a));
        }
        t + flow.puts / r.requests_per_s
    }

    /// Download from the store, as [`PlanProblem::upload_s`] with the read rate and the GETs.
    pub fn download_s(&self, flow: &Flow, receiver_vm: usize) -> f64 {
        let r = &self.catalog.remote_storage;
        let bw = self
            .vm_type(receiver_vm)
            .bandwidth_bps()
            .min(mbps_to_bytes_per_s(r.read_mbps));
        let mut t = r.request_latency_ms / 1e3 + flow.recv_per_vm / bw;
        if let Some(a) = r.aggregate_mbps {
            t = t.max(flow.fetched / mbps_to_bytes_per_s(a));
        }
        t + flow.gets / r.requests_per_s
    }

    /// Upload to the memory tier: as [`PlanProblem::upload_s`] with the tier's latency, its
    /// network (shared by every VM: at least the edge's bytes over it) and request rate.
    /// Infinite without a tier.
    pub fn memory_upload_s(&self, e: usize, flow: &Flow, sender_vm: usize) -> f64 {
        let Some(m) = &self.catalog.memory_tier else {
            return f64::INFINITY;
        };
        let node = mbps_to_bytes_per_s(m.network_mbps);
        let bw = self.vm_type(sender_vm).bandwidth_bps().min(node);
        let t =
            (m.request_latency_ms / 1e3 + flow.upload_per_vm / bw).max(self.edges[e].bytes / node);
        t + flow.puts / m.requests_per_s
    }

    /// Download from the memory tier, as [`PlanProblem::memory_upload_s`].
    pub fn memory_download_s(&self, flow: &Flow, receiver_vm: usize) -> f64 {
        let Some(m) = &self.catalog.memory_tier else {
            return f64::INFINITY;
        };
        let node = mbps_to_bytes_per_s(m.network_mbps);
        let bw = self.vm_type(receiver_vm).bandwidth_bps().min(node);
        let t = (m.request_latency_ms / 1e3 + flow.recv_per_vm / bw).max(flow.fetched / node);
        t + flow.gets / m.requests_per_s
    }

    /// Upload and fetch times of edge `e` under `method`.
    pub(crate) fn edge_times(
        &self,
        s: &Sender,
        receiver: Placement,
        receiver_per_vm: u32,
    ) -> (EdgeTimes, Flow) {
        let flow = self.flow(s.edge, s.per_vm, receiver.vms, receiver_per_vm);
        let times = match s.method {
            Method::VmStorage => EdgeTimes::default(),
            Method::Direct => EdgeTimes {
                upload_s: 0.0,
                fetch_s: self.direct_s(&flow, s.vm, receiver.vm),
            },
            Method::Remote => EdgeTimes {
                upload_s: self.upload_s(s.edge, &flow, s.vm),
                fetch_s: self.download_s(&flow, receiver.vm),
            },
            Method::Memory => EdgeTimes {
                upload_s: self.memory_upload_s(s.edge, &flow, s.vm),
                fetch_s: self.memory_download_s(&flow, receiver.vm),
            },
        };
        (times, flow)
    }

    /// Runs stage `r` with placement `pl` on `host`, after `senders` (its incoming edges, in the
    /// problem's edge order): its timing and the cost it adds. Updates the groups' holds (a VM
    /// is held until its last lambda and its last served transfer end) and busy times.
    /// `times` receives each incoming edge's timing, in `senders` order.
    pub(crate) fn step(
        &self,
        r: usize,
        pl: Placement,
        host: Host,
        senders: &[Sender],
        groups: &mut Groups<'_>,
        times: &mut Vec<(EdgeTimes, Flow)>,
    ) -> StepOut {
        let per_vm = self.per_vm(r, pl.vms);
        times.clear();
        let mut start: f64 = match host {
            Host::New => 0.0,
            Host::Continue(g) => groups.busy[g],
        };
        let mut fetch: f64 = 0.0;
        for s in senders {
            let (t, flow) = self.edge_times(s, pl, per_vm);
            start = start.max(s.end + t.upload_s);
            fetch = fetch.max(t.fetch_s);
            times.push((t, flow));
        }
        let compute = self.compute_s(r, pl);
        let overhead = self.overhead_s(r, pl);
        let end = start + fetch + compute + overhead;

        let (lp, rp) = (self.local_price, self.remote_price);
        let put = self.catalog.remote_storage.put_usd_per_1k / 1e3;
        let get = self.catalog.remote_storage.get_usd_per_1k / 1e3;
        let (mut vm_usd, mut local_usd, mut remote_usd, mut request_usd) = (0.0, 0.0, 0.0, 0.0);
        let mut memory_usd = 0.0;
        for (s, (t, flow)) in senders.iter().zip(times.iter()) {
            let bytes = self.edges[s.edge].bytes;
            // Storage: a file is kept until the receiving stage ends (it may be retried).
            let serve_end = match s.method {
                Method::VmStorage => {
                    local_usd += bytes * (end - s.end) * lp;
                    None
                }
                Method::Direct => {
                    local_usd += bytes * (start + t.fetch_s - s.end) * lp
                        + flow.fetched * (end - start) * lp;
                    Some(start + t.fetch_s)
                }
                Method::Remote => {
                    let durable = s.end + t.upload_s;
                    local_usd += bytes * t.upload_s * lp + flow.fetched * (end - start) * lp;
                    remote_usd += bytes * (start + t.fetch_s - durable) * rp;
                    request_usd += flow.puts * put + flow.gets * get;
                    Some(durable)
                }
                // As remote, the tier holding the bytes from durable to fetched; no requests
                // are charged.
                Method::Memory => {
                    let durable = s.end + t.upload_s;
                    local_usd += bytes * t.upload_s * lp + flow.fetched * (end - start) * lp;
                    memory_usd += bytes * (start + t.fetch_s - durable) * self.memory_price;
                    Some(durable)
                }
            };
            if let Some(se) = serve_end {
                let h = &mut groups.hold[s.group];
                if se > *h {
                    vm_usd += groups.rate[s.group] * (se - *h);
                    *h = se;
                }
            }
        }
        match host {
            Host::New => vm_usd += self.rate(pl.vm, pl.vms) * (end - start),
            Host::Continue(g) => {
                let h = &mut groups.hold[g];
                if end > *h {
                    vm_usd += groups.rate[g] * (end - *h);
                    *h = end;
                }
                groups.busy[g] = end;
            }
        }
        let cost = vm_usd + local_usd + remote_usd + request_usd + memory_usd;
        StepOut {
            start,
            fetch,
            compute,
            overhead,
            end,
            cost,
            vm_usd,
            local_usd,
            remote_usd,
            request_usd,
            memory_usd,
        }
    }

    /// Checks a placement of stage `s` on its own: a known VM type the lambda fits, a VM count
    /// the fanout allows, a concurrency memory and vCPUs allow.
    pub fn check_placement(&self, s: usize, pl: Placement) -> Result<(), Infeasible> {
        let bad = |message: String| Infeasible::Placement {
            stage: self.stages[s].name.clone(),
            message,
        };
        let Some(vm) = self.catalog.vm_types.get(pl.vm) else {
            return Err(bad(format!("no VM type #{}", pl.vm)));
        };
        let cmax = self.cmax[s][pl.vm];
        if cmax == 0 {
            return Err(bad(format!(
                "{} MB does not fit {}",
                self.stages[s].memory_mb, vm.name
            )));
        }
        let k = self.stages[s].instances;
        if pl.vms == 0 || pl.vms > k {
            return Err(bad(format!("{} VMs for {k} instances", pl.vms)));
        }
        if let Some(limit) = self.vm_limit(pl.vm)
            && pl.vms > limit
        {
            return Err(bad(format!(
                "{} {} VMs, at most {limit} of that type",
                pl.vms, vm.name
            )));
        }
        if ceil_div(k, self.per_vm(s, pl.vms)) != pl.vms {
            return Err(bad(format!(
                "{} VMs cannot be filled evenly by {k} instances",
                pl.vms
            )));
        }
        let p = self.per_vm(s, pl.vms);
        if pl.concurrent == 0 || pl.concurrent > p.min(cmax) {
            return Err(bad(format!(
                "{} at once on {} (at most {} by memory and vCPUs, {p} per VM)",
                pl.concurrent, vm.name, cmax
            )));
        }
        Ok(())
    }

    /// Predicts latency and cost of an assignment, or says why it cannot run.
    ///
    /// vm-storage: the receiving stage runs on the VMs (a *group*) of its vm-storage senders,
    /// which must all be in one group; every edge from that group into it is then vm-storage;
    /// its placement is the group's VM type and count; an edge other than `one` needs a group
    /// of one VM. A group runs one stage at a time, in topological order.
    pub fn evaluate(&self, a: &Assignment) -> Result<Prediction, Infeasible> {
        let n = self.stages.len();
        if a.placements.len() != n {
            return Err(Infeasible::Shape {
                what: "placements",
                got: a.placements.len(),
                want: n,
            });
        }
        if a.methods.len() != self.edges.len() {
            return Err(Infeasible::Shape {
                what: "methods",
                got: a.methods.len(),
                want: self.edges.len(),
            });
        }
        let mut walk = Walk::new(self);
        for r in 0..n {
            walk.push(self, a, r)?;
        }
        walk.finish(self, a)
    }

    /// The VM groups of assignment `a` ([`crate::held`]): a stage continues the group of its
    /// `vm-storage` senders (all in one group when `a` is feasible), else starts its own.
    pub fn groups_of(&self, a: &Assignment) -> held::Groups {
        let n = self.stages.len();
        let mut group_of: Vec<usize> = (0..n).collect();
        for r in 0..n {
            if let Some(&e) = self.incoming[r]
                .iter()
                .find(|&&e| a.methods.get(e) == Some(&Method::VmStorage))
            {
                group_of[r] = group_of[self.edges[e].from];
            }
        }
        let direct = self
            .edges
            .iter()
            .zip(&a.methods)
            .filter(|(_, m)| **m == Method::Direct)
            .map(|(e, _)| (e.from, e.to));
        held::Groups::new(&self.reach, &group_of, direct)
    }

    /// Under VM limits, the first VM type (and its heaviest set of groups) of which `a`'s VM
    /// groups held at the same time need more VMs than the pool has: the one rule of
    /// [`crate::held`], which the resource manager grants by. `None` when `a` fits (always
    /// without limits).
    pub fn over_pool(&self, a: &Assignment) -> Option<(usize, Heaviest)> {
        if !self.has_vm_limits() || a.placements.len() != self.stages.len() {
            return None;
        }
        let groups = self.groups_of(a);
        // Each group's placement is its first stage's.
        let mut first: Vec<Option<Placement>> = vec![None; groups.count()];
        for (s, pl) in a.placements.iter().enumerate() {
            first[groups.of(s)].get_or_insert(*pl);
        }
        (0..self.catalog.vm_types.len()).find_map(|vm| {
            let limit = self.vm_limit(vm)?;
            let weights: Vec<u32> = first
                .iter()
                .map(|p| p.filter(|p| p.vm == vm).map_or(0, |p| p.vms))
                .collect();
            let most = groups.most(&weights);
            (most.vms > limit).then_some((vm, most))
        })
    }

    /// Whether the pool's VMs of stage `r`'s type hold it beside the VMs it fetches from over
    /// `direct` edges: a direct sender's VMs are held until the receiver has fetched, so under a
    /// VM limit (what a resource manager's pool has of a type) the receiver's VMs and those of
    /// its direct senders of the same type (each VM group once, not the receiver's own group)
    /// must all fit. The resource manager holds a granted plan to this rule (it never runs a
    /// direct receiver on its sender's VM), so the planner respects it when it plans under
    /// limits. Without a limit on the type it always holds.
    pub(crate) fn direct_fits(&self, pl: Placement, host: Host, senders: &[Sender]) -> bool {
        let Some(limit) = self.vm_limit(pl.vm) else {
            return true;
        };
        let own = match host {
            Host::New => None,
            Host::Continue(g) => Some(g),
        };
        let direct = senders
            .iter()
            .filter(|s| s.method == Method::Direct && s.vm == pl.vm)
            .map(|s| (Some(s.group), s.vms));
        held_with_direct_senders(pl.vms, own, direct) <= limit
    }

    /// Where stage `r` runs given the methods of its incoming edges (see [`PlanProblem::evaluate`]).
    fn host_of(
        &self,
        r: usize,
        pl: Placement,
        methods: &[Method],
        group_of: &[usize],
        gplace: &[Placement],
    ) -> Result<Host, Infeasible> {
        let edge_err = |e: usize, message: String| Infeasible::Edge {
            from: self.stages[self.edges[e].from].name.clone(),
            to: self.stages[r].name.clone(),
            message,
        };
        for &e in &self.incoming[r] {
            if methods[e] == Method::Memory && !self.memory_fits(e) {
                return Err(edge_err(
                    e,
                    match &self.catalog.memory_tier {
                        None => "memory: the catalog has no memory tier".into(),
                        Some(m) => format!(
                            "memory: its {:.0} bytes do not fit the memory tier's {} MB",
                            self.edges[e].bytes, m.capacity_mb
                        ),
                    },
                ));
            }
        }
        let mut group = None;
        for &e in &self.incoming[r] {
            if methods[e] != Method::VmStorage {
                continue;
            }
            let g = group_of[self.edges[e].from];
            match group {
                None => group = Some((g, e)),
                Some((g0, _)) if g0 != g => {
                    return Err(edge_err(
                        e,
                        "vm-storage from senders on different VMs".into(),
                    ));
                }
                _ => {}
            }
        }
        let Some((g, first)) = group else {
            return Ok(Host::New);
        };
        let gp = gplace[g];
        if gp.vm != pl.vm || gp.vms != pl.vms {
            return Err(edge_err(
                first,
                format!(
                    "vm-storage runs the receiver on the sender's {} x {}, not {} x {}",
                    gp.vms,
                    self.vm_type(gp.vm).name,
                    pl.vms,
                    self.vm_type(pl.vm).name
                ),
            ));
        }
        for &e in &self.incoming[r] {
            if group_of[self.edges[e].from] != g {
                continue;
            }
            if methods[e] != Method::VmStorage {
                return Err(edge_err(
                    e,
                    format!(
                        "the sender is on the receiver's VMs: only vm-storage applies, not {}",
                        methods[e]
                    ),
                ));
            }
            if self.edges[e].kind != EdgeKind::One && gp.vms != 1 {
                return Err(edge_err(
                    e,
                    format!(
                        "a {} edge over vm-storage needs one VM, not {}",
                        self.edges[e].kind, gp.vms
                    ),
                ));
            }
        }
        Ok(Host::Continue(g))
    }
}

/// The model's timeline built one stage at a time, in topological order: what
/// [`PlanProblem::evaluate`] runs, and what a search runs to price a plan's first stages (every
/// step only adds cost and never makes an earlier stage end sooner, so a prefix's cost and
/// stage ends bound the whole plan's).
#[derive(Debug, Clone)]
pub(crate) struct Walk {
    group_of: Vec<usize>,
    hold: Vec<f64>,
    busy: Vec<f64>,
    rate: Vec<f64>,
    gplace: Vec<Placement>,
    ends: Vec<f64>,
    pub stages: Vec<StagePrediction>,
    pub edges: Vec<EdgePrediction>,
    /// The cost of the stages pushed so far.
    pub total: f64,
    breakdown: CostBreakdown,
}

impl Walk {
    pub(crate) fn new(pb: &PlanProblem) -> Walk {
        let n = pb.stages.len();
        Walk {
            group_of: vec![usize::MAX; n],
            hold: Vec::new(),
            busy: Vec::new(),
            rate: Vec::new(),
            gplace: Vec::new(),
            ends: vec![0.0; n],
            stages: Vec::with_capacity(n),
            edges: vec![
                EdgePrediction {
                    method: Method::Direct,
                    seconds: 0.0,
                    upload_s: 0.0,
                    fetch_s: 0.0
                };
                pb.edges.len()
            ],
            total: 0.0,
            breakdown: CostBreakdown::default(),
        }
    }

    /// The (VM type, VM count) stage `r` must take when `a`'s methods into it include
    /// vm-storage from an already placed group; `None` when it starts VMs of its own.
    pub(crate) fn continued_placement(
        &self,
        pb: &PlanProblem,
        a: &Assignment,
        r: usize,
    ) -> Option<Placement> {
        pb.incoming[r]
            .iter()
            .find(|&&e| a.methods[e] == Method::VmStorage)
            .and_then(|&e| {
                let g = self.group_of[pb.edges[e].from];
                self.gplace.get(g).copied()
            })
    }

    /// Stage `r` placed as `a` says, with `a`'s methods on its incoming edges; the stages before
    /// it in topological order must have been pushed.
    pub(crate) fn push(
        &mut self,
        pb: &PlanProblem,
        a: &Assignment,
        r: usize,
    ) -> Result<(), Infeasible> {
        debug_assert_eq!(self.stages.len(), r, "stages are pushed in order");
        let pl = a.placements[r];
        pb.check_placement(r, pl)?;
        let host = pb.host_of(r, pl, &a.methods, &self.group_of, &self.gplace)?;
        let mut senders = Vec::with_capacity(pb.incoming[r].len());
        for &e in &pb.incoming[r] {
            let s = pb.edges[e].from;
            let sp = a.placements[s];
            senders.push(Sender {
                edge: e,
                method: a.methods[e],
                end: self.ends[s],
                vm: sp.vm,
                vms: sp.vms,
                per_vm: pb.per_vm(s, sp.vms),
                group: self.group_of[s],
            });
        }
        if !pb.direct_fits(pl, host, &senders) {
            return Err(Infeasible::Placement {
                stage: pb.stages[r].name.clone(),
                message: format!(
                    "its {} x {} and the VMs it fetches from over direct edges are more than the {} {} VMs there are (a direct sender's VMs are held until the receiver has fetched)",
                    pl.vms,
                    pb.vm_type(pl.vm).name,
                    pb.vm_limit(pl.vm).unwrap_or(0),
                    pb.vm_type(pl.vm).name
                ),
            });
        }
        let mut groups = Groups {
            hold: &mut self.hold,
            busy: &mut self.busy,
            rate: &self.rate,
        };
        let mut times = Vec::with_capacity(senders.len());
        let out = pb.step(r, pl, host, &senders, &mut groups, &mut times);
        match host {
            Host::New => {
                self.group_of[r] = self.hold.len();
                self.hold.push(out.end);
                self.busy.push(out.end);
                self.rate.push(pb.rate(pl.vm, pl.vms));
                self.gplace.push(pl);
            }
            Host::Continue(g) => self.group_of[r] = g,
        }
        self.ends[r] = out.end;
        self.total += out.cost;
        self.breakdown.vm_usd += out.vm_usd;
        self.breakdown.local_storage_usd += out.local_usd;
        self.breakdown.remote_storage_usd += out.remote_usd;
        self.breakdown.requests_usd += out.request_usd;
        self.breakdown.memory_tier_usd += out.memory_usd;
        for (s, (t, _)) in senders.iter().zip(&times) {
            self.edges[s.edge] = EdgePrediction {
                method: s.method,
                seconds: t.upload_s + t.fetch_s,
                upload_s: t.upload_s,
                fetch_s: t.fetch_s,
            };
        }
        self.stages.push(StagePrediction {
            start_s: out.start,
            fetch_s: out.fetch,
            compute_s: out.compute,
            overhead_s: out.overhead,
            end_s: out.end,
            batches: pb.batches(r, pl),
            cost_so_far_usd: self.total,
        });
        Ok(())
    }

    /// The whole plan's prediction, once every stage is pushed: refused when it holds more
    /// VMs of a type at once than the pool has.
    pub(crate) fn finish(self, pb: &PlanProblem, a: &Assignment) -> Result<Prediction, Infeasible> {
        if let Some((vm, most)) = pb.over_pool(a) {
            let groups = pb.groups_of(a);
            return Err(Infeasible::Pool {
                stages: most
                    .groups
                    .iter()
                    .flat_map(|&g| groups.stages(g))
                    .map(|s| pb.stages[s].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                vm_type: pb.vm_type(vm).name.clone(),
                need: most.vms,
                limit: pb.vm_limit(vm).unwrap_or(0),
            });
        }
        let latency = self.ends.iter().copied().fold(0.0, f64::max);
        Ok(Prediction {
            latency_s: latency,
            cost_usd: self.total,
            perf_per_dollar: perf_per_dollar(latency, self.total),
            stages: self.stages,
            edges: self.edges,
            cost: self.breakdown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{LocalStorage, RemoteStorage};

    fn vm(name: &str, vcpus: u32, memory_mb: u64, mbps: f64, usd: f64) -> VmType {
        VmType {
            name: name.into(),
            vcpus,
            memory_mb,
            network_mbps: mbps,
            usd_per_hour: usd,
        }
    }

    /// Round numbers: 1 GB/s NIC (8000 Mbit/s), $3.6/h = $0.001/s, no storage prices, a store with
    /// no latency and no request limit worth counting.
    fn catalog() -> Catalog {
        Catalog {
            reserve_mb: 0,
            vm_types: vec![vm("a", 4, 4000, 8000.0, 3.6), vm("b", 2, 2000, 800.0, 0.36)],
            local_storage: LocalStorage {
                usd_per_gb_month: 0.0,
            },
            remote_storage: RemoteStorage {
                write_mbps: 4000.0,
                read_mbps: 2000.0,
                request_latency_ms: 0.0,
                put_usd_per_1k: 0.0,
                get_usd_per_1k: 0.0,
                usd_per_gb_month: 0.0,
                requests_per_s: 1e12,
                aggregate_mbps: None,
            },
            memory_tier: None,
        }
    }

    fn stage(name: &str, mem: f64, cold: f64, hot: f64, k: u32) -> Stage {
        Stage {
            parallel: 0.0,
            name: name.into(),
            memory_mb: mem,
            cold_s: cold,
            hot_s: hot,
            instances: k,
            overhead_s: 0.0,
            overhead_hot_s: None,
            start_s: 0.0,
        }
    }

    fn edge(from: &str, to: &str, kind: EdgeKind, bytes: f64) -> EdgeSpec {
        EdgeSpec {
            from: from.into(),
            to: to.into(),
            kind,
            bytes,
        }
    }

    fn lightgbm_edges(k: u32) -> Vec<EdgeSpec> {
        vec![
            edge("pca", "train", EdgeKind::Broadcast, 1e9),
            edge("train", "combine", EdgeKind::Gather, 1e8 * f64::from(k)),
        ]
    }

    fn lightgbm(k: u32) -> PlanProblem {
        PlanProblem::new(
            vec![
                stage("pca", 1000.0, 10.0, 9.0, 1),
                stage("train", 1000.0, 14.0, 12.0, k),
                stage("combine", 500.0, 2.0, 1.0, 1),
            ],
            lightgbm_edges(k),
            catalog(),
            Bounds::default(),
        )
        .unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn a_function_that_uses_several_cores_runs_faster_with_more_of_them() {
        // train: 4 instances, 10 s cold (1 s of it the container's start), 8 s hot, on one core.
        let mut st = stage("train", 1000.0, 10.0, 8.0, 4);
        st.start_s = 1.0;
        let serial =
            PlanProblem::new(vec![st.clone()], vec![], catalog(), Bounds::default()).unwrap();
        st.parallel = 0.75;
        let par = PlanProblem::new(vec![st], vec![], catalog(), Bounds::default()).unwrap();
        // Type a has 4 vCPUs: shared by the lambdas that run at once.
        let packed = Placement {
            vm: 0,
            vms: 1,
            concurrent: 4,
        };
        let half = Placement {
            vm: 0,
            vms: 1,
            concurrent: 2,
        };
        let alone = Placement {
            vm: 0,
            vms: 4,
            concurrent: 1,
        };
        assert_eq!(
            [par.cores(packed), par.cores(half), par.cores(alone)],
            [1.0, 2.0, 4.0]
        );
        // A single-threaded function takes its time whatever it is given.
        assert!(close(serial.compute_s(0, packed), 10.0));
        assert!(close(serial.compute_s(0, alone), 10.0));
        assert!(close(serial.compute_s(0, half), 18.0));
        // 3/4 of it parallel: 0.625 of the lambda on 2 cores, 0.4375 on 4; the start as it is.
        assert!(close(par.compute_s(0, packed), 10.0));
        assert!(close(
            par.compute_s(0, half),
            1.0 + 9.0 * 0.625 + 8.0 * 0.625
        ));
        assert!(close(par.compute_s(0, alone), 1.0 + 9.0 * 0.4375));
        // The searches' lower bound holds for every placement (4 cores at most here).
        for pl in [packed, half, alone] {
            assert!(par.least_busy_s(0) <= par.compute_s(0, pl) + par.overhead_s(0, pl) + 1e-12);
        }
        assert!(close(par.least_busy_s(0), 1.0 + 9.0 * 0.4375));
        // Perf/$: a single-threaded function gets a core per lambda (more would be paid for
        // and idle); a parallel one more cores, each VM paid for a shorter time.
        let best = |pb: &PlanProblem| {
            crate::planner::plan(pb, crate::planner::Policy::Sonic)
                .unwrap()
                .best
                .stages[0]
                .cores
        };
        assert_eq!(best(&serial), 1.0);
        let mut all = stage("train", 1000.0, 10.0, 8.0, 4);
        all.parallel = 1.0;
        let all = PlanProblem::new(vec![all], vec![], catalog(), Bounds::default()).unwrap();
        assert!(best(&all) > 1.0, "{}", best(&all));
    }

    #[test]
    fn every_batch_pays_the_per_instance_overhead() {
        // train: 6 instances on one VM of type a, 2 at once: 3 batches, each paying 0.5 s of
        // overhead after its compute (14 cold, then 12 hot twice).
        let mut stages = vec![
            stage("pca", 1000.0, 10.0, 9.0, 1),
            stage("train", 1000.0, 14.0, 12.0, 6),
        ];
        let edges = vec![edge("pca", "train", EdgeKind::Broadcast, 1e9)];
        let plain =
            PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default()).unwrap();
        stages[0].overhead_s = 0.25;
        stages[1].overhead_s = 0.5;
        let with =
            PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default()).unwrap();
        let one = |c| Placement {
            vm: 0,
            vms: 1,
            concurrent: c,
        };
        let a = Assignment {
            placements: vec![one(1), one(2)],
            methods: vec![Method::VmStorage],
        };
        assert_eq!(with.batches(1, one(2)), 3);
        assert!(close(with.overhead_s(1, one(2)), 1.5));
        assert!(close(with.busy_s(1, one(2)), 14.0 + 2.0 * 12.0 + 1.5));
        let (p0, p1) = (plain.evaluate(&a).unwrap(), with.evaluate(&a).unwrap());
        // The sender ends 0.25 s later, the receiver starts then and pays 3 x 0.5 s more.
        assert!(close(p1.stages[0].end_s, p0.stages[0].end_s + 0.25));
        assert!(close(p1.stages[1].start_s, p0.stages[1].start_s + 0.25));
        assert!(close(p1.stages[1].compute_s, p0.stages[1].compute_s));
        assert!(close(p1.stages[1].overhead_s, 1.5));
        let s1 = &p1.stages[1];
        assert!(close(
            s1.end_s,
            s1.start_s + s1.fetch_s + s1.compute_s + s1.overhead_s
        ));
        assert!(close(p1.latency_s, p0.latency_s + 0.25 + 1.5));
        // The VM is held (and paid) for it: $0.001/s.
        assert!(close(p1.cost.vm_usd - p0.cost.vm_usd, 0.001 * (0.25 + 1.5)));
        // A negative or infinite overhead is refused.
        stages[1].overhead_s = -1.0;
        assert!(matches!(
            PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default()),
            Err(ProblemError::BadStage { .. })
        ));
        stages[1].overhead_s = f64::INFINITY;
        assert!(PlanProblem::new(stages, edges, catalog(), Bounds::default()).is_err());
    }

    /// A hot batch pays the hot-batch overhead where one was learned: the cold first batch
    /// `overhead_s`, the two hot ones `overhead_hot_s`; a stage starting warm pays it for
    /// every batch. The least busy time bounds every placement's from below.
    #[test]
    fn hot_batches_pay_their_own_overhead() {
        let mut stages = vec![
            stage("pca", 1000.0, 10.0, 9.0, 1),
            stage("train", 1000.0, 14.0, 12.0, 6),
        ];
        stages[1].overhead_s = 0.5;
        stages[1].overhead_hot_s = Some(0.125);
        let edges = vec![edge("pca", "train", EdgeKind::Broadcast, 1e9)];
        let pb =
            PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default()).unwrap();
        let one = |c| Placement {
            vm: 0,
            vms: 1,
            concurrent: c,
        };
        assert!(close(pb.overhead_s(1, one(2)), 0.5 + 2.0 * 0.125));
        assert!(close(pb.overhead_s(1, one(6)), 0.5));
        assert!(close(pb.least_busy_s(1), 14.0 + 0.5));
        // Warm containers for the first batch on the VM: every batch hot.
        let warm = BTreeMap::from([(
            "train".to_owned(),
            BTreeMap::from([("a".to_owned(), vec![6])]),
        )]);
        let warm_pb = pb.clone().with_warm(&warm);
        assert!(warm_pb.warm_start(1, one(2)));
        assert!(close(warm_pb.overhead_s(1, one(2)), 3.0 * 0.125));
        assert!(close(warm_pb.least_busy_s(1), 12.0 + 0.125));
        // Prewarmed: the first batch's compute less the cold start.
        stages[1].start_s = 3.0;
        let pre = PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default())
            .unwrap()
            .with_prewarm(true);
        assert!(close(pre.least_busy_s(1), 11.0 + 0.5));
        for c in 1..=6 {
            assert!(pre.busy_s(1, one(c)) >= pre.least_busy_s(1) - 1e-12);
            assert!(warm_pb.busy_s(1, one(c)) >= warm_pb.least_busy_s(1) - 1e-12);
        }
        // A negative hot overhead is refused.
        stages[1].overhead_hot_s = Some(-0.1);
        assert!(matches!(
            PlanProblem::new(stages, edges, catalog(), Bounds::default()),
            Err(ProblemError::BadStage { .. })
        ));
    }

    #[test]
    fn a_stage_starts_hot_only_where_warm_environments_cover_its_first_batch() {
        // train: 6 instances; cold 14 s, hot 12 s.
        let cold = lightgbm(6);
        let on = |vms, c| Placement {
            vm: 0,
            vms,
            concurrent: c,
        };
        let warm = |counts: Vec<u32>| {
            let by_type = BTreeMap::from([("a".to_string(), counts)]);
            cold.clone()
                .with_warm(&BTreeMap::from([("train".to_string(), by_type)]))
        };
        // Two VMs of 3 lambdas, 3 at once: one batch, cold without warm environments.
        assert!(!cold.warm_start(1, on(2, 3)));
        assert!(close(cold.compute_s(1, on(2, 3)), 14.0));
        // Two VMs holding 3 each: hot.
        let both = warm(vec![3, 3, 0]);
        assert!(both.warm_start(1, on(2, 3)));
        assert!(close(both.compute_s(1, on(2, 3)), 12.0));
        // Only one VM covers a first batch of 3: the stage is priced cold.
        let one = warm(vec![3, 2]);
        assert!(!one.warm_start(1, on(2, 3)));
        assert!(close(one.compute_s(1, on(2, 3)), 14.0));
        // ... but 2 at once (2 batches of at most 2) is covered on both: 2 x 12.
        assert!(one.warm_start(1, on(2, 2)));
        assert!(close(one.compute_s(1, on(2, 2)), 24.0));
        // Another type's or another function's warm environments do not count.
        assert!(!one.warm_start(1, Placement { vm: 1, ..on(2, 2) }));
        assert!(!one.warm_start(0, on(1, 1)));
        // The plan says which stages it priced warm, and predicts them faster.
        let (p0, p1) = (
            crate::planner::plan(&cold, crate::planner::Policy::Sonic).unwrap(),
            crate::planner::plan(
                &cold.clone().with_warm(&BTreeMap::from([(
                    "train".to_string(),
                    BTreeMap::from([("a".into(), vec![6; 6]), ("b".into(), vec![6; 6])]),
                )])),
                crate::planner::Policy::Sonic,
            )
            .unwrap(),
        );
        assert!(p0.best.stages.iter().all(|s| !s.warm));
        let train = &p1.best.stages[1];
        assert!(train.warm, "{train:?}");
        assert!(p1.best.stages.iter().filter(|s| s.warm).count() == 1);
        assert!(p1.best.predicted.latency_s < p0.best.predicted.latency_s);
    }

    #[test]
    fn prewarming_takes_the_cold_start_off_a_receivers_first_batch() {
        // train's cold 14 s includes a 4 s cold start; pca reads from nothing.
        let mut stages = vec![
            stage("pca", 1000.0, 10.0, 9.0, 1),
            stage("train", 1000.0, 14.0, 12.0, 6),
        ];
        stages[0].start_s = 3.0;
        stages[1].start_s = 4.0;
        let edges = vec![edge("pca", "train", EdgeKind::Broadcast, 1e9)];
        let pb =
            PlanProblem::new(stages.clone(), edges.clone(), catalog(), Bounds::default()).unwrap();
        let on = |vms, c| Placement {
            vm: 0,
            vms,
            concurrent: c,
        };
        // Off by default: as before.
        assert!(close(pb.compute_s(1, on(1, 3)), 14.0 + 12.0));
        let pre = pb.clone().with_prewarm(true);
        assert!(pre.prewarmed(1, on(1, 3)) && !pre.prewarmed(0, on(1, 1)));
        // Two batches: the first without its cold start, the second hot.
        assert!(close(pre.compute_s(1, on(1, 3)), 10.0 + 12.0));
        // The first stage has nothing to start ahead of it.
        assert!(close(pre.compute_s(0, on(1, 1)), 10.0));
        // Warm environments win over prewarming: all hot.
        let warm = pre.clone().with_warm(&BTreeMap::from([(
            "train".to_string(),
            BTreeMap::from([("a".to_string(), vec![3])]),
        )]));
        assert!(warm.warm_start(1, on(1, 3)) && !warm.prewarmed(1, on(1, 3)));
        assert!(close(warm.compute_s(1, on(1, 3)), 24.0));
        // The plan says so.
        let plan = crate::planner::plan(&pre, crate::planner::Policy::Sonic).unwrap();
        assert!(!plan.best.stages[0].prewarmed && plan.best.stages[1].prewarmed);
        // A cold start longer than the cold time is refused.
        stages[1].start_s = 15.0;
        assert!(matches!(
            PlanProblem::new(stages, edges, catalog(), Bounds::default()),
            Err(ProblemError::BadStage { .. })
        ));
    }

    #[test]
    fn vm_counts_are_the_distinct_ceilings() {
        let p = lightgbm(10);
        assert_eq!(p.vm_counts(1), vec![10, 5, 4, 3, 2, 1]);
        assert_eq!(p.vm_counts(0), vec![1]);
        let brute: std::collections::BTreeSet<u32> = (1..=10).map(|q| 10u32.div_ceil(q)).collect();
        assert_eq!(
            p.vm_counts(1)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>(),
            brute
        );
        assert_eq!(
            p.placement_from_per_vm(1, 0, 6, 6),
            Placement {
                vm: 0,
                vms: 2,
                concurrent: 5
            }
        );
    }

    #[test]
    fn concurrency_is_bounded_by_memory_and_vcpus() {
        let p = lightgbm(6);
        assert_eq!(p.max_concurrent(1, 0), 4); // 4000 MB / 1000 = 4, 4 vCPUs
        assert_eq!(p.max_concurrent(1, 1), 2); // 2000 / 1000 = 2, 2 vCPUs
        assert_eq!(p.max_concurrent(2, 1), 2); // vCPUs bind
        assert!(
            p.check_placement(
                1,
                Placement {
                    vm: 1,
                    vms: 1,
                    concurrent: 3
                }
            )
            .is_err()
        );
    }

    #[test]
    fn broadcast_direct_formula() {
        // pca on one "a" VM (1 GB/s), train K=6 on 3 "b" VMs (100 MB/s): direct passes
        // max(F * n_r / BW_s, F / BW_r) = max(3 s, 10 s) = 10 s.
        let p = lightgbm(6);
        let a = Assignment {
            placements: vec![
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
                Placement {
                    vm: 1,
                    vms: 3,
                    concurrent: 2,
                },
                Placement {
                    vm: 1,
                    vms: 1,
                    concurrent: 1,
                },
            ],
            methods: vec![Method::Direct, Method::Direct],
        };
        let pr = p.evaluate(&a).unwrap();
        assert!(close(pr.edges[0].seconds, 10.0), "{:?}", pr.edges[0]);
        // train: 2 per VM, 2 at once: one batch of 14 s, starting at 10 + 10.
        assert!(close(pr.stages[1].end_s, 10.0 + 10.0 + 14.0));
        // gather: each train VM sends 2 * 100 MB over 100 MB/s = 2 s; combine receives 600 MB at 100 MB/s = 6 s.
        assert!(close(pr.edges[1].seconds, 6.0));
        assert!(close(pr.latency_s, 34.0 + 6.0 + 2.0));
        // VMs: pca held 10 s (+10 s serving the broadcast) at $0.001/s; trains 3 x $0.0001/s for
        // 24 s (+6 s serving); combine $0.0001/s for 8 s.
        let want = 0.001 * 20.0 + 3.0 * 0.0001 * 30.0 + 0.0001 * 8.0;
        assert!(close(pr.cost_usd, want), "{} vs {want}", pr.cost_usd);
        assert!(close(pr.perf_per_dollar, 1.0 / (42.0 * want)));
    }

    #[test]
    fn vm_storage_serializes_and_holds_the_vm() {
        // K = 6 trainers on pca's single "a" VM: 4 at once, so 2 batches: 14 + 12.
        let p = lightgbm(6);
        let a = Assignment {
            placements: vec![
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 4,
                },
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
            ],
            methods: vec![Method::VmStorage, Method::VmStorage],
        };
        let pr = p.evaluate(&a).unwrap();
        assert_eq!(pr.stages[1].batches, 2);
        assert!(close(pr.latency_s, 10.0 + 26.0 + 2.0));
        assert!(close(pr.cost_usd, 0.001 * 38.0));
        assert_eq!(pr.edges[0].seconds, 0.0);
    }

    #[test]
    fn remote_separates_upload_and_download() {
        let p = lightgbm(2);
        let a = Assignment {
            placements: vec![
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
                Placement {
                    vm: 0,
                    vms: 2,
                    concurrent: 1,
                },
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
            ],
            methods: vec![Method::Remote, Method::Remote],
        };
        let pr = p.evaluate(&a).unwrap();
        // upload 1 GB at min(1 GB/s, 500 MB/s) = 2 s; each VM downloads 1 GB at 250 MB/s = 4 s.
        assert!(close(pr.edges[0].upload_s, 2.0));
        assert!(close(pr.edges[0].fetch_s, 4.0));
        assert!(close(pr.stages[1].start_s, 12.0));
    }

    #[test]
    fn memory_passes_through_the_tier_priced_by_the_bytes_it_holds() {
        let tier = |capacity_mb| crate::catalog::MemoryTier {
            // $0.001/s for 1 GiB; a 2 GB/s node, no latency, no request limit.
            usd_per_hour: 3.6,
            capacity_mb,
            network_mbps: 16_000.0,
            request_latency_ms: 0.0,
            requests_per_s: 1e12,
        };
        let with = |memory_tier| {
            PlanProblem::new(
                vec![
                    stage("pca", 1000.0, 10.0, 9.0, 1),
                    stage("train", 1000.0, 14.0, 12.0, 2),
                    stage("combine", 500.0, 2.0, 1.0, 1),
                ],
                lightgbm_edges(2),
                Catalog {
                    memory_tier,
                    ..catalog()
                },
                Bounds::default(),
            )
            .unwrap()
        };
        let one = |vm, vms| Placement {
            vm,
            vms,
            concurrent: 1,
        };
        let a = Assignment {
            placements: vec![one(0, 1), one(0, 2), one(0, 1)],
            methods: vec![Method::Memory, Method::Memory],
        };
        let p = with(Some(tier(1024)));
        let pr = p.evaluate(&a).unwrap();
        // pca's 1 GB broadcast: uploaded at min(1 GB/s NIC, 2 GB/s node) = 1 s; each train VM
        // reads it at 1 GB/s while the node serves both at 2 GB/s: 1 s.
        assert!(close(pr.edges[0].upload_s, 1.0) && close(pr.edges[0].fetch_s, 1.0));
        assert!(close(pr.stages[1].start_s, 11.0));
        // train's 2 x 100 MB: 0.1 s up from each VM, combine reads 200 MB in 0.2 s.
        assert!(close(pr.edges[1].upload_s, 0.1) && close(pr.edges[1].fetch_s, 0.2));
        assert!(close(pr.stages[2].start_s, 26.1));
        // The tier charges the bytes held from durable to fetched over its capacity: 1 GB for
        // 1 s and 200 MB for 0.2 s at $0.001 per GiB-second; no requests, no store.
        let price = 0.001 / (1024.0 * 1024.0 * 1024.0);
        assert!(close(
            pr.cost.memory_tier_usd,
            price * (1e9 * 1.0 + 2e8 * 0.2)
        ));
        assert_eq!(
            (pr.cost.remote_storage_usd, pr.cost.requests_usd),
            (0.0, 0.0)
        );
        let parts = pr.cost.vm_usd
            + pr.cost.local_storage_usd
            + pr.cost.remote_storage_usd
            + pr.cost.requests_usd
            + pr.cost.memory_tier_usd;
        assert!(close(parts, pr.cost_usd));
        // A tier too small for the broadcast's 1 GB refuses that edge; no tier refuses both.
        let err = with(Some(tier(512))).evaluate(&a).unwrap_err().to_string();
        assert!(
            err.contains("pca -> train") && err.contains("512 MB"),
            "{err}"
        );
        let err = with(None).evaluate(&a).unwrap_err().to_string();
        assert!(err.contains("no memory tier"), "{err}");
        assert!(!with(None).memory_fits(0) && !with(Some(tier(512))).memory_fits(0));
        assert!(with(Some(tier(512))).memory_fits(1));
    }

    /// The plan's per-stage timing splits each stage's time after its last sender into upload,
    /// wait, fetch and compute, which add up to its predicted end.
    #[test]
    fn stage_timing_adds_up_to_the_predicted_ends() {
        let p = lightgbm(2);
        let one = |vm, vms| Placement {
            vm,
            vms,
            concurrent: 1,
        };
        let a = Assignment {
            placements: vec![one(0, 1), one(0, 2), one(0, 1)],
            methods: vec![Method::Remote, Method::Remote],
        };
        let pr = p.evaluate(&a).unwrap();
        let t = crate::planner::timing(&p, &pr);
        assert_eq!(t.len(), 3);
        for (x, sp) in t.iter().zip(&pr.stages) {
            let sum = x.ready_s + x.upload_s + x.wait_s + x.fetch_s + x.compute_s;
            assert!(close(sum, sp.end_s), "{x:?}");
            assert!(x.upload_s >= 0.0 && x.wait_s >= 0.0);
        }
        assert_eq!(t[0].function, "pca");
        assert!(close(t[0].ready_s, 0.0) && close(t[0].compute_s, 10.0));
        // train: ready when pca ended (10 s), 2 s uploading the 1 GB, then 4 s fetching it.
        assert!(close(t[1].ready_s, 10.0) && close(t[1].upload_s, 2.0));
        assert!(close(t[1].wait_s, 0.0) && close(t[1].fetch_s, 4.0));
        assert!(close(t[1].compute_s, 14.0) && close(t[1].end_s, 30.0));
        // The plan carries it, and its JSON has the terms by name.
        let plan = crate::planner::Plan::new(&p, &a, &pr);
        assert_eq!(plan.timing, t);
        let v = serde_json::to_value(&plan).unwrap();
        assert_eq!(v["timing"][1]["function"], "train");
        assert!(close(v["timing"][1]["upload_s"].as_f64().unwrap(), 2.0));
        // All on one VM by vm-storage: no upload; combine waits for nothing but train.
        let local = Assignment {
            placements: vec![one(0, 1), one(0, 1), one(0, 1)],
            methods: vec![Method::VmStorage, Method::VmStorage],
        };
        let pr = p.evaluate(&local).unwrap();
        for x in crate::planner::timing(&p, &pr) {
            assert!(close(x.upload_s, 0.0) && close(x.fetch_s, 0.0), "{x:?}");
            assert!(close(x.ready_s + x.wait_s + x.compute_s, x.end_s), "{x:?}");
            assert_eq!(x.overhead_s, 0.0);
        }
        // A per-instance overhead is waiting (neither data passing nor compute), as an
        // evaluation measures it: train's 2 instances on 2 VMs pay it once each.
        let mut stages = p.stages().to_vec();
        stages[1].overhead_s = 0.3;
        let edges = lightgbm_edges(2);
        let q = PlanProblem::new(stages, edges, catalog(), Bounds::default()).unwrap();
        let pr = q.evaluate(&a).unwrap();
        let t = crate::planner::timing(&q, &pr);
        assert!(
            close(t[1].overhead_s, 0.3) && close(t[1].wait_s, 0.3),
            "{:?}",
            t[1]
        );
        assert!(close(t[1].end_s, 30.3) && close(t[2].ready_s, 30.3));
        for (x, sp) in t.iter().zip(&pr.stages) {
            let sum = x.ready_s + x.upload_s + x.wait_s + x.fetch_s + x.compute_s;
            assert!(close(sum, sp.end_s), "{x:?}");
        }
    }

    #[test]
    fn infeasible_vm_storage() {
        let p = lightgbm(6);
        let mut a = Assignment {
            placements: vec![
                Placement {
                    vm: 0,
                    vms: 1,
                    concurrent: 1,
                },
                Placement {
                    vm: 1,
                    vms: 3,
                    concurrent: 2,
                },
                Placement {
                    vm: 1,
                    vms: 1,
                    concurrent: 1,
                },
            ],
            methods: vec![Method::Direct, Method::VmStorage],
        };
        // gather from three VMs over vm-storage
        let err = p.evaluate(&a).unwrap_err().to_string();
        assert!(
            err.contains("needs one VM") || err.contains("not 1 x"),
            "{err}"
        );
        // receiver not on the sender's VM type
        a.methods = vec![Method::VmStorage, Method::Direct];
        assert!(p.evaluate(&a).is_err());
    }

    #[test]
    fn problem_refusals() {
        let big = PlanProblem::new(
            vec![stage("huge", 99_999.0, 1.0, 1.0, 1)],
            vec![],
            catalog(),
            Bounds::default(),
        );
        let msg = big.unwrap_err().to_string();
        assert!(msg.contains("huge") && msg.contains("99999"), "{msg}");
        let cyc = PlanProblem::new(
            vec![stage("a", 1.0, 1.0, 1.0, 1), stage("b", 1.0, 1.0, 1.0, 1)],
            vec![
                edge("a", "b", EdgeKind::One, 1.0),
                edge("b", "a", EdgeKind::One, 1.0),
            ],
            catalog(),
            Bounds::default(),
        );
        assert!(matches!(cyc, Err(ProblemError::Cycle(_))));
        let gather = PlanProblem::new(
            vec![stage("a", 1.0, 1.0, 1.0, 3), stage("b", 1.0, 1.0, 1.0, 2)],
            vec![edge("a", "b", EdgeKind::Gather, 1.0)],
            catalog(),
            Bounds::default(),
        );
        assert!(gather.unwrap_err().to_string().contains("gather receiver"));
        let unknown = PlanProblem::new(
            vec![stage("a", 1.0, 1.0, 1.0, 1)],
            vec![edge("a", "zz", EdgeKind::One, 1.0)],
            catalog(),
            Bounds::default(),
        );
        assert!(unknown.unwrap_err().to_string().contains("zz"));
    }

    #[test]
    fn topological_order_is_restored() {
        let p = PlanProblem::new(
            vec![stage("b", 1.0, 1.0, 1.0, 1), stage("a", 1.0, 1.0, 1.0, 1)],
            vec![edge("a", "b", EdgeKind::One, 1.0)],
            catalog(),
            Bounds::default(),
        )
        .unwrap();
        assert_eq!(p.stages()[0].name, "a");
        assert_eq!(p.edges()[0].from, 0);
    }

    #[test]
    fn method_names() {
        assert_eq!(
            serde_json::to_string(&Method::VmStorage).unwrap(),
            "\"vm-storage\""
        );
        assert_eq!("remote".parse::<Method>().unwrap(), Method::Remote);
        assert!("s3".parse::<Method>().is_err());
    }
}
