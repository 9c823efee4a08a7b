//! `sonic-agent`: parses flags, loads the configuration, starts tracing and runs the agent.

use clap::Parser;
use sonic_agent::config::{AgentArgs, AgentConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = AgentArgs::parse();
    sonic_daemon::logging::init(args.log_format, "info").map_err(anyhow::Error::msg)?;
    let config = AgentConfig::load(&args)?;
    let agent = sonic_agent::start_from_config(config).await?;
    tracing::info!(url = %agent.url(), "sonic-agent ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
    agent.stop().await;
    Ok(())
}
