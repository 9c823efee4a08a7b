//! `ofctl demo`: starts a cluster, applies two sample DAGs (`dags/synthetic-chain.yaml` and
//! `dags/mapreduce-sort.yaml`), profiles them at several input sizes until their models converge
//! (or a cap of jobs), runs them planned, prints what was learned and decided, and stops.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use serde::Serialize;
use serde_json::{Value, json};
use sonic_api::control::{DagModelsView, JobMode, JobStatus, JobSummary};

use crate::client::{Client, encode};
use crate::commands::{self, JobInput, JobRequest, print_json};
use crate::progress::Progress;
use crate::render::{self, Table};
use crate::up::{Cluster, ClusterInfo, MemoryTierInfo, wait_for_signal, write_info};
use crate::{Output, UpArgs};
use sonic_core::planner::Policy;
use sonic_eval::apps::sort_records;

/// How much the demo runs.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// Profiling jobs per DAG at most.
    pub max_jobs: u32,
    /// Planned jobs per DAG.
    pub planned_jobs: u32,
}

/// The fewest jobs a model needs to converge (sonic-core's default rule); without the models
/// route, profiling stops after this many.
const MIN_SAMPLES: u32 = 5;

/// One sample application of the demo.
struct App {
    name: &'static str,
    file: &'static str,
    yaml: &'static str,
    /// Input sizes in bytes, cycled through by the profiling jobs; `[0]`: the DAG takes no input.
    sizes: &'static [u64],
    /// The sizes the planned jobs run at.
    planned_sizes: &'static [u64],
}

/// Small inputs: each job takes a second or two here, yet the sort's stages grow with the input.
const APPS: [App; 2] = [
    App {
        name: "synthetic-chain",
        file: "dags/synthetic-chain.yaml",
        yaml: include_str!("../../../dags/synthetic-chain.yaml"),
        sizes: &[0],
        planned_sizes: &[0],
    },
    App {
        name: "mapreduce-sort",
        file: "dags/mapreduce-sort.yaml",
        yaml: include_str!("../../../dags/mapreduce-sort.yaml"),
        sizes: &[4_000_000, 8_000_000, 12_000_000, 16_000_000, 20_000_000],
        planned_sizes: &[10_000_000, 20_000_000],
    },
];

/// A profiling job, briefly.
#[derive(Debug, Clone, Serialize)]
pub struct JobBrief {
    pub job_id: String,
    pub input_bytes: u64,
    pub status: JobStatus,
    pub mode: JobMode,
    pub policy: String,
    pub latency_s: f64,
    pub cost_usd: f64,
    pub perf_per_dollar: f64,
}

impl From<&JobSummary> for JobBrief {
    fn from(s: &JobSummary) -> JobBrief {
        JobBrief {
            job_id: s.job_id.clone(),
            input_bytes: s.input_bytes,
            status: s.status,
            mode: s.mode,
            policy: s.policy.to_string(),
            latency_s: s.latency_s,
            cost_usd: s.cost_usd,
            perf_per_dollar: s.perf_per_dollar,
        }
    }
}

/// What the demo did with one DAG.
#[derive(Debug, Clone, Serialize)]
pub struct DagReport {
    pub dag: String,
    pub profiling_jobs: Vec<JobBrief>,
    /// Whether the models converged; `None` when the control plane does not serve them.
    pub converged: Option<bool>,
    /// `GET /v1/dags/{name}/models` after profiling.
    pub models: Option<Value>,
    /// `GET /v1/dags/{name}/plan?input_bytes=N` for the first planned size.
    pub plan: Option<Value>,
    pub plan_input_bytes: u64,
    /// Why a models or plan view is missing.
    pub notes: Vec<String>,
    /// The planned jobs' summaries.
    pub planned_jobs: Vec<Value>,
    /// One job of the paper's `direct` baseline at the first planned size, placed as the
    /// planner places it and run through the resource manager (`policy: direct`, `planned`):
    /// its prediction against its measure beside the planned jobs'.
    pub baseline_jobs: Vec<Value>,
}

