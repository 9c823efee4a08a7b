//! The small SDK a Rust lambda uses to speak Sonic's file ABI (see `docs/` and the spec, §2).
//!
//! A lambda reads its inputs from `SONIC_INPUT_DIR` and writes its outputs under `SONIC_OUTPUT_DIR`:
//!
//! ```no_run
//! use sonic_lambda::Context;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = Context::from_env()?;
//!     let trees: u32 = ctx.param_or("trees", 4)?;
//!     let mut total = 0u64;
//!     for file in ctx.inputs_from("pca")? {
//!         total += std::fs::metadata(&file.path)?.len();
//!     }
//!     ctx.write_result("summary.txt", format!("{trees} trees, {total} bytes in").as_bytes())?;
//!     Ok(())
//! }
//! ```
//!
//! Every output file is written under a temporary name in its final directory and then renamed,
//! so the agent (and a downstream lambda) never sees a partial file.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Names of the environment variables of the ABI.
#[cfg(unix)]
pub mod process;

pub mod env {
    pub const JOB_ID: &str = "SONIC_JOB_ID";
    pub const FUNCTION: &str = "SONIC_FUNCTION";
    pub const INSTANCE: &str = "SONIC_INSTANCE";
    pub const INSTANCES: &str = "SONIC_INSTANCES";
    pub const INPUT_DIR: &str = "SONIC_INPUT_DIR";
    pub const OUTPUT_DIR: &str = "SONIC_OUTPUT_DIR";
    pub const PARAMS: &str = "SONIC_PARAMS";
    /// Prefix of `SONIC_FANOUT_<TO>`.
    pub const FANOUT_PREFIX: &str = "SONIC_FANOUT_";
}

/// The protocol between the Docker sandbox and `sonic-launcher`, the program that keeps a warm
/// container alive and starts lambdas in it (much faster than `docker exec`).
///
/// The sandbox bind-mounts a control folder (at [`launcher::CTL_DIR`] in the container). For a run
/// named `r`, it writes the request to `r.json`, creates the FIFO `r.done`, and writes the line
/// `r` to the FIFO `requests`. The launcher starts the command with its output in `r.log`, waits
/// for it, and writes one JSON [`launcher::Report`] line to `r.done`.
pub mod launcher {
    use serde::{Deserialize, Serialize};

    /// Where the control folder is mounted in the container.
    pub const CTL_DIR: &str = "/sonic/ctl";
    /// The FIFO the launcher reads run names from, one a line.
    pub const REQUESTS: &str = "requests";

    /// The request file of run `run`.
    pub fn request_file(run: &str) -> String {
        format!("{run}.json")
    }
    /// The file that receives the standard output and error of run `run`.
    pub fn log_file(run: &str) -> String {
        format!("{run}.log")
    }
    /// The FIFO the launcher writes the [`Report`] of run `run` to.
    pub fn done_fifo(run: &str) -> String {
        format!("{run}.done")
    }

    /// What to start.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Request {
        /// Executable (looked up in the launcher's PATH) and arguments.
        pub cmd: Vec<String>,
        /// Added to the launcher's own environment (the image's).
        pub env: Vec<(String, String)>,
        /// Working directory of the command.
        pub cwd: String,
    }

    /// How the run ended.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Report {
        /// When the command was started (Unix time, ns), to measure the start latency.
        pub spawned_unix_ns: Option<u64>,
        /// Exit status, when the command exited.
        pub exit_code: Option<i32>,
        /// Signal number, when a signal killed the command.
        pub signal: Option<i32>,
        /// Peak resident set size of the command and its waited-for children (wait4), KiB.
        pub max_rss_kib: Option<u64>,
        /// Why the command could not be started (then no exit code or signal).
        pub error: Option<String>,
        /// `ENOENT` or `EACCES`-like failures to start, as a shell would report them (127, 126).
        pub error_exit_code: Option<i32>,
    }
}

/// The folder of the job's own input inside the input directory.
pub const JOB_INPUT: &str = "input";
/// The folder of the job's final outputs inside the output directory.
pub const RESULT: &str = "result";

