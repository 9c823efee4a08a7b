//! A host platform's [`ResourceManager`]: agents started on demand, as child processes of the
//! host (the `sonic-agent` binary with the process sandbox) or as containers of the agent image
//! ([`crate::containers`], when [`Launcher::containers`] is set), and stopped once idle.
//!
//! The host owns an inventory of machines ([`Machine`]): it registers each with the control
//! plane once, with the URL its agent will listen at, and keeps them registered by
//! heartbeating for them ([`OnDemand::keep_registered`]): to the control plane a machine is
//! *alive* when the host can run it, whether its agent runs now or not. An agent process is
//! started when the control plane needs the machine: a planned job's grant
//! ([`ResourceManager::offer`]) or an unplanned job's instance ([`ResourceManager::slot`]);
//! either way the job holds the machine until it is released ([`ResourceManager::release`]).
//! An agent no job has held for the idle period is stopped. Every machine is shared: this
//! host does not limit how many jobs use one agent at once (the built-in
//! [`sonic_control::resources::Pool`] shows how to account slots and memory).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sonic_api::agent::{BandwidthReport, Capacity, Heartbeat};
use sonic_control::resources::{
    Answer, BoxFuture, Grant, Offer, ResourceError, ResourceManager, Slot,
};
use sonic_control::store::AgentSlot;

use crate::containers::{AGENT_PORT, AgentContainer, Containers, Limits};

/// A machine of the host's inventory: one agent, standing for one VM of `vm_type`.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The agent's id.
    pub id: String,
    /// The catalog's VM type this machine is.
    pub vm_type: String,
    /// Its vCPUs.
    pub vcpus: u32,
    /// Its memory, MB.
    pub memory_mb: u64,
}

/// How the host starts an agent: a process, or a container when `containers` is set.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The `sonic-agent` binary (processes only).
    pub agent_bin: PathBuf,
    /// Where the lambdas' executables are (the process sandbox's `PATH`).
    pub lambda_dirs: Vec<PathBuf>,
    /// One folder per agent is made here (its data folder and its log).
    pub data_dir: PathBuf,
    /// The object store the control plane uses (a local folder shared by every agent).
    pub store_dir: PathBuf,
    /// The agents' token ([`sonic_control::JobsConfig::agent_token`]).
    pub agent_token: String,
    /// The file key ([`sonic_control::JobsConfig::file_key`]).
    pub file_key: String,
    /// How long an agent may take to answer its health check after it was started.
    pub start_timeout: Duration,
    /// Agents as containers on this run's network (its `i`-th machine at its `i`-th address)
    /// instead of processes.
    pub containers: Option<Arc<Containers>>,
}

/// What the host did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An agent started, for `why` (a job's grant or one of its instances).
    Started {
        /// The agent.
        agent: String,
        /// For what.
        why: String,
        /// From starting the process (creating the container) to its first healthy answer,
        /// milliseconds.
        took_ms: u64,
        /// A container's CPU quota and memory limit, as Docker reports them (`None`: a process).
        limits: Option<Limits>,
    },
    /// An agent was stopped after being idle (its container removed).
    Stopped {
        /// The agent.
        agent: String,
    },
}

/// An agent that runs.
#[derive(Debug)]
enum Agent {
    /// A child process.
    Process(tokio::process::Child),
    /// A container, by name.
    Container(String),
}

/// One machine and its agent, if running.
#[derive(Debug)]
struct Node {
    machine: Machine,
    url: String,
    port: u16,
    /// Its container's address (agents as containers).
    ip: Option<std::net::Ipv4Addr>,
    process: tokio::sync::Mutex<Option<Agent>>,
}

/// Who holds what, shared by the manager's calls and the background task.
#[derive(Debug, Default)]
struct Book {
    /// Per agent: how many jobs hold it now.
    holders: HashMap<String, usize>,
    /// Per agent nobody holds: since when.
    idle_since: HashMap<String, Instant>,
    /// Per job: the agents it holds (an agent once, however many of its VMs it is).
    jobs: HashMap<String, Vec<String>>,
    /// Agents that run.
    running: HashSet<String>,
    events: Vec<Event>,
}

#[derive(Debug)]
struct Host {
    nodes: Vec<Node>,
    launcher: Launcher,
    idle: Duration,
    book: Mutex<Book>,
}

