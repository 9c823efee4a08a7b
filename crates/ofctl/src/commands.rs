//! The commands that talk to a running control plane: apply, run, get, describe, models, logs,
//! fetch, cancel, delete, open.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use sonic_api::control::{
    AgentList, DagList, DagModelsView, DagSummary, JobAccepted, JobEvent, JobLogs, JobStatus,
    JobSummary, SubmitJob,
};

use crate::client::{Client, RequestError, encode, encode_path};
use crate::progress::Progress;
use crate::{Command, DeleteKind, DescribeKind, JobFailed, Kind, Output, UsageError, render};

/// `GET /v1/jobs`.
#[derive(Debug, Deserialize)]
struct JobList {
    jobs: Vec<JobSummary>,
}

/// Prints one JSON document.
pub fn print_json(out: &mut dyn Write, v: &Value) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}

fn typed<T: serde::de::DeserializeOwned>(what: &str, v: &Value) -> anyhow::Result<T> {
    serde_json::from_value(v.clone()).map_err(|e| anyhow!("unexpected answer to {what}: {e}"))
}

/// Runs one server command.
pub async fn run(
    client: &Client,
    command: Command,
    output: Output,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match command {
        Command::Apply { file } => apply(client, &file, output, out).await,
        Command::Run {
            dag,
            input,
            params,
            policy,
            planned,
            wait,
        } => {
            let req = JobRequest {
                dag,
                input: input.map(JobInput::File),
                params,
                policy,
                planned,
            };
            let accepted = submit(client, &req).await?;
            let id = accepted["job_id"]
                .as_str()
                .ok_or_else(|| anyhow!("unexpected answer to POST /v1/jobs: no job_id"))?
                .to_owned();
            if !wait {
                return match output {
                    Output::Json => print_json(out, &accepted),
                    Output::Table => Ok(writeln!(
                        out,
                        "job {id} submitted; follow it with `ofctl describe job {id}`"
                    )?),
                };
            }
            let mut progress = Progress::new();
            let summary = wait_job(client, &id, &mut progress).await?;
            drop(progress);
            let s: JobSummary = typed("GET /v1/jobs/{id}", &summary)?;
            match output {
                Output::Json => print_json(out, &summary)?,
                Output::Table => {
                    render::job(&s, out)?;
                    render::job_plan(&summary, out)?;
                }
            }
            if s.status == JobStatus::Failed {
                return Err(JobFailed {
                    job_id: id,
                    error: s.error.unwrap_or_else(|| "no reason given".into()),
                }
                .into());
            }
            Ok(())
        }
        Command::Get { kind } => {
            let (path, what) = match kind {
                Kind::Dags => ("/v1/dags", "GET /v1/dags"),
                Kind::Jobs => ("/v1/jobs", "GET /v1/jobs"),
                Kind::Agents => ("/v1/agents", "GET /v1/agents"),
            };
            let v: Value = client.get(path).await?;
            match (output, kind) {
                (Output::Json, _) => print_json(out, &v),
                (Output::Table, Kind::Dags) => Ok(render::dags(&typed::<DagList>(what, &v)?, out)?),
                (Output::Table, Kind::Jobs) => {
                    Ok(render::jobs(&typed::<JobList>(what, &v)?.jobs, out)?)
                }
                (Output::Table, Kind::Agents) => {
                    Ok(render::agents(&typed::<AgentList>(what, &v)?, out)?)
                }
            }
        }
        Command::Describe {
            kind: DescribeKind::Job,
            id,
        } => {
            let v = get_job(client, &id).await?;
            match output {
                Output::Json => print_json(out, &v),
                Output::Table => {
                    render::job(&typed("GET /v1/jobs/{id}", &v)?, out)?;
                    Ok(render::job_plan(&v, out)?)
                }
            }
        }
        Command::Models { dag } => {
            let v: Value = client
                .get(&format!("/v1/dags/{}/models", encode(&dag)))
                .await?;
            match output {
                Output::Json => print_json(out, &v),
                Output::Table => Ok(render::models(
                    &typed::<DagModelsView>("GET /v1/dags/{name}/models", &v)?,
                    out,
                )?),
            }
        }
        Command::Logs { job, function } => {
            let mut path = format!("/v1/jobs/{}/logs", encode(&job));
            if let Some(f) = &function {
                path.push_str(&format!("?function={}", encode(f)));
            }
            let v: Value = client.get(&path).await?;
            match output {
                Output::Json => print_json(out, &v),
                Output::Table => Ok(render::logs(
                    &typed::<JobLogs>("GET /v1/jobs/{id}/logs", &v)?,
                    out,
                )?),
            }
        }
        Command::Fetch { job, to } => {
            let fetched = fetch(client, &job, &to).await?;
            match output {
                Output::Json => {
                    print_json(out, &json!({ "job_id": job, "to": to, "files": fetched }))
                }
                Output::Table => {
                    if fetched.is_empty() {
                        writeln!(out, "job {job} has no results")?;
                    }
                    for f in &fetched {
                        writeln!(
                            out,
                            "{}  {}",
                            f["path"].as_str().unwrap_or(""),
                            render::bytes(f["bytes"].as_u64().unwrap_or(0))
                        )?;
                    }
                    Ok(())
                }
            }
        }
        Command::Cancel { job } => {
            let v: Value = client
                .post_empty(&format!("/v1/jobs/{}/cancel", encode(&job)))
                .await?;
            match output {
                Output::Json => print_json(out, &v),
                Output::Table => Ok(writeln!(
                    out,
                    "job {job} cancel requested: it ends failed (cancelled); follow it with `ofctl describe job {job}`"
                )?),
            }
        }
        Command::Delete {
            kind: DeleteKind::Dag,
            name,
        } => {
            client
                .delete(&format!("/v1/dags/{}", encode(&name)))
                .await?;
            match output {
                Output::Json => print_json(out, &json!({ "kind": "dag", "deleted": name })),
                Output::Table => Ok(writeln!(
                    out,
                    "dag {name} deleted (its jobs, samples and models stay: applying it again keeps what was learned)"
                )?),
            }
        }
        Command::Open => {
            let url = dashboard_url(client.server());
            match output {
                Output::Json => print_json(out, &json!({ "url": url })),
                Output::Table => Ok(writeln!(out, "{url}")?),
            }
        }
        Command::Plan { .. } | Command::Up(_) | Command::Demo { .. } | Command::Bench { .. } => {
            Err(UsageError("not a server command".into()).into())
        }
    }
}

