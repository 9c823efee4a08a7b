//! One execution of a job, from its agents and grant to the machine's outcome.
//!
//! [`run`] prepares it ([`Execution::prepare`]: the DAG and agents as they are now, the plan the
//! resource manager grants, what an earlier control plane recorded, the job machine), then
//! [`Execution::dispatch`] carries out the machine's actions, each by one method, and tells it
//! what happened; [`Execution::finish`] turns the machine's outcome into the execution's.

use super::fetch::StageFetch;
use super::*;

/// Runs one execution of `job` (number `execution`), recording into `progress`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    state: &Arc<Context>,
    rt: &Arc<Runtime>,
    job: &JobRecord,
    inputs: &[JobInputFile],
    cancel: &CancellationToken,
    planned: Option<&Planned>,
    progress: &mut Progress,
    execution: u32,
    recorded: Recorded,
) -> Result<(), Failure> {
    let mut x = Execution::prepare(
        state, rt, job, inputs, cancel, planned, progress, execution, recorded,
    )
    .await?;
    let outcome = match x.dispatch().await {
        Ok(outcome) => outcome,
        Err(e) => {
            x.set.abort_all();
            return Err(e);
        }
    };
    x.finish(outcome).await
}

/// What a stage's requests are built from: the job, its plan and the files produced so far.
macro_rules! stage_context {
    ($x:expr) => {
        StageContext {
            job_id: &$x.job.id,
            dag: &$x.dag,
            params: &$x.params,
            fanouts: &$x.fanouts,
            methods: &$x.methods,
            policy: $x.policy,
            agents: &$x.agents,
            produced: &$x.produced,
            inputs: $x.inputs,
            file_key: &$x.rt.config.file_key,
            token_expiry: $x.expiry,
            handlers: &$x.handlers,
            secrets: &$x.secrets,
        }
    };
}

/// One execution under way: what it was prepared with and what it has done so far.
struct Execution<'a> {
    state: &'a Arc<Context>,
    rt: &'a Arc<Runtime>,
    job: &'a JobRecord,
    inputs: &'a [JobInputFile],
    cancel: &'a CancellationToken,
    progress: &'a mut Progress,
    execution: u32,
    dag: Dag,
    agents: Vec<AgentSlot>,
    fanouts: Vec<Fanout>,
    params: serde_json::Map<String, serde_json::Value>,
    policy: Policy,
    handlers: BTreeMap<usize, sonic_api::agent::HandlerRun>,
    /// The values of the secrets its functions name, by secret name.
    secrets: BTreeMap<String, String>,
    alloc: Option<Allocation>,
    methods: Vec<Method>,
    /// Per function, the files its instances produced.
    produced: Vec<Vec<Produced>>,
    expiry: u64,
    /// Unplanned: at most one lambda per vCPU of an agent's VM type, across the job's stages.
    vcpu_permits: HashMap<usize, Arc<Semaphore>>,
    /// Planned: what the grant reserved per agent.
    job_permits: HashMap<usize, Arc<Semaphore>>,
    /// What an earlier control plane recorded, by (function, instance), with its agent.
    recorded: HashMap<(usize, u32), (usize, InstanceRunRecord)>,
    shape: Shape,
    machine: JobMachine,
    opened: Vec<Option<Opened>>,
    seen_ended: Vec<bool>,
    /// Per instance: when it was first sent (monotonic, and wall clock for the record).
    first_sent: HashMap<(usize, u32), (Instant, i64)>,
    failures: HashMap<(usize, u32), InstanceFailure>,
    set: tokio::task::JoinSet<Attempted>,
    events: VecDeque<Event>,
    /// The job measures cold starts: its containers serve only itself, nothing is prewarmed.
    profiling: bool,
    /// Per function, what its runs' warm containers are recorded under (none when profiling).
    warm_keys: Vec<String>,
    /// Per instance that ended well and is not yet reported to the warm ledger
    /// ([`Action::WarmReported`]): its agent and what the agent said it keeps warm.
    warm_words: HashMap<(usize, u32), (usize, Option<sonic_api::agent::WarmIdle>)>,
    /// Unplanned, per function index: the CPUs each instance is given (a planned job's are its
    /// plan's).
    unplanned_cpus: Vec<f64>,
    /// Per instance that ran out of memory: the limit its next attempt gets ([`raised_memory`]).
    memory_raised: HashMap<(usize, u32), u64>,
}

