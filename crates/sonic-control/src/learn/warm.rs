//! What the pool holds warm: per agent and function, the idle warm containers (process
//! environments) the agent said it kept once a run of the function ended (`RunReport::warm`).
//!
//! Agents keep a function's containers warm across its jobs for a keep-alive
//! (`sonic_core::warm`); a planned job whose VMs hold enough of them starts its stages hot. The
//! planner prices a stage's first batch hot where the pool's warm environments cover it
//! ([`sonic_core::model::PlanProblem::with_warm`]) and the resource manager then prefers those
//! agents ([`crate::resources::Offer::warm`]). Only runs that share containers across jobs are
//! recorded (a profiling job's runs are keyed by their job). An entry is the agent's latest word
//! for the key and ends with the keep-alive the agent reported; it can be wrong in between (an
//! agent evicting containers for memory, another job taking them): then a stage priced hot
//! starts cold, as before.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use sonic_api::agent::WarmIdle;
use sonic_core::dag::Dag;
use sonic_core::params::Params;

use crate::store::{AgentSlot, Db, StoreError};

/// The most (agent, function) entries the ledger keeps; past it the ones ending soonest go.
pub const MAX_ENTRIES: usize = 16_384;

/// The identity of function `i` across jobs (`sonic_api::agent::function_key`): the DAG's name,
/// the function's and a hash of its definition; the agents keep its containers warm across jobs.
pub fn function_key(dag: &Dag, i: usize) -> String {
    let f = &dag.functions[i];
    let definition = serde_json::to_vec(f).unwrap_or_default();
    sonic_api::agent::function_key(&dag.name, &f.name, &definition)
}

/// What runs of DAG function `i` with this memory limit share warm containers under: the
/// function's identity across jobs (`jobs::function_key`, which hashes its definition: image
/// and command), for a handler stage the digest of its code (a new version gets containers of
/// its own), and the limit its containers were made with (the CPU limit is the same for every
/// run).
pub fn key(dag: &Dag, i: usize, handler_digest: Option<&str>, memory_limit_mb: u64) -> String {
    format!(
        "{}|{}|{memory_limit_mb}",
        function_key(dag, i),
        handler_digest.unwrap_or("")
    )
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    idle: u32,
    /// The agent's order of its counts (`WarmIdle::seq`).
    seq: u64,
    /// When the agent drops them if no run comes (ms since the epoch, the control plane's clock).
    until_ms: i64,
}

/// The agents' latest word on what they keep warm (see the module's documentation), less what
/// jobs granted those agents are about to take.
#[derive(Debug, Default)]
pub struct WarmLedger {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per (agent, key): its latest word.
    entries: HashMap<(String, String), Seen>,
    /// Per (agent, key): per job, the warm containers the job was granted the agent for and
    /// has not started on yet ([`WarmLedger::claim`]).
    claims: HashMap<(String, String), BTreeMap<String, u32>>,
}

impl State {
    fn claimed(&self, k: &(String, String)) -> u32 {
        self.claims
            .get(k)
            .map_or(0, |c| c.values().fold(0u32, |a, n| a.saturating_add(*n)))
    }

    fn idle(&self, k: &(String, String), now_ms: i64) -> u32 {
        self.entries
            .get(k)
            .filter(|s| s.until_ms > now_ms)
            .map_or(0, |s| s.idle.saturating_sub(self.claimed(k)))
    }
}

