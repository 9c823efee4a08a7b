//! The cluster-wide resource manager: the seam where a host platform decides which of its
//! machines run a job's VMs ([`ResourceManager`]), and the built-in implementation over the
//! registered agents ([`Pool`]), which accounts every agent's vCPU slots and memory across all
//! jobs and queues the jobs it cannot admit yet.
//!
//! # How the control plane uses it
//!
//! A planned job is *offered* to the manager before it runs ([`ResourceManager::offer`]): its
//! best plan with the second-best one as a hint (the best without `vm-storage` where the best
//! has it). The manager answers with an [`Answer`]:
//!
//! - [`Answer::Grant`]: which agents host which of the plan's VMs; the job runs there and keeps
//!   them until it ends, when [`ResourceManager::release`] is called (success, failure,
//!   cancellation, or lost agents before the job runs again without them).
//! - [`Answer::RefuseBest`]: the best plan cannot be granted (e.g. its `vm-storage` group needs
//!   a VM that is busy); the second-best plan is offered next.
//! - [`Answer::Capacity`]: the pool can never give what the plan asks for; the answer says how
//!   many VMs of each type it can give, the job is re-planned under that limit and offered
//!   again.
//!
//! The future returned by `offer` may take its time: the built-in manager keeps it pending
//! while the job waits in its queue (the job shows as `queued`, with the reason the manager
//! passes to the `waiting` callback). Dropping the future (the job was cancelled) withdraws the
//! offer.
//!
//! Jobs that are not planned (profiling, forced policies) have no plan to offer: each of their
//! instances asks for one [`Slot`] on the agent it runs on ([`ResourceManager::slot`]) and
//! holds it while it runs.
//!
//! # Implementing it in a host platform
//!
//! A host that starts machines on demand implements the trait over its own inventory: in
//! `offer`, start (or pick) one machine per VM of each stage whose VM type the plan names,
//! wait until each runs a `sonic-agent` that joined the control plane, and answer with their
//! agent ids; in `release`, stop or recycle them. A stage that continues a `vm-storage` group
//! ([`Offer::vm_group`]) must be granted its sender's agents, in the same order: the files are
//! there. Two VMs of one stage must be different agents. A stage that reads over `direct` edges
//! must get other machines than its senders': the plan priced each such edge as one network
//! copy between VMs, the sender's held until the receiver has fetched. More generally, VM groups
//! the plan holds at the same time (branches that run at once, a direct sender until its
//! receivers have fetched: [`sonic_core::held`], [`Offer::held_at_once`]) get machines of their
//! own, unless the offer says they may share ([`Offer::share`]). The implementation is installed with
//! [`crate::Runtime::with_resources`].

#![warn(missing_docs)]

pub mod planned;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::held::Reach;
use sonic_core::model::{Method, held_with_direct_senders};
use sonic_core::planner::{Plan, PlanStage};
use tokio::sync::Notify;

use crate::store::AgentSlot;

/// A boxed future, so that [`ResourceManager`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How many planned jobs the built-in manager lets wait at once by default.
pub const DEFAULT_MAX_QUEUED: usize = 256;

/// A plan offered to the manager for one job.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The job's id (the key of [`ResourceManager::release`]).
    pub job: String,
    /// The job's DAG; its functions are in topological order.
    pub dag: Arc<Dag>,
    /// The plan to grant.
    pub plan: Plan,
    /// The hint: the plan that is offered next if this one is refused, when there is one.
    pub second_best: Option<Plan>,
    /// Per DAG function index: the memory limit of one lambda, MB.
    pub memory_limit_mb: Vec<u64>,
    /// The agents the control plane can run on now (alive, not lost by this job), by id.
    pub agents: Vec<AgentSlot>,
    /// Per DAG function index, the agent ids the job ran that stage on before (a job a
    /// restarted control plane resumes: its files are there), in VM order; empty where there
    /// is no preference. A hint: a manager that grants these keeps the job's recorded progress,
    /// one that grants others makes it start again from its input.
    pub prefer: Vec<Vec<String>>,
    /// What the agents keep warm for the DAG's functions (idle warm containers per function
    /// and agent), as the plan was priced with: a stage the plan marks `warm` starts hot only
    /// on agents that keep enough of them. A hint: the built-in manager prefers them.
    pub warm: crate::learn::warm::WarmPool,
    /// Whether VM groups the plan holds at the same time may share an agent (they then share
    /// its slots, fewer lambdas at once than priced). `false` unless no plan keeps them apart
    /// on this pool ([`planned::admit`] offers the plan again with it, and says so in the
    /// job's notes).
    pub share: bool,
}

impl Offer {
    /// The plan's VM groups and which of them it holds at the same time (the model's rule,
    /// [`sonic_core::held`]): group ids are the groups' first functions.
    pub fn held_at_once(&self) -> sonic_core::held::Groups {
        held_at_once(&self.dag, &self.plan)
    }

    /// The plan's placement of DAG function `i`.
    pub fn stage(&self, i: usize) -> Option<&PlanStage> {
        stage_of(&self.dag, &self.plan, i)
    }

    /// The function whose VMs DAG function `i` runs on (its `vm-storage` sender), if any: a
    /// grant must give `i` the same agents as that sender, in the same order.
    pub fn vm_group(&self, i: usize) -> Option<usize> {
        vm_sender(&self.dag, &self.plan, i)
    }
}

/// [`Offer::held_at_once`] of `plan`.
fn held_at_once(dag: &Dag, plan: &Plan) -> sonic_core::held::Groups {
    let n = dag.functions.len();
    let reach = Reach::new(n, dag.edges.iter().map(|e| (e.from, e.to)));
    let roots: Vec<usize> = (0..n).map(|i| group_root(dag, plan, i)).collect();
    let direct = dag
        .edges
        .iter()
        .filter(|e| edge_method(dag, plan, e.from, e.to) == Some(Method::Direct));
    sonic_core::held::Groups::new(&reach, &roots, direct.map(|e| (e.from, e.to)))
}

/// The plan's method on the edge `from -> to` (DAG function indices).
fn edge_method(dag: &Dag, plan: &Plan, from: usize, to: usize) -> Option<Method> {
    let (f, t) = (&dag.functions[from].name, &dag.functions[to].name);
    plan.edges
        .iter()
        .find(|e| &e.from == f && &e.to == t)
        .map(|e| e.method)
}

fn stage_of<'a>(dag: &Dag, plan: &'a Plan, i: usize) -> Option<&'a PlanStage> {
    let f = dag.functions.get(i)?;
    plan.stages.iter().find(|s| s.function == f.name)
}

fn vm_sender(dag: &Dag, plan: &Plan, i: usize) -> Option<usize> {
    dag.edges
        .iter()
        .filter(|e| e.to == i)
        .find(|e| {
            let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
            plan.edges
                .iter()
                .any(|pe| &pe.from == from && &pe.to == to && pe.method == Method::VmStorage)
        })
        .map(|e| e.from)
}

/// The first function of the VM group DAG function `i` runs in (itself, unless it continues
/// its `vm-storage` sender's VMs).
fn group_root(dag: &Dag, plan: &Plan, mut i: usize) -> usize {
    while let Some(s) = vm_sender(dag, plan, i) {
        i = s;
    }
    i
}

/// The pairs of VM groups (by root, `roots`: each function's group root) that a `direct` edge
/// joins, each pair both ways round.
fn direct_links(dag: &Dag, plan: &Plan, roots: &[usize]) -> BTreeSet<(usize, usize)> {
    let mut links = BTreeSet::new();
    for to in 0..dag.functions.len() {
        for from in direct_senders(dag, plan, to) {
            let (a, b) = (roots[from], roots[to]);
            if a != b {
                links.insert((a, b));
                links.insert((b, a));
            }
        }
    }
    links
}

/// The functions DAG function `i` reads from over `direct` edges (their files stay on their
/// VMs and `i`'s VMs fetch them).
fn direct_senders<'a>(dag: &'a Dag, plan: &'a Plan, i: usize) -> impl Iterator<Item = usize> + 'a {
    dag.edges
        .iter()
        .filter(move |e| e.to == i)
        .filter(move |e| {
            let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
            plan.edges
                .iter()
                .any(|pe| &pe.from == from && &pe.to == to && pe.method == Method::Direct)
        })
        .map(|e| e.from)
}

/// Where a granted plan's VMs run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grant {
    /// Per DAG function index: one agent id per VM of the stage (`vms` of them, all
    /// different).
    pub hosts: Vec<Vec<String>>,
    /// What the job's summary says about the grant (e.g. how long it waited and behind what).
    pub notes: Vec<String>,
}

/// The manager's answer to an [`Offer`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The plan runs on these agents until the job is released.
    Grant(Grant),
    /// The offered plan cannot be granted; the second-best plan is offered next.
    RefuseBest {
        /// Why, for the job's summary.
        why: String,
    },
    /// The pool can never grant the plan: at most `vms[type]` VMs of each type (a type not
    /// named: none). The job is re-planned within these limits.
    Capacity {
        /// Per VM type: the most VMs of it one stage can get.
        vms: BTreeMap<String, u32>,
        /// Why, for the job's summary.
        why: String,
    },
}

