//! The agent's configuration: a YAML file, overridden by flags and environment, with sane defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sonic_daemon::TlsFiles;

pub use sonic_daemon::ConfigError;

/// Which sandbox runs the lambdas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SandboxChoice {
    /// Docker when an engine answers, else processes.
    #[default]
    Auto,
    Docker,
    Process,
}

impl SandboxChoice {
    /// As written in a configuration file.
    pub fn name(self) -> &'static str {
        match self {
            SandboxChoice::Auto => "auto",
            SandboxChoice::Docker => "docker",
            SandboxChoice::Process => "process",
        }
    }
}

pub use sonic_storage::StoreChoice;

/// The default of `output_quota_mb`: 10 GiB per instance.
pub const DEFAULT_OUTPUT_QUOTA_MB: u64 = 10 * 1024;
/// The largest `output_quota_mb` (1 TiB): the quota in bytes must fit Docker's 64-bit ulimits.
pub const MAX_OUTPUT_QUOTA_MB: u64 = 1 << 20;

/// Everything an agent needs to start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// This agent's id, unique in the cluster.
    pub id: String,
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// URL peers and the control plane use to reach this agent; default `http://<listen>`.
    pub advertise_url: Option<String>,
    /// Where job files and sandbox scratch live.
    pub data_dir: PathBuf,
    /// The VM type this agent stands for (a name of the catalog).
    pub vm_type: String,
    pub vcpus: u32,
    pub memory_mb: u64,
    /// The VM type's network bandwidth in megabits per second, declared to the control plane;
    /// with `limit_network`, egress and ingress are limited to it. `None` leaves the network
    /// unlimited.
    pub network_mbps: Option<f64>,
    /// Whether the agent limits its own streams to `network_mbps` (default). `false`: it only
    /// declares the rate, because something outside the agent limits the VM's network (a real
    /// VM's NIC, or deploy/cluster.sh's links shaped by Linux traffic control).
    pub limit_network: bool,
    /// The control plane to register with and send heartbeats to; `None` runs standalone.
    pub control_url: Option<String>,
    /// Bearer token the control plane presents on every call (and the agent on registration).
    /// Empty with a `join_token`: the control plane hands it out when the agent joins.
    pub token: String,
    /// Key of the HMAC file tokens the control plane issues for `direct` transfers. Empty with a
    /// `join_token`: the control plane hands it out when the agent joins.
    pub file_key: String,
    /// The secret that lets this agent join the control plane at `control_url`; what the agent
    /// needs for jobs (the token, the file key, the store) comes back over that channel.
    pub join_token: String,
    /// Serve HTTPS with this certificate and key (peers and the control plane verify it).
    pub tls: Option<TlsFiles>,
    /// The CA that signed the control plane's and the peers' certificates; without it, the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    pub sandbox: SandboxChoice,
    /// With `sandbox: auto`, whether lambdas may run as unconfined host processes (under the
    /// agent's user) when Docker or its lambda image is missing (default true, said with a
    /// warning); false refuses to start instead (`--process-fallback false`,
    /// `SONIC_AGENT_PROCESS_FALLBACK=false`).
    pub process_fallback: bool,
    /// How long a warm container (process environment) is kept after its last run, seconds
    /// (flag `--warm-idle-s`, `SONIC_AGENT_WARM_IDLE_S`; docs/agent.md, warm starts).
    pub warm_idle_s: u64,
    pub heartbeat_interval_ms: u64,
    pub store: Option<StoreChoice>,
    /// The in-memory tier `memory` edges pass through (`redis://host:port`); with a join token
    /// and none set, the control plane's comes back at joining. None: a `memory` upload goes
    /// to the store.
    pub memory_tier: Option<String>,
    /// Makes the store answer like a remote one (request latency, one connection's throughput):
    /// the evaluation's emulated cluster, where the store runs on the same machine. `None`: as is.
    pub store_profile: Option<sonic_storage::emulated::StoreProfile>,
    /// Folders searched first for a command's executable by the process sandbox.
    pub bin_dirs: Vec<PathBuf>,
    /// Most megabytes one function instance may write (its outputs, its log; no single file
    /// larger); past it the instance is killed and fails. A run request may ask for less.
    pub output_quota_mb: u64,
    /// The image the Docker sandbox runs Python handler stages in (`deploy/build-python-image.sh`
    /// builds it; docs/python.md). Not used by the process sandbox.
    pub python_image: String,
}

