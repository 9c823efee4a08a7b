//! Persistence: the control plane's SQLite database (DAGs, jobs, profiling samples, fitted models,
//! file metadata, agents) with versioned schema migrations.
//!
//! One writing connection, owned by a writer thread that commits writes in groups: every write is
//! queued ([`Db::write`], [`Db::commit`]), and the thread runs what is queued (up to [`MAX_BATCH`])
//! in one transaction, each write in a savepoint of its own, then answers each requester once that
//! transaction committed. A write that fails (or panics) is rolled back to its savepoint and
//! answered with its error; the others in its batch still commit. So hundreds of concurrent writes
//! cost a few commits, not one commit and one hand-over of a lock each. A database in a file also
//! has a few connections that only read ([`READERS`]): in WAL mode they read the
//! last committed state while the writer writes, so reads (a job's status, the DAG a submission
//! names, the agents) never queue behind a commit. The file is in WAL mode with a busy timeout, so
//! another process (a backup, `sqlite3` by hand) can read it while the daemon runs.
//!
//! Durability: `synchronous = NORMAL` in WAL mode. A commit is in the WAL file when it returns, so
//! it survives the control plane's crash, kill or restart (what durable execution resumes from);
//! the WAL is synced to disk at every checkpoint, not at every commit, so an operating-system crash
//! or a power loss may lose the last commits before it, never corrupting the database (SQLite
//! keeps a consistent prefix). Syncing every commit (`FULL`) cost about 1.5 ms each here, a dozen
//! commits per job on the one writer: it bounded the control plane to about 50 jobs a second
//! (docs/load.md).
//!
//! Every statement is parameterized; no value is ever formatted into SQL.
//! The methods block: async code calls them through [`Db::run`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, mpsc};
use std::time::Duration;

use rusqlite::types::Type;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sonic_api::agent::{Capacity, Heartbeat, RunReport};
use sonic_api::control::{InstanceLog, JobMode, JobPlan, JobStatus, JobSummary};
use sonic_core::planner::Policy;

/// The database's file name inside the data directory.
pub const DB_FILE: &str = "sonic.db";
/// How long a statement waits for another process's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections that only read, beside the writer, for a database in a file.
pub const READERS: usize = 4;
/// Prepared statements each connection keeps (the hot paths' statements are prepared once).
const STATEMENT_CACHE: usize = 64;
/// The most writes the writer thread commits in one transaction.
pub const MAX_BATCH: usize = 256;
/// The most DAGs kept parsed in memory ([`Db::parsed_dag`]); past it the least recently used
/// one is dropped (and parsed again from its row when it is next named).
pub const CACHED_DAGS: usize = 256;

/// The schema, one migration per version; the database records how many it has applied in
/// `schema_version`. Append new migrations; never edit one that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    r#"
    CREATE TABLE dags (
        name        TEXT PRIMARY KEY,
        yaml        TEXT NOT NULL,
        parsed      TEXT NOT NULL,
        revision    INTEGER NOT NULL,
        created_ms  INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE jobs (
        id           TEXT PRIMARY KEY,
        dag          TEXT NOT NULL,
        status       TEXT NOT NULL,
        policy       TEXT NOT NULL,
        mode         TEXT NOT NULL,
        input_bytes  INTEGER NOT NULL,
        params       TEXT NOT NULL,
        summary      TEXT,
        error        TEXT,
        created_ms   INTEGER NOT NULL,
        started_ms   INTEGER,
        finished_ms  INTEGER,
        updated_ms   INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX jobs_by_dag ON jobs (dag, created_ms);

    CREATE TABLE samples (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        dag          TEXT NOT NULL,
        job          TEXT NOT NULL UNIQUE,
        input_bytes  INTEGER NOT NULL,
        measured     TEXT NOT NULL,
        created_ms   INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX samples_by_dag ON samples (dag, id);

    CREATE TABLE models (
        dag         TEXT PRIMARY KEY,
        models      TEXT NOT NULL,
        converged   INTEGER NOT NULL CHECK (converged IN (0, 1)),
        samples     INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE files (
        job         TEXT NOT NULL,
        file_id     TEXT NOT NULL,
        agent       TEXT,
        path        TEXT,
        object_key  TEXT,
        size        INTEGER NOT NULL,
        checksum    TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (job, file_id),
        CHECK ((agent IS NULL) = (path IS NULL)),
        CHECK (agent IS NOT NULL OR object_key IS NOT NULL)
    ) STRICT;

    CREATE TABLE agents (
        id                 TEXT PRIMARY KEY,
        url                TEXT NOT NULL,
        vm_type            TEXT NOT NULL,
        capacity           TEXT NOT NULL,
        registered_ms      INTEGER NOT NULL,
        last_heartbeat_ms  INTEGER NOT NULL
    ) STRICT;
    "#,
    // 2: the plan a planned job ran with, and every instance attempt's log.
    r#"
    ALTER TABLE jobs ADD COLUMN plan TEXT;

    CREATE TABLE instance_logs (
        job         TEXT NOT NULL,
        function    TEXT NOT NULL,
        instance    INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        agent       TEXT NOT NULL,
        log         TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (job, function, instance, attempt)
    ) STRICT;
    "#,
    // 3: durable execution: what a running job's execution needs to resume after a restart
    // (its inputs, its number, the agents it lost, its placement), and every instance it sent.
    r#"
    ALTER TABLE jobs ADD COLUMN execution TEXT;

    CREATE TABLE instance_runs (
        job         TEXT NOT NULL,
        execution   INTEGER NOT NULL,
        function    TEXT NOT NULL,
        instance    INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        agent       TEXT NOT NULL,
        report      TEXT,
        started_ms  INTEGER NOT NULL,
        ended_ms    INTEGER,
        PRIMARY KEY (job, execution, function, instance)
    ) STRICT;
    "#,
    // 4: convergence with hysteresis and drift detection: each DAG's mode (profiling or planned)
    // and what decides when it changes (`sonic_core::mode::DagMode`, as JSON), and why each job
    // ran in its mode.
    r#"
    ALTER TABLE jobs ADD COLUMN mode_reason TEXT;

    CREATE TABLE dag_modes (
        dag         TEXT PRIMARY KEY,
        state       TEXT NOT NULL,
        updated_ms  INTEGER NOT NULL
    ) STRICT;
    "#,
    // 5: models and modes per parameter setting (`sonic_core::setting`: the canonical key of
    // the values of the job parameters that change the work). Rows of earlier versions are the
    // empty setting ''.
    r#"
    CREATE TABLE models_by_setting (
        dag         TEXT NOT NULL,
        setting     TEXT NOT NULL,
        models      TEXT NOT NULL,
        converged   INTEGER NOT NULL CHECK (converged IN (0, 1)),
        samples     INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL,
        PRIMARY KEY (dag, setting)
    ) STRICT;
    INSERT INTO models_by_setting (dag, setting, models, converged, samples, updated_ms)
        SELECT dag, '', models, converged, samples, updated_ms FROM models;
    DROP TABLE models;
    ALTER TABLE models_by_setting RENAME TO models;

    CREATE TABLE dag_modes_by_setting (
        dag         TEXT NOT NULL,
        setting     TEXT NOT NULL,
        state       TEXT NOT NULL,
        updated_ms  INTEGER NOT NULL,
        PRIMARY KEY (dag, setting)
    ) STRICT;
    INSERT INTO dag_modes_by_setting (dag, setting, state, updated_ms)
        SELECT dag, '', state, updated_ms FROM dag_modes;
    DROP TABLE dag_modes;
    ALTER TABLE dag_modes_by_setting RENAME TO dag_modes;
    "#,
    // 6: idempotent submission: the job a DAG's submission key made (`Idempotency-Key`).
    r#"
    CREATE TABLE job_keys (
        dag         TEXT NOT NULL,
        key         TEXT NOT NULL,
        job         TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (dag, key)
    ) STRICT;
    "#,
    // 7: a job's percentile objective (its own or its DAG's, `sonic_core::slo::Slo` as JSON),
    // which a resumed job is planned for again.
    r#"
    ALTER TABLE jobs ADD COLUMN slo TEXT;
    "#,
    // 8: a DAG's object triggers: the objects under a trigger's prefix already seen (each
    // starts at most one job, `job` when it did), and when the trigger first looked (the
    // objects there then were not new).
    r#"
    CREATE TABLE trigger_objects (
        dag         TEXT NOT NULL,
        prefix      TEXT NOT NULL,
        key         TEXT NOT NULL,
        job         TEXT,
        seen_ms     INTEGER NOT NULL,
        PRIMARY KEY (dag, prefix, key)
    ) STRICT;
    CREATE TABLE trigger_baselines (
        dag         TEXT NOT NULL,
        prefix      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (dag, prefix)
    ) STRICT;
    "#,
    // 9: every revision of a DAG kept (a job runs the one it was submitted with, through resume
    // and retry; `--revision N` runs an older one); the revision each job runs (unknown, NULL,
    // for jobs of earlier versions); when a failed job was last retried (its deadline counts from
    // then).
    r#"
    CREATE TABLE dag_revisions (
        dag         TEXT NOT NULL,
        revision    INTEGER NOT NULL,
        yaml        TEXT NOT NULL,
        parsed      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (dag, revision)
    ) STRICT;
    INSERT INTO dag_revisions (dag, revision, yaml, parsed, created_ms)
        SELECT name, revision, yaml, parsed, updated_ms FROM dags;
    ALTER TABLE jobs ADD COLUMN dag_revision INTEGER;
    ALTER TABLE jobs ADD COLUMN retried_ms INTEGER;
    "#,
    // 10: the secret store: values a DAG's functions get as environment variables
    // (`env: { VAR: { secret: NAME } }`), never served back.
    r#"
    CREATE TABLE secrets (
        name        TEXT PRIMARY KEY,
        value       TEXT NOT NULL,
        updated_ms  INTEGER NOT NULL
    ) STRICT;
    "#,
];

/// A secret of the store as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// Its value's size.
    pub bytes: u64,
    /// When it was last set, Unix milliseconds.
    pub updated_ms: i64,
}

/// The schema version this build writes.
pub fn schema_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Why a database call failed. Clients only ever see "internal error"; this is for logs.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused the statement.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A value could not be written as JSON.
    #[error("cannot encode {what} as json: {source}")]
    Encode {
        /// What it was.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The database was written by a newer build.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// Its schema version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// The database's folder could not be made.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A row already exists with this key (a duplicate job id, ...).
    #[error("{0} already exists")]
    Conflict(String),
    /// A value the schema cannot hold.
    #[error("invalid value: {0}")]
    Invalid(String),
    /// The blocking task running the statement failed (or the write panicked).
    #[error("database task failed: {0}")]
    Task(String),
    /// The transaction holding this write (with the others of its batch) did not commit: nothing
    /// of it was recorded.
    #[error("commit failed: {0}")]
    Commit(String),
}

/// How an apply changed the stored DAG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The DAG was new.
    Created,
    /// A different file replaced the stored one; the revision grew.
    Updated,
    /// The same text as stored: nothing changed.
    Unchanged,
}

/// A stored DAG.
#[derive(Debug, Clone, PartialEq)]
pub struct DagRecord {
    /// The DAG's name.
    pub name: String,
    /// The file as applied.
    pub yaml: String,
    /// The checked `sonic_core::dag::Dag`, as JSON.
    pub parsed: serde_json::Value,
    /// 1 when created, one more per change.
    pub revision: u64,
    /// When it was first applied, Unix ms.
    pub created_ms: i64,
    /// When it last changed, Unix ms.
    pub updated_ms: i64,
}

impl DagRecord {
    /// The checked DAG this record holds; an error naming it when it no longer decodes.
    pub fn dag(&self) -> Result<sonic_core::dag::Dag, String> {
        serde_json::from_value(self.parsed.clone())
            .map_err(|e| format!("stored dag {} does not decode: {e}", self.name))
    }
}

/// A job row.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// The job's id (`j-...`).
    pub id: String,
    /// Its DAG's name.
    pub dag: String,
    /// Queued, running, or how it ended.
    pub status: JobStatus,
    /// The policy it runs with.
    pub policy: Policy,
    /// Profiling or planned.
    pub mode: JobMode,
    /// The size of its input.
    pub input_bytes: u64,
    /// The parameters the job overrides.
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Its summary, once it ended.
    pub summary: Option<JobSummary>,
    /// Why it failed.
    pub error: Option<String>,
    /// When it was submitted, Unix ms.
    pub created_ms: i64,
    /// When it started running, Unix ms.
    pub started_ms: Option<i64>,
    /// When it ended, Unix ms.
    pub finished_ms: Option<i64>,
    /// When the row last changed, Unix ms.
    pub updated_ms: i64,
    /// How a planned job was planned and placed; set when its execution starts.
    pub plan: Option<JobPlan>,
    /// Why it runs in its mode (the DAG's mode and why, or the forced policy).
    pub mode_reason: Option<String>,
    /// The percentile objective it is planned for: its own (`SubmitJob::slo`) or its DAG's.
    pub slo: Option<sonic_core::slo::Slo>,
    /// The revision of its DAG it runs, through resume and retry (`None`: a job of a version that
    /// did not record it, which runs the DAG as it is now).
    pub dag_revision: Option<u64>,
    /// When it was last retried ([`Db::retry_job`]), Unix ms: its deadline counts from then.
    pub retried_ms: Option<i64>,
}

/// What came of asking to delete a job ([`Writer::delete_job`]).
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteJob {
    /// Its rows are gone (its record as it was): its files are the caller's to delete.
    Deleted(Box<JobRecord>),
    /// No such job.
    NotFound,
    /// It has not ended.
    NotEnded(JobStatus),
}