/// Why the manager cannot take a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// Too many jobs wait already.
    #[error(
        "{waiting} jobs already wait for resources (the bound is {bound}): the job is not queued"
    )]
    QueueFull {
        /// Planned jobs waiting now.
        waiting: usize,
        /// The most that may wait.
        bound: usize,
    },
    /// The manager cannot run the job at all.
    #[error("{0}")]
    Unavailable(String),
}

/// One instance's place on an agent, held until dropped.
pub struct Slot {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Slot {
    /// A slot that runs `release` when dropped.
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> Slot {
        Slot {
            release: Some(Box::new(release)),
        }
    }

    /// A slot that accounts nothing (a manager that does not limit unplanned jobs).
    pub fn unlimited() -> Slot {
        Slot { release: None }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

/// What a host platform implements to decide where jobs run (see the module's documentation).
/// Object-safe: the control plane holds an `Arc<dyn ResourceManager>`.
pub trait ResourceManager: Send + Sync + fmt::Debug {
    /// Offers a job's plan. The future resolves with the answer; it may stay pending while the
    /// job waits for capacity, calling `waiting` with why (shown as the job's message). A
    /// dropped future withdraws the offer.
    fn offer<'a>(
        &'a self,
        offer: &'a Offer,
        waiting: &'a (dyn Fn(&str) + Send + Sync),
    ) -> BoxFuture<'a, Result<Answer, ResourceError>>;

    /// The job's VMs are free again (it ended, or it runs again without lost agents). Called
    /// for every job that ends, granted or not; releasing twice does nothing.
    fn release(&self, job: &str);

    /// One instance of an unplanned job runs on `agent` with `memory_mb` of memory: resolves
    /// with its slot once the agent has one free (one vCPU and the memory).
    fn slot<'a>(
        &'a self,
        job: &'a str,
        agent: &'a AgentSlot,
        memory_mb: u64,
    ) -> BoxFuture<'a, Result<Slot, ResourceError>>;
}

/// vCPU slots and memory on one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Use {
    /// vCPU slots: one lambda runs on each.
    pub slots: u32,
    /// Memory, MB.
    pub memory_mb: u64,
}

impl Use {
    /// The larger of each.
    pub fn max(self, o: Use) -> Use {
        Use {
            slots: self.slots.max(o.slots),
            memory_mb: self.memory_mb.max(o.memory_mb),
        }
    }

    fn min(self, o: Use) -> Use {
        Use {
            slots: self.slots.min(o.slots),
            memory_mb: self.memory_mb.min(o.memory_mb),
        }
    }

    /// Both added.
    pub fn plus(self, o: Use) -> Use {
        Use {
            slots: self.slots.saturating_add(o.slots),
            memory_mb: self.memory_mb.saturating_add(o.memory_mb),
        }
    }

    fn minus(self, o: Use) -> Use {
        Use {
            slots: self.slots.saturating_sub(o.slots),
            memory_mb: self.memory_mb.saturating_sub(o.memory_mb),
        }
    }

    fn within(self, cap: Use) -> bool {
        self.slots <= cap.slots && self.memory_mb <= cap.memory_mb
    }
}

/// Which of a DAG's stages can run at the same time: `i` and `j` can unless a path of edges
/// leads from one to the other (independent branches run at once, `sonic_core::machine`).
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// Which stages come before which (the model's, [`sonic_core::held::Reach`]).
    reach: Reach,
}

impl Concurrency {
    /// The relation of `dag`'s stages.
    pub fn of(dag: &Dag) -> Concurrency {
        let n = dag.functions.len();
        Concurrency {
            reach: Reach::new(n, dag.edges.iter().map(|e| (e.from, e.to))),
        }
    }

    /// Whether stages `i` and `j` (not the same) can run at the same time.
    pub fn together(&self, i: usize, j: usize) -> bool {
        self.reach.together(i, j)
    }

    /// What a job holds on one agent from its stages there (`(stage, what one of its VMs holds
    /// there)`, a stage once per VM): the most that stages which can run at the same time hold
    /// together. Stages one after another share what the largest holds; branches that run at
    /// once each hold their own, as the model gives each its VMs. Each of `slots` and
    /// `memory_mb` is the most over such sets: exact up to 16 stages on one agent (every set of
    /// stages that can all run together is visited once, so a chain costs little); beyond,
    /// each stage with every stage it can run beside, which holds at least as much.
    pub fn held(&self, stages: &[(usize, Use)]) -> Use {
        let n = stages.len();
        let together = |a: usize, b: usize| {
            stages[a].0 == stages[b].0 || self.together(stages[a].0, stages[b].0)
        };
        let mut most = Use::default();
        if n <= 16 {
            // Depth first over the sets whose stages can all run together, each extended only
            // by later stages that can run beside every one already in it.
            fn visit(
                from: usize,
                sum: Use,
                chosen: &mut Vec<usize>,
                stages: &[(usize, Use)],
                together: &dyn Fn(usize, usize) -> bool,
                most: &mut Use,
            ) {
                *most = most.max(sum);
                for b in from..stages.len() {
                    if chosen.iter().all(|&a| together(a, b)) {
                        chosen.push(b);
                        visit(b + 1, sum.plus(stages[b].1), chosen, stages, together, most);
                        chosen.pop();
                    }
                }
            }
            let mut chosen: Vec<usize> = Vec::with_capacity(n);
            visit(0, Use::default(), &mut chosen, stages, &together, &mut most);
        } else {
            for a in 0..n {
                let sum = (0..n)
                    .filter(|&b| b == a || together(a, b))
                    .fold(Use::default(), |acc, b| acc.plus(stages[b].1));
                most = most.max(sum);
            }
        }
        most
    }

    /// What a job whose stage `i` runs on agents `hosts[i]` (one per VM), each VM of it
    /// holding `per[i]`, holds on each agent: [`Concurrency::held`] per agent. The one rule
    /// of what a grant reserves (the built-in [`Pool`]) and of what the executor lets run at
    /// once on an agent.
    pub fn held_per_agent(&self, hosts: &[Vec<usize>], per: &[Use]) -> BTreeMap<usize, Use> {
        let mut on: BTreeMap<usize, Vec<(usize, Use)>> = BTreeMap::new();
        for (i, h) in hosts.iter().enumerate() {
            for &a in h {
                on.entry(a)
                    .or_default()
                    .push((i, per.get(i).copied().unwrap_or_default()));
            }
        }
        on.into_iter().map(|(a, st)| (a, self.held(&st))).collect()
    }
}

/// Who waits in the queue.
#[derive(Debug, Clone)]
struct Waiter {
    ticket: u64,
    /// A planned job (counted against the bound), or an unplanned instance's slot.
    planned: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Per agent id: what every grant and slot holds on it.
    used: HashMap<String, Use>,
    /// Per job: what its grant holds, per agent id.
    grants: HashMap<String, Vec<(String, Use)>>,
    /// Per slot ticket: (agent id, what it holds).
    slots: HashMap<u64, (String, Use)>,
    /// First come, first served.
    queue: VecDeque<Waiter>,
    next: u64,
}

impl State {
    fn add(&mut self, agent: &str, u: Use) {
        let e = self.used.entry(agent.to_owned()).or_default();
        *e = e.plus(u);
    }

    fn sub(&mut self, agent: &str, u: Use) {
        if let Some(e) = self.used.get_mut(agent) {
            *e = e.minus(u);
        }
    }

    fn at_head(&self, ticket: u64) -> bool {
        self.queue.front().is_some_and(|w| w.ticket == ticket)
    }

    fn dequeue(&mut self, ticket: u64) {
        self.queue.retain(|w| w.ticket != ticket);
    }

    fn ahead(&self, ticket: u64) -> usize {
        self.queue
            .iter()
            .position(|w| w.ticket == ticket)
            .unwrap_or(0)
    }
}

