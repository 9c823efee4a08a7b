//! The job executor: runs a job stage by stage (topological order) on the alive agents, retries
//! failed instances, records where files are, cleans the job's intermediate data, and writes the
//! job summary and the profiling sample, then refits the DAG's models.
//!
//! A planned (`sonic`) job runs its plan: the cluster's resource manager
//! ([`crate::resources`], through [`crate::resources::planned::admit`]) grants the plan's VMs on agents, the
//! job waiting `queued` until it does; each edge moves data by the plan's method, and at most the
//! plan's concurrency of a stage's instances run at once on one VM. An unplanned job's instance
//! holds one slot of its agent from the same manager while it runs.

pub mod agents;
mod context;
mod execution;
mod fetch;
pub mod handlers;
mod on_failure;
pub mod prewarm;
pub mod reports;
pub mod requests;
pub mod secrets;
pub mod threads;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sonic_api::agent::{RunReport, RunRequest, RunStatus};
use sonic_api::control::{
    EdgeRun, FunctionRun, InstanceLog, JobEvent, JobPlan, JobStatus, JobSummary, StageHosts,
};
use sonic_api::plan::PlanReport;
use sonic_core::catalog::{Catalog, SECONDS_PER_MONTH};
use sonic_core::dag::{Dag, Fanout};
use sonic_core::planner::Policy;
use sonic_core::regression::Convergence;
use sonic_storage::ObjectStore;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::exec::agents::{AgentClient, AgentError, HttpAgents};
use crate::exec::requests::{
    JobInputFile, Method, Produced, StageContext, edge_methods, instance_runs, job_prefix,
    stage_runs,
};
use crate::learn::Planned;
use crate::resources::planned::Allocation;
use crate::resources::{DEFAULT_MAX_QUEUED, Pool, ResourceManager};
use crate::store::AgentSlot;
use crate::store::{
    Db, DeleteJob, ExecutionRecord, FileRecord, InstanceRunRecord, JobRecord, LocalCopy,
    SampleRecord, StoreError,
};
pub use context::Context;
use sonic_core::machine::{
    self, Action, Event, ExecutionEnd, Executions, Failure as RunFailure, JobMachine, Next,
    Outcome, RetryPolicy, Shape, Warmth,
};

/// The reason a job that was running when the control plane stopped is failed with.
pub const RESTARTED: &str = "control plane restarted";

/// How long a failed job keeps what a retry reuses, by default: a day.
pub const DEFAULT_KEEP_FAILED: Duration = Duration::from_secs(24 * 3600);

/// The most kept jobs one sweep deletes ([`sweep_kept`]).
const SWEEP_BATCH: u32 = 100;

/// How the executor talks to agents and retries.
#[derive(Clone)]
pub struct JobsConfig {
    /// The bearer token the agents accept.
    pub agent_token: String,
    /// The key the agents check `direct` file tokens with.
    pub file_key: Vec<u8>,
    /// The S3 bucket, to name outputs `s3://<bucket>/<key>`; `None` names them `store://<key>`.
    pub bucket: Option<String>,
    /// The store joining agents are told to use (`None`: they must have their own).
    pub agent_store: Option<sonic_api::control::StoreSpec>,
    /// The in-memory tier of `memory` edges (`redis://host:port`), told to joining agents; the
    /// control plane plans `memory` only with one (its catalog prices it), and clears a job's
    /// files from it when the job ends.
    pub memory_tier: Option<String>,
    /// Attempts per instance, the first included.
    pub max_attempts: u32,
    /// The wait before the second attempt; it doubles for each further one.
    pub backoff: Duration,
    /// The kinds of failure tried again by default (a function's `retries: on:` replaces them).
    pub retry_on: std::collections::BTreeSet<sonic_core::dag::RetryOn>,
    /// Without pushed reports (no `report_url` known): the first wait between two reads of a
    /// running instance's report; each further wait is half as long again, up to
    /// `max_poll_interval` (1,000 instances polled every 25 ms were 40,000 requests a second:
    /// docs/load.md).
    pub poll_interval: Duration,
    /// The longest wait between two reads of a running instance's report.
    pub max_poll_interval: Duration,
    /// The control plane's URL as agents reach it, sent in every run request so that the agent
    /// pushes the report when the run ends (an agent with its own `control_url` uses that).
    /// `None`: where the control plane listens, once it does ([`Runtime::listening_at`]).
    pub report_url: Option<String>,
    /// Whether agents are asked to push reports at all (`false`: the executor polls, as it did
    /// before pushes; for measuring the difference, or agents that cannot reach the control
    /// plane).
    pub push_reports: bool,
    /// With pushed reports, how often the executor still reads a running instance's report
    /// itself, in case a push is lost (at once when the agent's push is known to have failed).
    pub fallback_poll: Duration,
    /// Added to a function's timeout for staging and routing before a run is given up on.
    pub report_slack: Duration,
    /// When a DAG's models are good enough to plan its jobs with, and when a planned DAG has
    /// drifted back to profiling (`sonic_core::mode`; defaults: 15% MAPE, 5 samples, a parameter
    /// more than 50% off in 3 planned jobs in a row).
    pub convergence: Convergence,
    /// What planning one job may spend (time, memory): past it, the best plan found so far.
    pub planning: sonic_core::planner::Budget,
    /// Executions per job, the first included: when an agent the job uses is lost (it stops
    /// answering, or its disk is full), the job runs again from its input without that agent.
    pub job_attempts: u32,
    /// How long an agent has to answer `GET /v1/health` before it counts as lost.
    pub health_timeout: Duration,
    /// Whether the agents that will run the stages reading from a stage that starts are asked
    /// to start those stages' containers meanwhile (`prewarm`), so that they start hot.
    pub prewarm: bool,
    /// With `prewarm`, a planned job's receivers are prewarmed when the plan predicts their
    /// containers must start, not when their senders start (ORION's timed pre-warming:
    /// `prewarm::timed_delays`); `false`: at once.
    pub prewarm_timed: bool,
    /// How often a DAG's `object_created` triggers list their prefix
    /// (`crate::admission::triggers`).
    pub trigger_poll: std::time::Duration,
    /// The time dilation factor of the cluster (1: none); the catalog is already dilated by it
    /// ([`sonic_core::catalog::Catalog::dilated`]); reported by `GET /v1/health`.
    pub dilation: f64,
    /// How long a failed job keeps what a retry reuses (its succeeded instances' files on the
    /// agents, in the store and the memory tier, and their records) before [`sweep_kept`]
    /// deletes it; zero: deleted when the job fails, as a succeeded job's are.
    pub keep_failed: Duration,
    /// Jobs ended longer ago than this are deleted whole ([`delete_job`]: record, logs,
    /// results, input) by the sweep; `None`: kept until deleted.
    pub retain_jobs: Option<Duration>,
    /// A folder whose files are secrets, beside the store's (`secrets::Secrets`).
    pub secrets_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for JobsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobsConfig")
            .field("agent_token", &"<redacted>")
            .field("file_key", &"<redacted>")
            .field("bucket", &self.bucket)
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("convergence", &self.convergence)
            .field("planning", &self.planning)
            .field("job_attempts", &self.job_attempts)
            .field("health_timeout", &self.health_timeout)
            .field("dilation", &self.dilation)
            .field("keep_failed", &self.keep_failed)
            .field("retain_jobs", &self.retain_jobs)
            .field("secrets_dir", &self.secrets_dir)
            .finish()
    }
}

impl JobsConfig {
    /// The defaults, with the agents' token and the file key.
    pub fn new(agent_token: impl Into<String>, file_key: impl Into<Vec<u8>>) -> JobsConfig {
        JobsConfig {
            agent_token: agent_token.into(),
            file_key: file_key.into(),
            bucket: None,
            agent_store: None,
            memory_tier: None,
            max_attempts: 3,
            backoff: Duration::from_millis(200),
            retry_on: sonic_core::dag::RetryOn::ALL.into_iter().collect(),
            poll_interval: Duration::from_millis(25),
            max_poll_interval: Duration::from_millis(500),
            report_url: None,
            push_reports: true,
            fallback_poll: Duration::from_secs(2),
            report_slack: Duration::from_secs(120),
            convergence: Convergence::default(),
            planning: crate::learn::default_budget(),
            job_attempts: 3,
            health_timeout: Duration::from_secs(3),
            prewarm: true,
            prewarm_timed: true,
            trigger_poll: std::time::Duration::from_secs(5),
            dilation: 1.0,
            keep_failed: DEFAULT_KEEP_FAILED,
            retain_jobs: None,
            secrets_dir: None,
        }
    }
}

/// What running jobs needs besides the database: the object store, the catalog (prices), agents.
#[derive(Debug)]
pub struct Runtime {
    /// The object store: job inputs, `remote` files, results.
    pub store: Arc<dyn ObjectStore>,
    /// The VM catalog jobs are planned and priced with.
    pub catalog: Option<Catalog>,
    /// The executor's settings.
    pub config: JobsConfig,
    http: reqwest::Client,
    /// How runs are sent to agents and their reports read (over `http` unless replaced).
    agents: Arc<dyn AgentClient>,
    cancels: Mutex<HashMap<String, CancellationToken>>,
    /// The progress of every job this process runs, for `GET /v1/jobs/{id}/events`.
    events: Mutex<HashMap<String, watch::Sender<JobEvent>>>,
    /// Where jobs run: the cluster's resource manager (the built-in [`Pool`] unless a host
    /// platform installed its own, [`Runtime::with_resources`]).
    resources: Arc<dyn ResourceManager>,
    /// Jobs running on a grant: their instances need no slot of their own.
    granted: Mutex<BTreeSet<String>>,
    /// One refit at a time: two jobs of a DAG ending together must not both extend the same fit.
    models: Mutex<()>,
    /// Runs waiting for their agent's pushed report (`POST /v1/agents/{id}/runs/{run}/report`).
    pub reports: crate::exec::reports::Waiters,
    /// Where agents push reports: `JobsConfig::report_url`, else where the server listens.
    report_url: std::sync::OnceLock<String>,
    /// The tasks executing jobs, stopped with the control plane ([`Runtime::stop_jobs`]).
    tasks: Mutex<JobTasks>,
    /// The OpenLambda registry whose lambdas DAG functions may name as handlers.
    handlers: std::sync::OnceLock<Arc<sonic_openlambda::Handlers>>,
    /// What the agents keep warm, per function: planning prices warm stages hot with it.
    pub warm: crate::learn::warm::WarmLedger,
    /// Digests of lambda tarballs this process put in the store.
    packages: Mutex<BTreeSet<String>>,
    /// Where executions run ([`Runtime::with_executor`]); `None`: on the caller's runtime.
    executor: Option<crate::exec::threads::Executor>,
    /// The memory tier (`JobsConfig::memory_tier`), connected on first use: a job's files are
    /// cleared from it when the job ends.
    memory: tokio::sync::OnceCell<Arc<sonic_storage::redis::RedisStore>>,
}

/// The tasks executing jobs. Finished ones are dropped once the list doubled since the last
/// time (amortized O(1) per job: a submission does not scan every job in flight).
#[derive(Debug, Default)]
struct JobTasks {
    handles: Vec<tokio::task::AbortHandle>,
    prune_at: usize,
}

impl JobTasks {
    fn push(&mut self, handle: tokio::task::AbortHandle) {
        if self.handles.len() >= self.prune_at {
            self.handles.retain(|t| !t.is_finished());
            self.prune_at = (self.handles.len() * 2).max(64);
        }
        self.handles.push(handle);
    }
}

/// `catalog` with the memory tier the control plane has: without one configured its priced
/// tier is dropped (said so: no plan may use `memory`); with one and a catalog that prices none,
/// the built-in tier's prices. What `Runtime::new` plans with, and what the daemon applies
/// before it dilates the catalog (so that a built-in tier is dilated too).
pub(crate) fn with_tier_as_configured(mut catalog: Catalog, configured: bool) -> Catalog {
    catalog.memory_tier = match (configured, catalog.memory_tier.take()) {
        (false, Some(_)) => {
            tracing::warn!(
                "the catalog prices a memory tier but none is configured (memory_tier, SONIC_MEMORY_TIER): no plan uses memory"
            );
            None
        }
        (false, None) => None,
        (true, Some(t)) => Some(t),
        (true, None) => Some(sonic_core::catalog::MemoryTier::default()),
    };
    catalog
}

impl Runtime {
    /// Which of `check`'s executables `agent` cannot start ([`AgentClient::runnable`]).
    pub async fn runnable(
        &self,
        agent: &AgentSlot,
        check: &sonic_api::agent::RunnableCheck,
        timeout: Duration,
    ) -> Result<sonic_api::agent::RunnableReport, AgentError> {
        self.agents.runnable(agent, check, timeout).await
    }

