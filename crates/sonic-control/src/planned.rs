//! How a planned (`sonic`) job gets its agents: [`admit`] offers its plans to the cluster's
//! [`ResourceManager`] (grant; refusal, then the second-best plan; or the capacity the pool has,
//! then a plan within it) and turns the grant into an [`Allocation`]. [`allocate`] is the older
//! per-job mapping with no accounting across jobs, kept for tools that place one job alone.
//!
//! A plan's stage asks for `vms` VMs of one type. Its instance `k` runs on VM `k % vms` (lambdas
//! spread evenly, as the model assumes), so a stage that continues a `vm-storage` group (same VMs
//! as its sender) finds instance `k`'s input where instance `k` of the sender wrote it.
//!
//! A stage that starts a `vm-storage` group keeps its agents for the whole job: they are *held*
//! and no other planned job can start a group on them. The group needs an alive, unheld agent of
//! the plan's VM type; when there is none (every one is gone or held), the vm-storage placement
//! is refused and the second-best plan (no vm-storage where the best had it) runs instead. A
//! stage whose VM type has no alive agent at all runs on other agents, and the plan says why.

use std::collections::{BTreeMap, BTreeSet};

use sonic_core::dag::Dag;
use sonic_core::params::Params;
use sonic_core::planner::{Plan, PlanOutcome};

use std::sync::Arc;

use crate::jobs::{AgentSlot, DEFAULT_MEMORY_MB, Method};
use crate::learning::Planned;
use crate::resources::{Answer, Grant, Offer, ResourceManager};

/// Memory limit headroom over the predicted peak: predictions have errors.
pub const MEMORY_HEADROOM: f64 = 1.5;

/// Which of the planner's plans a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Used {
    Best,
    SecondBest,
}

impl Used {
    pub fn as_str(self) -> &'static str {
        match self {
            Used::Best => "best",
            Used::SecondBest => "second_best",
        }
    }
}

/// What a planned job runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub used: Used,
    pub plan: Plan,
    /// Why the second-best plan, substituted types, shared VMs.
    pub notes: Vec<String>,
    /// Per DAG function index: one agent index per VM of the plan.
    pub hosts: Vec<Vec<usize>>,
    /// Per DAG function index: instances that run at once on one VM.
    pub concurrent: Vec<u32>,
    /// Per DAG function index.
    pub memory_limit_mb: Vec<u64>,
    /// Per DAG edge index.
    pub methods: Vec<Method>,
    /// Agent ids this job holds for its vm-storage groups.
    pub held: BTreeSet<String>,
}

impl Allocation {
    /// The agent instance `k` of function `i` runs on.
    pub fn host(&self, i: usize, k: u32) -> usize {
        let h = &self.hosts[i];
        h[k as usize % h.len()]
    }

    /// Per agent, how many of the stage's instances may run at once on it (several VMs of the
    /// plan can share one agent).
    pub fn permits(&self, i: usize) -> BTreeMap<usize, usize> {
        let mut out = BTreeMap::new();
        for &a in &self.hosts[i] {
            *out.entry(a).or_insert(0) += self.concurrent[i].max(1) as usize;
        }
        out
    }

    /// The `vm-storage` senders of function `i`'s inputs: (sender function, its hosts).
    pub fn vm_storage_senders<'a>(&'a self, dag: &'a Dag, i: usize) -> Vec<(usize, &'a [usize])> {
        dag.edges
            .iter()
            .enumerate()
            .filter(|(e, edge)| edge.to == i && self.methods[*e] == Method::VmStorage)
            .map(|(_, edge)| (edge.from, self.hosts[edge.from].as_slice()))
            .collect()
    }
}

/// A plan mapped onto agents, or why a vm-storage placement cannot be granted.
struct Mapped {
    hosts: Vec<Vec<usize>>,
    concurrent: Vec<u32>,
    methods: Vec<Method>,
    notes: Vec<String>,
    held: BTreeSet<String>,
}

