//! A lambda's `requirements.txt`: pinned packages from PyPI, installed into a Python virtual
//! environment of its own, one per requirements set.
//!
//! Only exact pins (`name==version`, blank lines and `#` comments) are accepted
//! ([`Requirements::parse`]); anything else is refused before anything is installed. The
//! environment of a set is `<root>/<sha256 of the set>/`, made with `python -m venv` and filled by
//! `pip install --no-input --disable-pip-version-check -r`, with pip's cache in the data folder,
//! under a time bound. It is built once: concurrent callers of [`Venvs::ensure`] for one set wait
//! for the same build, and a folder counts only once its build finished (a marker file), so a
//! build cut short is started again from scratch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The file a lambda's pins are read from, at the top of its folder.
pub const REQUIREMENTS_FILE: &str = "requirements.txt";
/// The longest a `requirements.txt` may be.
pub const MAX_REQUIREMENTS: u64 = 64 * 1024;
/// How long one environment's build (venv and pip) may take by default.
pub const DEFAULT_PIP_TIMEOUT: Duration = Duration::from_secs(300);
/// Written in an environment's folder when its build finished.
const READY: &str = ".sonic-ready";

/// A lambda's pins, checked and put in a canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirements {
    /// `(normalized name, version)`, sorted by name.
    pins: Vec<(String, String)>,
    sha256: String,
}

/// Why a `requirements.txt` was refused.
#[derive(Debug, thiserror::Error)]
pub enum RequirementsError {
    /// A line that is not an exact pin.
    #[error(
        "requirements.txt line {line}: `{text}` is not pinned as name==version (only exact pins \
         are installed: no ranges, options, URLs, extras or markers)"
    )]
    NotPinned {
        /// 1-based.
        line: usize,
        /// The line as written.
        text: String,
    },
    /// One package pinned twice.
    #[error("requirements.txt pins {0} more than once")]
    Duplicate(String),
    /// Larger than [`MAX_REQUIREMENTS`].
    #[error("requirements.txt is larger than {MAX_REQUIREMENTS} bytes")]
    TooLarge,
    /// Not UTF-8, or unreadable.
    #[error("requirements.txt: {0}")]
    Io(#[from] std::io::Error),
}

/// A PEP 508 name: letters and digits, with `.`, `_`, `-` inside.
fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// A PEP 440 version as written in an exact pin (no wildcard).
fn valid_version(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'!' | b'+' | b'_' | b'-'))
}

/// PEP 503: lowercase, runs of `-`, `_`, `.` as one `-`.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

impl Requirements {
    /// Checks `text`: every line blank, a `#` comment, or `name==version` (spaces around `==`
    /// and a trailing ` # comment` allowed). `None` when it pins nothing.
    pub fn parse(text: &str) -> Result<Option<Requirements>, RequirementsError> {
        let mut pins: Vec<(String, String)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let refuse = || RequirementsError::NotPinned {
                line: i + 1,
                text: raw.trim().chars().take(200).collect(),
            };
            let mut line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(at) = line.find(" #").or_else(|| line.find("\t#")) {
                line = line[..at].trim_end();
            }
            let Some((name, version)) = line.split_once("==") else {
                return Err(refuse());
            };
            let (name, version) = (name.trim(), version.trim());
            if !valid_name(name) || !valid_version(version) {
                return Err(refuse());
            }
            let name = normalize(name);
            if pins.iter().any(|(n, _)| *n == name) {
                return Err(RequirementsError::Duplicate(name));
            }
            pins.push((name, version.to_owned()));
        }
        if pins.is_empty() {
            return Ok(None);
        }
        pins.sort();
        let mut r = Requirements {
            pins,
            sha256: String::new(),
        };
        r.sha256 = crate::package::sha256_hex(r.text().as_bytes());
        Ok(Some(r))
    }

    /// Reads and checks `<dir>/requirements.txt`; `None` when there is none or it pins nothing.
    /// Blocking.
    pub fn load(dir: &Path) -> Result<Option<Requirements>, RequirementsError> {
        let path = dir.join(REQUIREMENTS_FILE);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if meta.len() > MAX_REQUIREMENTS {
            return Err(RequirementsError::TooLarge);
        }
        let bytes = std::fs::read(&path)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8"))?;
        Requirements::parse(&text)
    }

    /// The pins as pip is given them: `name==version` lines, sorted by normalized name.
    pub fn text(&self) -> String {
        self.pins
            .iter()
            .map(|(n, v)| format!("{n}=={v}\n"))
            .collect()
    }

    /// The SHA-256 of [`Requirements::text`]: the name of its environment.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