/// The on-demand manager; cheap to clone (clones share the inventory and its processes).
#[derive(Debug, Clone)]
pub struct OnDemand {
    host: Arc<Host>,
}

/// Why a plan does not fit the inventory.
enum NoFit {
    /// Fewer machines of a type than a stage wants.
    Capacity(BTreeMap<String, u32>, String),
    /// The offer cannot be placed at all.
    Bad(String),
}

impl OnDemand {
    /// A manager over `machines`, each given its agent's address now: a loopback port (the
    /// agent as a process) or an address on the containers' network; agents idle for `idle`
    /// are stopped.
    pub fn new(
        machines: Vec<Machine>,
        launcher: Launcher,
        idle: Duration,
    ) -> std::io::Result<Self> {
        let mut nodes = Vec::with_capacity(machines.len());
        for (i, machine) in machines.into_iter().enumerate() {
            // The URL the control plane knows must not change between starts: a free port
            // now, for the agent to bind later, or the container's fixed address.
            if let Some(c) = &launcher.containers {
                let ip = c.address(i).map_err(std::io::Error::other)?;
                nodes.push(Node {
                    url: format!("http://{ip}:{AGENT_PORT}"),
                    port: AGENT_PORT,
                    ip: Some(ip),
                    machine,
                    process: tokio::sync::Mutex::new(None),
                });
                continue;
            }
            let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
                .local_addr()?
                .port();
            nodes.push(Node {
                url: format!("http://127.0.0.1:{port}"),
                port,
                ip: None,
                machine,
                process: tokio::sync::Mutex::new(None),
            });
        }
        let now = Instant::now();
        let book = Book {
            idle_since: nodes.iter().map(|n| (n.machine.id.clone(), now)).collect(),
            ..Book::default()
        };
        Ok(OnDemand {
            host: Arc::new(Host {
                nodes,
                launcher,
                idle,
                book: Mutex::new(book),
            }),
        })
    }

    /// Registers every machine with the control plane at `control_url` (the agent protocol's
    /// `POST /v1/agents/register`), then heartbeats for them every `every` and stops agents
    /// idle for the idle period, until the manager is dropped.
    pub async fn keep_registered(
        &self,
        control_url: &str,
        token: &str,
        every: Duration,
    ) -> Result<tokio::task::JoinHandle<()>, String> {
        let http = reqwest::Client::new();
        let base = control_url.trim_end_matches('/').to_owned();
        for n in &self.host.nodes {
            let capacity = Capacity {
                agent_id: n.machine.id.clone(),
                url: n.url.clone(),
                vm_type: n.machine.vm_type.clone(),
                vcpus: n.machine.vcpus,
                memory_mb: n.machine.memory_mb,
                network_mbps: None,
                sandbox: "process".into(),
                running: 0,
                bandwidth: BandwidthReport::default(),
            };
            let r = http
                .post(format!("{base}/v1/agents/register"))
                .bearer_auth(token)
                .json(&capacity)
                .send()
                .await
                .map_err(|e| format!("register {}: {e}", n.machine.id))?;
            if !r.status().is_success() {
                return Err(format!("register {}: {}", n.machine.id, r.status()));
            }
        }
        let weak: Weak<Host> = Arc::downgrade(&self.host);
        let token = token.to_owned();
        Ok(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(host) = weak.upgrade() else { return };
                for n in &host.nodes {
                    let beat = Heartbeat {
                        agent_id: n.machine.id.clone(),
                        running: 0,
                        bandwidth: BandwidthReport::default(),
                    };
                    let sent = http
                        .post(format!("{base}/v1/agents/{}/heartbeat", n.machine.id))
                        .bearer_auth(&token)
                        .json(&beat)
                        .send()
                        .await;
                    if let Err(e) = sent {
                        tracing::warn!(agent = %n.machine.id, error = %e, "heartbeat not sent");
                    }
                }
                host.stop_idle().await;
            }
        }))
    }

    /// What the host did so far.
    pub fn events(&self) -> Vec<Event> {
        self.host.book().events.clone()
    }

    /// The agents that run now, by id.
    pub fn running(&self) -> Vec<String> {
        let mut r: Vec<String> = self.host.book().running.iter().cloned().collect();
        r.sort();
        r
    }

    /// Stops every agent (the host is shutting down).
    pub async fn stop_all(&self) {
        for n in &self.host.nodes {
            self.host.stop(n).await;
        }
    }

    /// Picks the machines of `offer`'s plan: per DAG function, one distinct machine per VM of
    /// its stage (running ones and those the offer prefers first); a `vm-storage` receiver
    /// gets its sender's machines.
    fn place(&self, offer: &Offer) -> Result<Vec<Vec<String>>, NoFit> {
        let book = self.host.book();
        let mine: Vec<&AgentSlot> = offer
            .agents
            .iter()
            .filter(|a| self.host.node(&a.id).is_some())
            .collect();
        let mut have: BTreeMap<String, u32> = BTreeMap::new();
        for a in &mine {
            *have.entry(a.vm_type.clone()).or_default() += 1;
        }
        let mut hosts: Vec<Vec<String>> = Vec::with_capacity(offer.dag.functions.len());
        let mut short = Vec::new();
        for (i, f) in offer.dag.functions.iter().enumerate() {
            if let Some(s) = offer.vm_group(i) {
                hosts.push(hosts[s].clone());
                continue;
            }
            let st = offer
                .stage(i)
                .ok_or_else(|| NoFit::Bad(format!("the plan has no placement for {}", f.name)))?;
            let vms = st.vms.max(1) as usize;
            let prefer = |id: &str| {
                offer
                    .prefer
                    .get(i)
                    .and_then(|p| p.iter().position(|x| x == id))
                    .unwrap_or(usize::MAX)
            };
            let mut typed: Vec<&AgentSlot> = mine
                .iter()
                .copied()
                .filter(|a| a.vm_type == st.vm_type)
                .collect();
            typed.sort_by_key(|a| {
                (
                    prefer(&a.id),
                    !book.running.contains(&a.id),
                    book.holders.get(&a.id).copied().unwrap_or(0),
                    a.id.clone(),
                )
            });
            if typed.len() < vms {
                short.push(format!(
                    "{} wants {vms} {} VMs, the host has {}",
                    f.name,
                    st.vm_type,
                    typed.len()
                ));
                hosts.push(Vec::new());
                continue;
            }
            hosts.push(typed[..vms].iter().map(|a| a.id.clone()).collect());
        }
        if short.is_empty() {
            Ok(hosts)
        } else {
            Err(NoFit::Capacity(have, short.join("; ")))
        }
    }
}