impl<'a> Execution<'a> {
    /// The DAG and agents as they are now, the grant of a planned job, what an earlier control
    /// plane recorded of this execution, and the job machine to run it.
    #[allow(clippy::too_many_arguments)]
    async fn prepare(
        state: &'a Arc<Context>,
        rt: &'a Arc<Runtime>,
        job: &'a JobRecord,
        inputs: &'a [JobInputFile],
        cancel: &'a CancellationToken,
        planned: Option<&Planned>,
        progress: &'a mut Progress,
        execution: u32,
        recorded: Recorded,
    ) -> Result<Execution<'a>, Failure> {
        let Recorded {
            runs: recorded,
            hosts: recorded_hosts,
            methods: recorded_methods,
        } = recorded;
        let lost = progress.lost.clone();
        let now = state.clock.now_ms();
        let timeout = state.heartbeat_timeout;
        // The DAG as it is now (kept parsed: no blocking thread), the agents from their rows.
        let (parsed, agents) = tokio::join!(
            state.db.parsed_dag_at(&job.dag, job.dag_revision),
            state.db.run(|db| db.list_agents())
        );
        let agents = agents.map_err(|e| format!("database: {e}"))?;
        let mut dag = parsed
            .map_err(|e| format!("database: {e}"))?
            .ok_or_else(|| job.dag_missing())?
            .dag
            .clone();
        // Planned (and re-planned under the pool's limits) for the job's own objective, not
        // only its DAG's.
        dag.slo = job.slo;
        let mut agents: Vec<AgentSlot> = agents
            .into_iter()
            .filter(|a| a.alive(now, timeout) && !lost.contains(&a.id))
            .map(AgentSlot::from)
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        if agents.is_empty() {
            return Err(Failure::Job(if lost.is_empty() {
                "no alive agent to run on".into()
            } else {
                format!(
                    "no alive agent to run on (lost during this job: {})",
                    lost.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            }));
        }
        progress.agents = agents.clone();
        progress.dag = Some(dag.clone());
        let overrides: BTreeMap<String, serde_json::Value> =
            job.params.clone().into_iter().collect();
        let params_map = dag.job_params(&overrides);
        let fanouts = dag.fanouts(&params_map).map_err(Failure::Job)?;
        let params: serde_json::Map<String, serde_json::Value> = params_map.into_iter().collect();
        let policy = job.policy;
        // Handlers are resolved once per execution: its runs all call the same code.
        let handlers = crate::exec::handlers::resolve(rt, &dag)
            .await
            .map_err(Failure::Job)?;
        // And secrets: a secret deleted since the job was submitted fails it here, named.
        let needed = crate::exec::secrets::needed(&dag);
        let secrets = if needed.is_empty() {
            BTreeMap::new()
        } else {
            let dir = rt.config.secrets_dir.clone();
            state
                .db
                .run(move |db| Ok(crate::exec::secrets::resolve(db, dir.as_deref(), &needed)))
                .await
                .map_err(|e| Failure::Job(format!("database: {e}")))?
                .map_err(Failure::Job)?
        };
        let mut prewarm_delays = BTreeMap::new();
        let alloc = match planned {
            Some(p) => {
                let (alloc, p) = rt
                    .admit(state, job, &dag, p, &agents, &recorded_hosts, cancel)
                    .await
                    .map_err(Failure::Job)?;
                let hosts: Vec<Vec<String>> = alloc
                    .hosts
                    .iter()
                    .map(|h| h.iter().map(|&a| agents[a].id.clone()).collect())
                    .collect();
                // What a previous control plane recorded is reused only under the same plan: on
                // the same agents (their files are there) with the same method on every edge (a
                // sender that ran for `direct` uploaded nothing a `remote` receiver could read). A
                // record without methods (made before they were kept) cannot say: it starts over.
                if !recorded.is_empty()
                    && !recorded_hosts.is_empty()
                    && (hosts != recorded_hosts || alloc.methods != recorded_methods)
                {
                    tracing::warn!(job = %job.id, before = ?recorded_hosts, now = ?hosts, methods_before = ?recorded_methods, methods_now = ?alloc.methods, "resumed under another plan: a new execution starts from the input");
                    return Err(Failure::PlanChanged(
                        "resumed under another plan than its recorded runs ran under".into(),
                    ));
                }
                // Recorded so that after a restart the job asks for the same agents again, and
                // knows which plan its recorded runs ran under.
                let (id, now) = (job.id.clone(), state.clock.now_ms());
                let methods = alloc.methods.clone();
                state
                    .db
                    .run(move |db| {
                        if let Some(mut e) = db.job_execution(&id)? {
                            e.hosts = hosts;
                            e.methods = methods;
                            db.set_job_execution(&id, &e, now)?;
                        }
                        Ok(())
                    })
                    .await
                    .map_err(|e| format!("database: {e}"))?;
                let mut plan = job_plan(&dag, &alloc, &agents, &p.report, &p.warm);
                // What makes the prediction less sure (an input outside the learned sizes).
                plan.notes.extend(p.report.warnings.iter().cloned());
                if rt.config.prewarm && rt.config.prewarm_timed {
                    prewarm_delays =
                        crate::exec::prewarm::timed_delays(&dag, &alloc.plan, &p.params);
                    for (&(from, to), d) in &prewarm_delays {
                        if d.is_zero() {
                            continue;
                        }
                        let containers: usize = alloc.permits(to).values().sum();
                        plan.notes.push(format!(
                            "prewarm of {} sent {:.2} s after {} starts, when the plan needs its containers: {:.2} container-seconds not spent idle",
                            dag.functions[to].name,
                            d.as_secs_f64(),
                            dag.functions[from].name,
                            d.as_secs_f64() * containers as f64
                        ));
                    }
                }
                tracing::info!(job = %job.id, used = %plan.used, notes = ?plan.notes, "plan granted");
                let (id, stored, now) = (job.id.clone(), plan.clone(), state.clock.now_ms());
                state
                    .db
                    .run(move |db| db.set_job_plan(&id, &stored, now))
                    .await
                    .map_err(|e| format!("database: {e}"))?;
                rt.publish(&job.id, |e| {
                    e.message = Some(format!("running the {} plan", alloc.used.as_str()));
                });
                progress.plan = Some(plan);
                Some(alloc)
            }
            None => None,
        };
        let methods = match &alloc {
            Some(a) => a.methods.clone(),
            None => edge_methods(&dag, policy),
        };
        progress.methods = methods.clone();
        progress.expected = fanouts
            .iter()
            .map(|f| match f {
                Fanout::Known(n) => *n,
                Fanout::Scattered => 0,
            })
            .collect();
        let total: u32 = progress.expected.iter().sum();
        rt.publish(&job.id, |e| e.total_instances = total);
        let n = dag.functions.len();
        let produced: Vec<Vec<Produced>> = vec![Vec::new(); n];
        let expiry = unix_now() + 24 * 3600;
        // Unplanned (profiling, forced policies): at most one lambda per vCPU of the VM type an
        // agent stands for, across every stage of the job that runs at once. Instances beyond that
        // wait and then run in a warm container of this job, which is how profiling measures hot
        // times, not only cold ones.
        let vcpu_permits: HashMap<usize, Arc<Semaphore>> = HashMap::new();
        // A planned job holds on each agent what its grant reserved there, by the pool's rule
        // (`Allocation::reserved`): stages one after another share it, branches that run together
        // each have their own share, at most the agent's vCPUs.
        let job_permits: HashMap<usize, Arc<Semaphore>> = alloc
            .as_ref()
            .map(|a| {
                let vcpus = |agent: usize| {
                    let t = rt.catalog.as_ref()?.vm_type(&agents.get(agent)?.vm_type)?;
                    Some(t.vcpus as usize)
                };
                a.reserved(&dag, vcpus)
                    .into_iter()
                    .map(|(agent, k)| (agent, Arc::new(Semaphore::new(k))))
                    .collect()
            })
            .unwrap_or_default();
        // What a previous control plane recorded of this execution, by (function, instance), on
        // agents this execution still has: the machine restores what succeeded and sends again, by
        // the same attempt, what was sent.
        let recorded: HashMap<(usize, u32), (usize, InstanceRunRecord)> = recorded
            .into_iter()
            .filter_map(|r| {
                let i = dag.functions.iter().position(|f| f.name == r.function)?;
                let a = agents.iter().position(|a| a.id == r.agent)?;
                Some(((i, r.instance), (a, r)))
            })
            .collect();
        let decisions = recorded
            .iter()
            .map(|(&key, (_, r))| {
                let state = match r.report {
                    Some(_) => machine::Recorded::Succeeded(r.attempt),
                    None => machine::Recorded::Sent(r.attempt),
                };
                (key, state)
            })
            .collect();
        // Every decision of when what runs is the machine's (`machine.rs`); this loop carries its
        // actions out and tells it what happened.
        // A planned job's stages open after their senders and run on the plan's VMs in blocks, as
        // the model priced them; an unplanned job's go round its agents (`machine::Spread`).
        let shape = match &alloc {
            Some(a) => {
                let vms: Vec<u32> = a.hosts.iter().map(|h| h.len().max(1) as u32).collect();
                Shape::planned(&dag, &vms)
            }
            None => {
                Shape::of(&dag, &fanouts).on_agents(agents.len() as u32, policy == Policy::Local)
            }
        };
        // Each function's `retries:` over the control plane's default.
        let default = RetryPolicy {
            on: rt.config.retry_on.clone(),
            ..RetryPolicy::new(rt.config.max_attempts, rt.config.backoff)
        };
        let policies = dag
            .functions
            .iter()
            .map(|f| default.with(f.retries.as_ref()))
            .collect();
        let machine = JobMachine::new(shape.clone(), rt.config.max_attempts, rt.config.backoff)
            .with_policies(policies)
            .with_recorded(decisions);
        let opened: Vec<Option<Opened>> = (0..n).map(|_| None).collect();
        let seen_ended = vec![false; n];
        // Per instance: when it was first sent (monotonic, and wall clock for the record).
        let first_sent: HashMap<(usize, u32), (Instant, i64)> = HashMap::new();
        let failures: HashMap<(usize, u32), InstanceFailure> = HashMap::new();
        let set: tokio::task::JoinSet<Attempted> = tokio::task::JoinSet::new();
        let events: VecDeque<Event> = VecDeque::from([Event::Begin]);
        // Until the DAG's cold times are learned, a job's runs share warm containers only among
        // themselves (the first run on each agent starts cold, later ones hot), so that every job
        // measures both; from then on they share them with every job of the function, and the
        // next stages are prewarmed. A planned job always shares: its plan priced its stages with
        // the warm containers the pool keeps (`warm`), and a cold-time model that stopped converging
        // for a sample does not make it a profiling job (its DAG's mode has hysteresis).
        let (learned, jobs_learned) = cold_times_learned(state, rt, &dag, &job.params).await;
        let profiling = job.mode != sonic_api::control::JobMode::Planned && !learned;
        // Right-sizing is learned from runs on different numbers of cores: every other
        // profiling job of a setting gives each instance of a stage two CPUs where that takes
        // nothing from the stage's concurrency (every agent it lands on has at least two vCPUs
        // per instance of it there), the others one. Forced baselines keep one: what they
        // measure is the baseline.
        let vcpus_of = |a: usize| agent_vcpus(rt.catalog.as_ref(), agents.get(a)?);
        let unforced = job.mode_reason.as_deref() != Some(&crate::learn::forced_unplanned(policy));
        let unplanned_cpus: Vec<f64> = fanouts
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (Fanout::Known(n), true) = (f, profiling && unforced && jobs_learned % 2 == 1)
                else {
                    return 1.0;
                };
                let mut per_agent: BTreeMap<usize, u32> = BTreeMap::new();
                for k in 0..*n {
                    *per_agent
                        .entry(crate::exec::requests::place(policy, agents.len(), i, k))
                        .or_insert(0) += 1;
                }
                let roomy = !per_agent.is_empty()
                    && per_agent
                        .iter()
                        .all(|(&a, &m)| vcpus_of(a).is_some_and(|v| v >= 2 * m));
                if roomy { 2.0 } else { 1.0 }
            })
            .collect();
        // What the agents' reports of this execution's runs are recorded under in the warm ledger,
        // per function: the identity, code and memory limit its runs carry (none for a profiling
        // job, whose containers serve only itself).
        let warm_keys: Vec<String> = if profiling {
            Vec::new()
        } else {
            (0..n)
                .map(|i| {
                    let mem = alloc
                        .as_ref()
                        .and_then(|al| al.memory_limit_mb.get(i).copied())
                        .unwrap_or(crate::exec::requests::DEFAULT_MEMORY_MB);
                    let digest = handlers.get(&i).map(|h| h.sha256.as_str());
                    crate::learn::warm::key(&dag, i, digest, mem)
                })
                .collect()
        };
        // The machine claims, reports and prewarms by how the job shares warm containers.
        let warmth = if profiling {
            Warmth::Own
        } else {
            Warmth::Shared {
                claims: alloc.is_some(),
                prewarm: rt.config.prewarm.then_some(prewarm_delays),
            }
        };
        let machine = machine.with_warmth(warmth);
        Ok(Execution {
            state,
            rt,
            job,
            inputs,
            cancel,
            progress,
            execution,
            dag,
            agents,
            fanouts,
            params,
            policy,
            handlers,
            secrets,
            alloc,
            methods,
            produced,
            expiry,
            vcpu_permits,
            job_permits,
            recorded,
            shape,
            machine,
            opened,
            seen_ended,
            first_sent,
            failures,
            set,
            events,
            profiling,
            warm_keys,
            warm_words: HashMap::new(),
            unplanned_cpus,
            memory_raised: HashMap::new(),
        })
    }

    /// Carries out the machine's actions and tells it what happened, until it finishes.
    async fn dispatch(&mut self) -> Result<Outcome, Failure> {
        loop {
            while let Some(event) = self.events.pop_front() {
                for action in self.machine.handle(event) {
                    match action {
                        Action::OpenStage { stage } => self.open_stage(stage).await?,
                        Action::StartRun {
                            stage,
                            instance,
                            attempt,
                            delay,
                            vm,
                        } => self.start_run(stage, instance, attempt, delay, vm)?,
                        Action::Restore {
                            stage,
                            instance,
                            attempt,
                            vm,
                        } => self.restore(stage, instance, attempt, vm).await?,
                        Action::ClaimWarm { stage } => self.claim_warm(stage),
                        Action::WarmReported { stage, instance } => {
                            self.warm_reported(stage, instance)
                        }
                        Action::Prewarm { stage, delay } => self.prewarm(stage, delay),
                        Action::StopRuns => self.set.abort_all(),
                        Action::Finish(outcome) => return Ok(outcome),
                    }
                }
            }
            self.stages_ended();
            let joined = tokio::select! {
                j = self.set.join_next() => j,
                () = self.cancel.cancelled() => {
                    self.events.push_back(Event::Cancel);
                    continue;
                }
            };
            match joined {
                Some(Ok(a)) => self.attempted(a).await?,
                Some(Err(e)) if e.is_cancelled() => {}
                Some(Err(e)) => return Err(Failure::Job(format!("instance task failed: {e}"))),
                // The machine finishes a job whose stages cannot start; nothing runs here only
                // when it has, so this is a guard.
                None => return Ok(Outcome::Stuck),
            }
        }
    }

    /// Counts the stages that ended since the last call.
    fn stages_ended(&mut self) {
        stages_ended(
            self.state,
            self.rt,
            self.job,
            &self.dag,
            &self.machine,
            &self.opened,
            &mut self.seen_ended,
        );
    }

    /// Builds stage `i`'s requests (or, for a stage whose instances start one by one, their
    /// count), its permits per agent, and prewarms the stages after it.
    async fn open_stage(&mut self, i: usize) -> Result<(), Failure> {
        let state = self.state;
        let rt = self.rt;
        let job = self.job;
        let Execution {
            ref mut progress,
            ref dag,
            ref agents,
            ref alloc,
            ref shape,
            ref machine,
            ref mut opened,
            ref mut events,
            ..
        } = *self;
        if let Some(a) = alloc
            && let Err(e) = check_vm_storage_senders(state, dag, a, agents, i).await
        {
            return Err(Failure::Job(e));
        }
        let ctx = stage_context!(self);
        // A stage whose instances start one by one builds each request when it
        // starts (its senders' files are known then); the others build all now.
        let (count, built) = match shape.per_instance(i) {
            Some(count) => (count, Vec::new()),
            None => match stage_runs(&ctx, i) {
                Ok(p) => (p.len() as u32, p),
                Err(e) => {
                    return Err(Failure::Job(e.to_string()));
                }
            },
        };
        progress.instances.insert(i, count);
        progress.expected[i] = count;
        // A planned stage runs where the resource manager put its VMs, as many
        // at once per VM as the plan says.
        let permits = match alloc {
            Some(a) => a
                .permits(i)
                .into_iter()
                .map(|(agent, n)| (agent, Arc::new(Semaphore::new(n))))
                .collect(),
            None => HashMap::new(),
        };
        // Each agent fetches its instances' inputs once, before the first of them runs: the
        // agent an instance runs on as `start_run` finds it (the machine's spread of the stage).
        let agent_of = |k: u32| {
            let vm = shape.spread(i).place(k, count);
            match alloc {
                Some(a) => a.hosts[i].get(vm as usize).copied().unwrap_or(0),
                None => vm as usize,
            }
        };
        let fetches = StageFetch::for_stage(
            &job.id,
            dag,
            i,
            agents,
            built
                .iter()
                .map(|p| (agent_of(p.request.instance), &p.request)),
        );
        opened[i] = Some(Opened {
            requests: built.into_iter().map(|p| (p.request.instance, p)).collect(),
            permits,
            fetches,
            count,
            since: Instant::now(),
        });
        let total: u32 = progress.expected.iter().sum();
        let running = running_stages(dag, machine);
        rt.publish(&job.id, |e| {
            e.stage = running;
            e.total_instances = total;
            e.message = None;
        });
        tracing::info!(job = %job.id, function = %dag.functions[i].name, instances = count, "stage starts");
        events.push_back(Event::StageOpened {
            stage: i,
            instances: count,
        });
        Ok(())
    }

    /// Sends attempt `attempt` of instance `k` of stage `i` to where the machine placed it
    /// (`vm`), after `delay`.
    fn start_run(
        &mut self,
        i: usize,
        k: u32,
        attempt: u32,
        delay: Duration,
        vm: u32,
    ) -> Result<(), Failure> {
        let state = self.state;
        let rt = self.rt;
        let cancel = self.cancel;
        let execution = self.execution;
        let profiling = self.profiling;
        let unplanned_cpus = self.unplanned_cpus.get(i).copied().unwrap_or(1.0);
        let Execution {
            ref mut progress,
            ref dag,
            ref agents,
            ref alloc,
            ref mut vcpu_permits,
            ref job_permits,
            ref recorded,
            ref mut opened,
            ref mut first_sent,
            ref mut set,
            ref memory_raised,
            ..
        } = *self;
        let Some(stage) = opened[i].as_mut() else {
            return Ok(());
        };
        let placement = match stage.requests.get(&k) {
            Some(p) => p.clone(),
            None => {
                let ctx = stage_context!(self);
                match instance_runs(&ctx, i, stage.count, [k]) {
                    Ok(mut p) if !p.is_empty() => {
                        let p = p.remove(0);
                        stage.requests.insert(k, p.clone());
                        p
                    }
                    Ok(_) => {
                        return Err(Failure::Job(format!(
                            "function {} instance {k}: no request",
                            dag.functions[i].name
                        )));
                    }
                    Err(e) => {
                        return Err(Failure::Job(e.to_string()));
                    }
                }
            }
        };
        let mut p = placement;
        p.request.execution = execution;
        p.request.attempt = attempt;
        if profiling {
            p.request.function_key = None;
        }
        // Where the machine placed it: the plan's VM `vm` of the stage, on the
        // agent granted for it, or the job's agent `vm`.
        p.agent = match alloc {
            Some(a) => {
                p.request.memory_limit_mb = a.memory_limit_mb[i];
                a.hosts[i].get(vm as usize).copied().unwrap_or(0)
            }
            None => vm as usize,
        };
        // An attempt after one that ran out of memory runs under the raised limit.
        if let Some(&raised) = memory_raised.get(&(i, k)) {
            p.request.memory_limit_mb = p.request.memory_limit_mb.max(raised);
        }
        // An instance a previous control plane sent is asked for again on the
        // agent it went to.
        let mut sent_ms = None;
        if let Some((a, r)) = recorded.get(&(i, k)) {
            p.agent = *a;
            sent_ms = Some(r.started_ms);
        }
        // The CPUs it is given: the plan's (right-sizing), or the unplanned job's; never more
        // than its agent's VM type has.
        let cpus = instance_cpus(
            rt.catalog.as_ref(),
            alloc.as_ref(),
            agents.get(p.agent),
            i,
            unplanned_cpus,
        );
        p.request.cpus = cpus;
        progress.cpus.insert(i, cpus);
        let permit = match alloc {
            Some(_) => stage.permits.get(&p.agent).cloned(),
            None => rt
                .catalog
                .as_ref()
                .and_then(|c| c.vm_type(&agents.get(p.agent)?.vm_type))
                .filter(|t| t.vcpus > 0)
                .map(|t| {
                    vcpu_permits
                        .entry(p.agent)
                        .or_insert_with(|| Arc::new(Semaphore::new(t.vcpus as usize)))
                        .clone()
                }),
        };
        let sent_ms = first_sent
            .get(&(i, k))
            .map(|s| s.1)
            .or(sent_ms)
            .unwrap_or_else(|| state.clock.now_ms());
        let vm = alloc.as_ref().map_or(0, |a| planned_vm(dag, a, i, vm));
        let attempt = AttemptTask {
            state: state.clone(),
            rt: rt.clone(),
            agent: agents[p.agent].clone(),
            agent_index: p.agent,
            request: p.request,
            cancel: cancel.clone(),
            permit,
            reservation: job_permits.get(&p.agent).cloned(),
            delay,
            fetch: stage.fetches.get(&p.agent).cloned(),
            sent_ms,
            function: i,
            vm,
        };
        // A child of the job's span: the instance's events carry both.
        let span = tracing::info_span!("run", function = %dag.functions[i].name, instance = k);
        set.spawn(tracing::Instrument::instrument(attempt.run(), span));
        Ok(())
    }

    /// Records, from what was recorded, an instance an earlier control plane saw succeed.
    async fn restore(&mut self, i: usize, k: u32, attempt: u32, vm: u32) -> Result<(), Failure> {
        let self_unplanned_cpus = self.unplanned_cpus.get(i).copied().unwrap_or(1.0);
        let state = self.state;
        let rt = self.rt;
        let job = self.job;
        let execution = self.execution;
        let Execution {
            ref mut progress,
            ref dag,
            ref agents,
            ref alloc,
            ref mut produced,
            ref recorded,
            ref mut events,
            ..
        } = *self;
        let Some((a, r)) = recorded.get(&(i, k)) else {
            return Ok(());
        };
        let Some(report) = r.report.clone() else {
            return Ok(());
        };
        progress.cpus.insert(
            i,
            instance_cpus(
                rt.catalog.as_ref(),
                alloc.as_ref(),
                agents.get(*a),
                i,
                self_unplanned_cpus,
            ),
        );
        // Succeeded before the job's retry: reused, it takes no time and no VM of this try
        // (its report keeps what it measured then).
        let ended_ms = r.ended_ms.unwrap_or(r.started_ms);
        let reused = job.retried_ms.is_some_and(|t| ended_ms <= t);
        let (started, ended) = match (reused, progress.origin) {
            (true, Some(origin)) => (origin, origin),
            _ => (instant_at(state, r.started_ms), instant_at(state, ended_ms)),
        };
        let f = Finished {
            function: i,
            instance: k,
            agent: *a,
            vm: alloc.as_ref().map_or(0, |al| planned_vm(dag, al, i, vm)),
            report,
            attempts: attempt,
            started,
            ended,
            fetch: None,
            reused,
        };
        let ended = succeed(
            state, rt, &job.id, dag, agents, execution, f, progress, produced,
        )
        .await?;
        events.push_back(ended);
        Ok(())
    }

    /// Claims, in the warm ledger, the containers stage `i`'s first batch takes on each agent
    /// it was granted (as many as the plan runs there at once): the next jobs' plans no longer
    /// count them (released as its runs report, or at the job's end).
    fn claim_warm(&mut self, i: usize) {
        let (Some(a), Some(key)) = (&self.alloc, self.warm_keys.get(i)) else {
            return;
        };
        let now = self.state.clock.now_ms();
        for (agent, k) in a.permits(i) {
            let want = u32::try_from(k).unwrap_or(u32::MAX);
            self.rt
                .warm
                .claim(&self.job.id, &self.agents[agent].id, key, want, now);
        }
    }

    /// Tells the warm ledger what the agent of instance `k` of stage `i` said it keeps warm
    /// for the function once the run ended, for the next jobs' plans; the job's claim there ends.
    fn warm_reported(&mut self, i: usize, k: u32) {
        // An instance restored from an earlier control plane's record has no word here.
        let (Some((agent, word)), Some(key)) =
            (self.warm_words.remove(&(i, k)), self.warm_keys.get(i))
        else {
            return;
        };
        let agent = &self.agents[agent].id;
        self.rt.warm.started(&self.job.id, agent, key);
        if let Some(w) = word {
            self.rt
                .warm
                .observe(agent, key.clone(), w, self.state.clock.now_ms());
        }
    }

    /// Prewarms stage `i` (where its instances will run) after `delay`, in the background.
    fn prewarm(&mut self, i: usize, delay: Duration) {
        let ctx = stage_context!(self);
        crate::exec::prewarm::stage(self.rt, &ctx, i, self.alloc.as_ref(), delay);
    }

    /// An attempt ended: records its instance if it succeeded, and tells the machine.
    async fn attempted(&mut self, a: Attempted) -> Result<(), Failure> {
        let state = self.state;
        let rt = self.rt;
        let job = self.job;
        let cancel = self.cancel;
        let execution = self.execution;
        let Execution {
            ref mut progress,
            ref dag,
            ref agents,
            ref mut produced,
            ref mut first_sent,
            ref mut failures,
            ref mut events,
            ref mut warm_words,
            ref mut memory_raised,
            ..
        } = *self;
        let (i, k) = (a.function, a.instance);
        let first = *first_sent.entry((i, k)).or_insert((a.started, a.sent_ms));
        match a.outcome {
            Ok((report, ended)) => {
                warm_words.insert((i, k), (a.agent, report.warm));
                let f = Finished {
                    function: i,
                    instance: k,
                    agent: a.agent,
                    vm: a.vm,
                    report,
                    attempts: a.attempt,
                    started: first.0,
                    ended,
                    fetch: a.fetch,
                    reused: false,
                };
                // The instance's files are recorded before any instance that reads them starts.
                let ended = succeed(
                    state, rt, &job.id, dag, agents, execution, f, progress, produced,
                )
                .await?;
                events.push_back(ended);
            }
            Err(failure) => {
                let function = &dag.functions[i].name;
                let attempt = a.attempt;
                let max = self
                    .machine
                    .policy(i)
                    .map_or(rt.config.max_attempts, |p| p.attempts)
                    .max(attempt);
                let last = failure.message.clone();
                rt.publish(&job.id, |e| {
                    e.message = Some(format!(
                        "{function} instance {k} attempt {attempt} of {max} failed: {last}"
                    ));
                });
                let kind = if cancel.is_cancelled() {
                    RunFailure::Cancelled
                } else {
                    failure.kind
                };
                // Where and when it failed, for the summary (a cancel's runs are not failures).
                if kind != RunFailure::Cancelled {
                    let at = |t: Instant| {
                        progress
                            .origin
                            .map(|o| t.saturating_duration_since(o).as_secs_f64())
                    };
                    progress.failed.push(sonic_api::control::FailedAttempt {
                        name: function.clone(),
                        instance: k,
                        attempt,
                        agent: failure.agent.clone(),
                        kind,
                        error: failure.message.chars().take(2000).collect(),
                        started_s: at(a.started),
                        ended_s: at(Instant::now()),
                    });
                }
                // Out of memory: the next attempt (if its retries cover it) gets more, up to
                // its agent's VM type's memory.
                if kind == RunFailure::OutOfMemory {
                    let cap = rt
                        .catalog
                        .as_ref()
                        .and_then(|c| c.vm_type(&agents.get(a.agent)?.vm_type))
                        .map(|t| t.memory_mb);
                    let next = raised_memory(a.memory_limit_mb, cap);
                    if next > a.memory_limit_mb {
                        tracing::info!(job = %job.id, function = %function, instance = k, from_mb = a.memory_limit_mb, to_mb = next, "out of memory: the next attempt gets more");
                        memory_raised.insert((i, k), next);
                    }
                }
                failures.insert((i, k), failure);
                events.push_back(Event::RunFailed {
                    stage: i,
                    instance: k,
                    attempt,
                    error: last,
                    kind,
                });
            }
        }
        Ok(())
    }

    /// The execution's result from the machine's outcome: a run's failure comes with the
    /// agents that no longer answer, for the machine of executions.
    async fn finish(mut self, outcome: Outcome) -> Result<(), Failure> {
        self.set.abort_all();
        // The last stage ends with the job.
        self.stages_ended();
        let rt = self.rt;
        let cancel = self.cancel;
        let Execution {
            ref mut progress,
            ref dag,
            ref agents,
            ref mut failures,
            ..
        } = self;
        // The summary lists runs stage by stage, as the DAG orders them.
        let order: HashMap<&str, usize> = dag
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.as_str(), i))
            .collect();
        progress
            .functions
            .sort_by_key(|r| (order.get(r.name.as_str()).copied(), r.instance));
        let (message, failed, at) = match outcome {
            Outcome::Succeeded => return Ok(()),
            Outcome::Cancelled => return Err(Failure::Job("cancelled".into())),
            Outcome::Stuck => {
                return Err(Failure::Job(
                    "no stage can start: the DAG's stages wait on each other".into(),
                ));
            }
            Outcome::Failed {
                stage,
                instance,
                attempts,
                error,
                exhausted,
            } => {
                let name = &dag.functions[stage].name;
                let tries = if attempts == 1 { "attempt" } else { "attempts" };
                // A failure of a kind its function's retries leave out is said so; a cancel or
                // a refusal is its own message.
                let uncovered = failures
                    .get(&(stage, instance))
                    .and_then(|f| f.kind.retry_kind());
                let message = match (exhausted, uncovered) {
                    (true, _) => format!(
                        "function {name} instance {instance} failed after {attempts} {tries}: {error}"
                    ),
                    (false, Some(kind)) => format!(
                        "function {name} instance {instance} failed after {attempts} {tries} (its retries do not cover `{}` failures): {error}",
                        kind.as_str()
                    ),
                    (false, None) => error,
                };
                (
                    message,
                    failures.remove(&(stage, instance)),
                    Some((name.clone(), instance)),
                )
            }
        };
        if cancel.is_cancelled() {
            return Err(Failure::Job(message));
        }
        // Whether a lost agent (it or a peer it fetched from stopped answering, or its disk is
        // full) makes the job worth another execution without it is the job machine's call; the
        // probe is what it needs to know.
        let unreachable = unreachable_agents(rt, agents).await;
        let (kind, agent) = failed.map_or((None, String::new()), |f| (Some(f.kind), f.agent));
        Err(Failure::RunFailed {
            message,
            kind,
            agent,
            unreachable,
            at,
        })
    }
}

/// The CPUs an instance of stage `i` on `slot` is given: its plan's `cores` for a planned job,
/// else the unplanned job's; never more than the agent's vCPUs ([`agent_vcpus`]).
fn instance_cpus(
    catalog: Option<&Catalog>,
    alloc: Option<&Allocation>,
    slot: Option<&AgentSlot>,
    i: usize,
    unplanned: f64,
) -> f64 {
    let most = slot
        .and_then(|a| agent_vcpus(catalog, a))
        .map_or(f64::INFINITY, |v| f64::from(v.max(1)));
    alloc
        .and_then(|a| a.cpus.get(i).copied())
        .unwrap_or(unplanned)
        .max(1.0)
        .min(most)
}
