//! Registration with the control plane, the heartbeats after it, and the run reports an agent
//! pushes when a run ends.

use std::time::Duration;

use sonic_api::agent::{Capacity, Heartbeat, RunReport};
use sonic_api::control::{JoinSecrets, Joined};

/// Registers `capacity` at `control_url`, retrying with backoff until it is accepted or `attempts`
/// run out. Returns what the control plane hands a joining agent, when it does.
pub async fn register(
    client: &reqwest::Client,
    control_url: &str,
    token: &str,
    capacity: &Capacity,
    attempts: u32,
) -> Result<Option<JoinSecrets>, String> {
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
                // An older control plane answers the bare record: no secrets.
                let joined: Option<Joined> = r.json().await.ok();
                return Ok(joined.and_then(|j| j.join));
            }
            Ok(r) if r.status().is_client_error() => {
                // A refusal (bad token, bad body) will not change by retrying.
                let status = r.status();
                let why = r.text().await.unwrap_or_default();
                return Err(format!(
                    "control plane refused registration: {status} {}",
                    why.trim()
                ));
            }
            Ok(r) => last = format!("control plane answered {}", r.status()),
            Err(e) => {
                let cause = root_cause(&e);
                // An untrusted certificate will not become trusted by retrying.
                if cause.to_ascii_lowercase().contains("certificate") {
                    return Err(format!(
                        "the control plane's certificate is not trusted ({cause}): is ca_file the cluster's CA?"
                    ));
                }
                last = format!("control plane unreachable: {e}: {cause}");
            }
        }
        tracing::warn!(attempt, error = %last, "registration failed, retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
    Err(last)
}

/// The innermost error of a chain (for reqwest, the TLS or socket error under "error sending
/// request").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Joins the control plane with the join token: registers (retrying until the control plane
/// answers) and returns the secrets it hands out. A control plane that hands out none (it runs
/// no jobs) is an error: the agent could not take part in any.
pub async fn join(
    client: &reqwest::Client,
    control_url: &str,
    join_token: &str,
    capacity: &Capacity,
) -> Result<JoinSecrets, String> {
    tracing::info!(control = control_url, agent = %capacity.agent_id, "joining the control plane");
    register(client, control_url, join_token, capacity, u32::MAX)
        .await?
        .ok_or_else(|| {
            format!("the control plane at {control_url} runs no jobs: it handed out no file key")
        })
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

/// What became of a pushed run report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    Taken,
    /// The control plane answered 4xx (it waits for no such run from this agent, or the token
    /// is wrong): final, retrying would not change it.
    Refused(String),
    /// Unreachable or 5xx after every attempt: the control plane's slow poll reads the report.
    Failed(String),
}

/// Attempts of one push, the first included; the waits between them double from 50 ms (about
/// 1.5 s in all): a control plane that is briefly busy still hears at once, and one that is
/// gone costs little (its slow poll is the fallback).
pub const PUSH_ATTEMPTS: u32 = 6;

/// Pushes the report of run `report.run_id` to the control plane at `control_url`:
/// `POST /v1/agents/{agent_id}/runs/{run_id}/report` with the agents' token, retrying with
/// backoff while it fails in a way that may pass.
pub async fn push_report(
    client: &reqwest::Client,
    control_url: &str,
    token: &str,
    agent_id: &str,
    report: &RunReport,
    attempts: u32,
) -> PushOutcome {
    let url = format!(
        "{}/v1/agents/{agent_id}/runs/{}/report",
        control_url.trim_end_matches('/'),
        report.run_id
    );
    let mut delay = Duration::from_millis(50);
    let mut last = String::new();
    for attempt in 1..=attempts.max(1) {
        let sent = client
            .post(&url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(10))
            .json(report)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return PushOutcome::Taken,
            Ok(r)
                if r.status().is_client_error()
                    && r.status() != reqwest::StatusCode::TOO_MANY_REQUESTS =>
            {
                let status = r.status();
                let why = r.text().await.unwrap_or_default();
                return PushOutcome::Refused(format!("{status} {}", why.trim()));
            }
            Ok(r) => last = format!("control plane answered {}", r.status()),
            Err(e) => last = format!("control plane unreachable: {e}: {}", root_cause(&e)),
        }
        if attempt < attempts {
            tracing::debug!(attempt, error = %last, "report push failed, retrying");
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
    PushOutcome::Failed(last)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::http::{HeaderMap, StatusCode, Uri};
    use sonic_api::agent::RunStatus;

    use super::*;

    fn report() -> RunReport {
        RunReport {
            cold: Some(true),
            seconds: Some(0.1),
            exit_code: Some(0),
            ..RunReport::new("j-1.f.0.1".into(), RunStatus::Succeeded)
        }
    }

    /// A control plane that answers the i-th push with `answers[i]` (the last one after), and
    /// records the path and authorization of each.
    async fn control(answers: Vec<StatusCode>) -> (String, Arc<Mutex<Vec<(String, String)>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let n = Arc::new(AtomicU32::new(0));
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
            let log = log.clone();
            let n = n.clone();
            let answers = answers.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                log.lock().unwrap().push((uri.path().to_owned(), auth));
                let i = n.fetch_add(1, Ordering::SeqCst) as usize;
                answers[i.min(answers.len() - 1)]
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, seen)
    }

    #[tokio::test]
    async fn a_push_retries_what_may_pass_and_stops_at_a_refusal() {
        let client = reqwest::Client::new();
        let busy = vec![
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::NO_CONTENT,
        ];
        let (url, seen) = control(busy).await;
        let out = push_report(&client, &url, "agents-token", "a-1", &report(), 6).await;
        assert_eq!(out, PushOutcome::Taken);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (path, auth) in &seen {
            assert_eq!(path, "/v1/agents/a-1/runs/j-1.f.0.1/report");
            assert_eq!(auth, "Bearer agents-token");
        }

        let (url, seen) = control(vec![StatusCode::NOT_FOUND]).await;
        let out = push_report(&client, &url, "agents-token", "a-1", &report(), 6).await;
        assert!(
            matches!(out, PushOutcome::Refused(ref why) if why.starts_with("404")),
            "{out:?}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1, "a refusal is not retried");

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let out = push_report(&client, &dead, "agents-token", "a-1", &report(), 2).await;
        assert!(matches!(out, PushOutcome::Failed(_)), "{out:?}");
    }
}