impl WarmLedger {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what `agent` said it keeps for `key` once a run ended at `now_ms`; a count the
    /// agent took before the one recorded (reports of runs that ended together, read out of
    /// order) changes nothing.
    pub fn observe(&self, agent: &str, key: String, warm: WarmIdle, now_ms: i64) {
        let keep_ms = i64::try_from(warm.keep_alive_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let seen = Seen {
            idle: warm.idle,
            seq: warm.seq,
            until_ms: now_ms.saturating_add(keep_ms),
        };
        let mut state = self.state();
        let entries = &mut state.entries;
        let k = (agent.to_owned(), key);
        if let Some(old) = entries.get(&k)
            && seen.seq != 0
            && old.seq > seen.seq
            && old.until_ms > now_ms
        {
            return;
        }
        entries.insert(k, seen);
        if entries.len() > MAX_ENTRIES {
            entries.retain(|_, s| s.until_ms > now_ms);
            while entries.len() > MAX_ENTRIES {
                let Some(k) = entries
                    .iter()
                    .min_by_key(|(_, s)| s.until_ms)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                entries.remove(&k);
            }
        }
    }

    /// Forgets what `agent` kept (it restarted or was lost: its containers went with it).
    pub fn forget_agent(&self, agent: &str) {
        let mut state = self.state();
        state.entries.retain(|(a, _), _| a != agent);
        state.claims.retain(|(a, _), _| a != agent);
    }

    /// The idle warm environments `agent` keeps for `key` at `now_ms`, less those claimed by
    /// jobs granted the agent that have not started on it yet.
    pub fn idle(&self, agent: &str, key: &str, now_ms: i64) -> u32 {
        self.state()
            .idle(&(agent.to_owned(), key.to_owned()), now_ms)
    }

    /// `job` was granted `agent` for a stage whose first batch runs `want` lambdas of `key`
    /// there: it takes up to that many of the agent's unclaimed idle warm environments, which
    /// the plans of other jobs no longer count ([`WarmLedger::idle`]) until the job's first
    /// report of `key` from the agent ([`WarmLedger::started`]) or its end
    /// ([`WarmLedger::release_job`]). Without it, a job planned while another was starting
    /// was priced on that one's containers, and then started cold. Returns how many it took.
    pub fn claim(&self, job: &str, agent: &str, key: &str, want: u32, now_ms: i64) -> u32 {
        let mut state = self.state();
        let k = (agent.to_owned(), key.to_owned());
        let n = state.idle(&k, now_ms).min(want);
        if n > 0 {
            let mine = state
                .claims
                .entry(k)
                .or_default()
                .entry(job.to_owned())
                .or_insert(0);
            *mine = mine.saturating_add(n);
        }
        n
    }

    /// A run of `job` for `key` on `agent` reported: the agent's counts say from now on what the
    /// job took, so its claim there ends.
    pub fn started(&self, job: &str, agent: &str, key: &str) {
        let mut state = self.state();
        if state.claims.is_empty() {
            // Every report of a planned job comes here: no key built when nothing is claimed.
            return;
        }
        let k = (agent.to_owned(), key.to_owned());
        if let Some(c) = state.claims.get_mut(&k) {
            c.remove(job);
            if c.is_empty() {
                state.claims.remove(&k);
            }
        }
    }

    /// `job` ended (or gave its grant back): whatever it still claimed is free again.
    pub fn release_job(&self, job: &str) {
        self.state().claims.retain(|_, c| {
            c.remove(job);
            !c.is_empty()
        });
    }

    /// What `agents` keep warm for each function of `dag` whose runs get these memory limits
    /// (per DAG function index) and, for handler stages, these code digests (by function
    /// index; a handler stage without one counts as keeping nothing), at `now_ms`.
    pub fn pool(
        &self,
        dag: &Dag,
        memory_limit_mb: &[u64],
        digests: &BTreeMap<usize, String>,
        agents: &[AgentSlot],
        now_ms: i64,
    ) -> WarmPool {
        let mut functions = BTreeMap::new();
        for (i, f) in dag.functions.iter().enumerate() {
            let Some(&mem) = memory_limit_mb.get(i) else {
                continue;
            };
            let digest = digests.get(&i).map(String::as_str);
            if f.handler.is_some() && digest.is_none() {
                continue;
            }
            let k = key(dag, i, digest, mem);
            let on: BTreeMap<String, (String, u32)> = agents
                .iter()
                .filter_map(|a| {
                    let n = self.idle(&a.id, &k, now_ms);
                    (n > 0).then(|| (a.id.clone(), (a.vm_type.clone(), n)))
                })
                .collect();
            if !on.is_empty() {
                functions.insert(f.name.clone(), on);
            }
        }
        WarmPool {
            functions,
            prewarm: false,
        }
    }
}

/// What planning sees warm now: the ledger's entries for the agents alive now.
#[derive(Debug)]
pub struct Source<'a> {
    ledger: Option<&'a WarmLedger>,
    agents: Vec<AgentSlot>,
    now_ms: i64,
    prewarm: bool,
    /// Per handler stage (function index), the digest of its code.
    digests: BTreeMap<usize, String>,
}

