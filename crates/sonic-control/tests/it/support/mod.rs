//! The one test kit of the control plane's integration tests: a cluster on loopback, started by
//! [`Cluster::builder`], and what the tests do with it over HTTP (apply, submit, get, wait,
//! results, restart, stop). Modules add helpers of their own in `impl Cluster` blocks.
//!
//! How the agents come (one of):
//! - in this process, registered by the kit (the default): the process sandbox running the
//!   lambdas of `sonic_testkit::lambda_dir`, one local store shared with the control plane; they
//!   do not heartbeat, so the control plane's heartbeat timeout is an hour. Each stands for a VM
//!   of its type: the catalog's vCPUs and network;
//! - [`Builder::joined`]: as on real hosts, each agent knows only the control plane's URL and the
//!   join token (`sonic_agent::start_from_config`), and the control plane starts from its own
//!   configuration (`sonic_control::start`; `runtime_from_config` when the jobs' settings are
//!   tuned); [`Builder::tls`] adds certificates of `deploy/certs.sh` to both;
//! - [`Builder::agent_processes`]: processes of their own (this binary re-run as a whole
//!   agent, [`agent_process_main`]), which a test can kill with SIGKILL and add to;
//!   [`Builder::control_process`] makes the control plane one too ([`control_process_main`]);
//! - [`Builder::memory_agents`]: no agent at all, the executor's in-memory client
//!   (`MemoryAgents`) answering every run; the agents are registered with an address where
//!   nothing listens.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sonic_agent::config::{AgentConfig, SandboxChoice, local_config};
use sonic_agent::sandbox::{ProcessConfig, ProcessSandbox};
use sonic_agent::server::RunningAgent;
use sonic_agent::throttle::AgentThrottle;
use sonic_api::control::{JobEvent, JobSummary};
use sonic_control::config::OpenLambdaSettings;
use sonic_control::exec::agents::MemoryAgents;
use sonic_control::{
    ControlConfig, JobsConfig, RunningControl, Runtime, SystemClock, start_with_jobs,
};
use sonic_core::catalog::Catalog;
use sonic_core::regression::Convergence;
use sonic_core::units::{ByteSize, Seconds};
use sonic_daemon::TlsFiles;
use sonic_storage::local::LocalStore;
use sonic_storage::s3::S3Config;
use sonic_storage::{ObjectStore, StoreChoice};

pub const TOKEN: &str = "control-token-0123456789";
pub const FILE_KEY: &str = "file-key-0123456789abcdef";
/// What a joining agent shows the control plane ([`Builder::joined`]).
pub const JOIN: &str = "join-token-0123456789abcdef";

pub const CATALOG: &str = r#"
vm_types:
  - { name: m5.large,   vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge,  vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;

/// gen copies the job input and broadcasts it to two mids, which copy it on; sink gathers both.
pub const DAG: &str = r#"
name: fan
description: gen broadcasts the input to two mids; sink gathers their copies
params: { mids: 2 }
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: "{{ params.mids }}", timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

/// `target/debug` after building the lambdas in it (`sonic_testkit::lambda_dir`).
pub fn lambda_dir() -> &'static Path {
    sonic_testkit::lambda_dir()
}

/// Whether this run is CI's (`sonic_testkit::in_ci`).
pub fn in_ci() -> bool {
    sonic_testkit::in_ci()
}

/// The workspace's root folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A DAG file of the workspace's `dags/`.
pub fn dag_file(name: &str) -> String {
    std::fs::read_to_string(workspace().join("dags").join(name))
        .unwrap_or_else(|e| panic!("dags/{name}: {e}"))
}

type Tune<T> = Arc<dyn Fn(&mut T) + Send + Sync>;

/// How the agents come (the module's doc).
#[derive(Clone)]
enum Agents {
    Registered,
    Joined { tls: bool },
    Processes { control_process: bool },
    Memory(Arc<MemoryAgents>),
}

/// What [`Cluster::start`] starts; every setting has the default the module's doc says.
#[derive(Clone)]
pub struct Builder {
    agents: Vec<(String, String)>,
    kind: Agents,
    sandbox: SandboxChoice,
    convergence: Option<Convergence>,
    tune: Vec<Tune<JobsConfig>>,
    tune_agents: Vec<Tune<AgentConfig>>,
    executor_threads: Option<usize>,
    heartbeat_timeout: Option<Seconds>,
    max_body: Option<ByteSize>,
    catalog: Option<&'static str>,
    store: Option<(Arc<dyn ObjectStore>, Option<S3Config>)>,
    bucket: Option<&'static str>,
    openlambda: bool,
    wait_deadline: Duration,
}

impl Builder {
    /// The agents, by id and VM type (default: `a-1` an m5.large, `a-2` an m5.xlarge).
    pub fn agents(mut self, agents: &[(&str, &str)]) -> Builder {
        self.agents = agents
            .iter()
            .map(|(id, vm)| ((*id).to_owned(), (*vm).to_owned()))
            .collect();
        self
    }