/// What came of asking to retry a job ([`Writer::retry_job`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Retry {
    /// Queued again under its id: its record as it is now, and how many of its instances'
    /// successes it keeps (they are not run again).
    Queued {
        /// The job, queued.
        job: Box<JobRecord>,
        /// Its instances whose successes it keeps.
        reused: usize,
    },
    /// No such job.
    NotFound,
    /// It has not failed (it is queued, running or succeeded).
    NotFailed(JobStatus),
    /// It failed, but what it kept (its execution, its succeeded runs' files) was deleted.
    NothingKept,
}

impl JobRecord {
    /// Why its DAG could not be found at the revision it runs.
    pub fn dag_missing(&self) -> String {
        match self.dag_revision {
            Some(r) => format!("dag {} has no revision {r}", self.dag),
            None => format!("dag {} no longer exists", self.dag),
        }
    }
}

/// What a job's current execution needs to go on after a control-plane restart, recorded when it
/// starts (and again when its placement is granted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// 1 for the first execution; one more for each run again without lost agents, and for a
    /// retry ([`Writer::retry_job`]).
    pub number: u32,
    /// Executions of earlier tries of the job (before its last retry): they do not count
    /// against the executions one try may take.
    #[serde(default)]
    pub before: u32,
    /// The job's input objects: `(name under input/, object key)`.
    pub inputs: Vec<(String, String)>,
    /// Agents earlier executions lost.
    #[serde(default)]
    pub lost: Vec<String>,
    /// A planned job's grant, once granted: per DAG function, the agent ids of its VMs in
    /// order (empty before, and for unplanned jobs).
    #[serde(default)]
    pub hosts: Vec<Vec<String>>,
    /// With `hosts`: how each DAG edge moves its data in the granted plan (empty before, for
    /// unplanned jobs, and in records made before it was kept).
    #[serde(default)]
    pub methods: Vec<sonic_core::model::Method>,
}

/// One instance an execution sent to an agent: running (no report yet) or succeeded.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRunRecord {
    /// The job.
    pub job: String,
    /// The execution that sent it (1 for the first).
    pub execution: u32,
    /// The DAG function.
    pub function: String,
    /// The instance's index.
    pub instance: u32,
    /// The attempt sent last (the agent's run id names it).
    pub attempt: u32,
    /// The agent it was sent to.
    pub agent: String,
    /// Set once the instance succeeded.
    pub report: Option<RunReport>,
    /// When it was sent, Unix ms.
    pub started_ms: i64,
    /// When it succeeded, Unix ms.
    pub ended_ms: Option<i64>,
}

/// What one profiled job measured: the DAG parameters at its input size. One per job: recording a
/// job's sample again replaces it, so a retried recording does not count twice.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRecord {
    /// The DAG.
    pub dag: String,
    /// The job that measured it.
    pub job: String,
    /// The job's input size.
    pub input_bytes: u64,
    /// The measured DAG parameters (`sonic_core::params::Params`), as JSON.
    pub measured: serde_json::Value,
    /// When it was recorded, Unix ms.
    pub created_ms: i64,
}

/// The models fitted for one parameter setting of a DAG.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRecord {
    /// The DAG.
    pub dag: String,
    /// The parameter setting's canonical key (`sonic_core::setting::Setting::key`; '' for the
    /// empty setting, and for models recorded before settings).
    pub setting: String,
    /// The fitted models (`sonic_core::regression::DagModels`), as JSON.
    pub models: serde_json::Value,
    /// The models predict well enough (cross-validated error under the threshold) to plan with.
    pub converged: bool,
    /// How many samples they were fitted on.
    pub samples: u64,
    /// When they were last refitted, Unix ms.
    pub updated_ms: i64,
}

/// A copy of a file on an agent's disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCopy {
    /// The agent.
    pub agent: String,
    /// The file's path in the job's namespace on that agent.
    pub path: String,
}

/// Where one intermediate or result file of a job lives: on an agent, in the object store, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    /// The job.
    pub job: String,
    /// The id its writer always uses, so a retried writer replaces its own row.
    pub file_id: String,
    /// Its copy on an agent, if any.
    pub local: Option<LocalCopy>,
    /// Its key in the object store, if uploaded.
    pub object_key: Option<String>,
    /// Its size, bytes.
    pub size: u64,
    /// Its xxh3 checksum, hex.
    pub checksum: String,
    /// When it was recorded, Unix ms.
    pub created_ms: i64,
}

/// A registered agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRecord {
    /// The agent's id.
    pub id: String,
    /// Where it is reached.
    pub url: String,
    /// The VM type it stands for.
    pub vm_type: String,
    /// What it registered (and its last heartbeat updated).
    pub capacity: Capacity,
    /// When it last registered, Unix ms.
    pub registered_ms: i64,
    /// When it was last heard from, Unix ms.
    pub last_heartbeat_ms: i64,
}

impl AgentRecord {
    /// Whether the agent was heard from within `timeout` of `now_ms`.
    pub fn alive(&self, now_ms: i64, timeout: Duration) -> bool {
        let timeout = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        now_ms.saturating_sub(self.last_heartbeat_ms) <= timeout
    }
}

/// The control plane's database. Cheap to clone; every clone shares the same connections.
#[derive(Debug, Clone)]
pub struct Db {
    /// The writing connection: the writer thread's, which locks it for each batch; a few rare
    /// writes (DAGs, samples, models) and a database in memory's reads lock it directly.
    conn: Arc<Mutex<Connection>>,
    /// Read-only connections (none for a database in memory: it is the writer's alone).
    readers: Option<Arc<Readers>>,
    /// The writer thread's queue; the thread ends when the last clone is dropped.
    queue: Arc<WriteQueue>,
    /// The DAGs last looked up, parsed, as their rows hold them.
    dags: Arc<DagCache>,
    /// What the learning code last read and wrote per setting of a DAG (its samples, models
    /// and mode), so that a finished job's refit reads only the samples recorded since
    /// (`crate::learn::Memory`, installed at its first use: [`Db::derived`]).
    learned: Arc<std::sync::OnceLock<Box<dyn Derived>>>,
}

/// What a layer above keeps in memory from this database's rows per (DAG, setting): forgotten
/// when the rows it came from change ([`Db::put_model`], [`Db::put_dag_mode`], a replaced
/// sample).
pub trait Derived: std::any::Any + Send + Sync + std::fmt::Debug {
    /// Forgets what was derived from one setting of a DAG.
    fn forget(&self, dag: &str, setting: &str);
    /// Forgets everything.
    fn forget_all(&self);
}

/// A DAG as its row holds it, parsed once: what [`Db::parsed_dag`] answers.
#[derive(Debug)]
pub struct ParsedDag {
    /// The row's revision (1 when created, one more per change).
    pub revision: u64,
    /// The checked DAG.
    pub dag: sonic_core::dag::Dag,
}

/// Parsed DAGs by name, at most [`CACHED_DAGS`]. What it holds is what the `dags` table held
/// at some point no earlier than the last change this process made to the name: [`Db::put_dag`]
/// and [`Db::delete_dag`] drop a name once their change is committed (before they return), and a
/// lookup that read a row keeps it only if no change came in between (`generation`). This process
/// is the only writer of the table (another process may read the file, not change DAGs).
#[derive(Default)]
struct DagCache {
    state: RwLock<DagCacheState>,
    /// Orders the entries' uses, for evicting the least recently used.
    clock: AtomicU64,
}

#[derive(Default)]
struct DagCacheState {
    dags: HashMap<String, CachedDag>,
    /// One more at every committed change of the table.
    generation: u64,
}

struct CachedDag {
    parsed: Arc<ParsedDag>,
    /// `DagCache::clock` when last used.
    used: AtomicU64,
}

impl std::fmt::Debug for DagCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DagCache")
            .field("len", &self.read().dags.len())
            .finish()
    }
}

impl DagCache {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, DagCacheState> {
        // Nothing is left half done under the lock: a panic cannot poison it meaningfully.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, DagCacheState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, name: &str) -> Option<Arc<ParsedDag>> {
        let state = self.read();
        let entry = state.dags.get(name)?;
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        entry.used.store(now, Ordering::Relaxed);
        Some(entry.parsed.clone())
    }

    fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Keeps `parsed`, read from the table after `generation` was current, unless the table
    /// changed since.
    fn fill(&self, name: &str, generation: u64, parsed: Arc<ParsedDag>) {
        let mut state = self.write();
        if state.generation != generation {
            return;
        }
        if !state.dags.contains_key(name) && state.dags.len() >= CACHED_DAGS {
            let oldest = state
                .dags
                .iter()
                .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.dags.remove(&k);
            }
        }
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        state.dags.insert(
            name.to_owned(),
            CachedDag {
                parsed,
                used: AtomicU64::new(now),
            },
        );
    }

    /// The row of `name` changed (committed): what was kept of it goes, and lookups that read
    /// before this do not keep what they read.
    fn changed(&self, name: &str) {
        let mut state = self.write();
        state.generation += 1;
        state.dags.remove(name);
    }

    fn len(&self) -> usize {
        self.read().dags.len()
    }
}

/// How many writes the writer thread committed, in how many transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Transactions committed (or attempted).
    pub batches: u64,
    /// Writes they held.
    pub writes: u64,
    /// The most writes one transaction held.
    pub largest: u64,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    writes: AtomicU64,
    largest: AtomicU64,
}

/// The sending side of the writer thread's queue.
struct WriteQueue {
    tx: mpsc::Sender<Box<dyn Request>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for WriteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteQueue").finish_non_exhaustive()
    }
}

/// Where a queued write's result goes.
enum Reply<T> {
    /// A thread blocked in [`Db::write`].
    Blocking(mpsc::SyncSender<Result<T, StoreError>>),
    /// A future from [`Db::commit`].
    Async(tokio::sync::oneshot::Sender<Result<T, StoreError>>),
}

impl<T> Reply<T> {
    fn send(self, r: Result<T, StoreError>) {
        // A requester that stopped waiting (a dropped future) loses only the answer: its write
        // stands, as a write on a blocking thread did.
        match self {
            Reply::Blocking(s) => drop(s.send(r)),
            Reply::Async(s) => drop(s.send(r)),
        }
    }
}

/// One queued write, type-erased: run in its batch's transaction, answered after the commit.
trait Request: Send {
    /// Runs the write in a savepoint of its own; `Err` when the savepoint itself could not be
    /// taken, released or rolled back (the batch is then abandoned).
    fn run(&mut self, w: &Writer<'_>) -> Result<(), rusqlite::Error>;
    /// Answers the requester: its own result when the batch committed, else the batch's error.
    fn answer(self: Box<Self>, batch: Result<(), &StoreError>);
}

struct Queued<T, F> {
    work: Option<F>,
    result: Option<Result<T, StoreError>>,
    reply: Reply<T>,
}

impl<T, F> Request for Queued<T, F>
where
    T: Send,
    F: FnOnce(&Writer<'_>) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, w: &Writer<'_>) -> Result<(), rusqlite::Error> {
        if let Some(work) = self.work.take() {
            self.result = Some(w.savepoint(work)?);
        }
        Ok(())
    }

    fn answer(self: Box<Self>, batch: Result<(), &StoreError>) {
        let r = match (batch, self.result) {
            (_, Some(Err(e))) => Err(e),
            (Ok(()), Some(Ok(v))) => Ok(v),
            (Err(e), _) => Err(StoreError::Commit(e.to_string())),
            (Ok(()), None) => Err(StoreError::Task("the write was not run".into())),
        };
        self.reply.send(r);
    }
}

/// The writer thread: takes the first queued write, locks the connection, takes every write queued
/// meanwhile (up to [`MAX_BATCH`]), commits them in one transaction and answers them.
fn serve_writes(
    conn: Arc<Mutex<Connection>>,
    rx: mpsc::Receiver<Box<dyn Request>>,
    counters: Arc<Counters>,
) {
    while let Ok(first) = rx.recv() {
        let asked = std::time::Instant::now();
        let guard = conn.lock().unwrap_or_else(|p| p.into_inner());
        let lock_us = asked.elapsed().as_micros() as u64;
        // Taken after the lock: what queued while it waited joins this batch.
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        // At debug (`sonic-load`'s SONIC_LOAD_SPANS): how long each batch held the connection,
        // and how long the writer waited for it (the rare writes that lock it directly).
        let span = tracing::debug_span!("write_batch", writes = batch.len(), lock_us).entered();
        let outcome = commit_batch(&guard, &mut batch);
        drop(guard);
        drop(span);
        if let Err(e) = &outcome {
            tracing::error!(error = %e, writes = batch.len(), "a batch of writes did not commit");
        }
        let n = batch.len() as u64;
        counters.batches.fetch_add(1, Ordering::Relaxed);
        counters.writes.fetch_add(n, Ordering::Relaxed);
        counters.largest.fetch_max(n, Ordering::Relaxed);
        for r in batch {
            r.answer(outcome.as_ref().map(|_| ()));
        }
    }
}

/// Runs a batch in one IMMEDIATE transaction and commits it; on an error of the transaction itself
/// (begin, a savepoint, commit) rolls everything back.
fn commit_batch(conn: &Connection, batch: &mut [Box<dyn Request>]) -> Result<(), StoreError> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let w = Writer(conn);
    let done = batch
        .iter_mut()
        .try_for_each(|r| r.run(&w))
        .and_then(|()| conn.prepare_cached("COMMIT")?.execute([]).map(drop));
    if let Err(e) = done {
        if !conn.is_autocommit()
            && let Err(r) = conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %r, "cannot roll back a failed batch of writes");
        }
        return Err(e.into());
    }
    Ok(())
}

