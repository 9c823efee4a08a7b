//! Where later commands find the cluster `ofctl up` (or `deploy/cluster.sh up`) started: a small
//! JSON file per user (`$XDG_CONFIG_HOME/sonic/config.json`, else `~/.config/sonic/config.json`,
//! mode 0600: `{"server", "token", "ca_file"}`), which `--server` / `SONIC_SERVER`, `SONIC_TOKEN`
//! and `SONIC_CA_FILE` override.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use serde::{Deserialize, Serialize};

/// The saved configuration.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
pub struct Saved {
    pub server: String,
    pub token: String,
    /// The CA the server's certificate is verified against (an `https://` cluster's own CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// The control plane a command talks to.
#[derive(Clone)]
pub struct Target {
    pub server: String,
    pub token: Option<String>,
    /// Verify the server against this CA (else the system's roots).
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// The configuration file's path for this user.
pub fn path() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => home()?.join(".config"),
    };
    Ok(base.join("sonic").join("config.json"))
}

/// The user's default data folder for `ofctl up`.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => home()?.join(".local").join("share"),
    };
    Ok(base.join("sonic"))
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("HOME is not set: set XDG_CONFIG_HOME or HOME"))
}

/// Reads the saved configuration; `None` when there is none.
pub fn load(path: &Path) -> anyhow::Result<Option<Saved>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Saves atomically (temporary file, then rename), readable by this user only.
pub fn save(path: &Path, saved: &Saved) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent folder", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(".config.json.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(serde_json::to_string_pretty(saved)?.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("cannot save {}: {e}", path.display())
    })
}

/// The target of a command: `--server` (or `SONIC_SERVER`, which clap folds into `server`), else
/// the saved server; `SONIC_TOKEN`, else the saved token.
pub fn resolve(server: Option<&str>) -> anyhow::Result<Target> {
    let env_token = std::env::var("SONIC_TOKEN").ok().filter(|t| !t.is_empty());
    let saved = load(&path()?)?;
    let server = match (server, &saved) {
        (Some(s), _) => s.to_owned(),
        (None, Some(saved)) => saved.server.clone(),
        (None, None) => {
            return Err(anyhow!(
                "no control plane known: start one with `ofctl up`, or pass --server URL (or set SONIC_SERVER)"
            ));
        }
    };
    let env_ca = std::env::var_os("SONIC_CA_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let ca_file = env_ca.or_else(|| saved.as_ref().and_then(|s| s.ca_file.clone()));
    let token = env_token.or_else(|| saved.map(|s| s.token));
    Ok(Target {
        server: server.trim_end_matches('/').to_owned(),
        token,
        ca_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sonic").join("config.json");
        assert_eq!(load(&p).expect("load"), None);
        let saved = Saved {
            server: "http://127.0.0.1:7000".into(),
            token: "0123456789abcdef".into(),
            ca_file: Some("/etc/sonic/ca.pem".into()),
        };
        save(&p, &saved).expect("save");
        assert_eq!(load(&p).expect("load"), Some(saved.clone()));
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!format!("{saved:?}").contains("0123456789abcdef"));
    }
}
