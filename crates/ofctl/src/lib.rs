//! The `ofctl` commands as library calls, so tests run them without a process.
//!
//! `plan` is offline; `up` and `demo` run a whole cluster in this process ([`up`]); the other
//! commands talk to a control plane over HTTP ([`client`]), found through the saved configuration
//! ([`config`]) or `--server` / `SONIC_SERVER` and `SONIC_TOKEN`. The cluster and the client are
//! the `sonic-cluster` library's.

pub mod commands;
pub mod demo;
pub mod plan;
pub mod render;
pub mod up;

/// The control plane's client, the saved context and the progress line live in `sonic-cluster`.
pub use sonic_cluster::{SandboxArg, StoreArg, client, config, progress};
/// `ofctl bench` is the front door of the evaluation, the `sonic-eval` crate.
pub use sonic_eval as bench;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// For people.
    #[default]
    Table,
    /// One JSON document on stdout.
    Json,
}

/// A request the command line cannot mean (exit status 2, like clap's own usage errors).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A job that ended `failed` (exit status 1; its summary was printed).
#[derive(Debug)]
pub struct JobFailed {
    pub job_id: String,
    pub error: String,
}

impl std::fmt::Display for JobFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {} failed: {}", self.job_id, self.error)
    }
}

impl std::error::Error for JobFailed {}

/// The exit status for an error a command returned: 2 for bad usage, 1 for everything else.
pub fn exit_status(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<UsageError>().is_some() {
        2
    } else {
        1
    }
}

/// The error as one line (causes joined, newlines folded).
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Parser)]
#[command(name = "ofctl", version, about = "Sonic: plan and run serverless DAGs")]
pub struct Cli {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    /// The control plane's URL (default: the one `ofctl up` saved).
    #[arg(long, env = "SONIC_SERVER", global = true)]
    pub server: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// What `ofctl get` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Dags,
    Jobs,
    Agents,
    /// One DAG (`get dag NAME`): its revisions and its file.
    Dag,
    /// The secrets functions may name: names, sizes, sources (never values).
    Secrets,
}

/// What `ofctl describe` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DescribeKind {
    Job,
}

/// What `ofctl delete` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeleteKind {
    Dag,
    /// An ended job: its record, logs, results and input.
    Job,
    /// A secret of the control plane's store.
    Secret,
}

/// What `ofctl create` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CreateKind {
    /// A secret a DAG's functions name as `env: { VAR: { secret: NAME } }`.
    Secret,
}

