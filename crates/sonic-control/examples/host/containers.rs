//! Agents as containers: the host's machines started as containers of the agent image through
//! the Docker engine (bollard), on a network this host creates for the run and removes at the
//! end.
//!
//! Each container stands for one machine of the inventory: the `sonic-agent` of the image (or
//! this tree's, mounted read-only) with the process sandbox inside the container, its lambdas
//! from folders of the host mounted read-only at the same path (`--bin-dir`), `--init` as pid 1
//! (it reaps what lambdas leave behind), a CPU quota of its machine's vCPUs (at most the
//! engine's CPUs) and a memory limit of its machine's memory. What it shares with the host is
//! mounted at the same path: the object store (a [`sonic_storage::local::LocalStore`] folder)
//! and its data folder. Each agent has a fixed address on the network, so the URL the control
//! plane knows never changes between starts; the control plane listens on the network's
//! gateway, an address of the host the containers reach.
//!
//! Everything is labelled `sonic.host.run=<run>`; [`Containers::cleanup`] removes the run's
//! containers and its network, and dropping a [`Containers`] that was not cleaned up does it
//! (on a thread of its own, so it also happens when the host unwinds from an error or a panic).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt;

/// The image `deploy/images/build.sh` builds (and `deploy/cluster.sh` runs): Debian with CA
/// certificates and python3, `sonic-agent` and the lambdas. (`sonic-agent:latest` of
/// `deploy/build-images.sh` has no CA certificates: its agent exits at start, "http client:
/// builder error".)
pub const DEFAULT_IMAGE: &str = "sonic-agent-host:latest";
/// The port every agent listens on inside its container.
pub const AGENT_PORT: u16 = 7070;
/// The label every container and the network of one run carry.
pub const RUN_LABEL: &str = "sonic.host.run";
/// Where a `sonic-agent` binary of the host is mounted in the container (`agent_bin`).
const AGENT_IN_CONTAINER: &str = "/opt/sonic-host/sonic-agent";

/// How the host runs its agents' containers.
#[derive(Debug, Clone)]
pub struct ContainerOptions {
    /// The agent image (`sonic-agent` on its `PATH`).
    pub image: String,
    /// A `sonic-agent` binary of the host to run instead of the image's (mounted read-only):
    /// the image then gives the filesystem and the libraries.
    pub agent_bin: Option<PathBuf>,
    /// How long `docker stop` waits for the agent to stop before killing it.
    pub stop_timeout: Duration,
}

impl Default for ContainerOptions {
    fn default() -> Self {
        ContainerOptions {
            image: DEFAULT_IMAGE.into(),
            agent_bin: None,
            stop_timeout: Duration::from_secs(5),
        }
    }
}

/// One agent's container, as [`Containers::start`] makes it.
#[derive(Debug, Clone)]
pub struct AgentContainer {
    /// The agent's id (the container is `sonic-host-<run>-<id>`).
    pub id: String,
    /// Its address on the run's network.
    pub ip: Ipv4Addr,
    /// The VM type, vCPUs and memory it declares.
    pub vm_type: String,
    /// Its vCPUs (the container's CPU quota, at most the engine's CPUs).
    pub vcpus: u32,
    /// Its memory, MB (the container's memory limit).
    pub memory_mb: u64,
    /// Its data folder on the host (mounted at the same path).
    pub data_dir: PathBuf,
    /// The object store's folder on the host (mounted at the same path).
    pub store_dir: PathBuf,
    /// Folders of lambda executables on the host (mounted read-only at the same path).
    pub lambda_dirs: Vec<PathBuf>,
    /// The agents' token and the file key (in the container's environment).
    pub agent_token: String,
    /// The file key.
    pub file_key: String,
}

/// The limits Docker reports for a started container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPUs (the CPU quota), thousandths.
    pub millicpus: u64,
    /// Memory limit, MB.
    pub memory_mb: u64,
}