    /// A runtime whose jobs are admitted by the built-in [`Pool`] over the registered agents.
    /// `memory` is planned only where there is a tier to run it on: without
    /// `config.memory_tier` the catalog's tier is dropped; with one and a catalog that prices
    /// none, the built-in tier's prices are taken.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        catalog: Option<Catalog>,
        config: JobsConfig,
    ) -> Runtime {
        let catalog = catalog.map(|c| with_tier_as_configured(c, config.memory_tier.is_some()));
        let resources: Arc<dyn ResourceManager> =
            Arc::new(Pool::new(catalog.as_ref(), DEFAULT_MAX_QUEUED));
        let http = reqwest::Client::new();
        let agents: Arc<dyn AgentClient> =
            Arc::new(HttpAgents::new(http.clone(), config.agent_token.clone()));
        let report_url = std::sync::OnceLock::new();
        if let Some(url) = &config.report_url {
            let _ = report_url.set(url.trim_end_matches('/').to_owned());
        }
        Runtime {
            store,
            catalog,
            config,
            agents,
            http,
            cancels: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            resources,
            granted: Mutex::new(BTreeSet::new()),
            models: Mutex::new(()),
            reports: crate::exec::reports::Waiters::default(),
            report_url,
            tasks: Mutex::new(JobTasks::default()),
            handlers: std::sync::OnceLock::new(),
            warm: crate::learn::warm::WarmLedger::default(),
            packages: Mutex::new(BTreeSet::new()),
            executor: None,
            memory: tokio::sync::OnceCell::new(),
        }
    }

    /// The memory tier, when the control plane has one (connected on first use, and again
    /// after a failed connection).
    async fn memory_tier(
        &self,
    ) -> Option<Result<&Arc<sonic_storage::redis::RedisStore>, sonic_storage::StoreError>> {
        let url = self.config.memory_tier.as_deref()?;
        Some(
            self.memory
                .get_or_try_init(|| async {
                    sonic_storage::redis::RedisStore::connect(url, sonic_storage::redis::NAMESPACE)
                        .await
                        .map(Arc::new)
                })
                .await,
        )
    }

    /// Runs job executions on `executor`'s threads (a lower priority than the API's) instead
    /// of the runtime that starts them.
    pub fn with_executor(mut self, executor: crate::exec::threads::Executor) -> Runtime {
        self.executor = Some(executor);
        self
    }

    /// The executor jobs run on, when they have one of their own.
    pub fn executor(&self) -> Option<&crate::exec::threads::Executor> {
        self.executor.as_ref()
    }

    /// DAG functions naming a `handler` run lambdas of this registry (the first call wins).
    pub fn set_handlers(&self, registry: Arc<sonic_openlambda::Handlers>) {
        let _ = self.handlers.set(registry);
    }

    /// The OpenLambda registry, when one was set.
    pub fn handlers(&self) -> Option<&Arc<sonic_openlambda::Handlers>> {
        self.handlers.get()
    }

    /// Whether this process already put the lambda tarball of digest `sha256` in the store.
    pub fn package_stored(&self, sha256: &str) -> bool {
        self.packages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(sha256)
    }

    /// Records that the lambda tarball of digest `sha256` is in the store.
    pub fn mark_package_stored(&self, sha256: &str) {
        self.packages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sha256.to_owned());
    }

    /// Runs a job's execution ([`execute`] or [`resume`]) in a task of its own, stopped by
    /// [`Runtime::stop_jobs`], on the [`Runtime::with_executor`] executor when there is one. It
    /// starts at once: holding a burst's executions until its submissions were answered did not
    /// make its jobs end sooner (docs/load.md, "Submissions first").
    pub fn spawn_job<F>(&self, execution: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let task = execution;
        let handle = match &self.executor {
            Some(e) => e.handle().spawn(task),
            None => tokio::spawn(task),
        }
        .abort_handle();
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
    }

    /// Stops executing every job, recording nothing more: what was recorded stays, so that the
    /// next control plane on the same database resumes them ([`resume`]). Runs already sent go
    /// on on their agents and are adopted then.
    pub fn stop_jobs(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks.handles {
            t.abort();
        }
    }

    /// The server of this runtime listens at `url`: agents push reports there unless
    /// `JobsConfig::report_url` names another URL (the first call wins).
    pub fn listening_at(&self, url: &str) {
        let _ = self.report_url.set(url.trim_end_matches('/').to_owned());
    }

    /// Where agents push run reports, once known.
    pub fn report_url(&self) -> Option<&str> {
        if !self.config.push_reports {
            return None;
        }
        self.report_url.get().map(String::as_str)
    }

    /// Calls agents with `http` (a client that trusts the cluster's CA).
    pub fn with_http(mut self, http: reqwest::Client) -> Runtime {
        self.agents = Arc::new(HttpAgents::new(
            http.clone(),
            self.config.agent_token.clone(),
        ));
        self.http = http;
        self
    }

    /// Talks to agents through `agents` instead of HTTP (e.g. [`crate::exec::agents::MemoryAgents`]
    /// in tests of the executor without a network).
    pub fn with_agents(mut self, agents: Arc<dyn AgentClient>) -> Runtime {
        self.agents = agents;
        self
    }

    /// Places jobs with `resources` instead of the built-in [`Pool`] over the registered agents
    /// (a host platform's own manager, e.g. one that starts machines on demand).
    pub fn with_resources(mut self, resources: Arc<dyn ResourceManager>) -> Runtime {
        self.resources = resources;
        self
    }

    /// The resource manager jobs are admitted by.
    pub fn resources(&self) -> &Arc<dyn ResourceManager> {
        &self.resources
    }

    /// The client that calls agents (it trusts the cluster's CA).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// What a joining agent is handed: the token, the file key, the store.
    pub fn join_secrets(&self) -> sonic_api::control::JoinSecrets {
        sonic_api::control::JoinSecrets {
            agent_token: self.config.agent_token.clone(),
            file_key: String::from_utf8_lossy(&self.config.file_key).into_owned(),
            store: self.config.agent_store.clone(),
            memory_tier: self.config.memory_tier.clone(),
        }
    }

    fn cancels(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.cancels.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<JobEvent>>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn granted(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.granted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a job about to be executed, so that a cancel from now on reaches it and its
    /// progress can be followed; pass its token to [`execute`] (a cancel wakes the job at once).
    pub fn register(&self, job: &str) -> CancellationToken {
        let flag = CancellationToken::new();
        self.cancels().insert(job.to_owned(), flag.clone());
        let (tx, _) = watch::channel(JobEvent {
            job_id: job.to_owned(),
            status: JobStatus::Queued,
            stage: None,
            done_instances: 0,
            total_instances: 0,
            message: None,
        });
        self.events().insert(job.to_owned(), tx);
        flag
    }

    /// Follows the progress of a job this process runs; `None` for any other job.
    pub fn subscribe(&self, job: &str) -> Option<watch::Receiver<JobEvent>> {
        self.events().get(job).map(watch::Sender::subscribe)
    }

    /// The progress of every job this process is executing now.
    pub fn progress(&self) -> Vec<JobEvent> {
        self.events()
            .values()
            .map(|tx| tx.borrow().clone())
            .collect()
    }

    /// Updates a running job's progress (subscribers see the newest state).
    fn publish(&self, job: &str, f: impl FnOnce(&mut JobEvent)) {
        if let Some(tx) = self.events().get(job) {
            tx.send_modify(f);
        }
    }

    /// Admits a planned job through the resource manager ([`crate::resources::planned::admit`]): until it
    /// is granted the job stays `queued`, its message saying why; then it shows as running.
    /// Returns the allocation and the plans it came from (re-planned when the pool was short).
    /// `prefer`: the agents a resumed job ran each stage on ([`crate::resources::Offer::prefer`]).
    #[allow(clippy::too_many_arguments)]
    async fn admit(
        &self,
        state: &Context,
        job: &JobRecord,
        dag: &Dag,
        planned: &Planned,
        agents: &[AgentSlot],
        prefer: &[Vec<String>],
        cancel: &CancellationToken,
    ) -> Result<(Allocation, Planned), String> {
        let policy = job.policy;
        let id = job.id.clone();
        let waiting = |why: &str| {
            tracing::info!(job = %id, why, "job queued");
            self.publish(&id, |e| {
                e.status = JobStatus::Queued;
                e.message = Some(why.to_owned());
            });
        };
        let replan = |limits: &BTreeMap<String, u32>| {
            let (catalog, _) = state.planning_catalog();
            crate::learn::replan(dag, planned, catalog, policy, state.plan_budget(), limits)
                .map_err(|e| e.to_string())
        };
        let admitted = crate::resources::planned::admit_preferring(
            self.resources.as_ref(),
            &job.id,
            dag,
            planned,
            agents,
            prefer,
            &waiting,
            &replan,
        );
        let admitted = until_cancelled(admitted, cancel)
            .await
            .ok_or_else(|| "cancelled".to_owned())??;
        self.granted().insert(job.id.clone());
        let (id, now) = (job.id.clone(), state.clock.now_ms());
        state
            .db
            .commit(move |w| w.set_job_status(&id, JobStatus::Running, now))
            .await
            .map_err(|e| format!("database: {e}"))?;
        self.publish(&job.id, |e| e.status = JobStatus::Running);
        Ok(admitted)
    }

    /// Gives what a job holds back to the resource manager.
    fn release(&self, job: &str) {
        self.granted().remove(job);
        self.resources.release(job);
        self.warm.release_job(job);
    }

    /// Forgets a job that ended: its cancel token, its progress, what it holds.
    fn forget(&self, job: &str) {
        self.cancels().remove(job);
        self.events().remove(job);
        self.release(job);
    }

    /// Asks a job this process is running to stop; false when it runs nothing by that id.
    pub fn cancel(&self, job: &str) -> bool {
        match self.cancels().get(job) {
            Some(flag) => {
                flag.cancel();
                true
            }
            None => false,
        }
    }

    /// Output names as users see them.
    pub fn output_url(&self, key: &str) -> String {
        match &self.config.bucket {
            Some(b) => format!("s3://{b}/{key}"),
            None => format!("store://{key}"),
        }
    }
}

/// Fails every job that was queued or running when the control plane stopped (it cannot resume
/// them). Returns how many.
pub fn fail_interrupted(db: &Db, now_ms: i64) -> Result<usize, StoreError> {
    Ok(interrupted(db, now_ms, false)?.0)
}

/// The jobs a previous control plane left queued or running: with `resume`, those [`resumable`]
/// are returned to go on with; every other one is failed with [`RESTARTED`]. Returns how many
/// were failed, and the jobs to resume.
pub fn interrupted(
    db: &Db,
    now_ms: i64,
    resume: bool,
) -> Result<(usize, Vec<JobRecord>), StoreError> {
    let mut failed = 0;
    let mut kept = Vec::new();
    for job in db.list_jobs(None, u32::MAX)? {
        if job.status.is_terminal() {
            continue;
        }
        if resume && resumable(db, &job)? {
            kept.push(job);
        } else {
            db.finish_job(&job.id, JobStatus::Failed, None, Some(RESTARTED), now_ms)?;
            failed += 1;
        }
    }
    Ok((failed, kept))
}

/// Why one execution of a job stopped.
#[derive(Debug)]
enum Failure {
    /// The job cannot go on (bad parameters, a plan that cannot run, cancelled, ...).
    Job(String),
    /// A run failed for good: whether another execution without some agents may succeed is the
    /// job machine's call (`machine::Executions`), from the failure's kind and agent and the
    /// agents that did not answer a probe after it.
    RunFailed {
        message: String,
        kind: Option<RunFailure>,
        agent: String,
        unreachable: Vec<String>,
        /// The function and instance whose run failed.
        at: Option<(String, u32)>,
    },
    /// A resumed job was granted another plan than the one its recorded runs ran under (other
    /// agents, or another method on an edge): nothing of them can be reused, and the agents
    /// may still hold runs under the same ids, so it goes on as a new execution.
    PlanChanged(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Job(e)
    }
}

impl Failure {
    /// What the executions' machine is told. A cancelled job's failure is a cancel whatever
    /// stopped it.
    fn end(self, cancelled: bool) -> ExecutionEnd {
        match self {
            Failure::Job(m) | Failure::RunFailed { message: m, .. } | Failure::PlanChanged(m)
                if cancelled =>
            {
                ExecutionEnd::Cancelled(m)
            }
            Failure::Job(message) => ExecutionEnd::Failed {
                message,
                kind: None,
                agent: String::new(),
                unreachable: Vec::new(),
            },
            Failure::RunFailed {
                message,
                kind,
                agent,
                unreachable,
                ..
            } => ExecutionEnd::Failed {
                message,
                kind,
                agent,
                unreachable,
            },
            Failure::PlanChanged(why) => ExecutionEnd::PlanChanged(why),
        }
    }
}

/// One instance that ended well.
struct Finished {
    function: usize,
    instance: u32,
    agent: usize,
    /// The plan's VM the instance ran on (see [`planned_vm`]); 0 for unplanned jobs.
    vm: usize,
    report: RunReport,
    attempts: u32,
    started: Instant,
    ended: Instant,
    /// The stage's fetch on the instance's agent, if it had one.
    fetch: Option<Arc<fetch::StageFetch>>,
    /// It succeeded before the job's retry and was not run again (its outputs are reused).
    reused: bool,
}

/// What the executor learned so far (kept for the summary of a failed job too).
#[derive(Default)]
struct Progress {
    /// Agents earlier executions of the job lost: this one runs without them.
    lost: BTreeSet<String>,
    /// Per function index: the CPUs its instances were given (right-sizing).
    cpus: BTreeMap<usize, f64>,
    functions: Vec<FunctionRun>,
    /// The attempts that failed, as they ended.
    failed: Vec<sonic_api::control::FailedAttempt>,
    /// The stages' fetches (once per stage and agent).
    fetches: Vec<sonic_api::control::FetchRun>,
    /// Per edge index: bytes and the slowest instance's staging seconds.
    edges: BTreeMap<usize, (u64, f64)>,
    /// Per edge index: bytes the sending stage wrote for it (the model's edge bytes).
    written: BTreeMap<usize, u64>,
    /// Per edge index: the methods the agents reported staging its files with.
    observed: BTreeMap<usize, BTreeSet<Method>>,
    /// Per edge index: where its senders uploaded its files (the store, or the memory tier), so
    /// that an edge nobody staged (its receiver never ran) says where they went.
    uploaded_to: BTreeMap<usize, BTreeSet<Method>>,
    /// Per function index: each instance's time outside the data passing the model counts on
    /// the DAG's edges, its lambda's own time, and whether it ran cold ([`batch_overhead_s`]).
    outside_edges: BTreeMap<usize, Vec<Outside>>,
    /// Per (agent index, the plan's VM on it): when the job first and last held it. Several
    /// VMs of a plan can share one agent (a small cluster); each is charged as the VM it is.
    spans: HashMap<(usize, usize), (Instant, Instant)>,
    /// Per (function index, instance): the (agent index, plan VM) its last run finished on.
    placed: HashMap<(usize, u32), (usize, usize)>,
    agents: Vec<AgentSlot>,
    dag: Option<Dag>,
    methods: Vec<Method>,
    instances: BTreeMap<usize, u32>,
    /// How a planned job was placed.
    plan: Option<JobPlan>,
    /// Per stage: its instances (known fanouts first, the real count once it starts).
    expected: Vec<u32>,
    done: u32,
    /// When the job started: instances' times are given from it.
    origin: Option<Instant>,
    /// What the executions a lost agent made the job abandon cost, USD (counted in the job's
    /// cost: their work was paid for and discarded).
    discarded_usd: f64,
    /// The store's requests and the files kept, for the job's storage cost.
    store: StoreUse,
}

/// What a job's intermediate files used of storage (the model's storage terms,
/// spec/model.md "Cost of a job"): the object store's requests on the DAG's edges, and every
/// file sent on an edge, its size, where it is kept and since when (kept until the job's end,
/// when the agents and the store delete them).
#[derive(Debug, Default)]
struct StoreUse {
    /// Files sent `remote`: one PUT each.
    puts: u64,
    /// Remote inputs an agent fetched (not those another instance on it had fetched).
    gets: u64,
    /// (bytes, written at, where it is kept).
    kept: Vec<(u64, Instant, Kept)>,
}

/// Where a file of a job is kept while it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// On an agent's disk.
    Local,
    /// In the object store.
    Store,
    /// In the in-memory tier.
    Memory,
}

impl StoreUse {
    /// (storage, requests) in USD at `catalog`'s prices, the files kept until `end`.
    fn cost(&self, catalog: Option<&Catalog>, end: Instant) -> (f64, f64) {
        let Some(c) = catalog else {
            return (0.0, 0.0);
        };
        let per_byte_s = |usd_per_gb_month: f64| usd_per_gb_month / SECONDS_PER_MONTH / 1e9;
        let (local, remote) = (
            per_byte_s(c.local_storage.usd_per_gb_month),
            per_byte_s(c.remote_storage.usd_per_gb_month),
        );
        let storage = self
            .kept
            .iter()
            .map(|&(bytes, since, kept)| {
                let price = match kept {
                    Kept::Local => local,
                    Kept::Store => remote,
                    Kept::Memory => c
                        .memory_tier
                        .as_ref()
                        .map_or(0.0, |m| m.usd_per_byte_second()),
                };
                bytes as f64 * end.saturating_duration_since(since).as_secs_f64() * price
            })
            .sum();
        let requests = self.puts as f64 * c.remote_storage.put_usd_per_1k / 1e3
            + self.gets as f64 * c.remote_storage.get_usd_per_1k / 1e3;
        (storage, requests)
    }
}

/// Runs a submitted job to its end and records it. Never fails: errors become a failed job.
/// `planned` is the plan of a `sonic` job (chosen at submission, for its input size).
pub async fn execute(
    state: Arc<Context>,
    rt: Arc<Runtime>,
    job: JobRecord,
    inputs: Vec<JobInputFile>,
    cancel: CancellationToken,
    planned: Option<Planned>,
) {
    execute_from(state, rt, job, inputs, cancel, planned, None).await;
}

/// Records which execution a job is in and what it needs to go on after a restart (its grant
/// is added once granted).
async fn record_execution(
    state: &Context,
    job: &str,
    (number, before): (u32, u32),
    inputs: &[JobInputFile],
    lost: &BTreeSet<String>,
) {
    let record = ExecutionRecord {
        number,
        before,
        inputs: inputs
            .iter()
            .map(|i| (i.name.clone(), i.key.clone()))
            .collect(),
        lost: lost.iter().cloned().collect(),
        hosts: Vec::new(),
        methods: Vec::new(),
    };
    let (id, now) = (job.to_owned(), state.clock.now_ms());
    if let Err(e) = state
        .db
        .commit(move |w| w.set_job_execution(&id, &record, now))
        .await
    {
        tracing::warn!(job, error = %e, "cannot record the job's execution");
    }
}

/// Where a job a previous control plane was running goes on from.
struct Resumed {
    execution: ExecutionRecord,
    runs: Vec<InstanceRunRecord>,
}

/// What [`run`] goes on from: the instances a previous control plane sent in this execution,
/// and the plan a planned job was granted: the agents of its stages (agent ids per function, in
/// VM order) and each edge's method.
#[derive(Debug, Default)]
struct Recorded {
    runs: Vec<InstanceRunRecord>,
    hosts: Vec<Vec<String>>,
    methods: Vec<Method>,
}

/// Whether [`resume`] can take a job a previous control plane left unfinished: it recorded the
/// job's execution.
pub fn resumable(db: &Db, job: &JobRecord) -> Result<bool, StoreError> {
    Ok(!job.status.is_terminal() && db.job_execution(&job.id)?.is_some())
}