/// What can go wrong when a lambda talks to the ABI.
#[derive(Debug, thiserror::Error)]
pub enum LambdaError {
    #[error("environment variable {0} is not set (is this running under a sonic sandbox?)")]
    MissingVar(&'static str),
    #[error("environment variable {name} is invalid: {reason}")]
    InvalidVar { name: String, reason: String },
    #[error("parameter {0:?} is not set in SONIC_PARAMS")]
    MissingParam(String),
    #[error("parameter {name:?} has the wrong type: {reason}")]
    InvalidParam { name: String, reason: String },
    #[error("no fanout for {to:?}: {var} is not set (is there a shuffle edge to it?)")]
    MissingFanout { to: String, var: String },
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LambdaError + '_ {
    move |source| LambdaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The environment variable that carries the fanout of a shuffle edge to `to`
/// (`word-count` becomes `SONIC_FANOUT_WORD_COUNT`).
pub fn fanout_var(to: &str) -> String {
    let suffix: String = to
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{}{suffix}", env::FANOUT_PREFIX)
}

/// One input file sent by an upstream instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// Index of the sending instance (`<from>/<instance>/...`); 0 for the job input.
    pub instance: u32,
    /// Path relative to the sender's folder, with `/` separators (`part-3`, `sub/x.csv`).
    pub name: String,
    /// Absolute path to read.
    pub path: PathBuf,
}

/// What the sandbox told this instance: who it is, where its files are, and the job's parameters.
#[derive(Debug, Clone)]
pub struct Context {
    pub job_id: String,
    pub function: String,
    pub instance: u32,
    pub instances: u32,
    pub input_dir: PathBuf,
    pub output_dir: PathBuf,
    params: Map<String, Value>,
    /// `SONIC_FANOUT_*` variables by their full name.
    fanouts: BTreeMap<String, u32>,
}

impl Context {
    /// Reads the ABI from the process environment.
    pub fn from_env() -> Result<Self, LambdaError> {
        Self::from_vars(std::env::vars_os().filter_map(|(k, v)| {
            // Variables that are not UTF-8 cannot be ours; the ones we need are checked below.
            Some((k.into_string().ok()?, v.into_string().ok()?))
        }))
    }

