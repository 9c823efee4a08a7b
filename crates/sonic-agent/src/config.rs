//! The agent's configuration: a YAML file, overridden by flags and environment, with sane defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

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

/// Where `remote` files go.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreChoice {
    /// An S3-compatible endpoint.
    S3(sonic_storage::s3::S3Config),
    /// A directory shared by every agent of this machine (tests, single-machine clusters).
    Local { root: PathBuf },
}

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
    /// The VM type's network bandwidth in megabits per second; egress and ingress are limited to it.
    /// `None` leaves the network unlimited.
    pub network_mbps: Option<f64>,
    /// The control plane to register with and send heartbeats to; `None` runs standalone.
    pub control_url: Option<String>,
    /// Bearer token the control plane presents on every call (and the agent on registration).
    pub token: String,
    /// Key of the HMAC file tokens the control plane issues for `direct` transfers.
    pub file_key: String,
    pub sandbox: SandboxChoice,
    /// How long a warm container is kept after its last run.
    pub warm_idle_s: u64,
    pub heartbeat_interval_ms: u64,
    pub store: Option<StoreChoice>,
    /// Makes the store answer like a remote one (request latency, one connection's throughput):
    /// the evaluation's emulated cluster, where the store runs on the same machine. `None`: as is.
    pub store_profile: Option<sonic_storage::emulated::StoreProfile>,
    /// Folders searched first for a command's executable by the process sandbox.
    pub bin_dirs: Vec<PathBuf>,
    /// Most megabytes one function instance may write (its outputs, its log; no single file
    /// larger); past it the instance is killed and fails. A run request may ask for less.
    pub output_quota_mb: u64,
}

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
            control_url: None,
            token: String::new(),
            file_key: String::new(),
            sandbox: SandboxChoice::Auto,
            warm_idle_s: 60,
            heartbeat_interval_ms: 2000,
            store: None,
            store_profile: None,
            bin_dirs: Vec::new(),
            output_quota_mb: DEFAULT_OUTPUT_QUOTA_MB,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
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
    #[arg(long, env = "SONIC_CONTROL_URL")]
    pub control_url: Option<String>,
    #[arg(long, env = "SONIC_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[arg(long, env = "SONIC_FILE_KEY", hide_env_values = true)]
    pub file_key: Option<String>,
    #[arg(long, env = "SONIC_AGENT_SANDBOX", value_enum)]
    pub sandbox: Option<SandboxChoice>,
    /// A local directory standing in for the object store.
    #[arg(long, env = "SONIC_AGENT_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// A folder searched first for lambda executables by the process sandbox (repeatable).
    #[arg(long = "bin-dir")]
    pub bin_dirs: Vec<PathBuf>,
    /// Most megabytes one function instance may write before it is killed.
    #[arg(long, env = "SONIC_AGENT_OUTPUT_QUOTA_MB")]
    pub output_quota_mb: Option<u64>,
}

impl AgentConfig {
    /// Parses a YAML configuration; `path` names it in errors.
    pub fn from_yaml(path: &str, text: &str) -> Result<AgentConfig, ConfigError> {
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e
                .to_string()
                .lines()
                .next()
                .unwrap_or("invalid YAML")
                .to_owned(),
        })
    }

    /// The file named by `args.config` (if any), then every flag or variable that is set.
    pub fn load(args: &AgentArgs) -> Result<AgentConfig, ConfigError> {
        let mut cfg = match &args.config {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                AgentConfig::from_yaml(&shown, &text)?
            }
            None => AgentConfig::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &args.$f { cfg.$f = v.clone(); } )* };
        }
        set!(
            id,
            listen,
            data_dir,
            vm_type,
            vcpus,
            memory_mb,
            token,
            file_key,
            sandbox,
            output_quota_mb
        );
        if args.advertise_url.is_some() {
            cfg.advertise_url = args.advertise_url.clone();
        }
        if args.network_mbps.is_some() {
            cfg.network_mbps = args.network_mbps;
        }
        if args.control_url.is_some() {
            cfg.control_url = args.control_url.clone();
        }
        if !args.bin_dirs.is_empty() {
            cfg.bin_dirs = args.bin_dirs.clone();
        }
        if let Some(root) = &args.store_dir {
            cfg.store = Some(StoreChoice::Local { root: root.clone() });
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
        if self.token.len() < 16 {
            return bad("token: set a secret of at least 16 characters (SONIC_AGENT_TOKEN)");
        }
        if self.file_key.len() < 16 {
            return bad("file_key: set a secret of at least 16 characters (SONIC_FILE_KEY)");
        }
        Ok(())
    }

    /// The URL this agent is reached at.
    pub fn url(&self) -> String {
        self.advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
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
            ..AgentArgs::default()
        };
        let cfg = AgentConfig::load(&args).expect("load");
        assert_eq!(cfg.id, "a-7");
        assert_eq!(cfg.vm_type, "m5.2xlarge");
        assert_eq!(cfg.network_mbps, Some(1250.0));
        assert_eq!(cfg.heartbeat_interval_ms, 2000);
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
