//! Pre-warming (ORION's idea, seed paper ch. 6.4.4): while a stage runs, the agents that will run
//! the stages reading from it are asked (`POST /v1/prewarm`) to start the containers (prepare the
//! process environments) of those stages, so that their instances start hot rather than cold.
//!
//! Which agents and how many: a planned job's grant says it (the hosts of the next stage, as many
//! per agent as the plan runs there at once, with the plan's memory limit); an unplanned job's
//! instances go where [`crate::exec::requests::place`] puts them, at most one per vCPU of the agent's type at
//! once. The requests carry the function's identity (`jobs::function_key`), image, command and
//! the limits its runs will have, since a warm container serves only runs with the same ones.
//! Prewarming is best effort: a refusal or an unreachable agent only costs a cold start.
//! Switched by `JobsConfig::prewarm`.
//!
//! **Timed** (ORION §6.4.4, `JobsConfig::prewarm_timed`): for a planned job the calls for a
//! receiving stage are not sent when its sender starts but when the plan predicts its
//! containers must start to be ready for it ([`timed_delays`]): the gap the plan predicts
//! between the two stages' starts, less the receiver's cold start with a margin. Its containers
//! then do not sit started and idle for the rest of the gap; the job's plan notes say how long
//! each waits and the idle container-seconds that saves.

use std::collections::BTreeMap;
use std::time::Duration;

use sonic_api::agent::{MAX_PREWARM, PrewarmRequest};
use sonic_core::dag::Fanout;

use crate::exec::Runtime;
use crate::exec::requests::{DEFAULT_MEMORY_MB, StageContext, function_key, place};
use crate::resources::planned::Allocation;

/// How long one prewarm call may take (containers start in the agent before it answers).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A timed prewarm is sent this many cold starts ahead of the receiver's predicted start
/// ([`timed_delay`]): the cold start varies, and a late prewarm costs a cold start.
pub const LEAD_COLD_STARTS: f64 = 2.0;

/// And this much earlier again (the call's own round trip, the predictions' noise).
pub const LEAD_SLACK_S: f64 = 0.25;

/// How long after its sender starts a receiver's prewarm is sent: `gap_s` (the plan's
/// predicted time from the sender's start to the receiver's), less [`LEAD_COLD_STARTS`] times
/// the receiver's cold start `cold_start_s` and [`LEAD_SLACK_S`]; at once when that is not
/// positive (or a figure is not a finite number).
pub fn timed_delay(gap_s: f64, cold_start_s: f64) -> Duration {
    let wait = gap_s - LEAD_COLD_STARTS * cold_start_s.max(0.0) - LEAD_SLACK_S;
    if wait.is_finite() && wait > 0.0 {
        Duration::from_secs_f64(wait)
    } else {
        Duration::ZERO
    }
}

/// Per (sender, receiver) stage pair of `dag` (function indices), how long after the sender
/// starts the receiver's prewarm is sent ([`timed_delay`]), from `plan`'s predicted timing and
/// what each receiver's containers take to become warm (`params`): its cold start, or its cold
/// time less its hot time where that is longer (a handler's runtime imports its module when it
/// is prewarmed, which its cold runs pay). Pairs the plan does not time are absent (sent at
/// once).
pub fn timed_delays(
    dag: &sonic_core::dag::Dag,
    plan: &sonic_core::planner::Plan,
    params: &sonic_core::params::Params,
) -> BTreeMap<(usize, usize), Duration> {
    let start = |i: usize| {
        let name = &dag.functions[i].name;
        plan.timing
            .iter()
            .find(|t| &t.function == name)
            .map(|t| t.start_s)
    };
    let mut out = BTreeMap::new();
    for e in &dag.edges {
        let (Some(from), Some(to)) = (start(e.from), start(e.to)) else {
            continue;
        };
        let cold_start = params
            .functions
            .get(&dag.functions[e.to].name)
            .map_or(0.0, |f| f.start_s.max(f.cold_s - f.hot_s));
        out.insert((e.from, e.to), timed_delay(to - from, cold_start));
    }
    out
}

/// One prewarm call to make: to which of the job's agents (index into `StageContext::agents`),
/// with what body.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The receiving stage (function index) it prewarms.
    pub stage: usize,
    /// Index into the job's agents.
    pub agent: usize,
    /// What to ask that agent for.
    pub request: PrewarmRequest,
}