impl Source<'static> {
    /// Nothing warm and nothing prewarmed (plans price every stage's first batch cold).
    pub fn none() -> Source<'static> {
        Source {
            ledger: None,
            agents: Vec::new(),
            now_ms: 0,
            prewarm: false,
            digests: BTreeMap::new(),
        }
    }
}

impl<'a> Source<'a> {
    /// The ledger's entries for the agents of `db` alive at `now_ms` (a heartbeat within
    /// `timeout`); nothing without a ledger (a control plane that runs no jobs). `prewarm`: the
    /// executor starts a stage's containers while its senders run (`JobsConfig::prewarm`).
    /// `digests`: the code digest of each handler stage (by function index), as the job's runs
    /// will carry it.
    pub fn alive(
        db: &Db,
        ledger: Option<&'a WarmLedger>,
        now_ms: i64,
        timeout: std::time::Duration,
        prewarm: bool,
        digests: BTreeMap<usize, String>,
    ) -> Result<Source<'a>, StoreError> {
        let agents = match ledger {
            None => Vec::new(),
            Some(_) => db
                .list_agents()?
                .into_iter()
                .filter(|a| a.alive(now_ms, timeout))
                .map(AgentSlot::from)
                .collect(),
        };
        Ok(Source {
            ledger,
            agents,
            now_ms,
            prewarm: prewarm && ledger.is_some(),
            digests,
        })
    }

    /// What the agents keep warm for `dag`'s functions, whose runs get the memory limits these
    /// predicted parameters give them (`planned::memory_limits`).
    pub fn pool(&self, dag: &Dag, params: &Params) -> WarmPool {
        let mut pool = match self.ledger {
            None => WarmPool::default(),
            Some(l) => l.pool(
                dag,
                &crate::learn::memory_limits(dag, params),
                &self.digests,
                &self.agents,
                self.now_ms,
            ),
        };
        pool.prewarm = self.prewarm;
        pool
    }
}

/// What the alive agents keep warm for a DAG's functions when a job was planned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmPool {
    /// Per function name: per agent id, its VM type and how many idle warm environments of the
    /// function it keeps (agents with none left out).
    pub functions: BTreeMap<String, BTreeMap<String, (String, u32)>>,
    /// The executor starts each stage's containers while its senders run (prewarming), so the
    /// plan prices those stages' first batches without the cold start.
    pub prewarm: bool,
}

impl WarmPool {
    /// Per function and VM type, one count per agent: what
    /// [`sonic_core::model::PlanProblem::with_warm`] takes.
    pub fn by_type(&self) -> BTreeMap<String, BTreeMap<String, Vec<u32>>> {
        self.functions
            .iter()
            .map(|(f, on)| {
                let mut types: BTreeMap<String, Vec<u32>> = BTreeMap::new();
                for (vm_type, n) in on.values() {
                    types.entry(vm_type.clone()).or_default().push(*n);
                }
                (f.clone(), types)
            })
            .collect()
    }

    /// The pool as a plan report shows it (`warm_pool`): per function, one entry per agent
    /// keeping idle warm environments of it.
    pub fn report(&self) -> BTreeMap<String, Vec<sonic_api::plan::WarmAgent>> {
        self.functions
            .iter()
            .map(|(f, on)| {
                let agents = on
                    .iter()
                    .map(|(agent, (vm_type, idle))| sonic_api::plan::WarmAgent {
                        agent: agent.clone(),
                        vm_type: vm_type.clone(),
                        idle: *idle,
                    })
                    .collect();
                (f.clone(), agents)
            })
            .collect()
    }

