//! `sonic-control`: parses flags, loads the configuration, starts tracing and runs the control plane.

use clap::Parser;
use sonic_control::{ControlArgs, ControlConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = ControlArgs::parse();
    sonic_daemon::logging::init(args.log_format, "info").map_err(anyhow::Error::msg)?;
    let config = ControlConfig::load(&args)?;
    sonic_control::serve(config).await?;
    Ok(())
}