/// The prewarm calls for stage `j` (a stage reading from one that starts now): per agent, the
/// containers its instances will need there at once.
pub fn targets(
    ctx: &StageContext<'_>,
    j: usize,
    alloc: Option<&Allocation>,
    vcpus: impl Fn(usize) -> Option<u32>,
) -> Vec<Target> {
    let f = &ctx.dag.functions[j];
    // A handler stage: the agent starts its instances' Python runtimes (imports `f.py`).
    let handler = match f.handler {
        Some(_) => match ctx.handlers.get(&j) {
            Some(h) => Some(h.clone()),
            None => return Vec::new(),
        },
        None => None,
    };
    let instances = match ctx.fanouts.get(j) {
        Some(Fanout::Known(n)) => Some(*n),
        // One per file the sender writes: not known before it ran.
        _ => None,
    };
    // Per agent: how many at once, and the memory limit of the runs.
    let (per_agent, memory_limit_mb, cpus): (BTreeMap<usize, u32>, u64, f64) = match alloc {
        Some(a) => {
            let Some(hosts) = a.hosts.get(j).filter(|h| !h.is_empty()) else {
                return Vec::new();
            };
            let mut placed: BTreeMap<usize, u32> = BTreeMap::new();
            match instances {
                Some(n) => {
                    for k in 0..n {
                        *placed.entry(a.host(j, k, n)).or_insert(0) += 1;
                    }
                }
                None => {
                    for &h in hosts {
                        placed.entry(h).or_insert(0);
                    }
                }
            }
            let at_once = a.permits(j);
            let per_agent = placed
                .into_iter()
                .map(|(agent, n)| {
                    let most = at_once.get(&agent).copied().unwrap_or(1) as u32;
                    (
                        agent,
                        if instances.is_some() {
                            n.min(most)
                        } else {
                            most
                        },
                    )
                })
                .collect();
            let memory = a
                .memory_limit_mb
                .get(j)
                .copied()
                .unwrap_or(DEFAULT_MEMORY_MB);
            (per_agent, memory, a.cpus.get(j).copied().unwrap_or(1.0))
        }
        None => {
            let Some(n) = instances else {
                return Vec::new();
            };
            if ctx.agents.is_empty() {
                return Vec::new();
            }
            let mut placed: BTreeMap<usize, u32> = BTreeMap::new();
            for k in 0..n {
                *placed
                    .entry(place(ctx.policy, ctx.agents.len(), j, k))
                    .or_insert(0) += 1;
            }
            let per_agent = placed
                .into_iter()
                .map(|(agent, n)| (agent, n.min(vcpus(agent).unwrap_or(1).max(1))))
                .collect();
            (per_agent, DEFAULT_MEMORY_MB, 1.0)
        }
    };
    let mut out = Vec::new();
    for (agent, count) in per_agent {
        if count == 0 {
            continue;
        }
        out.push(Target {
            stage: j,
            agent,
            request: PrewarmRequest {
                function_key: function_key(ctx.dag, j),
                image: f.image.clone(),
                command: f.command.clone(),
                count: count.min(MAX_PREWARM),
                memory_limit_mb,
                // As the executor gives every run: the plan's, at most the agent's vCPUs.
                cpus: cpus
                    .min(vcpus(agent).map_or(f64::INFINITY, f64::from))
                    .max(1.0),
                output_quota_mb: None,
                handler: handler.clone(),
            },
        });
    }
    out
}

/// Sends, in the background and after `delay`, the prewarm calls for stage `j`
/// ([`targets`]): the job machine's [`sonic_core::machine::Action::Prewarm`].
pub fn stage(
    rt: &Runtime,
    ctx: &StageContext<'_>,
    j: usize,
    alloc: Option<&Allocation>,
    delay: Duration,
) {
    let vcpus =
        |agent: usize| crate::exec::agent_vcpus(rt.catalog.as_ref(), ctx.agents.get(agent)?);
    let calls: Vec<(String, String, PrewarmRequest)> = targets(ctx, j, alloc, vcpus)
        .into_iter()
        .filter_map(|t| {
            let agent = ctx.agents.get(t.agent)?;
            Some((agent.id.clone(), agent.url.clone(), t.request))
        })
        .collect();
    if calls.is_empty() {
        return;
    }
    let http = rt.http().clone();
    let token = rt.config.agent_token.clone();
    let job = ctx.job_id.to_owned();
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let sent = calls
            .iter()
            .map(|(agent, url, body)| send(&http, &token, &job, agent, url, body));
        futures::future::join_all(sent).await;
    });
}

