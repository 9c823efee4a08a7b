//! DAG files: the YAML of interfaces.md §1 parsed into a checked [`Dag`].

use serde::{Deserialize, Serialize};

/// How a sending stage's output reaches a receiving stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeKind {
    /// 1 -> 1, or i -> i when both stages have the same fanout.
    One,
    /// The sender's output is split; receiver j reads part j.
    Scatter,
    /// Every receiver reads the same whole file.
    Broadcast,
    /// K -> 1: the receiver reads every sender's file.
    Gather,
    /// K -> M all-to-all: receiver j reads part j of every sender's output.
    Shuffle,
}

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_saphyr::Spanned;

use crate::units::Seconds;

/// The timeout of a function whose file names none.
pub const DEFAULT_TIMEOUT_S: f64 = 300.0;
/// The largest fanout a DAG file may ask for.
pub const MAX_INSTANCES: u64 = 100_000;
/// Names a function may not take: the ABI uses them for the job's input and final results.
pub const RESERVED_NAMES: &[&str] = &["input", "result"];
/// The largest DAG file accepted, in bytes.
pub const MAX_FILE_BYTES: usize = crate::yaml::MAX_YAML_BYTES;
/// The most functions one DAG may have.
pub const MAX_FUNCTIONS: usize = 1_000;
/// The most edges one DAG may have.
pub const MAX_EDGES: usize = 10_000;
/// Most edges into one function: the planner tries every combination of their methods.
pub const MAX_INPUTS: usize = 16;
/// Most files one `shuffle` edge may pass (`K_s x K_r`): each is a file, a transfer and, under
/// `remote`, two requests, and the receivers' inputs are listed per pair.
pub const MAX_SHUFFLE_FILES: u64 = 1_000_000;
/// The most parameters one DAG may declare.
pub const MAX_PARAMS: usize = 256;
/// The most words (executable and arguments) a function's command may have.
pub const MAX_COMMAND_ARGS: usize = 1_024;
/// The longest description, parameter string or command word, in bytes.
pub const MAX_TEXT_BYTES: usize = 4_096;
/// The longest image reference, in bytes.
pub const MAX_IMAGE_BYTES: usize = 512;
/// The longest handler (OpenLambda lambda) name, in bytes.
pub const MAX_HANDLER_BYTES: usize = 128;

/// A refused DAG file: which file, where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DagError {
    pub file: String,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The field at fault, as a path (`functions[1].timeout`), or empty for the whole document.
    pub field: String,
    pub message: String,
}

impl fmt::Display for DagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.field, self.message)
        }
    }
}

/// How many instances a function runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instances {
    /// A number written in the file.
    Fixed(u32),
    /// `{{ params.NAME }}`: a job parameter, overridable per job.
    Param(String),
    /// Omitted: follows the incoming edge (1 for a function with no incoming edge).
    Follow,
}

/// One function (stage) of a DAG: an executable (`image` and `command`) or a registered
/// OpenLambda handler (`handler`), never both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Function {
    pub name: String,
    /// The Docker sandbox's image; empty for a handler.
    pub image: String,
    /// Executable and arguments; empty for a handler.
    pub command: Vec<String>,
    /// The name of a lambda in the OpenLambda registry whose `f(event)` this function runs
    /// (docs/python.md); `None` for an executable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    pub timeout_s: f64,
    pub instances: Instances,
    /// When its failed runs are tried again (`retries:`); `None`: the control plane's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
    /// Environment variables of its runs (`env:`), beside the lambda ABI's own `SONIC_*`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Environment variables of its runs whose values are secrets (`env: { VAR: { secret:
    /// NAME } }`): variable -> the secret's name in the control plane's secret store. The DAG
    /// holds names only; values reach the runs, never the DAG, its logs or the dashboard.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
}

/// Whether `name` can name a secret: letters, digits, `.`, `_` and `-`, not first a `.`, at
/// most 128 (a file of a secrets folder, a Kubernetes secret key).
pub fn valid_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether a run's environment variable is the sandbox's to set, not a DAG's: the lambda ABI's
/// `SONIC_*`, the sandbox's `PATH`, `HOME` and `TMPDIR`, and the dynamic loader's `LD_*` (which
/// would load code of the author's choosing into the sandbox's own executables).
pub fn reserved_env(name: &str) -> bool {
    name.starts_with("SONIC_")
        || name.starts_with("LD_")
        || matches!(name, "PATH" | "HOME" | "TMPDIR")
}

/// The most variables a function's `env:` may set.
pub const MAX_ENV_VARS: usize = 256;
/// The most bytes a function's `env:` may hold (names and values).
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// The most retries a function may ask for.
pub const MAX_RETRIES: u32 = 100;

/// A function's retry policy as its DAG file gives it (interfaces.md §7): each field it leaves
/// out is the control plane's default.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Retries {
    /// How many times a failed run is tried again after its first attempt (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The wait before the first retry, doubled before each next one, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_s: Option<f64>,
    /// The kinds of failure that are tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<RetryOn>>,
}

/// A kind of failure a retry policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The lambda failed (exited with an error, was killed by a signal), or its agent could not
    /// stage its inputs, route its outputs or write for lack of disk.
    Error,
    /// It ran past its time limit.
    Timeout,
    /// It ran out of memory.
    Oom,
    /// Its agent did not answer.
    Lost,
}

impl RetryOn {
    /// Every kind, in the order of their names.
    pub const ALL: [RetryOn; 4] = [
        RetryOn::Error,
        RetryOn::Timeout,
        RetryOn::Oom,
        RetryOn::Lost,
    ];

    /// Its name in a DAG file.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::Error => "error",
            RetryOn::Timeout => "timeout",
            RetryOn::Oom => "oom",
            RetryOn::Lost => "lost",
        }
    }
}

/// One edge, by function index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub kind: EdgeKind,
}

/// The user's optional bounds on one job.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Bounds {
    pub max_latency_s: Option<f64>,
    pub max_cost_usd: Option<f64>,
}

/// The fanout of a stage once a job's parameters are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fanout {
    Known(u32),
    /// Set by a `scatter` sender's output: one instance per file it writes.
    Scattered,
}