    /// Agents that join with the join token; the control plane from its own configuration.
    pub fn joined(mut self) -> Builder {
        self.kind = Agents::Joined { tls: false };
        self
    }

    /// [`Builder::joined`], every daemon serving HTTPS with a certificate of `deploy/certs.sh`
    /// (in `dir/tls`, [`Cluster::certs`]); the kit's client trusts that CA only.
    pub fn tls(mut self) -> Builder {
        self.kind = Agents::Joined { tls: true };
        self
    }

    /// Agents that are processes of their own.
    pub fn agent_processes(mut self) -> Builder {
        self.kind = Agents::Processes {
            control_process: false,
        };
        self
    }

    /// [`Builder::agent_processes`], and the control plane a process too, on a fixed address
    /// ([`Cluster::restart`] kills it with SIGKILL). Its jobs' settings cannot be tuned.
    pub fn control_process(mut self) -> Builder {
        self.kind = Agents::Processes {
            control_process: true,
        };
        self
    }

    /// No agents running anything: `agents` answers every run request (registered where
    /// nothing listens). [`Cluster::memory`] is it.
    pub fn memory_agents(mut self, agents: Arc<MemoryAgents>) -> Builder {
        self.kind = Agents::Memory(agents);
        self
    }

    /// The joined agents' sandbox (default: processes); Docker is checked first, see
    /// [`docker_ready`].
    pub fn sandbox(mut self, sandbox: SandboxChoice) -> Builder {
        self.sandbox = sandbox;
        self
    }

    /// When the models count as converged.
    pub fn convergence(mut self, rule: Convergence) -> Builder {
        self.convergence = Some(rule);
        self
    }

    /// Changes the executor's configuration (after the kit's, [`kit_jobs`], and the
    /// convergence rule); again at every restart.
    pub fn tune(mut self, tune: impl Fn(&mut JobsConfig) + Send + Sync + 'static) -> Builder {
        self.tune.push(Arc::new(tune));
        self
    }

    /// Changes every agent's configuration before it starts (not for agent processes).
    pub fn tune_agents(
        mut self,
        tune: impl Fn(&mut AgentConfig) + Send + Sync + 'static,
    ) -> Builder {
        self.tune_agents.push(Arc::new(tune));
        self
    }

    /// Executions on an executor of their own, `threads` threads at the daemon's default nice
    /// (`executor_nice`), as the daemon runs them.
    pub fn executor_threads(mut self, threads: usize) -> Builder {
        self.executor_threads = Some(threads);
        self
    }

    /// How long an agent may go unheard.
    pub fn heartbeat_timeout(mut self, timeout: Seconds) -> Builder {
        self.heartbeat_timeout = Some(timeout);
        self
    }

    /// The largest request body the API takes (job inputs inline).
    pub fn max_body(mut self, max: ByteSize) -> Builder {
        self.max_body = Some(max);
        self
    }

    /// The catalog the executor prices with (default [`CATALOG`]; `None`: none). A joined
    /// cluster's control plane uses its built-in one.
    pub fn catalog(mut self, catalog: Option<&'static str>) -> Builder {
        self.catalog = catalog;
        self
    }

    /// The object store (default: a folder, `dir/store`), and the S3 configuration agent
    /// processes open it with (`None`: that folder).
    pub fn store(mut self, store: Arc<dyn ObjectStore>, s3: Option<S3Config>) -> Builder {
        self.store = Some((store, s3));
        self
    }

    /// A joined cluster's configured store: SeaweedFS's bucket `bucket` when the tests have one
    /// (`SONIC_S3_ENDPOINT`, as in CI), else a folder (default: none configured, the control
    /// plane's fallback folder).
    pub fn store_bucket(mut self, bucket: &'static str) -> Builder {
        self.bucket = Some(bucket);
        self
    }

    /// A joined cluster's control plane also serves OpenLambda's worker API (the registry).
    pub fn openlambda(mut self) -> Builder {
        self.openlambda = true;
        self
    }

    /// How long [`Cluster::ended`] and [`Events::next`] wait (default 120 s).
    pub fn wait_deadline(mut self, deadline: Duration) -> Builder {
        self.wait_deadline = deadline;
        self
    }

    pub async fn start(self) -> Cluster {
        Cluster::start_from(self).await
    }

    fn jobs_config(&self) -> JobsConfig {
        let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
        kit_jobs(&mut jobs);
        self.tune_jobs(&mut jobs);
        jobs
    }

    fn tune_jobs(&self, jobs: &mut JobsConfig) {
        if let Some(rule) = self.convergence {
            jobs.convergence = rule;
        }
        for tune in &self.tune {
            tune(jobs);
        }
    }

    fn catalog_parsed(&self) -> Option<Catalog> {
        self.catalog
            .map(|yaml| Catalog::from_yaml(yaml).expect("catalog"))
    }
}