/// Why an environment could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VenvError {
    /// `python -m venv` failed.
    #[error("cannot create the lambda's environment with `{python} -m venv`: {detail}")]
    Venv {
        /// The interpreter.
        python: String,
        /// Its last lines, or why it did not start.
        detail: String,
    },
    /// pip failed: its last lines.
    #[error("pip install of requirements.txt failed ({status}):\n{tail}")]
    Pip {
        /// pip's exit status.
        status: String,
        /// pip's last lines.
        tail: String,
    },
    /// The build did not finish in time (pip was killed).
    #[error("pip install of requirements.txt did not finish within {0:?}")]
    Timeout(Duration),
    /// Disk.
    #[error("the lambda's environment: {0}")]
    Io(#[from] std::io::Error),
}

/// A build of one environment somewhere else than with a host interpreter (e.g. in a
/// container of the image its runs will use): called with the environment's folder (not there
/// yet), pip's cache folder and the pins; it makes the folder and installs the pins into it.
/// Dropping its future must stop the build (the time bound drops it).
pub type BuildFn = Arc<
    dyn Fn(
            PathBuf,
            PathBuf,
            Requirements,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), VenvError>> + Send>>
        + Send
        + Sync,
>;

/// The environments of one host: `<root>/<sha256>/`, pip's cache in `pip_cache`.
pub struct Venvs {
    root: PathBuf,
    pip_cache: PathBuf,
    python: PathBuf,
    timeout: Duration,
    builder: Option<BuildFn>,
    builds: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pulled: Arc<Mutex<Pulled>>,
}

/// The packages runs needed: each pin counted once, when a run first needs it, with its share
/// of its environment's build time. OpenLambda's worker counts the packages it pulls
/// (`pull-package`), which it does when a lambda first runs; Sonic builds a lambda's environment
/// when the lambda is uploaded (a bad `requirements.txt` is refused then), and counts its
/// packages when a run first needs them, so the counter reads as OpenLambda's.
#[derive(Debug, Default)]
struct Pulled {
    pins: std::collections::BTreeSet<(String, String)>,
    cnt: u64,
    total_ms: f64,
    /// Per environment built by this process (its requirements' digest): its build time, ms.
    built_ms: HashMap<String, f64>,
}