/// The image `deploy/build-python-image.sh` builds: Debian's python3 and `sonic-launcher`.
pub const PYTHON_IMAGE: &str = "sonic-python:latest";

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            id: "agent-1".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            advertise_url: None,
            data_dir: PathBuf::from("/var/lib/sonic-agent"),
            vm_type: "m5.large".into(),
            vcpus: 2,
            memory_mb: 8192,
            network_mbps: None,
            limit_network: true,
            control_url: None,
            token: String::new(),
            file_key: String::new(),
            join_token: String::new(),
            tls: None,
            ca_file: None,
            sandbox: SandboxChoice::Auto,
            process_fallback: true,
            warm_idle_s: sonic_core::warm::DEFAULT_KEEP_ALIVE_S,
            heartbeat_interval_ms: 2000,
            store: None,
            memory_tier: None,
            store_profile: None,
            bin_dirs: Vec::new(),
            output_quota_mb: DEFAULT_OUTPUT_QUOTA_MB,
            python_image: PYTHON_IMAGE.into(),
        }
    }
}

/// Command-line flags and environment variables; each overrides the file.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "sonic-agent",
    about = "Sonic's per-VM agent: runs lambdas and moves their files"
)]
pub struct AgentArgs {
    /// A YAML configuration file.
    #[arg(long, env = "SONIC_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "SONIC_AGENT_ID")]
    pub id: Option<String>,
    #[arg(long, env = "SONIC_AGENT_LISTEN")]
    pub listen: Option<SocketAddr>,
    #[arg(long, env = "SONIC_AGENT_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    #[arg(long, env = "SONIC_AGENT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[arg(long, env = "SONIC_AGENT_VM_TYPE")]
    pub vm_type: Option<String>,
    #[arg(long, env = "SONIC_AGENT_VCPUS")]
    pub vcpus: Option<u32>,
    #[arg(long, env = "SONIC_AGENT_MEMORY_MB")]
    pub memory_mb: Option<u64>,
    #[arg(long, env = "SONIC_AGENT_NETWORK_MBPS")]
    pub network_mbps: Option<f64>,
    /// false: declare network_mbps without limiting the agent's streams to it (the network is
    /// limited outside the agent, e.g. by traffic control).
    #[arg(long, env = "SONIC_AGENT_LIMIT_NETWORK")]
    pub limit_network: Option<bool>,
    /// false: with the auto sandbox, refuse to start rather than run lambdas as unconfined host
    /// processes when Docker or its lambda image is missing.
    #[arg(long, env = "SONIC_AGENT_PROCESS_FALLBACK")]
    pub process_fallback: Option<bool>,
    #[arg(long, env = "SONIC_CONTROL_URL")]
    pub control_url: Option<String>,
    #[arg(long, env = "SONIC_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[arg(long, env = "SONIC_FILE_KEY", hide_env_values = true)]
    pub file_key: Option<String>,
    /// The secret to join the control plane with (at least 16 characters).
    #[arg(long, env = "SONIC_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// PEM certificate to serve HTTPS with (with --tls-key).
    #[arg(long, env = "SONIC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SONIC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) the control plane's and peers' certificates are verified against.
    #[arg(long, env = "SONIC_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    #[arg(long, env = "SONIC_AGENT_SANDBOX", value_enum)]
    pub sandbox: Option<SandboxChoice>,
    /// A local directory standing in for the object store.
    #[arg(long, env = "SONIC_AGENT_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// The in-memory tier for `memory` edges, `redis://host:port`.
    #[arg(long, env = "SONIC_AGENT_MEMORY_TIER")]
    pub memory_tier: Option<String>,
    /// A folder searched first for lambda executables by the process sandbox (repeatable).
    #[arg(long = "bin-dir")]
    pub bin_dirs: Vec<PathBuf>,
    /// Most megabytes one function instance may write before it is killed.
    #[arg(long, env = "SONIC_AGENT_OUTPUT_QUOTA_MB")]
    pub output_quota_mb: Option<u64>,
    /// Seconds an idle warm container (process environment) is kept after its last run.
    #[arg(long, env = "SONIC_AGENT_WARM_IDLE_S")]
    pub warm_idle_s: Option<u64>,
    /// The image Python handler stages run in with the Docker sandbox.
    #[arg(long, env = "SONIC_AGENT_PYTHON_IMAGE")]
    pub python_image: Option<String>,
    /// Make the store answer like a remote one: wait this long before every request (ms;
    /// `store_profile.request_latency_ms`; a time-dilated cluster: deploy/cluster.sh --dilation).
    #[arg(long, env = "SONIC_AGENT_STORE_LATENCY_MS")]
    pub store_latency_ms: Option<f64>,
    /// One store connection's upload throughput, megabits per second (`store_profile.write_mbps`).
    #[arg(long, env = "SONIC_AGENT_STORE_WRITE_MBPS")]
    pub store_write_mbps: Option<f64>,
    /// One store connection's download throughput, megabits per second (`store_profile.read_mbps`).
    #[arg(long, env = "SONIC_AGENT_STORE_READ_MBPS")]
    pub store_read_mbps: Option<f64>,
    /// How log lines are written: text, or json (one object per line, with the run's span).
    #[arg(long, env = "SONIC_LOG_FORMAT", default_value = "text")]
    pub log_format: sonic_daemon::logging::LogFormat,
}

