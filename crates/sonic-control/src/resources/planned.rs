//! How a planned (`sonic`) job gets its agents: [`admit`] offers its plans to the cluster's
//! [`ResourceManager`] (grant; refusal, then the second-best plan; or the capacity the pool has,
//! then a plan within it) and turns the grant into an [`Allocation`].
//!
//! A plan's stage asks for `vms` VMs of one type. Its instance `k` of `K` runs on VM
//! `sonic_core::machine::vm_of(k, K, vms)` (contiguous blocks, lambdas spread evenly as the model
//! assumes; the job machine places by it), so a stage that continues a `vm-storage` group (same
//! VMs as its sender) finds instance `k`'s input where instance `k` of the sender wrote it. The
//! manager grants such a stage its sender's agents, in the same order.

use std::collections::BTreeMap;
use std::sync::Arc;

use sonic_core::dag::Dag;
use sonic_core::planner::Plan;

use crate::learn::{Planned, memory_limits};
use crate::resources::{Answer, Concurrency, Grant, Offer, ResourceManager, Use};
use crate::store::AgentSlot;
use sonic_core::model::Method;

/// Which of the planner's plans a job runs (the wire's [`PlanUsed`]; a granted job never has
/// `None`).
pub use sonic_api::control::PlanUsed as Used;

/// What a planned job runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Which of the plans runs.
    pub used: Used,
    /// The plan that runs.
    pub plan: Plan,
    /// Why the second-best plan, substituted types, shared VMs.
    pub notes: Vec<String>,
    /// Per DAG function index: one agent index per VM of the plan.
    pub hosts: Vec<Vec<usize>>,
    /// Per DAG function index: instances that run at once on one VM.
    pub concurrent: Vec<u32>,
    /// Per DAG function index.
    pub memory_limit_mb: Vec<u64>,
    /// Per DAG function index: the CPUs each instance is given (the plan's `cores`: its VM
    /// type's vCPUs over the lambdas it runs at once).
    pub cpus: Vec<f64>,
    /// Per DAG edge index.
    pub methods: Vec<Method>,
}