impl std::fmt::Debug for Venvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Venvs")
            .field("root", &self.root)
            .field("pip_cache", &self.pip_cache)
            .field("python", &self.python)
            .field("timeout", &self.timeout)
            .field("builder", &self.builder.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// The last `n` non-empty lines of `bytes`.
fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The environment pip and `venv` run with: the daemon's own minus its secrets (what reaches
/// PyPI: proxies, certificates, pip's own settings) plus pip's cache.
fn build_env(cmd: &mut tokio::process::Command, pip_cache: &Path) {
    cmd.env_clear();
    for (k, v) in std::env::vars_os() {
        let Some(key) = k.to_str() else { continue };
        let keep = matches!(
            key,
            "PATH" | "HOME" | "LANG" | "LC_ALL" | "TMPDIR" | "SSL_CERT_FILE" | "SSL_CERT_DIR"
        ) || key.starts_with("PIP_")
            || key.eq_ignore_ascii_case("http_proxy")
            || key.eq_ignore_ascii_case("https_proxy")
            || key.eq_ignore_ascii_case("no_proxy")
            || key == "REQUESTS_CA_BUNDLE";
        if keep {
            cmd.env(k, v);
        }
    }
    cmd.env("PIP_CACHE_DIR", pip_cache);
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
}

impl Venvs {
    /// Environments under `root`, made with the interpreter `python`, pip's cache in
    /// `pip_cache`, each build bounded by `timeout`.
    pub fn new(root: PathBuf, pip_cache: PathBuf, python: PathBuf, timeout: Duration) -> Venvs {
        Venvs {
            root,
            pip_cache,
            python,
            timeout,
            builder: None,
            builds: Mutex::new(HashMap::new()),
            pulled: Arc::default(),
        }
    }

    /// The packages runs needed so far ([`Venvs::needed_by_a_run`]), each pin once: how many,
    /// and the milliseconds of their builds, shared among each environment's pins.
    pub fn pulled(&self) -> (u64, f64) {
        let p = self.pulled.lock().unwrap_or_else(|e| e.into_inner());
        (p.cnt, p.total_ms)
    }

    /// A run starts with `reqs`'s environment: counts the pins no run needed before.
    pub fn needed_by_a_run(&self, reqs: &Requirements) {
        let mut p = self.pulled.lock().unwrap_or_else(|e| e.into_inner());
        let share =
            p.built_ms.get(reqs.sha256()).copied().unwrap_or(0.0) / reqs.pins.len().max(1) as f64;
        for pin in &reqs.pins {
            if p.pins.insert(pin.clone()) {
                p.cnt += 1;
                p.total_ms += share;
            }
        }
    }

    /// Environments under `root` made by `builder` instead of a host interpreter (the same
    /// markers, time bound and one-build-per-set as [`Venvs::new`]).
    pub fn with_builder(
        root: PathBuf,
        pip_cache: PathBuf,
        builder: BuildFn,
        timeout: Duration,
    ) -> Venvs {
        Venvs {
            builder: Some(builder),
            ..Venvs::new(root, pip_cache, PathBuf::from("python3"), timeout)
        }
    }

    /// The folder of `reqs`'s environment (it may not be built yet).
    pub fn dir_of(&self, reqs: &Requirements) -> PathBuf {
        self.root.join(reqs.sha256())
    }

    /// The interpreter of `reqs`'s environment (it may not be built yet).
    pub fn python_of(&self, reqs: &Requirements) -> PathBuf {
        self.root.join(reqs.sha256()).join("bin").join("python")
    }

    /// Whether `reqs`'s environment is built.
    pub fn ready(&self, reqs: &Requirements) -> bool {
        self.root.join(reqs.sha256()).join(READY).is_file()
    }

    /// The interpreter of `reqs`'s environment, built first if it is not: once, whoever asks at
    /// the same time waits for the same build. A failed build leaves nothing behind. The build
    /// runs on a task of its own: a caller that gives up (a run stopped, a request dropped) does
    /// not stop it, and the next caller finds it built or waits for it.
    pub async fn ensure(&self, reqs: &Requirements) -> Result<PathBuf, VenvError> {
        if self.ready(reqs) {
            return Ok(self.python_of(reqs));
        }
        let lock = {
            let mut builds = self.builds.lock().unwrap_or_else(|e| e.into_inner());
            builds.entry(reqs.sha256().to_owned()).or_default().clone()
        };
        let build = Build {
            dir: self.root.join(reqs.sha256()),
            root: self.root.clone(),
            pip_cache: self.pip_cache.clone(),
            python: self.python.clone(),
            timeout: self.timeout,
            reqs: reqs.clone(),
            builder: self.builder.clone(),
            pulled: self.pulled.clone(),
        };
        let task = tokio::spawn(async move {
            let _one = lock.lock().await;
            build.run().await
        });
        match task.await {
            Ok(built) => built.map(|()| self.python_of(reqs)),
            Err(e) => Err(VenvError::Io(std::io::Error::other(e.to_string()))),
        }
    }
}

/// One environment's build, owned by its task.
struct Build {
    dir: PathBuf,
    root: PathBuf,
    pip_cache: PathBuf,
    python: PathBuf,
    timeout: Duration,
    reqs: Requirements,
    builder: Option<BuildFn>,
    pulled: Arc<Mutex<Pulled>>,
}

impl Build {
    async fn run(self) -> Result<(), VenvError> {
        if self.dir.join(READY).is_file() {
            return Ok(());
        }
        // What an interrupted build left.
        let _ = tokio::fs::remove_dir_all(&self.dir).await;
        tokio::fs::create_dir_all(&self.root).await?;
        tokio::fs::create_dir_all(&self.pip_cache).await?;
        let t0 = std::time::Instant::now();
        let build: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), VenvError>> + Send + '_>,
        > = match &self.builder {
            Some(b) => b(self.dir.clone(), self.pip_cache.clone(), self.reqs.clone()),
            None => Box::pin(self.build()),
        };
        let built = tokio::time::timeout(self.timeout, build)
            .await
            .unwrap_or(Err(VenvError::Timeout(self.timeout)));
        match built {
            Ok(()) => {
                tokio::fs::write(self.dir.join(READY), self.reqs.text()).await?;
                let ms = t0.elapsed().as_secs_f64() * 1000.0;
                self.pulled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .built_ms
                    .insert(self.reqs.sha256().to_owned(), ms);
                tracing::info!(
                    sha256 = %self.reqs.sha256(),
                    secs = t0.elapsed().as_secs_f64(),
                    "lambda environment built"
                );
                Ok(())
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&self.dir).await;
                Err(e)
            }
        }
    }

    /// Whether the interpreter's own pip can install into another environment (`--python`,
    /// pip 22.3 and later): then the environment is made without pip, which is much faster.
    async fn host_pip(&self) -> bool {
        let mut cmd = tokio::process::Command::new(&self.python);
        cmd.args(["-m", "pip", "--version"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        build_env(&mut cmd, &self.pip_cache);
        let Ok(out) = cmd.output().await else {
            return false;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.split_whitespace().nth(1).unwrap_or("");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        out.status.success() && (major, minor) >= (22, 3)
    }

    async fn build(&self) -> Result<(), VenvError> {
        let dir = &self.dir;
        let host_pip = self.host_pip().await;
        let mut venv = tokio::process::Command::new(&self.python);
        venv.args(["-m", "venv"]);
        if host_pip {
            venv.arg("--without-pip");
        }
        venv.arg(dir).stdin(Stdio::null()).kill_on_drop(true);
        build_env(&mut venv, &self.pip_cache);
        let python = self.python.display().to_string();
        let out = venv.output().await.map_err(|e| VenvError::Venv {
            python: python.clone(),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            let mut detail = tail(&out.stderr, 6);
            if detail.is_empty() {
                detail = tail(&out.stdout, 6);
            }
            return Err(VenvError::Venv { python, detail });
        }
        let list = dir.join(REQUIREMENTS_FILE);
        tokio::fs::write(&list, self.reqs.text()).await?;
        let env_python = dir.join("bin").join("python");
        let mut pip = if host_pip {
            let mut c = tokio::process::Command::new(&self.python);
            c.args(["-m", "pip", "--python"]).arg(&env_python);
            c
        } else {
            let mut c = tokio::process::Command::new(&env_python);
            c.args(["-m", "pip"]);
            c
        };
        pip.args(["install", "--no-input", "--disable-pip-version-check", "-r"])
            .arg(&list)
            .current_dir(dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        build_env(&mut pip, &self.pip_cache);
        let out = pip.output().await.map_err(|e| VenvError::Pip {
            status: "did not start".into(),
            tail: e.to_string(),
        })?;
        if !out.status.success() {
            let mut lines = tail(&out.stderr, 8);
            if lines.is_empty() {
                lines = tail(&out.stdout, 8);
            }
            return Err(VenvError::Pip {
                status: out.status.to_string(),
                tail: lines,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_only() {
        let r = Requirements::parse("# numbers\n\nNumPy == 1.26.4\nsix==1.16.0  # tiny\n")
            .expect("parse")
            .expect("pins");
        assert_eq!(r.text(), "numpy==1.26.4\nsix==1.16.0\n");
        // Order, case and spacing do not make another set.
        let same = Requirements::parse("six==1.16.0\nnumpy==1.26.4")
            .expect("parse")
            .expect("pins");
        assert_eq!(r.sha256(), same.sha256());
        let other = Requirements::parse("six==1.17.0\nnumpy==1.26.4")
            .expect("parse")
            .expect("pins");
        assert_ne!(r.sha256(), other.sha256());
        assert!(
            Requirements::parse("# nothing\n\n")
                .expect("parse")
                .is_none()
        );
        for bad in [
            "numpy",
            "numpy>=1.26",
            "numpy==1.*",
            "numpy===1.26.4",
            "numpy[extra]==1.26.4",
            "numpy==1.26.4; python_version>'3'",
            "-r other.txt",
            "--index-url http://example.com/simple",
            "-e .",
            "git+https://example.com/x.git",
            "numpy==1.26.4 --hash=sha256:00",
            "numpy==",
        ] {
            let err = Requirements::parse(&format!("six==1.16.0\n{bad}\n")).expect_err(bad);
            let msg = err.to_string();
            assert!(
                msg.contains("line 2") && msg.contains("not pinned as name==version"),
                "{bad}: {msg}"
            );
        }
        let dup = Requirements::parse("six==1.16.0\nSix==1.17.0").expect_err("dup");
        assert!(dup.to_string().contains("six more than once"), "{dup}");
    }

    #[test]
    fn load_reads_the_file_at_the_top() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(Requirements::load(dir.path()).expect("none").is_none());
        std::fs::write(dir.path().join(REQUIREMENTS_FILE), "six==1.16.0\n").expect("write");
        let r = Requirements::load(dir.path()).expect("load").expect("pins");
        assert_eq!(r.text(), "six==1.16.0\n");
        std::fs::write(dir.path().join(REQUIREMENTS_FILE), b"six==1.16.0\n\xff\n").expect("w");
        assert!(Requirements::load(dir.path()).is_err());
    }
}
