//! Registration with the control plane and the heartbeats after it.

use std::time::Duration;

use sonic_api::agent::{Capacity, Heartbeat};

/// Registers `capacity` at `control_url`, retrying with backoff until it is accepted or `attempts`
/// run out.
pub async fn register(
    client: &reqwest::Client,
    control_url: &str,
    token: &str,
    capacity: &Capacity,
    attempts: u32,
) -> Result<(), String> {
    let url = format!("{}/v1/agents/register", control_url.trim_end_matches('/'));
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 1..=attempts.max(1) {
        match client
            .post(&url)
            .bearer_auth(token)
            .json(capacity)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                tracing::info!(control = control_url, agent = %capacity.agent_id, "registered");
                return Ok(());
            }
            Ok(r) if r.status().is_client_error() => {
                // A refusal (bad token, bad body) will not change by retrying.
                return Err(format!(
                    "control plane refused registration: {}",
                    r.status()
                ));
            }
            Ok(r) => last = format!("control plane answered {}", r.status()),
            Err(e) => last = format!("control plane unreachable: {e}"),
        }
        tracing::warn!(attempt, error = %last, "registration failed, retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
    Err(last)
}

/// Why a heartbeat was not taken.
#[derive(Debug, thiserror::Error)]
pub enum BeatError {
    /// The control plane answered 404: it does not know this agent, which must register again.
    #[error("the control plane does not know this agent")]
    UnknownAgent,
    #[error("heartbeat failed: {0}")]
    Failed(String),
}

/// Sends one heartbeat; the caller loops.
pub async fn heartbeat(
    client: &reqwest::Client,
    control_url: &str,
    token: &str,
    beat: &Heartbeat,
) -> Result<(), BeatError> {
    let url = format!(
        "{}/v1/agents/{}/heartbeat",
        control_url.trim_end_matches('/'),
        beat.agent_id
    );
    let r = client
        .post(&url)
        .bearer_auth(token)
        .json(beat)
        .send()
        .await
        .map_err(|e| BeatError::Failed(e.to_string()))?;
    match r.status() {
        s if s.is_success() => Ok(()),
        reqwest::StatusCode::NOT_FOUND => Err(BeatError::UnknownAgent),
        s => Err(BeatError::Failed(format!("refused: {s}"))),
    }
}
