//! `sonic-store-probe`: measures the object store from where it runs (request latency, one VM's
//! write and read throughput, requests per second) and prints one JSON document
//! (`sonic_agent::probe::StoreFigures`). deploy/measure-store.sh runs it inside an agent
//! container of the testbed, through that agent's shaped link.

use std::sync::Arc;

use clap::Parser;
use sonic_agent::probe::{ProbePlan, measure};
use sonic_storage::ObjectStore;
use sonic_storage::s3::{S3Config, S3Store};

#[derive(Debug, Parser)]
#[command(
    name = "sonic-store-probe",
    about = "Measures an S3-compatible store: latency, throughput each way, requests per second"
)]
struct Args {
    #[arg(long, env = "SONIC_S3_ENDPOINT")]
    endpoint: String,
    #[arg(long, env = "SONIC_S3_BUCKET", default_value = "sonic")]
    bucket: String,
    #[arg(long, env = "SONIC_S3_ACCESS_KEY", hide_env_values = true)]
    access_key: String,
    #[arg(long, env = "SONIC_S3_SECRET_KEY", hide_env_values = true)]
    secret_key: String,
    #[arg(long, env = "SONIC_S3_REGION", default_value = "us-east-1")]
    region: String,
    /// Sequential small requests for the latency, each way.
    #[arg(long, default_value_t = 30)]
    small_requests: usize,
    /// Large objects written and read back for the throughputs.
    #[arg(long, default_value_t = 3)]
    large_objects: usize,
    /// Megabytes of a large object (one request: below the client's 16 MB part size).
    #[arg(long, default_value_t = 8)]
    large_mb: usize,
    /// Small PUTs for the request rate.
    #[arg(long, default_value_t = 1000)]
    rate_requests: usize,
    /// How many of them are in flight at once (enough that the latency does not bound the rate).
    #[arg(long, default_value_t = 128)]
    rate_concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if a.large_mb == 0 || a.large_mb > 15 {
        anyhow::bail!("--large-mb: between 1 and 15 (one request, below the 16 MB part size)");
    }
    let mut cfg = S3Config::new(&a.endpoint, &a.bucket, &a.access_key, &a.secret_key);
    cfg.region = a.region.clone();
    // A probe reports what it met; it does not wait out outages or retry.
    cfg.max_attempts = 1;
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(cfg)?);
    let plan = ProbePlan {
        small_requests: a.small_requests,
        large_objects: a.large_objects,
        large_bytes: a.large_mb << 20,
        rate_requests: a.rate_requests,
        rate_concurrency: a.rate_concurrency,
        ..ProbePlan::default()
    };
    let figures = measure(store, &plan).await?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
