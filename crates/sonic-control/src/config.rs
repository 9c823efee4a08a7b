//! The control plane's configuration: a YAML file, overridden by flags and environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sonic_core::units::{ByteSize, Seconds};

/// The shortest token accepted: a guessable secret protects nothing.
pub const MIN_TOKEN_LEN: usize = 16;

/// Everything the control plane needs to start.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Where the SQLite database (`sonic.db`) lives.
    pub data_dir: PathBuf,
    /// The bearer token every client (ofctl, agents) presents.
    pub token: String,
    /// An agent silent for longer than this is not alive (`10s`, `1500ms`, ...).
    pub heartbeat_timeout: Seconds,
    /// The VM catalog file (interfaces.md); read by the planner once jobs run.
    pub catalog: Option<String>,
    /// Request bodies larger than this are refused with 413 (`1MiB`, ...).
    pub max_body: ByteSize,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7000)),
            data_dir: PathBuf::from("/var/lib/sonic-control"),
            token: String::new(),
            heartbeat_timeout: Seconds(10.0),
            catalog: None,
            max_body: ByteSize(1024 * 1024),
        }
    }
}

impl std::fmt::Debug for ControlConfig {
    // Hand-written so the token never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlConfig")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("token", &"<redacted>")
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("catalog", &self.catalog)
            .field("max_body", &self.max_body)
            .finish()
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
    name = "sonic-control",
    about = "Sonic's control plane: DAG and agent registry, job planning and scheduling"
)]
pub struct ControlArgs {
    /// A YAML configuration file.
    #[arg(long, env = "SONIC_CONTROL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7000.
    #[arg(long, env = "SONIC_CONTROL_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory of the SQLite database.
    #[arg(long, env = "SONIC_CONTROL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Bearer token clients and agents present (at least 16 characters).
    #[arg(long, env = "SONIC_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Agent heartbeat timeout, e.g. 10s.
    #[arg(long, env = "SONIC_HEARTBEAT_TIMEOUT")]
    pub heartbeat_timeout: Option<Seconds>,
    /// The VM catalog file.
    #[arg(long, env = "SONIC_CATALOG")]
    pub catalog: Option<String>,
    /// Largest request body, e.g. 1MiB.
    #[arg(long, env = "SONIC_MAX_BODY")]
    pub max_body: Option<ByteSize>,
}

impl ControlConfig {
    /// Parses a YAML configuration; `path` names it in errors.
    pub fn from_yaml(path: &str, text: &str) -> Result<ControlConfig, ConfigError> {
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

    /// The file named by `args.config` (if any), then every flag or variable that is set; checked.
    pub fn load(args: &ControlArgs) -> Result<ControlConfig, ConfigError> {
        let mut cfg = match &args.config {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                ControlConfig::from_yaml(&shown, &text)?
            }
            None => ControlConfig::default(),
        };
        if let Some(v) = args.listen {
            cfg.listen = v;
        }
        if let Some(v) = &args.data_dir {
            cfg.data_dir = v.clone();
        }
        if let Some(v) = &args.token {
            cfg.token = v.clone();
        }
        if let Some(v) = args.heartbeat_timeout {
            cfg.heartbeat_timeout = v;
        }
        if let Some(v) = &args.catalog {
            cfg.catalog = Some(v.clone());
        }
        if let Some(v) = args.max_body {
            cfg.max_body = v;
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// Refuses settings the control plane cannot run with.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.token.len() < MIN_TOKEN_LEN {
            return Err(ConfigError::Invalid(format!(
                "token: set a secret of at least {MIN_TOKEN_LEN} characters (SONIC_TOKEN)"
            )));
        }
        let t = self.heartbeat_timeout.0;
        if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
            return Err(ConfigError::Invalid(
                "heartbeat_timeout must be positive and at most a day".into(),
            ));
        }
        if self.max_body.0 < 1024 || self.max_body.0 > 1024 * 1024 * 1024 {
            return Err(ConfigError::Invalid(
                "max_body must be between 1KiB and 1GiB".into(),
            ));
        }
        Ok(())
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_timeout.0.max(0.0))
    }

    pub fn max_body_bytes(&self) -> usize {
        usize::try_from(self.max_body.0).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_flags() {
        let yaml = "listen: 127.0.0.1:7123\ntoken: 0123456789abcdef\nheartbeat_timeout: 1500ms\nmax_body: 2MiB\ncatalog: catalog.yaml\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("control.yaml");
        std::fs::write(&path, yaml).expect("write");
        let args = ControlArgs {
            config: Some(path),
            data_dir: Some(dir.path().join("data")),
            ..ControlArgs::default()
        };
        let cfg = ControlConfig::load(&args).expect("load");
        assert_eq!(cfg.listen.port(), 7123);
        assert_eq!(cfg.heartbeat_timeout(), Duration::from_millis(1500));
        assert_eq!(cfg.max_body_bytes(), 2 * 1024 * 1024);
        assert_eq!(cfg.catalog.as_deref(), Some("catalog.yaml"));
        assert_eq!(cfg.data_dir, dir.path().join("data"));
        assert!(
            !format!("{cfg:?}").contains("0123456789abcdef"),
            "token redacted"
        );
    }

    #[test]
    fn refuses_weak_token_and_unknown_keys() {
        let weak = ControlConfig {
            token: "short".into(),
            ..ControlConfig::default()
        };
        assert!(matches!(weak.check(), Err(ConfigError::Invalid(m)) if m.contains("token")));
        assert!(matches!(
            ControlConfig::from_yaml("c.yaml", "listne: 1.2.3.4:5\n"),
            Err(ConfigError::Parse { path, .. }) if path == "c.yaml"
        ));
    }
}
