//! Jobs through the control plane's API, as `ofctl` and the evaluation submit them: register a
//! DAG, submit a job (its input inline or already in the store), follow it to its end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use serde_json::Value;
use sonic_api::control::{JobAccepted, JobEvent, JobStatus, SubmitJob};

use crate::client::{Client, RequestError, encode};
use crate::progress::Progress;

/// Registers a DAG file's text under the name `file` (errors name it); true when created.
pub async fn apply_text(
    client: &Client,
    file: &str,
    text: String,
) -> anyhow::Result<(Value, bool)> {
    let path = format!("/v1/dags?file={}", encode(file));
    let (status, v): (_, Value) = client.put_yaml(&path, text).await?;
    Ok((v, status == reqwest::StatusCode::CREATED))
}

/// A job's input.
#[derive(Debug, Clone)]
pub enum JobInput {
    /// A file sent inline.
    File(PathBuf),
    /// An object already in the cluster's store.
    Key { key: String, name: String },
}

/// What `ofctl run` submits.
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub dag: String,
    pub input: Option<JobInput>,
    pub params: Vec<(String, Value)>,
    pub policy: Option<String>,
    /// A forced static policy placed the way the planner places that baseline.
    pub planned: bool,
    /// The submission's `Idempotency-Key`: a second submission with it returns the first job.
    pub key: Option<String>,
    /// A percentile objective overriding the DAG's (`--slo p95=20s`).
    pub slo: Option<sonic_core::slo::Slo>,
    /// Where no plan meets the objective, run the fastest instead of refusing the job.
    pub slo_best_effort: bool,
    /// Run this revision of the DAG rather than the one applied last.
    pub revision: Option<u64>,
}

/// A name the control plane accepts under `input/`: letters, digits, `.`, `_`, `-`.
fn input_name(path: &Path) -> String {
    let raw = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    let clean = clean.trim_start_matches('.').to_owned();
    if clean.is_empty() {
        "input".into()
    } else {
        clean
    }
}

/// `POST /v1/jobs`; the answer (202 for a new job, 200 for the job its key made before).
pub async fn submit(client: &Client, req: &JobRequest) -> anyhow::Result<Value> {
    let input = match &req.input {
        None => None,
        Some(JobInput::File(path)) => {
            let data =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some(sonic_api::control::JobInput {
                name: Some(input_name(path)),
                base64: Some(base64(&data)),
                key: None,
            })
        }
        Some(JobInput::Key { key, name }) => Some(sonic_api::control::JobInput {
            name: Some(name.clone()),
            base64: None,
            key: Some(key.clone()),
        }),
    };
    let body = SubmitJob {
        dag: req.dag.clone(),
        input,
        params: req.params.iter().cloned().collect(),
        // Refused here, as the control plane would, with its words.
        policy: req
            .policy
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e: String| anyhow!(e))?,
        planned: req.planned,
        slo: req.slo,
        slo_best_effort: req.slo_best_effort,
        revision: req.revision,
    };
    let v: Value = client
        .post_keyed("/v1/jobs", &body, req.key.as_deref())
        .await
        .map_err(|e| {
        match e.status() {
            Some(s) if s == reqwest::StatusCode::PAYLOAD_TOO_LARGE => anyhow!(
                "{e}: the input is too large to send inline to this control plane (raise its max_body)"
            ),
            _ => anyhow::Error::new(e),
        }
    })?;
    // The answer is kept as sent (for `-o json`), once it is known to be an acceptance.
    serde_json::from_value::<JobAccepted>(v.clone())
        .with_context(|| format!("unexpected answer to POST /v1/jobs: {v}"))?;
    Ok(v)
}

/// `GET /v1/jobs/{id}` as sent.
pub async fn get_job(client: &Client, id: &str) -> Result<Value, RequestError> {
    client.get(&format!("/v1/jobs/{}", encode(id))).await
}

fn status_of(v: &Value) -> Option<JobStatus> {
    v["status"].as_str().and_then(|s| s.parse().ok())
}

/// Follows a job to its end (server-sent events when the control plane has them, else polling)
/// and returns its summary as sent.
pub async fn wait_job(client: &Client, id: &str, progress: &mut Progress) -> anyhow::Result<Value> {
    let started = std::time::Instant::now();
    match client
        .get_raw(&format!("/v1/jobs/{}/events", encode(id)))
        .await
    {
        Ok(resp) => {
            let is_sse = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if is_sse {
                follow_events(client, id, resp, progress, started).await?;
            }
        }
        // An older control plane: poll instead.
        Err(e) if e.is_route_missing() => {}
        Err(e) => return Err(e.into()),
    }
    loop {
        let v = get_job(client, id).await?;
        let status = status_of(&v);
        if status.is_some_and(JobStatus::is_terminal) {
            progress.clear();
            return Ok(v);
        }
        progress.update(&format!(
            "job {id} {} ({:.0} s)",
            status.map_or("?", JobStatus::as_str),
            started.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads events until one says the job ended, the stream ends, or it goes quiet while the job
/// ended anyway (checked every few seconds). The caller then reads the summary.
async fn follow_events(
    client: &Client,
    id: &str,
    mut resp: reqwest::Response,
    progress: &mut Progress,
    started: std::time::Instant,
) -> anyhow::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(Duration::from_secs(3), resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            // The stream ended or broke: polling takes over.
            Ok(Ok(None)) | Ok(Err(_)) => return Ok(()),
            Err(_) => {
                let v = get_job(client, id).await?;
                if status_of(&v).is_some_and(JobStatus::is_terminal) {
                    return Ok(());
                }
                continue;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let Ok(ev) = serde_json::from_str::<JobEvent>(data.trim()) else {
                continue;
            };
            if ev.status.is_terminal() {
                return Ok(());
            }
            let mut line = format!(
                "job {id} {} {}/{} instances",
                ev.status, ev.done_instances, ev.total_instances
            );
            if let Some(stage) = &ev.stage {
                line.push_str(&format!(", stage {stage}"));
            }
            line.push_str(&format!(" ({:.0} s)", started.elapsed().as_secs_f64()));
            progress.update(&line);
        }
    }
}

/// Standard base64 with padding (the job input's inline encoding).
pub fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_examples() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn input_names() {
        assert_eq!(input_name(Path::new("/tmp/records.bin")), "records.bin");
        assert_eq!(input_name(Path::new("my data.csv")), "my_data.csv");
        assert_eq!(input_name(Path::new(".hidden")), "hidden");
    }
}