/// The flags of `ofctl up` (and the cluster part of `ofctl demo`).
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// How many agents (VMs) to start; their types cycle through the catalog.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub agents: u32,
    /// The VM catalog (YAML); the built-in one (deploy/catalog.yaml) when omitted.
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = SandboxArg::Auto)]
    pub sandbox: SandboxArg,
    #[arg(long, value_enum, default_value_t = StoreArg::Auto)]
    pub store: StoreArg,
    /// Start no memory tier: by default a private redis-server (when installed) holds the files
    /// of `memory` edges; without one no plan uses `memory`. `bench` never starts one.
    #[arg(long)]
    pub no_memory_tier: bool,
    /// Where the database, agent files and local store live (default: ~/.local/share/sonic for
    /// `up`, a temporary directory for `demo`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address of the control plane's API (default 127.0.0.1:7000 for `up`, any free port for
    /// `demo`; port 0: any free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Folder of the lambda executables for the process sandbox (default: next to ofctl, built
    /// with cargo first when ofctl runs from a checkout).
    #[arg(long, env = "SONIC_LAMBDAS_DIR")]
    pub lambdas: Option<PathBuf>,
    /// Also serve OpenLambda's worker API (`/run/<name>`, `/registry`) with Python handlers on
    /// this address, e.g. 127.0.0.1:5000 (docs/python.md).
    #[arg(long)]
    pub openlambda: Option<SocketAddr>,
    /// The bearer token the OpenLambda listener requires (needed off loopback).
    #[arg(long, env = "SONIC_OPENLAMBDA_TOKEN", hide_env_values = true)]
    pub openlambda_token: Option<String>,
    /// An OpenLambda worker configuration (`config.json`) for the listener to follow: its
    /// `registry` folder, `registry_cache_ms` and `limits` (docs/python.md).
    #[arg(long, requires = "openlambda")]
    pub openlambda_config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Offline: the plan the optimizer picks for a DAG at given DAG parameters (no server needed).
    Plan {
        /// The DAG file (YAML).
        #[arg(long)]
        dag: PathBuf,
        /// The DAG parameters at one input size (YAML).
        #[arg(long)]
        params: PathBuf,
        /// The VM catalog (YAML); the built-in defaults when omitted.
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// sonic (the planner), sonic-mean (the paper's: means only), remote, local, direct, or
        /// oracle.
        #[arg(long, default_value = "sonic")]
        policy: String,
        /// A percentile objective on job latency, p<percentile>=<duration> (e.g. p95=20s):
        /// the cheapest plan whose predicted latency at that percentile meets it. Overrides the
        /// DAG's `slo:`.
        #[arg(long, value_parser = parse_slo)]
        slo: Option<sonic_core::slo::Slo>,
        /// Where no plan meets the SLO, the plan with the lowest percentile latency instead of
        /// a refusal.
        #[arg(long)]
        slo_best_effort: bool,
    },
    /// Start a whole cluster on this machine in the foreground (Ctrl-C stops it).
    Up(UpArgs),
    /// Start a cluster, learn the sample DAGs, run them planned, explain, stop.
    Demo {
        #[command(flatten)]
        up: UpArgs,
        /// Most profiling jobs per DAG before giving up on convergence.
        #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=100))]
        max_jobs: u32,
        /// Planned jobs per DAG once its models converged.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
        planned_jobs: u32,
    },
    /// Run the evaluation (the paper's experiments) on a cluster on this machine and in the
    /// simulator; writes CSV, SVG charts and a report.
    Bench {
        #[command(flatten)]
        up: UpArgs,
        /// A few minutes: fewer input sizes, fanouts and repetitions.
        #[arg(long)]
        quick: bool,
        /// Where the CSV files, the SVG charts and report.md go.
        #[arg(long, default_value = "docs/results")]
        out: PathBuf,
        /// Run only these experiments (repeatable; default: all but `dilation` and `profile`,
        /// which only run when named).
        #[arg(long, value_enum)]
        only: Vec<bench::Experiment>,
        /// Seeds the random order of the policies in each round and the bootstrap intervals
        /// (default: drawn from the clock; the report names it, so a run can be repeated).
        #[arg(long)]
        seed: Option<u64>,
        /// Where the cluster experiments run: a cluster started in this process, or the cluster
        /// of containers `deploy/cluster.sh up` started (its saved context, or --server).
        #[arg(long, value_enum, default_value_t = bench::harness::ClusterKind::InProcess)]
        cluster: bench::harness::ClusterKind,
        /// The container cluster's time dilation factor (`cluster.sh up --dilation D`): checked
        /// against what its control plane reports, which is what divides the measured times.
        #[arg(long)]
        dilation: Option<f64>,
        /// Rounds of the dilation check (one job per policy each).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
        dilation_reps: u32,
        /// Only this application (repeatable; default: all three). Fig. 2 runs only with
        /// `ml-pipeline`.
        #[arg(long = "app", value_name = "NAME")]
        apps: Vec<String>,
        /// Run Fig. 7's cells even where a policy's plan asks a stage for more VMs of a type
        /// than the cluster has agents of it (the plan is squeezed onto fewer: a testbed error;
        /// jobs.csv's `squeezed` and the report name it).
        #[arg(long)]
        allow_squeezed: bool,
    },
    /// Register or update a DAG.
    Apply {
        /// The DAG file (YAML).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Submit a job.
    Run {
        /// The DAG's name.
        dag: String,
        /// The job's input file (the first functions see it as input/<its name>).
        #[arg(long)]
        input: Option<PathBuf>,
        /// A parameter override, `key=value` (repeatable; values are JSON when they parse).
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, serde_json::Value)>,
        /// remote, direct, local, memory (the cluster's memory tier, where it has one), sonic
        /// (the default: planned once the models converged) or oracle (planned with the
        /// parameters measured at this input size; evaluation).
        #[arg(long)]
        policy: Option<String>,
        /// With --policy remote, direct or local: place the job the way the planner places that
        /// baseline (VM types by predicted memory) instead of spreading it over the agents.
        #[arg(long)]
        planned: bool,
        /// An idempotency key: a second `run` of the DAG with the same key returns the first
        /// job (its id, exit 0), whatever its state, and starts nothing.
        #[arg(long)]
        key: Option<String>,
        /// A percentile objective on the job's latency, p<percentile>=<duration> (e.g.
        /// p95=20s), overriding the DAG's `slo:`: the cheapest plan whose predicted latency at
        /// that percentile meets it; the job is refused (exit 1) when none does.
        #[arg(long, value_parser = parse_slo)]
        slo: Option<sonic_core::slo::Slo>,
        /// Where no plan meets the SLO (the job's or the DAG's), run the plan with the lowest
        /// percentile latency instead of refusing the job.
        #[arg(long)]
        slo_best_effort: bool,
        /// Run this revision of the DAG (`ofctl get dag NAME` lists them) instead of the one
        /// applied last; the job keeps it through resume and retry.
        #[arg(long)]
        revision: Option<u64>,
        /// Follow the job to its end and print its summary.
        #[arg(long)]
        wait: bool,
    },
    /// List DAGs, jobs or agents.
    Get {
        #[arg(value_enum)]
        kind: Kind,
        /// `get dag`: the DAG's name.
        name: Option<String>,
        /// `get dag`: show this revision's file (default: the one applied last).
        #[arg(long)]
        revision: Option<u64>,
        /// `get jobs`: only this DAG's.
        #[arg(long)]
        dag: Option<String>,
        /// `get jobs`: only those in this status (queued, running, succeeded, failed).
        #[arg(long)]
        status: Option<String>,
        /// `get jobs`: at most this many, newest first (default 100, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Show one job in detail.
    Describe {
        #[arg(value_enum)]
        kind: DescribeKind,
        id: String,
    },
    /// What Sonic learned about a DAG: its models and whether they converged, of the parameter
    /// setting a job with these overrides plans with (default: the DAG's default parameters).
    Models {
        dag: String,
        /// A parameter override, `key=value` (repeatable; as `ofctl run --param`).
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, serde_json::Value)>,
    },
    /// A job's lambda logs, optionally of one function.
    Logs {
        job: String,
        function: Option<String>,
    },
    /// Download a job's results into a folder.
    Fetch {
        job: String,
        #[arg(long)]
        to: PathBuf,
    },
    /// Cancel a queued or running job (it ends `failed`, with the reason `cancelled`).
    Cancel { job: String },
    /// Run a failed or cancelled job again under its id: its instances that succeeded are not
    /// run again, their outputs are reused (`reused` in the summary).
    Retry {
        job: String,
        /// Follow the job to its end and print its summary.
        #[arg(long)]
        wait: bool,
    },
    /// Set a secret in the control plane's store, from a file (`-`: standard input) or a
    /// literal; its value is never printed or served back.
    Create {
        #[arg(value_enum)]
        kind: CreateKind,
        name: String,
        /// The file holding the value, its bytes as they are (`-`: standard input).
        #[arg(
            long,
            conflicts_with = "from_literal",
            required_unless_present = "from_literal"
        )]
        from_file: Option<PathBuf>,
        /// The value itself (it stays in your shell's history: prefer --from-file).
        #[arg(long)]
        from_literal: Option<String>,
    },
    /// Delete a DAG's definition (its jobs, samples and models stay), an ended job with its
    /// logs, results and input (the sample it taught stays), or a secret.
    Delete {
        #[arg(value_enum)]
        kind: DeleteKind,
        name: String,
    },
    /// Print the web dashboard's URL (log in there with the token).
    Open,
}