/// A checked DAG: names valid and unique, edges between known functions, acyclic, edge kinds
/// consistent with the fanouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dag {
    pub name: String,
    pub description: String,
    /// Default job parameters (JSON scalars).
    pub params: BTreeMap<String, serde_json::Value>,
    /// The parameters that change the work (`work_params`): models are learned per combination
    /// of their values (`crate::setting`). `None`: every parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_params: Option<Vec<String>>,
    /// Functions in a topological order (every edge goes from a lower to a higher index).
    pub functions: Vec<Function>,
    pub edges: Vec<Edge>,
    pub bounds: Bounds,
    /// The whole job's deadline, in seconds from its submission (`deadline:`): past it, the job
    /// fails with a reason naming it. `None`: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_s: Option<f64>,
    /// The objective on job latency at a percentile (`slo:`, interfaces.md §6); a job may
    /// override it. `None`: plans maximize Perf/$.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<crate::slo::Slo>,
    /// What starts its jobs besides submissions (`triggers:`, interfaces.md §7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggers: Vec<Trigger>,
    /// The function `on_failure:` names, run once when a job fails (interfaces.md §7). It is
    /// not one of `functions`: it has no edges, is never planned and never runs in a job that
    /// succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<Function>,
    /// `input: required`: a job without an input is refused at submission (its first functions
    /// read one), and no schedule may start one. `false` (`optional`, the default): a job may
    /// have none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub input_required: bool,
}

/// What starts a job of a DAG without a submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// `{ schedule: "*/30 * * * * *" }`: one job at each time the schedule names (its
    /// parameters' defaults, no input).
    Schedule(crate::schedule::Schedule),
    /// `{ object_created: { prefix: "incoming/" } }`: one job per object that appears under
    /// the prefix of the cluster's store (its parameters' defaults, the object as its input).
    ObjectCreated {
        /// The key prefix watched.
        prefix: String,
    },
}

/// The most characters of an `object_created` prefix.
pub const MAX_TRIGGER_PREFIX_CHARS: usize = 512;

/// The longest deadline a DAG may give its jobs: a week.
pub const MAX_DEADLINE_S: f64 = 7.0 * 86_400.0;