/// The connections that only read, taken in turn.
#[derive(Debug)]
struct Readers {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

impl Readers {
    fn open(path: &Path, n: usize) -> Result<Readers, StoreError> {
        let conns = (0..n)
            .map(|_| {
                let c = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                c.busy_timeout(BUSY_TIMEOUT)?;
                c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                Ok(Mutex::new(c))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Readers {
            conns,
            next: AtomicUsize::new(0),
        })
    }

    /// A free connection if there is one, else the next in turn once it is free.
    fn get(&self) -> MutexGuard<'_, Connection> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            if let Ok(c) = self.conns[(start + i) % n].try_lock() {
                return c;
            }
        }
        // As for the writer: a panic while reading leaves nothing half done.
        self.conns[start % n]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

fn u64_to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Invalid(format!("{what} {v} is too large")))
}

fn to_json<T: Serialize>(v: &T, what: &'static str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|source| StoreError::Encode { what, source })
}

/// Reads a JSON column; a value that no longer decodes is a conversion error naming the column.
fn json_col<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn opt_json_col<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<T>> {
    let text: Option<String> = row.get(idx)?;
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
    })
    .transpose()
}

fn u64_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let v: i64 = row.get(idx)?;
    u64::try_from(v).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(idx, v))
}

fn parsed_col<T: std::str::FromStr>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = row.get(idx)?;
    text.parse()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

/// Maps a unique-key violation to [`StoreError::Conflict`].
fn conflict(e: rusqlite::Error, what: impl FnOnce() -> String) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            StoreError::Conflict(what())
        }
        _ => StoreError::Sqlite(e),
    }
}

/// What a DAG's revision is kept under in the parsed DAGs (a name holds no `@`).
fn revision_key(name: &str, revision: u64) -> String {
    format!("{name}@{revision}")
}