/// Goes on with a job a previous control plane left unfinished, from what it recorded: the
/// instances it saw succeed are not run again, those it had sent are asked for again (an agent
/// that still has the run answers with it), the rest run as usual. Register the job first
/// ([`Runtime::register`]) and pass its cancel token. `planned`: a planned job's plan made
/// again (`crate::admission::resume`), or why it could not be.
pub async fn resume(
    state: Arc<Context>,
    rt: Arc<Runtime>,
    job: JobRecord,
    cancel: CancellationToken,
    planned: Option<Result<Planned, String>>,
) {
    let id = job.id.clone();
    let loaded = state
        .db
        .run(move |db| {
            let Some(execution) = db.job_execution(&id)? else {
                return Ok(None);
            };
            let runs = db.instance_runs(&id, execution.number)?;
            Ok(Some(Resumed { execution, runs }))
        })
        .await;
    match loaded {
        Ok(Some(resumed)) => {
            let inputs = resumed
                .execution
                .inputs
                .iter()
                .map(|(name, key)| JobInputFile {
                    name: name.clone(),
                    key: key.clone(),
                })
                .collect();
            // A planned job was planned again (`crate::admission::resume`); the resource
            // manager is asked for the agents it ran on before.
            let planned = match planned {
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => {
                    let why = format!("{RESTARTED}; the job cannot be planned again: {e}");
                    return fail_unresumed(&state, &rt, &job, why).await;
                }
                None => None,
            };
            tracing::info!(job = %job.id, execution = resumed.execution.number, recorded = resumed.runs.len(), "resuming the job");
            execute_from(state, rt, job, inputs, cancel, planned, Some(resumed)).await;
        }
        other => {
            let why = match other {
                Err(e) => format!("{RESTARTED}; its execution cannot be read: {e}"),
                _ => format!("{RESTARTED}; nothing of its execution was recorded"),
            };
            fail_unresumed(&state, &rt, &job, why).await;
        }
    }
}

/// Fails a job a previous control plane left unfinished that cannot go on, saying why.
async fn fail_unresumed(state: &Context, rt: &Runtime, job: &JobRecord, why: String) {
    tracing::warn!(job = %job.id, "{why}");
    let (id, now) = (job.id.clone(), state.clock.now_ms());
    let reason = why.clone();
    if let Err(e) = state
        .db
        .commit(move |w| w.finish_job(&id, JobStatus::Failed, None, Some(&reason), now))
        .await
    {
        tracing::error!(job = %job.id, error = %e, "cannot record the job's end");
    }
    rt.publish(&job.id, |e| {
        e.status = JobStatus::Failed;
        e.message = Some(why);
    });
    rt.forget(&job.id);
}