/// `ofctl demo`.
pub async fn run(
    args: UpArgs,
    opts: DemoOptions,
    output: Output,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let temp;
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("sonic-demo-")
                .tempdir()
                .context("cannot make a temporary folder")?;
            temp.path().to_path_buf()
        }
    };
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut note = |line: &str| eprintln!("{line}");
    note("starting a cluster on this machine");
    let cluster = Cluster::start(args.options(data_dir.clone(), listen), &mut note).await?;
    let mut info = Vec::new();
    write_info(&cluster.info, &cluster.memory, &mut info)?;
    eprint!("{}", String::from_utf8_lossy(&info));
    eprintln!("server   {}", cluster.info.server);
    let prefix = format!("demo/{}/", std::process::id());
    let outcome = tokio::select! {
        r = demo(&cluster, opts, &data_dir, &prefix) => r,
        s = wait_for_signal() => s.and_then(|()| Err(anyhow!("interrupted"))),
    };
    if let Err(e) = cluster.store.delete_prefix(&prefix).await {
        eprintln!("ofctl: cannot delete the demo inputs: {e}");
    }
    let info = cluster.info.clone();
    let memory = cluster.memory.clone();
    eprintln!("stopping the cluster");
    cluster.stop().await;
    let reports = outcome?;
    let seconds = started.elapsed().as_secs_f64();
    match output {
        Output::Json => {
            let planned: Vec<Value> = reports
                .iter()
                .flat_map(|r| r.planned_jobs.iter().cloned())
                .collect();
            let mut cluster = serde_json::to_value(&info)?;
            memory.add_to(&mut cluster);
            print_json(
                out,
                &json!({
                    "cluster": cluster,
                    "seconds": seconds,
                    "dags": reports,
                    "planned_jobs": planned,
                }),
            )?;
        }
        Output::Table => write_report(&info, &memory, &reports, seconds, out)?,
    }
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.planned_jobs
                .iter()
                .chain(r.baseline_jobs.iter().filter(|j| baseline_ran(j)))
        })
        .filter(|j| j["status"] == "failed")
        .map(|j| j["job_id"].as_str().unwrap_or("?").to_owned())
        .collect();
    if !failed.is_empty() {
        bail!("planned or baseline job(s) failed: {}", failed.join(", "));
    }
    Ok(())
}