/// The engine, the run's network and its containers.
#[derive(Debug)]
pub struct Containers {
    docker: Docker,
    options: ContainerOptions,
    /// This run's id (in every name and label).
    pub run: String,
    /// The network's name (`sonic-host-<run>`).
    pub network: String,
    /// The network's gateway: the host's address on it.
    pub gateway: Ipv4Addr,
    subnet: (Ipv4Addr, u8),
    /// The engine's CPUs (a container's CPU quota cannot exceed them).
    pub engine_cpus: u32,
    cleaned: AtomicBool,
}

/// Whether an error is the engine's 404.
fn not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Connects to the engine (`DOCKER_HOST` or the default socket) and negotiates the API version
/// (the engine may speak an older one than bollard).
pub async fn connect(timeout: Duration) -> Result<Docker, String> {
    let unreachable = |e: &dyn std::fmt::Display| {
        format!(
            "the Docker engine does not answer: {e} (is it running, and is /var/run/docker.sock \
             or DOCKER_HOST accessible?)"
        )
    };
    let docker = Docker::connect_with_local_defaults().map_err(|e| unreachable(&e))?;
    match tokio::time::timeout(timeout, docker.negotiate_version()).await {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(unreachable(&e)),
        Err(_) => Err(unreachable(&format!("no answer within {timeout:?}"))),
    }
}

/// Checks that the engine has `image`, with an error saying how to build it when it has not.
pub async fn check_image(docker: &Docker, image: &str) -> Result<(), String> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Err(missing_image(image)),
        Err(e) => Err(format!("cannot inspect the image {image}: {e}")),
    }
}

fn missing_image(image: &str) -> String {
    format!(
        "the agent image {image} is missing: build it with `bash deploy/images/build.sh` \
         (sonic-agent-host:latest, debug binaries)"
    )
}

impl Containers {
    /// Connects to the engine, checks the image and creates the run's network
    /// (`sonic-host-<run>`, a bridge with a subnet of its own).
    pub async fn setup(options: ContainerOptions) -> Result<Containers, String> {
        let docker = connect(Duration::from_secs(5)).await?;
        check_image(&docker, &options.image).await?;
        if let Some(bin) = &options.agent_bin
            && !bin.is_file()
        {
            return Err(format!(
                "{} is missing: build it with `cargo build -p sonic-agent --bin sonic-agent`",
                bin.display()
            ));
        }
        let info = docker
            .info()
            .await
            .map_err(|e| format!("docker info: {e}"))?;
        let engine_cpus = info.ncpu.unwrap_or(1).max(1) as u32;
        let run = format!("{:08x}", rand::random::<u32>());
        let network = format!("sonic-host-{run}");
        let (subnet, gateway) = create_network(&docker, &network, &run).await?;
        Ok(Containers {
            docker,
            options,
            run,
            network,
            gateway,
            subnet,
            engine_cpus,
            cleaned: AtomicBool::new(false),
        })
    }

    /// The address of the `i`-th agent (from 0): after the gateway's, in order.
    pub fn address(&self, i: usize) -> Result<Ipv4Addr, String> {
        let (net, prefix) = self.subnet;
        let size = 1u64 << (32 - u32::from(prefix));
        let offset = u64::from(u32::from(self.gateway) - u32::from(net)) + 1 + i as u64;
        if offset + 1 >= size {
            return Err(format!(
                "the network {}/{prefix} has no address for agent {i}",
                net
            ));
        }
        Ok(Ipv4Addr::from(u32::from(net) + offset as u32))
    }

    /// The container's name of agent `id`.
    pub fn name(&self, id: &str) -> String {
        format!("sonic-host-{}-{id}", self.run)
    }