/// `key=value`; the value is JSON when it parses as JSON (numbers, booleans), else a string.
fn parse_param(s: &str) -> Result<(String, serde_json::Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not key=value"))?;
    let k = k.trim();
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    let value = serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_owned()));
    Ok((k.to_owned(), value))
}

/// `--slo p95=20s`.
fn parse_slo(s: &str) -> Result<sonic_core::slo::Slo, String> {
    s.parse()
        .map_err(|e: sonic_core::slo::SloError| e.to_string())
}

/// Runs one command, writing its answer to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let output = cli.output;
    match cli.command {
        Command::Plan {
            dag,
            params,
            catalog,
            policy,
            slo,
            slo_best_effort,
        } => {
            let objective = plan::Objective {
                slo,
                best_effort: slo_best_effort,
            };
            plan::run(
                &dag,
                &params,
                catalog.as_deref(),
                &policy,
                objective,
                output,
                out,
            )
        }
        Command::Up(args) => runtime()?.block_on(up::run(args, output, out)),
        Command::Demo {
            up,
            max_jobs,
            planned_jobs,
        } => {
            let opts = demo::DemoOptions {
                max_jobs,
                planned_jobs,
            };
            runtime()?.block_on(demo::run(up, opts, output, out))
        }
        Command::Bench {
            up,
            quick,
            out: out_dir,
            only,
            seed,
            cluster,
            dilation,
            dilation_reps,
            apps,
            allow_squeezed,
        } => {
            let known: Vec<&str> = bench::apps::apps().iter().map(|a| a.name).collect();
            if let Some(bad) = apps.iter().find(|a| !known.contains(&a.as_str())) {
                return Err(UsageError(format!(
                    "--app {bad}: not an application of the bench ({})",
                    known.join(", ")
                ))
                .into());
            }
            if let Some(d) = dilation
                && !(d.is_finite() && d >= 1.0)
            {
                return Err(UsageError(format!("--dilation takes a number >= 1, not {d}")).into());
            }
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs())
            });
            let opts = bench::BenchOptions {
                quick,
                out_dir,
                data_dir: up.data_dir.clone(),
                only,
                seed,
                cluster,
                server: cli.server.clone(),
                dilation,
                dilation_reps: dilation_reps as usize,
                apps,
                allow_squeezed,
            };
            // Each cluster the bench starts gets its own data folder and a free port. No memory
            // tier: the agents see the store as the catalog prices it (emulated), and a local
            // redis-server would not be; the experiments compare the paper's methods.
            let base = sonic_cluster::ClusterOptions {
                memory: sonic_cluster::MemoryArg::Off,
                ..up.options(PathBuf::new(), SocketAddr::from(([127, 0, 0, 1], 0)))
            };
            runtime()?.block_on(bench::run(base, opts, out))
        }
        command => {
            let target = config::resolve(cli.server.as_deref())?;
            let client = client::Client::new(target)?;
            runtime()?.block_on(commands::run(&client, command, output, out))
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse() {
        assert_eq!(
            parse_param("trees=3"),
            Ok(("trees".into(), serde_json::json!(3)))
        );
        assert_eq!(
            parse_param("dataset=iris"),
            Ok(("dataset".into(), serde_json::json!("iris")))
        );
        assert_eq!(
            parse_param("b.compute_ms=500"),
            Ok(("b.compute_ms".into(), serde_json::json!(500)))
        );
        assert!(parse_param("novalue").is_err());
        assert!(parse_param("=1").is_err());
    }

    #[test]
    fn usage_errors_exit_2() {
        let usage = anyhow::Error::new(UsageError("bad".into()));
        assert_eq!(exit_status(&usage), 2);
        assert_eq!(exit_status(&anyhow::anyhow!("refused")), 1);
        let multi = anyhow::anyhow!("a\nb").context("c");
        assert_eq!(one_line(&multi), "c: a b");
    }
}