/// What `conn` holds of a job's execution's instances.
fn instance_runs_on(
    conn: &Connection,
    job: &str,
    execution: u32,
) -> Result<Vec<InstanceRunRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT job, execution, function, instance, attempt, agent, report, started_ms, \
           ended_ms FROM instance_runs WHERE job = ?1 AND execution = ?2 \
         ORDER BY function, instance",
    )?;
    let rows = stmt.query_map(params![job, execution], |r| {
        Ok(InstanceRunRecord {
            job: r.get(0)?,
            execution: r.get(1)?,
            function: r.get(2)?,
            instance: r.get(3)?,
            attempt: r.get(4)?,
            agent: r.get(5)?,
            report: opt_json_col(r, 6)?,
            started_ms: r.get(7)?,
            ended_ms: r.get(8)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

const DAG_COLUMNS: &str = "name, yaml, parsed, revision, created_ms, updated_ms";

fn dag_row(row: &Row<'_>) -> rusqlite::Result<DagRecord> {
    Ok(DagRecord {
        name: row.get(0)?,
        yaml: row.get(1)?,
        parsed: json_col(row, 2)?,
        revision: u64_col(row, 3)?,
        created_ms: row.get(4)?,
        updated_ms: row.get(5)?,
    })
}

const JOB_COLUMNS: &str = "id, dag, status, policy, mode, input_bytes, params, summary, error, \
                           created_ms, started_ms, finished_ms, updated_ms, plan, mode_reason, slo, \
                           dag_revision, retried_ms";

fn job_row(row: &Row<'_>) -> rusqlite::Result<JobRecord> {
    Ok(JobRecord {
        id: row.get(0)?,
        dag: row.get(1)?,
        status: parsed_col(row, 2)?,
        policy: {
            let text: String = row.get(3)?;
            text.parse::<Policy>()
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, Type::Text, e.into()))?
        },
        mode: parsed_col(row, 4)?,
        input_bytes: u64_col(row, 5)?,
        params: json_col(row, 6)?,
        summary: opt_json_col(row, 7)?,
        error: row.get(8)?,
        created_ms: row.get(9)?,
        started_ms: row.get(10)?,
        finished_ms: row.get(11)?,
        updated_ms: row.get(12)?,
        plan: opt_json_col(row, 13)?,
        mode_reason: row.get(14)?,
        slo: opt_json_col(row, 15)?,
        dag_revision: row
            .get::<_, Option<i64>>(16)?
            .map(|r| u64::try_from(r).unwrap_or(0)),
        retried_ms: row.get(17)?,
    })
}

const SAMPLE_COLUMNS: &str = "dag, job, input_bytes, measured, created_ms";

fn sample_row(row: &Row<'_>) -> rusqlite::Result<SampleRecord> {
    Ok(SampleRecord {
        dag: row.get(0)?,
        job: row.get(1)?,
        input_bytes: u64_col(row, 2)?,
        measured: json_col(row, 3)?,
        created_ms: row.get(4)?,
    })
}

const MODEL_COLUMNS: &str = "dag, setting, models, converged, samples, updated_ms";

fn model_row(row: &Row<'_>) -> rusqlite::Result<ModelRecord> {
    Ok(ModelRecord {
        dag: row.get(0)?,
        setting: row.get(1)?,
        models: json_col(row, 2)?,
        converged: row.get(3)?,
        samples: u64_col(row, 4)?,
        updated_ms: row.get(5)?,
    })
}

const FILE_COLUMNS: &str = "job, file_id, agent, path, object_key, size, checksum, created_ms";

fn file_row(row: &Row<'_>) -> rusqlite::Result<FileRecord> {
    let agent: Option<String> = row.get(2)?;
    let path: Option<String> = row.get(3)?;
    Ok(FileRecord {
        job: row.get(0)?,
        file_id: row.get(1)?,
        // The schema guarantees agent and path are both set or both null.
        local: agent
            .zip(path)
            .map(|(agent, path)| LocalCopy { agent, path }),
        object_key: row.get(4)?,
        size: u64_col(row, 5)?,
        checksum: row.get(6)?,
        created_ms: row.get(7)?,
    })
}

const AGENT_COLUMNS: &str = "id, url, vm_type, capacity, registered_ms, last_heartbeat_ms";

fn agent_row(row: &Row<'_>) -> rusqlite::Result<AgentRecord> {
    Ok(AgentRecord {
        id: row.get(0)?,
        url: row.get(1)?,
        vm_type: row.get(2)?,
        capacity: json_col(row, 3)?,
        registered_ms: row.get(4)?,
        last_heartbeat_ms: row.get(5)?,
    })
}

impl Db {
    /// Opens (creating if needed) `<data_dir>/sonic.db` and brings its schema up to date.
    pub fn open_dir(data_dir: &Path) -> Result<Db, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::Io {
            path: data_dir.display().to_string(),
            source,
        })?;
        Db::open(&data_dir.join(DB_FILE))
    }

    /// Opens (creating if needed) the database file at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "sqlite did not switch to WAL");
            return Db::init(conn, None);
        }
        // Readers only once the schema is up to date: they are opened after the writer migrated.
        let mut db = Db::init(conn, None)?;
        db.readers = Some(Arc::new(Readers::open(path, READERS)?));
        Ok(db)
    }

    /// A database that lives only as long as this value (tests).
    pub fn open_in_memory() -> Result<Db, StoreError> {
        Db::init(Connection::open_in_memory()?, None)
    }

    fn init(mut conn: Connection, readers: Option<Arc<Readers>>) -> Result<Db, StoreError> {
        // NORMAL: a commit survives the process, not a power loss (see the module's comment).
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        migrate(&mut conn)?;
        let conn = Arc::new(Mutex::new(conn));
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let (c, k) = (conn.clone(), counters.clone());
        std::thread::Builder::new()
            .name("sonic-db-writer".into())
            .spawn(move || serve_writes(c, rx, k))
            .map_err(|e| StoreError::Task(format!("cannot start the database writer: {e}")))?;
        Ok(Db {
            conn,
            readers,
            queue: Arc::new(WriteQueue { tx, counters }),
            dags: Arc::new(DagCache::default()),
            learned: Arc::default(),
        })
    }

    /// Queues `f` for the writer thread; `reply` gets its result once its batch committed.
    fn queue<T, F>(&self, f: F, reply: Reply<T>) -> Result<(), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Writer<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let request: Box<dyn Request> = Box::new(Queued {
            work: Some(f),
            result: None,
            reply,
        });
        self.queue
            .tx
            .send(request)
            .map_err(|_| StoreError::Task("the database writer stopped".into()))
    }

    /// How many writes the writer thread committed so far, in how many transactions.
    pub fn write_stats(&self) -> WriteStats {
        let c = &self.queue.counters;
        WriteStats {
            batches: c.batches.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            largest: c.largest.load(Ordering::Relaxed),
        }
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (it rolls back what was not
        // committed), so the connection stays usable.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection for reading: one of the readers, or the writer's when there are none. What a
    /// write committed before this call is seen (WAL readers read the last commit).
    fn reader(&self) -> MutexGuard<'_, Connection> {
        match &self.readers {
            Some(r) => r.get(),
            None => self.conn(),
        }
    }

    /// Runs blocking database work off the async runtime's threads.
    pub async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Db) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Runs `f`'s writes on the writer thread, all of them or none (an error or a panic in `f`
    /// rolls back its own writes, not the others of its batch), and blocks until they are
    /// committed. From async code, [`Db::commit`] waits without a blocking thread. `f` must not
    /// wait for another write (the writer thread runs it).
    pub fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Writer<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.queue(f, Reply::Blocking(tx))?;
        rx.recv()
            .map_err(|_| StoreError::Task("the database writer stopped".into()))?
    }

    /// [`Db::write`] for async code: `f` is queued at once (before the future is polled), and the
    /// future resolves once its batch committed. Dropping the future does not cancel the write.
    pub fn commit<T, F>(
        &self,
        f: F,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&Writer<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let queued = self.queue(f, Reply::Async(tx));
        async move {
            queued?;
            rx.await
                .map_err(|_| StoreError::Task("the database writer stopped".into()))?
        }
    }

    /// The schema version the file is at.
    pub fn version(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn()
            .query_row("SELECT version FROM schema_version", [], |r| r.get(0))?)
    }

    /// Whether the database answers.
    pub fn ping(&self) -> Result<(), StoreError> {
        self.reader()
            .query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?;
        Ok(())
    }

    // ---- DAGs ----

    /// Stores a DAG under `name`, creating it or replacing its file.
    pub fn put_dag(
        &self,
        name: &str,
        yaml: &str,
        parsed: &serde_json::Value,
        now_ms: i64,
    ) -> Result<(Applied, DagRecord), StoreError> {
        let parsed_text = to_json(parsed, "parsed dag")?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let existing: Option<(String, i64)> = tx
            .query_row(
                "SELECT yaml, revision FROM dags WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let applied = match existing {
            None => {
                // A DAG deleted and applied again goes on from its last revision: each number
                // names one file for good (its jobs ran it).
                let last: i64 = tx.query_row(
                    "SELECT COALESCE(MAX(revision), 0) FROM dag_revisions WHERE dag = ?1",
                    params![name],
                    |r| r.get(0),
                )?;
                tx.execute(
                    "INSERT INTO dags (name, yaml, parsed, revision, created_ms, updated_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                    params![name, yaml, parsed_text, last + 1, now_ms],
                )?;
                Applied::Created
            }
            Some((old, _)) if old == yaml => Applied::Unchanged,
            Some((_, rev)) => {
                tx.execute(
                    "UPDATE dags SET yaml = ?2, parsed = ?3, revision = ?4, updated_ms = ?5 \
                     WHERE name = ?1",
                    params![name, yaml, parsed_text, rev + 1, now_ms],
                )?;
                Applied::Updated
            }
        };
        if applied != Applied::Unchanged {
            tx.execute(
                "INSERT INTO dag_revisions (dag, revision, yaml, parsed, created_ms) \
                 SELECT name, revision, yaml, parsed, updated_ms FROM dags WHERE name = ?1",
                params![name],
            )?;
        }
        let record = tx.query_row(
            &format!("SELECT {DAG_COLUMNS} FROM dags WHERE name = ?1"),
            params![name],
            dag_row,
        )?;
        tx.commit()?;
        // Still holding the connection: changes of one name reach the cache in commit order.
        if applied != Applied::Unchanged {
            self.dags.changed(name);
        }
        Ok((applied, record))
    }

    /// The DAG named `name`.
    pub fn get_dag(&self, name: &str) -> Result<Option<DagRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached(&format!("SELECT {DAG_COLUMNS} FROM dags WHERE name = ?1"))?
            .query_row(params![name], dag_row)
            .optional()?)
    }

    /// Every DAG, by name.
    pub fn list_dags(&self) -> Result<Vec<DagRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt =
            conn.prepare_cached(&format!("SELECT {DAG_COLUMNS} FROM dags ORDER BY name"))?;
        let rows = stmt.query_map([], dag_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Revision `revision` of DAG `name`, as it was applied (`updated_ms`: when), whether or not
    /// the DAG is still registered.
    pub fn get_dag_revision(
        &self,
        name: &str,
        revision: u64,
    ) -> Result<Option<DagRecord>, StoreError> {
        let revision = u64_to_i64(revision, "revision")?;
        Ok(self
            .reader()
            .prepare_cached(
                "SELECT dag, yaml, parsed, revision, created_ms, created_ms FROM dag_revisions \
                 WHERE dag = ?1 AND revision = ?2",
            )?
            .query_row(params![name, revision], dag_row)
            .optional()?)
    }

    /// The revisions of DAG `name` kept, in order.
    pub fn dag_revisions(&self, name: &str) -> Result<Vec<u64>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT revision FROM dag_revisions WHERE dag = ?1 ORDER BY revision",
        )?;
        let rows = stmt.query_map(params![name], |r| u64_col(r, 0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes a DAG's definition; its jobs, samples and models stay (history, and what a
    /// re-applied DAG of the same name learns from). Returns whether it existed.
    pub fn delete_dag(&self, name: &str) -> Result<bool, StoreError> {
        let conn = self.conn();
        let n = conn.execute("DELETE FROM dags WHERE name = ?1", params![name])?;
        if n > 0 {
            self.dags.changed(name);
        }
        Ok(n > 0)
    }

    /// The DAG named `name`, parsed: from memory when it was looked up since it last changed
    /// (no statement, no blocking), else read from its row and kept ([`CACHED_DAGS`] at most).
    /// Blocks on a miss; async code calls [`Db::parsed_dag`]. A row that no longer decodes is
    /// [`StoreError::Invalid`].
    pub fn load_dag(&self, name: &str) -> Result<Option<Arc<ParsedDag>>, StoreError> {
        if let Some(hit) = self.dags.get(name) {
            return Ok(Some(hit));
        }
        let generation = self.dags.generation();
        let Some(record) = self.get_dag(name)? else {
            return Ok(None);
        };
        let parsed = Arc::new(ParsedDag {
            revision: record.revision,
            dag: record.dag().map_err(StoreError::Invalid)?,
        });
        self.dags.fill(name, generation, parsed.clone());
        Ok(Some(parsed))
    }

    /// [`Db::load_dag`] for async code: a DAG kept in memory is answered at once, without a
    /// blocking thread; only a miss reads its row on one ([`Db::run`]).
    pub async fn parsed_dag(&self, name: &str) -> Result<Option<Arc<ParsedDag>>, StoreError> {
        if let Some(hit) = self.dags.get(name) {
            return Ok(Some(hit));
        }
        let lookup = name.to_owned();
        self.run(move |db| db.load_dag(&lookup)).await
    }

    /// Revision `revision` of DAG `name`, parsed (`None`: the DAG as it is now, [`Db::load_dag`]).
    /// A revision never changes: once read it is kept under its own entry. Blocks on a miss.
    pub fn load_dag_at(
        &self,
        name: &str,
        revision: Option<u64>,
    ) -> Result<Option<Arc<ParsedDag>>, StoreError> {
        let Some(revision) = revision else {
            return self.load_dag(name);
        };
        if let Some(now) = self.load_dag(name)?
            && now.revision == revision
        {
            return Ok(Some(now));
        }
        let key = revision_key(name, revision);
        if let Some(hit) = self.dags.get(&key) {
            return Ok(Some(hit));
        }
        let generation = self.dags.generation();
        let Some(record) = self.get_dag_revision(name, revision)? else {
            return Ok(None);
        };
        let parsed = Arc::new(ParsedDag {
            revision,
            dag: record.dag().map_err(StoreError::Invalid)?,
        });
        self.dags.fill(&key, generation, parsed.clone());
        Ok(Some(parsed))
    }

    /// [`Db::load_dag_at`] for async code: answered at once when kept in memory.
    pub async fn parsed_dag_at(
        &self,
        name: &str,
        revision: Option<u64>,
    ) -> Result<Option<Arc<ParsedDag>>, StoreError> {
        if let Some(hit) = self.dags.get(name)
            && revision.is_none_or(|r| r == hit.revision)
        {
            return Ok(Some(hit));
        }
        if let Some(r) = revision
            && let Some(hit) = self.dags.get(&revision_key(name, r))
        {
            return Ok(Some(hit));
        }
        let lookup = name.to_owned();
        self.run(move |db| db.load_dag_at(&lookup, revision)).await
    }

    /// How many DAGs are kept parsed in memory (at most [`CACHED_DAGS`]).
    pub fn cached_dags(&self) -> usize {
        self.dags.len()
    }

    /// How many DAGs are registered.
    pub fn count_dags(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .reader()
            .prepare_cached("SELECT COUNT(*) FROM dags")?
            .query_row([], |r| r.get(0))?;
        Ok(n.max(0) as u64)
    }

    // ---- jobs ----

    /// Adds a new job; [`StoreError::Conflict`] when the id is taken.
    pub fn insert_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let job = job.clone();
        self.write(move |w| w.insert_job(&job))
    }

    /// Moves a job to `status`; the first move to `running` records the start, a move to a terminal
    /// status the end. Returns whether the job exists.
    pub fn set_job_status(
        &self,
        id: &str,
        status: JobStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |w| w.set_job_status(&id, status, now_ms))
    }

    /// Records how a job ended. Returns whether the job exists.
    pub fn finish_job(
        &self,
        id: &str,
        status: JobStatus,
        summary: Option<&JobSummary>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (id, summary) = (id.to_owned(), summary.cloned());
        let error = error.map(str::to_owned);
        self.write(move |w| w.finish_job(&id, status, summary.as_ref(), error.as_deref(), now_ms))
    }

    /// Records the plan a job runs with. Returns whether the job exists.
    pub fn set_job_plan(&self, id: &str, plan: &JobPlan, now_ms: i64) -> Result<bool, StoreError> {
        let text = to_json(plan, "job plan")?;
        let id = id.to_owned();
        self.write(move |w| {
            let n =
                w.0.prepare_cached("UPDATE jobs SET plan = ?2, updated_ms = ?3 WHERE id = ?1")?
                    .execute(params![id, text, now_ms])?;
            Ok(n > 0)
        })
    }

    /// The job `id`.
    pub fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
            .query_row(params![id], job_row)
            .optional()?)
    }

    /// Forgets what DAG `dag`'s object triggers saw (the DAG was deleted: one applied again
    /// under its name looks afresh).
    pub fn forget_trigger_objects(&self, dag: &str) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM trigger_objects WHERE dag = ?1", params![dag])?;
        tx.execute("DELETE FROM trigger_baselines WHERE dag = ?1", params![dag])?;
        tx.commit()?;
        Ok(())
    }

    /// Whether DAG `dag`'s object trigger on `prefix` has looked at its prefix before.
    pub fn trigger_baseline(&self, dag: &str, prefix: &str) -> Result<bool, StoreError> {
        Ok(self
            .reader()
            .prepare_cached("SELECT 1 FROM trigger_baselines WHERE dag = ?1 AND prefix = ?2")?
            .query_row(params![dag, prefix], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Records the first look of DAG `dag`'s object trigger on `prefix`: the objects there now
    /// are not new (seen, no job), in one transaction.
    pub fn set_trigger_baseline(
        &self,
        dag: &str,
        prefix: &str,
        keys: &[String],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut seen = tx.prepare_cached(
                "INSERT OR IGNORE INTO trigger_objects (dag, prefix, key, job, seen_ms) \
                 VALUES (?1, ?2, ?3, NULL, ?4)",
            )?;
            for key in keys {
                seen.execute(params![dag, prefix, key, now_ms])?;
            }
        }
        tx.execute(
            "INSERT OR IGNORE INTO trigger_baselines (dag, prefix, created_ms) VALUES (?1, ?2, ?3)",
            params![dag, prefix, now_ms],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The objects DAG `dag`'s trigger on `prefix` has seen.
    pub fn trigger_objects_seen(
        &self,
        dag: &str,
        prefix: &str,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let conn = self.reader();
        let mut stmt =
            conn.prepare_cached("SELECT key FROM trigger_objects WHERE dag = ?1 AND prefix = ?2")?;
        let keys = stmt
            .query_map(params![dag, prefix], |r| r.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        Ok(keys)
    }

    /// Records that DAG `dag`'s trigger on `prefix` saw object `key`, and the job it started
    /// (none: the object could not start one).
    pub fn trigger_object_seen(
        &self,
        dag: &str,
        prefix: &str,
        key: &str,
        job: Option<&str>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO trigger_objects (dag, prefix, key, job, seen_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![dag, prefix, key, job, now_ms],
        )?;
        Ok(())
    }

    /// The job `dag`'s submission key `key` made, if one did.
    pub fn job_for_key(&self, dag: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached("SELECT job FROM job_keys WHERE dag = ?1 AND key = ?2")?
            .query_row(params![dag, key], |r| r.get(0))
            .optional()?)
    }

    /// The secrets in the store, by name: their sizes and when they were set, never their
    /// values.
    pub fn secrets(&self) -> Result<Vec<SecretInfo>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT name, length(CAST(value AS BLOB)), updated_ms FROM secrets ORDER BY name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(SecretInfo {
                name: r.get(0)?,
                bytes: r.get::<_, i64>(1)?.max(0) as u64,
                updated_ms: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The value of the secret `name`, if the store holds it.
    pub fn secret_value(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached("SELECT value FROM secrets WHERE name = ?1")?
            .query_row(params![name], |r| r.get(0))
            .optional()?)
    }

    /// The newest `limit` jobs, of one DAG or of all.
    pub fn list_jobs(&self, dag: Option<&str>, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        self.find_jobs(dag, None, limit)
    }

    /// The newest `limit` jobs, of one DAG or of all, in one status or in any.
    pub fn find_jobs(
        &self,
        dag: Option<&str>,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE (?1 IS NULL OR dag = ?1) \
             AND (?3 IS NULL OR status = ?3) \
             ORDER BY created_ms DESC, id DESC LIMIT ?2"
        ))?;
        let status = status.map(JobStatus::as_str);
        let rows = stmt.query_map(params![dag, limit, status], job_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records the execution a job is in. Returns whether the job exists.
    pub fn set_job_execution(
        &self,
        id: &str,
        execution: &ExecutionRecord,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (id, execution) = (id.to_owned(), execution.clone());
        self.write(move |w| w.set_job_execution(&id, &execution, now_ms))
    }

    /// The execution a job is in, as last recorded.
    pub fn job_execution(&self, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached("SELECT execution FROM jobs WHERE id = ?1")?
            .query_row(params![id], |r| opt_json_col(r, 0))
            .optional()?
            .flatten())
    }

    /// Jobs that ended before `before_ms`, the longest ended first, at most `limit`.
    pub fn jobs_ended_before(&self, before_ms: i64, limit: u32) -> Result<Vec<String>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM jobs WHERE status IN ('succeeded', 'failed') \
             AND COALESCE(finished_ms, updated_ms) < ?1 ORDER BY finished_ms LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![before_ms, limit], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Failed jobs that ended before `before_ms` and still hold what they kept for a retry
    /// (their execution), the longest ended first, at most `limit`.
    pub fn failed_jobs_kept(&self, before_ms: i64, limit: u32) -> Result<Vec<String>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM jobs WHERE status = 'failed' AND execution IS NOT NULL \
             AND COALESCE(finished_ms, updated_ms) < ?1 ORDER BY finished_ms LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![before_ms, limit], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records an instance sent (or sent again, or ended), replacing its earlier row.
    pub fn put_instance_run(&self, r: &InstanceRunRecord) -> Result<(), StoreError> {
        let r = r.clone();
        self.write(move |w| w.put_instance_run(&r))
    }

    /// The instances one execution of a job sent, by function and instance.
    pub fn instance_runs(
        &self,
        job: &str,
        execution: u32,
    ) -> Result<Vec<InstanceRunRecord>, StoreError> {
        instance_runs_on(&self.reader(), job, execution)
    }

    /// Forgets what a job's executions sent (once it ended); returns how many rows.
    pub fn delete_instance_runs(&self, job: &str) -> Result<usize, StoreError> {
        let job = job.to_owned();
        self.write(move |w| w.delete_instance_runs(&job))
    }

    // ---- samples ----

    /// What the learning code keeps in memory (`crate::learn::refit`): a `T` made at the first
    /// call. A database keeps one kind.
    pub fn derived<T: Derived + Default>(&self) -> &T {
        let kept = self.learned.get_or_init(|| Box::new(T::default()));
        let any: &dyn std::any::Any = &**kept;
        any.downcast_ref::<T>()
            .expect("a database keeps one kind of derived memory")
    }

    fn forget(&self, dag: &str, setting: &str) {
        if let Some(d) = self.learned.get() {
            d.forget(dag, setting);
        }
    }

    /// Records a job's measured parameters (replacing an earlier sample of the same job).
    pub fn put_sample(&self, s: &SampleRecord) -> Result<(), StoreError> {
        let measured = to_json(&s.measured, "sample")?;
        let input_bytes = u64_to_i64(s.input_bytes, "input_bytes")?;
        let conn = self.conn();
        // A replaced sample keeps its row (and its place): what the learning code read of it
        // is forgotten (rare: a job's sample is recorded once).
        if let Some(d) = self.learned.get()
            && conn
                .prepare_cached("SELECT 1 FROM samples WHERE job = ?1")?
                .exists(params![s.job])?
        {
            d.forget_all();
        }
        conn.prepare_cached("INSERT INTO samples (dag, job, input_bytes, measured, created_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (job) DO UPDATE SET dag = excluded.dag, input_bytes = excluded.input_bytes, \
               measured = excluded.measured, created_ms = excluded.created_ms")?.execute(params![s.dag, s.job, input_bytes, measured, s.created_ms])?;
        Ok(())
    }

    /// Deletes the samples of these jobs (retention: samples the models no longer keep); how
    /// many. What the learning code read is forgotten.
    pub fn delete_samples(&self, jobs: &[String]) -> Result<usize, StoreError> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut n = 0;
        {
            let mut stmt = tx.prepare_cached("DELETE FROM samples WHERE job = ?1")?;
            for j in jobs {
                n += stmt.execute(params![j])?;
            }
        }
        tx.commit()?;
        if let Some(d) = self.learned.get() {
            d.forget_all();
        }
        Ok(n)
    }

    /// A DAG's samples recorded after row `after` (0: all), oldest first, each with its row id.
    pub fn samples_after(
        &self,
        dag: &str,
        after: i64,
    ) -> Result<Vec<(i64, SampleRecord)>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SAMPLE_COLUMNS}, id FROM samples WHERE dag = ?1 AND id > ?2 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![dag, after], |r| Ok((r.get(5)?, sample_row(r)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A DAG's samples, oldest first.
    pub fn samples(&self, dag: &str) -> Result<Vec<SampleRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SAMPLE_COLUMNS} FROM samples WHERE dag = ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![dag], sample_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // ---- models ----

    /// Stores the fitted models of one setting of a DAG, replacing its previous fit.
    pub fn put_model(&self, m: &ModelRecord) -> Result<(), StoreError> {
        // The learning code puts back what it wrote (`crate::learn::refit`).
        self.forget(&m.dag, &m.setting);
        let models = to_json(&m.models, "models")?;
        let samples = u64_to_i64(m.samples, "samples")?;
        self.conn().prepare_cached("INSERT INTO models (dag, setting, models, converged, samples, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (dag, setting) DO UPDATE SET models = excluded.models, converged = excluded.converged, \
               samples = excluded.samples, updated_ms = excluded.updated_ms")?.execute(params![m.dag, m.setting, models, m.converged, samples, m.updated_ms])?;
        Ok(())
    }

    /// The models of one setting of `dag`, once fitted.
    pub fn get_model(&self, dag: &str, setting: &str) -> Result<Option<ModelRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached(&format!(
                "SELECT {MODEL_COLUMNS} FROM models WHERE dag = ?1 AND setting = ?2"
            ))?
            .query_row(params![dag, setting], model_row)
            .optional()?)
    }

    /// The models of every setting of `dag`, by setting key.
    pub fn models(&self, dag: &str) -> Result<Vec<ModelRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MODEL_COLUMNS} FROM models WHERE dag = ?1 ORDER BY setting"
        ))?;
        let rows = stmt.query_map(params![dag], model_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // ---- DAG modes ----

    /// Stores the mode of one setting of a DAG (`sonic_core::mode::DagMode` as JSON),
    /// replacing the previous one.
    pub fn put_dag_mode(
        &self,
        dag: &str,
        setting: &str,
        state: &serde_json::Value,
        updated_ms: i64,
    ) -> Result<(), StoreError> {
        self.forget(dag, setting);
        let state = to_json(state, "dag mode")?;
        self.conn().prepare_cached("INSERT INTO dag_modes (dag, setting, state, updated_ms) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (dag, setting) DO UPDATE SET state = excluded.state, updated_ms = excluded.updated_ms")?.execute(params![dag, setting, state, updated_ms])?;
        Ok(())
    }

    /// The recorded mode of one setting of a DAG, once a job of it finished.
    pub fn get_dag_mode(
        &self,
        dag: &str,
        setting: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached("SELECT state FROM dag_modes WHERE dag = ?1 AND setting = ?2")?
            .query_row(params![dag, setting], |r| json_col(r, 0))
            .optional()?)
    }

    // ---- instance logs ----

    /// Keeps one instance attempt's log (replacing the same attempt's earlier row).
    pub fn put_log(&self, job: &str, l: &InstanceLog, now_ms: i64) -> Result<(), StoreError> {
        let (job, l) = (job.to_owned(), l.clone());
        self.write(move |w| w.put_log(&job, &l, now_ms))
    }

    /// A job's instance logs (of one function, or all), by function, instance and attempt.
    pub fn logs(&self, job: &str, function: Option<&str>) -> Result<Vec<InstanceLog>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT function, instance, attempt, agent, log FROM instance_logs \
             WHERE job = ?1 AND (?2 IS NULL OR function = ?2) \
             ORDER BY function, instance, attempt",
        )?;
        let rows = stmt.query_map(params![job, function], |r| {
            Ok(InstanceLog {
                function: r.get(0)?,
                instance: r.get(1)?,
                attempt: r.get(2)?,
                agent: r.get(3)?,
                log: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // ---- files ----

    /// Records where a file is (replacing the row of the same `(job, file_id)`: a retried writer
    /// overwrites its own output).
    pub fn put_file(&self, f: &FileRecord) -> Result<(), StoreError> {
        let f = f.clone();
        self.write(move |w| w.put_file(&f))
    }

    /// The file `file_id` of `job`.
    pub fn get_file(&self, job: &str, file_id: &str) -> Result<Option<FileRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached(&format!(
                "SELECT {FILE_COLUMNS} FROM files WHERE job = ?1 AND file_id = ?2"
            ))?
            .query_row(params![job, file_id], file_row)
            .optional()?)
    }

    /// A job's files, by id.
    pub fn files(&self, job: &str) -> Result<Vec<FileRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {FILE_COLUMNS} FROM files WHERE job = ?1 ORDER BY file_id"
        ))?;
        let rows = stmt.query_map(params![job], file_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets a job's files (after its data was cleaned up); returns how many.
    pub fn delete_files(&self, job: &str) -> Result<usize, StoreError> {
        let job = job.to_owned();
        self.write(move |w| w.delete_files(&job))
    }

    // ---- agents ----

    /// Registers an agent, or re-registers it (a restarted agent) with its new capacity.
    pub fn register_agent(&self, c: &Capacity, now_ms: i64) -> Result<AgentRecord, StoreError> {
        let capacity = to_json(c, "capacity")?;
        let c = c.clone();
        let c2 = c.clone();
        self.write(move |w| {
            w.0.prepare_cached(
                "INSERT INTO agents (id, url, vm_type, capacity, registered_ms, last_heartbeat_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5) \
             ON CONFLICT (id) DO UPDATE SET url = excluded.url, vm_type = excluded.vm_type, \
               capacity = excluded.capacity, registered_ms = excluded.registered_ms, \
               last_heartbeat_ms = excluded.last_heartbeat_ms",
            )?
            .execute(params![c2.agent_id, c2.url, c2.vm_type, capacity, now_ms])?;
            Ok(())
        })?;
        Ok(AgentRecord {
            id: c.agent_id.clone(),
            url: c.url.clone(),
            vm_type: c.vm_type.clone(),
            capacity: c.clone(),
            registered_ms: now_ms,
            last_heartbeat_ms: now_ms,
        })
    }

    /// Records a heartbeat (and the running count and bandwidth it reports); `None` for an agent
    /// that is not registered.
    pub fn heartbeat(
        &self,
        beat: &Heartbeat,
        now_ms: i64,
    ) -> Result<Option<AgentRecord>, StoreError> {
        let beat = beat.clone();
        self.write(move |w| {
            let found =
                w.0.prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"))?
                    .query_row(params![beat.agent_id], agent_row)
                    .optional()?;
            let Some(mut agent) = found else {
                return Ok(None);
            };
            agent.capacity.running = beat.running;
            agent.capacity.bandwidth = beat.bandwidth;
            agent.last_heartbeat_ms = now_ms;
            w.0.prepare_cached(
                "UPDATE agents SET capacity = ?2, last_heartbeat_ms = ?3 WHERE id = ?1",
            )?
            .execute(params![
                agent.id,
                to_json(&agent.capacity, "capacity")?,
                now_ms
            ])?;
            Ok(Some(agent))
        })
    }

    /// The agent `id`.
    pub fn get_agent(&self, id: &str) -> Result<Option<AgentRecord>, StoreError> {
        Ok(self
            .reader()
            .prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"))?
            .query_row(params![id], agent_row)
            .optional()?)
    }

    /// Every agent, by id.
    pub fn list_agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt =
            conn.prepare_cached(&format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id"))?;
        let rows = stmt.query_map([], agent_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets an agent; returns whether it was registered.
    pub fn delete_agent(&self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn()
            .execute("DELETE FROM agents WHERE id = ?1", params![id])?;
        Ok(n > 0)
    }
}

/// The writing connection, in a transaction when it comes from [`Db::write`]: the writes that
/// must be recorded together (an instance's end, its files and its log) commit once. Statements
/// are prepared once per connection (SQLite's statement cache).
pub struct Writer<'a>(&'a Connection);

impl Writer<'_> {
    /// Runs `f` in a savepoint: its writes stay when it returns `Ok`, are rolled back when it
    /// returns an error or panics. The outer error: the savepoint itself failed.
    fn savepoint<T>(
        &self,
        f: impl FnOnce(&Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<Result<T, StoreError>, rusqlite::Error> {
        self.0
            .prepare_cached("SAVEPOINT sonic_write")?
            .execute([])?;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)))
            .unwrap_or_else(|_| Err(StoreError::Task("the write panicked".into())));
        if out.is_err() {
            self.0
                .prepare_cached("ROLLBACK TO sonic_write")?
                .execute([])?;
        }
        self.0.prepare_cached("RELEASE sonic_write")?.execute([])?;
        Ok(out)
    }

    /// Inserts `job` made by its DAG's submission key `key`, unless the key already made one:
    /// then nothing is written and that job's id comes back. In one transaction, so that two
    /// submissions with one key make one job.
    pub fn insert_keyed_job(
        &self,
        job: &JobRecord,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let existing: Option<String> = self
            .0
            .prepare_cached("SELECT job FROM job_keys WHERE dag = ?1 AND key = ?2")?
            .query_row(params![job.dag, key], |r| r.get(0))
            .optional()?;
        if existing.is_some() {
            return Ok(existing);
        }
        self.insert_job(job)?;
        self.0
            .prepare_cached(
                "INSERT INTO job_keys (dag, key, job, created_ms) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![job.dag, key, job.id, job.created_ms])?;
        Ok(None)
    }

    /// Sets the secret `name` to `value` (a new one, or a new value).
    pub fn put_secret(&self, name: &str, value: &str, now_ms: i64) -> Result<(), StoreError> {
        self.0
            .prepare_cached(
                "INSERT INTO secrets (name, value, updated_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_ms = excluded.updated_ms",
            )?
            .execute(params![name, value, now_ms])?;
        Ok(())
    }

    /// Deletes the secret `name`: whether the store held it.
    pub fn delete_secret(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .0
            .prepare_cached("DELETE FROM secrets WHERE name = ?1")?
            .execute(params![name])?
            > 0)
    }

    /// Adds a new job; [`StoreError::Conflict`] when the id is taken.
    pub fn insert_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let params_text = to_json(&job.params, "job params")?;
        let summary_text = job
            .summary
            .as_ref()
            .map(|s| to_json(s, "job summary"))
            .transpose()?;
        let input_bytes = u64_to_i64(job.input_bytes, "input_bytes")?;
        let plan_text = job
            .plan
            .as_ref()
            .map(|p| to_json(p, "job plan"))
            .transpose()?;
        let slo_text = job
            .slo
            .as_ref()
            .map(|s| to_json(s, "job slo"))
            .transpose()?;
        let dag_revision = job
            .dag_revision
            .map(|r| u64_to_i64(r, "dag_revision"))
            .transpose()?;
        self.0
            .prepare_cached(
                &format!("INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"))?
            .execute(params![
                    job.id,
                    job.dag,
                    job.status.as_str(),
                    job.policy.as_str(),
                    job.mode.as_str(),
                    input_bytes,
                    params_text,
                    summary_text,
                    job.error,
                    job.created_ms,
                    job.started_ms,
                    job.finished_ms,
                    job.updated_ms,
                    plan_text,
                    job.mode_reason,
                    slo_text,
                    dag_revision,
                    job.retried_ms,
                ])
            .map_err(|e| conflict(e, || format!("job {}", job.id)))?;
        Ok(())
    }

    /// Moves a job to `status`; the first move to `running` records the start, a move to a terminal
    /// status the end. Returns whether the job exists.
    pub fn set_job_status(
        &self,
        id: &str,
        status: JobStatus,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let n = self.0.prepare_cached("UPDATE jobs SET status = ?2, updated_ms = ?3, \
               started_ms = CASE WHEN ?2 = 'running' THEN COALESCE(started_ms, ?3) ELSE started_ms END, \
               finished_ms = CASE WHEN ?2 IN ('succeeded', 'failed') THEN ?3 ELSE finished_ms END \
             WHERE id = ?1")?.execute(params![id, status.as_str(), now_ms])?;
        Ok(n > 0)
    }

    /// Records the execution a job is in. Returns whether the job exists.
    pub fn set_job_execution(
        &self,
        id: &str,
        execution: &ExecutionRecord,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let text = to_json(execution, "job execution")?;
        let n = self
            .0
            .prepare_cached("UPDATE jobs SET execution = ?2, updated_ms = ?3 WHERE id = ?1")?
            .execute(params![id, text, now_ms])?;
        Ok(n > 0)
    }

    /// Records how a job ended. Returns whether the job exists.
    pub fn finish_job(
        &self,
        id: &str,
        status: JobStatus,
        summary: Option<&JobSummary>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid(format!(
                "{status} is not a final job status"
            )));
        }
        let summary_text = summary.map(|s| to_json(s, "job summary")).transpose()?;
        let n = self.0.prepare_cached(
            "UPDATE jobs SET status = ?2, summary = ?3, error = ?4, finished_ms = ?5, updated_ms = ?5 \
             WHERE id = ?1")?.execute(params![id, status.as_str(), summary_text, error, now_ms])?;
        Ok(n > 0)
    }

    /// Records an instance sent (or sent again, or ended), replacing its earlier row.
    pub fn put_instance_run(&self, r: &InstanceRunRecord) -> Result<(), StoreError> {
        let report = r
            .report
            .as_ref()
            .map(|x| to_json(x, "run report"))
            .transpose()?;
        self.0.prepare_cached(
            "INSERT INTO instance_runs (job, execution, function, instance, attempt, agent, report, \
               started_ms, ended_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (job, execution, function, instance) DO UPDATE SET \
               attempt = excluded.attempt, agent = excluded.agent, report = excluded.report, \
               started_ms = excluded.started_ms, ended_ms = excluded.ended_ms")?.execute(params![
                r.job,
                r.execution,
                r.function,
                r.instance,
                r.attempt,
                r.agent,
                report,
                r.started_ms,
                r.ended_ms
            ])?;
        Ok(())
    }

    /// Forgets what a job's executions sent (once it ended); returns how many rows.
    pub fn delete_instance_runs(&self, job: &str) -> Result<usize, StoreError> {
        Ok(self
            .0
            .prepare_cached("DELETE FROM instance_runs WHERE job = ?1")?
            .execute(params![job])?)
    }

    /// Queues failed job `id` again under its id (`ofctl retry`), in one transaction: its last
    /// execution's succeeded instances (not those on agents it lost) become the next
    /// execution's, to be restored rather than run; every other run it recorded is forgotten;
    /// its end, summary and error are cleared and `retried_ms` set. Only a failed job that still
    /// holds its execution is retried (the sweep of kept jobs takes it first, [`Writer::forget_kept`]).
    pub fn retry_job(&self, id: &str, now_ms: i64) -> Result<Retry, StoreError> {
        let row: Option<(String, Option<String>)> = self
            .0
            .prepare_cached("SELECT status, execution FROM jobs WHERE id = ?1")?
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((status, execution)) = row else {
            return Ok(Retry::NotFound);
        };
        let status: JobStatus = status
            .parse()
            .map_err(|e| StoreError::Invalid(format!("job {id}'s status: {e}")))?;
        if status != JobStatus::Failed {
            return Ok(Retry::NotFailed(status));
        }
        let Some(text) = execution else {
            return Ok(Retry::NothingKept);
        };
        let old: ExecutionRecord = serde_json::from_str(&text)
            .map_err(|e| StoreError::Invalid(format!("job {id}'s execution: {e}")))?;
        let number = old.number + 1;
        let mut reused = 0;
        for mut run in instance_runs_on(self.0, id, old.number)? {
            if run.report.is_none() || old.lost.contains(&run.agent) {
                continue;
            }
            run.execution = number;
            self.put_instance_run(&run)?;
            reused += 1;
        }
        self.0
            .prepare_cached("DELETE FROM instance_runs WHERE job = ?1 AND execution <> ?2")?
            .execute(params![id, number])?;
        let next = ExecutionRecord {
            number,
            before: old.number,
            lost: Vec::new(),
            ..old
        };
        self.set_job_execution(id, &next, now_ms)?;
        self.0
            .prepare_cached(
                "UPDATE jobs SET status = 'queued', summary = NULL, error = NULL, \
                   started_ms = NULL, finished_ms = NULL, retried_ms = ?2, updated_ms = ?2 \
                 WHERE id = ?1",
            )?
            .execute(params![id, now_ms])?;
        let job = self
            .0
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
            .query_row(params![id], job_row)?;
        Ok(Retry::Queued {
            job: Box::new(job),
            reused,
        })
    }

    /// Deletes ended job `id`'s rows in one transaction: the job, its logs, its instances'
    /// records and file records, the submission key that made it (the key can make a new job).
    /// The sample it taught the models stays (the models' memory); an object trigger that
    /// started it still counts the object as seen.
    pub fn delete_job(&self, id: &str) -> Result<DeleteJob, StoreError> {
        let job = self
            .0
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
            .query_row(params![id], job_row)
            .optional()?;
        let Some(job) = job else {
            return Ok(DeleteJob::NotFound);
        };
        if !job.status.is_terminal() {
            return Ok(DeleteJob::NotEnded(job.status));
        }
        for table in ["instance_logs", "instance_runs", "files", "job_keys"] {
            self.0
                .prepare_cached(&format!("DELETE FROM {table} WHERE job = ?1"))?
                .execute(params![id])?;
        }
        self.0
            .prepare_cached("UPDATE trigger_objects SET job = NULL WHERE job = ?1")?
            .execute(params![id])?;
        self.0
            .prepare_cached("DELETE FROM jobs WHERE id = ?1")?
            .execute(params![id])?;
        Ok(DeleteJob::Deleted(Box::new(job)))
    }

    /// Takes what failed job `id` kept for a retry (its execution and recorded runs): true when
    /// it held some and still failed (a retry did not take it first); the caller then deletes
    /// its files.
    pub fn forget_kept(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let n = self
            .0
            .prepare_cached(
                "UPDATE jobs SET execution = NULL, updated_ms = ?2 \
                 WHERE id = ?1 AND status = 'failed' AND execution IS NOT NULL",
            )?
            .execute(params![id, now_ms])?;
        if n > 0 {
            self.delete_instance_runs(id)?;
        }
        Ok(n > 0)
    }

    /// Keeps one instance attempt's log (replacing the same attempt's earlier row).
    pub fn put_log(&self, job: &str, l: &InstanceLog, now_ms: i64) -> Result<(), StoreError> {
        self.0.prepare_cached(
            "INSERT INTO instance_logs (job, function, instance, attempt, agent, log, created_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (job, function, instance, attempt) DO UPDATE SET agent = excluded.agent, \
               log = excluded.log, created_ms = excluded.created_ms")?.execute(params![
                job, l.function, l.instance, l.attempt, l.agent, l.log, now_ms
            ])?;
        Ok(())
    }

    /// Records where a file is (replacing the row of the same `(job, file_id)`: a retried writer
    /// overwrites its own output).
    pub fn put_file(&self, f: &FileRecord) -> Result<(), StoreError> {
        if f.local.is_none() && f.object_key.is_none() {
            return Err(StoreError::Invalid(format!(
                "file {} of job {} has no location",
                f.file_id, f.job
            )));
        }
        let size = u64_to_i64(f.size, "size")?;
        let (agent, path) = match &f.local {
            Some(l) => (Some(l.agent.as_str()), Some(l.path.as_str())),
            None => (None, None),
        };
        self.0.prepare_cached(
            &format!(
                "INSERT INTO files ({FILE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                 ON CONFLICT (job, file_id) DO UPDATE SET agent = excluded.agent, path = excluded.path, \
                   object_key = excluded.object_key, size = excluded.size, checksum = excluded.checksum, \
                   created_ms = excluded.created_ms"
            ))?.execute(params![f.job, f.file_id, agent, path, f.object_key, size, f.checksum, f.created_ms])?;
        Ok(())
    }

    /// Forgets a job's files (after its data was cleaned up); returns how many.
    pub fn delete_files(&self, job: &str) -> Result<usize, StoreError> {
        Ok(self
            .0
            .prepare_cached("DELETE FROM files WHERE job = ?1")?
            .execute(params![job])?)
    }
}