async fn demo(
    cluster: &Cluster,
    opts: DemoOptions,
    data_dir: &Path,
    prefix: &str,
) -> anyhow::Result<Vec<DagReport>> {
    let client = cluster.client()?;
    let mut inputs: HashMap<u64, String> = HashMap::new();
    let mut reports = Vec::new();
    for app in &APPS {
        commands::apply_text(&client, app.file, app.yaml.to_owned())
            .await
            .with_context(|| format!("apply {}", app.file))?;
        eprintln!("\n{}: applied {}", app.name, app.file);
        let mut report = DagReport {
            dag: app.name.into(),
            profiling_jobs: Vec::new(),
            converged: None,
            models: None,
            plan: None,
            plan_input_bytes: app.planned_sizes[0],
            notes: Vec::new(),
            planned_jobs: Vec::new(),
            baseline_jobs: Vec::new(),
        };
        // Profiling: until the models converge, or the cap.
        for k in 0..opts.max_jobs {
            let size = app.sizes[k as usize % app.sizes.len()];
            let summary = run_job(
                cluster,
                &client,
                app,
                size,
                &mut inputs,
                data_dir,
                prefix,
                None,
            )
            .await?;
            let s: JobSummary = serde_json::from_value(summary.clone())?;
            report.profiling_jobs.push(JobBrief::from(&s));
            if s.status == JobStatus::Failed {
                bail!(
                    "{} profiling job {} failed: {}",
                    app.name,
                    s.job_id,
                    s.error.unwrap_or_default()
                );
            }
            let mut line = format!(
                "  profiling job {}/{} {} at {}: {} {} in {:.2} s",
                k + 1,
                opts.max_jobs,
                s.job_id,
                render::bytes(size),
                s.mode,
                s.status,
                s.latency_s
            );
            let models = models(&client, app.name).await?;
            let done = match &models {
                Some(m) => {
                    let ok = m.models.iter().filter(|v| v.converged).count();
                    line.push_str(&format!("; models {ok}/{} converged", m.models.len()));
                    report.converged = Some(m.converged);
                    m.converged || s.mode == JobMode::Planned
                }
                None => k + 1 >= MIN_SAMPLES,
            };
            eprintln!("{line}");
            if done {
                break;
            }
        }
        match models(&client, app.name).await? {
            Some(m) => {
                if !m.converged {
                    report.notes.push(format!(
                        "the models did not converge within {} profiling jobs (the cap, --max-jobs): planned jobs still profile",
                        opts.max_jobs
                    ));
                }
                report.converged = Some(m.converged);
                report.models = Some(serde_json::to_value(&m)?);
            }
            None => report.notes.push(
                "this control plane does not serve GET /v1/dags/{name}/models yet: nothing to show of the models"
                    .into(),
            ),
        }
        for n in &report.notes {
            eprintln!("  note: {n}");
        }
        let plan_path = format!(
            "/v1/dags/{}/plan?input_bytes={}",
            encode(app.name),
            report.plan_input_bytes
        );
        match client.get::<Value>(&plan_path).await {
            Ok(p) => report.plan = Some(p),
            Err(e) => {
                let n = format!("no plan: {e}");
                eprintln!("  note: {n}");
                report.notes.push(n);
            }
        }
        for k in 0..opts.planned_jobs {
            let size = app.planned_sizes[k as usize % app.planned_sizes.len()];
            let summary = run_job(
                cluster,
                &client,
                app,
                size,
                &mut inputs,
                data_dir,
                prefix,
                None,
            )
            .await?;
            let s: JobSummary = serde_json::from_value(summary.clone())?;
            eprintln!(
                "  {} job {} at {}: {} in {:.2} s, perf/$ {:.0}",
                s.mode,
                s.job_id,
                render::bytes(size),
                s.status,
                s.latency_s,
                s.perf_per_dollar
            );
            report.planned_jobs.push(summary);
        }
        let size = app.planned_sizes[0];
        let summary = run_job(
            cluster,
            &client,
            app,
            size,
            &mut inputs,
            data_dir,
            prefix,
            Some(Policy::Direct),
        )
        .await?;
        let s: JobSummary = serde_json::from_value(summary.clone())?;
        eprintln!(
            "  direct baseline job {} at {}: {} in {:.2} s",
            s.job_id,
            render::bytes(size),
            s.status,
            s.latency_s
        );
        if !baseline_ran(&summary) {
            // Too few agents of a type for its direct edges (e.g. `--agents 1`): not the
            // demo's failure, the cluster's size.
            let n = format!(
                "the direct baseline could not run on this cluster: {}",
                s.error.unwrap_or_default()
            );
            eprintln!("  note: {n}");
            report.notes.push(n);
        }
        report.baseline_jobs.push(summary);
        reports.push(report);
    }
    Ok(reports)
}