/// Maps `plan` onto `agents` (alive, in a stable order). `busy`: agents other jobs hold. With
/// `strict`, a vm-storage group that cannot get an alive, unheld agent of its type refuses the
/// plan; without, it takes what there is and says so.
fn map_plan(
    dag: &Dag,
    plan: &Plan,
    agents: &[AgentSlot],
    busy: &BTreeSet<String>,
    strict: bool,
) -> Result<Mapped, String> {
    let mut methods = Vec::with_capacity(dag.edges.len());
    for e in &dag.edges {
        let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
        let pe = plan
            .edges
            .iter()
            .find(|pe| &pe.from == from && &pe.to == to)
            .ok_or_else(|| format!("the plan has no method for edge {from} -> {to}"))?;
        methods.push(pe.method);
    }
    let n = dag.functions.len();
    let mut hosts: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut concurrent = Vec::with_capacity(n);
    let mut notes = Vec::new();
    let mut held = BTreeSet::new();
    for (i, f) in dag.functions.iter().enumerate() {
        let ps = plan
            .stages
            .iter()
            .find(|s| s.function == f.name)
            .ok_or_else(|| format!("the plan has no placement for {}", f.name))?;
        concurrent.push(ps.concurrent.max(1));
        // Continuing a vm-storage group: the sender's VMs (the model puts every vm-storage
        // sender of a stage in one group).
        let continued = dag
            .edges
            .iter()
            .enumerate()
            .find(|(e, edge)| edge.to == i && methods[*e] == Method::VmStorage)
            .map(|(_, edge)| hosts[edge.from].clone());
        if let Some(h) = continued {
            hosts.push(h);
            continue;
        }
        let starts_group = dag
            .edges
            .iter()
            .enumerate()
            .any(|(e, edge)| edge.from == i && methods[e] == Method::VmStorage);
        let typed: Vec<usize> = (0..agents.len())
            .filter(|&a| agents[a].vm_type == ps.vm_type)
            .collect();
        let candidates: Vec<usize> = if starts_group {
            let free: Vec<usize> = typed
                .iter()
                .copied()
                .filter(|&a| !busy.contains(&agents[a].id))
                .collect();
            if !free.is_empty() {
                free
            } else {
                let why = if typed.is_empty() {
                    format!("vm-storage from {}: no alive {} agent", f.name, ps.vm_type)
                } else {
                    format!(
                        "vm-storage from {}: every alive {} agent holds another job's vm-storage data",
                        f.name, ps.vm_type
                    )
                };
                if strict {
                    return Err(why);
                }
                notes.push(format!("{why}: granted on other agents"));
                if typed.is_empty() {
                    (0..agents.len()).collect()
                } else {
                    typed
                }
            }
        } else if typed.is_empty() {
            notes.push(format!(
                "no alive {} agent: {} runs on agents of other types",
                ps.vm_type, f.name
            ));
            (0..agents.len()).collect()
        } else {
            typed
        };
        if candidates.is_empty() {
            return Err("no alive agent to run on".into());
        }
        let vms = ps.vms.max(1) as usize;
        if candidates.len() < vms {
            notes.push(format!(
                "{}: the plan wants {vms} {} VMs, {} available: VMs share agents",
                f.name,
                ps.vm_type,
                candidates.len()
            ));
        }
        // Shifted by the stage index, so consecutive stages of a chain land on different agents.
        let h: Vec<usize> = (0..vms)
            .map(|v| candidates[(i + v) % candidates.len()])
            .collect();
        if starts_group {
            held.extend(h.iter().map(|&a| agents[a].id.clone()));
        }
        hosts.push(h);
    }
    Ok(Mapped {
        hosts,
        concurrent,
        methods,
        notes,
        held,
    })
}

