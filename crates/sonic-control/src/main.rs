//! `sonic-control`: parses flags, loads the configuration, starts tracing and runs the control plane.

use clap::Parser;
use sonic_control::{ControlArgs, ControlConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = ControlArgs::parse();
    let config = ControlConfig::load(&args)?;
    sonic_control::serve(config).await?;
    Ok(())
}