// ---- the YAML as written ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DagSpec {
    name: Spanned<String>,
    #[serde(default)]
    description: Option<Spanned<String>>,
    #[serde(default)]
    params: Option<Spanned<BTreeMap<String, Spanned<serde_json::Value>>>>,
    #[serde(default)]
    work_params: Option<Spanned<Vec<Spanned<String>>>>,
    functions: Spanned<Vec<Spanned<FunctionSpec>>>,
    /// `edges:` with nothing after it (YAML null) is an empty list too.
    #[serde(default)]
    edges: Option<Vec<Spanned<EdgeSpec>>>,
    #[serde(default)]
    bounds: Option<BoundsSpec>,
    #[serde(default)]
    deadline: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    slo: Option<Spanned<SloSpec>>,
    #[serde(default)]
    triggers: Option<Vec<Spanned<TriggerSpec>>>,
    #[serde(default)]
    on_failure: Option<Spanned<String>>,
    #[serde(default)]
    input: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerSpec {
    #[serde(default)]
    schedule: Option<Spanned<String>>,
    #[serde(default)]
    object_created: Option<Spanned<ObjectCreatedSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectCreatedSpec {
    prefix: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SloSpec {
    #[serde(default)]
    percentile: Option<Spanned<ScalarSpec>>,
    latency: Spanned<ScalarSpec>,
    #[serde(default)]
    best_effort: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionSpec {
    name: Spanned<String>,
    #[serde(default)]
    image: Option<Spanned<String>>,
    #[serde(default)]
    command: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    handler: Option<Spanned<String>>,
    #[serde(default)]
    timeout: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    instances: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    retries: Option<Spanned<RetriesSpec>>,
    #[serde(default)]
    env: Option<Spanned<BTreeMap<String, Spanned<EnvValue>>>>,
}

/// A value of `env:`: any YAML scalar, kept as its text.
#[derive(Deserialize)]
#[serde(untagged)]
enum EnvValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// `{ secret: NAME }`: a secret of the control plane's store.
    Secret(SecretRefSpec),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretRefSpec {
    secret: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetriesSpec {
    #[serde(default)]
    limit: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    backoff: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    on: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeSpec {
    from: Spanned<String>,
    to: Spanned<String>,
    kind: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BoundsSpec {
    #[serde(default)]
    max_latency: Option<Spanned<ScalarSpec>>,
    #[serde(default)]
    max_cost_usd: Option<Spanned<f64>>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum ScalarSpec {
    Int(i64),
    Float(f64),
    Str(String),
}

impl fmt::Display for ScalarSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarSpec::Int(n) => write!(f, "{n}"),
            ScalarSpec::Float(x) => write!(f, "{x}"),
            ScalarSpec::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A function's `retries:` checked: a limit from 0 to [`MAX_RETRIES`], a backoff from 0 to an
/// hour, kinds of failure among [`RetryOn::ALL`], each once.
fn retries_of(
    errs: &Errs<'_>,
    r: &RetriesSpec,
    at: &dyn Fn(&str) -> String,
) -> Result<Retries, DagError> {
    let limit = match &r.limit {
        None => None,
        Some(l) => match &l.value {
            ScalarSpec::Int(n) if (0..=i64::from(MAX_RETRIES)).contains(n) => Some(*n as u32),
            _ => {
                return Err(errs.at(
                    l,
                    at("retries.limit"),
                    format!(
                        "{} is not a whole number of retries from 0 to {MAX_RETRIES}",
                        l.value
                    ),
                ));
            }
        },
    };
    let backoff_s = match &r.backoff {
        None => None,
        Some(b) => {
            let secs = match &b.value {
                ScalarSpec::Int(0) => Some(0.0),
                ScalarSpec::Str(s) => s.parse::<Seconds>().ok().map(|s| s.0),
                _ => None,
            };
            match secs {
                Some(s) if (0.0..=3600.0).contains(&s) => Some(s),
                _ => {
                    return Err(errs.at(
                        b,
                        at("retries.backoff"),
                        format!(
                            "{} is not a duration from 0 to 1h (e.g. 500ms, 2s)",
                            b.value
                        ),
                    ));
                }
            }
        }
    };
    let on = match &r.on {
        None => None,
        Some(list) => {
            let mut kinds = Vec::new();
            for k in &list.value {
                let Some(kind) = RetryOn::ALL.into_iter().find(|x| x.as_str() == k.value) else {
                    return Err(errs.at(
                        k,
                        at("retries.on"),
                        format!(
                            "{:?} is not a kind of failure (error, timeout, oom, lost)",
                            k.value
                        ),
                    ));
                };
                if kinds.contains(&kind) {
                    return Err(errs.at(
                        k,
                        at("retries.on"),
                        format!("{:?} is named twice", k.value),
                    ));
                }
                kinds.push(kind);
            }
            Some(kinds)
        }
    };
    Ok(Retries {
        limit,
        backoff_s,
        on,
    })
}

/// Builds errors that all name the same file.
struct Errs<'a> {
    file: &'a str,
}

impl Errs<'_> {
    fn at<T>(
        &self,
        span: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> DagError {
        let loc = span.referenced;
        let known = loc.line() > 0;
        DagError {
            file: self.file.to_owned(),
            line: known.then(|| loc.line() as u32),
            column: known.then(|| loc.column() as u32),
            field: field.into(),
            message: message.into(),
        }
    }

    fn whole(&self, field: impl Into<String>, message: impl Into<String>) -> DagError {
        DagError {
            file: self.file.to_owned(),
            line: None,
            column: None,
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An OpenLambda lambda's name as its registry takes it: letters, digits, `-`, `_` and `.`, not
/// starting with `.`, at most [`MAX_HANDLER_BYTES`].
pub fn valid_handler_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HANDLER_BYTES
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `[a-z0-9-]`, starting and ending with a letter or digit, at most 63 characters.
pub fn valid_dag_name(name: &str) -> bool {
    valid_ident(name, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
    })
}

/// Function names also allow `_`; they name folders and environment variables.
pub fn valid_function_name(name: &str) -> bool {
    valid_ident(name, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
    })
}

fn valid_ident(name: &str, allowed: impl Fn(char) -> bool) -> bool {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(allowed)
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last())
}

/// A Docker image reference as `docker pull` takes it: `[registry[:port]/]path[:tag][@digest]`,
/// lowercase path components (the grammar of distribution/reference), at most
/// [`MAX_IMAGE_BYTES`]. Refuses what would smuggle anything else into the sandbox's arguments:
/// spaces, control characters, `..`, a leading `-`.
pub fn valid_image(image: &str) -> bool {
    if image.is_empty() || image.len() > MAX_IMAGE_BYTES {
        return false;
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if digest.is_some_and(|d| !valid_digest(d)) {
        return false;
    }
    // The tag follows the last ':' after the last '/' (an earlier ':' is a registry port).
    let name_start = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[name_start..].rfind(':') {
        Some(i) => (&rest[..name_start + i], Some(&rest[name_start + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !valid_tag(t)) || name.is_empty() || name.len() > 255 {
        return false;
    }
    let mut parts = name.split('/');
    let first = parts.next().unwrap_or("");
    let has_domain = name.contains('/')
        && (first.contains(['.', ':'])
            || first == "localhost"
            || first.chars().any(|c| c.is_ascii_uppercase()));
    let first_ok = if has_domain {
        valid_domain(first)
    } else {
        valid_path_component(first)
    };
    first_ok && parts.all(valid_path_component)
}

/// `[a-z0-9]+` runs joined by `.`, `_`, `__` or dashes.
fn valid_path_component(p: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = p.as_bytes();
    if !(b.first().is_some_and(|&c| alnum(c)) && b.last().is_some_and(|&c| alnum(c))) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &p[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

/// `host[.host...][:port]`, host labels of letters, digits and inner dashes.
fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    let port_ok =
        port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|c| c.is_ascii_digit()));
    port_ok
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(t: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    (1..=128).contains(&t.len())
        && t.bytes().next().is_some_and(word)
        && t.bytes().all(|c| word(c) || c == b'.' || c == b'-')
}

/// `algorithm:hex`, at least 32 hex digits.
fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    alg.bytes().next().is_some_and(|c| c.is_ascii_alphabetic())
        && alg
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'.' | b'_' | b'-'))
        && hex.len() >= 32
        && hex.bytes().all(|c| c.is_ascii_hexdigit())
}

/// Characters that reorder how text is shown (Trojan Source): no description needs them.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Why a command word is refused, if it is: the executable takes no control character and no
/// `..` component; arguments may hold tabs and newlines (scripts), no other control character.
fn command_word_problem(word: &str, executable: bool) -> Option<String> {
    if word.len() > MAX_TEXT_BYTES {
        return Some(format!(
            "a command word is at most {MAX_TEXT_BYTES} bytes, this one has {}",
            word.len()
        ));
    }
    if word.contains('\0') {
        return Some("arguments must not contain NUL".to_owned());
    }
    if executable {
        if word.trim().is_empty() {
            return Some("the command needs an executable".to_owned());
        }
        if word.chars().any(char::is_control) {
            return Some(format!(
                "the executable {word:?} must not contain control characters"
            ));
        }
        if word.split('/').any(|part| part == "..") {
            return Some(format!(
                "the executable {word:?} must not climb directories with '..'"
            ));
        }
    } else if word
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Some(format!(
            "{word:?}: arguments must not contain control characters other than tab and newline"
        ));
    }
    None
}

/// The environment variable that tells a `shuffle` sender how many parts to write for `to`.
pub fn fanout_env_var(to: &str) -> String {
    format!("SONIC_FANOUT_{}", to.to_ascii_uppercase().replace('-', "_"))
}

fn parse_edge_kind(s: &str) -> Option<EdgeKind> {
    Some(match s {
        "one" => EdgeKind::One,
        "scatter" => EdgeKind::Scatter,
        "broadcast" => EdgeKind::Broadcast,
        "gather" => EdgeKind::Gather,
        "shuffle" => EdgeKind::Shuffle,
        _ => return None,
    })
}

/// `{{ params.trees }}` -> `trees`.
fn param_reference(s: &str) -> Option<&str> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?.trim();
    let name = inner.strip_prefix("params.")?;
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    .then_some(name)
}

/// A parameter's value as a fanout, when it is a whole number in range.
pub fn param_as_fanout(v: &serde_json::Value) -> Option<u32> {
    let n = match v {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (1..=MAX_INSTANCES).contains(&n).then_some(n as u32)
}

impl Dag {
    /// Parses and checks a DAG file's text; `file` names it in errors.
    ///
    /// The text is read with tight parser budgets ([`MAX_FILE_BYTES`], nesting, aliases): a hostile
    /// file is refused after bounded work and memory.
    pub fn from_yaml(file: &str, text: &str) -> Result<Dag, DagError> {
        let errs = Errs { file };
        if text.len() > MAX_FILE_BYTES {
            return Err(errs.whole(
                "",
                format!(
                    "the file has {} bytes; a DAG file has at most {MAX_FILE_BYTES}",
                    text.len()
                ),
            ));
        }
        if crate::yaml::is_blank(text) {
            return Err(errs.whole(
                "",
                "the file is empty: a DAG file needs at least name and functions",
            ));
        }
        let spec: DagSpec = serde_saphyr::from_str_with_options(text, crate::yaml::options())
            .map_err(|e| yaml_error(file, text, &e))?;
        build(&errs, spec)
    }

    pub fn function_index(&self, name: &str) -> Option<usize> {
        self.functions.iter().position(|f| f.name == name)
    }

    /// Edges into function `i`.
    pub fn incoming(&self, i: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.to == i)
    }

    /// Edges out of function `i`.
    pub fn outgoing(&self, i: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.from == i)
    }

    /// Functions with no outgoing edge: their `result/` files are the job's outputs.
    pub fn sinks(&self) -> Vec<usize> {
        (0..self.functions.len())
            .filter(|&i| self.outgoing(i).next().is_none())
            .collect()
    }

    /// Checks a job's parameter overrides for typos. A key the DAG does not declare is the
    /// lambdas' (they read any key of the job's parameters, `<function>.<key>` for one
    /// function: the `synthetic` lambda's `compute_ms`), unless it is a letter or two from a
    /// declared parameter (`mapers` for `mappers`, at most a third of its length): that one is
    /// refused, naming the parameter meant and all of them, since it would run with the default
    /// and start a setting of its own that nothing was learned for.
    pub fn check_overrides(
        &self,
        overrides: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), String> {
        for unknown in overrides.keys().filter(|k| !self.params.contains_key(*k)) {
            let meant = self
                .params
                .keys()
                .map(|k| (strsim::damerau_levenshtein(unknown, k), k))
                .filter(|(d, k)| *d <= 2 && d * 3 <= k.len())
                .min();
            if let Some((_, meant)) = meant {
                let declared: Vec<&str> = self.params.keys().map(String::as_str).collect();
                return Err(format!(
                    "parameter {unknown:?} is not one of DAG {}'s (did you mean {meant:?}?): it declares {}",
                    self.name,
                    declared.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// The job parameters: the DAG's defaults overridden by `overrides`.
    pub fn job_params(
        &self,
        overrides: &BTreeMap<String, serde_json::Value>,
    ) -> BTreeMap<String, serde_json::Value> {
        let mut p = self.params.clone();
        p.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        p
    }

    /// The fanout of every function for a job with these parameters (defaults merged in).
    /// Fails when a parameter used as a fanout is missing or not a whole number, or when the
    /// fanouts contradict an edge kind.
    pub fn fanouts(
        &self,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Vec<Fanout>, String> {
        let mut out: Vec<Fanout> = Vec::with_capacity(self.functions.len());
        for (i, f) in self.functions.iter().enumerate() {
            let declared = match &f.instances {
                Instances::Fixed(n) => Some(*n),
                Instances::Param(p) => {
                    let v = params.get(p).ok_or_else(|| {
                        format!("function {}: parameter {p:?} is not set", f.name)
                    })?;
                    Some(param_as_fanout(v).ok_or_else(|| {
                        format!(
                            "function {}: parameter {p:?} = {v} is not a whole number from 1 to {MAX_INSTANCES}",
                            f.name
                        )
                    })?)
                }
                Instances::Follow => None,
            };
            let mut implied: Option<Fanout> = None;
            for e in self.incoming(i) {
                let sender = self.functions[e.from].name.as_str();
                let s = out[e.from];
                let (imp, why) = match e.kind {
                    EdgeKind::One => (Some(s), "a one edge keeps the sender's fanout"),
                    EdgeKind::Scatter => (
                        Some(Fanout::Scattered),
                        "a scatter receiver runs one instance per part",
                    ),
                    EdgeKind::Gather => {
                        (Some(Fanout::Known(1)), "a gather receiver has one instance")
                    }
                    EdgeKind::Broadcast | EdgeKind::Shuffle => (None, ""),
                };
                // Sender-side constraints.
                match e.kind {
                    EdgeKind::Scatter | EdgeKind::Broadcast if s != Fanout::Known(1) => {
                        return Err(format!(
                            "edge {sender} -> {}: a {} sender must have one instance",
                            f.name,
                            kind_name(e.kind)
                        ));
                    }
                    _ => {}
                }
                if let Some(imp) = imp {
                    if let Some(d) = declared
                        && imp != Fanout::Known(d)
                    {
                        return Err(format!(
                            "edge {sender} -> {}: {why}, but {} declares {d} instances",
                            f.name, f.name
                        ));
                    }
                    match implied {
                        Some(prev) if prev != imp => {
                            return Err(format!(
                                "function {}: its incoming edges imply different fanouts",
                                f.name
                            ));
                        }
                        _ => implied = Some(imp),
                    }
                }
            }
            let fanout = match (declared, implied) {
                (Some(d), _) => Fanout::Known(d),
                (None, Some(imp)) => imp,
                (None, None) if self.incoming(i).next().is_none() => Fanout::Known(1),
                (None, None) => {
                    return Err(format!(
                        "function {}: its instances must be given (a number or {{{{ params.NAME }}}}): broadcast and shuffle receivers do not imply a fanout",
                        f.name
                    ));
                }
            };
            out.push(fanout);
        }
        for e in &self.edges {
            if let (EdgeKind::Shuffle, Fanout::Known(ks), Fanout::Known(kr)) =
                (e.kind, out[e.from], out[e.to])
                && u64::from(ks) * u64::from(kr) > MAX_SHUFFLE_FILES
            {
                return Err(format!(
                    "edge {} -> {}: a shuffle of {ks} x {kr} instances passes {} files; at most {MAX_SHUFFLE_FILES}",
                    self.functions[e.from].name,
                    self.functions[e.to].name,
                    u64::from(ks) * u64::from(kr)
                ));
            }
        }
        Ok(out)
    }
}

fn kind_name(k: EdgeKind) -> &'static str {
    match k {
        EdgeKind::One => "one",
        EdgeKind::Scatter => "scatter",
        EdgeKind::Broadcast => "broadcast",
        EdgeKind::Gather => "gather",
        EdgeKind::Shuffle => "shuffle",
    }
}

impl fmt::Display for EdgeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(kind_name(*self))
    }
}

fn yaml_error(file: &str, text: &str, e: &serde_saphyr::Error) -> DagError {
    let loc = e.location().filter(|l| l.line() > 0);
    // The rendered error may carry a source snippet over several lines; keep the first line.
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // Drop serde-saphyr's own "line N column M: " prefix: the location is shown once, in front.
    let message = match first.split_once(": ") {
        Some((head, rest)) if head.starts_with("line ") && head.contains(" column ") => rest,
        _ => first,
    }
    .to_owned();
    let named = message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field"))
        .map(str::to_owned);
    // Otherwise (a wrong type, a duplicate key, ...) the field is the one at the error's place.
    let field = named
        .or_else(|| loc.and_then(|l| crate::yaml::path_at(text, l.line(), l.column())))
        .unwrap_or_default();
    let message = crate::yaml::plain_message(&message);
    DagError {
        file: file.to_owned(),
        line: loc.map(|l| l.line() as u32),
        column: loc.map(|l| l.column() as u32),
        field,
        message,
    }
}

/// Checks a function's `image` and `command` (the executable form).
fn check_executable(
    errs: &Errs<'_>,
    i: usize,
    image: &Spanned<String>,
    command: &Spanned<Vec<Spanned<String>>>,
) -> Result<(), DagError> {
    let at = |field: &str| format!("functions[{i}].{field}");
    if image.value.trim().is_empty() {
        return Err(errs.at(image, at("image"), "the image must not be empty"));
    }
    if !valid_image(&image.value) {
        let shown: String = image.value.chars().take(80).collect();
        return Err(errs.at(
            image,
            at("image"),
            format!(
                "{shown:?} is not an image reference ([registry/]name[:tag][@digest], lowercase name, at most {MAX_IMAGE_BYTES} bytes)"
            ),
        ));
    }
    if command.value.is_empty() {
        return Err(errs.at(command, at("command"), "the command needs an executable"));
    }
    if command.value.len() > MAX_COMMAND_ARGS {
        return Err(errs.at(
            command,
            at("command"),
            format!(
                "{} words; a command has at most {MAX_COMMAND_ARGS}",
                command.value.len()
            ),
        ));
    }
    for (j, word) in command.value.iter().enumerate() {
        if let Some(problem) = command_word_problem(&word.value, j == 0) {
            return Err(errs.at(word, at(&format!("command[{j}]")), problem));
        }
    }
    Ok(())
}

fn build(errs: &Errs<'_>, mut spec: DagSpec) -> Result<Dag, DagError> {
    let spec_edges = spec.edges.take().unwrap_or_default();
    if !valid_dag_name(&spec.name.value) {
        return Err(errs.at(
            &spec.name,
            "name",
            format!(
                "{:?} is not a valid DAG name (lowercase letters, digits and '-', at most 63)",
                spec.name.value
            ),
        ));
    }

    if let Some(d) = &spec.description {
        if d.value.len() > MAX_TEXT_BYTES {
            return Err(errs.at(
                d,
                "description",
                format!(
                    "the description has {} bytes; at most {MAX_TEXT_BYTES}",
                    d.value.len()
                ),
            ));
        }
        if d.value
            .chars()
            .any(|c| (c.is_control() && !matches!(c, '\t' | '\n')) || is_bidi_control(c))
        {
            return Err(errs.at(
                d,
                "description",
                "the description must not contain control or text-direction characters",
            ));
        }
    }

    let mut params = BTreeMap::new();
    if let Some(p) = &spec.params {
        if p.value.len() > MAX_PARAMS {
            return Err(errs.at(
                p,
                "params",
                format!(
                    "{} parameters; a DAG declares at most {MAX_PARAMS}",
                    p.value.len()
                ),
            ));
        }
        for (k, v) in &p.value {
            let field = format!("params.{k}");
            if k.is_empty()
                || k.len() > 63
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(errs.at(
                    v,
                    field,
                    "parameter names use letters, digits, '_' and '-', at most 63",
                ));
            }
            if !(v.value.is_number() || v.value.is_string() || v.value.is_boolean()) {
                return Err(errs.at(v, field, "a parameter is a number, a string or a boolean"));
            }
            if v.value.as_str().is_some_and(|s| s.len() > MAX_TEXT_BYTES) {
                return Err(errs.at(
                    v,
                    field,
                    format!("a parameter string is at most {MAX_TEXT_BYTES} bytes"),
                ));
            }
            params.insert(k.clone(), v.value.clone());
        }
    }

    let work_params = match &spec.work_params {
        None => None,
        Some(list) => {
            let mut names: Vec<String> = Vec::with_capacity(list.value.len());
            for (i, n) in list.value.iter().enumerate() {
                let field = format!("work_params[{i}]");
                if !params.contains_key(&n.value) {
                    return Err(errs.at(
                        n,
                        field,
                        format!("parameter {:?} is not declared under params", n.value),
                    ));
                }
                if names.contains(&n.value) {
                    return Err(errs.at(n, field, format!("duplicate parameter {:?}", n.value)));
                }
                names.push(n.value.clone());
            }
            names.sort();
            Some(names)
        }
    };

    if spec.functions.value.is_empty() {
        return Err(errs.at(
            &spec.functions,
            "functions",
            "a DAG needs at least one function",
        ));
    }
    if spec.functions.value.len() > MAX_FUNCTIONS {
        return Err(errs.at(
            &spec.functions,
            "functions",
            format!(
                "{} functions; a DAG has at most {MAX_FUNCTIONS}",
                spec.functions.value.len()
            ),
        ));
    }
    if spec_edges.len() > MAX_EDGES {
        return Err(errs.at(
            &spec_edges[MAX_EDGES],
            "edges",
            format!("{} edges; a DAG has at most {MAX_EDGES}", spec_edges.len()),
        ));
    }

    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut functions = Vec::with_capacity(spec.functions.value.len());
    for (i, fs) in spec.functions.value.iter().enumerate() {
        let f = &fs.value;
        let at = |field: &str| format!("functions[{i}].{field}");
        let name = f.name.value.clone();
        if !valid_function_name(&name) {
            return Err(errs.at(
                &f.name,
                at("name"),
                format!("{name:?} is not a valid function name (lowercase letters, digits, '-' and '_', at most 63)"),
            ));
        }
        if RESERVED_NAMES.contains(&name.as_str()) {
            return Err(errs.at(
                &f.name,
                at("name"),
                format!("{name:?} is reserved by the file ABI"),
            ));
        }
        if names.insert(name.clone(), i).is_some() {
            return Err(errs.at(&f.name, at("name"), format!("duplicate function {name:?}")));
        }
        let (image, command, handler) = match (&f.handler, &f.image, &f.command) {
            (Some(h), None, None) => {
                if !valid_handler_name(&h.value) {
                    let shown: String = h.value.chars().take(80).collect();
                    return Err(errs.at(
                        h,
                        at("handler"),
                        format!(
                            "{shown:?} is not a lambda name (letters, digits, '-', '_' and '.', not first, at most {MAX_HANDLER_BYTES})"
                        ),
                    ));
                }
                (String::new(), Vec::new(), Some(h.value.clone()))
            }
            (Some(h), _, _) => {
                return Err(errs.at(
                    h,
                    at("handler"),
                    "a function runs either a handler or an image and command, not both",
                ));
            }
            (None, Some(image), Some(command)) => {
                check_executable(errs, i, image, command)?;
                (
                    image.value.clone(),
                    command.value.iter().map(|w| w.value.clone()).collect(),
                    None,
                )
            }
            (None, None, _) => {
                return Err(errs.at(
                    fs,
                    at("image"),
                    "missing field `image` (or name a registered lambda with `handler`)",
                ));
            }
            (None, Some(_), None) => {
                return Err(errs.at(
                    fs,
                    at("command"),
                    "missing field `command` (or name a registered lambda with `handler`)",
                ));
            }
        };
        let timeout_s = match &f.timeout {
            None => DEFAULT_TIMEOUT_S,
            Some(t) => {
                let secs = match &t.value {
                    ScalarSpec::Int(n) if *n > 0 => Some(*n as f64),
                    ScalarSpec::Float(x) if x.is_finite() && *x > 0.0 => Some(*x),
                    ScalarSpec::Str(s) => {
                        s.parse::<Seconds>().ok().map(|s| s.0).filter(|s| *s > 0.0)
                    }
                    _ => None,
                };
                match secs {
                    Some(s) if s <= 86_400.0 => s,
                    _ => {
                        return Err(errs.at(
                            t,
                            at("timeout"),
                            format!(
                                "{} is not a duration from 1ms to 24h (e.g. 300s, 250ms, 5m)",
                                t.value
                            ),
                        ));
                    }
                }
            }
        };
        let instances = match &f.instances {
            None => Instances::Follow,
            Some(s) => match &s.value {
                ScalarSpec::Int(n) if (1..=MAX_INSTANCES as i64).contains(n) => {
                    Instances::Fixed(*n as u32)
                }
                ScalarSpec::Str(txt) => match param_reference(txt) {
                    Some(p) if params.contains_key(p) => Instances::Param(p.to_owned()),
                    Some(p) => {
                        return Err(errs.at(
                            s,
                            at("instances"),
                            format!("parameter {p:?} is not declared under params"),
                        ));
                    }
                    None => {
                        return Err(errs.at(
                            s,
                            at("instances"),
                            format!("{} is neither a number nor {{{{ params.NAME }}}}", s.value),
                        ));
                    }
                },
                _ => {
                    return Err(errs.at(
                        s,
                        at("instances"),
                        format!(
                            "{} is not a whole number from 1 to {MAX_INSTANCES}",
                            s.value
                        ),
                    ));
                }
            },
        };
        let retries = match &f.retries {
            None => None,
            Some(r) => Some(retries_of(errs, &r.value, &at)?),
        };
        let mut env = BTreeMap::new();
        let mut secrets = BTreeMap::new();
        if let Some(e) = &f.env {
            let mut bytes = 0;
            for (k, v) in &e.value {
                let name_ok = k
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !name_ok || reserved_env(k) {
                    return Err(errs.at(
                        e,
                        at(&format!("env.{k}")),
                        "a variable's name is letters, digits and `_`, not first a digit; not `SONIC_...` (the lambda ABI's own), `PATH`, `HOME` or `TMPDIR` (the sandbox's), nor `LD_...` (the loader's)",
                    ));
                }
                let value = match &v.value {
                    EnvValue::Str(s) => s.clone(),
                    EnvValue::Int(n) => n.to_string(),
                    EnvValue::Float(x) => x.to_string(),
                    EnvValue::Bool(b) => b.to_string(),
                    EnvValue::Secret(r) => {
                        if !valid_secret_name(&r.secret) {
                            let shown: String = r.secret.chars().take(80).collect();
                            return Err(errs.at(
                                v,
                                at(&format!("env.{k}")),
                                format!(
                                    "{shown:?} is not a secret's name (letters, digits, '.', '_' and '-', not first a '.', at most 128)"
                                ),
                            ));
                        }
                        bytes += k.len() + r.secret.len();
                        secrets.insert(k.clone(), r.secret.clone());
                        continue;
                    }
                };
                if value.contains('\0') {
                    return Err(errs.at(v, at(&format!("env.{k}")), "a value cannot hold NUL"));
                }
                bytes += k.len() + value.len();
                env.insert(k.clone(), value);
            }
            if env.len() + secrets.len() > MAX_ENV_VARS || bytes > MAX_ENV_BYTES {
                return Err(errs.at(
                    e,
                    at("env"),
                    format!("at most {MAX_ENV_VARS} variables and {MAX_ENV_BYTES} bytes"),
                ));
            }
        }
        functions.push(Function {
            name,
            image,
            command,
            handler,
            timeout_s,
            instances,
            retries,
            env,
            secrets,
        });
    }

    // The function run when a job fails: one instance, alone, no edges.
    let on_failure = match &spec.on_failure {
        None => None,
        Some(o) => {
            let Some(&k) = names.get(&o.value) else {
                return Err(errs.at(
                    o,
                    "on_failure",
                    format!("unknown function {:?} (name one of `functions`)", o.value),
                ));
            };
            if !matches!(
                functions[k].instances,
                Instances::Follow | Instances::Fixed(1)
            ) {
                return Err(errs.at(
                    o,
                    "on_failure",
                    format!(
                        "function {:?} runs once when a job fails: it has one instance (leave `instances` out)",
                        o.value
                    ),
                ));
            }
            if functions.len() == 1 {
                return Err(errs.at(
                    o,
                    "on_failure",
                    "a DAG needs a function besides the one it runs on failure",
                ));
            }
            Some(k)
        }
    };

    let mut edges: Vec<(usize, Edge)> = Vec::with_capacity(spec_edges.len());
    // Per function, the edges into it so far.
    let mut inputs = vec![0usize; functions.len()];
    let mut seen = BTreeSet::new();
    for (i, es) in spec_edges.iter().enumerate() {
        let e = &es.value;
        let at = |field: &str| format!("edges[{i}].{field}");
        let from = *names.get(&e.from.value).ok_or_else(|| {
            errs.at(
                &e.from,
                at("from"),
                format!("unknown function {:?}", e.from.value),
            )
        })?;
        let to = *names.get(&e.to.value).ok_or_else(|| {
            errs.at(
                &e.to,
                at("to"),
                format!("unknown function {:?}", e.to.value),
            )
        })?;
        let kind = parse_edge_kind(&e.kind.value).ok_or_else(|| {
            errs.at(
                &e.kind,
                at("kind"),
                format!(
                    "{:?} is not an edge kind (one, scatter, broadcast, gather, shuffle)",
                    e.kind.value
                ),
            )
        })?;
        if from == to {
            return Err(errs.at(
                es,
                format!("edges[{i}]"),
                format!("function {:?} sends to itself", e.from.value),
            ));
        }
        if let Some(k) = on_failure
            && (from == k || to == k)
        {
            return Err(errs.at(
                es,
                format!("edges[{i}]"),
                format!(
                    "function {:?} is the DAG's on_failure function: it runs alone, once, when a job fails, and has no edges",
                    functions[k].name
                ),
            ));
        }
        if !seen.insert((from, to)) {
            return Err(errs.at(
                es,
                format!("edges[{i}]"),
                format!("duplicate edge {} -> {}", e.from.value, e.to.value),
            ));
        }
        inputs[to] += 1;
        if inputs[to] > MAX_INPUTS {
            return Err(errs.at(
                es,
                format!("edges[{i}]"),
                format!(
                    "function {:?} reads from more than {MAX_INPUTS} functions (the planner tries every combination of its inputs' methods); gather them through a function in between",
                    e.to.value
                ),
            ));
        }
        edges.push((i, Edge { from, to, kind }));
    }

    // Topological order (Kahn), stable in file order; a leftover means a cycle.
    let n = functions.len();
    let mut indegree = vec![0usize; n];
    for (_, e) in &edges {
        indegree[e.to] += 1;
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for (_, e) in edges.iter().filter(|(_, e)| e.from == i) {
            indegree[e.to] -= 1;
            if indegree[e.to] == 0 {
                ready.insert(e.to);
            }
        }
    }
    if order.len() < n {
        let cyclic: Vec<&str> = (0..n)
            .filter(|&i| indegree[i] > 0)
            .map(|i| functions[i].name.as_str())
            .collect();
        let (idx, _) = edges
            .iter()
            .find(|(_, e)| indegree[e.from] > 0 && indegree[e.to] > 0)
            .copied()
            .unwrap_or(edges[0]);
        return Err(errs.at(
            &spec_edges[idx],
            format!("edges[{idx}]"),
            format!("the edges form a cycle through {}", cyclic.join(", ")),
        ));
    }
    // The on_failure function leaves the DAG's functions (no edge names it).
    let on_failure = on_failure.map(|k| {
        order.retain(|&i| i != k);
        functions[k].clone()
    });
    let mut position = vec![0usize; n];
    for (pos, &i) in order.iter().enumerate() {
        position[i] = pos;
    }
    let functions: Vec<Function> = order.iter().map(|&i| functions[i].clone()).collect();
    let spans: Vec<usize> = edges.iter().map(|(i, _)| *i).collect();
    let edges: Vec<Edge> = edges
        .into_iter()
        .map(|(_, e)| Edge {
            from: position[e.from],
            to: position[e.to],
            kind: e.kind,
        })
        .collect();

    let bounds = match &spec.bounds {
        None => Bounds::default(),
        Some(b) => {
            let max_latency_s = match &b.max_latency {
                None => None,
                Some(t) => {
                    let secs = match &t.value {
                        ScalarSpec::Int(n) if *n > 0 => Some(*n as f64),
                        ScalarSpec::Float(x) if x.is_finite() && *x > 0.0 => Some(*x),
                        ScalarSpec::Str(s) => {
                            s.parse::<Seconds>().ok().map(|s| s.0).filter(|s| *s > 0.0)
                        }
                        _ => None,
                    };
                    Some(secs.ok_or_else(|| {
                        errs.at(
                            t,
                            "bounds.max_latency",
                            format!("{} is not a positive duration", t.value),
                        )
                    })?)
                }
            };
            let max_cost_usd = match &b.max_cost_usd {
                None => None,
                Some(c) if c.value.is_finite() && c.value > 0.0 => Some(c.value),
                Some(c) => {
                    return Err(errs.at(
                        c,
                        "bounds.max_cost_usd",
                        format!("{} is not a positive amount", c.value),
                    ));
                }
            };
            Bounds {
                max_latency_s,
                max_cost_usd,
            }
        }
    };

    let deadline_s = match &spec.deadline {
        None => None,
        Some(d) => {
            let secs = match &d.value {
                ScalarSpec::Int(n) if *n > 0 => Some(*n as f64),
                ScalarSpec::Str(s) => s.parse::<Seconds>().ok().map(|s| s.0),
                _ => None,
            };
            match secs {
                Some(s) if s > 0.0 && s <= MAX_DEADLINE_S => Some(s),
                _ => {
                    return Err(errs.at(
                        d,
                        "deadline",
                        format!(
                            "{} is not a duration from 1ms to 7 days (e.g. 10m, 90s, 2h)",
                            d.value
                        ),
                    ));
                }
            }
        }
    };

    let slo = match &spec.slo {
        None => None,
        Some(o) => {
            let percentile = match &o.value.percentile {
                None => 95.0,
                Some(p) => match &p.value {
                    ScalarSpec::Int(n) => *n as f64,
                    ScalarSpec::Float(x) => *x,
                    ScalarSpec::Str(_) => {
                        return Err(errs.at(
                            p,
                            "slo.percentile",
                            format!("{} is not a number from 50 to 99.9", p.value),
                        ));
                    }
                },
            };
            let latency = match &o.value.latency.value {
                ScalarSpec::Int(n) if *n > 0 => Some(*n as f64),
                ScalarSpec::Float(x) if *x > 0.0 => Some(*x),
                ScalarSpec::Str(s) => s.parse::<Seconds>().ok().map(|s| s.0),
                _ => None,
            };
            let Some(latency) = latency else {
                return Err(errs.at(
                    &o.value.latency,
                    "slo.latency",
                    format!(
                        "{} is not a duration (e.g. 20s, 1500ms, 2m)",
                        o.value.latency.value
                    ),
                ));
            };
            match crate::slo::Slo::new(percentile, latency) {
                Ok(slo) => Some(slo.best_effort(o.value.best_effort.unwrap_or(false))),
                Err(e @ crate::slo::SloError::Percentile(_)) => {
                    let at = o.value.percentile.as_ref().map_or_else(
                        || errs.at(o, "slo", e.to_string()),
                        |p| errs.at(p, "slo.percentile", e.to_string()),
                    );
                    return Err(at);
                }
                Err(e) => return Err(errs.at(&o.value.latency, "slo.latency", e.to_string())),
            }
        }
    };

    let input_required = match &spec.input {
        None => false,
        Some(s) => match s.value.as_str() {
            "required" => true,
            "optional" => false,
            other => {
                let shown: String = other.chars().take(40).collect();
                return Err(errs.at(
                    s,
                    "input",
                    format!("{shown:?} is neither `required` nor `optional`"),
                ));
            }
        },
    };
    let mut triggers = Vec::new();
    for (i, t) in spec.triggers.iter().flatten().enumerate() {
        let field = format!("triggers[{i}]");
        match (&t.value.schedule, &t.value.object_created) {
            (Some(s), None) if input_required => {
                return Err(errs.at(
                    s,
                    format!("{field}.schedule"),
                    "a schedule starts jobs without an input, and this DAG's `input: required` needs one (an object_created trigger gives its object)",
                ));
            }
            (Some(s), None) => match s.value.parse::<crate::schedule::Schedule>() {
                Ok(schedule) => triggers.push(Trigger::Schedule(schedule)),
                Err(e) => return Err(errs.at(s, format!("{field}.schedule"), e)),
            },
            (None, Some(o)) => {
                let p = &o.value.prefix;
                let prefix = p.value.as_str();
                let problem = if prefix.is_empty() || prefix.len() > MAX_TRIGGER_PREFIX_CHARS {
                    Some(format!(
                        "a prefix has 1 to {MAX_TRIGGER_PREFIX_CHARS} characters"
                    ))
                } else if prefix.starts_with('/') || prefix.chars().any(char::is_control) {
                    Some("a prefix is a store key's beginning: no leading `/`, no control characters".to_owned())
                } else if prefix.starts_with("jobs/") || "jobs/".starts_with(prefix) {
                    Some("`jobs/` holds Sonic's own job files: a trigger there would start jobs on every job's files".to_owned())
                } else {
                    None
                };
                if let Some(message) = problem {
                    return Err(errs.at(p, format!("{field}.object_created.prefix"), message));
                }
                triggers.push(Trigger::ObjectCreated {
                    prefix: prefix.to_owned(),
                });
            }
            _ => {
                return Err(errs.at(
                    t,
                    field,
                    "a trigger is one of { schedule: \"<cron>\" } or { object_created: { prefix: ... } }",
                ));
            }
        }
    }

    let dag = Dag {
        name: spec.name.value.clone(),
        description: spec
            .description
            .as_ref()
            .map(|d| d.value.clone())
            .unwrap_or_default(),
        params,
        work_params,
        functions,
        edges,
        bounds,
        deadline_s,
        slo,
        triggers,
        on_failure,
        input_required,
    };
    // Edge kinds must agree with the fanouts under the default parameters.
    if let Err(msg) = dag.fanouts(&dag.params) {
        // Point at the first edge the message names, else at the whole file.
        let idx = dag.edges.iter().enumerate().find(|(_, e)| {
            msg.contains(&format!(
                "{} -> {}",
                dag.functions[e.from].name, dag.functions[e.to].name
            ))
        });
        if let Some((j, _)) = idx {
            return Err(errs.at(&spec_edges[spans[j]], format!("edges[{}]", spans[j]), msg));
        }
        // Else at the function it names ("function NAME: ..."), in file order.
        let named = spec
            .functions
            .value
            .iter()
            .enumerate()
            .find(|(_, f)| msg.starts_with(&format!("function {}:", f.value.name.value)));
        return Err(match named {
            Some((j, f)) => match &f.value.instances {
                Some(inst) => errs.at(inst, format!("functions[{j}].instances"), msg),
                None if msg.contains("instances must be given") => {
                    errs.at(&f.value.name, format!("functions[{j}].instances"), msg)
                }
                None => errs.at(f, format!("functions[{j}]"), msg),
            },
            None => errs.whole("functions", msg),
        });
    }
    Ok(dag)
}