impl Host {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.machine.id == id)
    }

    /// `job` holds the machine `id` until it is released (once, however often it asks).
    fn hold(&self, job: &str, id: &str) {
        let mut book = self.book();
        let held = book.jobs.entry(job.to_owned()).or_default();
        if held.iter().any(|a| a == id) {
            return;
        }
        held.push(id.to_owned());
        *book.holders.entry(id.to_owned()).or_default() += 1;
        book.idle_since.remove(id);
    }

    /// `job` ended: the machines it held are idle from now on unless another job holds them.
    fn release(&self, job: &str) {
        let mut book = self.book();
        for id in book.jobs.remove(job).unwrap_or_default() {
            let h = book.holders.entry(id.clone()).or_default();
            *h = h.saturating_sub(1);
            if *h == 0 {
                book.idle_since.insert(id, Instant::now());
            }
        }
    }

    /// Starts the agent of `id` unless it runs; `Ok(true)` when this call started it. The
    /// caller holds the machine, so the idle reaper leaves it alone meanwhile.
    async fn ensure_running(&self, id: &str, why: &str) -> Result<bool, String> {
        let node = self
            .node(id)
            .ok_or_else(|| format!("agent {id} is not one of this host's"))?;
        let mut process = node.process.lock().await;
        match process.as_mut() {
            Some(Agent::Process(child)) => match child.try_wait() {
                Ok(None) => return Ok(false),
                Ok(Some(status)) => {
                    tracing::warn!(agent = id, %status, "agent process had exited: starting it again");
                }
                Err(e) => return Err(format!("agent {id}: {e}")),
            },
            Some(Agent::Container(name)) => {
                let c = self.containers()?;
                match c.running(name).await {
                    Ok(true) => return Ok(false),
                    Ok(false) => {
                        tracing::warn!(agent = id, "agent container is gone: starting it again")
                    }
                    Err(e) => {
                        tracing::warn!(agent = id, error = %e, "agent container had stopped: starting it again")
                    }
                }
            }
            None => {}
        }
        let since = Instant::now();
        let (agent, limits) = if self.launcher.containers.is_some() {
            let name = self.start_container(node).await?;
            let limits = self.containers()?.limits(&name).await?;
            (Agent::Container(name), Some(limits))
        } else {
            (Agent::Process(self.spawn(node).await?), None)
        };
        let took_ms = since.elapsed().as_millis() as u64;
        *process = Some(agent);
        let mut book = self.book();
        book.running.insert(id.to_owned());
        book.events.push(Event::Started {
            agent: id.to_owned(),
            why: why.to_owned(),
            took_ms,
            limits,
        });
        tracing::info!(agent = id, why, took_ms, "agent started on demand");
        Ok(true)
    }

    fn containers(&self) -> Result<&Containers, String> {
        self.launcher
            .containers
            .as_deref()
            .ok_or_else(|| "this host runs its agents as processes".to_owned())
    }

    /// Starts the container of `node` and waits until its agent answers its health check.
    async fn start_container(&self, node: &Node) -> Result<String, String> {
        let c = self.containers()?;
        let l = &self.launcher;
        let m = &node.machine;
        let ip = node
            .ip
            .ok_or_else(|| format!("agent {} has no container address", m.id))?;
        let spec = AgentContainer {
            id: m.id.clone(),
            ip,
            vm_type: m.vm_type.clone(),
            vcpus: m.vcpus,
            memory_mb: m.memory_mb,
            data_dir: l.data_dir.join(&m.id).join("data"),
            store_dir: l.store_dir.clone(),
            lambda_dirs: l.lambda_dirs.clone(),
            agent_token: l.agent_token.clone(),
            file_key: l.file_key.clone(),
        };
        let name = c.start(&spec).await?;
        let http = reqwest::Client::new();
        let deadline = Instant::now() + l.start_timeout;
        let mut checked = Instant::now();
        loop {
            if answers_health(&http, &node.url).await {
                return Ok(name);
            }
            // An agent that exits at start (a bad setting, a missing library) says why in
            // its log; asking the engine every 200 ms keeps the poll cheap.
            if checked.elapsed() >= Duration::from_millis(200) {
                checked = Instant::now();
                if let Err(e) = c.running(&name).await {
                    c.stop(&name, &self.log_of(m)).await;
                    return Err(format!("agent {}: {e}", m.id));
                }
            }
            if Instant::now() > deadline {
                let logs = c.logs(&name).await;
                c.stop(&name, &self.log_of(m)).await;
                return Err(format!(
                    "agent {} (container {name}) did not answer at {} within {:?}{logs}",
                    m.id, node.url, l.start_timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where an agent's log is kept on the host.
    fn log_of(&self, m: &Machine) -> PathBuf {
        self.launcher.data_dir.join(&m.id).join("agent.log")
    }

    /// Runs `sonic-agent` for `node` and waits until it answers its health check.
    async fn spawn(&self, node: &Node) -> Result<tokio::process::Child, String> {
        let l = &self.launcher;
        let m = &node.machine;
        let dir = l.data_dir.join(&m.id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .map_err(|e| format!("agent log of {}: {e}", m.id))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = tokio::process::Command::new(&l.agent_bin);
        cmd.arg("--id")
            .arg(&m.id)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", node.port))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--vm-type")
            .arg(&m.vm_type)
            .arg("--vcpus")
            .arg(m.vcpus.to_string())
            .arg("--memory-mb")
            .arg(m.memory_mb.to_string())
            .arg("--sandbox")
            .arg("process")
            .arg("--store-dir")
            .arg(&l.store_dir);
        for d in &l.lambda_dirs {
            cmd.arg("--bin-dir").arg(d);
        }
        // Secrets through the environment, not the command line (which `ps` shows).
        cmd.env("SONIC_AGENT_TOKEN", &l.agent_token)
            .env("SONIC_FILE_KEY", &l.file_key)
            .env_remove("SONIC_CONTROL_URL")
            .env_remove("SONIC_JOIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", l.agent_bin.display()))?;
        let http = reqwest::Client::new();
        let deadline = Instant::now() + l.start_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "agent {} exited at start ({status}); its log: {}",
                    m.id,
                    dir.join("agent.log").display()
                ));
            }
            if answers_health(&http, &node.url).await {
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(format!(
                    "agent {} did not answer within {:?}",
                    m.id, l.start_timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the agent of `node` if it runs.
    async fn stop(&self, node: &Node) {
        let mut process = node.process.lock().await;
        self.kill(node, &mut process).await;
    }

    /// Stops the agent in `process`, if any: kills its process, or stops and removes its
    /// container (the caller holds the node's lock).
    async fn kill(&self, node: &Node, process: &mut Option<Agent>) {
        match process.take() {
            None => return,
            Some(Agent::Process(mut child)) => {
                if let Err(e) = child.kill().await {
                    tracing::warn!(agent = %node.machine.id, error = %e, "cannot stop the agent");
                }
            }
            Some(Agent::Container(name)) => match self.containers() {
                Ok(c) => c.stop(&name, &self.log_of(&node.machine)).await,
                Err(e) => {
                    tracing::warn!(agent = %node.machine.id, error = %e, "cannot stop the agent")
                }
            },
        }
        let mut book = self.book();
        book.running.remove(&node.machine.id);
        book.events.push(Event::Stopped {
            agent: node.machine.id.clone(),
        });
        tracing::info!(agent = %node.machine.id, "agent stopped");
    }

    /// Stops the agents nobody has held for the idle period.
    async fn stop_idle(&self) {
        for n in &self.nodes {
            // Under the process lock, so a start that holds the machine meanwhile waits and
            // then finds it stopped (and starts it again).
            let mut process = n.process.lock().await;
            let idle = {
                let book = self.book();
                book.holders.get(&n.machine.id).copied().unwrap_or(0) == 0
                    && book
                        .idle_since
                        .get(&n.machine.id)
                        .is_some_and(|t| t.elapsed() >= self.idle)
            };
            if idle {
                self.kill(n, &mut process).await;
            }
        }
    }
}

impl ResourceManager for OnDemand {
    fn offer<'a>(
        &'a self,
        offer: &'a Offer,
        waiting: &'a (dyn Fn(&str) + Send + Sync),
    ) -> BoxFuture<'a, Result<Answer, ResourceError>> {
        Box::pin(async move {
            let hosts = match self.place(offer) {
                Ok(h) => h,
                Err(NoFit::Capacity(vms, why)) => return Ok(Answer::Capacity { vms, why }),
                Err(NoFit::Bad(why)) => return Err(ResourceError::Unavailable(why)),
            };
            let mut agents: Vec<String> = Vec::new();
            for id in hosts.iter().flatten() {
                if !agents.contains(id) {
                    agents.push(id.clone());
                }
            }
            // Held before starting: the idle reaper must not stop them meanwhile.
            for id in &agents {
                self.host.hold(&offer.job, id);
            }
            let stopped: Vec<&String> = {
                let book = self.host.book();
                agents
                    .iter()
                    .filter(|a| !book.running.contains(*a))
                    .collect()
            };
            if !stopped.is_empty() {
                waiting(&format!(
                    "starting agent{} {} on demand",
                    if stopped.len() == 1 { "" } else { "s" },
                    stopped
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let mut started = Vec::new();
            for id in &agents {
                match self
                    .host
                    .ensure_running(id, &format!("job {}", offer.job))
                    .await
                {
                    Ok(true) => started.push(id.clone()),
                    Ok(false) => {}
                    Err(e) => {
                        self.host.release(&offer.job);
                        return Err(ResourceError::Unavailable(e));
                    }
                }
            }
            let mut notes = Vec::new();
            if !started.is_empty() {
                notes.push(format!("started on demand: {}", started.join(", ")));
            }
            Ok(Answer::Grant(Grant { hosts, notes }))
        })
    }

    fn release(&self, job: &str) {
        self.host.release(job);
    }

    fn slot<'a>(
        &'a self,
        job: &'a str,
        agent: &'a AgentSlot,
        _memory_mb: u64,
    ) -> BoxFuture<'a, Result<Slot, ResourceError>> {
        Box::pin(async move {
            if self.host.node(&agent.id).is_none() {
                return Ok(Slot::unlimited());
            }
            // Held by the job until it ends, not only while this instance runs: its next
            // stage (or its cleanup) may come back to this agent.
            self.host.hold(job, &agent.id);
            self.host
                .ensure_running(&agent.id, &format!("an instance of job {job}"))
                .await
                .map_err(ResourceError::Unavailable)?;
            Ok(Slot::unlimited())
        })
    }
}

/// Whether the agent at `url` answers `GET /v1/health` with a success within a second.
async fn answers_health(http: &reqwest::Client, url: &str) -> bool {
    http.get(format!("{url}/v1/health"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