/// The dashboard's address: the control plane's own root (same port, same token).
pub fn dashboard_url(server: &str) -> String {
    format!("{}/", server.trim_end_matches('/'))
}

/// `ofctl apply -f FILE`.
async fn apply(
    client: &Client,
    file: &Path,
    output: Output,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let (v, created) = apply_text(client, &file.display().to_string(), text).await?;
    match output {
        Output::Json => print_json(out, &v),
        Output::Table => {
            let s: DagSummary = typed("PUT /v1/dags", &v)?;
            Ok(writeln!(
                out,
                "dag {} {} (revision {}): {}",
                s.name,
                if created { "created" } else { "applied" },
                s.revision,
                s.functions.join(" -> ")
            )?)
        }
    }
}

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

/// `POST /v1/jobs`; the 202 answer.
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
        policy: req.policy.clone(),
        planned: req.planned,
    };
    let v: Value = client.post("/v1/jobs", &body).await.map_err(|e| {
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

/// The path of an output under its job's `result/`: `s3://bucket/jobs/<id>/result/a/b` and
/// `store://jobs/<id>/result/a/b` give `a/b`. Refuses anything that could leave the folder.
pub fn result_path(job: &str, output: &str) -> anyhow::Result<String> {
    let key = if let Some(rest) = output.strip_prefix("s3://") {
        rest.split_once('/').map(|(_, k)| k).unwrap_or("")
    } else if let Some(rest) = output.strip_prefix("store://") {
        rest
    } else {
        output
    };
    let prefix = format!("jobs/{job}/result/");
    let rel = key
        .strip_prefix(&prefix)
        .ok_or_else(|| anyhow!("output {output} is not under {prefix}"))?;
    let ok = !rel.is_empty()
        && rel
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\\'));
    if !ok {
        bail!("output {output} has an unsafe path");
    }
    Ok(rel.to_owned())
}

/// Downloads every output of a succeeded job into `to`, keeping their paths under `result/`.
pub async fn fetch(client: &Client, job: &str, to: &Path) -> anyhow::Result<Vec<Value>> {
    let v = get_job(client, job).await?;
    let s: JobSummary = typed("GET /v1/jobs/{id}", &v)?;
    if s.status != JobStatus::Succeeded {
        let why = s.error.map(|e| format!(": {e}")).unwrap_or_default();
        bail!("job {job} is {}, it has no results to fetch{why}", s.status);
    }
    let mut fetched = Vec::new();
    for output in &s.outputs {
        let rel = result_path(job, output)?;
        let dest = to.join(&rel);
        let parent = dest
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent", dest.display()))?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let mut resp = client
            .get_raw(&format!(
                "/v1/jobs/{}/results/{}",
                encode(job),
                encode_path(&rel)
            ))
            .await?;
        let tmp = parent.join(format!(
            ".{}.ofctl-{}",
            dest.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            std::process::id()
        ));
        let mut file = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut n = 0u64;
        let written: anyhow::Result<()> = async {
            while let Some(chunk) = resp.chunk().await.map_err(|e| anyhow!("{output}: {e}"))? {
                file.write_all(&chunk)?;
                n += chunk.len() as u64;
            }
            file.sync_all()?;
            std::fs::rename(&tmp, &dest)?;
            Ok(())
        }
        .await;
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.context(format!("cannot write {}", dest.display())));
        }
        fetched.push(json!({ "output": output, "path": dest, "bytes": n }));
    }
    Ok(fetched)
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
    fn result_paths() {
        let check = |out: &str| result_path("j-1", out).ok();
        assert_eq!(
            check("s3://sonic/jobs/j-1/result/out").as_deref(),
            Some("out")
        );
        assert_eq!(
            check("store://jobs/j-1/result/reduce/0/part-0").as_deref(),
            Some("reduce/0/part-0")
        );
        assert_eq!(check("store://jobs/j-2/result/out"), None);
        assert_eq!(check("store://jobs/j-1/result/../x"), None);
        assert_eq!(check("store://jobs/j-1/result/a//b"), None);
        assert_eq!(check("store://jobs/j-1/result/"), None);
    }

    #[test]
    fn dashboard_urls() {
        assert_eq!(
            dashboard_url("http://127.0.0.1:7000"),
            "http://127.0.0.1:7000/"
        );
        assert_eq!(dashboard_url("https://sonic:7000/"), "https://sonic:7000/");
    }

    #[test]
    fn input_names() {
        assert_eq!(input_name(Path::new("/tmp/records.bin")), "records.bin");
        assert_eq!(input_name(Path::new("my data.csv")), "my_data.csv");
        assert_eq!(input_name(Path::new(".hidden")), "hidden");
    }
}
