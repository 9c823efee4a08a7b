//! The commands that talk to a running control plane: apply, run, get, describe, models, logs,
//! fetch, cancel, delete, open.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use sonic_api::control::{
    AgentList, DagList, DagModelsView, DagSummary, JobLogs, JobStatus, JobSummary,
};

pub use sonic_cluster::jobs::{
    JobInput, JobRequest, apply_text, base64, get_job, submit, wait_job,
};

use crate::client::{Client, encode, encode_path};
use crate::progress::Progress;
use crate::{
    Command, CreateKind, DeleteKind, DescribeKind, JobFailed, Kind, Output, UsageError, render,
};

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
            key,
            slo,
            slo_best_effort,
            revision,
            wait,
        } => {
            let req = JobRequest {
                dag,
                input: input.map(JobInput::File),
                params,
                policy,
                planned,
                key,
                slo,
                slo_best_effort,
                revision,
            };
            let accepted = submit(client, &req).await?;
            let id = accepted["job_id"]
                .as_str()
                .ok_or_else(|| anyhow!("unexpected answer to POST /v1/jobs: no job_id"))?
                .to_owned();
            if !wait {
                return match output {
                    Output::Json => print_json(out, &accepted),
                    // The bare id on stdout, for scripts (`id=$(ofctl run ...)`); the hint for
                    // people on stderr.
                    Output::Table => {
                        eprintln!("job {id} submitted; follow it with `ofctl describe job {id}`");
                        Ok(writeln!(out, "{id}")?)
                    }
                };
            }
            follow(client, id, output, out).await
        }
        Command::Retry { job, wait } => {
            let v: Value = client
                .post_empty(&format!("/v1/jobs/{}/retry", encode(&job)))
                .await?;
            if !wait {
                return match output {
                    Output::Json => print_json(out, &v),
                    Output::Table => {
                        eprintln!(
                            "job {job} queued again: what succeeded before is reused; follow it with `ofctl describe job {job}`"
                        );
                        Ok(writeln!(out, "{job}")?)
                    }
                };
            }
            follow(client, job, output, out).await
        }
        Command::Get {
            kind: Kind::Dag,
            name,
            revision,
            dag,
            status,
            limit,
        } => {
            let Some(name) = name else {
                return Err(crate::UsageError("get dag NAME: name the DAG".into()).into());
            };
            if dag.is_some() || status.is_some() || limit.is_some() {
                return Err(crate::UsageError(
                    "--dag, --status and --limit filter `get jobs` only".into(),
                )
                .into());
            }
            let mut path = format!("/v1/dags/{}", encode(&name));
            if let Some(r) = revision {
                path.push_str(&format!("?revision={r}"));
            }
            let v: Value = client.get(&path).await?;
            match output {
                Output::Json => print_json(out, &v),
                Output::Table => Ok(render::dag(&typed("GET /v1/dags/{name}", &v)?, out)?),
            }
        }
        Command::Get {
            kind,
            name,
            revision,
            dag,
            status,
            limit,
        } => {
            if name.is_some() || revision.is_some() {
                return Err(crate::UsageError(
                    "a name and --revision go with `get dag NAME` only".into(),
                )
                .into());
            }
            let (path, what) = match kind {
                Kind::Dags => ("/v1/dags", "GET /v1/dags"),
                Kind::Jobs => ("/v1/jobs", "GET /v1/jobs"),
                Kind::Agents => ("/v1/agents", "GET /v1/agents"),
                Kind::Secrets => ("/v1/secrets", "GET /v1/secrets"),
                Kind::Dag => unreachable!("`get dag` is answered above"),
            };
            let mut query = Vec::new();
            if let Some(d) = &dag {
                query.push(format!("dag={}", encode(d)));
            }
            if let Some(s) = &status {
                query.push(format!("status={}", encode(s)));
            }
            if let Some(n) = limit {
                query.push(format!("limit={n}"));
            }
            if !query.is_empty() && !matches!(kind, Kind::Jobs) {
                return Err(crate::UsageError(
                    "--dag, --status and --limit filter `get jobs` only".into(),
                )
                .into());
            }
            let path = if query.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", query.join("&"))
            };
            let v: Value = client.get(&path).await?;
            match (output, kind) {
                (Output::Json, _) => print_json(out, &v),
                (Output::Table, Kind::Dags) => Ok(render::dags(&typed::<DagList>(what, &v)?, out)?),
                (Output::Table, Kind::Jobs) => {
                    Ok(render::jobs(&typed::<JobList>(what, &v)?.jobs, out)?)
                }
                (Output::Table, Kind::Agents) => {
                    Ok(render::agents(&typed::<AgentList>(what, &v)?, out)?)
                }
                (Output::Table, Kind::Secrets) => Ok(render::secrets(
                    &typed::<sonic_api::control::SecretList>(what, &v)?,
                    out,
                )?),
                (Output::Table, Kind::Dag) => unreachable!("`get dag` is answered above"),
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
        Command::Models { dag, params } => {
            let mut path = format!("/v1/dags/{}/models", encode(&dag));
            if !params.is_empty() {
                let map: serde_json::Map<String, Value> = params.into_iter().collect();
                path.push_str(&format!(
                    "?params={}",
                    encode(&Value::Object(map).to_string())
                ));
            }
            let v: Value = client.get(&path).await?;
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
            kind: DeleteKind::Job,
            name,
        } => {
            client
                .delete(&format!("/v1/jobs/{}", encode(&name)))
                .await?;
            match output {
                Output::Json => print_json(out, &json!({ "kind": "job", "deleted": name })),
                Output::Table => Ok(writeln!(
                    out,
                    "job {name} deleted, with its logs, results and input (the sample it taught the models stays)"
                )?),
            }
        }
        Command::Create {
            kind: CreateKind::Secret,
            name,
            from_file,
            from_literal,
        } => {
            let value = match (from_file, from_literal) {
                (_, Some(v)) => v.into_bytes(),
                (Some(p), None) if p.as_os_str() == "-" => {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
                        .map_err(|e| anyhow::anyhow!("cannot read standard input: {e}"))?;
                    v
                }
                (Some(p), None) => std::fs::read(&p)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?,
                (None, None) => {
                    return Err(crate::UsageError(
                        "create secret NAME: give --from-file FILE or --from-literal VALUE".into(),
                    )
                    .into());
                }
            };
            let bytes = value.len();
            client
                .put_bytes(&format!("/v1/secrets/{}", encode(&name)), value)
                .await?;
            match output {
                Output::Json => print_json(
                    out,
                    &json!({ "kind": "secret", "name": name, "bytes": bytes }),
                ),
                Output::Table => Ok(writeln!(
                    out,
                    "secret {name} set ({bytes} bytes); functions name it as env: {{ VAR: {{ secret: {name} }} }}"
                )?),
            }
        }
        Command::Delete {
            kind: DeleteKind::Secret,
            name,
        } => {
            client
                .delete(&format!("/v1/secrets/{}", encode(&name)))
                .await?;
            match output {
                Output::Json => print_json(out, &json!({ "kind": "secret", "deleted": name })),
                Output::Table => Ok(writeln!(
                    out,
                    "secret {name} deleted (jobs that name it are refused until it is set again)"
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
    // Applied either way: what the agents cannot start goes to stderr, beside any output.
    for w in v["warnings"].as_array().into_iter().flatten() {
        if let Some(w) = w.as_str() {
            eprintln!("warning: {w}");
        }
    }
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

/// Follows job `id` to its end and prints its summary; a failed job is an error naming why.
async fn follow(
    client: &Client,
    id: String,
    output: Output,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