/// One agent process or control plane process; killed (SIGKILL) on drop if still running.
struct Proc {
    id: String,
    child: Child,
}

impl Proc {
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    control: Option<RunningControl>,
    control_process: Option<Proc>,
    /// The agents running in this process (registered or joined), in the order they started.
    pub agents: Vec<RunningAgent>,
    processes: Vec<Proc>,
    store: Option<Arc<dyn ObjectStore>>,
    /// Speaks to the control plane (trusting the cluster's CA only, with TLS).
    pub http: reqwest::Client,
    url: String,
    listen: SocketAddr,
    started: usize,
    setup: Builder,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub fn builder() -> Builder {
        Builder {
            agents: vec![
                ("a-1".into(), "m5.large".into()),
                ("a-2".into(), "m5.xlarge".into()),
            ],
            kind: Agents::Registered,
            sandbox: SandboxChoice::Process,
            convergence: None,
            tune: Vec::new(),
            tune_agents: Vec::new(),
            executor_threads: None,
            heartbeat_timeout: None,
            max_body: None,
            catalog: Some(CATALOG),
            store: None,
            bucket: None,
            openlambda: false,
            wait_deadline: Duration::from_secs(120),
        }
    }

    /// The default cluster with the models converging under `convergence`.
    pub async fn start(convergence: Convergence) -> Cluster {
        Cluster::builder().convergence(convergence).start().await
    }

    async fn start_from(setup: Builder) -> Cluster {
        if setup.sandbox == SandboxChoice::Docker {
            docker_ready().await;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let tls = matches!(setup.kind, Agents::Joined { tls: true });
        if tls {
            let mut names = vec!["control"];
            names.extend(setup.agents.iter().map(|(id, _)| id.as_str()));
            certificates(&dir.path().join("tls"), &names);
        }
        let store = match (&setup.kind, &setup.store) {
            (Agents::Joined { .. }, _) => None,
            (_, Some((store, _))) => Some(store.clone()),
            (_, None) => {
                let local = LocalStore::new(dir.path().join("store")).expect("store");
                Some(Arc::new(local) as Arc<dyn ObjectStore>)
            }
        };
        let http = if tls {
            sonic_daemon::tls::client_builder(Some(&dir.path().join("tls/ca.pem")))
                .expect("CA")
                .build()
                .expect("client")
        } else {
            reqwest::Client::new()
        };
        let listen = match setup.kind {
            // Agent processes find a control plane process again at the same address.
            Agents::Processes {
                control_process: true,
            } => std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port"),
            _ => SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let agents = setup.agents.clone();
        let mut c = Cluster {
            control: None,
            control_process: None,
            agents: Vec::new(),
            processes: Vec::new(),
            store,
            http,
            url: String::new(),
            listen,
            started: 0,
            setup,
            dir,
        };
        // Registered agents start first, the others need the control plane's URL.
        if matches!(c.setup.kind, Agents::Registered) {
            for (id, vm_type) in &agents {
                let root = c.dir().join(id);
                c.start_agent(id, vm_type, root).await;
            }
            c.start_control().await;
            for a in &c.agents {
                c.register(&a.state.capacity()).await;
            }
        } else {
            c.start_control().await;
            for (id, vm_type) in &agents {
                let root = c.dir().join(id);
                c.start_agent(id, vm_type, root).await;
            }
            if !matches!(c.setup.kind, Agents::Memory(_)) {
                c.wait_alive().await;
            }
        }
        c
    }

    async fn start_control(&mut self) {
        let s = &self.setup;
        let data_dir = self.dir.path().join("control");
        match &s.kind {
            Agents::Processes {
                control_process: true,
            } => {
                assert!(
                    s.convergence.is_none()
                        && s.tune.is_empty()
                        && s.executor_threads.is_none()
                        && s.store.is_none(),
                    "a control plane process takes no closures nor a store of this one"
                );
                let spec = ControlProcess {
                    listen: self.listen,
                    data_dir,
                    store: self.dir.path().join("store"),
                    catalog: s.catalog.map(str::to_owned),
                    heartbeat_timeout_s: s.heartbeat_timeout.map(|t| t.0),
                    max_body: s.max_body.map(|b| b.0),
                };
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.path().join("control.log"))
                    .expect("control.log");
                let child = Command::new(std::env::current_exe().expect("this test binary"))
                    .args([
                        "--exact",
                        "control_process_entry",
                        "--nocapture",
                        "--test-threads",
                        "1",
                    ])
                    .env(CONTROL_PROCESS, serde_json::to_string(&spec).expect("json"))
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("start a control plane process");
                self.control_process = Some(Proc {
                    id: "control".into(),
                    child,
                });
                self.url = format!("http://{}", self.listen);
                self.wait_answering().await;
            }
            Agents::Joined { tls } => {
                let config = self.joined_control_config(*tls, data_dir);
                let tuned = s.convergence.is_some() || !s.tune.is_empty();
                let control = if tuned {
                    let mut runtime = sonic_control::server::runtime_from_config(&config)
                        .await
                        .expect("runtime");
                    s.tune_jobs(&mut runtime.config);
                    start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
                        .await
                        .expect("control plane")
                } else {
                    sonic_control::start(config, Arc::new(SystemClock))
                        .await
                        .expect("start the control plane from its configuration")
                };
                self.url = control.url();
                self.control = Some(control);
            }
            kind => {
                let store = self.store.clone().expect("a store");
                let mut runtime = Runtime::new(store, s.catalog_parsed(), s.jobs_config());
                if let Some(threads) = s.executor_threads {
                    let executor = sonic_control::exec::threads::Executor::new(
                        threads,
                        i32::from(sonic_control::config::DEFAULT_EXECUTOR_NICE),
                    )
                    .expect("executor");
                    runtime = runtime.with_executor(executor);
                }
                if let Agents::Memory(agents) = kind {
                    runtime = runtime.with_agents(agents.clone());
                }
                let unheard = match kind {
                    // Registered agents do not heartbeat: registration keeps them alive for
                    // the whole test, however slow the machine.
                    Agents::Registered | Agents::Memory(_) => Seconds(3600.0),
                    _ => ControlConfig::default().heartbeat_timeout,
                };
                let config = ControlConfig {
                    listen: self.listen,
                    data_dir,
                    token: TOKEN.into(),
                    heartbeat_timeout: s.heartbeat_timeout.unwrap_or(unheard),
                    max_body: s.max_body.unwrap_or(ControlConfig::default().max_body),
                    ..ControlConfig::default()
                };
                let control =
                    start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
                        .await
                        .expect("start control plane");
                self.url = control.url();
                self.control = Some(control);
            }
        }
    }

    fn joined_control_config(&self, tls: bool, data_dir: PathBuf) -> ControlConfig {
        let s = &self.setup;
        let certs = self.certs();
        let defaults = ControlConfig::default();
        ControlConfig {
            listen: self.listen,
            data_dir,
            token: TOKEN.into(),
            join_token: JOIN.into(),
            store: s.bucket.map(|bucket| store_choice(self.dir(), bucket)),
            tls: tls.then(|| tls_files(&certs, "control")),
            ca_file: tls.then(|| certs.join("ca.pem")),
            heartbeat_timeout: s.heartbeat_timeout.unwrap_or(defaults.heartbeat_timeout),
            max_body: s.max_body.unwrap_or(defaults.max_body),
            openlambda: s.openlambda.then(|| OpenLambdaSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                token: String::new(),
                python: "python3".into(),
                timeout: Seconds(30.0),
                max_body: ByteSize(1 << 20),
                pip_timeout: Seconds(300.0),
                worker_memory: ByteSize(1 << 30),
                ..OpenLambdaSettings::on(SocketAddr::from(([127, 0, 0, 1], 0)))
            }),
            ..defaults
        }
    }