    /// Creates and starts the container of `agent`; its name. The caller waits for its health
    /// check.
    pub async fn start(&self, agent: &AgentContainer) -> Result<String, String> {
        let name = self.name(&agent.id);
        let cpus = agent.vcpus.min(self.engine_cpus).max(1);
        let memory = (agent.memory_mb as i64) << 20;
        let same = |p: &Path, mode: &str| format!("{0}:{0}:{mode}", p.display());
        let mut binds = vec![same(&agent.data_dir, "rw"), same(&agent.store_dir, "rw")];
        let mut cmd = vec![match &self.options.agent_bin {
            Some(bin) => {
                binds.push(format!("{}:{AGENT_IN_CONTAINER}:ro", bin.display()));
                AGENT_IN_CONTAINER.to_owned()
            }
            None => "sonic-agent".to_owned(),
        }];
        for d in &agent.lambda_dirs {
            binds.push(same(d, "ro"));
            cmd.push("--bin-dir".into());
            cmd.push(d.display().to_string());
        }
        std::fs::create_dir_all(&agent.data_dir)
            .map_err(|e| format!("{}: {e}", agent.data_dir.display()))?;
        // The agent runs as the owner of its data folder, so what it writes on the host's
        // folders (the store, its data) belongs to the host's user.
        let owner = std::fs::metadata(&agent.data_dir)
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                format!("{}:{}", m.uid(), m.gid())
            })
            .map_err(|e| format!("{}: {e}", agent.data_dir.display()))?;
        let env = vec![
            format!("SONIC_AGENT_ID={}", agent.id),
            format!("SONIC_AGENT_LISTEN=0.0.0.0:{AGENT_PORT}"),
            format!("SONIC_AGENT_ADVERTISE_URL=http://{}:{AGENT_PORT}", agent.ip),
            format!("SONIC_AGENT_DATA_DIR={}", agent.data_dir.display()),
            format!("SONIC_AGENT_VM_TYPE={}", agent.vm_type),
            format!("SONIC_AGENT_VCPUS={}", agent.vcpus),
            format!("SONIC_AGENT_MEMORY_MB={}", agent.memory_mb),
            "SONIC_AGENT_SANDBOX=process".into(),
            format!("SONIC_AGENT_STORE_DIR={}", agent.store_dir.display()),
            // Without SONIC_CONTROL_URL: the host registers and heartbeats for its machines.
            format!("SONIC_AGENT_TOKEN={}", agent.agent_token),
            format!("SONIC_FILE_KEY={}", agent.file_key),
            "RUST_LOG=info".into(),
            "NO_COLOR=1".into(),
        ];
        let labels = HashMap::from([
            (RUN_LABEL.to_owned(), self.run.clone()),
            ("sonic.host.agent".to_owned(), agent.id.clone()),
        ]);
        let body = ContainerCreateBody {
            image: Some(self.options.image.clone()),
            cmd: Some(cmd),
            env: Some(env),
            user: Some(owner),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: Some(binds),
                init: Some(true),
                nano_cpus: Some(i64::from(cpus) * 1_000_000_000),
                memory: Some(memory),
                memory_swap: Some(memory),
                network_mode: Some(self.network.clone()),
                ..HostConfig::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    self.network.clone(),
                    EndpointSettings {
                        ipam_config: Some(EndpointIpamConfig {
                            ipv4_address: Some(agent.ip.to_string()),
                            ..EndpointIpamConfig::default()
                        }),
                        ..EndpointSettings::default()
                    },
                )])),
            }),
            ..ContainerCreateBody::default()
        };
        // A container of this name left by an earlier start of this run.
        self.remove(&name).await;
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        match self.docker.create_container(Some(options), body).await {
            Ok(_) => {}
            Err(e) if not_found(&e) => return Err(missing_image(&self.options.image)),
            Err(e) => return Err(format!("cannot create the container {name}: {e}")),
        }
        if let Err(e) = self.docker.start_container(&name, None).await {
            let logs = self.logs(&name).await;
            self.remove(&name).await;
            return Err(format!(
                "cannot start the container {name} of {}: {e} (the image must have sonic-agent on \
                 its PATH: `bash deploy/images/build.sh`){logs}",
                self.options.image
            ));
        }
        Ok(name)
    }

    /// Whether the container `name` runs; `Err` with its last log lines when it stopped.
    pub async fn running(&self, name: &str) -> Result<bool, String> {
        match self.docker.inspect_container(name, None).await {
            Ok(c) => {
                let state = c.state.unwrap_or_default();
                if state.running == Some(true) {
                    Ok(true)
                } else {
                    Err(format!(
                        "the container {name} stopped (exit code {}){}",
                        state.exit_code.unwrap_or(-1),
                        self.logs(name).await
                    ))
                }
            }
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(format!("cannot inspect the container {name}: {e}")),
        }
    }

    /// The CPU quota and memory limit Docker holds for the container `name`.
    pub async fn limits(&self, name: &str) -> Result<Limits, String> {
        let c = self
            .docker
            .inspect_container(name, None)
            .await
            .map_err(|e| format!("cannot inspect the container {name}: {e}"))?;
        let h = c.host_config.unwrap_or_default();
        Ok(Limits {
            millicpus: (h.nano_cpus.unwrap_or(0) / 1_000_000) as u64,
            memory_mb: (h.memory.unwrap_or(0) >> 20) as u64,
        })
    }

    /// The last lines of the container's log, as a suffix for an error message.
    pub async fn logs(&self, name: &str) -> String {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail("20")
            .build();
        let mut out = String::new();
        let mut s = self.docker.logs(name, Some(options));
        while let Some(Ok(line)) = s.next().await {
            out.push_str(&line.to_string());
        }
        if out.trim().is_empty() {
            String::new()
        } else {
            format!("; its last log lines:\n{}", out.trim_end())
        }
    }

    /// Stops the container `name` (SIGTERM, then SIGKILL after the stop timeout), keeps its log
    /// in `log` and removes it.
    pub async fn stop(&self, name: &str, log: &Path) {
        let t = i32::try_from(self.options.stop_timeout.as_secs()).unwrap_or(5);
        let options = StopContainerOptionsBuilder::default().t(t).build();
        match self.docker.stop_container(name, Some(options)).await {
            Ok(()) => {}
            // 304: it had stopped already.
            Err(DockerError::DockerResponseServerError {
                status_code: 304, ..
            }) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => tracing::warn!(container = name, error = %e, "cannot stop the container"),
        }
        let all = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .build();
        let mut text = Vec::new();
        let mut s = self.docker.logs(name, Some(all));
        while let Some(Ok(line)) = s.next().await {
            text.extend_from_slice(&line.into_bytes());
        }
        let kept = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &text));
        if let Err(e) = kept {
            tracing::warn!(log = %log.display(), error = %e, "cannot keep the agent's log");
        }
        self.remove(name).await;
    }

    /// Removes the container `name` (forced), if it exists.
    async fn remove(&self, name: &str) {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => tracing::warn!(container = name, error = %e, "cannot remove the container"),
        }
    }

    /// What of this run exists now: its containers (running or not) and its network, by name.
    pub async fn leftovers(&self) -> Result<Vec<String>, String> {
        let mut left = list_run(&self.docker, &self.run).await?;
        if network_exists(&self.docker, &self.network).await? {
            left.push(format!("network {}", self.network));
        }
        Ok(left)
    }

    /// Removes this run's containers and its network.
    pub async fn cleanup(&self) -> Result<(), String> {
        let r = remove_run(&self.docker, &self.run, &self.network).await;
        self.cleaned.store(true, Ordering::SeqCst);
        r
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        if self.cleaned.load(Ordering::SeqCst) {
            return;
        }
        // Not cleaned up (an error or a panic on the way): do it now, on a thread with a
        // runtime of its own (this one may be shutting down, or this may be inside it).
        let (run, network) = (self.run.clone(), self.network.clone());
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let docker = connect(Duration::from_secs(5)).await?;
                remove_run(&docker, &run, &network).await
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("host: cleaning up containers of run {}: {e}", self.run),
            Err(_) => eprintln!("host: cleaning up containers of run {} panicked", self.run),
        }
    }
}