    /// Reads the ABI from the given variables (what `from_env` does, testable).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, LambdaError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let vars: BTreeMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let get = |name: &'static str| vars.get(name).ok_or(LambdaError::MissingVar(name));
        let number = |name: &'static str| -> Result<u32, LambdaError> {
            let raw = get(name)?;
            raw.trim().parse().map_err(|e| LambdaError::InvalidVar {
                name: name.to_string(),
                reason: format!("{raw:?} is not a non-negative integer ({e})"),
            })
        };
        let dir = |name: &'static str| -> Result<PathBuf, LambdaError> {
            let raw = get(name)?;
            if raw.is_empty() {
                return Err(LambdaError::InvalidVar {
                    name: name.to_string(),
                    reason: "empty path".to_string(),
                });
            }
            Ok(PathBuf::from(raw))
        };

        let instance = number(env::INSTANCE)?;
        let instances = number(env::INSTANCES)?;
        if instances == 0 || instance >= instances {
            return Err(LambdaError::InvalidVar {
                name: env::INSTANCE.to_string(),
                reason: format!("instance {instance} is not below the fanout {instances}"),
            });
        }
        let params = match vars.get(env::PARAMS) {
            // No parameters at all is a valid job: the DAG may declare none.
            None => Map::new(),
            Some(raw) if raw.trim().is_empty() => Map::new(),
            Some(raw) => match serde_json::from_str::<Value>(raw) {
                Ok(Value::Object(map)) => map,
                Ok(other) => {
                    return Err(LambdaError::InvalidVar {
                        name: env::PARAMS.to_string(),
                        reason: format!("expected a JSON object, got {}", json_kind(&other)),
                    });
                }
                Err(e) => {
                    return Err(LambdaError::InvalidVar {
                        name: env::PARAMS.to_string(),
                        reason: e.to_string(),
                    });
                }
            },
        };
        let mut fanouts = BTreeMap::new();
        for (name, raw) in &vars {
            if name.starts_with(env::FANOUT_PREFIX) {
                let n: u32 = raw.trim().parse().map_err(|e| LambdaError::InvalidVar {
                    name: name.clone(),
                    reason: format!("{raw:?} is not a non-negative integer ({e})"),
                })?;
                fanouts.insert(name.clone(), n);
            }
        }
        Ok(Self {
            job_id: get(env::JOB_ID)?.clone(),
            function: get(env::FUNCTION)?.clone(),
            instance,
            instances,
            input_dir: dir(env::INPUT_DIR)?,
            output_dir: dir(env::OUTPUT_DIR)?,
            params,
            fanouts,
        })
    }

    /// All the job's parameters.
    pub fn params(&self) -> &Map<String, Value> {
        &self.params
    }

    /// A parameter, typed. A string value is also tried as JSON, so `"6"` reads as `6u32`
    /// (parameters given on a command line arrive as strings).
    pub fn param<T: DeserializeOwned>(&self, name: &str) -> Result<T, LambdaError> {
        self.param_opt(name)?
            .ok_or_else(|| LambdaError::MissingParam(name.to_string()))
    }

    /// A parameter, or `None` when it is not set (`null` counts as not set).
    pub fn param_opt<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, LambdaError> {
        match self.params.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => typed(name, value).map(Some),
        }
    }

    /// A parameter, or `default` when it is not set.
    pub fn param_or<T: DeserializeOwned>(&self, name: &str, default: T) -> Result<T, LambdaError> {
        Ok(self.param_opt(name)?.unwrap_or(default))
    }

    /// The receiver count of the shuffle edge to `to` (`SONIC_FANOUT_<TO>`).
    pub fn fanout(&self, to: &str) -> Result<u32, LambdaError> {
        let var = fanout_var(to);
        self.fanouts
            .get(&var)
            .copied()
            .ok_or_else(|| LambdaError::MissingFanout {
                to: to.to_string(),
                var,
            })
    }

    /// The upstream functions that sent something to this instance, sorted (`input` excluded).
    pub fn upstreams(&self) -> Result<Vec<String>, LambdaError> {
        let mut names = Vec::new();
        for entry in read_dir_or_empty(&self.input_dir)? {
            if entry.is_dir && entry.name != JOB_INPUT {
                names.push(entry.name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Files that the instances of upstream function `from` sent to this instance, sorted by
    /// sending instance, then by name. Empty when nothing was sent.
    pub fn inputs_from(&self, from: &str) -> Result<Vec<InputFile>, LambdaError> {
        check_name(from)?;
        let root = self.input_dir.join(from);
        let mut senders = Vec::new();
        for entry in read_dir_or_empty(&root)? {
            // Only `<i>/` folders are senders; anything else is not part of the ABI.
            if let (true, Ok(i)) = (entry.is_dir, entry.name.parse::<u32>()) {
                senders.push(i);
            }
        }
        senders.sort_unstable();
        let mut files = Vec::new();
        for i in senders {
            let dir = root.join(i.to_string());
            for (name, path) in walk_files(&dir)? {
                files.push(InputFile {
                    instance: i,
                    name,
                    path,
                });
            }
        }
        Ok(files)
    }

    /// The job's input files (`input/...`), sorted by name. Empty when there are none.
    pub fn job_inputs(&self) -> Result<Vec<InputFile>, LambdaError> {
        let dir = self.input_dir.join(JOB_INPUT);
        Ok(walk_files(&dir)?
            .into_iter()
            .map(|(name, path)| InputFile {
                instance: 0,
                name,
                path,
            })
            .collect())
    }

    /// Every input file, whatever its sender: `(path relative to the input dir, absolute path)`, sorted.
    pub fn all_inputs(&self) -> Result<Vec<(String, PathBuf)>, LambdaError> {
        walk_files(&self.input_dir)
    }

    /// The folder for outputs to downstream function `to` (or [`RESULT`]), created if needed.
    pub fn output_dir_for(&self, to: &str) -> Result<PathBuf, LambdaError> {
        check_name(to)?;
        let dir = self.output_dir.join(to);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        Ok(dir)
    }

    /// Writes `<to>/<name>` atomically.
    pub fn write_output(&self, to: &str, name: &str, bytes: &[u8]) -> Result<PathBuf, LambdaError> {
        let mut w = self.create_output(to, name)?;
        w.write_all(bytes).map_err(io_err(&w.target))?;
        w.commit()
    }

    /// Writes `result/<name>` atomically (a final output of the job).
    pub fn write_result(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, LambdaError> {
        self.write_output(RESULT, name, bytes)
    }

    /// Writes part `j` of a shuffle to `to` (`<to>/part-<j>`), atomically.
    pub fn write_part(&self, to: &str, j: u32, bytes: &[u8]) -> Result<PathBuf, LambdaError> {
        self.write_output(to, &part_name(j), bytes)
    }

    /// Opens `<to>/<name>` for streaming writes; it appears under its name only on
    /// [`AtomicWriter::commit`]. `name` may contain `/` for sub-folders.
    pub fn create_output(&self, to: &str, name: &str) -> Result<AtomicWriter, LambdaError> {
        check_name(to)?;
        check_relative(name)?;
        AtomicWriter::create(self.output_dir.join(to).join(name))
    }
}

/// The file name of shuffle part `j`.
pub fn part_name(j: u32) -> String {
    format!("part-{j}")
}

fn typed<T: DeserializeOwned>(name: &str, value: &Value) -> Result<T, LambdaError> {
    match serde_json::from_value::<T>(value.clone()) {
        Ok(v) => Ok(v),
        Err(first) => {
            if let Value::String(s) = value
                && let Ok(parsed) = serde_json::from_str::<Value>(s)
                && let Ok(v) = serde_json::from_value::<T>(parsed)
            {
                return Ok(v);
            }
            Err(LambdaError::InvalidParam {
                name: name.to_string(),
                reason: format!("{first} (value: {value})"),
            })
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A single path component: a function name, `input` or `result`.
fn check_name(name: &str) -> Result<(), LambdaError> {
    let bad = |reason| {
        Err(LambdaError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return bad("must be a single path component");
    }
    Ok(())
}

/// A relative path that stays inside its folder.
fn check_relative(name: &str) -> Result<(), LambdaError> {
    let bad = |reason| {
        Err(LambdaError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.contains('\0') {
        return bad("empty");
    }
    let path = Path::new(name);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) || name.ends_with('/') {
        return bad("must be a relative file path without '..'");
    }
    Ok(())
}

struct DirEntry {
    name: String,
    is_dir: bool,
}

fn read_dir_or_empty(dir: &Path) -> Result<Vec<DirEntry>, LambdaError> {
    let iter = match fs::read_dir(dir) {
        Ok(iter) => iter,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut out = Vec::new();
    for entry in iter {
        let entry = entry.map_err(io_err(dir))?;
        // Follow symlinks: a sandbox may expose inputs through links.
        let is_dir = fs::metadata(entry.path())
            .map(|m| m.is_dir())
            .map_err(io_err(&entry.path()))?;
        out.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            is_dir,
        });
    }
    Ok(out)
}

/// Every file under `dir`, as (relative path with `/`, absolute path), sorted by relative path.
fn walk_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, LambdaError> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, path)) = stack.pop() {
        for entry in read_dir_or_empty(&path)? {
            let rel = if prefix.is_empty() {
                entry.name.clone()
            } else {
                format!("{prefix}/{}", entry.name)
            };
            let abs = path.join(&entry.name);
            if entry.is_dir {
                stack.push((rel, abs));
            } else {
                out.push((rel, abs));
            }
        }
    }
    out.sort();
    Ok(out)
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file written under a temporary name in its final folder and renamed into place by
/// [`commit`](Self::commit). Dropped without a commit, the temporary file is removed.
#[derive(Debug)]
pub struct AtomicWriter {
    file: Option<io::BufWriter<fs::File>>,
    temp: PathBuf,
    target: PathBuf,
}

impl AtomicWriter {
    /// Creates the parent folders and a temporary file next to `target`.
    pub fn create(target: impl Into<PathBuf>) -> Result<Self, LambdaError> {
        let target = target.into();
        let parent = target
            .parent()
            .ok_or_else(|| LambdaError::InvalidName {
                name: target.display().to_string(),
                reason: "has no parent folder",
            })?
            .to_path_buf();
        let file_name = target
            .file_name()
            .ok_or_else(|| LambdaError::InvalidName {
                name: target.display().to_string(),
                reason: "has no file name",
            })?
            .to_string_lossy()
            .into_owned();
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        // Same folder, so the rename is atomic; the pid and counter keep concurrent writers apart.
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = parent.join(format!(".{file_name}.tmp-{}-{n}", std::process::id()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(io_err(&temp))?;
        Ok(Self {
            file: Some(io::BufWriter::new(file)),
            temp,
            target,
        })
    }

    /// Where the file appears on commit.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Flushes the data and renames the file into place; returns its final path.
    pub fn commit(mut self) -> Result<PathBuf, LambdaError> {
        if let Some(file) = self.file.take() {
            // No fsync: the rename is what makes the file visible whole to other processes; a
            // crash of the machine fails the instance anyway, and it is retried.
            file.into_inner()
                .map_err(|e| io_err(&self.temp)(e.into_error()))?;
        }
        fs::rename(&self.temp, &self.target).map_err(io_err(&self.target))?;
        Ok(self.target.clone())
    }
}

impl Write for AtomicWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.file.as_mut() {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("atomic writer already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for AtomicWriter {
    fn drop(&mut self) {
        if self.file.is_some() {
            // Not committed: leave no half-written file behind. Nothing more to do on failure.
            let _ = fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(input: &Path, output: &Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = vec![
            ("SONIC_JOB_ID".into(), "j-1".into()),
            ("SONIC_FUNCTION".into(), "train".into()),
            ("SONIC_INSTANCE".into(), "1".into()),
            ("SONIC_INSTANCES".into(), "3".into()),
            ("SONIC_INPUT_DIR".into(), input.display().to_string()),
            ("SONIC_OUTPUT_DIR".into(), output.display().to_string()),
            (
                "SONIC_PARAMS".into(),
                r#"{"trees": 6, "name": "x", "n": "7", "ratio": 0.5}"#.into(),
            ),
            ("SONIC_FANOUT_WORD_COUNT".into(), "4".into()),
            ("PATH".into(), "/bin".into()),
        ];
        for (k, val) in extra {
            v.retain(|(name, _)| name != k);
            v.push((k.to_string(), val.to_string()));
        }
        v
    }

    fn ctx(dir: &Path) -> Context {
        let input = dir.join("in");
        let output = dir.join("out");
        fs::create_dir_all(&input).unwrap();
        fs::create_dir_all(&output).unwrap();
        Context::from_vars(vars(&input, &output, &[])).unwrap()
    }

    fn tempdir() -> PathBuf {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "sonic-lambda-test-{}-{n}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn touch(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn reads_every_variable() {
        let dir = tempdir();
        let c = ctx(&dir);
        assert_eq!(c.job_id, "j-1");
        assert_eq!(c.function, "train");
        assert_eq!((c.instance, c.instances), (1, 3));
        assert_eq!(c.input_dir, dir.join("in"));
        assert_eq!(c.output_dir, dir.join("out"));
        assert_eq!(c.params().len(), 4);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn missing_and_invalid_variables_are_named() {
        let p = Path::new("/x");
        let check = |extra: &[(&str, &str)], remove: Option<&str>, expect: &str| {
            let mut v = vars(p, p, extra);
            if let Some(r) = remove {
                v.retain(|(k, _)| k != r);
            }
            let err = Context::from_vars(v).unwrap_err().to_string();
            assert!(err.contains(expect), "{err:?} should contain {expect:?}");
        };
        check(&[], Some("SONIC_JOB_ID"), "SONIC_JOB_ID is not set");
        check(&[], Some("SONIC_OUTPUT_DIR"), "SONIC_OUTPUT_DIR is not set");
        check(
            &[("SONIC_INSTANCE", "x")],
            None,
            "SONIC_INSTANCE is invalid",
        );
        check(&[("SONIC_INSTANCE", "3")], None, "not below the fanout 3");
        check(
            &[("SONIC_INSTANCES", "-1")],
            None,
            "SONIC_INSTANCES is invalid",
        );
        check(
            &[("SONIC_PARAMS", "[1]")],
            None,
            "expected a JSON object, got an array",
        );
        check(&[("SONIC_PARAMS", "{")], None, "SONIC_PARAMS is invalid");
        check(
            &[("SONIC_FANOUT_X", "many")],
            None,
            "SONIC_FANOUT_X is invalid",
        );
        check(&[("SONIC_INPUT_DIR", "")], None, "empty path");
    }

    #[test]
    fn params_are_typed() {
        let dir = tempdir();
        let c = ctx(&dir);
        assert_eq!(c.param::<u32>("trees").unwrap(), 6);
        assert_eq!(c.param::<String>("name").unwrap(), "x");
        // A string holding JSON reads as the typed value (command-line parameters are strings).
        assert_eq!(c.param::<u64>("n").unwrap(), 7);
        assert_eq!(c.param::<String>("n").unwrap(), "7");
        assert_eq!(c.param::<f64>("ratio").unwrap(), 0.5);
        assert_eq!(c.param_or::<u32>("absent", 9).unwrap(), 9);
        assert_eq!(c.param_opt::<u32>("absent").unwrap(), None);
        assert!(matches!(
            c.param::<u32>("absent"),
            Err(LambdaError::MissingParam(n)) if n == "absent"
        ));
        let err = c.param::<u32>("name").unwrap_err();
        assert!(matches!(err, LambdaError::InvalidParam { .. }), "{err}");
        assert!(c.param::<u32>("ratio").is_err());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_params_is_an_empty_object() {
        let p = Path::new("/x");
        let mut v = vars(p, p, &[]);
        v.retain(|(k, _)| k != "SONIC_PARAMS");
        let c = Context::from_vars(v).unwrap();
        assert!(c.params().is_empty());
    }

    #[test]
    fn fanout_by_receiver_name() {
        let dir = tempdir();
        let c = ctx(&dir);
        assert_eq!(fanout_var("word-count"), "SONIC_FANOUT_WORD_COUNT");
        assert_eq!(fanout_var("reduce_2"), "SONIC_FANOUT_REDUCE_2");
        assert_eq!(c.fanout("word-count").unwrap(), 4);
        let err = c.fanout("other").unwrap_err().to_string();
        assert!(err.contains("SONIC_FANOUT_OTHER"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn inputs_sorted_by_instance_then_name() {
        let dir = tempdir();
        let c = ctx(&dir);
        let i = &c.input_dir;
        // Instance 10 after 2: numeric order, not string order.
        touch(&i.join("map/10/a"), b"10a");
        touch(&i.join("map/2/b"), b"2b");
        touch(&i.join("map/2/a"), b"2a");
        touch(&i.join("map/2/sub/z"), b"2z");
        touch(&i.join("map/not-an-instance/x"), b"?");
        touch(&i.join("input/data.csv"), b"csv");
        touch(&i.join("other/0/x"), b"x");
        let got: Vec<(u32, String)> = c
            .inputs_from("map")
            .unwrap()
            .into_iter()
            .map(|f| (f.instance, f.name))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, "a".to_string()),
                (2, "b".to_string()),
                (2, "sub/z".to_string()),
                (10, "a".to_string()),
            ]
        );
        let first = &c.inputs_from("map").unwrap()[0];
        assert_eq!(fs::read(&first.path).unwrap(), b"2a");
        assert!(c.inputs_from("absent").unwrap().is_empty());
        let job: Vec<String> = c
            .job_inputs()
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(job, vec!["data.csv"]);
        assert_eq!(c.upstreams().unwrap(), vec!["map", "other"]);
        assert!(c.inputs_from("../etc").is_err());
        assert_eq!(c.all_inputs().unwrap().len(), 7);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn outputs_are_written_atomically_in_place() {
        let dir = tempdir();
        let c = ctx(&dir);
        let p = c.write_output("combine", "model.json", b"{}").unwrap();
        assert_eq!(p, c.output_dir.join("combine/model.json"));
        assert_eq!(fs::read(&p).unwrap(), b"{}");
        c.write_result("r.txt", b"done").unwrap();
        assert_eq!(
            fs::read(c.output_dir.join("result/r.txt")).unwrap(),
            b"done"
        );
        c.write_part("reduce", 3, b"p3").unwrap();
        assert_eq!(fs::read(c.output_dir.join("reduce/part-3")).unwrap(), b"p3");
        c.write_output("combine", "nested/x", b"n").unwrap();
        assert_eq!(
            fs::read(c.output_dir.join("combine/nested/x")).unwrap(),
            b"n"
        );

        // A streaming writer is invisible until commit, and leaves nothing if dropped.
        let mut w = c.create_output("result", "big").unwrap();
        w.write_all(&[7u8; 10_000]).unwrap();
        assert!(!c.output_dir.join("result/big").exists());
        w.commit().unwrap();
        assert_eq!(
            fs::read(c.output_dir.join("result/big")).unwrap().len(),
            10_000
        );
        let mut w = c.create_output("result", "abandoned").unwrap();
        w.write_all(b"half").unwrap();
        drop(w);
        let names: Vec<String> = fs::read_dir(c.output_dir.join("result"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!names.iter().any(|n| n.contains("tmp")), "{names:?}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn output_names_cannot_escape() {
        let dir = tempdir();
        let c = ctx(&dir);
        for (to, name) in [
            ("../x", "a"),
            ("", "a"),
            ("ok", "../a"),
            ("ok", "/abs"),
            ("ok", ""),
            ("ok", "a/"),
        ] {
            let err = c.write_output(to, name, b"x").unwrap_err();
            assert!(
                matches!(err, LambdaError::InvalidName { .. }),
                "{to} {name}: {err}"
            );
        }
        fs::remove_dir_all(dir).unwrap();
    }
}