/// Grants `outcome` on `agents`: the best plan when its vm-storage placements can be granted,
/// else the second-best one. `busy`: agents other jobs hold for their vm-storage groups.
pub fn allocate(
    dag: &Dag,
    outcome: &PlanOutcome,
    params: &Params,
    agents: &[AgentSlot],
    busy: &BTreeSet<String>,
) -> Result<Allocation, String> {
    if agents.is_empty() {
        return Err("no alive agent to run on".into());
    }
    let (used, plan, mapped, mut notes) = match map_plan(dag, &outcome.best, agents, busy, true) {
        Ok(m) => (Used::Best, &outcome.best, m, Vec::new()),
        Err(why) => match &outcome.second_best {
            Some(second) => {
                let note = format!("best plan refused ({why}): the second-best plan runs");
                let m = match map_plan(dag, second, agents, busy, true) {
                    Ok(m) => m,
                    Err(_) => map_plan(dag, second, agents, busy, false)?,
                };
                (Used::SecondBest, second, m, vec![note])
            }
            None => {
                let note = format!(
                    "best plan's vm-storage cannot be granted ({why}) and there is no second-best plan: it runs on the agents there are"
                );
                let m = map_plan(dag, &outcome.best, agents, busy, false)?;
                (Used::Best, &outcome.best, m, vec![note])
            }
        },
    };
    notes.extend(mapped.notes);
    let memory_limit_mb = memory_limits(dag, params);
    Ok(Allocation {
        used,
        plan: plan.clone(),
        notes,
        hosts: mapped.hosts,
        concurrent: mapped.concurrent,
        memory_limit_mb,
        methods: mapped.methods,
        held: mapped.held,
    })
}

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

/// A granted plan as the executor runs it.
fn from_grant(
    dag: &Dag,
    plan: &Plan,
    used: Used,
    grant: Grant,
    memory_limit_mb: Vec<u64>,
    agents: &[AgentSlot],
    mut notes: Vec<String>,
) -> Result<Allocation, String> {
    let mut methods = Vec::with_capacity(dag.edges.len());
    for e in &dag.edges {
        let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
        let pe = plan
            .edges
            .iter()
            .find(|pe| &pe.from == from && &pe.to == to)
            .ok_or_else(|| format!("the plan has no method for edge {from} -> {to}"))?;
        methods.push(pe.method);
    }
    let mut hosts = Vec::with_capacity(dag.functions.len());
    let mut concurrent = Vec::with_capacity(dag.functions.len());
    for (i, f) in dag.functions.iter().enumerate() {
        let ps = plan
            .stages
            .iter()
            .find(|s| s.function == f.name)
            .ok_or_else(|| format!("the plan has no placement for {}", f.name))?;
        concurrent.push(ps.concurrent.max(1));
        let ids = grant
            .hosts
            .get(i)
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("the resource manager granted no agent for {}", f.name))?;
        let h = ids
            .iter()
            .map(|id| {
                agents.iter().position(|a| &a.id == id).ok_or_else(|| {
                    format!("the resource manager granted agent {id}, which is not alive")
                })
            })
            .collect::<Result<Vec<usize>, String>>()?;
        hosts.push(h);
    }
    notes.extend(grant.notes);
    Ok(Allocation {
        used,
        plan: plan.clone(),
        notes,
        hosts,
        concurrent,
        memory_limit_mb,
        methods,
        held: BTreeSet::new(),
    })
}

