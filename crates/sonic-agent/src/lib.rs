//! The per-VM agent: runs function instances in sandboxes and moves their intermediate files.

pub mod config;
pub mod files;
pub mod fileserver;
pub mod memory;
pub mod metrics;
pub mod probe;
pub mod register;
pub mod runner;
pub mod sandbox;
pub mod server;
pub mod throttle;
pub mod transfer;

use std::sync::Arc;

use config::{AgentConfig, SandboxChoice, StoreChoice};
use sandbox::{DockerConfig, DockerSandbox, ProcessConfig, ProcessSandbox, Sandbox, SandboxError};
use sonic_storage::ObjectStore;

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("object store: {0}")]
    Store(#[from] sonic_storage::StoreError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("joining the control plane: {0}")]
    Join(String),
}

/// The image `deploy/build-images.sh` builds and the sample DAGs name.
pub const LAMBDA_IMAGE: &str = "sonic-lambdas:latest";

/// Makes the sandbox the configuration asks for; `auto` takes Docker when an engine answers and
/// has the lambda image, else processes.
pub async fn make_sandbox(config: &AgentConfig) -> Result<Arc<dyn Sandbox>, SandboxError> {
    let docker = || DockerConfig {
        work_dir: config.data_dir.join("containers"),
        idle_timeout: std::time::Duration::from_secs(config.warm_idle_s),
        ..DockerConfig::default()
    };
    let process = || {
        ProcessSandbox::new(ProcessConfig {
            work_dir: config.data_dir.join("processes"),
            path: config.bin_dirs.clone(),
            idle_timeout: std::time::Duration::from_secs(config.warm_idle_s),
            ..ProcessConfig::default()
        })
    };
    Ok(match config.sandbox {
        SandboxChoice::Docker => Arc::new(DockerSandbox::connect_with(docker()).await?),
        SandboxChoice::Process => Arc::new(process()?),
        SandboxChoice::Auto => {
            let why = match DockerSandbox::connect_with(docker()).await {
                Ok(d) => match d.image_exists(LAMBDA_IMAGE).await {
                    Ok(true) => return Ok(Arc::new(d)),
                    Ok(false) => format!(
                        "Docker answers but the lambda image {LAMBDA_IMAGE} is missing (bash deploy/build-images.sh)"
                    ),
                    Err(e) => format!("Docker's image lookup failed: {e}"),
                },
                Err(e) => format!("no Docker engine: {e}"),
            };
            process_fallback(config.process_fallback, &why)?;
            Arc::new(process()?)
        }
    })
}

/// The `auto` sandbox without Docker: lambdas would run as unconfined host processes under the
/// agent's own user (its token, its store keys in reach). Said loudly when allowed; refused,
/// with what to do, when `process_fallback` is false.
fn process_fallback(allowed: bool, why: &str) -> Result<(), SandboxError> {
    if !allowed {
        return Err(SandboxError::Unavailable(format!(
            "{why}, and process_fallback is false: start Docker with the lambda image, or choose the process sandbox explicitly (sandbox: process)"
        )));
    }
    tracing::warn!(
        reason = why,
        "RUNNING LAMBDAS AS UNCONFINED HOST PROCESSES under the agent's user (sandbox auto without Docker): \
         set process_fallback: false (SONIC_AGENT_PROCESS_FALLBACK=false) to refuse, or sandbox: process to choose it"
    );
    Ok(())
}

/// Makes the object store the configuration names, throttled by the agent's bandwidth.
pub async fn make_store(
    config: &AgentConfig,
    throttle: sonic_storage::Throttle,
) -> Result<Option<Arc<dyn ObjectStore>>, sonic_storage::StoreError> {
    use sonic_storage::emulated::Emulated;
    let profile = config.store_profile;
    if let Some(p) = &profile {
        p.check().map_err(sonic_storage::StoreError::Other)?;
    }
    let Some(choice) = &config.store else {
        return Ok(None);
    };
    let store = choice.open(Some(throttle)).await?;
    Ok(Some(match profile {
        Some(p) => Arc::new(Emulated::new(store, p)) as Arc<dyn ObjectStore>,
        None => store,
    }))
}

/// Starts an agent from its configuration: sandbox, listener, joining the control plane (with a
/// join token: the agent's token, file key and, unless configured, store come back from it),
/// store, HTTP API, heartbeats.
pub async fn start_from_config(
    mut config: AgentConfig,
) -> Result<server::RunningAgent, StartError> {
    let sandbox = make_sandbox(&config).await?;
    // The agent's own limiters stand for the VM's network unless something outside limits it.
    let throttle = if config.limit_network {
        throttle::AgentThrottle::from_mbps(config.network_mbps)
    } else {
        throttle::AgentThrottle::unlimited()
    };
    let tls = server::load_tls(&config).await?;
    let listener = server::bind(&mut config).await?;
    if config.joins() {
        let control = config
            .control_url
            .clone()
            .ok_or_else(|| StartError::Join("join_token needs control_url".into()))?;
        let http = transfer::http_client(config.ca_file.as_deref())
            .map_err(|e| StartError::Join(e.to_string()))?;
        let capacity = server::capacity_of(&config, sandbox.kind());
        let secrets = register::join(&http, &control, &config.join_token, &capacity)
            .await
            .map_err(StartError::Join)?;
        config.token = secrets.agent_token;
        config.file_key = secrets.file_key;
        if config.store.is_none() {
            config.store = secrets.store.as_ref().map(StoreChoice::from_spec);
        }
        if config.memory_tier.is_none() {
            config.memory_tier = secrets.memory_tier.clone();
        }
        tracing::info!(
            store = config
                .store
                .as_ref()
                .map_or_else(|| "-".to_owned(), StoreChoice::describe),
            "joined: credentials received"
        );
    }
    let store = make_store(&config, throttle.storage_throttle()).await?;
    Ok(server::start_on(listener, tls, config, sandbox, store, &throttle).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_to_host_processes_is_refused_when_forbidden() {
        process_fallback(true, "no Docker engine: x").expect("allowed by default");
        let err = process_fallback(false, "no Docker engine: x")
            .expect_err("forbidden")
            .to_string();
        assert!(
            err.contains("no Docker engine: x")
                && err.contains("process_fallback is false")
                && err.contains("sandbox: process"),
            "{err}"
        );
    }
}