/// `GET /v1/dags/{name}/models`; `None` when the control plane has no such route.
async fn models(client: &Client, dag: &str) -> anyhow::Result<Option<DagModelsView>> {
    match client
        .get::<DagModelsView>(&format!("/v1/dags/{}/models", encode(dag)))
        .await
    {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.is_route_missing() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Submits one job of `app` at `size` (its input put in the store once per size) and waits;
/// `baseline`: that policy forced, planned as the planner places it.
#[allow(clippy::too_many_arguments)]
async fn run_job(
    cluster: &Cluster,
    client: &Client,
    app: &App,
    size: u64,
    inputs: &mut HashMap<u64, String>,
    data_dir: &Path,
    prefix: &str,
    baseline: Option<Policy>,
) -> anyhow::Result<Value> {
    let input = if size == 0 {
        None
    } else {
        let key = match inputs.get(&size) {
            Some(k) => k.clone(),
            None => {
                let key = format!("{prefix}records-{size}.bin");
                cluster
                    .put_input(&key, &sort_records(size, size), data_dir)
                    .await?;
                inputs.insert(size, key.clone());
                key
            }
        };
        Some(JobInput::Key {
            key,
            name: "records.bin".into(),
        })
    };
    let req = JobRequest {
        revision: None,
        dag: app.name.into(),
        input,
        params: Vec::new(),
        policy: baseline.map(|p| p.to_string()),
        planned: baseline.is_some(),
        key: None,
        slo: None,
        slo_best_effort: false,
    };
    let accepted = commands::submit(client, &req).await?;
    let id = accepted["job_id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST /v1/jobs answered no job_id"))?
        .to_owned();
    let mut progress = Progress::new();
    commands::wait_job(client, &id, &mut progress).await
}

fn write_report(
    info: &ClusterInfo,
    memory: &MemoryTierInfo,
    reports: &[DagReport],
    seconds: f64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "Sonic demo: {} agents ({} sandbox, {} store, {})",
        info.agents.len(),
        info.sandbox,
        info.store,
        match &memory.url {
            Some(url) => format!("memory tier {url}"),
            None => "no memory tier".into(),
        }
    )?;
    for r in reports {
        writeln!(out, "\n=== {} ===", r.dag)?;
        let conv = match r.converged {
            Some(true) => "converged",
            Some(false) => "did NOT converge",
            None => "convergence unknown",
        };
        writeln!(
            out,
            "profiling: {} job(s), models {conv}",
            r.profiling_jobs.len()
        )?;
        for n in &r.notes {
            writeln!(out, "note: {n}")?;
        }
        if let Some(m) = &r.models
            && let Ok(m) = serde_json::from_value::<DagModelsView>(m.clone())
        {
            writeln!(out, "\nWHAT WAS LEARNED")?;
            render::models(&m, out)?;
        }
        if let Some(p) = &r.plan {
            writeln!(
                out,
                "\nWHAT WAS DECIDED (the plan at input {})",
                render::bytes(r.plan_input_bytes)
            )?;
            render::plan(p, "  ", out)?;
        }
        writeln!(out, "\nJOBS")?;
        let mut t = Table::new(&[
            "JOB", "MODE", "POLICY", "INPUT", "STATUS", "LATENCY", "COST", "PERF/$", "METHODS",
        ]);
        let briefs = r.profiling_jobs.iter().map(|b| (b.clone(), None)).chain(
            r.planned_jobs
                .iter()
                .chain(&r.baseline_jobs)
                .filter_map(|v| {
                    serde_json::from_value::<JobSummary>(v.clone())
                        .ok()
                        .map(|s| (JobBrief::from(&s), Some(s)))
                }),
        );
        for (b, full) in briefs {
            let methods = full
                .map(|s| {
                    s.edges
                        .iter()
                        .map(|e| format!("{}->{}:{}", e.from, e.to, e.method))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            t.row(vec![
                b.job_id,
                b.mode.to_string(),
                b.policy,
                render::bytes(b.input_bytes),
                b.status.to_string(),
                format!("{:.2} s", b.latency_s),
                render::usd(b.cost_usd),
                format!("{:.0}", b.perf_per_dollar),
                methods,
            ]);
        }
        t.write("  ", out)?;
        for j in r.planned_jobs.iter().chain(&r.baseline_jobs) {
            let used = j["plan"]["used"].as_str();
            if let Some(used) = used {
                writeln!(
                    out,
                    "  {}: ran the {used} plan",
                    j["job_id"].as_str().unwrap_or("?")
                )?;
                if let Some(p) = prediction(j) {
                    writeln!(out, "    {}", p.line())?;
                }
                for n in j["plan"]["notes"].as_array().into_iter().flatten() {
                    writeln!(out, "    note: {}", n.as_str().unwrap_or_default())?;
                }
            }
        }
    }
    writeln!(out, "\ndemo took {seconds:.0} s; the cluster is stopped")?;
    Ok(())
}

/// Whether a baseline job got to run (it succeeded, or some instance of it ran): one that
/// failed before any instance did could not be planned or granted on this cluster.
fn baseline_ran(job: &Value) -> bool {
    job["status"] != "failed" || job["functions"].as_array().is_some_and(|f| !f.is_empty())
}

/// What a planned job's plan predicted against what it measured.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Prediction {
    latency_s: (f64, f64),
    cost_usd: (f64, f64),
}

impl Prediction {
    /// "predicted 2.28 s, $0.000061; measured 2.02 s, $0.000058: latency +13%, cost +5%".
    fn line(&self) -> String {
        let err = |(p, m): (f64, f64)| {
            if m > 0.0 {
                format!("{:+.0}%", (p - m) / m * 100.0)
            } else {
                "n/a".into()
            }
        };
        format!(
            "predicted {:.2} s, {}; measured {:.2} s, {}: latency {}, cost {} (predicted against measured)",
            self.latency_s.0,
            render::usd(self.cost_usd.0),
            self.latency_s.1,
            render::usd(self.cost_usd.1),
            err(self.latency_s),
            err(self.cost_usd)
        )
    }
}

/// The prediction of the plan a job summary says it ran (`plan.used`: the best plan's, or the
/// second-best's) against the job's measured latency and cost; `None` for a job without one.
fn prediction(job: &Value) -> Option<Prediction> {
    let report = &job["plan"]["report"];
    let predicted = match job["plan"]["used"].as_str()? {
        "best" => &report["predicted"],
        "second_best" => &report["second_best"]["predicted"],
        _ => return None,
    };
    Some(Prediction {
        latency_s: (predicted["latency_s"].as_f64()?, job["latency_s"].as_f64()?),
        cost_usd: (predicted["cost_usd"].as_f64()?, job["cost_usd"].as_f64()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prediction of the plan that ran: the best one's, or the second-best's.
    #[test]
    fn a_jobs_prediction_is_the_plan_it_ran() {
        let job = |used: &str| {
            json!({
                "latency_s": 2.0, "cost_usd": 0.0001,
                "plan": {"used": used, "report": {
                    "predicted": {"latency_s": 2.5, "cost_usd": 0.0002},
                    "second_best": {"predicted": {"latency_s": 3.0, "cost_usd": 0.0001}},
                }},
            })
        };
        let best = prediction(&job("best")).expect("best");
        assert_eq!(best.latency_s, (2.5, 2.0));
        assert!(
            best.line().contains("latency +25%, cost +100%"),
            "{}",
            best.line()
        );
        assert!(baseline_ran(
            &json!({"status": "succeeded", "functions": []})
        ));
        assert!(baseline_ran(
            &json!({"status": "failed", "functions": [{"name": "a"}]})
        ));
        assert!(!baseline_ran(&json!({"status": "failed", "functions": []})));
        let second = prediction(&job("second_best")).expect("second");
        assert_eq!(second.cost_usd, (0.0001, 0.0001));
        assert!(prediction(&job("none")).is_none());
        assert!(prediction(&json!({"latency_s": 1.0})).is_none());
    }

    #[test]
    fn the_demo_dags_are_the_shipped_files() {
        for app in &APPS {
            let dag = sonic_core::dag::Dag::from_yaml(app.file, app.yaml).expect("parses");
            assert_eq!(dag.name, app.name);
        }
    }
}