async fn execute_from(
    state: Arc<Context>,
    rt: Arc<Runtime>,
    job: JobRecord,
    inputs: Vec<JobInputFile>,
    cancel: CancellationToken,
    planned: Option<Planned>,
    mut resumed: Option<Resumed>,
) {
    // A resumed job's latency counts from when it first started.
    let started = match (&resumed, job.started_ms) {
        (Some(_), Some(ms)) => instant_at(&state, ms),
        _ => Instant::now(),
    };
    // Recorded before the job shows as running: a job a restart finds running can go on. A new
    // unplanned job records both in one commit.
    let fresh = resumed.is_none() && planned.is_none();
    if fresh {
        let record = ExecutionRecord {
            number: 1,
            before: 0,
            inputs: inputs
                .iter()
                .map(|i| (i.name.clone(), i.key.clone()))
                .collect(),
            lost: Vec::new(),
            hosts: Vec::new(),
            methods: Vec::new(),
        };
        let (id, now) = (job.id.clone(), state.clock.now_ms());
        if let Err(e) = state
            .db
            .commit(move |w| {
                w.set_job_execution(&id, &record, now)?;
                w.set_job_status(&id, JobStatus::Running, now)
            })
            .await
        {
            tracing::error!(job = %job.id, error = %e, "cannot record the job's execution and start");
        }
        rt.publish(&job.id, |e| e.status = JobStatus::Running);
    } else if resumed.is_none() {
        record_execution(&state, &job.id, (1, 0), &inputs, &BTreeSet::new()).await;
    }
    // A planned job shows as running once the resource manager admits it (`Runtime::admit`).
    if planned.is_none() && !fresh {
        let now = state.clock.now_ms();
        let id = job.id.clone();
        if let Err(e) = state
            .db
            .commit(move |w| w.set_job_status(&id, JobStatus::Running, now))
            .await
        {
            tracing::error!(job = %job.id, error = %e, "cannot mark the job running");
        }
        rt.publish(&job.id, |e| e.status = JobStatus::Running);
    }
    // The DAG's deadline counts from the submission, across restarts: past it the job is
    // stopped as a cancel stops it, and fails naming the deadline.
    let parsed = state
        .db
        .parsed_dag_at(&job.dag, job.dag_revision)
        .await
        .ok()
        .flatten();
    let deadline = parsed.as_ref().and_then(|p| p.dag.deadline_s);
    let deadline_passed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = deadline.map(|secs| {
        // A retried job's from its retry.
        let from = job.retried_ms.unwrap_or(job.created_ms);
        let at = instant_at(&state, from) + Duration::from_secs_f64(secs);
        let (cancel, passed) = (cancel.clone(), deadline_passed.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            passed.store(true, std::sync::atomic::Ordering::SeqCst);
            cancel.cancel();
        })
    });
    // Every agent any execution used, for the final cleanup.
    let mut used: Vec<AgentSlot> = Vec::new();
    // Whether a failed execution is followed by another, without which agents, is the job
    // machine's decision (`machine::Executions`).
    // Executions of the job's earlier tries (before a retry) do not count against this one's.
    let before = resumed.as_ref().map_or(0, |r| r.execution.before);
    let mut executions = Executions::new(
        resumed.as_ref().map_or(1, |r| r.execution.number),
        rt.config.job_attempts.saturating_add(before),
        resumed
            .as_ref()
            .map(|r| r.execution.lost.clone())
            .unwrap_or_default(),
    );
    let mut discarded = 0.0;
    // The kind of the run failure that failed the job, for its summary, and whose run it was.
    let mut failed_kind = None;
    let mut failed_at = None;
    let (outcome, progress) = loop {
        let execution = executions.execution();
        let mut progress = Progress {
            lost: executions.lost().clone(),
            origin: Some(started),
            discarded_usd: discarded,
            ..Progress::default()
        };
        let recorded = resumed
            .take()
            .map(|r| Recorded {
                hosts: r.execution.hosts,
                methods: r.execution.methods,
                runs: r.runs,
            })
            .unwrap_or_default();
        let outcome = execution::run(
            &state,
            &rt,
            &job,
            &inputs,
            &cancel,
            planned.as_ref(),
            &mut progress,
            execution,
            recorded,
        )
        .await;
        for a in &progress.agents {
            if !used.iter().any(|u| u.id == a.id) {
                used.push(a.clone());
            }
        }
        let failure = match outcome {
            Ok(()) => break (Ok(()), progress),
            Err(f) => f,
        };
        let (kind, at) = match &failure {
            Failure::RunFailed { kind, at, .. } => (*kind, at.clone()),
            _ => (None, None),
        };
        failed_at = at;
        if let Some(secs) = deadline
            && deadline_passed.load(std::sync::atomic::Ordering::SeqCst)
        {
            break (
                Err(format!(
                    "the job ran past its deadline of {} (the DAG's `deadline:`, counted from its submission) and was stopped",
                    sonic_core::units::Seconds(secs)
                )),
                progress,
            );
        }
        let why = match executions.ended(failure.end(cancel.is_cancelled())) {
            Next::Fail(message) => {
                // A cancelled job says so, whatever stopped its last run.
                failed_kind = if cancel.is_cancelled() {
                    Some(RunFailure::Cancelled)
                } else {
                    kind
                };
                break (Err(message), progress);
            }
            Next::RunAgain { why, .. } => why,
        };
        tracing::warn!(job = %job.id, "{why}");
        rt.publish(&job.id, |e| {
            e.stage = None;
            e.done_instances = 0;
            e.message = Some(why.clone());
        });
        discarded += spans_cost(rt.catalog.as_ref(), &progress);
        // The next execution starts from the job's input: this one's files go, and its runs'
        // ids with them (the next execution's runs are named after it).
        let lost = executions.lost();
        clear_execution(&state, &rt, &job.id, &progress.agents, lost).await;
        rt.release(&job.id);
        // What the next execution needs to go on after a restart, before it sends anything.
        record_execution(
            &state,
            &job.id,
            (executions.execution(), before),
            &inputs,
            lost,
        )
        .await;
    };
    if let Some(w) = watcher {
        w.abort();
    }
    // The last execution's agents stay in the progress: its runs and spans index them.
    let latency_s = started.elapsed().as_secs_f64();
    rt.publish(&job.id, |e| {
        e.stage = None;
        e.message = Some("cleaning up".into());
    });
    // A failed job keeps its files for a retry to reuse (`sweep_kept` deletes them later); its
    // runs still going on stop.
    let keep = outcome.is_err() && !rt.config.keep_failed.is_zero();
    if keep {
        stop_runs(&rt, &job.id, &used).await;
    } else {
        cleanup(&state, &rt, &job.id, &used).await;
    }
    let outputs = match &outcome {
        Ok(()) => result_outputs(&state, &rt, &job.id).await,
        Err(_) => Vec::new(),
    };
    // A job that failed (not one its user cancelled) runs its DAG's `on_failure` function.
    let cancelled_by_user =
        cancel.is_cancelled() && !deadline_passed.load(std::sync::atomic::Ordering::SeqCst);
    let hook = match (&outcome, &parsed) {
        (Err(error), Some(p)) if p.dag.on_failure.is_some() && !cancelled_by_user => {
            let function = p.dag.on_failure.as_ref().map(|f| f.name.clone());
            rt.publish(&job.id, |e| {
                e.message = function.map(|f| format!("running its on_failure function {f}"));
            });
            let context = on_failure::FailureContext {
                job_id: job.id.clone(),
                dag: job.dag.clone(),
                dag_revision: job.dag_revision,
                error: error.clone(),
                function: failed_at.as_ref().map(|(f, _)| f.clone()),
                instance: failed_at.as_ref().map(|(_, k)| *k),
                kind: failed_kind,
                params: p.dag.job_params(&job.params.clone().into_iter().collect()),
            };
            on_failure::run(&state, &rt, &job, &p.dag, &context).await
        }
        _ => None,
    };
    let mut summary = summarize(
        &rt,
        &job,
        &progress,
        latency_s,
        outputs,
        outcome.as_ref().err(),
        failed_kind,
    );
    if let Some((run, agent)) = hook {
        if let Some(a) = &agent {
            // What it cost, in the job's cost; what it left on its agent, gone with the job's
            // files (kept for a retry, they go when the rest does).
            summary.cost_usd += run.seconds * price_per_second(rt.catalog.as_ref(), &a.vm_type);
            if summary.latency_s > 0.0 && summary.cost_usd > 0.0 {
                summary.perf_per_dollar = 1.0 / (summary.latency_s * summary.cost_usd);
            }
            if !keep {
                cleanup(&state, &rt, &job.id, std::slice::from_ref(a)).await;
            }
        }
        summary.on_failure = Some(run);
    }
    let (status, error) = match &outcome {
        Ok(()) => (JobStatus::Succeeded, None),
        Err(e) => (JobStatus::Failed, Some(e.clone())),
    };
    state.metrics.job_ended(&summary);
    tracing::info!(job = %job.id, %status, latency_s, error = error.as_deref().unwrap_or(""), "job ended");
    // The sample and the refit are recorded before the job shows as ended, so that a client
    // that waits for it and submits again is planned with what it taught.
    let mut mode_changed = None;
    // A retried job that reused instances of its earlier try measured only part of the DAG
    // end to end: it teaches nothing.
    let reused = progress.functions.iter().filter(|f| f.reused).count();
    if reused > 0 {
        tracing::info!(job = %job.id, reused, "a retry that reused instances: not a sample");
    }
    if status == JobStatus::Succeeded
        && reused == 0
        && let Some(dag) = progress.dag.clone()
    {
        let s = sample(&job, &progress, &state);
        let rule = rt.config.convergence;
        let now = state.clock.now_ms();
        let models = rt.clone();
        let overrides = job.params.clone().into_iter().collect();
        let known_fanouts = dag
            .fanouts(&dag.job_params(&overrides))
            .map(|fs| {
                dag.functions
                    .iter()
                    .zip(fs)
                    .filter_map(|(f, k)| match k {
                        sonic_core::dag::Fanout::Known(n) => Some((f.name.clone(), n)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        // The job's sample teaches the models of its own parameter setting only.
        let setting = crate::learn::job_setting(&dag, &job.params);
        let finished = crate::learn::Finished {
            job: job.id.clone(),
            mode: job.mode,
            known_fanouts,
        };
        let learned = state
            .db
            .run(move |db| {
                // The sample is added under the lock too: a refit then finds the stored fit one
                // sample behind and adds it, where samples of jobs ending at once made it fit
                // every sample again.
                let _one_at_a_time = models.models.lock().unwrap_or_else(|p| p.into_inner());
                db.put_sample(&s)?;
                crate::learn::refit(db, &dag, &setting, rule, now, Some(&finished))
            })
            .await;
        match learned {
            Err(e) => {
                tracing::error!(job = %job.id, error = %e, "cannot record the sample or refit")
            }
            // Whoever follows the job sees why the DAG's mode changed with it.
            Ok(r) => mode_changed = r.changed,
        }
    }
    let id = job.id.clone();
    let now = state.clock.now_ms();
    let final_message = error.clone().or(mode_changed);
    let recorded = state
        .db
        .commit(move |w| {
            let found = w.finish_job(&id, status, Some(&summary), error.as_deref(), now)?;
            // An ended job is never resumed: what its executions sent is forgotten, but for
            // what a failed one keeps for a retry.
            if !keep {
                w.delete_instance_runs(&id)?;
            }
            Ok(found)
        })
        .await;
    if let Err(e) = recorded {
        tracing::error!(job = %job.id, error = %e, "cannot record the job's end");
    }
    rt.publish(&job.id, |e| {
        e.status = status;
        e.stage = None;
        e.message = final_message;
    });
    rt.forget(&job.id);
}

/// The job plan as recorded: what was planned and where each stage runs.
fn job_plan(
    dag: &Dag,
    alloc: &Allocation,
    agents: &[AgentSlot],
    report: &PlanReport,
    warm: &crate::learn::warm::WarmPool,
) -> JobPlan {
    // The document's top level is the plan that runs; the best one stays for the record.
    let report = match alloc.used {
        crate::resources::planned::Used::SecondBest => {
            report.clone().running_second_best(alloc.plan.clone())
        }
        _ => report.clone(),
    };
    // Planning that the budget cut short says so, in the record as in the report.
    let mut notes = alloc.notes.clone();
    match report.plan.stopped {
        Some(stopped) => notes.push(format!("planning budget: {stopped}")),
        None if !report.plan.exact => {
            notes.push("planning budget: the plan is not proven optimal".to_owned())
        }
        None => {}
    }
    let plan_stage = |i: usize| {
        alloc
            .plan
            .stages
            .iter()
            .find(|s| s.function == dag.functions[i].name)
    };
    let priced_warm = |i: usize| plan_stage(i).is_some_and(|s| s.warm);
    for (i, f) in dag.functions.iter().enumerate() {
        let Some(ps) = plan_stage(i).filter(|s| s.warm) else {
            continue;
        };
        // The first batch on each of its agents (a receiver over vm-storage runs on its
        // sender's agents, which need not be the warm ones).
        let first = ps.per_vm.min(alloc.concurrent[i]).max(1);
        let cold: Vec<&str> = alloc.hosts[i]
            .iter()
            .map(|&a| agents[a].id.as_str())
            .filter(|id| warm.on(&f.name, id) < first)
            .collect();
        if !cold.is_empty() {
            notes.push(format!(
                "{} was priced warm, but {} keep{} fewer than the {first} warm containers its first batch needs: it starts cold there",
                f.name,
                cold.join(", "),
                if cold.len() == 1 { "s" } else { "" }
            ));
        }
    }
    JobPlan {
        exact: Some(report.plan.exact),
        used: alloc.used,
        notes,
        report: Some(report),
        stages: dag
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| StageHosts {
                function: f.name.clone(),
                vm_type: alloc
                    .plan
                    .stages
                    .iter()
                    .find(|s| s.function == f.name)
                    .map_or_else(String::new, |s| s.vm_type.clone()),
                agents: alloc.hosts[i]
                    .iter()
                    .map(|&a| agents[a].id.clone())
                    .collect(),
                concurrent: alloc.concurrent[i],
                memory_limit_mb: alloc.memory_limit_mb[i],
                warm: priced_warm(i),
            })
            .collect(),
    }
}

/// Fails a planned stage whose vm-storage inputs are on an agent that is gone: its files went
/// with it, and no other agent can link them.
async fn check_vm_storage_senders(
    state: &Arc<Context>,
    dag: &Dag,
    alloc: &Allocation,
    agents: &[AgentSlot],
    i: usize,
) -> Result<(), String> {
    let senders = alloc.vm_storage_senders(dag, i);
    if senders.is_empty() {
        return Ok(());
    }
    let now = state.clock.now_ms();
    let timeout = state.heartbeat_timeout;
    let records = state
        .db
        .run(|db| db.list_agents())
        .await
        .map_err(|e| format!("database: {e}"))?;
    for (from, hosts) in senders {
        for &h in hosts {
            let id = &agents[h].id;
            let alive = records.iter().any(|r| &r.id == id && r.alive(now, timeout));
            if !alive {
                return Err(format!(
                    "vm-storage {} -> {}: agent {id}, which holds {}'s output, is gone",
                    dag.functions[from].name, dag.functions[i].name, dag.functions[from].name
                ));
            }
        }
    }
    Ok(())
}

/// Counts the stages that ended since the last call (`seen`: those already counted) in the
/// metrics and the job's progress.
fn stages_ended(
    state: &Context,
    rt: &Runtime,
    job: &JobRecord,
    dag: &Dag,
    machine: &JobMachine,
    opened: &[Option<Opened>],
    seen: &mut [bool],
) {
    for (i, seen) in seen.iter_mut().enumerate() {
        if !*seen && machine.ended(i) {
            *seen = true;
            if let Some(o) = &opened[i] {
                let stage = &dag.functions[i].name;
                state
                    .metrics
                    .stage_ended(&job.dag, stage, o.since.elapsed().as_secs_f64());
            }
            let running = running_stages(dag, machine);
            rt.publish(&job.id, |e| e.stage = running);
        }
    }
}

/// What the executor keeps of a stage the machine opened.
struct Opened {
    /// Its requests by instance: all of them when it opened, or each when it first starts (a
    /// stage whose instances start one by one).
    requests: HashMap<u32, crate::exec::requests::Placement>,
    /// A planned stage's concurrency per agent.
    permits: HashMap<usize, Arc<Semaphore>>,
    /// Per agent: its instances' inputs, fetched before the first of them runs.
    fetches: HashMap<usize, Arc<fetch::StageFetch>>,
    count: u32,
    since: Instant,
}

/// Records a finished instance (its run, its files, that it ended) and returns the event that
/// tells the machine, so that an instance that reads its files starts only once they are
/// recorded.
#[allow(clippy::too_many_arguments)]
async fn succeed(
    state: &Arc<Context>,
    rt: &Runtime,
    job: &str,
    dag: &Dag,
    agents: &[AgentSlot],
    execution: u32,
    f: Finished,
    progress: &mut Progress,
    produced: &mut [Vec<Produced>],
) -> Result<Event, Failure> {
    let ended = Event::RunEnded {
        stage: f.function,
        instance: f.instance,
        attempt: f.attempts,
    };
    progress.done += 1;
    let finished = progress.done;
    rt.publish(job, |e| e.done_instances = finished);
    let mut files = Vec::new();
    record_instance(dag, agents, &f, progress, produced, job, &mut files);
    let ended_run = InstanceRunRecord {
        job: job.to_owned(),
        execution,
        function: dag.functions[f.function].name.clone(),
        instance: f.instance,
        attempt: f.attempts,
        agent: agents[f.agent].id.clone(),
        report: Some(f.report.clone()),
        started_ms: ms_at(state, f.started),
        ended_ms: Some(ms_at(state, f.ended)),
    };
    // Its log goes with them (one commit): the attempt kept only the logs of runs that failed.
    let log = Some((
        job.to_owned(),
        InstanceLog {
            function: ended_run.function.clone(),
            instance: f.instance,
            attempt: f.attempts,
            agent: ended_run.agent.clone(),
            log: f.report.log.clone(),
        },
    ));
    // A reused instance's run and log are recorded as they were (the retry moved them here).
    if f.reused {
        put_files(state, files, None, None).await?;
    } else {
        put_files(state, files, Some(ended_run), log).await?;
    }
    Ok(ended)
}

/// Whether the DAG's jobs share warm containers across jobs: once the models of the job's
/// parameter setting learned every function's cold time under the rule in force
/// (`sonic_core::warm`, the rule the simulator follows too); and how many jobs the setting's
/// models learned from.
async fn cold_times_learned(
    state: &Context,
    rt: &Runtime,
    dag: &Dag,
    params: &serde_json::Map<String, serde_json::Value>,
) -> (bool, usize) {
    let (d, rule) = (dag.clone(), rt.config.convergence);
    let setting = crate::learn::job_setting(dag, params);
    match state
        .db
        .run(move |db| crate::learn::current(db, &d, &setting, rule))
        .await
    {
        Ok(m) => (sonic_core::warm::shares_across_jobs(&m), m.jobs),
        Err(e) => {
            tracing::warn!(dag = %dag.name, error = %e, "cannot read the models");
            (false, 0)
        }
    }
}

/// The stages running now (opened, a stage being opened included, and not ended), by name, for
/// the job's progress (`a, b` while two branches run).
fn running_stages(dag: &Dag, machine: &JobMachine) -> Option<String> {
    let names: Vec<&str> = dag
        .functions
        .iter()
        .enumerate()
        .filter(|(i, _)| machine.opened(*i) && !machine.ended(*i))
        .map(|(_, f)| f.name.as_str())
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// Records where a finished instance's files are, then that it ended, before the instances
/// that read them start (a restart between the two asks the agent for its report again).
async fn put_files(
    state: &Arc<Context>,
    mut files: Vec<FileRecord>,
    ended: Option<InstanceRunRecord>,
    log: Option<(String, InstanceLog)>,
) -> Result<(), Failure> {
    let now = state.clock.now_ms();
    for r in &mut files {
        r.created_ms = now;
    }
    state
        .db
        .commit(move |w| {
            files.iter().try_for_each(|r| w.put_file(r))?;
            if let Some((job, l)) = &log {
                w.put_log(job, l, now)?;
            }
            match &ended {
                Some(e) => w.put_instance_run(e),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| Failure::Job(format!("database: {e}")))
}

/// The monotonic instant of a wall-clock time in ms (for runs a previous process recorded).
fn instant_at(state: &Context, ms: i64) -> Instant {
    let ago = Duration::from_millis(u64::try_from(state.clock.now_ms() - ms).unwrap_or(0));
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

/// The wall-clock time in ms of a monotonic instant.
fn ms_at(state: &Context, at: Instant) -> i64 {
    let now = Instant::now();
    let ago = now.saturating_duration_since(at).as_millis() as i64;
    let ahead = at.saturating_duration_since(now).as_millis() as i64;
    state.clock.now_ms() - ago + ahead
}

/// `f`, or `None` once `cancel` is set (at once: the token wakes its waiters).
async fn until_cancelled<F: std::future::Future>(
    f: F,
    cancel: &CancellationToken,
) -> Option<F::Output> {
    tokio::select! {
        out = f => Some(out),
        () = cancel.cancelled() => None,
    }
}

/// The agents of `agents` that do not answer `GET /v1/health` in time.
async fn unreachable_agents(rt: &Runtime, agents: &[AgentSlot]) -> Vec<String> {
    let probes = agents.iter().map(|a| async move {
        (!rt.agents.healthy(a, rt.config.health_timeout).await).then(|| a.id.clone())
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Which of the plan's VMs the stage's VM `vm` (the machine's placement) is, as a number unique
/// within the job: the VM's slot in the stage that started its vm-storage group (a receiver over
/// vm-storage runs on its sender's VMs), offset by that stage's index.
fn planned_vm(dag: &Dag, a: &crate::resources::planned::Allocation, i: usize, vm: u32) -> usize {
    let mut root = i;
    // A stage over vm-storage continues its sender's VMs; the DAG is acyclic, so this ends.
    for _ in 0..dag.functions.len() {
        let sender = dag
            .edges
            .iter()
            .enumerate()
            .find(|(e, edge)| edge.to == root && a.methods.get(*e) == Some(&Method::VmStorage))
            .map(|(_, edge)| edge.from);
        match sender {
            Some(s) => root = s,
            None => break,
        }
    }
    let slots = a.hosts.get(i).map_or(1, |h| h.len().max(1));
    1 + root * 100_000 + (vm as usize % slots)
}

/// A `direct` sender's VM is held until its receivers have fetched (the model's rule, spec/
/// model.md "Cost of a job"): each VM that served one of `f`'s direct inputs is held at least
/// until `f` had staged its inputs. The agent stages them (several at a time) before the lambda
/// starts, each reporting its share of their wall time, so staging ended by `started` plus the
/// sum of those shares.
///
/// A file the stage's fetch brought ([`fetch::StageFetch`]) held its sender until that fetch
/// ended ([`record_fetch`]), not until this instance started: the run staged it without a copy.
fn hold_direct_senders(dag: &Dag, f: &Finished, progress: &mut Progress) {
    let staging: f64 = f.report.staged.iter().map(|s| s.seconds.max(0.0)).sum();
    let staged_until = (f.started + Duration::from_secs_f64(staging)).min(f.ended);
    let prefetched = f.fetch.as_ref().is_some_and(|x| x.fetched().is_some());
    for s in &f.report.staged {
        if s.method != Method::Direct || (prefetched && !s.fetched) {
            continue;
        }
        let mut parts = s.dest.split('/');
        let (Some(from), Some(Ok(instance))) = (parts.next(), parts.next().map(str::parse::<u32>))
        else {
            continue;
        };
        let Some(function) = dag.functions.iter().position(|g| g.name == from) else {
            continue;
        };
        let Some(&at) = progress.placed.get(&(function, instance)) else {
            continue;
        };
        if let Some(span) = progress.spans.get_mut(&at) {
            span.1 = span.1.max(staged_until);
        }
    }
}

/// What the stage's fetch on `f`'s agent did, if it had one: the instance's VM is held from
/// the fetch's start; once per fetch, its files' edges take its times, its `remote` files its
/// GETs, and each `direct` sender's VM is held until the fetch ended (the model's hold).
fn record_fetch(f: &Finished, progress: &mut Progress) {
    let Some(fetch) = &f.fetch else {
        return;
    };
    let Some(fetched) = fetch.fetched() else {
        return;
    };
    if let Some(span) = progress.spans.get_mut(&(f.agent, f.vm)) {
        span.0 = span.0.min(fetched.started);
    }
    let Some((fetched, files)) = fetch.record_once() else {
        return;
    };
    if let Some(origin) = progress.origin {
        let function = progress
            .dag
            .as_ref()
            .and_then(|d| d.functions.get(f.function))
            .map(|g| g.name.clone())
            .unwrap_or_default();
        progress.fetches.push(sonic_api::control::FetchRun {
            function,
            agent: progress
                .agents
                .get(f.agent)
                .map(|a| a.id.clone())
                .unwrap_or_default(),
            started_s: fetched
                .started
                .saturating_duration_since(origin)
                .as_secs_f64(),
            ended_s: fetched
                .ended
                .saturating_duration_since(origin)
                .as_secs_f64(),
            bytes: fetched.report.files.iter().map(|x| x.bytes).sum(),
        });
    }
    let seconds = fetched.ended.saturating_duration_since(fetched.started);
    for (of, file) in files.iter().zip(&fetched.report.files) {
        let total = progress.edges.entry(of.edge).or_default();
        total.1 = total.1.max(file.done_s.min(seconds.as_secs_f64()));
        match of.sender {
            Some(sender) => {
                if let Some(at) = progress.placed.get(&sender)
                    && let Some(span) = progress.spans.get_mut(at)
                {
                    span.1 = span.1.max(fetched.ended);
                }
            }
            None if file.fetched && of.from_store => progress.store.gets += 1,
            None => {}
        }
    }
}

/// Adds one finished instance to the progress: its run, its edges, its files.
fn record_instance(
    dag: &Dag,
    agents: &[AgentSlot],
    f: &Finished,
    progress: &mut Progress,
    produced: &mut [Vec<Produced>],
    job: &str,
    files: &mut Vec<FileRecord>,
) {
    let r = &f.report;
    let function = &dag.functions[f.function];
    let agent = &agents[f.agent];
    progress.functions.push(FunctionRun {
        reused: f.reused,
        name: function.name.clone(),
        instance: f.instance,
        agent: agent.id.clone(),
        vm_type: agent.vm_type.clone(),
        cold: r.cold.unwrap_or(false),
        seconds: r.seconds.unwrap_or(0.0),
        start_latency_s: r.start_latency_s,
        start_contention: r.start_contention,
        peak_memory_mb: r.peak_memory_mb,
        // What the agent's sandbox gave it (a host smaller than the VM type gives fewer
        // than asked), else what it was sent with.
        cpus: r.cpus.or_else(|| progress.cpus.get(&f.function).copied()),
        attempts: f.attempts,
        started_s: progress
            .origin
            .map(|o| f.started.saturating_duration_since(o).as_secs_f64()),
        ended_s: progress
            .origin
            .map(|o| f.ended.saturating_duration_since(o).as_secs_f64()),
    });
    let span = progress
        .spans
        .entry((f.agent, f.vm))
        .or_insert((f.started, f.ended));
    span.0 = span.0.min(f.started);
    span.1 = span.1.max(f.ended);
    progress
        .placed
        .insert((f.function, f.instance), (f.agent, f.vm));
    hold_direct_senders(dag, f, progress);
    record_fetch(f, progress);
    // Staged inputs by edge: `<from>/<i>/<name>` names the sender.
    let mut per_edge: BTreeMap<usize, (u64, f64)> = BTreeMap::new();
    for s in &r.staged {
        let Some(from) = s.dest.split('/').next() else {
            continue;
        };
        let Some(edge) = dag
            .edges
            .iter()
            .position(|e| e.to == f.function && dag.functions[e.from].name == from)
        else {
            continue;
        };
        let entry = per_edge.entry(edge).or_default();
        entry.0 += s.bytes;
        entry.1 += s.seconds;
        if s.method == Method::Remote && s.fetched {
            progress.store.gets += 1;
        }
        progress.observed.entry(edge).or_default().insert(s.method);
    }
    let staged_on_edges: f64 = per_edge.values().map(|(_, s)| s).sum();
    for (edge, (bytes, seconds)) in per_edge {
        let total = progress.edges.entry(edge).or_default();
        total.0 += bytes;
        total.1 = total.1.max(seconds);
    }
    // Uploads to the store of outputs on the DAG's edges: the model counts them as the edge's
    // upload (remote); results and everything else are the instance's overhead.
    let uploaded_on_edges: f64 = r
        .outputs
        .iter()
        .filter(|o| {
            dag.edges
                .iter()
                .any(|e| e.from == f.function && dag.functions[e.to].name == o.to)
        })
        .filter_map(|o| o.upload_seconds)
        .sum();
    // A handler's one-off setup on the agent (its code fetched, its environment built: pip
    // installs in the first run of a requirements set) is not a per-instance overhead either.
    // Nor is the part of a cold start that waited for other starts on the agent's host: the
    // run's time is learned without it (`uncontended`), and so is its time outside the edges.
    let run = progress.functions.last();
    let contended = run.map_or(0.0, |run| (run.seconds - uncontended(run).0).max(0.0));
    progress
        .outside_edges
        .entry(f.function)
        .or_default()
        .push(Outside {
            outside_s: f.ended.saturating_duration_since(f.started).as_secs_f64()
                - staged_on_edges
                - uploaded_on_edges
                - r.setup_s.unwrap_or(0.0)
                - contended,
            lambda_s: r.seconds.unwrap_or(0.0) - contended,
            cold: r.cold.unwrap_or(false),
        });
    for o in &r.outputs {
        if let Some(edge) = dag
            .edges
            .iter()
            .position(|e| e.from == f.function && dag.functions[e.to].name == o.to)
        {
            *progress.written.entry(edge).or_default() += o.size;
            if o.key.is_some() {
                progress
                    .uploaded_to
                    .entry(edge)
                    .or_default()
                    .insert(if o.in_memory {
                        Method::Memory
                    } else {
                        Method::Remote
                    });
                if o.in_memory {
                    progress.store.kept.push((o.size, f.ended, Kept::Memory));
                } else {
                    progress.store.puts += 1;
                    progress.store.kept.push((o.size, f.ended, Kept::Store));
                }
            }
        }
        let keep_local = o.to != "result"
            && dag.edges.iter().enumerate().any(|(i, e)| {
                e.from == f.function
                    && dag.functions[e.to].name == o.to
                    && !matches!(
                        progress.methods.get(i),
                        Some(&Method::Remote | &Method::Memory)
                    )
            });
        if keep_local {
            progress.store.kept.push((o.size, f.ended, Kept::Local));
        }
        let instance = instance_from_path(&o.file_path).unwrap_or(f.instance);
        produced[f.function].push(Produced {
            instance,
            to: o.to.clone(),
            name: o.name.clone(),
            file_path: o.file_path.clone(),
            agent: f.agent,
            key: o.key.clone(),
            in_memory: o.in_memory,
            size: o.size,
        });
        if keep_local || o.key.is_some() {
            files.push(FileRecord {
                job: job.to_owned(),
                file_id: o.file_path.clone(),
                local: keep_local.then(|| LocalCopy {
                    agent: agent.id.clone(),
                    path: o.file_path.clone(),
                }),
                object_key: o.key.clone(),
                size: o.size,
                checksum: o.checksum.clone(),
                created_ms: 0,
            });
        }
    }
}

/// One instance's times, for its stage's overheads ([`batch_overhead_s`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outside {
    /// From sending the instance (after its permits) to taking its report, less its staging of
    /// inputs from DAG senders, its uploads of outputs for DAG receivers (the model counts those
    /// on the edges), a handler's setup on the agent (`RunReport::setup_s`: its code fetched,
    /// its environment built) and the part of a cold start spent waiting for other starts on
    /// the host (`uncontended`).
    pub outside_s: f64,
    /// The lambda's own time, less that same wait.
    pub lambda_s: f64,
    /// Whether it ran cold: the model's first batch (a VM's later batches run hot).
    pub cold: bool,
}

/// A stage's *overhead* in one job for its cold batch (`cold`: the model's
/// `FunctionParams::overhead_s`) or its hot batches (`FunctionParams::overhead_hot_s`), the
/// per-batch term of the model, from its instances' times ([`Outside`]). A batch ends with its
/// slowest instance while the model's compute is the mean lambda's, so a batch's overhead is
/// its slowest instance's time outside the edges less its mean lambda time: what the system
/// pays per instance (the request and the report, loading the job's input in first stages,
/// moving and registering outputs, uploading results in last stages, the records kept around
/// it) and the batch's spread. The batches are told apart by how they ran: the cold instances
/// are the first batch, the hot ones the later (a cold instance's lambda time is not the hot
/// ones', so one slowest-minus-mean over both would count their difference as overhead; and a
/// cold batch pays the spread of its starts, which a hot one does not). Never negative; `None`
/// without an instance of the kind.
pub(crate) fn batch_overhead_s(instances: &[Outside], cold: bool) -> Option<f64> {
    let runs: Vec<&Outside> = instances
        .iter()
        .filter(|x| x.cold == cold && x.outside_s.is_finite() && x.lambda_s.is_finite())
        .collect();
    if runs.is_empty() {
        return None;
    }
    let slowest = runs
        .iter()
        .map(|x| x.outside_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let mean_lambda = runs.iter().map(|x| x.lambda_s).sum::<f64>() / runs.len() as f64;
    Some((slowest - mean_lambda).max(0.0))
}

/// `<function>/<instance>/<to>/<name>` -> instance.
fn instance_from_path(path: &str) -> Option<u32> {
    path.split('/').nth(1)?.parse().ok()
}

/// Keeps one attempt's log (what the lambda wrote, or why there is no report).
async fn keep_log(state: &Context, req: &RunRequest, agent: &AgentSlot, log: String) {
    let entry = InstanceLog {
        function: req.function.clone(),
        instance: req.instance,
        attempt: req.attempt,
        agent: agent.id.clone(),
        log,
    };
    let job = req.job_id.clone();
    let now = state.clock.now_ms();
    if let Err(e) = state.db.commit(move |w| w.put_log(&job, &entry, now)).await {
        tracing::warn!(job = %req.job_id, function = %req.function, error = %e, "cannot keep the log");
    }
}

/// One attempt of one instance, as the executor sends it: waits its backoff, takes its
/// concurrency permits (the plan's on its VM, the job's reservation on the agent, or for an
/// unplanned job a slot of the agent from the resource manager), records that it is sent, sends
/// it, waits for its report and keeps its log.
struct AttemptTask {
    state: Arc<Context>,
    rt: Arc<Runtime>,
    agent: AgentSlot,
    agent_index: usize,
    request: RunRequest,
    cancel: CancellationToken,
    permit: Option<Arc<Semaphore>>,
    reservation: Option<Arc<Semaphore>>,
    delay: Duration,
    /// The stage's inputs on this agent, fetched before the instance takes its permits.
    fetch: Option<Arc<fetch::StageFetch>>,
    /// When the instance was first sent (wall clock, ms): kept in its run record.
    sent_ms: i64,
    function: usize,
    vm: usize,
}

/// What one attempt came to.
struct Attempted {
    function: usize,
    instance: u32,
    attempt: u32,
    agent: usize,
    vm: usize,
    sent_ms: i64,
    /// When it held its agent (after its permits).
    started: Instant,
    /// The stage's fetch on its agent.
    fetch: Option<Arc<fetch::StageFetch>>,
    /// The memory limit it ran under, MB.
    memory_limit_mb: u64,
    /// Its report and when it ended, if it succeeded.
    outcome: Result<(RunReport, Instant), InstanceFailure>,
}

impl AttemptTask {
    async fn run(self) -> Attempted {
        let mut started = Instant::now();
        let outcome = self.attempt(&mut started).await;
        Attempted {
            function: self.function,
            instance: self.request.instance,
            attempt: self.request.attempt,
            agent: self.agent_index,
            vm: self.vm,
            sent_ms: self.sent_ms,
            started,
            fetch: self.fetch,
            memory_limit_mb: self.request.memory_limit_mb,
            outcome,
        }
    }

    fn failure(&self, message: String, kind: RunFailure) -> InstanceFailure {
        InstanceFailure {
            message,
            kind,
            agent: self.agent.id.clone(),
        }
    }

    async fn attempt(
        &self,
        started: &mut Instant,
    ) -> Result<(RunReport, Instant), InstanceFailure> {
        let (state, rt, req, agent) = (&*self.state, &*self.rt, &self.request, &self.agent);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        // The stage's inputs on this agent, all at once before its first batch (the model's
        // fetch); when that fails, the run fetches its own.
        if let Some(fetch) = &self.fetch
            && until_cancelled(fetch.once(rt), &self.cancel)
                .await
                .is_none()
        {
            return Err(self.failure("cancelled".into(), RunFailure::Cancelled));
        }
        // Held while the instance runs: the plan's concurrency on this VM.
        let _permit = match &self.permit {
            Some(s) => {
                let _waiting = state.metrics.waiting();
                Some(s.clone().acquire_owned().await.map_err(|_| {
                    self.failure("concurrency limit closed".to_owned(), RunFailure::Refused)
                })?)
            }
            None => None,
        };
        // And the job's reservation on the agent (taken after the stage's).
        let _reserved = match &self.reservation {
            Some(s) => Some(s.clone().acquire_owned().await.map_err(|_| {
                self.failure("reservation limit closed".to_owned(), RunFailure::Refused)
            })?),
            None => None,
        };
        // An unplanned job's instance holds one slot of its agent while it runs, so that
        // planned and unplanned jobs together never oversubscribe it (a planned job's grant
        // covers its own).
        let _slot = if rt.granted().contains(&req.job_id) {
            None
        } else {
            let slot = rt.resources.slot(&req.job_id, agent, req.memory_limit_mb);
            match until_cancelled(slot, &self.cancel).await {
                Some(Ok(s)) => Some(s),
                Some(Err(e)) => return Err(self.failure(e.to_string(), RunFailure::Refused)),
                None => return Err(self.failure("cancelled".into(), RunFailure::Cancelled)),
            }
        };
        if self.cancel.is_cancelled() {
            return Err(self.failure("cancelled".into(), RunFailure::Cancelled));
        }
        *started = Instant::now();
        // Recorded before it is sent: after a restart, the run is asked for again by the same
        // attempt (an agent answers a repeated attempt with the run it already has).
        let record = InstanceRunRecord {
            job: req.job_id.clone(),
            execution: req.execution,
            function: req.function.clone(),
            instance: req.instance,
            attempt: req.attempt,
            agent: agent.id.clone(),
            report: None,
            started_ms: self.sent_ms,
            ended_ms: None,
        };
        if let Err(e) = state.db.commit(move |w| w.put_instance_run(&record)).await {
            tracing::warn!(job = %req.job_id, function = %req.function, error = %e, "cannot record the run");
        }
        let outcome = attempt_once(state, rt, agent, req, &self.cancel).await;
        // A run that succeeded has its log recorded with its files (`succeed`), in one commit.
        let log = match &outcome {
            Ok(report) if report.status == RunStatus::Succeeded => None,
            Ok(report) => Some(report.log.clone()),
            Err(e) => Some(format!(
                "[sonic-control] no report from agent {}: {e}\n",
                agent.id
            )),
        };
        if let Some(log) = log {
            keep_log(state, req, agent, log).await;
        }
        // Logged here, in the run's span (the job's inside it).
        match &outcome {
            Ok(r) if r.status == RunStatus::Succeeded => {
                tracing::debug!(agent = %agent.id, attempt = req.attempt, cold = r.cold, seconds = r.seconds, "instance ended");
            }
            Ok(r) => {
                tracing::warn!(job = %req.job_id, function = %req.function, instance = req.instance, attempt = req.attempt, error = %describe(r), "instance failed");
            }
            Err(e) => {
                tracing::warn!(job = %req.job_id, function = %req.function, instance = req.instance, attempt = req.attempt, error = %e, "instance failed");
            }
        }
        match outcome {
            Ok(report) if report.status == RunStatus::Succeeded => Ok((report, Instant::now())),
            // Of what kind, the agent says (`RunStatus::DiskFull`: it knows its disk).
            Ok(report) => Err(self.failure(describe(&report), failure_kind(report.status))),
            // No report: the agent's disk says nothing here (an agent refuses no run for its
            // disk); whether the agent is lost, its health check tells.
            Err(e) => Err(self.failure(e.to_string(), RunFailure::NoReport)),
        }
    }
}

/// An attempt that failed.
struct InstanceFailure {
    message: String,
    /// What kind of failure (the job machine decides from it whether to try again).
    kind: RunFailure,
    /// The agent it ran on.
    agent: String,
}

/// The memory limit an instance that ran out of memory under `limit_mb` is given next: twice
/// as much, at most `cap_mb` (its agent's VM type's memory), never less than it had.
pub(crate) fn raised_memory(limit_mb: u64, cap_mb: Option<u64>) -> u64 {
    let want = limit_mb.saturating_mul(2).max(1);
    match cap_mb {
        Some(cap) => want.min(cap).max(limit_mb),
        None => want,
    }
}

/// The kind of failure a run's report says.
fn failure_kind(status: RunStatus) -> RunFailure {
    match status {
        RunStatus::Failed => RunFailure::Exit,
        RunStatus::OutOfMemory => RunFailure::OutOfMemory,
        RunStatus::TimedOut => RunFailure::Timeout,
        RunStatus::DiskFull => RunFailure::DiskFull,
        RunStatus::Unrunnable => RunFailure::Unrunnable,
        // A report that ended neither well nor in a failure of the run: the agent's own error.
        RunStatus::Error | RunStatus::Running | RunStatus::Succeeded => RunFailure::Error,
    }
}

fn describe(r: &RunReport) -> String {
    let status = serde_json::to_value(&r.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", r.status));
    let mut s = status;
    if let Some(code) = r.exit_code {
        s.push_str(&format!(" (exit code {code})"));
    }
    if let Some(e) = &r.error {
        s.push_str(&format!(": {e}"));
    }
    let tail: String = r
        .log
        .trim_end()
        .chars()
        .rev()
        .take(300)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if !tail.is_empty() {
        s.push_str(&format!("; log: {tail}"));
    }
    s
}

/// Why an attempt got no report.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("cancelled")]
    Cancelled,
    #[error("agent {agent}: run {run_id} did not end within its timeout")]
    NoEnd { agent: String, run_id: String },
}

/// Sends one attempt to its agent and waits for its report: pushed by the agent when the run
/// ends (a waiter registered before the run is sent, so no push comes too early), read with a
/// slow poll in case the push is lost, and read at once when the agent says the run already
/// existed (it will not push again). Without a report URL it polls with backoff, as before.
async fn attempt_once(
    state: &Context,
    rt: &Runtime,
    agent: &AgentSlot,
    req: &RunRequest,
    cancel: &CancellationToken,
) -> Result<RunReport, AttemptError> {
    let run_id = req.run_id();
    let mut waiter = rt.report_url().map(|_| rt.reports.wait(&run_id, &agent.id));
    let mut sent = std::borrow::Cow::Borrowed(req);
    if let Some(url) = rt.report_url() {
        sent.to_mut().report_url = Some(url.to_owned());
    }
    let accepted = rt.agents.start(agent, &sent).await?;
    // An agent that already had this run (a repeated request) pushed its report then, if
    // ever: read it now.
    let existed = accepted.existed;
    if accepted.run_id != run_id {
        // An agent that names runs otherwise cannot be waited for by id: poll it.
        waiter = None;
    }
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms) + rt.config.report_slack;
    let mut wait = rt.config.poll_interval;
    let mut poll_now = existed || waiter.is_none();
    loop {
        if cancel.is_cancelled() {
            return Err(AttemptError::Cancelled);
        }
        match waiter.as_mut() {
            _ if poll_now => {}
            Some(w) => {
                // Woken by the push, by the slow poll's timer, or by a cancel.
                let next_poll = tokio::time::sleep(rt.config.fallback_poll);
                tokio::select! {
                    pushed = w.rx.recv() => match pushed {
                        Some(crate::exec::reports::Push::Report(report)) => return Ok(*report),
                        Some(crate::exec::reports::Push::PollNow) => {}
                        // The waiter was replaced (a later execution reuses this run id).
                        None => {}
                    },
                    () = next_poll => {}
                    () = cancel.cancelled() => continue,
                }
            }
            None => {
                tokio::time::sleep(wait).await;
                wait = (wait * 3 / 2).min(rt.config.max_poll_interval.max(rt.config.poll_interval));
            }
        }
        poll_now = false;
        let report = rt.agents.report(agent, &accepted.run_id).await?;
        if report.status != RunStatus::Running {
            state.metrics.report_received("poll");
            return Ok(report);
        }
        if Instant::now() > deadline {
            return Err(AttemptError::NoEnd {
                agent: agent.id.clone(),
                run_id: accepted.run_id,
            });
        }
    }
}

/// Deletes the job's files on every agent it used and its store objects except `result/`.
async fn cleanup(state: &Arc<Context>, rt: &Runtime, job: &str, agents: &[AgentSlot]) {
    clear(state, rt, job, agents, Some("result/"), None).await;
}

/// Stops a failed job's runs still going on on `agents`, keeping its files (for a retry).
async fn stop_runs(rt: &Runtime, job: &str, agents: &[AgentSlot]) {
    let stopped = futures::future::join_all(agents.iter().map(|a| {
        rt.agents.clear_job(
            a,
            job,
            Some(rt.config.health_timeout),
            agents::Clearing::RunsOnly,
        )
    }))
    .await;
    for (a, outcome) in agents.iter().zip(stopped) {
        if let Err(e) = outcome {
            tracing::warn!(job, agent = %a.id, error = %e, "agent did not stop the job's runs");
        }
    }
}

/// Deletes what failed jobs kept for a retry once they have kept it `JobsConfig::keep_failed`,
/// and jobs past `JobsConfig::retain_jobs` whole (at most [`SWEEP_BATCH`] of each a call): their files on every alive agent, in the store (their
/// results and inputs included: nothing of them can run again) and in the memory tier, and
/// their execution and runs' records. A job a retry took first is left alone. Returns how many
/// were swept.
pub async fn sweep_kept(state: &Arc<Context>, rt: &Runtime) -> usize {
    let keep_ms = i64::try_from(rt.config.keep_failed.as_millis()).unwrap_or(i64::MAX);
    let now = state.clock.now_ms();
    let before = now.saturating_sub(keep_ms);
    let found = state
        .db
        .run(move |db| db.failed_jobs_kept(before, SWEEP_BATCH))
        .await;
    let jobs = found.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot list the failed jobs kept for a retry");
        Vec::new()
    });
    let agents = if jobs.is_empty() {
        Vec::new()
    } else {
        alive_agents(state).await
    };
    let mut swept = 0;
    for id in jobs {
        let claim = id.clone();
        match state.db.commit(move |w| w.forget_kept(&claim, now)).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot sweep the failed job");
                continue;
            }
        }
        clear(
            state,
            rt,
            &id,
            &agents,
            None,
            Some(rt.config.health_timeout),
        )
        .await;
        tracing::info!(job = %id, "deleted what the failed job kept for a retry");
        swept += 1;
    }
    // Jobs past the retention age go whole (`JobsConfig::retain_jobs`).
    if let Some(retain) = rt.config.retain_jobs {
        let retain_ms = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(retain_ms);
        match state
            .db
            .run(move |db| db.jobs_ended_before(before, SWEEP_BATCH))
            .await
        {
            Ok(old) => {
                for id in old {
                    match delete_job(state, rt, &id).await {
                        Ok(DeleteJob::Deleted(_)) => {
                            tracing::info!(job = %id, "deleted past the retention age");
                            swept += 1;
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(job = %id, error = %e, "cannot delete the job"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the jobs past the retention age"),
        }
        // And the samples past the same age that the models no longer keep.
        match state
            .db
            .run(move |db| crate::learn::prune_samples(db, before))
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                samples = n,
                "deleted samples past the retention age that the models no longer keep"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot prune the samples"),
        }
    }
    swept
}

/// Deletes ended job `id`: its rows ([`crate::store::Writer::delete_job`]: the record goes
/// first, so that nothing, a retry included, takes the job while its files go), then its files
/// on every alive agent, its objects in the store (results and input) and in the memory tier.
pub async fn delete_job(
    state: &Arc<Context>,
    rt: &Runtime,
    id: &str,
) -> Result<DeleteJob, StoreError> {
    let target = id.to_owned();
    let deleted = state.db.commit(move |w| w.delete_job(&target)).await?;
    if matches!(deleted, DeleteJob::Deleted(_)) {
        let agents = alive_agents(state).await;
        clear(state, rt, id, &agents, None, Some(rt.config.health_timeout)).await;
    }
    Ok(deleted)
}

/// The agents alive now.
async fn alive_agents(state: &Context) -> Vec<AgentSlot> {
    let now = state.clock.now_ms();
    let timeout = state.heartbeat_timeout;
    match state.db.run(|db| db.list_agents()).await {
        Ok(agents) => agents
            .into_iter()
            .filter(|a| a.alive(now, timeout))
            .map(AgentSlot::from)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the agents");
            Vec::new()
        }
    }
}

/// Sweeps kept failed jobs ([`sweep_kept`]) now and then, as long as the runtime runs jobs
/// (stopped with them, [`Runtime::stop_jobs`]).
pub fn spawn_sweeper(state: Arc<Context>, rt: Arc<Runtime>) {
    // Kept a day, a job is swept within a minute of its day; kept nothing (jobs of an earlier
    // setting may still hold something), once a minute.
    let keep = rt.config.keep_failed;
    let shortest = [Some(keep), rt.config.retain_jobs]
        .into_iter()
        .flatten()
        .filter(|d| !d.is_zero())
        .min();
    let every = match shortest {
        None => Duration::from_secs(60),
        Some(d) => (d / 4).clamp(Duration::from_millis(100), Duration::from_secs(60)),
    };
    let task = {
        let rt = rt.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sweep_kept(&state, &rt).await;
            }
        }
    };
    rt.spawn_job(task);
}

/// Deletes what one execution of a job left (the agents' files, the store's objects but the
/// job's input, the file records) before the next execution; lost agents are not asked.
async fn clear_execution(
    state: &Arc<Context>,
    rt: &Runtime,
    job: &str,
    agents: &[AgentSlot],
    lost: &BTreeSet<String>,
) {
    let alive: Vec<AgentSlot> = agents
        .iter()
        .filter(|a| !lost.contains(&a.id))
        .cloned()
        .collect();
    clear(
        state,
        rt,
        job,
        &alive,
        Some("input/"),
        Some(rt.config.health_timeout),
    )
    .await;
}

/// Deletes the job's files on `agents` (each asked within `timeout`, if any), its store objects
/// but those under `keep` (relative to the job's prefix; `None`: all of them), and its file
/// records.
async fn clear(
    state: &Arc<Context>,
    rt: &Runtime,
    job: &str,
    agents: &[AgentSlot],
    keep: Option<&str>,
    timeout: Option<Duration>,
) {
    // Every agent at once: the job's end waits for the slowest, not for their sum.
    let cleared = futures::future::join_all(agents.iter().map(|a| {
        rt.agents
            .clear_job(a, job, timeout, agents::Clearing::Everything)
    }))
    .await;
    for (a, outcome) in agents.iter().zip(cleared) {
        if let Err(e) = outcome {
            tracing::warn!(job, agent = %a.id, error = %e, "agent did not clean the job");
        }
    }
    let prefix = job_prefix(job);
    let keep = keep.map(|k| format!("{prefix}{k}"));
    match rt.store.list(&prefix).await {
        Ok(objects) => {
            let kept = |key: &str| keep.as_deref().is_some_and(|k| key.starts_with(k));
            for o in objects.iter().filter(|o| !kept(&o.key)) {
                if let Err(e) = rt.store.delete(&o.key).await {
                    tracing::warn!(job, key = %o.key, error = %e, "cannot delete an intermediate object");
                }
            }
        }
        Err(e) => tracing::warn!(job, error = %e, "cannot list the job's objects"),
    }
    // The memory tier holds only intermediates: all of them go.
    match rt.memory_tier().await {
        Some(Ok(tier)) => {
            if let Err(e) = tier.delete_prefix(&prefix).await {
                tracing::warn!(job, error = %e, "cannot clear the job's files from the memory tier");
            }
        }
        Some(Err(e)) => {
            tracing::warn!(job, error = %e, "cannot clear the job's files from the memory tier");
        }
        None => {}
    }
    let id = job.to_owned();
    if let Err(e) = state.db.commit(move |w| w.delete_files(&id)).await {
        tracing::warn!(job, error = %e, "cannot forget the job's files");
    }
}

/// The job's result objects (recorded in the Db), as output URLs.
async fn result_outputs(state: &Arc<Context>, rt: &Runtime, job: &str) -> Vec<String> {
    let prefix = format!("{}result/", job_prefix(job));
    let objects = match rt.store.list(&prefix).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(job, error = %e, "cannot list the job's results");
            return Vec::new();
        }
    };
    let now = state.clock.now_ms();
    let records: Vec<FileRecord> = objects
        .iter()
        .map(|o| FileRecord {
            job: job.to_owned(),
            file_id: o.key.clone(),
            local: None,
            object_key: Some(o.key.clone()),
            size: o.size,
            checksum: String::new(),
            created_ms: now,
        })
        .collect();
    if let Err(e) = state
        .db
        .commit(move |w| records.iter().try_for_each(|r| w.put_file(r)))
        .await
    {
        tracing::warn!(job, error = %e, "cannot record the job's results");
    }
    let mut keys: Vec<String> = objects.into_iter().map(|o| o.key).collect();
    keys.sort();
    keys.iter().map(|k| rt.output_url(k)).collect()
}

/// The method the agents reported for an edge when they agree; when no receiver staged its
/// files, where its senders uploaded them when they agree (a `memory` edge's files all sent to
/// the store say `remote`); else the one the job chose.
fn edge_method(p: &Progress, edge: usize) -> Method {
    let agreed = |seen: Option<&BTreeSet<Method>>| match seen {
        Some(seen) if seen.len() == 1 => seen.iter().next().copied(),
        _ => None,
    };
    agreed(p.observed.get(&edge))
        .or_else(|| {
            p.observed
                .get(&edge)
                .is_none_or(BTreeSet::is_empty)
                .then(|| agreed(p.uploaded_to.get(&edge)))
                .flatten()
        })
        .unwrap_or_else(|| p.methods.get(edge).copied().unwrap_or(Method::Remote))
}

fn price_per_second(catalog: Option<&Catalog>, vm_type: &str) -> f64 {
    catalog
        .and_then(|c| c.vm_type(vm_type))
        .map_or(0.0, |v| v.usd_per_second())
}

/// What the VMs an execution held cost, USD: each of the plan's VMs from its first instance's
/// start to its last instance's end or its last direct receiver's staging, at its agent's
/// price (the model's rule).
fn spans_cost(catalog: Option<&Catalog>, p: &Progress) -> f64 {
    p.spans
        .iter()
        .map(|((agent, _), (a, b))| {
            let vm = p.agents.get(*agent).map_or("", |s| s.vm_type.as_str());
            price_per_second(catalog, vm) * b.duration_since(*a).as_secs_f64()
        })
        .sum()
}

fn summarize(
    rt: &Runtime,
    job: &JobRecord,
    p: &Progress,
    latency_s: f64,
    outputs: Vec<String>,
    error: Option<&String>,
    failure: Option<RunFailure>,
) -> JobSummary {
    let (storage_usd, requests_usd) = p.store.cost(rt.catalog.as_ref(), Instant::now());
    let cost_usd =
        spans_cost(rt.catalog.as_ref(), p) + p.discarded_usd + storage_usd + requests_usd;
    let perf_per_dollar = if latency_s > 0.0 && cost_usd > 0.0 {
        1.0 / (latency_s * cost_usd)
    } else {
        0.0
    };
    let edges = p
        .dag
        .as_ref()
        .map(|dag| {
            dag.edges
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let (bytes, seconds) = p.edges.get(&i).copied().unwrap_or_default();
                    EdgeRun {
                        from: dag.functions[e.from].name.clone(),
                        to: dag.functions[e.to].name.clone(),
                        method: edge_method(p, i),
                        bytes,
                        seconds,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    // In the DAG's (topological) order, not the names', each function's instances in order.
    let mut functions = p.functions.clone();
    let position = |name: &str| {
        p.dag
            .as_ref()
            .and_then(|d| d.function_index(name))
            .unwrap_or(usize::MAX)
    };
    functions.sort_by(|a, b| {
        (position(&a.name), &a.name, a.instance).cmp(&(position(&b.name), &b.name, b.instance))
    });
    let mut fetches = p.fetches.clone();
    fetches.sort_by(|a, b| a.started_s.total_cmp(&b.started_s));
    // A job that succeeded outside its DAG's bounds says so (the planner meets them on its
    // predictions; what ran may not).
    let bounds_missed = match (&p.dag, error) {
        (Some(dag), None) => bounds_missed(&dag.bounds, latency_s, cost_usd),
        _ => Vec::new(),
    };
    JobSummary {
        job_id: job.id.clone(),
        dag: job.dag.clone(),
        status: if error.is_some() {
            JobStatus::Failed
        } else {
            JobStatus::Succeeded
        },
        policy: job.policy,
        mode: job.mode,
        input_bytes: job.input_bytes,
        latency_s,
        cost_usd,
        perf_per_dollar,
        storage_usd,
        requests_usd,
        edges,
        functions,
        fetches,
        outputs,
        error: error.cloned(),
        failure,
        plan: p.plan.clone().or_else(|| job.plan.clone()),
        mode_reason: job.mode_reason.clone(),
        slo: job
            .slo
            .filter(|_| job.mode == sonic_api::control::JobMode::Planned),
        submitted_ms: None,
        started_ms: None,
        ended_ms: None,
        bounds_missed,
        dag_revision: job.dag_revision,
        on_failure: None,
        failed_attempts: p.failed.clone(),
    }
}

/// What of `bounds` a job of `latency_s` and `cost_usd` missed, in words.
fn bounds_missed(bounds: &sonic_core::dag::Bounds, latency_s: f64, cost_usd: f64) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(max) = bounds.max_latency_s
        && latency_s > max
    {
        out.push(format!(
            "latency {latency_s:.3} s over the DAG's max_latency {max} s"
        ));
    }
    if let Some(max) = bounds.max_cost_usd
        && cost_usd > max
    {
        out.push(format!(
            "cost ${cost_usd:.6} over the DAG's max_cost ${max}"
        ));
    }
    out
}

/// A run's `seconds` and start latency as if its start had had a core to itself: a cold run
/// whose container started while other starts shared the agent's host
/// (`StartContention::factor` starts per core) is counted with its start divided by that
/// factor. Container starts are CPU-bound, and a plan never starts more lambdas at once on a VM
/// than it has vCPUs (`PlanProblem::max_concurrent`), so this is the start a plan's first batch
/// pays; `remote` profiling jobs start a stage's containers all at once, on agents that may
/// share a host (the demo's four share one Docker engine and two cores: a mapper's start took
/// 0.5 s there against 0.24 s in the planned job that started two). Hot runs and runs without
/// a contention are taken as measured.
pub(crate) fn uncontended(r: &FunctionRun) -> (f64, Option<f64>) {
    let start = r
        .start_latency_s
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s.min(r.seconds.max(0.0)));
    match (start, r.start_contention) {
        (Some(s), Some(c)) if r.cold && r.seconds.is_finite() => {
            let alone = s / c.factor();
            (r.seconds - s + alone, Some(alone))
        }
        _ => (r.seconds, start),
    }
}

/// An agent's vCPUs: its VM type's, at most what it registered (it refuses a run given more);
/// `None` where the catalog does not know the type.
pub(crate) fn agent_vcpus(catalog: Option<&Catalog>, slot: &AgentSlot) -> Option<u32> {
    let typed = catalog?.vm_type(&slot.vm_type)?.vcpus;
    Some(slot.vcpus.map_or(typed, |v| typed.min(v)))
}

/// The mean CPUs a function's runs had, where they say.
fn mean_cpus(runs: &[&FunctionRun]) -> Option<f64> {
    let c: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.cpus)
        .filter(|c| c.is_finite() && *c > 0.0)
        .collect();
    (!c.is_empty()).then(|| c.iter().sum::<f64>() / c.len() as f64)
}

/// The DAG parameters this job measured, in the `--params` file's shape.
fn sample(job: &JobRecord, p: &Progress, state: &Context) -> SampleRecord {
    let overrides: std::collections::BTreeMap<String, serde_json::Value> = job
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let job_params = p
        .dag
        .as_ref()
        .map(|dag| dag.job_params(&overrides))
        .unwrap_or(overrides);
    let mut functions = serde_json::Map::new();
    if let Some(dag) = &p.dag {
        for (i, f) in dag.functions.iter().enumerate() {
            let runs: Vec<&FunctionRun> = p.functions.iter().filter(|r| r.name == f.name).collect();
            // The mean of what the cold (or the hot) runs measured, where they measured it.
            let mean = |cold: bool, value: fn(&FunctionRun) -> Option<f64>| {
                let s: Vec<f64> = runs
                    .iter()
                    .filter(|r| r.cold == cold)
                    .filter_map(|r| value(r))
                    .collect();
                (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64)
            };
            // A cold run's time and start as if its container had started alone on a core.
            let seconds = |r: &FunctionRun| Some(uncontended(r).0);
            let outside = p.outside_edges.get(&i).map_or(&[][..], Vec::as_slice);
            let (overhead, overhead_hot) = (
                batch_overhead_s(outside, true),
                batch_overhead_s(outside, false),
            );
            // The cold start of its cold runs: the hot time's guess until hot runs teach it.
            let start = mean(true, |r| uncontended(r).1);
            let memory = runs
                .iter()
                .filter_map(|r| r.peak_memory_mb)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            // How the cold (or hot) runs spread around their mean: each one's time over it.
            let spread = |cold: bool| -> Option<Vec<f64>> {
                let s: Vec<f64> = runs
                    .iter()
                    .filter(|r| r.cold == cold)
                    .map(|r| uncontended(r).0)
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .collect();
                let m = s.iter().sum::<f64>() / s.len().max(1) as f64;
                (s.len() >= 2 && m > 0.0).then(|| s.iter().map(|v| v / m).collect())
            };
            functions.insert(
                f.name.clone(),
                serde_json::json!({
                    "memory_mb": memory,
                    "cold_s": mean(true, seconds),
                    "hot_s": mean(false, seconds),
                    "cold_spread": spread(true),
                    "hot_spread": spread(false),
                    "overhead_s": overhead,
                    "overhead_hot_s": overhead_hot,
                    "start_s": start,
                    // The CPUs its instances had (the agents' word, else what they were
                    // sent with): the times were measured on them.
                    "cores": mean_cpus(&runs).or_else(|| p.cpus.get(&i).copied()),
                    "instances": p.instances.get(&i).copied().unwrap_or(0),
                }),
            );
        }
    }
    let edges: Vec<serde_json::Value> = p
        .dag
        .as_ref()
        .map(|dag| {
            dag.edges
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    // What the sender wrote, as the model's edge bytes are (a broadcast file
                    // counts once however many receivers read it).
                    serde_json::json!({
                        "from": dag.functions[e.from].name,
                        "to": dag.functions[e.to].name,
                        "bytes": p.written.get(&i).copied().unwrap_or(0),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    SampleRecord {
        dag: job.dag.clone(),
        job: job.id.clone(),
        input_bytes: job.input_bytes,
        // The parameters it ran with: which setting's models the sample teaches.
        measured: serde_json::json!({
            "functions": functions,
            "edges": edges,
            "params": job_params,
        }),
        created_ms: state.clock.now_ms(),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::{Kept, Outside, StoreUse, batch_overhead_s, edge_method, uncontended};
    use sonic_core::catalog::{Catalog, SECONDS_PER_MONTH};
    use sonic_core::dag::Dag;
    use std::time::{Duration, Instant};

    #[test]
    fn out_of_memory_doubles_the_limit_up_to_the_vm() {
        use super::raised_memory;
        assert_eq!(raised_memory(1024, Some(8192)), 2048);
        assert_eq!(raised_memory(6000, Some(8192)), 8192);
        assert_eq!(
            raised_memory(8192, Some(8192)),
            8192,
            "at the VM's: no more"
        );
        assert_eq!(
            raised_memory(9000, Some(8192)),
            9000,
            "never less than it had"
        );
        assert_eq!(raised_memory(512, None), 1024);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 96,
            // About a third of random plans fit a random pool; the others are refused or
            // re-planned, which is not what this checks.
            max_global_rejects: 8192,
            ..proptest::prelude::ProptestConfig::default()
        })]
        /// Over random DAGs, plans and pools: whatever the built-in pool grants runs as the plan
        /// assumed. Each stage gets as many agents as the plan has VMs, all of its VM type; the
        /// job machine puts each instance on one of them, as evenly as the model spreads
        /// lambdas (a VM runs at most `ceil(K / vms)`); what the executor lets run at once
        /// on an agent is the plan's (a stage's permits there are its VMs there times its
        /// concurrency, and the job's reservation holds every set of stages that can run
        /// together) and never more than the agent's vCPUs; stages that run at once are on
        /// different agents unless no plan keeps them apart (the notes then say so); every VM
        /// of the plan is billed on its own (`planned_vm`), even where two share an agent.
        #[test]
        fn a_granted_plan_runs_placed_and_billed_as_priced(
            n in 1usize..6,
            links in proptest::collection::vec((0usize..6, 0usize..6), 0..8),
            stages in proptest::collection::vec((proptest::bool::ANY, 1u32..4, 1u32..3, 1u32..8), 6),
            direct in proptest::collection::vec(proptest::bool::ANY, 8),
            pool in proptest::collection::vec(proptest::bool::ANY, 2..10),
        ) {
            use super::planned_vm;
            use crate::resources::planned::admit;
            use crate::resources::tests::{agents, catalog};
            use crate::resources::{Concurrency, Pool};
            use sonic_core::machine::{Action, Event, JobMachine, Shape, vm_of};
            use sonic_core::model::Method;
            use sonic_core::planner::{Plan, PlanEdge, PlanOutcome, PlanStage, Predicted};
            use std::collections::{BTreeMap, BTreeSet};

            // Edges from lower to higher stages: a DAG.
            let mut edges: BTreeSet<(usize, usize)> = BTreeSet::new();
            for &(a, b) in &links {
                let (a, b) = (a.min(b), a.max(b));
                if b < n && a != b {
                    edges.insert((a, b));
                }
            }
            let edges: Vec<(usize, usize)> = edges.into_iter().collect();
            let yaml = format!(
                "name: r\nfunctions:\n{}edges:\n{}",
                (0..n)
                    .map(|i| format!("  - {{ name: s{i}, image: i, command: [x] }}\n"))
                    .collect::<String>(),
                if edges.is_empty() {
                    "  []\n".to_owned()
                } else {
                    edges
                        .iter()
                        .map(|(a, b)| format!("  - {{ from: s{a}, to: s{b}, kind: gather }}\n"))
                        .collect::<String>()
                },
            );
            let dag = Dag::from_yaml("r.yaml", &yaml).expect("dag");
            let type_of = |xl: bool| if xl { "m5.xlarge" } else { "m5.large" };
            let plan = Plan {
                stages: (0..n)
                    .map(|i| PlanStage { cores: 1.0,
                        function: format!("s{i}"),
                        vm_type: type_of(stages[i].0).into(),
                        vms: stages[i].1,
                        per_vm: stages[i].3.div_ceil(stages[i].1),
                        concurrent: stages[i].2,
                        warm: false,
                        prewarmed: false,
                    })
                    .collect(),
                edges: dag
                    .edges
                    .iter()
                    .enumerate()
                    .map(|(e, edge)| PlanEdge {
                        from: dag.functions[edge.from].name.clone(),
                        to: dag.functions[edge.to].name.clone(),
                        method: if direct[e] { Method::Direct } else { Method::Remote },
                        predicted_s: 0.0,
                    })
                    .collect(),
                predicted: Predicted {
                    latency_s: 1.0,
                    cost_usd: 1.0,
                    perf_per_dollar: 1.0,
                    requests_usd: 0.0,
                    latency_quantiles_s: None,
                },
                timing: Vec::new(),
            };
            let outcome = PlanOutcome {
                best: plan.clone(),
                second_best: None,
                table: Vec::new(),
                exact: true,
                stopped: None,
                slo: None,
            };
            let planned = crate::learn::Planned {
                report: sonic_api::plan::PlanReport::new(
                    outcome.report("r", sonic_core::planner::Policy::Sonic, 0),
                    0,
                ),
                outcome,
                params: sonic_core::params::Params::default(),
                warm: crate::learn::warm::WarmPool::default(),
            };
            let types: Vec<&str> = pool.iter().map(|&xl| type_of(xl)).collect();
            let slots = agents(&types);
            let manager = Pool::new(Some(&catalog()), 8);
            let no_replan = |_: &BTreeMap<String, u32>| -> Result<crate::learn::Planned, String> {
                Err("no re-plan here".into())
            };
            let quiet = |_: &str| {};
            let granted = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime")
                .block_on(async {
                    // A fresh pool answers at once: it grants, refuses or says what it has.
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        admit(&manager, "j", &dag, &planned, &slots, &quiet, &no_replan),
                    )
                    .await
                });
            let granted = granted.expect("a fresh pool never makes a job wait");
            // A plan the pool cannot hold is re-planned (not here) or refused: nothing runs.
            proptest::prop_assume!(granted.is_ok());
            let (a, _) = granted.expect("granted");
            let cat = catalog();
            let vcpus = |agent: usize| {
                cat.vm_type(&slots[agent].vm_type).expect("type").vcpus as usize
            };
            // Placement: the plan's VMs, each an agent of the plan's type.
            for (i, st) in plan.stages.iter().enumerate() {
                proptest::prop_assert_eq!(a.hosts[i].len(), st.vms as usize);
                for &h in &a.hosts[i] {
                    proptest::prop_assert_eq!(&slots[h].vm_type, &st.vm_type);
                }
            }
            // Concurrency: a stage's permits per agent are its VMs there times its
            // concurrency; the job's reservation on an agent holds every set of stages that
            // can run together, and never more than the agent has.
            let reserved = a.reserved(&dag, |agent| Some(vcpus(agent)));
            let together = Concurrency::of(&dag);
            for i in 0..n {
                let permits = a.permits(i);
                for (&agent, &k) in &permits {
                    let vms_there = a.hosts[i].iter().filter(|&&h| h == agent).count();
                    proptest::prop_assert_eq!(k, vms_there * plan.stages[i].concurrent as usize);
                    proptest::prop_assert!(reserved[&agent] >= k, "stage {} on {}", i, agent);
                }
                for j in i + 1..n {
                    if !together.together(i, j) {
                        continue;
                    }
                    let pj = a.permits(j);
                    // Branches priced on VMs of their own run on agents of their own, unless
                    // no plan keeps them apart on this pool and the notes say they share.
                    let shared = a.notes.iter().any(|n| n.starts_with("no plan fits"));
                    for (agent, k) in &permits {
                        if let Some(kj) = pj.get(agent) {
                            proptest::prop_assert!(shared, "branches {} and {} on agent {}: {:?}", i, j, agent, a.notes);
                            // Where they share an agent beyond its slots, they share them, and
                            // the job's notes say so.
                            let id = &slots[*agent].id;
                            let said = a.notes.iter().any(|n| n.contains(&format!("share agent {id}:")));
                            proptest::prop_assert!(
                                reserved[agent] >= k + kj || (k + kj > vcpus(*agent) && said),
                                "branches {} and {} on agent {}: {:?}", i, j, agent, a.notes
                            );
                        }
                    }
                }
            }
            for (&agent, &k) in &reserved {
                proptest::prop_assert!(k <= vcpus(agent), "agent {} holds {} slots", agent, k);
            }
            // The job machine places every instance on one of the stage's VMs, as evenly as the
            // model assumes, and every VM of the plan is billed on its own.
            let vms: Vec<u32> = a.hosts.iter().map(|h| h.len() as u32).collect();
            let mut machine = JobMachine::new(Shape::planned(&dag, &vms), 1, Duration::ZERO);
            let mut events = std::collections::VecDeque::from([Event::Begin]);
            let mut per_vm: BTreeMap<(usize, u32), u32> = BTreeMap::new();
            let mut finished = false;
            while let Some(event) = events.pop_front() {
                for action in machine.handle(event) {
                    match action {
                        Action::OpenStage { stage } => events.push_back(Event::StageOpened {
                            stage,
                            instances: stages[stage].3,
                        }),
                        Action::StartRun { stage, instance, vm, .. } => {
                            let k = stages[stage].3;
                            proptest::prop_assert_eq!(vm, vm_of(instance, k, vms[stage]));
                            proptest::prop_assert!(vm < vms[stage]);
                            *per_vm.entry((stage, vm)).or_default() += 1;
                            events.push_back(Event::RunEnded { stage, instance, attempt: 1 });
                        }
                        Action::Finish(outcome) => {
                            proptest::prop_assert_eq!(outcome, sonic_core::machine::Outcome::Succeeded);
                            finished = true;
                        }
                        other => proptest::prop_assert!(false, "{:?}", other),
                    }
                }
            }
            proptest::prop_assert!(finished);
            for (&(i, _), &count) in &per_vm {
                proptest::prop_assert!(count <= plan.stages[i].per_vm, "stage {} VM runs {}", i, count);
            }
            let billed: BTreeSet<usize> =
                per_vm.keys().map(|&(i, vm)| planned_vm(&dag, &a, i, vm)).collect();
            proptest::prop_assert_eq!(billed.len(), per_vm.len());
        }

        /// The executor bills a plan's VMs as the model priced them: a chain of one-instance
        /// stages, each on a VM of its own (m5.large or t2.large), each edge `direct` or
        /// `remote` at random; the instances run exactly when the model says (a remote sender
        /// reports once its upload is done, a receiver stages its input in the edge's fetch
        /// time). What the executor adds up for the VMs is the prediction's `vm_usd`.
        #[test]
        fn the_executor_bills_the_vms_as_the_model_priced_them(
            n in 2usize..6,
            remote in proptest::collection::vec(proptest::bool::ANY, 5),
            compute in proptest::collection::vec(0.1f64..5.0, 6),
            small in proptest::collection::vec(proptest::bool::ANY, 6),
            mbytes in proptest::collection::vec(1.0f64..500.0, 5),
        ) {
            use super::{Finished, Progress, record_instance, spans_cost};
            use crate::store::AgentSlot;
            use sonic_core::dag::{Bounds, EdgeKind};
            use sonic_core::model::{Assignment, EdgeSpec, Method, Placement, PlanProblem, Stage};

            let catalog = Catalog::default();
            let vm_of = |i: usize| {
                let name = if small[i] { "t2.large" } else { "m5.large" };
                catalog.vm_types.iter().position(|t| t.name == name).expect("type")
            };
            let stages: Vec<Stage> = (0..n)
                .map(|i| Stage { parallel: 0.0,
                    name: format!("s{i}"),
                    memory_mb: 100.0,
                    cold_s: compute[i],
                    hot_s: compute[i],
                    instances: 1,
                    overhead_s: 0.0,
                    overhead_hot_s: None,
                    start_s: 0.0,
                })
                .collect();
            let edges: Vec<EdgeSpec> = (1..n)
                .map(|i| EdgeSpec {
                    from: format!("s{}", i - 1),
                    to: format!("s{i}"),
                    kind: EdgeKind::One,
                    bytes: mbytes[i - 1] * 1e6,
                })
                .collect();
            let pb = PlanProblem::new(stages, edges, catalog.clone(), Bounds::default())
                .expect("problem");
            let method = |e: usize| if remote[e] { Method::Remote } else { Method::Direct };
            let a = Assignment {
                placements: (0..n)
                    .map(|i| Placement { vm: vm_of(i), vms: 1, concurrent: 1 })
                    .collect(),
                methods: (0..n - 1).map(method).collect(),
            };
            let pred = pb.evaluate(&a).expect("feasible");

            let yaml = format!(
                "name: chain\nfunctions:\n{}edges:\n{}",
                (0..n)
                    .map(|i| format!("  - {{ name: s{i}, image: i, command: [x] }}\n"))
                    .collect::<String>(),
                (1..n)
                    .map(|i| format!("  - {{ from: s{}, to: s{i}, kind: one }}\n", i - 1))
                    .collect::<String>(),
            );
            let dag = sonic_core::dag::Dag::from_yaml("chain.yaml", &yaml).expect("dag");
            let agents: Vec<AgentSlot> = (0..n)
                .map(|i| AgentSlot { vcpus: None,
                    id: format!("a-{i}"),
                    url: String::new(),
                    vm_type: catalog.vm_types[vm_of(i)].name.clone(),
                })
                .collect();
            let mut progress = Progress { agents: agents.clone(), ..Progress::default() };
            let mut produced = vec![Vec::new(); n];
            let mut files = Vec::new();
            let t0 = Instant::now();
            let at = |s: f64| t0 + Duration::from_secs_f64(s);
            for r in 0..n {
                let st = &pred.stages[r];
                // The sender reports once its outputs are durable where the plan reads them.
                let upload = if r + 1 < n && remote[r] { pred.edges[r].upload_s } else { 0.0 };
                let staged = if r == 0 {
                    serde_json::json!([])
                } else {
                    let m = if remote[r - 1] { "remote" } else { "direct" };
                    serde_json::json!([{
                        "dest": format!("s{}/0/x", r - 1), "method": m,
                        "bytes": (mbytes[r - 1] * 1e6) as u64,
                        "seconds": pred.edges[r - 1].fetch_s,
                    }])
                };
                let report = serde_json::from_value::<sonic_api::agent::RunReport>(serde_json::json!({
                    "run_id": "r", "status": "succeeded", "cold": true, "seconds": compute[r],
                    "start_latency_s": 0.0, "peak_memory_mb": 10.0, "exit_code": 0,
                    "error": null, "staged": staged,
                }))
                .expect("report");
                let f = Finished {
                    reused: false,
                    function: r,
                    instance: 0,
                    agent: r,
                    vm: r + 1,
                    report,
                    attempts: 1,
                    started: at(st.start_s),
                    ended: at(st.end_s + upload),
                    fetch: None,
                };
                record_instance(&dag, &agents, &f, &mut progress, &mut produced, "j", &mut files);
            }
            let billed = spans_cost(Some(&catalog), &progress);
            let priced = pred.cost.vm_usd;
            proptest::prop_assert!(
                (billed - priced).abs() <= 1e-6 * priced.max(1e-12),
                "billed {billed} priced {priced}"
            );
        }
    }

    /// A `direct` sender's VM is billed until its receiver has fetched (the model's rule): a
    /// ran 0-2 s on agent 0, b fetched its file for 1 s from 2 s on agent 1 then ran to 5 s;
    /// a's VM is held 0-3 s, b's 2-5 s. A `remote` input holds no sender VM (its upload was
    /// the sender's own run).
    #[test]
    fn a_direct_senders_vm_is_held_until_its_receiver_has_fetched() {
        use super::{Finished, Progress, record_instance};
        use crate::store::AgentSlot;
        let dag = sonic_core::dag::Dag::from_yaml(
            "pair.yaml",
            "name: pair\nfunctions:\n  - { name: a, image: i, command: [x] }\n  - { name: b, image: i, command: [x] }\n  - { name: c, image: i, command: [x] }\nedges:\n  - { from: a, to: b, kind: one }\n  - { from: b, to: c, kind: one }\n",
        )
        .expect("dag");
        let agents: Vec<AgentSlot> = (0..3)
            .map(|i| AgentSlot {
                vcpus: None,
                id: format!("a-{i}"),
                url: String::new(),
                vm_type: "m5.large".into(),
            })
            .collect();
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let report = |staged: serde_json::Value| {
            serde_json::from_value::<sonic_api::agent::RunReport>(serde_json::json!({
                "run_id": "r", "status": "succeeded", "cold": true, "seconds": 1.0,
                "start_latency_s": 0.0, "peak_memory_mb": 10.0, "exit_code": 0,
                "error": null, "staged": staged,
            }))
            .expect("report")
        };
        let finished = |function, agent, vm, staged, from, to| Finished {
            reused: false,
            function,
            instance: 0,
            agent,
            vm,
            report: report(staged),
            attempts: 1,
            started: at(from),
            ended: at(to),
            fetch: None,
        };
        let mut progress = Progress::default();
        let mut produced = vec![Vec::new(); 3];
        let mut files = Vec::new();
        let runs = [
            finished(0, 0, 1, serde_json::json!([]), 0.0, 2.0),
            finished(
                1,
                1,
                2,
                serde_json::json!([{"dest": "a/0/x", "method": "direct", "bytes": 10, "seconds": 1.0}]),
                2.0,
                5.0,
            ),
            finished(
                2,
                2,
                3,
                serde_json::json!([{"dest": "b/0/x", "method": "remote", "bytes": 10, "seconds": 0.5}]),
                6.0,
                7.0,
            ),
        ];
        for f in &runs {
            record_instance(
                &dag,
                &agents,
                f,
                &mut progress,
                &mut produced,
                "j",
                &mut files,
            );
        }
        let span = |agent, vm| {
            let (a, b) = progress.spans[&(agent, vm)];
            (
                a.duration_since(t0).as_secs_f64(),
                b.duration_since(t0).as_secs_f64(),
            )
        };
        let near =
            |(a, b): (f64, f64), (x, y): (f64, f64)| (a - x).abs() < 1e-6 && (b - y).abs() < 1e-6;
        assert!(near(span(0, 1), (0.0, 3.0)), "a: {:?}", span(0, 1));
        assert!(near(span(1, 2), (2.0, 5.0)), "b: {:?}", span(1, 2));
        assert!(near(span(2, 3), (6.0, 7.0)), "c: {:?}", span(2, 3));
    }

    /// With the stage's fetch, a `direct` sender's VM is held until the receiver's VM has
    /// fetched, whatever its later batches do: a's two instances ran 0-2 s on agent 0; b's
    /// agent fetched both files 2-3 s, then ran b's instances one after the other, 3-5 s and
    /// 5-7 s, each staging its file without a copy. a's VM is held 0-3 s (not until 5 s, when
    /// b's second batch started), b's 2-7 s (its fetch included), and the edge took the
    /// fetch's 1 s. Without the fetch, each run fetching its own, a is held until b's last
    /// batch has staged its file.
    #[test]
    fn a_stage_fetch_holds_a_direct_sender_until_the_receivers_vm_has_fetched() {
        use super::fetch::{Fetched, FileOf, StageFetch};
        use super::{Finished, Progress, record_instance};
        use crate::store::AgentSlot;
        let dag = sonic_core::dag::Dag::from_yaml(
            "pair.yaml",
            "name: pair\nfunctions:\n  - { name: a, image: i, command: [x] }\n  - { name: b, image: i, command: [x] }\nedges:\n  - { from: a, to: b, kind: one }\n",
        )
        .expect("dag");
        let agents: Vec<AgentSlot> = (0..2)
            .map(|i| AgentSlot {
                vcpus: None,
                id: format!("a-{i}"),
                url: String::new(),
                vm_type: "m5.large".into(),
            })
            .collect();
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let report = |staged: serde_json::Value| {
            serde_json::from_value::<sonic_api::agent::RunReport>(serde_json::json!({
                "run_id": "r", "status": "succeeded", "cold": true, "seconds": 1.0,
                "start_latency_s": 0.0, "peak_memory_mb": 10.0, "exit_code": 0,
                "error": null, "staged": staged,
            }))
            .expect("report")
        };
        let run = |with_fetch: bool| {
            let fetch = with_fetch.then(|| {
                let file = sonic_api::agent::FetchedFile {
                    bytes: 10,
                    done_s: 1.0,
                    fetched: true,
                };
                std::sync::Arc::new(StageFetch::over(
                    agents[1].clone(),
                    (0..2)
                        .map(|k| FileOf {
                            edge: 0,
                            sender: Some((0, k)),
                            from_store: false,
                        })
                        .collect(),
                    Fetched {
                        started: at(2.0),
                        ended: at(3.0),
                        report: sonic_api::agent::FetchReport {
                            files: vec![file.clone(), file],
                            seconds: 1.0,
                        },
                    },
                ))
            });
            // Staging without a copy takes no time; fetching its own file takes 1 s.
            let (seconds, start) = if with_fetch { (0.0, 3.0) } else { (1.0, 2.0) };
            let staged = |k: u32| {
                serde_json::json!([{"dest": format!("a/{k}/x"), "method": "direct", "bytes": 10,
                    "seconds": seconds, "fetched": !with_fetch}])
            };
            let finished = |function, instance, agent, vm, staged, from, to| Finished {
                reused: false,
                function,
                instance,
                agent,
                vm,
                report: report(staged),
                attempts: 1,
                started: at(from),
                ended: at(to),
                fetch: (function == 1).then(|| fetch.clone()).flatten(),
            };
            let runs = [
                finished(0, 0, 0, 1, serde_json::json!([]), 0.0, 2.0),
                finished(0, 1, 0, 1, serde_json::json!([]), 0.0, 2.0),
                finished(1, 0, 1, 2, staged(0), start, start + 2.0 + seconds),
                finished(
                    1,
                    1,
                    1,
                    2,
                    staged(1),
                    start + 2.0 + seconds,
                    start + 4.0 + 2.0 * seconds,
                ),
            ];
            let mut progress = Progress::default();
            let (mut produced, mut files) = (vec![Vec::new(); 2], Vec::new());
            for f in &runs {
                record_instance(
                    &dag,
                    &agents,
                    f,
                    &mut progress,
                    &mut produced,
                    "j",
                    &mut files,
                );
            }
            let span = |agent, vm| {
                let (a, b) = progress.spans[&(agent, vm)];
                (
                    a.duration_since(t0).as_secs_f64(),
                    b.duration_since(t0).as_secs_f64(),
                )
            };
            (span(0, 1), span(1, 2), progress.edges[&0].1)
        };
        let near =
            |(a, b): (f64, f64), (x, y): (f64, f64)| (a - x).abs() < 1e-6 && (b - y).abs() < 1e-6;
        let (a, b, edge) = run(true);
        assert!(near(a, (0.0, 3.0)), "a: {a:?}");
        assert!(near(b, (2.0, 7.0)), "b: {b:?}");
        assert!((edge - 1.0).abs() < 1e-6, "edge: {edge}");
        let (a, b, _) = run(false);
        assert!(near(a, (0.0, 6.0)), "a without the fetch: {a:?}");
        assert!(near(b, (2.0, 8.0)), "b without the fetch: {b:?}");
    }

    #[test]
    fn the_catalog_prices_the_tier_the_control_plane_has() {
        use sonic_core::catalog::{Catalog, MemoryTier};
        let priced = MemoryTier {
            capacity_mb: 64,
            ..MemoryTier::default()
        };
        let with = |tier: Option<MemoryTier>| Catalog {
            memory_tier: tier,
            ..Catalog::default()
        };
        let f = super::with_tier_as_configured;
        assert_eq!(f(with(Some(priced.clone())), false).memory_tier, None);
        assert_eq!(f(with(None), false).memory_tier, None);
        assert_eq!(
            f(with(Some(priced.clone())), true).memory_tier,
            Some(priced)
        );
        assert_eq!(f(with(None), true).memory_tier, Some(MemoryTier::default()));
    }

    /// What a job's summary says an edge used: what its receivers staged, else (no receiver
    /// staged anything: it never ran) where its senders' files went, else the plan's method.
    #[test]
    fn an_edge_nobody_staged_says_where_its_files_went() {
        use sonic_core::model::Method;
        let mut p = super::Progress {
            methods: vec![Method::Memory],
            ..super::Progress::default()
        };
        assert_eq!(
            edge_method(&p, 0),
            Method::Memory,
            "nothing known: the plan's"
        );
        p.uploaded_to.entry(0).or_default().insert(Method::Remote);
        assert_eq!(
            edge_method(&p, 0),
            Method::Remote,
            "every file went to the store"
        );
        p.uploaded_to.entry(0).or_default().insert(Method::Memory);
        assert_eq!(
            edge_method(&p, 0),
            Method::Memory,
            "some in each: the plan's"
        );
        p.observed.entry(0).or_default().insert(Method::Remote);
        assert_eq!(
            edge_method(&p, 0),
            Method::Remote,
            "what the receivers staged wins"
        );
    }

    #[test]
    fn a_jobs_storage_costs_its_requests_and_its_files_kept() {
        let c = Catalog::default();
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(10);
        let use_ = StoreUse {
            puts: 30,
            gets: 29,
            // 1 GB in the store for 10 s, 2 GB on a disk for 5 s.
            kept: vec![
                (1_000_000_000, t0, Kept::Store),
                (2_000_000_000, t0 + Duration::from_secs(5), Kept::Local),
            ],
        };
        let (storage, requests) = use_.cost(Some(&c), end);
        let r = &c.remote_storage;
        let want_requests = 30.0 * r.put_usd_per_1k / 1e3 + 29.0 * r.get_usd_per_1k / 1e3;
        assert!((requests - want_requests).abs() < 1e-15, "{requests}");
        let want_storage = (10.0 * r.usd_per_gb_month
            + 2.0 * 5.0 * c.local_storage.usd_per_gb_month)
            / SECONDS_PER_MONTH;
        assert!((storage - want_storage).abs() < 1e-15, "{storage}");
        // Without a catalog there are no prices.
        assert_eq!(use_.cost(None, end), (0.0, 0.0));
    }

    /// (time outside the edges, lambda time) of cold instances.
    fn cold(runs: &[(f64, f64)]) -> Vec<Outside> {
        runs.iter()
            .map(|&(outside_s, lambda_s)| Outside {
                outside_s,
                lambda_s,
                cold: true,
            })
            .collect()
    }

    #[test]
    fn a_stage_overhead_is_what_its_slowest_instance_adds_to_the_mean_lambda() {
        // One instance: sent to reported 1.0 s less 0.2 s staging from senders and 0.1 s
        // uploading for receivers is 0.7 s outside the edges, of which 0.5 s lambda.
        let o = cold_batch(&cold(&[(0.7, 0.5)])).expect("one");
        assert!((o - 0.2).abs() < 1e-12, "{o}");
        // Two: the slowest (0.9 s outside the edges) against the mean lambda (0.4 s).
        let o = cold_batch(&cold(&[(0.6, 0.5), (0.9, 0.3)])).expect("two");
        assert!((o - 0.5).abs() < 1e-12, "{o}");
        // Never negative, NaNs left out, nothing without instances.
        assert_eq!(cold_batch(&cold(&[(0.5, 0.6)])), Some(0.0));
        let o = cold_batch(&cold(&[(f64::NAN, 0.1), (0.3, 0.1)])).expect("one finite");
        assert!((o - 0.2).abs() < 1e-12, "{o}");
        assert_eq!(cold_batch(&[]), None);
    }

    fn cold_batch(instances: &[Outside]) -> Option<f64> {
        batch_overhead_s(instances, true)
    }

    /// The demo's planned sort (committed run 1, docs/results/demo-predictions): four mappers on
    /// one VM, two at a time, so a cold batch then a hot one. Each batch's overhead is its
    /// slowest instance's time outside the edges less its own mean lambda: 11.5 and 15.5 ms
    /// (learned apart: the cold one as `overhead_s`, the hot one as `overhead_hot_s`), where
    /// one slowest-minus-mean over all four counted the cold lambdas' lead over the hot ones
    /// (157 ms).
    #[test]
    fn a_stage_overhead_is_taken_per_batch() {
        let runs = [
            (0.346, 0.336, true),
            (0.340, 0.333, true),
            (0.060, 0.047, false),
            (0.053, 0.042, false),
        ]
        .map(|(outside_s, lambda_s, cold)| Outside {
            outside_s,
            lambda_s,
            cold,
        });
        // Cold: 0.346 - 0.3345 = 0.0115; hot: 0.060 - 0.0445 = 0.0155 (their mean, 0.0135, was
        // the one overhead learned before they were told apart).
        let c = batch_overhead_s(&runs, true).expect("a cold batch");
        let h = batch_overhead_s(&runs, false).expect("a hot batch");
        assert!((c - 0.0115).abs() < 1e-9, "{c}");
        assert!((h - 0.0155).abs() < 1e-9, "{h}");
        assert!(((c + h) / 2.0 - 0.0135).abs() < 1e-9);
        // Over all four as one: what the overhead was learned as before.
        let one = cold_batch(&cold(&runs.map(|r| (r.outside_s, r.lambda_s)))).expect("one");
        assert!((one - 0.1565).abs() < 1e-9, "{one}");
    }

    /// A cold run whose container started among others on the agent's host is learned as if
    /// it had started alone on a core: its start divided by the starts per core, the rest of
    /// its time as measured; hot runs and runs without a contention as measured.
    #[test]
    fn a_cold_start_is_learned_as_if_it_had_a_core_to_itself() {
        use sonic_api::agent::StartContention;
        use sonic_api::control::FunctionRun;
        let run = |cold, starts, cores| FunctionRun {
            reused: false,
            cpus: None,
            name: "map".into(),
            instance: 0,
            agent: "a-1".into(),
            vm_type: "m5.large".into(),
            cold,
            seconds: 0.54,
            start_latency_s: Some(0.5),
            start_contention: (starts > 0).then_some(StartContention { starts, cores }),
            peak_memory_mb: None,
            attempts: 1,
            started_s: None,
            ended_s: None,
        };
        let close = |(a, b): (f64, Option<f64>), (x, y): (f64, f64)| {
            (a - x).abs() < 1e-9 && b.is_some_and(|b| (b - y).abs() < 1e-9)
        };
        // Four starts on two cores: half the start.
        assert!(close(uncontended(&run(true, 4, 2)), (0.29, 0.25)));
        // No more starts than cores, no contention said, or a hot run: as measured.
        for r in [run(true, 2, 2), run(true, 0, 0), run(false, 4, 2)] {
            assert!(close(uncontended(&r), (0.54, 0.5)), "{r:?}");
        }
        // A start longer than the run (a bad report) is taken as the run.
        let mut long = run(true, 4, 2);
        long.start_latency_s = Some(0.9);
        assert!(close(uncontended(&long), (0.27, 0.27)));
    }
}