/// The built-in [`ResourceManager`] over the registered agents: every agent offers its VM
/// type's vCPUs as slots and its usable memory (the catalog's), shared by every job. A grant
/// reserves, on each agent it uses, what the job's stages there hold at once
/// ([`Concurrency::held`]: stages one after another the most of them, branches that run
/// together the sum; a stage's VM holds the plan's concurrent lambdas per VM and that many
/// memory limits; capped at the agent's capacity); a slot of an unplanned instance holds one
/// vCPU and its memory. Two VMs of one stage are never one agent, nor is a stage ever on an
/// agent it fetches from over a `direct` edge (a plan that needs more VMs of a type at once
/// than the pool has is answered [`Answer::Capacity`] and planned again within them); a stage
/// gets agents that run none of the job's branches beside it while such agents are free (so
/// that, where the pool has more than one VM of a type, branches are on VMs of their own as
/// planned). Requests are
/// served first come, first served: one that does not fit waits, and so does every later one
/// (a small job never overtakes a big one for ever); at most `max_queued` planned jobs wait.
/// Agents whose VM type the catalog does not know are not limited.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Per VM type: what one agent of it offers.
    capacity: BTreeMap<String, Use>,
    max_queued: usize,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl Pool {
    /// A pool whose agents offer what `catalog` says of their VM type; at most `max_queued`
    /// planned jobs wait.
    pub fn new(catalog: Option<&Catalog>, max_queued: usize) -> Pool {
        let capacity = catalog
            .map(|c| {
                c.vm_types
                    .iter()
                    .map(|v| {
                        (
                            v.name.clone(),
                            Use {
                                slots: v.vcpus.max(1),
                                memory_mb: c.usable_mb(v) as u64,
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Pool {
            capacity,
            max_queued,
            state: Arc::new(Mutex::new(State::default())),
            changed: Arc::new(Notify::new()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cap(&self, agent: &AgentSlot) -> Option<Use> {
        self.capacity.get(&agent.vm_type).copied()
    }

    /// What every agent holds now (for tests and the dashboard).
    pub fn usage(&self) -> BTreeMap<String, Use> {
        self.state()
            .used
            .iter()
            .map(|(a, u)| (a.clone(), *u))
            .collect()
    }

    /// How many requests wait.
    pub fn waiting(&self) -> usize {
        self.state().queue.len()
    }

    /// When `plan` asks for more VMs of a type than the pool has agents of it: how many of
    /// each type it has (every type of the catalog, 0 for those no agent has).
    fn short(&self, offer: &Offer) -> Option<(BTreeMap<String, u32>, String)> {
        let mut have: BTreeMap<String, u32> =
            self.capacity.keys().map(|t| (t.clone(), 0)).collect();
        for a in &offer.agents {
            *have.entry(a.vm_type.clone()).or_default() += 1;
        }
        let mut why = Vec::new();
        let (dag, plan) = (&offer.dag, &offer.plan);
        for i in 0..dag.functions.len() {
            let Some(st) = offer.stage(i) else { continue };
            let n = have.get(&st.vm_type).copied().unwrap_or(0);
            if offer.vm_group(i).is_none() && st.vms.max(1) > n {
                why.push(format!(
                    "{} wants {} {} VMs, the pool has {n}",
                    st.function,
                    st.vms.max(1),
                    st.vm_type
                ));
                continue;
            }
            // A direct sender's VMs are held until the receiver has fetched: the two never
            // share one (sonic_core::model::held_with_direct_senders).
            let root = group_root(dag, plan, i);
            let Some(own) = stage_of(dag, plan, root) else {
                continue;
            };
            let senders = direct_senders(dag, plan, i).filter_map(|s| {
                let g = group_root(dag, plan, s);
                stage_of(dag, plan, g)
                    .filter(|sp| sp.vm_type == own.vm_type)
                    .map(|sp| (g, sp.vms.max(1)))
            });
            let need = held_with_direct_senders(own.vms.max(1), root, senders);
            if need > own.vms.max(1) && need > n {
                why.push(format!(
                    "{} and the VMs it fetches from over direct edges want {need} {} VMs at once, the pool has {n}",
                    st.function, own.vm_type
                ));
            }
        }
        // VM groups held at the same time never share an agent (unless the offer allows it):
        // per VM type, the heaviest set of them against the agents of that type.
        if why.is_empty() && !offer.share {
            let groups = offer.held_at_once();
            let types: BTreeSet<&str> = plan.stages.iter().map(|s| s.vm_type.as_str()).collect();
            for t in types {
                let mut weights = vec![0u32; groups.count()];
                for i in 0..dag.functions.len() {
                    if let Some(st) = offer.stage(i)
                        && st.vm_type == t
                        && offer.vm_group(i).is_none()
                    {
                        weights[groups.of(i)] = st.vms.max(1);
                    }
                }
                let most = groups.most(&weights);
                let n = have.get(t).copied().unwrap_or(0);
                if most.vms > n {
                    let names: Vec<&str> = most
                        .groups
                        .iter()
                        .flat_map(|&g| groups.stages(g))
                        .map(|i| dag.functions[i].name.as_str())
                        .collect();
                    why.push(format!(
                        "{} hold {} {t} VMs at the same time (branches that run at once, or direct senders until their receivers fetch), the pool has {n}",
                        names.join(", "),
                        most.vms
                    ));
                }
            }
        }
        (!why.is_empty()).then(|| (have, why.join("; ")))
    }

    /// Places `plan` on the agents now, or says why not: per function, agent indices; per
    /// agent index, what the job reserves there. Each stage takes the agents it prefers (see
    /// [`Placing`]); where a later stage then finds none, earlier choices are undone and the next
    /// preferred tried (depth first, at most [`PLACE_STEPS`] choices), so that a plan the agents
    /// can hold is placed even where taking each stage's first choice would not (groups held at
    /// once need different agents, and a first fit can use up the ones a later group needed).
    /// The reason given is the first dead end's (that of taking every first choice). With the
    /// placement come the job's notes on agents where stages that run together hold more than
    /// the agent has (stages of one VM group, or groups an offer with `share` let share one):
    /// they share its slots, fewer of them at once than the plan priced.
    #[allow(clippy::type_complexity)]
    fn place(
        &self,
        st: &State,
        offer: &Offer,
        plan: &Plan,
    ) -> Result<(Vec<Vec<usize>>, BTreeMap<usize, Use>, Vec<String>), String> {
        let dag = &offer.dag;
        for f in &dag.functions {
            if !plan.stages.iter().any(|s| s.function == f.name) {
                return Err(format!("the plan has no placement for {}", f.name));
            }
        }
        let roots: Vec<usize> = (0..dag.functions.len())
            .map(|i| group_root(dag, plan, i))
            .collect();
        let mut placing = Placing {
            pool: self,
            st,
            offer,
            plan,
            together: Concurrency::of(dag),
            linked: direct_links(dag, plan, &roots),
            held: held_at_once(dag, plan),
            roots,
            steps: 0,
            first_dead_end: None,
        };
        let mut hosts: Vec<Vec<usize>> = Vec::with_capacity(dag.functions.len());
        // Per agent index: the job's stages placed there so far, each once per VM.
        let mut on: BTreeMap<usize, Vec<(usize, Use)>> = BTreeMap::new();
        if !placing.stage(0, &mut hosts, &mut on) {
            return Err(placing
                .first_dead_end
                .unwrap_or_else(|| "no placement found".to_owned()));
        }
        let mut need = BTreeMap::new();
        let mut squeezed = Vec::new();
        for (a, st) in on {
            let held = placing.together.held(&st);
            let Some(cap) = self.cap(&offer.agents[a]) else {
                need.insert(a, held);
                continue;
            };
            if held.slots > cap.slots {
                let mut names: Vec<&str> = st
                    .iter()
                    .map(|&(i, _)| dag.functions[i].name.as_str())
                    .collect();
                names.dedup();
                squeezed.push(format!(
                    "{} share agent {}: {} lambdas at once as planned, it has {} slots; they run fewer at once",
                    names.join(", "),
                    offer.agents[a].id,
                    held.slots,
                    cap.slots
                ));
            }
            need.insert(a, held.min(cap));
        }
        Ok((hosts, need, squeezed))
    }

    async fn offer_inner(
        &self,
        offer: &Offer,
        waiting: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Answer, ResourceError> {
        if offer.agents.is_empty() {
            return Err(ResourceError::Unavailable(
                "no alive agent to run on".into(),
            ));
        }
        if let Some((vms, why)) = self.short(offer) {
            return Ok(Answer::Capacity { vms, why });
        }
        let ticket = {
            let mut st = self.state();
            let queued = st.queue.iter().filter(|w| w.planned).count();
            if queued >= self.max_queued {
                return Err(ResourceError::QueueFull {
                    waiting: queued,
                    bound: self.max_queued,
                });
            }
            st.next += 1;
            let ticket = st.next;
            st.queue.push_back(Waiter {
                ticket,
                planned: true,
            });
            ticket
        };
        let _queued = Dequeue { pool: self, ticket };
        let since = Instant::now();
        let mut behind = 0usize;
        let mut said = String::new();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let why = {
                let mut st = self.state();
                if st.at_head(ticket) {
                    match self.place(&st, offer, &offer.plan) {
                        Ok((hosts, need, squeezed)) => {
                            let reserved: Vec<(String, Use)> = need
                                .iter()
                                .filter(|(a, _)| self.cap(&offer.agents[**a]).is_some())
                                .map(|(a, u)| (offer.agents[*a].id.clone(), *u))
                                .collect();
                            for (a, u) in &reserved {
                                st.add(a, *u);
                            }
                            st.grants
                                .entry(offer.job.clone())
                                .or_default()
                                .extend(reserved);
                            st.dequeue(ticket);
                            drop(st);
                            self.changed.notify_waiters();
                            let mut notes = squeezed;
                            if behind > 0 {
                                notes.push(format!(
                                    "queued {:.1} s behind {behind} job{}",
                                    since.elapsed().as_secs_f64(),
                                    if behind == 1 { "" } else { "s" }
                                ));
                            }
                            let hosts = hosts
                                .iter()
                                .map(|h| h.iter().map(|&a| offer.agents[a].id.clone()).collect())
                                .collect();
                            return Ok(Answer::Grant(Grant { hosts, notes }));
                        }
                        Err(why) if st.grants.is_empty() && st.slots.is_empty() => {
                            // Nothing holds any agent: no release will make room, waiting
                            // would be for ever. (`short` answers most such plans with the
                            // capacity; this is what its counts miss.)
                            if let Some(second) = &offer.second_best
                                && self.place(&st, offer, second).is_ok()
                            {
                                st.dequeue(ticket);
                                drop(st);
                                self.changed.notify_waiters();
                                return Ok(Answer::RefuseBest {
                                    why: format!("not grantable on this pool: {why}"),
                                });
                            }
                            st.dequeue(ticket);
                            drop(st);
                            self.changed.notify_waiters();
                            return Err(ResourceError::Unavailable(format!(
                                "the plan cannot be placed on this pool even when it is idle: {why}"
                            )));
                        }
                        Err(why) => {
                            if let Some(second) = &offer.second_best
                                && self.place(&st, offer, second).is_ok()
                            {
                                st.dequeue(ticket);
                                drop(st);
                                self.changed.notify_waiters();
                                return Ok(Answer::RefuseBest {
                                    why: format!("not grantable now: {why}"),
                                });
                            }
                            behind = behind.max(st.grants.len());
                            format!(
                                "queued: {why} ({} job{} hold{} resources)",
                                st.grants.len(),
                                if st.grants.len() == 1 { "" } else { "s" },
                                if st.grants.len() == 1 { "s" } else { "" }
                            )
                        }
                    }
                } else {
                    let ahead = st.ahead(ticket);
                    behind = behind.max(ahead + st.grants.len());
                    format!(
                        "queued behind {ahead} earlier request{} for resources",
                        if ahead == 1 { "" } else { "s" }
                    )
                }
            };
            if why != said {
                waiting(&why);
                said = why;
            }
            notified.await;
        }
    }

    async fn slot_inner(&self, agent: &AgentSlot, memory_mb: u64) -> Result<Slot, ResourceError> {
        let Some(cap) = self.cap(agent) else {
            return Ok(Slot::unlimited());
        };
        let want = Use {
            slots: 1,
            memory_mb,
        }
        .min(cap);
        let ticket = {
            let mut st = self.state();
            st.next += 1;
            let ticket = st.next;
            st.queue.push_back(Waiter {
                ticket,
                planned: false,
            });
            ticket
        };
        let _queued = Dequeue { pool: self, ticket };
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.state();
                let used = st.used.get(&agent.id).copied().unwrap_or_default();
                if st.at_head(ticket) && used.plus(want).within(cap) {
                    st.add(&agent.id, want);
                    st.slots.insert(ticket, (agent.id.clone(), want));
                    st.dequeue(ticket);
                    drop(st);
                    self.changed.notify_waiters();
                    let (state, changed) = (self.state.clone(), self.changed.clone());
                    return Ok(Slot::new(move || {
                        {
                            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some((a, u)) = st.slots.remove(&ticket) {
                                st.sub(&a, u);
                            }
                        }
                        changed.notify_waiters();
                    }));
                }
            }
            notified.await;
        }
    }
}

/// How many agent choices [`Pool::place`] tries before it gives up on a plan.
const PLACE_STEPS: usize = 2_000;

/// One placement of a plan in progress ([`Pool::place`]).
struct Placing<'a> {
    pool: &'a Pool,
    st: &'a State,
    offer: &'a Offer,
    plan: &'a Plan,
    together: Concurrency,
    /// Per function, the first function of its VM group.
    roots: Vec<usize>,
    linked: BTreeSet<(usize, usize)>,
    held: sonic_core::held::Groups,
    steps: usize,
    /// Why the first path that failed failed.
    first_dead_end: Option<String>,
}

impl Placing<'_> {
    fn dead_end(&mut self, why: impl FnOnce() -> String) -> bool {
        if self.first_dead_end.is_none() {
            self.first_dead_end = Some(why());
        }
        false
    }

    fn free(&self, a: usize) -> Option<Use> {
        let agent = &self.offer.agents[a];
        let cap = self.pool.cap(agent)?;
        Some(cap.minus(self.st.used.get(&agent.id).copied().unwrap_or_default()))
    }

    /// Whether stage `i`, holding `per` on each of its VMs, fits agent `a` beside what the job
    /// holds there already: what the job would hold there in all, against what other holders
    /// left.
    fn fits(&self, a: usize, i: usize, per: Use, on: &BTreeMap<usize, Vec<(usize, Use)>>) -> bool {
        let Some(cap) = self.pool.cap(&self.offer.agents[a]) else {
            return true;
        };
        let mut there = on.get(&a).cloned().unwrap_or_default();
        there.push((i, per));
        self.free(a)
            .is_some_and(|fr| self.together.held(&there).min(cap).within(fr))
    }

    /// Places stages `i..` given the hosts of those before; whether it could.
    fn stage(
        &mut self,
        i: usize,
        hosts: &mut Vec<Vec<usize>>,
        on: &mut BTreeMap<usize, Vec<(usize, Use)>>,
    ) -> bool {
        let (dag, offer, plan) = (&*self.offer.dag, self.offer, self.plan);
        if i == dag.functions.len() {
            return true;
        }
        let agents = &offer.agents;
        let f = &dag.functions[i];
        let Some(ps) = stage_of(dag, plan, i) else {
            return self.dead_end(|| format!("the plan has no placement for {}", f.name));
        };
        let mem = offer.memory_limit_mb.get(i).copied().unwrap_or(0);
        let concurrent = ps.concurrent.max(1);
        let per = Use {
            slots: concurrent,
            memory_mb: mem.saturating_mul(u64::from(concurrent)),
        };
        if let Some(s) = vm_sender(dag, plan, i) {
            let h = hosts[s].clone();
            for &a in &h {
                if !self.fits(a, i, per, on) {
                    return self.dead_end(|| {
                        format!(
                            "{} (over vm-storage from {}) needs {} slots and {} MB on agent {}",
                            f.name, dag.functions[s].name, per.slots, per.memory_mb, agents[a].id
                        )
                    });
                }
            }
            for &a in &h {
                on.entry(a).or_default().push((i, per));
            }
            hosts.push(h.clone());
            if self.stage(i + 1, hosts, on) {
                return true;
            }
            hosts.pop();
            for &a in &h {
                unplace(on, a);
            }
            return false;
        }
        // Never an agent of a group this stage's group is held at the same time as (branches
        // that run at once, a direct sender until its receivers have fetched, either way round
        // and its later vm-storage stages included: the model gives each such group VMs of its
        // own, sonic_core::held); `short` made sure the pool has enough VMs of the type, so the
        // stage waits for one. (An offer that lets them share keeps only the direct pairs
        // apart.) Among the others, in order: the agents the job ran this stage on before, in
        // their order; then agents that keep the most warm containers for the stage's first
        // batch (`Offer::warm`: the plan priced the stage hot where the pool had enough); then
        // agents that run none of the job's stages that can run at the same time as this one;
        // then the job's own agents (a reservation there may already cover the stage); then
        // the freest.
        let peers: Vec<usize> = (0..hosts.len())
            .filter(|&j| {
                if offer.share {
                    self.linked.contains(&(self.roots[j], i))
                } else {
                    self.held.at_once(self.held.of(j), self.held.of(i))
                }
            })
            .flat_map(|j| hosts[j].iter().copied())
            .collect();
        let preferred = |a: usize| {
            offer
                .prefer
                .get(i)
                .and_then(|p| p.iter().position(|id| *id == agents[a].id))
                .unwrap_or(usize::MAX)
        };
        let first = ps.per_vm.min(concurrent).max(1);
        let warm = |a: usize| offer.warm.on(&f.name, &agents[a].id).min(first);
        let mut typed: Vec<usize> = (0..agents.len())
            .filter(|&a| agents[a].vm_type == ps.vm_type && !peers.contains(&a))
            .collect();
        typed.sort_by_key(|&a| {
            let fr = self.free(a).unwrap_or(Use {
                slots: u32::MAX,
                memory_mb: u64::MAX,
            });
            let beside = on
                .get(&a)
                .is_some_and(|st| st.iter().any(|&(j, _)| self.together.together(i, j)));
            (
                preferred(a),
                std::cmp::Reverse(warm(a)),
                beside,
                !on.contains_key(&a),
                std::cmp::Reverse(fr.slots),
                std::cmp::Reverse(fr.memory_mb),
                a,
            )
        });
        let vms = ps.vms.max(1) as usize;
        let mut chosen = Vec::with_capacity(vms);
        self.choose(i, per, vms, &typed, 0, &mut chosen, hosts, on)
    }

    /// Takes `vms - chosen.len()` more agents for stage `i` from `typed[from..]`, in order,
    /// then places the stages after it; undoes its choices where that fails.
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &mut self,
        i: usize,
        per: Use,
        vms: usize,
        typed: &[usize],
        from: usize,
        chosen: &mut Vec<usize>,
        hosts: &mut Vec<Vec<usize>>,
        on: &mut BTreeMap<usize, Vec<(usize, Use)>>,
    ) -> bool {
        if chosen.len() == vms {
            hosts.push(chosen.clone());
            if self.stage(i + 1, hosts, on) {
                return true;
            }
            hosts.pop();
            return false;
        }
        let mut fitting = chosen.len();
        for k in from..typed.len() {
            if self.steps >= PLACE_STEPS {
                return false;
            }
            self.steps += 1;
            let a = typed[k];
            if !self.fits(a, i, per, on) {
                continue;
            }
            fitting += 1;
            on.entry(a).or_default().push((i, per));
            chosen.push(a);
            if self.choose(i, per, vms, typed, k + 1, chosen, hosts, on) {
                return true;
            }
            chosen.pop();
            unplace(on, a);
        }
        let (f, ps) = (
            &self.offer.dag.functions[i],
            stage_of(&self.offer.dag, self.plan, i),
        );
        let vm_type = ps.map(|p| p.vm_type.clone()).unwrap_or_default();
        self.dead_end(|| {
            format!(
                "{} needs {vms} {vm_type} VMs with {} free slots and {} MB each, {} are free",
                f.name,
                per.slots,
                per.memory_mb,
                fitting.min(vms - 1)
            )
        })
    }
}

/// Takes the last stage placed on agent `a` off it.
fn unplace(on: &mut BTreeMap<usize, Vec<(usize, Use)>>, a: usize) {
    if let Some(list) = on.get_mut(&a) {
        list.pop();
        if list.is_empty() {
            on.remove(&a);
        }
    }
}

/// Takes a request out of the queue when it is withdrawn (its future dropped).
struct Dequeue<'a> {
    pool: &'a Pool,
    ticket: u64,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        self.pool.state().dequeue(self.ticket);
        self.pool.changed.notify_waiters();
    }
}

impl ResourceManager for Pool {
    fn offer<'a>(
        &'a self,
        offer: &'a Offer,
        waiting: &'a (dyn Fn(&str) + Send + Sync),
    ) -> BoxFuture<'a, Result<Answer, ResourceError>> {
        Box::pin(self.offer_inner(offer, waiting))
    }

    fn release(&self, job: &str) {
        {
            let mut st = self.state();
            let Some(held) = st.grants.remove(job) else {
                return;
            };
            for (a, u) in held {
                st.sub(&a, u);
            }
        }
        self.changed.notify_waiters();
    }

    fn slot<'a>(
        &'a self,
        _job: &'a str,
        agent: &'a AgentSlot,
        memory_mb: u64,
    ) -> BoxFuture<'a, Result<Slot, ResourceError>> {
        Box::pin(self.slot_inner(agent, memory_mb))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use futures::FutureExt;
    use proptest::prelude::*;
    use sonic_core::planner::{PlanEdge, Predicted};

    const CATALOG: &str = r#"
