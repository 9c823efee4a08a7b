//! A host platform that embeds the Sonic control plane as a library and decides itself where
//! jobs run: its [`on_demand::OnDemand`] resource manager starts agents when a job needs them,
//! as `sonic-agent` processes or as containers of the agent image (`--launch container`), and
//! stops them when idle (docs/embedding.md walks through it).
//!
//! ```sh
//! cargo build -p sonic-agent --bin sonic-agent && cargo build -p sonic-lambdas --bin synthetic
//! cargo run -p sonic-control --example host -- --dag dags/synthetic-chain.yaml
//! bash deploy/images/build.sh           # the agent image, for --launch container
//! cargo run -p sonic-control --example host -- --launch container
//! ```

mod containers;
mod on_demand;
mod platform;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// Runs a DAG on agents this host starts on demand: profiling jobs, then a planned one.
#[derive(Debug, Parser)]
struct Args {
    /// The DAG to run (its lambdas must be in --lambda-dir).
    #[arg(long, default_value = "dags/synthetic-chain.yaml")]
    dag: PathBuf,
    /// The `sonic-agent` binary (default: beside this example's target folder).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// Where the lambdas are built (default: this example's target folder, e.g. target/debug).
    #[arg(long)]
    lambda_dir: Option<PathBuf>,
    /// Parameters every job gets, as a JSON object.
    #[arg(long, default_value = "{}")]
    params: String,
    /// Input sizes of the profiling jobs, bytes; the planned job gets the last.
    #[arg(long, value_delimiter = ',', default_value = "100000,300000,500000")]
    sizes: Vec<usize>,
    /// An agent nobody holds for this long is stopped, milliseconds.
    #[arg(long, default_value_t = 2000)]
    idle_ms: u64,
    /// How agents start: as processes, as containers of --image (Docker must answer), or auto
    /// (containers when Docker answers and has the image, else processes).
    #[arg(long, value_enum, default_value_t = Launch::Process)]
    launch: Launch,
    /// The agent image (containers).
    #[arg(long, default_value = containers::DEFAULT_IMAGE)]
    image: String,
    /// Containers run the `sonic-agent` of --agent-bin (mounted read-only) instead of the
    /// image's.
    #[arg(long)]
    mount_agent: bool,
}

/// How the host starts its agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Launch {
    Process,
    Container,
    Auto,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,host=info".into()),
        )
        .init();
    // target/debug/examples/host -> target/debug
    let exe = std::env::current_exe().context("this program's path")?;
    let target = exe
        .parent()
        .and_then(|p| p.parent())
        .context("this program is not in a target folder")?
        .to_path_buf();
    let dir = tempfile::tempdir().context("a folder for the run")?;
    let agent_bin = args.agent_bin.unwrap_or_else(|| target.join("sonic-agent"));
    let containers = containers::ContainerOptions {
        image: args.image.clone(),
        agent_bin: args.mount_agent.then(|| agent_bin.clone()),
        ..containers::ContainerOptions::default()
    };
    let containers = match args.launch {
        Launch::Process => None,
        Launch::Container => Some(containers),
        Launch::Auto => {
            let usable = match containers::connect(Duration::from_secs(3)).await {
                Ok(docker) => containers::check_image(&docker, &args.image).await,
                Err(e) => Err(e),
            };
            match usable {
                Ok(()) => Some(containers),
                Err(e) => {
                    eprintln!("host: agents as processes: {e}");
                    None
                }
            }
        }
    };
    let opts = platform::Options {
        agent_bin,
        lambda_dir: args.lambda_dir.unwrap_or(target),
        dir: dir.path().to_path_buf(),
        dag: std::fs::read_to_string(&args.dag)
            .with_context(|| format!("read {}", args.dag.display()))?,
        params: serde_json::from_str(&args.params).context("--params: a JSON object")?,
        sizes: args.sizes,
        idle: Duration::from_millis(args.idle_ms),
        patience: Duration::from_secs(300),
        containers,
    };
    let outcome = platform::run(&opts).await?;
    for s in &outcome.summaries {
        let plan = s.plan.as_ref();
        println!(
            "{} {:?} {:?} latency {:.3} s cost ${:.6} on {}{}",
            s.job_id,
            s.mode,
            s.status,
            s.latency_s,
            s.cost_usd,
            agents_of(s).join(","),
            plan.map(|p| format!(" notes: {}", p.notes.join("; ")))
                .unwrap_or_default()
        );
    }
    println!("what the host did:");
    for (i, e) in outcome.events.iter().enumerate() {
        if i == outcome.before_planned {
            println!("  -- the planned job is submitted --");
        }
        println!("  {e:?}");
    }
    println!("running at the end: {:?}", outcome.running_at_end);
    if let Some((run, network)) = &outcome.containers {
        println!("removed: the containers labelled sonic.host.run={run} and the network {network}");
    }
    Ok(())
}

/// The agents a job's instances ran on.
fn agents_of(s: &sonic_api::control::JobSummary) -> Vec<String> {
    let mut a: Vec<String> = s.functions.iter().map(|f| f.agent.clone()).collect();
    a.sort();
    a.dedup();
    a
}