/// The containers labelled with `run`, by name.
pub async fn list_run(docker: &Docker, run: &str) -> Result<Vec<String>, String> {
    let filters = HashMap::from([("label", vec![format!("{RUN_LABEL}={run}")])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(options))
        .await
        .map_err(|e| format!("docker ps: {e}"))?;
    let mut names: Vec<String> = list
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .map(|n| n.trim_start_matches('/').to_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// Removes `run`'s containers, then its network.
async fn remove_run(docker: &Docker, run: &str, network: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    for name in list_run(docker, run).await? {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match docker.remove_container(&name, Some(options)).await {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => errors.push(format!("remove {name}: {e}")),
        }
    }
    match docker.remove_network(network).await {
        Ok(()) => {}
        Err(e) if not_found(&e) => {}
        Err(e) => errors.push(format!("remove the network {network}: {e}")),
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Whether the network `name` exists.
pub async fn network_exists(docker: &Docker, name: &str) -> Result<bool, String> {
    match docker.inspect_network(name, None).await {
        Ok(_) => Ok(true),
        Err(e) if not_found(&e) => Ok(false),
        Err(e) => Err(format!("docker network inspect {name}: {e}")),
    }
}

/// Creates the bridge network `name` with a subnet Docker picks, made explicit so that
/// containers can be given fixed addresses on it (Docker allows that only on a network whose
/// subnet was configured): created once to learn a free subnet, then again with it. Its subnet
/// and gateway.
async fn create_network(
    docker: &Docker,
    name: &str,
    run: &str,
) -> Result<((Ipv4Addr, u8), Ipv4Addr), String> {
    let labels = HashMap::from([(RUN_LABEL.to_owned(), run.to_owned())]);
    let request = |ipam: Option<Ipam>| NetworkCreateRequest {
        name: name.to_owned(),
        driver: Some("bridge".into()),
        ipam,
        labels: Some(labels.clone()),
        ..NetworkCreateRequest::default()
    };
    let mut last = String::new();
    for _ in 0..3 {
        docker
            .create_network(request(None))
            .await
            .map_err(|e| format!("docker network create {name}: {e}"))?;
        let picked = docker
            .inspect_network(name, None)
            .await
            .map_err(|e| format!("docker network inspect {name}: {e}"))
            .and_then(|n| {
                n.ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|c| {
                        let subnet = parse_subnet(c.subnet.as_deref()?)?;
                        let gateway = c.gateway.as_deref()?.parse::<Ipv4Addr>().ok()?;
                        Some((subnet, gateway))
                    })
                    .ok_or_else(|| format!("the network {name} has no IPv4 subnet"))
            });
        let _ = docker.remove_network(name).await;
        let (subnet, gateway) = picked?;
        if subnet.1 > 28 {
            return Err(format!(
                "the network {name} got {}/{}, too small for the agents",
                subnet.0, subnet.1
            ));
        }
        let ipam = Ipam {
            config: Some(vec![IpamConfig {
                subnet: Some(format!("{}/{}", subnet.0, subnet.1)),
                gateway: Some(gateway.to_string()),
                ..IpamConfig::default()
            }]),
            ..Ipam::default()
        };
        // Another network may have taken the subnet meanwhile: then again.
        match docker.create_network(request(Some(ipam))).await {
            Ok(_) => return Ok((subnet, gateway)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("docker network create {name}: {last}"))
}

fn parse_subnet(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, prefix) = s.split_once('/')?;
    Some((ip.parse().ok()?, prefix.parse().ok().filter(|p| *p <= 32)?))
}