    /// Waits until the control plane (a process just started) answers.
    async fn wait_answering(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.http.get(self.url_for("/v1/health")).send().await {
                Ok(_) => return,
                Err(e) => {
                    assert!(Instant::now() < deadline, "the control plane: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The configuration the kit starts a joined agent with, its data in `root`.
    pub fn joined_agent_config(&self, id: &str, vm_type: &str, root: &Path) -> AgentConfig {
        let tls = matches!(self.setup.kind, Agents::Joined { tls: true });
        let certs = self.certs();
        let mut cfg = AgentConfig {
            id: id.to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            // A host of its own: nothing of the control plane's folder is visible to it.
            data_dir: root.to_path_buf(),
            vm_type: vm_type.into(),
            control_url: Some(self.url()),
            join_token: JOIN.to_owned(),
            tls: tls.then(|| tls_files(&certs, id)),
            ca_file: tls.then(|| certs.join("ca.pem")),
            sandbox: self.setup.sandbox,
            bin_dirs: vec![lambda_dir().to_path_buf()],
            heartbeat_interval_ms: 200,
            ..AgentConfig::default()
        };
        for tune in &self.setup.tune_agents {
            tune(&mut cfg);
        }
        cfg
    }

    /// An agent in this process, registered by the kit: the catalog's vCPUs and network for
    /// its VM type.
    fn registered_agent_config(&self, id: &str, vm_type: &str, root: &Path) -> AgentConfig {
        let mut cfg = local_config(id, root, TOKEN, FILE_KEY);
        cfg.vm_type = vm_type.into();
        if let Some(vm) = self
            .setup
            .catalog_parsed()
            .and_then(|c| c.vm_type(vm_type).cloned())
        {
            cfg.vcpus = vm.vcpus;
            cfg.network_mbps = Some(vm.network_mbps);
        }
        cfg.bin_dirs = vec![lambda_dir().to_path_buf()];
        for tune in &self.setup.tune_agents {
            tune(&mut cfg);
        }
        cfg
    }

    async fn start_agent(&mut self, id: &str, vm_type: &str, root: PathBuf) {
        self.started += 1;
        match self.setup.kind.clone() {
            Agents::Registered => {
                let cfg = self.registered_agent_config(id, vm_type, &root);
                let sandbox = ProcessSandbox::new(ProcessConfig {
                    work_dir: root.join("processes"),
                    path: cfg.bin_dirs.clone(),
                    ..ProcessConfig::default()
                })
                .expect("process sandbox");
                let agent = sonic_agent::server::start(
                    cfg,
                    Arc::new(sandbox),
                    self.store.clone(),
                    &AgentThrottle::unlimited(),
                )
                .await
                .expect("start agent");
                self.agents.push(agent);
            }
            Agents::Memory(_) => {
                let mut cfg = self.registered_agent_config(id, vm_type, &root);
                // Nothing listens there: only the in-memory client is ever used.
                cfg.advertise_url = Some("http://127.0.0.1:9".into());
                self.register(&sonic_agent::server::capacity_of(&cfg, "process"))
                    .await;
            }
            Agents::Joined { .. } => {
                let cfg = self.joined_agent_config(id, vm_type, &root);
                let agent = sonic_agent::start_from_config(cfg)
                    .await
                    .expect("the agent joins");
                self.agents.push(agent);
            }
            Agents::Processes { .. } => {
                assert!(
                    self.setup.tune_agents.is_empty(),
                    "an agent process takes no closure"
                );
                std::fs::create_dir_all(&root).expect("agent folder");
                let spec = AgentProcess {
                    id: id.to_owned(),
                    root,
                    vm_type: vm_type.to_owned(),
                    control: self.url(),
                    store: self.dir.path().join("store"),
                    s3: self.setup.store.as_ref().and_then(|(_, s3)| s3.clone()),
                    bins: lambda_dir().to_path_buf(),
                };
                let log = std::fs::File::create(self.dir.path().join(format!("{id}.log")))
                    .expect("agent log");
                let child = Command::new(std::env::current_exe().expect("this test binary"))
                    .args([
                        "--exact",
                        "agent_process_entry",
                        "--nocapture",
                        "--test-threads",
                        "1",
                    ])
                    .env(AGENT_PROCESS, serde_json::to_string(&spec).expect("json"))
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("start an agent process");
                self.processes.push(Proc {
                    id: id.to_owned(),
                    child,
                });
            }
        }
    }

    async fn register(&self, capacity: &sonic_api::agent::Capacity) {
        let r = self
            .http
            .post(self.url_for("/v1/agents/register"))
            .bearer_auth(TOKEN)
            .json(capacity)
            .send()
            .await
            .expect("register");
        assert!(r.status().is_success(), "register: {}", r.status());
    }

    /// Another agent of the first one's VM type, named `a-NN` after the number of agents
    /// started so far; its data in `dir/<id>`. Its id.
    pub async fn add_agent(&mut self) -> String {
        let id = format!("a-{:02}", self.started + 1);
        let root = self.dir().join(&id);
        self.add_agent_at(root).await
    }

    /// [`Cluster::add_agent`], its data folder `root` (made by the caller, e.g. a small tmpfs).
    pub async fn add_agent_at(&mut self, root: PathBuf) -> String {
        let id = format!("a-{:02}", self.started + 1);
        let vm_type = self
            .setup
            .agents
            .first()
            .map_or("m5.large".to_owned(), |(_, vm)| vm.clone());
        self.start_agent(&id, &vm_type, root).await;
        if matches!(self.setup.kind, Agents::Registered) {
            let capacity = self.agents.last().expect("started").state.capacity();
            self.register(&capacity).await;
        }
        id
    }

    /// Kills the agent process `id` (SIGKILL) and reaps it.
    pub fn kill_agent(&mut self, id: &str) {
        let at = self
            .processes
            .iter()
            .position(|p| p.id == id)
            .unwrap_or_else(|| panic!("no agent process {id}"));
        self.processes.remove(at).kill();
    }

    /// The control plane in this process (not with [`Builder::control_process`]).
    pub fn control(&self) -> &RunningControl {
        self.control
            .as_ref()
            .expect("the control plane runs in this process")
    }

    /// The object store the cluster shares (a joined cluster's is the control plane's own:
    /// read results with [`Cluster::results`]).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        self.store
            .as_ref()
            .expect("the kit holds this cluster's store")
    }

    /// The in-memory agents of [`Builder::memory_agents`].
    pub fn memory(&self) -> &MemoryAgents {
        match &self.setup.kind {
            Agents::Memory(agents) => agents,
            _ => panic!("this cluster's agents are not in memory"),
        }
    }

    /// The folder of everything: the control plane's data (`control/`), each agent's
    /// (`<id>/`), the store (`store/`), certificates (`tls/`), processes' logs (`<id>.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The certificates of [`Builder::tls`]: `ca.pem`, `<name>.pem`, `<name>.key`.
    pub fn certs(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The control plane's URL.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The control plane's URL of `path`.
    pub fn url_for(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// OpenLambda's URL of `path` ([`Builder::openlambda`]).
    pub fn openlambda_url(&self, path: &str) -> String {
        let ol = self.control().openlambda.as_ref().expect("openlambda");
        format!("{}{path}", ol.url())
    }

    pub async fn apply(&self, yaml: &str) {
        self.apply_answer(yaml).await;
    }

    /// Applies a DAG file, which must be accepted: the answer (its summary).
    pub async fn apply_answer(&self, yaml: &str) -> Value {
        let r = self
            .http
            .put(self.url_for("/v1/dags"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/yaml")
            .body(yaml.to_owned())
            .send()
            .await
            .expect("apply");
        assert!(r.status().is_success(), "apply: {}", r.status());
        r.json().await.expect("the DAG's summary")
    }

    /// `POST /v1/jobs` with `body`, whatever the answer.
    pub async fn post_job(&self, body: Value) -> reqwest::Response {
        self.http
            .post(self.url_for("/v1/jobs"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("POST /v1/jobs")
    }

    /// Submits a job, which must be accepted (202): its id.
    pub async fn submit(&self, body: Value) -> String {
        let r = self.post_job(body).await;
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
        let v: Value = r.json().await.expect("accepted");
        v["job_id"].as_str().expect("job id").to_owned()
    }

    /// Submits a job of `fan` with `n` bytes of input.
    pub async fn submit_sized(&self, policy: Option<&str>, n: usize) -> String {
        let mut body = json!({
            "dag": "fan",
            "input": { "name": "data.bin", "base64": base64(&sized_input(n)) },
        });
        if let Some(p) = policy {
            body["policy"] = json!(p);
        }
        self.submit(body).await
    }

    /// `GET /v1/jobs/{id}`, which must answer 200: as sent, and read.
    pub async fn get(&self, id: &str) -> (Value, JobSummary) {
        let r = self
            .http
            .get(self.url_for(&format!("/v1/jobs/{id}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get job");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        let s: JobSummary = serde_json::from_value(v.clone()).expect("summary");
        (v, s)
    }

    /// Polls the job until it ends (within the builder's `wait_deadline`, no fixed sleeps).
    pub async fn ended(&self, id: &str) -> (Value, JobSummary) {
        let deadline = Instant::now() + self.setup.wait_deadline;
        loop {
            let (v, s) = self.get(id).await;
            if s.status.is_terminal() {
                return (v, s);
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// [`Cluster::ended`], the summary only.
    pub async fn wait(&self, id: &str) -> JobSummary {
        self.ended(id).await.1
    }

    /// Submits a job (accepted) and waits for its end.
    pub async fn run(&self, body: Value) -> (Value, JobSummary) {
        let id = self.submit(body).await;
        self.ended(&id).await
    }

    /// `GET path` on the control plane, which must succeed, as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let (status, v) = self.get_json_status(path).await;
        assert!(status.is_success(), "GET {path}: {status}");
        v
    }

    /// `GET path` on the control plane, whatever the status: it and the JSON body.
    pub async fn get_json_status(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(self.url_for(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = r.status();
        (status, r.json().await.expect("json body"))
    }

    /// `GET url` with the token (when given): status and body text.
    pub async fn get_text(&self, url: &str, token: Option<&str>) -> (u16, String) {
        let mut req = self.http.get(url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("get");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// Every result file of a job, read through the API (keyed without the job id), sorted.
    pub async fn results(&self, s: &JobSummary) -> Vec<(String, Vec<u8>)> {
        let mut files = Vec::new();
        for out in &s.outputs {
            let marker = format!("jobs/{}/result/", s.job_id);
            let key = out
                .split_once(&marker)
                .map(|(_, k)| k.to_owned())
                .unwrap_or_else(|| panic!("output {out} is not a result"));
            let r = self
                .http
                .get(self.url_for(&format!("/v1/jobs/{}/results/{key}", s.job_id)))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("result");
            assert_eq!(r.status(), 200, "{out}");
            files.push((key, r.bytes().await.expect("bytes").to_vec()));
        }
        files.sort();
        files
    }

    /// Every result file of a job, read from the store (keyed by its path under `result/`),
    /// sorted.
    pub async fn stored_results(&self, s: &JobSummary) -> Vec<(String, Vec<u8>)> {
        let mut files = Vec::new();
        for out in &s.outputs {
            let key = match out.strip_prefix("store://") {
                Some(k) => k,
                None => out
                    .strip_prefix("s3://")
                    .and_then(|r| r.split_once('/'))
                    .map(|(_, k)| k)
                    .expect("store or s3 url"),
            };
            let rel = key
                .strip_prefix(&format!("jobs/{}/result/", s.job_id))
                .expect("under result/")
                .to_owned();
            files.push((
                rel,
                self.store().get_bytes(key).await.expect("result").to_vec(),
            ));
        }
        files.sort();
        files
    }

    /// `GET /v1/jobs/{id}/events`, read with [`Events::next`].
    pub async fn events(&self, id: &str) -> Events {
        let response = self
            .http
            .get(self.url_for(&format!("/v1/jobs/{id}/events")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("events");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        Events {
            id: id.to_owned(),
            status: response.status(),
            content_type,
            response,
            deadline: Instant::now() + self.setup.wait_deadline,
            buf: String::new(),
            ready: VecDeque::new(),
        }
    }

    /// The ids the control plane lists as alive, sorted.
    pub async fn alive(&self) -> Vec<String> {
        let (_, v) = self.get_json_status("/v1/agents").await;
        let mut ids: Vec<String> = v["agents"]
            .as_array()
            .expect("agents array")
            .iter()
            .filter(|a| a["alive"] == json!(true))
            .map(|a| a["agent_id"].as_str().expect("agent id").to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Waits until exactly the running agents (joined or processes) are alive.
    pub async fn wait_alive(&self) {
        let mut want: Vec<String> = self
            .agents
            .iter()
            .map(|a| a.state.config.id.clone())
            .chain(self.processes.iter().map(|p| p.id.clone()))
            .collect();
        want.sort();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let alive = self.alive().await;
            if alive == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agents alive {alive:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the control plane (in this process as [`Cluster::stop`] does; a process with
    /// SIGKILL, as a crash) and starts a new one on the same database (the agents stay; a
    /// control plane process on the same address).
    pub async fn restart(self) -> Cluster {
        self.restart_with(|_| {}).await
    }

    /// [`Cluster::restart`], calling `between` with the stopped control plane's data folder
    /// before the new one starts.
    pub async fn restart_with(mut self, between: impl FnOnce(&Path)) -> Cluster {
        if let Some(control) = self.control.take() {
            control.stop().await;
        }
        if let Some(p) = self.control_process.take() {
            p.kill();
        }
        between(&self.dir.path().join("control"));
        self.start_control().await;
        self
    }

    /// Stops everything, in the reverse order of the start.
    pub async fn stop(mut self) {
        if matches!(self.setup.kind, Agents::Registered)
            && let Some(control) = self.control.take()
        {
            control.stop().await;
        }
        for a in std::mem::take(&mut self.agents) {
            a.stop().await;
        }
        for p in std::mem::take(&mut self.processes) {
            p.kill();
        }
        if let Some(control) = self.control.take() {
            control.stop().await;
        }
        if let Some(p) = self.control_process.take() {
            p.kill();
        }
    }
}

/// A job's event stream (`text/event-stream`).
pub struct Events {
    id: String,
    pub status: StatusCode,
    pub content_type: String,
    response: reqwest::Response,
    deadline: Instant,
    buf: String,
    ready: VecDeque<JobEvent>,
}

impl Events {
    /// The next event; `None` once the stream ended (it must, by the builder's `wait_deadline`).
    pub async fn next(&mut self) -> Option<JobEvent> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("the event stream of {} did not end", self.id))
                .expect("stream")?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(pos) = self.buf.find('\n') {
                let line: String = self.buf.drain(..=pos).collect();
                if let Some(data) = line.trim_end().strip_prefix("data:") {
                    let e = serde_json::from_str(data.trim()).expect("a JobEvent");
                    self.ready.push_back(e);
                }
            }
        }
    }
}

/// The environment variable an agent process reads its [`AgentProcess`] from.
const AGENT_PROCESS: &str = "SONIC_TEST_AGENT_PROCESS";
/// The environment variable a control plane process reads its [`ControlProcess`] from.
const CONTROL_PROCESS: &str = "SONIC_TEST_CONTROL_PROCESS";

/// What an agent process is ([`Builder::agent_processes`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct AgentProcess {
    id: String,
    root: PathBuf,
    vm_type: String,
    control: String,
    /// The local store's folder, unless `s3` is given.
    store: PathBuf,
    s3: Option<S3Config>,
    bins: PathBuf,
}

/// An agent process: this test binary started again with [`AGENT_PROCESS`] set runs only the
/// test `agent_process_entry` (main.rs), which calls this: a whole `sonic-agent` (the library's
/// `start_from_config`, as the daemon does) heartbeating every second until it is killed.
/// Without the variable it does nothing. (Not a test here: `logs.rs` includes this module.)
pub fn agent_process_main() {
    let Ok(spec) = std::env::var(AGENT_PROCESS) else {
        return;
    };
    let spec: AgentProcess = serde_json::from_str(&spec).expect("an AgentProcess");
    let mut cfg = local_config(&spec.id, &spec.root, TOKEN, FILE_KEY);
    cfg.vm_type = spec.vm_type;
    cfg.control_url = Some(spec.control);
    cfg.sandbox = SandboxChoice::Process;
    cfg.store = Some(match spec.s3 {
        Some(s3) => StoreChoice::S3(s3),
        None => StoreChoice::Local { root: spec.store },
    });
    cfg.bin_dirs = vec![spec.bins];
    cfg.heartbeat_interval_ms = 1000;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let _agent = sonic_agent::start_from_config(cfg)
            .await
            .expect("start the agent");
        std::future::pending::<()>().await;
    });
}

/// What a control plane process is ([`Builder::control_process`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct ControlProcess {
    listen: SocketAddr,
    data_dir: PathBuf,
    store: PathBuf,
    catalog: Option<String>,
    heartbeat_timeout_s: Option<f64>,
    max_body: Option<u64>,
}

/// The control plane as a process of its own: this test binary re-run with [`CONTROL_PROCESS`]
/// set runs only the test `control_process_entry` (main.rs), which calls this: a control plane
/// with jobs (the kit's settings, a local store) until it is killed. Without the variable it
/// does nothing.
pub fn control_process_main() {
    let Ok(spec) = std::env::var(CONTROL_PROCESS) else {
        return;
    };
    let spec: ControlProcess = serde_json::from_str(&spec).expect("a ControlProcess");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = Arc::new(LocalStore::new(&spec.store).expect("store"));
        let mut jobs = JobsConfig::new(TOKEN, FILE_KEY.as_bytes());
        kit_jobs(&mut jobs);
        let catalog = spec
            .catalog
            .map(|yaml| Catalog::from_yaml(&yaml).expect("catalog"));
        let runtime = Runtime::new(store, catalog, jobs);
        let defaults = ControlConfig::default();
        let config = ControlConfig {
            listen: spec.listen,
            data_dir: spec.data_dir,
            token: TOKEN.into(),
            heartbeat_timeout: spec
                .heartbeat_timeout_s
                .map_or(defaults.heartbeat_timeout, Seconds),
            max_body: spec.max_body.map_or(defaults.max_body, ByteSize),
            ..defaults
        };
        let _control = start_with_jobs(config, Arc::new(SystemClock), Some(Arc::new(runtime)))
            .await
            .expect("start control plane");
        std::future::pending::<()>().await;
    });
}

/// Fails the test, saying what to do, when Docker does not answer or an image is missing.
async fn docker_ready() {
    let sandbox = sonic_agent::sandbox::DockerSandbox::connect_with(
        sonic_agent::sandbox::DockerConfig {
            work_dir: std::env::temp_dir().join("sonic-handlers-docker-check"),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "these tests need a running Docker engine: {e}. Start it (e.g. `service docker start`)."
        )
    });
    for (image, script) in [
        ("sonic-python:latest", "deploy/build-python-image.sh"),
        ("sonic-lambdas:latest", "deploy/build-images.sh"),
    ] {
        assert!(
            sandbox.image_exists(image).await.unwrap_or(false),
            "image {image} is missing: build it with `bash {script} --debug`"
        );
    }
}

/// A CA and certificates for `names` (SANs: the name, localhost, 127.0.0.1) by deploy/certs.sh.
pub fn certificates(dir: &Path, names: &[&str]) {
    let mut cmd = Command::new("bash");
    cmd.arg(workspace().join("deploy/certs.sh"))
        .arg("--out")
        .arg(dir);
    for n in names {
        cmd.args(["--name", n]);
    }
    let out = cmd.output().expect("run deploy/certs.sh");
    assert!(
        out.status.success(),
        "deploy/certs.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tls_files(dir: &Path, name: &str) -> TlsFiles {
    TlsFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    }
}

/// A joined cluster's store: SeaweedFS when the tests have one (CI), else a folder.
fn store_choice(dir: &Path, bucket: &str) -> StoreChoice {
    match std::env::var("SONIC_S3_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            StoreChoice::S3(S3Config::new(endpoint, bucket, "sonic", "sonicsecret"))
        }
        _ => StoreChoice::Local {
            root: dir.join("store"),
        },
    }
}

pub fn sized_input(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A job plan's report as it travels (`null` without one): what the tests read by key.
pub fn report_json(plan: &sonic_api::control::JobPlan) -> serde_json::Value {
    serde_json::to_value(&plan.report).expect("a plan report encodes")
}

/// The kit's executor settings, in process and in the control-plane process alike, before a
/// test's own: retries after 20 ms (not 200), and a run whose report a restarted control plane
/// must read itself (its agent pushed it to the one before) is read after 200 ms, not 2 s.
/// Neither is what the tests test (`push.rs` sets its own poll).
fn kit_jobs(jobs: &mut JobsConfig) {
    jobs.backoff = Duration::from_millis(20);
    jobs.fallback_poll = Duration::from_millis(200);
}