/// One prewarm call; its outcome is logged only.
async fn send(
    http: &reqwest::Client,
    token: &str,
    job: &str,
    agent: &str,
    url: &str,
    body: &PrewarmRequest,
) {
    let answer = http
        .post(format!("{}/v1/prewarm", url.trim_end_matches('/')))
        .bearer_auth(token)
        .timeout(CALL_TIMEOUT)
        .json(body)
        .send()
        .await;
    match answer {
        Ok(r) if r.status().is_success() => {
            let done = r.json::<sonic_api::agent::Prewarmed>().await.ok();
            tracing::debug!(job, agent, key = %body.function_key, count = body.count,
                started = done.as_ref().map(|d| d.started), "prewarmed");
        }
        Ok(r) => {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            tracing::warn!(job, agent, key = %body.function_key, %status, answer = %text, "prewarm refused");
        }
        Err(e) => {
            tracing::warn!(job, agent, key = %body.function_key, error = %e, "prewarm failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::requests::Policy;
    use crate::store::AgentSlot;
    use sonic_api::agent::HandlerRun;
    use sonic_core::dag::Dag;

    const DAG: &str = r#"
name: t
params: { n: 3 }
functions:
  - { name: gen, image: i, command: [synthetic, run, --to, mid] }
  - { name: mid, image: i, command: [synthetic, run, --to, sink], instances: "{{ params.n }}" }
  - { name: sink, image: i, command: [synthetic, run] }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

    /// A parsed DAG, its default parameters and fanouts, and agents of one type: what a
    /// `StageContext` borrows.
    struct Setup {
        dag: Dag,
        params: serde_json::Map<String, serde_json::Value>,
        fanouts: Vec<Fanout>,
        agents: Vec<AgentSlot>,
    }

    impl Setup {
        fn new(yaml: &str, agent_ids: &[&str]) -> Self {
            let dag = Dag::from_yaml("t.yaml", yaml).expect("dag");
            let params = dag.job_params(&Default::default());
            let fanouts = dag.fanouts(&params).expect("fanouts");
            let agents = agent_ids
                .iter()
                .map(|id| AgentSlot {
                    vcpus: None,
                    id: (*id).into(),
                    url: format!("http://{id}"),
                    vm_type: "m5.large".into(),
                })
                .collect();
            Setup {
                dag,
                params: params.into_iter().collect(),
                fanouts,
                agents,
            }
        }

        /// An unplanned (`remote`) job's context at its start.
        fn ctx<'a>(&'a self, handlers: &'a BTreeMap<usize, HandlerRun>) -> StageContext<'a> {
            StageContext {
                job_id: "j-1",
                dag: &self.dag,
                params: &self.params,
                fanouts: &self.fanouts,
                methods: &[],
                policy: Policy::Remote,
                agents: &self.agents,
                produced: &[],
                inputs: &[],
                file_key: b"k",
                token_expiry: 0,
                handlers,
                secrets: &crate::exec::requests::NO_SECRETS,
            }
        }
    }

    #[test]
    fn unplanned_stages_are_prewarmed_where_their_instances_go() {
        let setup = Setup::new(DAG, &["a-1", "a-2"]);
        let handlers = BTreeMap::new();
        let ctx = setup.ctx(&handlers);
        let dag = &setup.dag;
        // mid (read from gen): the 3 mids go to agents 1, 0, 1 (`jobs::place`), at most 1 at
        // once on agent 1 here (1 vCPU), 1 on agent 0.
        let got = targets(&ctx, 1, None, |a| Some(if a == 0 { 4 } else { 1 }));
        let counts: Vec<(usize, u32)> = got.iter().map(|t| (t.agent, t.request.count)).collect();
        assert_eq!(counts, vec![(0, 1), (1, 1)]);
        let r = &got[0].request;
        assert_eq!(r.function_key, crate::exec::requests::function_key(dag, 1));
        assert_eq!(r.command, dag.functions[1].command);
        assert_eq!((r.memory_limit_mb, r.cpus), (DEFAULT_MEMORY_MB, 1.0));
        // The same warm key as the runs the executor will send.
        let runs = crate::exec::requests::instance_runs(&ctx, 1, 3, [0]).expect("runs");
        assert_eq!(r.warm_key(), runs[0].request.warm_key());
        // The sink (read from mid), once. Which stages are prewarmed when (none reads from the
        // sink) is the job machine's decision (`machine::Action::Prewarm`), tested there.
        let got = targets(&ctx, 2, None, |_| Some(2));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request.count, 1);
    }

    /// A handler stage's prewarm names its handler (the agent starts the runtimes) and serves
    /// the warm key of its runs; one whose handler was not resolved is not prewarmed.
    #[test]
    fn handler_stages_are_prewarmed_with_their_handler() {
        let yaml = "name: h\nfunctions:\n  - { name: gen, image: i, command: [synthetic, run, --to, py] }\n  - { name: py, handler: py-count }\nedges:\n  - { from: gen, to: py, kind: one }\n";
        let setup = Setup::new(yaml, &["a-1"]);
        let handler = HandlerRun {
            name: "py-count".into(),
            sha256: "b".repeat(64),
            key: sonic_api::agent::handler_key(&"b".repeat(64)),
            routes: BTreeMap::from([("result".to_owned(), "result".to_owned())]),
        };
        let handlers = BTreeMap::from([(1, handler.clone())]);
        let mut ctx = setup.ctx(&handlers);
        let got = targets(&ctx, 1, None, |_| Some(2));
        assert_eq!(got.len(), 1);
        let r = &got[0].request;
        assert_eq!(r.handler.as_ref(), Some(&handler));
        assert!(r.image.is_empty() && r.command.is_empty(), "{r:?}");
        let runs = crate::exec::requests::instance_runs(&ctx, 1, 1, [0]).expect("runs");
        assert_eq!(r.warm_key(), runs[0].request.warm_key());
        let none = BTreeMap::new();
        ctx.handlers = &none;
        assert!(targets(&ctx, 1, None, |_| Some(2)).is_empty());
    }

    /// Timed prewarm: sent the predicted gap less two cold starts and a slack after the sender
    /// starts, never before it; pairs come from the plan's timing and the receivers' cold starts.
    #[test]
    fn a_receivers_prewarm_waits_until_its_containers_must_start() {
        assert_eq!(timed_delay(3.0, 0.5), Duration::from_secs_f64(1.75));
        assert_eq!(timed_delay(1.0, 0.5), Duration::ZERO);
        assert_eq!(timed_delay(f64::NAN, 0.5), Duration::ZERO);
        assert_eq!(timed_delay(2.0, -1.0), Duration::from_secs_f64(1.75));
        let setup = Setup::new(DAG, &["a-1"]);
        let timing = |f: &str, start_s: f64| sonic_core::planner::StageTiming {
            function: f.into(),
            ready_s: 0.0,
            start_s,
            upload_s: 0.0,
            wait_s: 0.0,
            overhead_s: 0.0,
            fetch_s: 0.0,
            compute_s: 0.0,
            end_s: 0.0,
            batches: 1,
        };
        let plan = sonic_core::planner::Plan {
            stages: Vec::new(),
            edges: Vec::new(),
            predicted: sonic_core::planner::Predicted {
                latency_s: 10.0,
                cost_usd: 1.0,
                perf_per_dollar: 0.1,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: vec![timing("gen", 0.0), timing("mid", 4.0), timing("sink", 4.5)],
        };
        let mut params = sonic_core::params::Params::default();
        for (name, start_s) in [("gen", 0.3), ("mid", 1.0), ("sink", 0.2)] {
            params.functions.insert(
                name.into(),
                sonic_core::params::FunctionParams {
                    parallel: 0.0,
                    memory_mb: 100.0,
                    cold_s: 1.0,
                    hot_s: 0.5,
                    instances: 1,
                    overhead_s: 0.0,
                    overhead_hot_s: None,
                    start_s,
                    cold_dist: None,
                    hot_dist: None,
                },
            );
        }
        let d = timed_delays(&setup.dag, &plan, &params);
        // gen -> mid: 4 s predicted, mid starts its containers in 1 s (more than its cold
        // time less its hot time, 0.5 s): sent 1.75 s after gen.
        assert_eq!(d.get(&(0, 1)), Some(&Duration::from_secs_f64(1.75)));
        // mid -> sink: 0.5 s apart, sink's cold start 0.2 s: at once.
        assert_eq!(d.get(&(1, 2)), Some(&Duration::ZERO));
        // A sink whose cold runs pay 1.5 s more than its hot ones (an import), 4 s after mid:
        // sent 4 - 2 x 1.5 - 0.25 = 0.75 s after mid.
        let later = sonic_core::planner::Plan {
            timing: vec![timing("gen", 0.0), timing("mid", 4.0), timing("sink", 8.0)],
            ..plan.clone()
        };
        if let Some(f) = params.functions.get_mut("sink") {
            f.cold_s = 2.0;
        }
        let d = timed_delays(&setup.dag, &later, &params);
        assert_eq!(d.get(&(1, 2)), Some(&Duration::from_secs_f64(0.75)));
        // A plan without timing (recorded before it was kept): nothing timed.
        let untimed = sonic_core::planner::Plan {
            timing: Vec::new(),
            ..plan
        };
        assert!(timed_delays(&setup.dag, &untimed, &params).is_empty());
    }
}