vm_types:
  - { name: m5.large,  vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge, vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

    const DAG: &str = r#"
name: chain
functions:
  - { name: a, image: i, command: [x], instances: 4 }
  - { name: b, image: i, command: [x], instances: 4 }
  - { name: c, image: i, command: [x] }
edges:
  - { from: a, to: b, kind: one }
  - { from: b, to: c, kind: gather }
"#;

    /// m5.large and m5.xlarge, as the catalog's example has them.
    pub(crate) fn catalog() -> Catalog {
        Catalog::from_yaml(CATALOG).expect("catalog")
    }

    /// One agent per type given, `a-<i>`.
    pub(crate) fn agents(types: &[&str]) -> Vec<AgentSlot> {
        types
            .iter()
            .enumerate()
            .map(|(i, t)| AgentSlot {
                vcpus: None,
                id: format!("a-{i}"),
                url: format!("http://127.0.0.1:{}", 7000 + i),
                vm_type: (*t).into(),
            })
            .collect()
    }

    /// (vm type, vms, concurrent) per function a, b, c; `ab_vm_storage`: a -> b over vm-storage
    /// (then b's placement is a's), else direct; b -> c direct.
    fn plan(stages: [(&str, u32, u32); 3], ab_vm_storage: bool) -> Plan {
        plan_over(stages, ab_vm_storage, Method::Direct)
    }

    /// [`plan`] with `other` on the edges that are not vm-storage (`remote`: a plan whose
    /// stages may share an agent one after another).
    fn plan_over(stages: [(&str, u32, u32); 3], ab_vm_storage: bool, other: Method) -> Plan {
        let names = ["a", "b", "c"];
        let method = |m: bool| if m { Method::VmStorage } else { other };
        Plan {
            stages: names
                .iter()
                .zip(stages)
                .map(|(f, (t, vms, c))| PlanStage {
                    cores: 1.0,
                    function: (*f).into(),
                    vm_type: t.into(),
                    vms,
                    per_vm: 1,
                    concurrent: c,
                    warm: false,
                    prewarmed: false,
                })
                .collect(),
            edges: vec![
                PlanEdge {
                    from: "a".into(),
                    to: "b".into(),
                    method: method(ab_vm_storage),
                    predicted_s: 0.0,
                },
                PlanEdge {
                    from: "b".into(),
                    to: "c".into(),
                    method: other,
                    predicted_s: 0.0,
                },
            ],
            predicted: Predicted {
                latency_s: 1.0,
                cost_usd: 1.0,
                perf_per_dollar: 1.0,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: Vec::new(),
        }
    }

    fn offer(job: &str, plan: Plan, memory_mb: u64, agents: &[AgentSlot]) -> Offer {
        Offer {
            job: job.into(),
            dag: Arc::new(Dag::from_yaml("chain.yaml", DAG).expect("dag")),
            plan,
            second_best: None,
            memory_limit_mb: vec![memory_mb; 3],
            agents: agents.to_vec(),
            prefer: Vec::new(),
            warm: Default::default(),
            share: false,
        }
    }

    fn quiet(_: &str) {}

    /// What the pool answers `o` at once, which must be a grant.
    fn grant_now(pool: &Pool, o: &Offer) -> Grant {
        granted(pool.offer(o, &quiet).now_or_never().expect("at once"))
    }

    fn granted(a: Result<Answer, ResourceError>) -> Grant {
        match a {
            Ok(Answer::Grant(g)) => g,
            other => panic!("not granted: {other:?}"),
        }
    }

    const DIAMOND: &str = r#"
name: diamond
functions:
  - { name: a, image: i, command: [x] }
  - { name: b, image: i, command: [x] }
  - { name: c, image: i, command: [x] }
  - { name: d, image: i, command: [x] }
edges:
  - { from: a, to: b, kind: one }
  - { from: a, to: c, kind: one }
  - { from: b, to: d, kind: one }
  - { from: c, to: d, kind: one }
"#;

    fn slots(n: u32) -> Use {
        Use {
            slots: n,
            memory_mb: u64::from(n) * 1024,
        }
    }

    /// Stages one after another hold the most of them; branches that run at once, the sum.
    #[test]
    fn a_job_holds_the_sum_of_its_branches_and_the_most_of_a_chain() {
        let dag = Dag::from_yaml("diamond.yaml", DIAMOND).expect("dag");
        let c = Concurrency::of(&dag);
        assert!(c.together(1, 2), "b and c are branches");
        for (i, j) in [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3)] {
            assert!(!c.together(i, j) && !c.together(j, i), "{i} before {j}");
        }
        assert!(!c.together(1, 1));
        // Everything on one agent: a, then b and c at once, then d.
        let all = [(0, slots(1)), (1, slots(2)), (2, slots(1)), (3, slots(2))];
        assert_eq!(c.held(&all), slots(3), "b and c together");
        // A chain on one agent: the largest.
        assert_eq!(
            c.held(&[(0, slots(2)), (1, slots(1)), (3, slots(1))]),
            slots(2)
        );
        // Per agent: b on agent 0 with a and d, c alone on agent 1.
        let hosts = vec![vec![0], vec![0], vec![1], vec![0]];
        let per = vec![slots(1), slots(2), slots(1), slots(2)];
        let held = c.held_per_agent(&hosts, &per);
        assert_eq!(held, BTreeMap::from([(0, slots(2)), (1, slots(1))]));
        // A stage's two VMs on one agent hold twice.
        assert_eq!(c.held(&[(1, slots(1)), (1, slots(1))]), slots(2));
    }

    proptest! {
        /// `held` is the most any set of stages that can all run together holds: the same as
        /// trying every subset, on random DAGs (edges from lower to higher stages).
        #[test]
        fn what_a_job_holds_on_an_agent_is_its_heaviest_set_of_concurrent_stages(
            n in 1usize..9,
            edges in proptest::collection::vec((0usize..9, 0usize..9), 0..14),
            uses in proptest::collection::vec((0u32..5, 0u64..5000), 9),
            twice in 0usize..9,
        ) {
            let pairs = edges
                .iter()
                .map(|&(a, b)| (a.min(b), a.max(b)))
                .filter(|&(a, b)| b < n && a != b);
            let c = Concurrency { reach: Reach::new(n, pairs) };
            let mut stages: Vec<(usize, Use)> = (0..n)
                .map(|i| (i, Use { slots: uses[i].0, memory_mb: uses[i].1 }))
                .collect();
            // A stage with two VMs on the agent.
            if twice < n {
                stages.push(stages[twice]);
            }
            let m = stages.len();
            let mut brute = Use::default();
            for set in 0u32..(1 << m) {
                let members: Vec<usize> = (0..m).filter(|&a| set & (1 << a) != 0).collect();
                let ok = members.iter().all(|&a| {
                    members.iter().all(|&b| {
                        a == b || stages[a].0 == stages[b].0 || c.together(stages[a].0, stages[b].0)
                    })
                });
                if ok {
                    let sum = members.iter().fold(Use::default(), |acc, &a| acc.plus(stages[a].1));
                    brute = brute.max(sum);
                }
            }
            prop_assert_eq!(c.held(&stages), brute);
        }
    }

    /// Branches that run at once get agents of their own while there are free ones; where
    /// there are none, they share one that holds both.
    #[test]
    fn a_diamonds_branches_are_granted_different_agents() {
        let dag = Arc::new(Dag::from_yaml("diamond.yaml", DIAMOND).expect("dag"));
        let stage = |f: &str| PlanStage {
            cores: 1.0,
            function: f.into(),
            vm_type: "m5.large".into(),
            vms: 1,
            per_vm: 1,
            concurrent: 1,
            warm: false,
            prewarmed: false,
        };
        let edge = |from: &str, to: &str, method| PlanEdge {
            from: from.into(),
            to: to.into(),
            method,
            predicted_s: 0.0,
        };
        // The paper's `direct` baseline: every edge direct, a VM of its own per stage.
        let plan = Plan {
            stages: ["a", "b", "c", "d"].map(stage).to_vec(),
            edges: vec![
                edge("a", "b", Method::Direct),
                edge("a", "c", Method::Direct),
                edge("b", "d", Method::Direct),
                edge("c", "d", Method::Direct),
            ],
            predicted: Predicted {
                latency_s: 1.0,
                cost_usd: 1.0,
                perf_per_dollar: 1.0,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: Vec::new(),
        };
        let offer = |agents: &[AgentSlot]| Offer {
            job: "j".into(),
            dag: dag.clone(),
            plan: plan.clone(),
            second_best: None,
            memory_limit_mb: vec![1024; 4],
            agents: agents.to_vec(),
            prefer: Vec::new(),
            warm: Default::default(),
            share: false,
        };
        let pool = Pool::new(Some(&catalog()), 4);
        let three = agents(&["m5.large", "m5.large", "m5.large"]);
        let g = grant_now(&pool, &offer(&three));
        assert_ne!(g.hosts[1], g.hosts[2], "b and c run at once: {:?}", g.hosts);
        for (from, to) in [(0, 1), (0, 2), (1, 3), (2, 3)] {
            assert_ne!(
                g.hosts[from], g.hosts[to],
                "direct {from} -> {to}: {:?}",
                g.hosts
            );
        }
        // Each agent holds one branch (and a or d, one after another): one slot each.
        assert!(
            pool.usage().values().all(|u| *u == slots(1)),
            "{:?}",
            pool.usage()
        );
        pool.release("j");
        // Two agents: d fetches from b and c at once, three VMs the pool does not have.
        let two = agents(&["m5.large", "m5.large"]);
        match pool.offer(&offer(&two), &quiet).now_or_never().expect("at once") {
            Ok(Answer::Capacity { why, .. }) => assert!(
                why.contains("d and the VMs it fetches from over direct edges want 3 m5.large VMs at once, the pool has 2"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // One agent and every edge remote: b and c run at once, each priced on a VM of its
        // own, so the pool can never hold them apart and says so (the job is re-planned).
        let mut remote = plan.clone();
        for e in &mut remote.edges {
            e.method = Method::Remote;
        }
        let one = agents(&["m5.large"]);
        let mut o = offer(&one);
        o.plan = remote.clone();
        match pool.offer(&o, &quiet).now_or_never().expect("at once") {
            Ok(Answer::Capacity { vms, why }) => {
                assert_eq!(vms["m5.large"], 1);
                assert!(
                    why.contains("b, c hold 2 m5.large VMs at the same time"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Offered with leave to share (no plan kept them apart): both branches on it, holding
        // two slots.
        o.share = true;
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[1], g.hosts[2]);
        assert_eq!(pool.usage()["a-0"], slots(2));
        pool.release("j");
        // Two agents, one of them full with another job's grant: c waits for it rather than
        // run beside b.
        let two = agents(&["m5.large", "m5.large"]);
        let mut o = offer(&two);
        o.plan = remote;
        // The other job: a remote chain, one after another on one agent, two lambdas at once.
        let other = super::tests::offer(
            "other",
            plan_over([("m5.large", 1, 2); 3], false, Method::Remote),
            1024,
            &two,
        );
        let busy = grant_now(&pool, &other);
        assert_eq!(pool.usage()[&busy.hosts[0][0]], slots(2));
        let waited = std::sync::Mutex::new(Vec::new());
        let said = |why: &str| waited.lock().expect("lock").push(why.to_owned());
        let mut pending = pool.offer(&o, &said);
        assert!((&mut pending).now_or_never().is_none(), "c waits");
        pool.release("other");
        let g = granted(pending.now_or_never().expect("granted once released"));
        assert_ne!(g.hosts[1], g.hosts[2], "{:?}", g.hosts);
        assert!(
            waited
                .lock()
                .expect("lock")
                .iter()
                .any(|w| w.starts_with("queued")),
            "{:?}",
            waited.lock()
        );
        pool.release("j");
    }

    /// Roots a and b, a and b -> c, a -> d, every edge remote, a VM each: b is held beside a,
    /// c beside d (they can run at once), b beside d; so two agents hold the plan, {a, d} and
    /// {b, c}. Taking each stage's first choice puts c on a's agent and leaves d none: the pool
    /// undoes that choice rather than answer that the plan cannot be placed.
    #[test]
    fn groups_held_at_once_are_placed_where_a_first_fit_would_not() {
        const DAG: &str = r#"
name: two-roots
functions:
  - { name: a, image: i, command: [x] }
  - { name: b, image: i, command: [x] }
  - { name: c, image: i, command: [x] }
  - { name: d, image: i, command: [x] }
edges:
  - { from: a, to: c, kind: one }
  - { from: b, to: c, kind: one }
  - { from: a, to: d, kind: one }
"#;
        let dag = Arc::new(Dag::from_yaml("two-roots.yaml", DAG).expect("dag"));
        let mut plan = plan_over([("m5.large", 1, 1); 3], false, Method::Remote);
        plan.stages = ["a", "b", "c", "d"]
            .map(|f| PlanStage {
                function: f.into(),
                ..plan.stages[0].clone()
            })
            .to_vec();
        plan.edges = [("a", "c"), ("b", "c"), ("a", "d")]
            .map(|(from, to)| PlanEdge {
                from: from.into(),
                to: to.into(),
                method: Method::Remote,
                predicted_s: 0.0,
            })
            .to_vec();
        let two = agents(&["m5.large", "m5.large"]);
        let o = Offer {
            dag,
            plan,
            memory_limit_mb: vec![1024; 4],
            ..offer(
                "j",
                plan_over([("m5.large", 1, 1); 3], false, Method::Remote),
                1024,
                &two,
            )
        };
        let groups = o.held_at_once();
        assert!(groups.at_once(0, 1) && groups.at_once(2, 3) && groups.at_once(1, 3));
        let pool = Pool::new(Some(&catalog()), 4);
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0], g.hosts[3], "{:?}", g.hosts);
        assert_eq!(g.hosts[1], g.hosts[2], "{:?}", g.hosts);
        assert_ne!(g.hosts[0], g.hosts[1], "{:?}", g.hosts);
        pool.release("j");
    }

    #[test]
    fn a_grant_spreads_a_stage_over_different_agents_and_reserves_the_most_a_stage_needs() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let o = offer(
            "j1",
            plan(
                [("m5.large", 2, 2), ("m5.large", 2, 1), ("m5.xlarge", 1, 1)],
                true,
            ),
            1024,
            &ag,
        );
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0].len(), 2);
        assert_ne!(g.hosts[0][0], g.hosts[0][1], "two VMs, two agents");
        assert_eq!(g.hosts[1], g.hosts[0], "vm-storage continues on a's VMs");
        assert_eq!(g.hosts[2], vec!["a-2".to_owned()]);
        assert!(g.notes.is_empty(), "{:?}", g.notes);
        let used = pool.usage();
        // a needs 2 slots and 2 GB on each large agent; b (1 at once) fits inside that.
        for id in ["a-0", "a-1"] {
            assert_eq!(
                used[id],
                Use {
                    slots: 2,
                    memory_mb: 2048
                }
            );
        }
        assert_eq!(used["a-2"].slots, 1);
        pool.release("j1");
        pool.release("j1");
        assert!(pool.usage().values().all(|u| *u == Use::default()));
    }

    #[test]
    fn a_stage_goes_to_the_agents_that_keep_its_containers_warm() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large", "m5.large", "m5.large", "m5.xlarge"]);
        let mut o = offer(
            "j1",
            plan(
                [("m5.large", 2, 1), ("m5.large", 1, 1), ("m5.xlarge", 1, 1)],
                false,
            ),
            1024,
            &ag,
        );
        // Without warm containers the freest come first, by index.
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0], vec!["a-0".to_owned(), "a-1".to_owned()]);
        assert_eq!(
            g.hosts[1],
            vec!["a-2".to_owned()],
            "b fetches direct from a's"
        );
        pool.release("j1");
        // a-2 and a-1 keep a's containers, a-0 keeps b's: each stage goes where it is warm.
        let on = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|(id, n)| ((*id).to_owned(), ("m5.large".to_owned(), *n)))
                .collect::<BTreeMap<_, _>>()
        };
        o.warm.functions = BTreeMap::from([
            ("a".to_owned(), on(&[("a-2", 1), ("a-1", 3)])),
            ("b".to_owned(), on(&[("a-0", 1)])),
        ]);
        let g = grant_now(&pool, &o);
        let mut a_hosts = g.hosts[0].clone();
        a_hosts.sort();
        assert_eq!(a_hosts, vec!["a-1".to_owned(), "a-2".to_owned()]);
        assert_eq!(g.hosts[1], vec!["a-0".to_owned()]);
        pool.release("j1");
        // A resumed job's own agents still come first.
        o.prefer = vec![vec!["a-0".into(), "a-1".into()], Vec::new(), Vec::new()];
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0], vec!["a-0".to_owned(), "a-1".to_owned()]);
        pool.release("j1");
    }

    #[test]
    fn a_resumed_job_gets_the_agents_it_ran_on_in_their_order() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large", "m5.large", "m5.large", "m5.xlarge"]);
        let mut o = offer(
            "j1",
            plan(
                [("m5.large", 2, 1), ("m5.large", 2, 1), ("m5.xlarge", 1, 1)],
                true,
            ),
            1024,
            &ag,
        );
        // Without a preference the freest come first, by index.
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0], vec!["a-0".to_owned(), "a-1".to_owned()]);
        pool.release("j1");
        o.prefer = vec![vec!["a-2".into(), "a-0".into()], Vec::new(), Vec::new()];
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[0], vec!["a-2".to_owned(), "a-0".to_owned()]);
        assert_eq!(g.hosts[1], g.hosts[0], "vm-storage continues on a's VMs");
        pool.release("j1");
    }

    #[test]
    fn a_direct_receiver_never_gets_its_senders_agents() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // a -> b direct: b gets the other large agent, not a's (nor the job's own).
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let chain = |vms: u32| {
            plan(
                [
                    ("m5.large", vms, 1),
                    ("m5.large", vms, 1),
                    ("m5.xlarge", 1, 1),
                ],
                false,
            )
        };
        let g = grant_now(&pool, &offer("j1", chain(1), 1024, &ag));
        assert_eq!(g.hosts[0], ids(&["a-0"]));
        assert_eq!(g.hosts[1], ids(&["a-1"]), "the direct edge crosses VMs");
        pool.release("j1");

        // Two VMs each, four large agents: b's two are the two a does not hold.
        let ag4 = agents(&["m5.large", "m5.large", "m5.large", "m5.large", "m5.xlarge"]);
        let g = grant_now(&pool, &offer("j2", chain(2), 1024, &ag4));
        assert_eq!(g.hosts[0], ids(&["a-0", "a-1"]));
        assert_eq!(g.hosts[1], ids(&["a-2", "a-3"]));
        pool.release("j2");

        // Another job fills a-0: j3 cannot have a and b on two large agents, so it waits
        // (never b on a's agent); once j0 is gone it gets both.
        let other = offer(
            "j0",
            plan_over(
                [("m5.large", 1, 2), ("m5.large", 1, 2), ("m5.xlarge", 1, 1)],
                true,
                Method::Remote,
            ),
            1024,
            &ag,
        );
        let g0 = grant_now(&pool, &other);
        assert_eq!(g0.hosts[0], ids(&["a-0"]));
        let j3 = offer("j3", chain(1), 1024, &ag);
        let mut waiting = pool.offer(&j3, &quiet);
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "b waits for a large agent a does not hold"
        );
        pool.release("j0");
        let g = granted(waiting.now_or_never().expect("granted once j0 is gone"));
        assert_ne!(g.hosts[0], g.hosts[1], "{:?}", g.hosts);
        // One large agent: the chain can never run as planned.
        let one = agents(&["m5.large", "m5.xlarge"]);
        match pool
            .offer(&offer("j4", chain(1), 1024, &one), &quiet)
            .now_or_never()
            .expect("at once")
        {
            Ok(Answer::Capacity { vms, why }) => {
                assert_eq!(vms["m5.large"], 1);
                assert!(why.contains("b and the VMs it fetches from over direct edges want 2 m5.large VMs at once, the pool has 1"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// h sends `direct` to e, which continues a's VM (a -> e vm-storage): h is placed after a
    /// (a -> h remote) and must keep off a's agent, though h fetches nothing over `direct`
    /// and the pool otherwise prefers the job's own agents.
    #[test]
    fn a_direct_sender_keeps_off_the_agent_its_receiver_will_continue_on() {
        const DAG: &str = r#"
name: join
functions:
  - { name: a, image: i, command: [x] }
  - { name: h, image: i, command: [x] }
  - { name: e, image: i, command: [x] }
edges:
  - { from: a, to: h, kind: one }
  - { from: a, to: e, kind: one }
  - { from: h, to: e, kind: one }
"#;
        let stage = |f: &str| PlanStage {
            cores: 1.0,
            function: f.into(),
            vm_type: "m5.large".into(),
            vms: 1,
            per_vm: 1,
            concurrent: 1,
            warm: false,
            prewarmed: false,
        };
        let edge = |from: &str, to: &str, method| PlanEdge {
            from: from.into(),
            to: to.into(),
            method,
            predicted_s: 0.0,
        };
        let plan = Plan {
            stages: ["a", "h", "e"].map(stage).to_vec(),
            edges: vec![
                edge("a", "h", Method::Remote),
                edge("a", "e", Method::VmStorage),
                edge("h", "e", Method::Direct),
            ],
            predicted: Predicted {
                latency_s: 1.0,
                cost_usd: 1.0,
                perf_per_dollar: 1.0,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: Vec::new(),
        };
        let o = Offer {
            job: "j".into(),
            dag: Arc::new(Dag::from_yaml("join.yaml", DAG).expect("dag")),
            plan,
            second_best: None,
            memory_limit_mb: vec![1024; 3],
            agents: agents(&["m5.large", "m5.large"]),
            prefer: Vec::new(),
            warm: Default::default(),
            share: false,
        };
        let pool = Pool::new(Some(&catalog()), 4);
        let g = grant_now(&pool, &o);
        assert_eq!(g.hosts[2], g.hosts[0], "e continues a's VM");
        assert_ne!(
            g.hosts[1], g.hosts[0],
            "h sends to e over direct: {:?}",
            g.hosts
        );
    }

    #[test]
    fn a_plan_the_pool_can_never_hold_is_answered_with_its_capacity() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large"]);
        let o = offer(
            "j1",
            plan(
                [("m5.large", 2, 1), ("m5.xlarge", 1, 1), ("m5.large", 1, 1)],
                false,
            ),
            1024,
            &ag,
        );
        match pool.offer(&o, &quiet).now_or_never().expect("at once") {
            Ok(Answer::Capacity { vms, why }) => {
                assert_eq!(
                    vms,
                    BTreeMap::from([("m5.large".to_owned(), 1), ("m5.xlarge".to_owned(), 0)])
                );
                assert!(
                    why.contains("a wants 2 m5.large VMs, the pool has 1"),
                    "{why}"
                );
                assert!(
                    why.contains("b wants 1 m5.xlarge VMs, the pool has 0"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(pool.waiting(), 0);
    }

    #[test]
    fn a_busy_vm_storage_group_refuses_the_best_plan_when_the_second_best_fits() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large", "m5.xlarge"]);
        // Another job holds both slots of the large agent.
        let other = offer(
            "j0",
            plan_over(
                [("m5.large", 1, 2), ("m5.large", 1, 2), ("m5.large", 1, 1)],
                true,
                Method::Remote,
            ),
            1024,
            &ag,
        );
        grant_now(&pool, &other);
        let mut o = offer(
            "j1",
            plan(
                [("m5.large", 1, 1), ("m5.large", 1, 1), ("m5.xlarge", 1, 1)],
                true,
            ),
            1024,
            &ag,
        );
        o.second_best = Some(plan_over(
            [
                ("m5.xlarge", 1, 1),
                ("m5.xlarge", 1, 1),
                ("m5.xlarge", 1, 1),
            ],
            false,
            Method::Remote,
        ));
        match pool.offer(&o, &quiet).now_or_never().expect("at once") {
            Ok(Answer::RefuseBest { why }) => assert!(why.contains("a needs 1 m5.large"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(pool.waiting(), 0, "a refusal leaves the queue");
    }

    /// Every job wants all 4 slots of the only xlarge agent but the small one, which wants 1.
    #[tokio::test]
    async fn jobs_are_admitted_first_come_first_served_and_a_small_one_does_not_overtake() {
        let pool = Pool::new(Some(&catalog()), 8);
        let ag = agents(&["m5.xlarge"]);
        let big = |job: &str| {
            offer(
                job,
                plan_over(
                    [
                        ("m5.xlarge", 1, 4),
                        ("m5.xlarge", 1, 4),
                        ("m5.xlarge", 1, 1),
                    ],
                    false,
                    Method::Remote,
                ),
                1024,
                &ag,
            )
        };
        let small = offer(
            "small",
            plan_over(
                [
                    ("m5.xlarge", 1, 1),
                    ("m5.xlarge", 1, 1),
                    ("m5.xlarge", 1, 1),
                ],
                false,
                Method::Remote,
            ),
            1024,
            &ag,
        );
        granted(pool.offer(&big("first"), &quiet).await);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let messages = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut tasks = Vec::new();
        for o in [big("second"), small] {
            let (mine, tx, messages) = (pool.clone(), tx.clone(), messages.clone());
            tasks.push(tokio::spawn(async move {
                let say = move |m: &str| messages.lock().expect("lock").push(m.to_owned());
                let g = granted(mine.offer(&o, &say).await);
                tx.send((o.job.clone(), g)).expect("send");
            }));
            // Queued in this order.
            while pool.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        assert!(rx.try_recv().is_err(), "nothing fits while first runs");
        let said = messages.lock().expect("lock").clone();
        assert!(
            said.iter()
                .any(|m| m.contains("queued: a needs 1 m5.xlarge")),
            "{said:?}"
        );
        assert!(
            said.iter()
                .any(|m| m.contains("queued behind 1 earlier request")),
            "{said:?}"
        );
        pool.release("first");
        let (job, g) = rx.recv().await.expect("granted");
        assert_eq!(job, "second", "first come, first served");
        assert!(g.notes[0].starts_with("queued "), "{:?}", g.notes);
        assert!(g.notes[0].ends_with("behind 1 job"), "{:?}", g.notes);
        // second holds every slot: small still waits.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(rx.try_recv().is_err());
        pool.release("second");
        let (job, _) = rx.recv().await.expect("granted");
        assert_eq!(job, "small");
        for t in tasks {
            t.await.expect("task");
        }
    }

    #[tokio::test]
    async fn past_the_bound_a_job_is_refused_and_a_withdrawn_offer_leaves_the_queue() {
        let pool = Pool::new(Some(&catalog()), 1);
        let ag = agents(&["m5.large"]);
        let full = |job: &str| {
            offer(
                job,
                plan_over(
                    [("m5.large", 1, 2), ("m5.large", 1, 2), ("m5.large", 1, 1)],
                    false,
                    Method::Remote,
                ),
                1024,
                &ag,
            )
        };
        granted(pool.offer(&full("j1"), &quiet).await);
        let j2 = full("j2");
        let mut waiting = pool.offer(&j2, &quiet);
        assert!((&mut waiting).now_or_never().is_none(), "j2 waits");
        let err = pool
            .offer(&full("j3"), &quiet)
            .now_or_never()
            .expect("at once")
            .expect_err("past the bound");
        assert_eq!(
            err,
            ResourceError::QueueFull {
                waiting: 1,
                bound: 1
            }
        );
        assert!(err.to_string().contains("the bound is 1"), "{err}");
        drop(waiting);
        assert_eq!(pool.waiting(), 0, "a dropped offer is withdrawn");
        let j3 = full("j3");
        let mut j3 = pool.offer(&j3, &quiet);
        assert!((&mut j3).now_or_never().is_none(), "j3 queues now");
    }

    #[tokio::test]
    async fn unplanned_slots_share_the_agents_with_grants() {
        let pool = Pool::new(Some(&catalog()), 4);
        let ag = agents(&["m5.large"]);
        let s1 = pool.slot("p", &ag[0], 1024).await.expect("slot");
        let o = offer(
            "j1",
            plan_over(
                [("m5.large", 1, 2), ("m5.large", 1, 1), ("m5.large", 1, 1)],
                false,
                Method::Remote,
            ),
            1024,
            &ag,
        );
        let mut grant = pool.offer(&o, &quiet);
        assert!(
            (&mut grant).now_or_never().is_none(),
            "1 of 2 slots is taken"
        );
        let mut s2 = pool.slot("p", &ag[0], 1024);
        assert!(
            (&mut s2).now_or_never().is_none(),
            "a slot waits behind the queued job"
        );
        drop(s1);
        let g = granted(grant.await);
        drop(s2);
        assert_eq!(g.hosts[0], vec!["a-0".to_owned()]);
        assert!(pool.slot("p", &ag[0], 1024).now_or_never().is_none());
        pool.release("j1");
        let held = pool.slot("p", &ag[0], 100_000).await.expect("slot");
        assert_eq!(
            pool.usage()["a-0"],
            Use {
                slots: 1,
                memory_mb: 7680
            },
            "capped at the agent's usable memory"
        );
        drop(held);
        assert_eq!(pool.usage()["a-0"], Use::default());
        // An agent of a type the catalog does not know is not limited.
        let odd = agents(&["t9.huge"]);
        let _a = pool.slot("p", &odd[0], 1).await.expect("slot");
        let _b = pool.slot("p", &odd[0], 1).await.expect("slot");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Offer {
            stages: [(bool, u32, u32); 3],
            memory_mb: u64,
            vm_storage: bool,
        },
        Release(usize),
        Slot {
            agent: usize,
            memory_mb: u64,
        },
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                prop::array::uniform3((any::<bool>(), 1u32..=3, 1u32..=4)),
                prop_oneof![Just(512u64), Just(1024), Just(3000), Just(9000)],
                any::<bool>()
            )
                .prop_map(|(stages, memory_mb, vm_storage)| Op::Offer {
                    stages,
                    memory_mb,
                    vm_storage
                }),
            (0usize..8).prop_map(Op::Release),
            (0usize..5, prop_oneof![Just(512u64), Just(4096)])
                .prop_map(|(agent, memory_mb)| Op::Slot { agent, memory_mb }),
            (0usize..8).prop_map(Op::Drop),
        ]
    }

    proptest! {
        /// Random offers (granted at once or withdrawn), releases and unplanned slots,
        /// interleaved: no agent ever holds more slots or memory than it has, no stage gets two
        /// VMs on one agent, and what the agents hold is what the grants and slots hold.
        #[test]
        fn the_pool_never_oversubscribes_an_agent(ops in prop::collection::vec(op(), 1..60)) {
            let cat = catalog();
            let pool = Pool::new(Some(&cat), 4);
            let ag = agents(&["m5.large", "m5.large", "m5.large", "m5.xlarge", "m5.xlarge"]);
            let mut jobs: Vec<String> = Vec::new();
            let mut slots: Vec<Slot> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Offer { stages, memory_mb, vm_storage } => {
                        let t = |x: bool| if x { "m5.xlarge" } else { "m5.large" };
                        let mut s = stages.map(|(x, vms, c)| (t(x), vms, c));
                        if vm_storage {
                            s[1] = s[0];
                        }
                        let job = format!("j{n}");
                        let o = offer(&job, plan(s, vm_storage), memory_mb, &ag);
                        if let Some(Ok(Answer::Grant(g))) = pool.offer(&o, &quiet).now_or_never() {
                            for (i, h) in g.hosts.iter().enumerate() {
                                let mut d = h.clone();
                                d.sort();
                                d.dedup();
                                prop_assert_eq!(d.len(), h.len(), "stage {} on {:?}", i, h);
                                prop_assert_eq!(h.len() as u32, s[i].1);
                                for id in h {
                                    let a = ag.iter().find(|a| &a.id == id).expect("known");
                                    prop_assert_eq!(a.vm_type.as_str(), s[i].0);
                                }
                            }
                            if vm_storage {
                                prop_assert_eq!(&g.hosts[1], &g.hosts[0]);
                            }
                            // A direct receiver never runs on its sender's agents (a -> b
                            // unless vm-storage, b -> c always).
                            for (from, to, direct) in [(0, 1, !vm_storage), (1, 2, true)] {
                                prop_assert!(
                                    !direct || g.hosts[to].iter().all(|a| !g.hosts[from].contains(a)),
                                    "{} -> {} direct, on {:?} and {:?}", from, to, g.hosts[from], g.hosts[to]
                                );
                            }
                            jobs.push(job);
                        }
                    }
                    Op::Release(k) if !jobs.is_empty() => {
                        let job = jobs.remove(k % jobs.len());
                        pool.release(&job);
                    }
                    Op::Slot { agent, memory_mb } => {
                        if let Some(Ok(s)) = pool.slot("p", &ag[agent], memory_mb).now_or_never() {
                            slots.push(s);
                        }
                    }
                    Op::Drop(k) if !slots.is_empty() => {
                        slots.remove(k % slots.len());
                    }
                    _ => {}
                }
                prop_assert_eq!(pool.waiting(), 0, "withdrawn offers leave the queue");
                let st = pool.state();
                let mut sum: HashMap<String, Use> = HashMap::new();
                for (a, u) in st.grants.values().flatten().chain(st.slots.values()) {
                    let e = sum.entry(a.clone()).or_default();
                    *e = e.plus(*u);
                }
                for a in &ag {
                    let used = st.used.get(&a.id).copied().unwrap_or_default();
                    let cap = pool.capacity[&a.vm_type];
                    prop_assert!(used.within(cap), "{}: {:?} over {:?}", a.id, used, cap);
                    prop_assert_eq!(used, sum.get(&a.id).copied().unwrap_or_default());
                }
            }
        }
    }
}