impl AgentConfig {
    /// Parses a YAML configuration; `path` names it in errors.
    pub fn from_yaml(path: &str, text: &str) -> Result<AgentConfig, ConfigError> {
        sonic_daemon::Layers::new().yaml_str(path, text).extract()
    }

    /// Defaults, then the file named by `args.config` (if any), then every flag or variable that
    /// is set; checked.
    pub fn load(args: &AgentArgs) -> Result<AgentConfig, ConfigError> {
        let a = args;
        let mut cfg: AgentConfig = sonic_daemon::Layers::new()
            .yaml_file(a.config.as_deref())
            .set("id", a.id.as_ref())
            .set("listen", a.listen)
            .set("advertise_url", a.advertise_url.as_ref())
            .set("data_dir", a.data_dir.as_ref())
            .set("vm_type", a.vm_type.as_ref())
            .set("vcpus", a.vcpus)
            .set("memory_mb", a.memory_mb)
            .set("network_mbps", a.network_mbps)
            .set("limit_network", a.limit_network)
            .set("process_fallback", a.process_fallback)
            .set("control_url", a.control_url.as_ref())
            .set("token", a.token.as_ref())
            .set("file_key", a.file_key.as_ref())
            .set("join_token", a.join_token.as_ref())
            .set("tls.cert", a.tls_cert.as_ref())
            .set("tls.key", a.tls_key.as_ref())
            .set("ca_file", a.ca_file.as_ref())
            .set("sandbox", a.sandbox.map(SandboxChoice::name))
            .set("store.local.root", a.store_dir.as_ref())
            .set("memory_tier", a.memory_tier.as_ref())
            .set("output_quota_mb", a.output_quota_mb)
            .set("warm_idle_s", a.warm_idle_s)
            .set("python_image", a.python_image.as_ref())
            .set("store_profile.request_latency_ms", a.store_latency_ms)
            .set("store_profile.write_mbps", a.store_write_mbps)
            .set("store_profile.read_mbps", a.store_read_mbps)
            .extract()?;
        if !args.bin_dirs.is_empty() {
            cfg.bin_dirs = args.bin_dirs.clone();
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// Refuses settings the agent cannot run with.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        if self.id.is_empty()
            || self.id.len() > 64
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return bad("id: letters, digits, '-', '_' and '.', at most 64");
        }
        if self.vcpus == 0 || self.memory_mb == 0 {
            return bad("vcpus and memory_mb must be positive");
        }
        if self.output_quota_mb == 0 || self.output_quota_mb > MAX_OUTPUT_QUOTA_MB {
            return bad("output_quota_mb: between 1 and 1048576 (1 TiB)");
        }
        if let Some(m) = self.network_mbps
            && !(m.is_finite() && m > 0.0)
        {
            return bad("network_mbps must be a positive number");
        }
        if self.joins() {
            sonic_daemon::secret::check("join_token (SONIC_JOIN_TOKEN)", &self.join_token)?;
            if self.control_url.is_none() {
                return bad(
                    "join_token needs control_url: the control plane to join (SONIC_CONTROL_URL)",
                );
            }
        } else {
            sonic_daemon::secret::check(
                "token (SONIC_AGENT_TOKEN), or a join_token (SONIC_JOIN_TOKEN) to get it from the control plane",
                &self.token,
            )?;
            sonic_daemon::secret::check("file_key (SONIC_FILE_KEY)", &self.file_key)?;
        }
        if let Some(p) = &self.store_profile {
            p.check().map_err(ConfigError::Invalid)?;
        }
        if let Some(url) = &self.advertise_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return bad("advertise_url must start with http:// or https://");
        }
        if let Some(url) = &self.memory_tier {
            sonic_storage::redis::check_url(url).map_err(ConfigError::Invalid)?;
        }
        Ok(())
    }

    /// Whether this agent joins with a join token (and learns its token and file key then).
    pub fn joins(&self) -> bool {
        !self.join_token.is_empty()
    }

    /// The URL this agent is reached at.
    pub fn url(&self) -> String {
        self.advertise_url.clone().unwrap_or_else(|| {
            format!(
                "{}://{}",
                sonic_daemon::tls::scheme(self.tls.is_some()),
                self.listen
            )
        })
    }

    pub fn jobs_dir(&self) -> PathBuf {
        self.data_dir.join("jobs")
    }

    pub fn scratch_dir(&self) -> PathBuf {
        self.data_dir.join("runs")
    }
}