impl Allocation {
    /// The agent instance `k` of function `i`'s `instances` runs on (the job machine's rule,
    /// [`sonic_core::machine::vm_of`]).
    pub fn host(&self, i: usize, k: u32, instances: u32) -> usize {
        let h = &self.hosts[i];
        let vm = sonic_core::machine::vm_of(k, instances, h.len() as u32) as usize;
        h[vm.min(h.len() - 1)]
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

    /// Per agent, how many of the job's lambdas may run at once on it: what the grant reserved
    /// there, by the built-in pool's rule ([`Concurrency::held_per_agent`]: stages one after
    /// another the most of them, branches that run together the sum), and never more than
    /// `cap(agent)` (the agent's vCPU slots, where known), as the pool caps what it reserves:
    /// branches squeezed onto one agent share its slots rather than oversubscribe it (the
    /// grant's notes say so).
    pub fn reserved(
        &self,
        dag: &Dag,
        cap: impl Fn(usize) -> Option<usize>,
    ) -> BTreeMap<usize, usize> {
        let per: Vec<Use> = self
            .concurrent
            .iter()
            .map(|&c| Use {
                slots: c.max(1),
                memory_mb: 0,
            })
            .collect();
        Concurrency::of(dag)
            .held_per_agent(&self.hosts, &per)
            .into_iter()
            .map(|(a, u)| {
                let slots = u.slots as usize;
                (a, cap(a).map_or(slots, |c| slots.min(c.max(1))))
            })
            .collect()
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
    let mut cpus = Vec::with_capacity(dag.functions.len());
    for (i, f) in dag.functions.iter().enumerate() {
        let ps = plan
            .stages
            .iter()
            .find(|s| s.function == f.name)
            .ok_or_else(|| format!("the plan has no placement for {}", f.name))?;
        concurrent.push(ps.concurrent.max(1));
        cpus.push(if ps.cores.is_finite() {
            ps.cores.max(1.0)
        } else {
            1.0
        });
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
        cpus,
        methods,
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
    admit_preferring(manager, job, dag, planned, agents, &[], waiting, replan).await
}

/// [`admit`], telling the manager which agents the job ran each stage on before
/// ([`Offer::prefer`]: a job resumed after a restart).
#[allow(clippy::too_many_arguments)]
pub async fn admit_preferring(
    manager: &dyn ResourceManager,
    job: &str,
    dag: &Dag,
    planned: &Planned,
    agents: &[AgentSlot],
    prefer: &[Vec<String>],
    waiting: &(dyn Fn(&str) + Send + Sync),
    replan: &Replan<'_>,
) -> Result<(Allocation, Planned), String> {
    let shared = Arc::new(dag.clone());
    let mut current = planned.clone();
    let mut notes = Vec::new();
    let mut replanned = false;
    // Whether groups the plan holds at once may share agents: only once no plan keeps them
    // apart on this pool.
    let mut share = false;
    loop {
        let memory_limit_mb = memory_limits(dag, &current.params);
        let mut offer = Offer {
            job: job.to_owned(),
            dag: shared.clone(),
            plan: current.outcome.best.clone(),
            second_best: current.outcome.second_best.clone(),
            memory_limit_mb: memory_limit_mb.clone(),
            agents: agents.to_vec(),
            prefer: prefer.to_vec(),
            warm: current.warm.clone(),
            share,
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
                match replan(&vms) {
                    Ok(again) => {
                        current = again;
                        replanned = true;
                        notes.push(format!(
                            "re-planned for at most {}: {why}",
                            limits_text(&vms)
                        ));
                    }
                    // No plan keeps the groups held at once apart on this pool (e.g. two
                    // branches that can only run on VMs of their own, one VM of the type):
                    // the plan runs with them sharing agents, as the job's notes say, rather
                    // than not at all. Its prediction assumed they run apart.
                    Err(e) if !share => {
                        share = true;
                        notes.push(format!(
                            "no plan fits {} ({why}; re-planning: {e}): stages planned on VMs of their own share agents and run fewer lambdas at once than predicted",
                            limits_text(&vms)
                        ));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::DEFAULT_MEMORY_MB;
    use crate::resources::Pool;
    use crate::resources::tests::{agents, catalog};
    use sonic_core::params::Params;
    use sonic_core::planner::{PlanEdge, PlanOutcome, PlanStage, Predicted};

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
            cores: 1.0,
            function: function.into(),
            vm_type: vm_type.into(),
            vms,
            per_vm: 1,
            concurrent,
            warm: false,
            prewarmed: false,
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
            requests_usd: 0.0,
            latency_quantiles_s: None,
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
                timing: Vec::new(),
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
                timing: Vec::new(),
            }),
            table: Vec::new(),
            exact: true,
            stopped: None,
            slo: None,
        }
    }

    fn params(memory_mb: f64) -> Params {
        let p = |m| sonic_core::params::FunctionParams {
            parallel: 0.0,
            memory_mb: m,
            cold_s: 1.0,
            hot_s: 1.0,
            instances: 1,
            overhead_s: 0.0,
            overhead_hot_s: None,
            start_s: 0.0,
            cold_dist: None,
            hot_dist: None,
        };
        Params {
            functions: [("a", p(100.0)), ("b", p(memory_mb)), ("c", p(10.0))]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            edges: Vec::new(),
        }
    }

    fn planned(with_second: bool) -> Planned {
        let outcome = outcome(with_second);
        Planned {
            report: sonic_api::plan::PlanReport::new(
                outcome.report("d", sonic_core::planner::Policy::Sonic, 0),
                0,
            ),
            outcome,
            params: params(2000.0),
            warm: crate::learn::warm::WarmPool::default(),
        }
    }

    fn quiet(_: &str) {}

    fn pool() -> Pool {
        Pool::new(Some(&catalog()), 8)
    }

    fn no_replan(_: &BTreeMap<String, u32>) -> Result<Planned, String> {
        Err("not expected".into())
    }

    #[tokio::test]
    async fn the_best_plan_runs_where_the_pool_grants_it() {
        let d = dag();
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let (a, ran) = admit(&pool(), "j", &d, &planned(true), &ag, &quiet, &no_replan)
            .await
            .expect("admitted");
        assert_eq!(a.used, Used::Best);
        assert!(a.notes.is_empty(), "{:?}", a.notes);
        assert_eq!(ran.outcome.best, outcome(true).best);
        let mut both = a.hosts[0].clone();
        both.sort();
        assert_eq!(both, vec![0, 1], "both large agents, one VM each");
        assert_eq!(a.hosts[1], vec![2]);
        assert_eq!(a.hosts[2], a.hosts[1], "vm-storage continues on b's VM");
        assert_eq!(a.methods, vec![Method::Direct, Method::VmStorage]);
        assert_eq!(
            a.memory_limit_mb,
            vec![DEFAULT_MEMORY_MB, 3000, DEFAULT_MEMORY_MB]
        );
        assert_eq!(a.vm_storage_senders(&d, 2), vec![(1, &[2usize][..])]);
        assert_eq!(a.permits(0).values().sum::<usize>(), 2);
    }

    #[tokio::test]
    async fn a_short_pool_re_plans_within_what_it_has() {
        let d = dag();
        // No xlarge agent: the best plan's b and c can never be granted.
        let ag = agents(&["m5.large", "m5.large"]);
        let asked = std::sync::Mutex::new(Vec::new());
        let replan = |limits: &BTreeMap<String, u32>| {
            asked.lock().expect("lock").push(limits.clone());
            let mut p = planned(false);
            for st in &mut p.outcome.best.stages {
                st.vm_type = "m5.large".into();
            }
            // Within the limits: a's two VMs and b's one would be three large ones at once
            // over a direct edge; the planner under limits sends a -> b remote.
            p.outcome.best.edges[0].method = Method::Remote;
            Ok(p)
        };
        let (a, ran) = admit(&pool(), "j", &d, &planned(true), &ag, &quiet, &replan)
            .await
            .expect("admitted");
        assert_eq!(
            asked.lock().expect("lock").clone(),
            vec![BTreeMap::from([
                ("m5.large".to_owned(), 2),
                ("m5.xlarge".to_owned(), 0)
            ])]
        );
        assert!(
            ran.outcome
                .best
                .stages
                .iter()
                .all(|s| s.vm_type == "m5.large")
        );
        assert_eq!(a.used, Used::Best);
        assert!(
            a.notes[0].starts_with("re-planned for at most 2 m5.large, 0 m5.xlarge: b wants 1 m5.xlarge VMs, the pool has 0"),
            "{:?}",
            a.notes
        );
        assert!(a.hosts.iter().flatten().all(|&h| h < 2));
    }

    /// A host platform's manager, scripted: its answers in order, and the offers it saw.
    #[derive(Debug, Default)]
    struct Scripted {
        answers: std::sync::Mutex<Vec<Answer>>,
        offered: std::sync::Mutex<Vec<(Plan, bool)>>,
    }

    impl ResourceManager for Scripted {
        fn offer<'a>(
            &'a self,
            offer: &'a Offer,
            _waiting: &'a (dyn Fn(&str) + Send + Sync),
        ) -> crate::resources::BoxFuture<'a, Result<Answer, crate::resources::ResourceError>>
        {
            self.offered
                .lock()
                .expect("lock")
                .push((offer.plan.clone(), offer.second_best.is_some()));
            let a = self.answers.lock().expect("lock").remove(0);
            Box::pin(async move { Ok(a) })
        }

        fn release(&self, _job: &str) {}

        fn slot<'a>(
            &'a self,
            _job: &'a str,
            _agent: &'a AgentSlot,
            _memory_mb: u64,
        ) -> crate::resources::BoxFuture<
            'a,
            Result<crate::resources::Slot, crate::resources::ResourceError>,
        > {
            Box::pin(async { Ok(crate::resources::Slot::unlimited()) })
        }
    }

    #[tokio::test]
    async fn a_refused_best_plan_is_followed_by_the_second_best() {
        let d = dag();
        let ag = agents(&["m5.large", "m5.large", "m5.xlarge"]);
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let host = Scripted {
            answers: std::sync::Mutex::new(vec![
                Answer::RefuseBest {
                    why: "the xlarge machine is booked".into(),
                },
                Answer::Grant(Grant {
                    hosts: vec![ids(&["a-1", "a-0"]), ids(&["a-2"]), ids(&["a-0"])],
                    notes: vec!["started 1 machine".into()],
                }),
            ]),
            ..Scripted::default()
        };
        let (a, _) = admit(&host, "j", &d, &planned(true), &ag, &quiet, &no_replan)
            .await
            .expect("admitted");
        let offered = host.offered.lock().expect("lock").clone();
        assert_eq!(offered.len(), 2);
        assert_eq!(
            offered[0],
            (outcome(true).best, true),
            "best, with the hint"
        );
        assert_eq!(
            offered[1].0,
            outcome(true).second_best.expect("second"),
            "then the second-best"
        );
        assert_eq!(a.used, Used::SecondBest);
        assert_eq!(a.hosts, vec![vec![1, 0], vec![2], vec![0]]);
        assert_eq!(a.methods, vec![Method::Direct, Method::Direct]);
        assert_eq!(
            a.notes,
            vec![
                "best plan refused (the xlarge machine is booked): the second-best plan runs"
                    .to_owned(),
                "started 1 machine".to_owned()
            ]
        );

        // Refused with no second-best plan, or a grant naming an agent that is not alive.
        let host = Scripted {
            answers: std::sync::Mutex::new(vec![Answer::RefuseBest { why: "no".into() }]),
            ..Scripted::default()
        };
        let err = admit(&host, "j", &d, &planned(false), &ag, &quiet, &no_replan)
            .await
            .expect_err("refused");
        assert!(err.contains("there is no second-best plan"), "{err}");
        let host = Scripted {
            answers: std::sync::Mutex::new(vec![Answer::Grant(Grant {
                hosts: vec![ids(&["a-0", "a-9"]), ids(&["a-2"]), ids(&["a-2"])],
                notes: Vec::new(),
            })]),
            ..Scripted::default()
        };
        let err = admit(&host, "j", &d, &planned(false), &ag, &quiet, &no_replan)
            .await
            .expect_err("unknown agent");
        assert!(err.contains("agent a-9, which is not alive"), "{err}");
    }
}
