//! `sonic-agent`: parses flags, loads the configuration, starts tracing and runs the agent.

use clap::Parser;
use sonic_agent::config::{AgentArgs, AgentConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = AgentArgs::parse();
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