    /// How many idle warm environments of `function` `agent` keeps.
    pub fn on(&self, function: &str, agent: &str) -> u32 {
        self.functions
            .get(function)
            .and_then(|on| on.get(agent))
            .map_or(0, |(_, n)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAG: &str = "name: d\nfunctions:\n  - { name: a, image: i, command: [x] }\n  - { name: b, image: i, command: [y] }\nedges:\n  - { from: a, to: b, kind: one }\n";

    fn slot(id: &str, vm_type: &str) -> AgentSlot {
        AgentSlot {
            vcpus: None,
            id: id.into(),
            url: format!("http://{id}"),
            vm_type: vm_type.into(),
        }
    }

    fn warm(idle: u32) -> WarmIdle {
        WarmIdle {
            idle,
            keep_alive_s: 60,
            seq: 0,
        }
    }

    #[test]
    fn the_pool_is_the_agents_latest_word_until_its_keep_alive_ends() {
        let dag = Dag::from_yaml("d.yaml", DAG).unwrap();
        let ledger = WarmLedger::default();
        let agents = [
            slot("x", "m5.large"),
            slot("y", "m5.large"),
            slot("z", "c5.large"),
        ];
        let limits = [512, 512];
        let none = BTreeMap::new();
        ledger.observe("x", key(&dag, 0, None, 512), warm(2), 0);
        ledger.observe("y", key(&dag, 0, None, 512), warm(1), 0);
        ledger.observe("y", key(&dag, 0, None, 512), warm(3), 1_000);
        ledger.observe("z", key(&dag, 0, None, 512), warm(1), 0);
        // Another memory limit is another container: not b's either.
        ledger.observe("x", key(&dag, 1, None, 1024), warm(4), 0);
        let pool = ledger.pool(&dag, &limits, &none, &agents, 30_000);
        assert_eq!(
            (pool.on("a", "x"), pool.on("a", "y"), pool.on("b", "x")),
            (2, 3, 0)
        );
        let by_type = pool.by_type();
        let mut large = by_type["a"]["m5.large"].clone();
        large.sort_unstable();
        assert_eq!(large, vec![2, 3]);
        assert_eq!(by_type["a"]["c5.large"], vec![1]);
        assert!(!by_type.contains_key("b"));
        assert_eq!(
            serde_json::to_value(pool.report()).expect("encodes"),
            serde_json::json!({ "a": [
                { "agent": "x", "vm_type": "m5.large", "idle": 2 },
                { "agent": "y", "vm_type": "m5.large", "idle": 3 },
                { "agent": "z", "vm_type": "c5.large", "idle": 1 },
            ] })
        );
        // x's entry ends 60 s after it was said, y's a second later.
        let pool = ledger.pool(&dag, &limits, &none, &agents, 60_500);
        assert_eq!((pool.on("a", "x"), pool.on("a", "y")), (0, 3));
        // An agent that says it keeps none, or is forgotten, has none.
        ledger.observe("y", key(&dag, 0, None, 512), warm(0), 2_000);
        ledger.forget_agent("z");
        let pool = ledger.pool(&dag, &limits, &none, &agents, 3_000);
        assert_eq!(
            (pool.on("a", "x"), pool.on("a", "y"), pool.on("a", "z")),
            (2, 0, 0)
        );
        // An agent that is not alive (not in `agents`) counts for nothing.
        let pool = ledger.pool(&dag, &limits, &none, &agents[1..], 3_000);
        assert_eq!(pool.on("a", "x"), 0);
        // Two runs ended together: the count taken last wins, whatever order their reports
        // are read in.
        let k = key(&dag, 1, None, 512);
        let seq = |idle, seq| WarmIdle { seq, ..warm(idle) };
        ledger.observe("y", k.clone(), seq(2, 11), 4_000);
        ledger.observe("y", k.clone(), seq(1, 10), 4_001);
        assert_eq!(ledger.idle("y", &k, 4_002), 2);
        ledger.observe("y", k.clone(), seq(0, 12), 4_003);
        assert_eq!(ledger.idle("y", &k, 4_004), 0);
    }

    #[test]
    fn a_handler_stage_is_warm_only_for_its_code_version() {
        let dag = Dag::from_yaml(
            "h.yaml",
            "name: h\nfunctions:\n  - { name: f, handler: ol-f }\n",
        )
        .unwrap();
        let ledger = WarmLedger::default();
        let agents = [slot("x", "m5.large")];
        ledger.observe("x", key(&dag, 0, Some("aaaa"), 512), warm(2), 0);
        let pool = |digests: &[(usize, &str)]| {
            let d = digests.iter().map(|(i, s)| (*i, (*s).to_owned())).collect();
            ledger.pool(&dag, &[512], &d, &agents, 1_000).on("f", "x")
        };
        assert_eq!(pool(&[(0, "aaaa")]), 2);
        // A new version of its code: none of the old containers serve it.
        assert_eq!(pool(&[(0, "bbbb")]), 0);
        // Not knowing its code, nothing is counted warm.
        assert_eq!(pool(&[]), 0);
    }

    /// A job granted an agent takes its warm containers out of the next plans' count until its
    /// first run there reports (the agent's count then says it) or it ends.
    #[test]
    fn a_granted_jobs_warm_containers_are_not_counted_for_others() {
        let ledger = WarmLedger::default();
        ledger.observe("x", "k".into(), warm(3), 0);
        ledger.observe("y", "k".into(), warm(1), 0);
        assert_eq!(ledger.claim("j1", "x", "k", 2, 10), 2);
        assert_eq!(ledger.idle("x", "k", 20), 1);
        // A second job takes what is left, no more.
        assert_eq!(ledger.claim("j2", "x", "k", 4, 20), 1);
        assert_eq!(ledger.idle("x", "k", 30), 0);
        assert_eq!(ledger.claim("j3", "x", "k", 1, 30), 0);
        // Nothing to take where nothing is warm; other agents and keys untouched.
        assert_eq!(ledger.claim("j1", "z", "k", 2, 30), 0);
        assert_eq!(
            (ledger.idle("y", "k", 30), ledger.idle("x", "other", 30)),
            (1, 0)
        );
        // j1's first run on x reported (with the agent's count after it): its claim ends.
        ledger.started("j1", "x", "k");
        ledger.observe("x", "k".into(), warm(2), 40);
        assert_eq!(
            ledger.idle("x", "k", 50),
            1,
            "2 idle, 1 still claimed by j2"
        );
        // j2 ended without a run there (cancelled): its claim goes.
        ledger.release_job("j2");
        assert_eq!(ledger.idle("x", "k", 60), 2);
        // A lost agent's claims go with its entries.
        assert_eq!(ledger.claim("j4", "y", "k", 1, 60), 1);
        ledger.forget_agent("y");
        ledger.observe("y", "k".into(), warm(1), 70);
        assert_eq!(ledger.idle("y", "k", 80), 1);
        assert!(ledger.state().claims.keys().all(|(a, _)| a != "y"));
    }

    #[test]
    fn the_ledger_is_bounded() {
        let ledger = WarmLedger::default();
        for n in 0..(MAX_ENTRIES + 10) {
            ledger.observe("a", format!("k{n}"), warm(1), n as i64);
        }
        assert_eq!(ledger.state().entries.len(), MAX_ENTRIES);
        // The ones ending soonest went.
        assert_eq!(ledger.idle("a", "k0", 0), 0);
        assert_eq!(ledger.idle("a", &format!("k{}", MAX_ENTRIES + 9), 0), 1);
    }
}