/// "1 m5.large, 0 t2.large": a capacity answer's limits, for the job's notes.
fn limits_text(vms: &BTreeMap<String, u32>) -> String {
    vms.iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Plans a job again with at most so many VMs of each type (a capacity answer's limits).
pub type Replan<'a> = dyn Fn(&BTreeMap<String, u32>) -> Result<Planned, String> + Send + Sync + 'a;

/// Offers a planned job to `manager` until it is granted: the best plan with the second-best
/// as a hint; after a refusal, the second-best; after a capacity answer, the plan `replan`
/// makes within those limits (once). `waiting` hears why the job waits. Returns the allocation
/// and the plans it came from (re-planned or not).
pub async fn admit(
    manager: &dyn ResourceManager,
    job: &str,
    dag: &Dag,
    planned: &Planned,
    agents: &[AgentSlot],
    waiting: &(dyn Fn(&str) + Send + Sync),
    replan: &Replan<'_>,
) -> Result<(Allocation, Planned), String> {
    let shared = Arc::new(dag.clone());
    let mut current = planned.clone();
    let mut notes = Vec::new();
    let mut replanned = false;
    loop {
        let memory_limit_mb = memory_limits(dag, &current.params);
        let mut offer = Offer {
            job: job.to_owned(),
            dag: shared.clone(),
            plan: current.outcome.best.clone(),
            second_best: current.outcome.second_best.clone(),
            memory_limit_mb: memory_limit_mb.clone(),
            agents: agents.to_vec(),
        };
        let mut used = Used::Best;
        let mut answer = manager
            .offer(&offer, waiting)
            .await
            .map_err(|e| e.to_string())?;
        if let Answer::RefuseBest { why } = &answer {
            let Some(second) = offer.second_best.take() else {
                return Err(format!(
                    "the resource manager refused the plan ({why}) and there is no second-best plan"
                ));
            };
            notes.push(format!(
                "best plan refused ({why}): the second-best plan runs"
            ));
            offer.plan = second;
            used = Used::SecondBest;
            answer = manager
                .offer(&offer, waiting)
                .await
                .map_err(|e| e.to_string())?;
        }
        match answer {
            Answer::Grant(grant) => {
                let alloc = from_grant(
                    dag,
                    &offer.plan,
                    used,
                    grant,
                    memory_limit_mb,
                    agents,
                    notes,
                )?;
                return Ok((alloc, current));
            }
            Answer::RefuseBest { why } => {
                return Err(format!("the resource manager refused both plans: {why}"));
            }
            Answer::Capacity { vms, why } => {
                if replanned {
                    return Err(format!(
                        "the pool cannot hold the job re-planned for at most {}: {why}",
                        limits_text(&vms)
                    ));
                }
                current = replan(&vms)?;
                replanned = true;
                notes.push(format!(
                    "re-planned for at most {}: {why}",
                    limits_text(&vms)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_core::planner::{PlanEdge, PlanStage, Predicted};

    const DAG: &str = r#"
name: chain
functions:
  - { name: a, image: i, command: [x], instances: 2 }
  - { name: b, image: i, command: [x] }
  - { name: c, image: i, command: [x] }
edges:
  - { from: a, to: b, kind: gather }
  - { from: b, to: c, kind: one }
"#;

    fn dag() -> Dag {
        Dag::from_yaml("chain.yaml", DAG).expect("dag")
    }

    fn stage(function: &str, vm_type: &str, vms: u32, concurrent: u32) -> PlanStage {
        PlanStage {
            function: function.into(),
            vm_type: vm_type.into(),
            vms,
            per_vm: 1,
            concurrent,
        }
    }

    fn edge(from: &str, to: &str, method: Method) -> PlanEdge {
        PlanEdge {
            from: from.into(),
            to: to.into(),
            method,
            predicted_s: 0.0,
        }
    }

    fn predicted() -> Predicted {
        Predicted {
            latency_s: 1.0,
            cost_usd: 1.0,
            perf_per_dollar: 1.0,
        }
    }

    /// Best: a on 2 large VMs, gathered directly into b on one xlarge, which passes to c by
    /// vm-storage. Second best: the same with b -> c direct, c on a large VM.
    fn outcome(with_second: bool) -> PlanOutcome {
        PlanOutcome {
            best: Plan {
                stages: vec![
                    stage("a", "m5.large", 2, 1),
                    stage("b", "m5.xlarge", 1, 1),
                    stage("c", "m5.xlarge", 1, 1),
                ],
                edges: vec![
                    edge("a", "b", Method::Direct),
                    edge("b", "c", Method::VmStorage),
                ],
                predicted: predicted(),
            },
            second_best: with_second.then(|| Plan {
                stages: vec![
                    stage("a", "m5.large", 2, 1),
                    stage("b", "m5.xlarge", 1, 1),
                    stage("c", "m5.large", 1, 1),
                ],
                edges: vec![
                    edge("a", "b", Method::Direct),
                    edge("b", "c", Method::Direct),
                ],
                predicted: predicted(),
            }),
            table: Vec::new(),
            exact: true,
            stopped: None,
        }
    }

    fn agents(types: &[&str]) -> Vec<AgentSlot> {
        types
            .iter()
            .enumerate()
            .map(|(i, t)| AgentSlot {
                id: format!("a-{i}"),
                url: format!("http://127.0.0.1:{}", 7000 + i),
                vm_type: (*t).into(),
            })
            .collect()
    }

    fn params(memory_mb: f64) -> Params {
        let p = |m| sonic_core::params::FunctionParams {
            memory_mb: m,
            cold_s: 1.0,
            hot_s: 1.0,
            instances: 1,
        };
        Params {
            functions: [("a", p(100.0)), ("b", p(memory_mb)), ("c", p(10.0))]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            edges: Vec::new(),
        }
    }

    #[test]
    fn the_best_plan_runs_when_its_vm_storage_is_granted() {
        let d = dag();
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let a = allocate(&d, &outcome(true), &params(2000.0), &ag, &BTreeSet::new())
            .expect("allocated");
        assert_eq!(a.used, Used::Best);
        assert!(a.notes.is_empty(), "{:?}", a.notes);
        assert_eq!(a.hosts[0], vec![0, 1], "both large agents");
        assert_eq!(a.hosts[1], vec![2]);
        assert_eq!(
            a.hosts[2], a.hosts[1],
            "vm-storage continues on the sender's VM"
        );
        assert_eq!(
            a.methods,
            vec![Method::Direct, Method::VmStorage],
            "by dag edge"
        );
        assert_eq!(a.held, BTreeSet::from(["a-2".to_owned()]));
        assert_eq!((a.host(0, 0), a.host(0, 1), a.host(0, 2)), (0, 1, 0));
        assert_eq!(
            a.memory_limit_mb,
            vec![DEFAULT_MEMORY_MB, 3000, DEFAULT_MEMORY_MB]
        );
        assert_eq!(a.vm_storage_senders(&d, 2), vec![(1, &[2usize][..])]);
        assert!(a.vm_storage_senders(&d, 1).is_empty());
    }

    #[test]
    fn a_refused_vm_storage_placement_falls_back_to_the_second_best_plan() {
        let d = dag();
        // The only xlarge agent is held by another job: busy.
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let busy = BTreeSet::from(["a-2".to_owned()]);
        let a = allocate(&d, &outcome(true), &params(10.0), &ag, &busy).expect("allocated");
        assert_eq!(a.used, Used::SecondBest);
        assert!(a.notes[0].contains("holds another job"), "{:?}", a.notes);
        assert_eq!(a.methods, vec![Method::Direct, Method::Direct]);
        assert!(a.held.is_empty());
        // b still runs on its xlarge type (no vm-storage: sharing is fine); c on a large one.
        assert_eq!(a.hosts[1], vec![2]);
        assert_eq!(ag[a.hosts[2][0]].vm_type, "m5.large");

        // No xlarge agent at all: refused too, and b runs on another type, said so.
        let ag = agents(&["m5.large", "m5.large"]);
        let a =
            allocate(&d, &outcome(true), &params(10.0), &ag, &BTreeSet::new()).expect("allocated");
        assert_eq!(a.used, Used::SecondBest);
        assert!(
            a.notes[0].contains("no alive m5.xlarge agent"),
            "{:?}",
            a.notes
        );
        assert!(
            a.notes
                .iter()
                .any(|n| n.contains("b runs on agents of other types")),
            "{:?}",
            a.notes
        );
    }

    #[test]
    fn without_a_second_best_plan_the_best_runs_where_it_can() {
        let d = dag();
        let ag = agents(&["m5.large"]);
        let a =
            allocate(&d, &outcome(false), &params(10.0), &ag, &BTreeSet::new()).expect("allocated");
        assert_eq!(a.used, Used::Best);
        assert!(a.notes[0].contains("no second-best plan"), "{:?}", a.notes);
        assert!(
            a.notes.iter().any(|n| n.contains("VMs share agents")),
            "2 VMs of a on 1 agent: {:?}",
            a.notes
        );
        assert_eq!(a.hosts[0], vec![0, 0]);
        assert_eq!(a.permits(0), BTreeMap::from([(0, 2)]));
        assert_eq!(a.hosts[2], a.hosts[1]);
        assert!(allocate(&d, &outcome(true), &params(1.0), &[], &BTreeSet::new()).is_err());
    }
}