/// Helper for tests and `ofctl up`: a configuration rooted in `dir` with the given secrets.
pub fn local_config(id: &str, dir: &Path, token: &str, file_key: &str) -> AgentConfig {
    AgentConfig {
        id: id.to_owned(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.to_path_buf(),
        token: token.to_owned(),
        file_key: file_key.to_owned(),
        ..AgentConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_flags() {
        let yaml = "id: a-7\nvm_type: m5.xlarge\nvcpus: 4\nmemory_mb: 16384\nnetwork_mbps: 1250\ntoken: 0123456789abcdef\nfile_key: fedcba9876543210\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, yaml).expect("write");
        let args = AgentArgs {
            config: Some(path),
            vm_type: Some("m5.2xlarge".into()),
            warm_idle_s: Some(300),
            ..AgentArgs::default()
        };
        let cfg = AgentConfig::load(&args).expect("load");
        assert!(
            cfg.limit_network,
            "an agent limits its own streams unless told not to"
        );
        let unlimited = AgentConfig::load(&AgentArgs {
            limit_network: Some(false),
            ..args.clone()
        })
        .expect("load");
        assert!(!unlimited.limit_network);
        assert!(
            cfg.process_fallback,
            "auto may fall back to processes unless told not to"
        );
        let strict = AgentConfig::load(&AgentArgs {
            process_fallback: Some(false),
            ..args.clone()
        })
        .expect("load");
        assert!(!strict.process_fallback);
        assert_eq!(
            unlimited.network_mbps,
            Some(1250.0),
            "the rate is still declared"
        );
        assert_eq!(cfg.id, "a-7");
        assert_eq!(cfg.warm_idle_s, 300);
        assert_eq!(cfg.vm_type, "m5.2xlarge");
        assert_eq!(cfg.network_mbps, Some(1250.0));
        assert_eq!(cfg.heartbeat_interval_ms, 2000);
        assert_eq!(cfg.store_profile, None);
    }

    #[test]
    fn store_profile_from_flags_a_figure_left_out_is_none() {
        let args = AgentArgs {
            token: Some("0123456789abcdef".into()),
            file_key: Some("fedcba9876543210".into()),
            store_latency_ms: Some(100.0),
            store_read_mbps: Some(100.0),
            ..AgentArgs::default()
        };
        let cfg = AgentConfig::load(&args).expect("load");
        let p = cfg.store_profile.expect("a profile");
        assert_eq!(
            (p.request_latency_ms, p.write_mbps, p.read_mbps),
            (100.0, 0.0, 100.0)
        );
        let bad = AgentArgs {
            store_write_mbps: Some(-1.0),
            ..args
        };
        assert!(AgentConfig::load(&bad).is_err());
    }

    #[test]
    fn refuses_bad_settings() {
        assert!(AgentConfig::from_yaml("a.yaml", "colour: red\n").is_err());
        let mut cfg = local_config("a", Path::new("/tmp"), "short", "0123456789abcdef");
        assert!(cfg.check().is_err());
        cfg.token = "0123456789abcdef".into();
        assert!(cfg.check().is_ok());
        cfg.id = "../x".into();
        assert!(cfg.check().is_err());
        cfg.id = "a".into();
        cfg.network_mbps = Some(-1.0);
        assert!(cfg.check().is_err());
    }
}