/// Applies the migrations the file has not seen, in one transaction.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    // IMMEDIATE: two processes opening a new file at once do not both migrate it.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL) STRICT",
    )?;
    let found: Option<i64> = tx
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .optional()?;
    let supported = schema_version();
    let current = found.unwrap_or(0);
    if current > supported {
        return Err(StoreError::SchemaTooNew {
            found: current,
            supported,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        tx.execute_batch(sql)?;
        tracing::info!(version = i + 1, "applied schema migration");
    }
    if found.is_none() {
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            params![supported],
        )?;
    } else if current < supported {
        tx.execute("UPDATE schema_version SET version = ?1", params![supported])?;
    }
    tx.commit()?;
    Ok(())
}

/// An agent a job may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSlot {
    /// The agent's id.
    pub id: String,
    /// Where the control plane and peers reach it.
    pub url: String,
    /// The catalog's VM type it stands for.
    pub vm_type: String,
    /// The vCPUs it registered (it refuses a run given more CPUs); `None`: the type's.
    pub vcpus: Option<u32>,
}

impl From<AgentRecord> for AgentSlot {
    /// Where a registered agent is reached and what it stands for.
    fn from(a: AgentRecord) -> AgentSlot {
        AgentSlot {
            id: a.id,
            url: a.url,
            vcpus: Some(a.capacity.vcpus),
            vm_type: a.vm_type,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sonic_api::agent::BandwidthReport;
    use sonic_api::control::EdgeRun;

    fn capacity(id: &str) -> Capacity {
        Capacity {
            agent_id: id.into(),
            url: format!("http://127.0.0.1:9000/{id}"),
            vm_type: "m5.large".into(),
            vcpus: 2,
            memory_mb: 8192,
            network_mbps: Some(750.0),
            sandbox: "process".into(),
            running: 0,
            bandwidth: BandwidthReport::default(),
        }
    }

    fn job(id: &str, dag: &str, created_ms: i64) -> JobRecord {
        let mut params = serde_json::Map::new();
        params.insert("trees".into(), json!(6));
        JobRecord {
            dag_revision: None,
            retried_ms: None,
            id: id.into(),
            dag: dag.into(),
            status: JobStatus::Queued,
            policy: Policy::Remote,
            mode: JobMode::Profiling,
            input_bytes: 200_000_000,
            params,
            summary: None,
            error: None,
            created_ms,
            started_ms: None,
            finished_ms: None,
            updated_ms: created_ms,
            plan: None,
            mode_reason: None,
            slo: None,
        }
    }

    fn summary(id: &str) -> JobSummary {
        JobSummary {
            failed_attempts: Vec::new(),
            on_failure: None,
            dag_revision: None,
            bounds_missed: Vec::new(),
            job_id: id.into(),
            dag: "ml".into(),
            status: JobStatus::Succeeded,
            policy: Policy::Remote,
            mode: JobMode::Profiling,
            input_bytes: 200_000_000,
            latency_s: 31.2,
            cost_usd: 0.0013,
            storage_usd: 0.0,
            requests_usd: 0.0,
            perf_per_dollar: 24_600.0,
            edges: vec![EdgeRun {
                from: "pca".into(),
                to: "train".into(),
                method: sonic_core::model::Method::Remote,
                bytes: 4_800_000_000,
                seconds: 2.1,
            }],
            functions: vec![],
            fetches: vec![],
            outputs: vec!["s3://sonic/jobs/j-1/result/model.json".into()],
            error: None,
            failure: None,
            plan: None,
            mode_reason: None,
            slo: None,
            submitted_ms: None,
            started_ms: None,
            ended_ms: None,
        }
    }

    /// Writes one row of every kind.
    fn fill(db: &Db) {
        db.put_dag("ml", "name: ml\n", &json!({"name": "ml"}), 10)
            .expect("dag");
        let slo = sonic_core::slo::Slo::new(95.0, 20.0)
            .expect("slo")
            .best_effort(true);
        db.insert_job(&JobRecord {
            slo: Some(slo),
            ..job("j-1", "ml", 20)
        })
        .expect("job");
        db.set_job_status("j-1", JobStatus::Running, 30)
            .expect("running");
        db.finish_job("j-1", JobStatus::Succeeded, Some(&summary("j-1")), None, 40)
            .expect("finish");
        db.put_sample(&SampleRecord {
            dag: "ml".into(),
            job: "j-1".into(),
            input_bytes: 200_000_000,
            measured: json!({"functions": {"pca": {"memory_mb": 3000}}}),
            created_ms: 41,
        })
        .expect("sample");
        db.put_model(&ModelRecord {
            dag: "ml".into(),
            setting: r#"{"trees":6}"#.into(),
            models: json!({"pca": {"degree": 1, "coefficients": [1.0, 2.0]}}),
            converged: true,
            samples: 1,
            updated_ms: 42,
        })
        .expect("model");
        db.put_file(&FileRecord {
            job: "j-1".into(),
            file_id: "pca/0/train/part-0".into(),
            local: Some(LocalCopy {
                agent: "a-1".into(),
                path: "pca/0/train/part-0".into(),
            }),
            object_key: Some("jobs/j-1/pca/0/train/part-0".into()),
            size: 1234,
            checksum: "00ff".into(),
            created_ms: 43,
        })
        .expect("file");
        db.register_agent(&capacity("a-1"), 50).expect("agent");
    }

    #[test]
    fn restart_loses_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        fill(&db);
        drop(db);

        let db = Db::open_dir(dir.path()).expect("reopen");
        assert_eq!(db.version().expect("version"), schema_version());
        let dag = db.get_dag("ml").expect("get").expect("dag kept");
        assert_eq!(
            (dag.yaml.as_str(), dag.revision, dag.created_ms),
            ("name: ml\n", 1, 10)
        );
        let j = db.get_job("j-1").expect("get").expect("job kept");
        assert_eq!(j.status, JobStatus::Succeeded);
        assert_eq!((j.started_ms, j.finished_ms), (Some(30), Some(40)));
        assert_eq!(j.params.get("trees"), Some(&json!(6)));
        assert_eq!(j.summary, Some(summary("j-1")));
        assert_eq!(
            j.slo,
            Some(
                sonic_core::slo::Slo::new(95.0, 20.0)
                    .expect("slo")
                    .best_effort(true)
            )
        );
        let samples = db.samples("ml").expect("samples");
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].measured["functions"]["pca"]["memory_mb"], 3000);
        let m = db
            .get_model("ml", r#"{"trees":6}"#)
            .expect("get")
            .expect("model kept");
        assert!(m.converged);
        assert_eq!(m.models["pca"]["degree"], 1);
        let files = db.files("j-1").expect("files");
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].size, 1234);
        assert_eq!(
            files[0].local.as_ref().map(|l| l.agent.as_str()),
            Some("a-1")
        );
        let agents = db.list_agents().expect("agents");
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].capacity, capacity("a-1"));
    }

    #[test]
    fn concurrent_writers_all_get_their_results_and_a_reopen_keeps_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let db = db.clone();
                std::thread::spawn(move || {
                    for i in 0..40 {
                        let id = format!("j-{t}-{i}");
                        if i % 2 == 0 {
                            db.insert_job(&job(&id, "ml", i)).expect("insert");
                        } else {
                            // The async path, from a thread of its own.
                            let stored = job(&id, "ml", i);
                            futures::executor::block_on(db.commit(move |w| w.insert_job(&stored)))
                                .expect("commit");
                        }
                        // Each writer sees its own result: the row is there once it is answered.
                        let found = db.set_job_status(&id, JobStatus::Running, 100 + i);
                        assert!(found.expect("status"), "{id}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer thread");
        }
        let stats = db.write_stats();
        assert_eq!(stats.writes, 8 * 40 * 2);
        assert!(stats.batches >= 1 && stats.batches <= stats.writes);
        assert!(stats.largest >= 1 && stats.largest <= MAX_BATCH as u64);
        drop(db);

        let db = Db::open_dir(dir.path()).expect("reopen");
        let jobs = db.list_jobs(None, 1000).expect("list");
        assert_eq!(jobs.len(), 8 * 40);
        assert!(jobs.iter().all(|j| j.status == JobStatus::Running));
        assert_eq!(
            db.get_job("j-7-39")
                .expect("get")
                .and_then(|j| j.started_ms),
            Some(139)
        );
    }

    #[test]
    fn a_failing_write_in_a_batch_leaves_the_others_committed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        db.insert_job(&job("j-0", "ml", 0)).expect("insert");
        let before = db.write_stats();
        // The writer's connection is held (as during another batch): every write below queues,
        // and the writer takes them all at once when it is let go.
        let busy = db.conn();
        let (a, dup, partial, panics, c) = (
            job("j-a", "ml", 1),
            job("j-0", "ml", 2),
            job("j-b", "ml", 3),
            job("j-p", "ml", 4),
            job("j-c", "ml", 5),
        );
        let a = db.commit(move |w| w.insert_job(&a));
        let dup = db.commit(move |w| w.insert_job(&dup));
        let partial = db.commit(move |w| {
            w.insert_job(&partial)?;
            w.put_log(
                "j-b",
                &InstanceLog {
                    function: "f".into(),
                    instance: 0,
                    attempt: 1,
                    agent: "a-1".into(),
                    log: "half".into(),
                },
                3,
            )?;
            Err::<(), _>(StoreError::Invalid("refused after two writes".into()))
        });
        let panics = db.commit(move |w| -> Result<(), StoreError> {
            w.insert_job(&panics)?;
            panic!("a write that panics");
        });
        let c = db.commit(move |w| w.insert_job(&c));
        drop(busy);
        let (a, dup, partial, panics, c) = futures::executor::block_on(async {
            (a.await, dup.await, partial.await, panics.await, c.await)
        });
        a.expect("the write before the failures committed");
        c.expect("the write after the failures committed");
        assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");
        assert!(
            matches!(partial, Err(StoreError::Invalid(_))),
            "{partial:?}"
        );
        assert!(matches!(panics, Err(StoreError::Task(_))), "{panics:?}");
        let after = db.write_stats();
        assert_eq!(after.writes - before.writes, 5);
        assert_eq!(
            after.batches - before.batches,
            1,
            "the five writes were one batch"
        );
        drop(db);

        let db = Db::open_dir(dir.path()).expect("reopen");
        let mut ids: Vec<String> = db
            .list_jobs(None, 100)
            .expect("list")
            .into_iter()
            .map(|j| j.id)
            .collect();
        ids.sort();
        // The failed writes left nothing: not their first rows, not the log.
        assert_eq!(ids, ["j-0", "j-a", "j-c"]);
        assert_eq!(
            db.get_job("j-0").expect("get").map(|j| j.created_ms),
            Some(0)
        );
        assert!(db.logs("j-b", None).expect("logs").is_empty());
        // The writer goes on after a panic.
        db.insert_job(&job("j-d", "ml", 6)).expect("insert after");
    }

    #[test]
    fn file_is_in_wal_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        let mode: String = db
            .conn()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("pragma");
        assert_eq!(mode, "wal");
        // NORMAL (1): commits survive the process; the WAL is synced at checkpoints.
        let sync: i64 = db
            .conn()
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("pragma");
        assert_eq!(sync, 1);
    }

    #[test]
    fn reads_do_not_wait_for_the_writer_and_see_its_last_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        for i in 0..2 * READERS {
            let id = format!("j-{i}");
            db.insert_job(&job(&id, "ml", i as i64)).expect("insert");
            // Every reader in turn sees what the writer committed just before.
            assert_eq!(db.get_job(&id).expect("get").map(|j| j.id), Some(id));
        }
        // The writer is busy (its lock held, as during a commit): a read still answers.
        let writing = db.conn();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = db.clone();
        std::thread::spawn(move || {
            let _ = tx.send(reader.get_job("j-0").map(|j| j.map(|j| j.status)));
        });
        let read = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a read waited for the writer");
        assert_eq!(read.expect("read"), Some(JobStatus::Queued));
        drop(writing);
        // The readers cannot write.
        assert!(db.reader().execute("DELETE FROM jobs", []).is_err());
        assert_eq!(db.list_jobs(None, 100).expect("list").len(), 2 * READERS);
    }

    #[test]
    fn reopening_does_not_migrate_again_and_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(DB_FILE);
        let db = Db::open(&path).expect("open");
        db.put_dag("a", "x", &json!({}), 1).expect("dag");
        drop(db);
        // A second open must not re-run migration 1 (it would fail: the tables exist).
        let db = Db::open(&path).expect("reopen");
        assert_eq!(db.count_dags().expect("count"), 1);
        db.conn()
            .execute("UPDATE schema_version SET version = 99", [])
            .expect("bump");
        drop(db);
        match Db::open(&path) {
            Err(StoreError::SchemaTooNew {
                found: 99,
                supported,
            }) => {
                assert_eq!(supported, schema_version())
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
    }

    #[test]
    fn apply_counts_revisions() {
        let db = Db::open_in_memory().expect("open");
        let (a, r) = db.put_dag("d", "one", &json!({}), 1).expect("put");
        assert_eq!((a, r.revision), (Applied::Created, 1));
        let (a, r) = db.put_dag("d", "one", &json!({}), 2).expect("put");
        assert_eq!((a, r.revision, r.updated_ms), (Applied::Unchanged, 1, 1));
        let (a, r) = db.put_dag("d", "two", &json!({"v": 2}), 3).expect("put");
        assert_eq!(
            (a, r.revision, r.created_ms, r.updated_ms),
            (Applied::Updated, 2, 1, 3)
        );
        assert_eq!(r.parsed["v"], 2);
        assert!(db.delete_dag("d").expect("delete"));
        assert!(!db.delete_dag("d").expect("delete again"));
        assert!(db.get_dag("d").expect("get").is_none());
        // Every revision's file stays (jobs ran them); applied again, the DAG goes on from its
        // last number, so that a number always names one file.
        assert_eq!(db.dag_revisions("d").expect("revisions"), [1, 2]);
        let one = db.get_dag_revision("d", 1).expect("get").expect("kept");
        assert_eq!((one.yaml.as_str(), one.revision), ("one", 1));
        let (a, r) = db.put_dag("d", "three", &json!({}), 4).expect("put");
        assert_eq!((a, r.revision), (Applied::Created, 3));
        assert_eq!(db.dag_revisions("d").expect("revisions"), [1, 2, 3]);
        assert!(db.get_dag_revision("d", 4).expect("get").is_none());
        assert!(db.get_dag_revision("other", 1).expect("get").is_none());
    }

    #[test]
    fn a_revision_is_loaded_as_it_was_applied() {
        let db = Db::open_in_memory().expect("open");
        put(&db, "d", "first");
        put(&db, "d", "second");
        let at = |r: Option<u64>| {
            db.load_dag_at("d", r)
                .expect("load")
                .map(|p| (p.revision, p.dag.functions[0].name.clone()))
        };
        assert_eq!(at(None), Some((2, "second".into())));
        assert_eq!(at(Some(1)), Some((1, "first".into())));
        // Kept parsed under its own entry, beside the DAG as it is now.
        assert_eq!(at(Some(1)), Some((1, "first".into())));
        assert_eq!(at(Some(2)), Some((2, "second".into())));
        assert_eq!(at(Some(3)), None);
        assert_eq!(at(None), Some((2, "second".into())));
    }

    /// A DAG file and its parsed form, as `PUT /v1/dags` stores them.
    fn dag_file(name: &str, function: &str) -> (String, serde_json::Value) {
        let yaml = format!(
            "name: {name}\nfunctions:\n  - {{ name: {function}, image: x, command: [noop] }}\n"
        );
        let dag = sonic_core::dag::Dag::from_yaml("test", &yaml).expect("valid dag");
        (yaml, serde_json::to_value(&dag).expect("json"))
    }

    fn put(db: &Db, name: &str, function: &str) -> Applied {
        let (yaml, parsed) = dag_file(name, function);
        db.put_dag(name, &yaml, &parsed, 1).expect("put").0
    }

    fn function_of(db: &Db, name: &str) -> Option<(u64, String)> {
        db.load_dag(name)
            .expect("load")
            .map(|p| (p.revision, p.dag.functions[0].name.clone()))
    }

    #[test]
    fn parsed_dags_follow_applies_and_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (what, db) in [
            ("memory", Db::open_in_memory().expect("open")),
            ("file", Db::open_dir(dir.path()).expect("open")),
        ] {
            assert!(db.load_dag("d").expect("load").is_none(), "{what}");
            assert_eq!(put(&db, "d", "first"), Applied::Created);
            let one = db.load_dag("d").expect("load").expect("dag");
            assert_eq!(
                (one.revision, one.dag.functions[0].name.as_str()),
                (1, "first")
            );
            // Kept: the same parse is answered again.
            let again = db.load_dag("d").expect("load").expect("dag");
            assert!(Arc::ptr_eq(&one, &again), "{what}: parsed once");
            assert_eq!(db.cached_dags(), 1);
            // The same file again changes nothing, and keeps the parse.
            assert_eq!(put(&db, "d", "first"), Applied::Unchanged);
            let same = db.load_dag("d").expect("load").expect("dag");
            assert!(Arc::ptr_eq(&one, &same), "{what}");
            // Re-applied: the next lookup sees the new revision.
            assert_eq!(put(&db, "d", "second"), Applied::Updated);
            assert_eq!(function_of(&db, "d"), Some((2, "second".into())), "{what}");
            // Deleted: gone, though it was kept.
            assert!(db.delete_dag("d").expect("delete"));
            assert_eq!(function_of(&db, "d"), None, "{what}");
            assert_eq!(db.cached_dags(), 0);
            // Applied again under the same name: a new DAG, numbered on from the old one's
            // revisions (each number names one file for good).
            assert_eq!(put(&db, "d", "third"), Applied::Created);
            assert_eq!(function_of(&db, "d"), Some((3, "third".into())), "{what}");
        }
    }

    #[test]
    fn a_lookup_that_read_before_a_change_keeps_nothing() {
        let db = Db::open_in_memory().expect("open");
        put(&db, "d", "old");
        // A lookup reads the row, then an apply (or a delete) commits before it keeps the parse.
        let generation = db.dags.generation();
        let stale = db.get_dag("d").expect("get").expect("row");
        put(&db, "d", "new");
        let stale = Arc::new(ParsedDag {
            revision: stale.revision,
            dag: stale.dag().expect("decodes"),
        });
        db.dags.fill("d", generation, stale.clone());
        assert_eq!(db.cached_dags(), 0, "a stale read is not kept");
        assert_eq!(function_of(&db, "d"), Some((2, "new".into())));
        let generation = db.dags.generation();
        assert!(db.delete_dag("d").expect("delete"));
        db.dags.fill("d", generation, stale);
        assert_eq!(
            function_of(&db, "d"),
            None,
            "a deleted DAG is not brought back"
        );
    }

    #[test]
    fn parsed_dags_are_bounded_and_the_least_recently_used_goes() {
        let db = Db::open_in_memory().expect("open");
        let names: Vec<String> = (0..=CACHED_DAGS).map(|i| format!("d{i}")).collect();
        for n in &names[..CACHED_DAGS] {
            put(&db, n, "f");
            db.load_dag(n).expect("load").expect("dag");
        }
        assert_eq!(db.cached_dags(), CACHED_DAGS);
        // d0 used again: d1 is now the least recently used.
        let d0 = db.load_dag("d0").expect("load").expect("dag");
        let last = &names[CACHED_DAGS];
        put(&db, last, "f");
        db.load_dag(last).expect("load").expect("dag");
        assert_eq!(db.cached_dags(), CACHED_DAGS, "never more than CACHED_DAGS");
        let state = db.dags.read();
        assert!(state.dags.contains_key("d0") && state.dags.contains_key(last.as_str()));
        assert!(
            !state.dags.contains_key("d1"),
            "the least recently used went"
        );
        drop(state);
        // Dropped from memory, not from the table: read again when named.
        assert_eq!(function_of(&db, "d1"), Some((1, "f".into())));
        assert!(Arc::ptr_eq(
            &d0,
            &db.load_dag("d0").expect("load").expect("dag")
        ));
    }

    #[test]
    fn jobs_move_through_their_states() {
        let db = Db::open_in_memory().expect("open");
        db.insert_job(&job("j-1", "a", 1)).expect("insert");
        db.insert_job(&job("j-2", "b", 2)).expect("insert");
        db.insert_job(&job("j-3", "a", 3)).expect("insert");
        assert!(matches!(
            db.insert_job(&job("j-1", "a", 4)),
            Err(StoreError::Conflict(_))
        ));
        assert!(
            db.set_job_status("j-1", JobStatus::Running, 10)
                .expect("run")
        );
        // A second `running` (a retry) keeps the first start.
        assert!(
            db.set_job_status("j-1", JobStatus::Running, 11)
                .expect("run")
        );
        assert!(
            db.finish_job(
                "j-1",
                JobStatus::Failed,
                None,
                Some("lambda train exited 1"),
                20
            )
            .expect("finish")
        );
        let j = db.get_job("j-1").expect("get").expect("exists");
        assert_eq!(
            (j.status, j.started_ms, j.finished_ms),
            (JobStatus::Failed, Some(10), Some(20))
        );
        assert_eq!(j.error.as_deref(), Some("lambda train exited 1"));
        assert!(
            !db.set_job_status("nope", JobStatus::Running, 1)
                .expect("missing")
        );
        assert!(matches!(
            db.finish_job("j-2", JobStatus::Running, None, None, 1),
            Err(StoreError::Invalid(_))
        ));
        let ids = |v: Vec<JobRecord>| v.into_iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(
            ids(db.list_jobs(Some("a"), 10).expect("list")),
            ["j-3", "j-1"]
        );
        assert_eq!(ids(db.list_jobs(None, 2).expect("list")), ["j-3", "j-2"]);
        let mut big = job("j-4", "a", 5);
        big.input_bytes = u64::MAX;
        assert!(matches!(db.insert_job(&big), Err(StoreError::Invalid(_))));
    }

    #[test]
    fn samples_models_and_files_replace_by_key() {
        let db = Db::open_in_memory().expect("open");
        let sample = |job: &str, bytes: u64| SampleRecord {
            dag: "d".into(),
            job: job.into(),
            input_bytes: bytes,
            measured: json!({"bytes": bytes}),
            created_ms: 1,
        };
        db.put_sample(&sample("j-1", 10)).expect("put");
        db.put_sample(&sample("j-2", 20)).expect("put");
        db.put_sample(&sample("j-1", 30)).expect("replace");
        let s = db.samples("d").expect("samples");
        assert_eq!(
            s.iter().map(|s| s.input_bytes).collect::<Vec<_>>(),
            [30, 20]
        );
        assert!(db.samples("other").expect("none").is_empty());

        assert!(db.get_model("d", "").expect("get").is_none());
        let model = |converged: bool, samples: u64| ModelRecord {
            dag: "d".into(),
            setting: String::new(),
            models: json!({}),
            converged,
            samples,
            updated_ms: 1,
        };
        db.put_model(&model(false, 2)).expect("put");
        db.put_model(&model(true, 5)).expect("refit");
        let m = db.get_model("d", "").expect("get").expect("exists");
        assert_eq!((m.converged, m.samples), (true, 5));
        // Another setting of the same DAG is another row.
        db.put_model(&ModelRecord {
            setting: r#"{"trees":1}"#.into(),
            ..model(false, 1)
        })
        .expect("another setting");
        assert_eq!(
            db.get_model("d", "").expect("get").expect("kept").samples,
            5
        );
        let all = db.models("d").expect("models");
        assert_eq!(
            all.iter().map(|m| m.setting.as_str()).collect::<Vec<_>>(),
            ["", r#"{"trees":1}"#]
        );
        db.put_dag_mode("d", "", &json!({"mode": "planned"}), 1)
            .expect("mode");
        db.put_dag_mode("d", r#"{"trees":1}"#, &json!({"mode": "profiling"}), 1)
            .expect("mode of another setting");
        assert_eq!(
            db.get_dag_mode("d", "").expect("get"),
            Some(json!({"mode": "planned"}))
        );

        let file = |key: Option<&str>, local: bool| FileRecord {
            job: "j-1".into(),
            file_id: "f".into(),
            local: local.then(|| LocalCopy {
                agent: "a-1".into(),
                path: "p".into(),
            }),
            object_key: key.map(str::to_owned),
            size: 5,
            checksum: "c".into(),
            created_ms: 1,
        };
        assert!(matches!(
            db.put_file(&file(None, false)),
            Err(StoreError::Invalid(_))
        ));
        db.put_file(&file(None, true)).expect("local");
        db.put_file(&file(Some("k"), false))
            .expect("now remote only");
        let f = db.get_file("j-1", "f").expect("get").expect("exists");
        assert_eq!((f.local, f.object_key.as_deref()), (None, Some("k")));
        assert_eq!(db.delete_files("j-1").expect("delete"), 1);
        assert!(db.files("j-1").expect("files").is_empty());
    }

    #[test]
    fn heartbeats_update_the_agent_and_miss_unknown_ones() {
        let db = Db::open_in_memory().expect("open");
        db.register_agent(&capacity("a-1"), 100).expect("register");
        let beat = Heartbeat {
            agent_id: "a-1".into(),
            running: 3,
            bandwidth: BandwidthReport {
                egress_bps: Some(1e6),
                ingress_bps: None,
                samples: 4,
            },
        };
        let a = db.heartbeat(&beat, 200).expect("beat").expect("known");
        assert_eq!(
            (a.last_heartbeat_ms, a.registered_ms, a.capacity.running),
            (200, 100, 3)
        );
        let stored = db.get_agent("a-1").expect("get").expect("exists");
        assert_eq!(stored, a);
        let unknown = Heartbeat {
            agent_id: "ghost".into(),
            ..beat
        };
        assert!(db.heartbeat(&unknown, 300).expect("beat").is_none());
        assert!(stored.alive(1_200, Duration::from_secs(1)));
        assert!(!stored.alive(1_201, Duration::from_secs(1)));
        assert!(db.delete_agent("a-1").expect("delete"));
        assert!(db.list_agents().expect("list").is_empty());
    }

    #[test]
    fn sql_metacharacters_are_stored_verbatim() {
        let db = Db::open_in_memory().expect("open");
        let evil = "x'); DROP TABLE dags; --";
        db.put_dag(evil, evil, &json!({"description": evil}), 1)
            .expect("put");
        let d = db
            .get_dag(evil)
            .expect("get")
            .expect("stored under the literal name");
        assert_eq!((d.name.as_str(), d.yaml.as_str()), (evil, evil));
        assert_eq!(db.count_dags().expect("table still there"), 1);
    }

    #[test]
    fn a_version_4_databases_models_and_mode_load_as_the_empty_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(DB_FILE);
        {
            // What a build of schema version 4 wrote: models and a mode keyed by the DAG alone.
            let conn = Connection::open(&path).expect("open");
            for sql in &MIGRATIONS[..4] {
                conn.execute_batch(sql).expect("v4 schema");
            }
            conn.execute_batch(
                "CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT; \
                 INSERT INTO schema_version (version) VALUES (4); \
                 INSERT INTO models (dag, models, converged, samples, updated_ms) \
                   VALUES ('ml', '{\"jobs\":5}', 1, 5, 7); \
                 INSERT INTO dag_modes (dag, state, updated_ms) VALUES ('ml', '{\"mode\":\"planned\"}', 8);",
            )
            .expect("v4 rows");
        }
        let db = Db::open(&path).expect("migrate");
        assert_eq!(db.version().expect("version"), schema_version());
        let m = db.get_model("ml", "").expect("get").expect("kept");
        assert_eq!((m.converged, m.samples, m.updated_ms), (true, 5, 7));
        assert_eq!(m.models, json!({"jobs": 5}));
        assert_eq!(
            db.get_dag_mode("ml", "").expect("get"),
            Some(json!({"mode": "planned"}))
        );
        assert!(db.get_model("ml", r#"{"trees":6}"#).expect("get").is_none());
    }

    #[test]
    fn a_version_1_database_is_migrated_and_keeps_its_jobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(DB_FILE);
        {
            // What a build of schema version 1 wrote.
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(MIGRATIONS[0]).expect("v1 schema");
            conn.execute_batch(
                "CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT; \
                 INSERT INTO schema_version (version) VALUES (1); \
                 INSERT INTO jobs (id, dag, status, policy, mode, input_bytes, params, summary, \
                   error, created_ms, started_ms, finished_ms, updated_ms) \
                 VALUES ('j-old', 'ml', 'succeeded', 'remote', 'profiling', 5, '{}', NULL, NULL, \
                   1, 2, 3, 3);",
            )
            .expect("v1 rows");
        }
        let db = Db::open(&path).expect("migrate");
        assert_eq!(db.version().expect("version"), schema_version());
        let old = db.get_job("j-old").expect("get").expect("kept");
        assert_eq!(
            (old.status, old.input_bytes, old.plan),
            (JobStatus::Succeeded, 5, None)
        );
        assert!(
            db.logs("j-old", None)
                .expect("logs table exists")
                .is_empty()
        );
    }

    #[test]
    fn plans_and_logs_are_kept_per_job() {
        let db = Db::open_in_memory().expect("open");
        db.insert_job(&job("j-1", "ml", 1)).expect("insert");
        let plan = JobPlan {
            used: sonic_api::control::PlanUsed::SecondBest,
            notes: vec!["vm-storage refused".into()],
            report: Some(
                serde_json::from_value(json!({
                    "dag": "ml", "policy": "sonic", "stages": [], "edges": [],
                    "predicted": {"latency_s": 1.0, "cost_usd": 0.001, "perf_per_dollar": 1000.0},
                }))
                .expect("a plan report"),
            ),
            stages: vec![],
            exact: None,
        };
        assert!(db.set_job_plan("j-1", &plan, 2).expect("plan"));
        assert!(!db.set_job_plan("j-9", &plan, 2).expect("no such job"));
        assert_eq!(
            db.get_job("j-1").expect("get").expect("job").plan,
            Some(plan)
        );
        let log = |function: &str, instance: u32, attempt: u32, text: &str| InstanceLog {
            function: function.into(),
            instance,
            attempt,
            agent: "a-1".into(),
            log: text.into(),
        };
        db.put_log("j-1", &log("train", 1, 1, "boom"), 3)
            .expect("log");
        db.put_log("j-1", &log("train", 0, 1, "ok"), 3)
            .expect("log");
        db.put_log("j-1", &log("pca", 0, 1, "pca"), 3).expect("log");
        db.put_log("j-1", &log("train", 1, 2, "ok again"), 4)
            .expect("log");
        db.put_log("j-1", &log("train", 1, 2, "ok again, replaced"), 5)
            .expect("same attempt replaces");
        db.put_log("j-2", &log("train", 0, 1, "other job"), 3)
            .expect("log");
        let all = db.logs("j-1", None).expect("logs");
        let keys: Vec<(&str, u32, u32)> = all
            .iter()
            .map(|l| (l.function.as_str(), l.instance, l.attempt))
            .collect();
        assert_eq!(
            keys,
            [
                ("pca", 0, 1),
                ("train", 0, 1),
                ("train", 1, 1),
                ("train", 1, 2)
            ]
        );
        assert_eq!(all[3].log, "ok again, replaced");
        assert_eq!(db.logs("j-1", Some("pca")).expect("logs").len(), 1);
        assert!(db.logs("j-1", Some("nope")).expect("logs").is_empty());
    }

    #[test]
    fn an_execution_and_its_runs_survive_a_reopen_until_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open_dir(dir.path()).expect("open");
        db.insert_job(&job("j-1", "ml", 1)).expect("job");
        assert_eq!(db.job_execution("j-1").expect("read"), None);
        let exec = ExecutionRecord {
            before: 0,
            number: 2,
            inputs: vec![("data.bin".into(), "jobs/j-1/input/data.bin".into())],
            lost: vec!["a-9".into()],
            hosts: vec![vec!["a-1".into(), "a-2".into()]],
            methods: vec![sonic_core::model::Method::Direct],
        };
        assert!(db.set_job_execution("j-1", &exec, 5).expect("set"));
        assert!(!db.set_job_execution("j-nope", &exec, 5).expect("set"));
        let mut run = InstanceRunRecord {
            job: "j-1".into(),
            execution: 2,
            function: "pca".into(),
            instance: 3,
            attempt: 1,
            agent: "a-1".into(),
            report: None,
            started_ms: 10,
            ended_ms: None,
        };
        db.put_instance_run(&run).expect("sent");
        // Sent again (attempt 2), then ended: one row, the newest.
        run.attempt = 2;
        db.put_instance_run(&run).expect("sent again");
        run.report = Some(RunReport {
            cold: Some(true),
            seconds: Some(0.5),
            exit_code: Some(0),
            ..RunReport::new("j-1.pca.3.2".into(), sonic_api::agent::RunStatus::Succeeded)
        });
        run.ended_ms = Some(20);
        db.put_instance_run(&run).expect("ended");
        drop(db);

        let db = Db::open_dir(dir.path()).expect("reopen");
        assert_eq!(db.job_execution("j-1").expect("read"), Some(exec));
        assert_eq!(db.instance_runs("j-1", 2).expect("runs"), vec![run]);
        assert!(db.instance_runs("j-1", 1).expect("runs").is_empty());
        assert_eq!(db.delete_instance_runs("j-1").expect("forget"), 1);
        assert!(db.instance_runs("j-1", 2).expect("runs").is_empty());
    }
}
