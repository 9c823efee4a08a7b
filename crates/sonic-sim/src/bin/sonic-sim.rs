//! `sonic-sim`: runs the paper's Fig. 9 scenario (or a variant) once per policy and prints a
//! table or JSON. Argument parsing only; the work is in the library.

use std::process::ExitCode;
use std::time::Instant;

use sonic_core::catalog::Catalog;
use sonic_core::planner::Policy;
use sonic_sim::scenario::{self, App, MIXED_CLUSTER, PAPER_CLUSTER, Workload};
use sonic_sim::{Cluster, SimConfig, render_table, validate_alone};

const USAGE: &str = "\
usage: sonic-sim [options]
       sonic-sim experiments --out DIR [--quick] [--seed N]

Simulates the SONIC paper's Fig. 9 scenario: jobs of the three applications (video-analytics,
ml-pipeline, mapreduce-sort) arriving together on a shared cluster, once per policy.

options:
  --cluster SPEC      VMs: mixed (default: m5.large=34,m5.xlarge=8,m5.2xlarge=4,t2.large=6),
                      paper (m5.large=52), or TYPE=COUNT,...
  --jobs N            jobs in all, the applications taking turns (default 60)
  --spread S          arrivals uniform in [0, S) seconds (default 5)
  --error E           relative error of predicted times and bytes (default 0.1)
  --seed N            seed of arrivals, predictions and tie-breaks (default 1)
  --policy P,...      policies to run (default sonic,remote,local,direct,oracle)
  --catalog FILE      VM catalog YAML (default: the built-in catalog, deploy/catalog.yaml)
  --params APP=FILE   parameters of one application (default: scenarios/fig9/APP.params.yaml)
  --keep-alive S      idle warm containers live S seconds (default 60, the agents')
  --cold-samples N    each DAG's cold-time models start with N samples, one more per job that
                      ends; jobs share warm containers only once they converged (default:
                      converged before the run)
  --no-cpu-sharing    lambdas never slow each other down on a VM
  --no-load-aware     sonic and oracle run the plan best alone, whatever the cluster's load
  --no-vcpu-slots     grant slots by memory alone (lambdas beyond the vCPUs share them)
  --prewarm           start a stage's containers while its senders run, as the control plane
                      does by default (its cold instances pay only what is left of the start)
  --validate          run one job of each application alone per policy, next to the model
  -o table|json       output (default table)

experiments: Fig. 6, 9, 14 and 15 of the paper in the simulator, written as DIR/fig6-sim.csv,
fig9-sim.csv, fig14-sim.csv and fig15-sim.csv (--quick: fewer points).
";

struct Args {
    cluster: String,
    workload: Workload,
    policies: Vec<Policy>,
    catalog: Option<String>,
    params: Vec<(String, String)>,
    config: SimConfig,
    validate: bool,
    json: bool,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        cluster: MIXED_CLUSTER.into(),
        workload: Workload::default(),
        policies: Policy::ALL.to_vec(),
        catalog: None,
        params: Vec::new(),
        config: SimConfig::default(),
        validate: false,
        json: false,
    };
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--cluster" => {
                let v = it.next().ok_or("--cluster needs a value")?;
                a.cluster = match v.as_str() {
                    "mixed" => MIXED_CLUSTER.into(),
                    "paper" => PAPER_CLUSTER.into(),
                    _ => v,
                };
            }
            "--jobs" => a.workload.jobs = num(&flag, it.next())?,
            "--spread" => a.workload.spread_s = num(&flag, it.next())?,
            "--error" => a.workload.error = num(&flag, it.next())?,
            "--seed" => {
                a.workload.seed = num(&flag, it.next())?;
                a.config.seed = a.workload.seed;
            }
            "--keep-alive" => a.config.keep_alive_s = num(&flag, it.next())?,
            "--cold-samples" => a.config.cold_samples = Some(num(&flag, it.next())?),
            "--no-cpu-sharing" => a.config.cpu_sharing = false,
            "--no-load-aware" => a.config.load_aware = false,
            "--no-vcpu-slots" => a.config.vcpu_slots = false,
            "--prewarm" => a.config.prewarm = true,
            "--validate" => a.validate = true,
            "--policy" => {
                let v = it.next().ok_or("--policy needs a value")?;
                a.policies = v
                    .split(',')
                    .map(|p| p.trim().parse::<Policy>())
                    .collect::<Result<_, _>>()?;
            }
            "--catalog" => a.catalog = Some(it.next().ok_or("--catalog needs a file")?),
            "--params" => {
                let v = it.next().ok_or("--params needs APP=FILE")?;
                let (app, file) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--params {v:?}: expected APP=FILE"))?;
                a.params.push((app.to_owned(), file.to_owned()));
            }
            "-o" | "--output" => {
                a.json = match it.next().as_deref() {
                    Some("json") => true,
                    Some("table") => false,
                    other => return Err(format!("-o {other:?}: expected table or json")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(a))
}

fn run(a: Args) -> Result<(), String> {
    let read = |f: &str| std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"));
    let catalog = match &a.catalog {
        Some(f) => Catalog::from_yaml(&read(f)?).map_err(|e| format!("{f}: {e}"))?,
        None => Catalog::default(),
    };
    let cluster = Cluster::from_spec(&catalog, &a.cluster).map_err(|e| e.to_string())?;
    let mut apps: Vec<App> = Vec::new();
    for (name, dag, params) in scenario::BUILTIN {
        let params = match a.params.iter().find(|(n, _)| n == name) {
            Some((_, f)) => read(f)?,
            None => params.to_owned(),
        };
        apps.push(App::from_yaml(name, dag, &params).map_err(|e| e.to_string())?);
    }
    if let Some((n, _)) = a
        .params
        .iter()
        .find(|(n, _)| !scenario::BUILTIN.iter().any(|b| b.0 == n))
    {
        return Err(format!("--params: no application {n:?}"));
    }

    if a.validate {
        let mut rows = Vec::new();
        for app in &apps {
            for &p in &a.policies {
                let mut w = a.workload;
                w.jobs = 1;
                w.error = 0.0;
                let job = scenario::jobs(std::slice::from_ref(app), p, &w)
                    .pop()
                    .ok_or("no job")?;
                let v = validate_alone(&cluster, &job, &a.config).map_err(|e| e.to_string())?;
                rows.push(v);
            }
        }
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
            );
        } else {
            println!(
                "{:<16} {:<7} {:>10} {:>10} {:>8} {:>11} {:>11} {:>8}  methods",
                "app", "policy", "sim s", "model s", "err", "sim $", "model $", "err"
            );
            for v in &rows {
                let methods: Vec<&str> = v.job.edges.iter().map(|e| e.method.as_str()).collect();
                println!(
                    "{:<16} {:<7} {:>10.3} {:>10.3} {:>7.3}% {:>11.7} {:>11.7} {:>7.3}%  {}",
                    v.job.app,
                    v.job.policy.as_str(),
                    v.job.latency_s,
                    v.model_latency_s,
                    100.0 * v.latency_rel_error,
                    v.job.cost_usd,
                    v.model_cost_usd,
                    100.0 * v.cost_rel_error,
                    methods.join(",")
                );
            }
        }
        return Ok(());
    }

    let started = Instant::now();
    let reports = scenario::run(&cluster, &apps, &a.workload, &a.policies, &a.config)
        .map_err(|e| e.to_string())?;
    let wall = started.elapsed();
    if a.json {
        let doc = serde_json::json!({
            "cluster": cluster.spec(),
            "workload": {
                "jobs": a.workload.jobs,
                "spread_s": a.workload.spread_s,
                "error": a.workload.error,
                "seed": a.workload.seed,
            },
            "runs": reports,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
    } else {
        let first = reports.first();
        println!(
            "cluster {} ({} VMs), {} jobs arriving in [0, {} s), prediction error {}, seed {}; peak lambdas at once: {}",
            cluster.spec(),
            cluster.vms().len(),
            a.workload.jobs,
            a.workload.spread_s,
            a.workload.error,
            a.workload.seed,
            reports
                .iter()
                .map(|r| format!(
                    "{} {}",
                    r.summary.first().map_or("-", |s| s.policy.as_str()),
                    r.cluster.peak_running
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = first;
        println!();
        print!("{}", render_table(&reports));
    }
    let events: u64 = reports.iter().map(|r| r.cluster.events).sum();
    eprintln!(
        "simulated {} runs ({} events, {} flows) in {:.1} ms, planning included",
        reports.len(),
        events,
        reports.iter().map(|r| r.cluster.flows).sum::<u64>(),
        wall.as_secs_f64() * 1e3
    );
    Ok(())
}

/// `sonic-sim experiments --out DIR [--quick] [--seed N]`.
fn experiments(mut it: impl Iterator<Item = String>) -> Result<(), String> {
    let (mut out, mut quick, mut seed) = (None, false, 1u64);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--out" => out = Some(it.next().ok_or("--out needs a directory")?),
            "--quick" => quick = true,
            "--seed" => {
                let v = it.next().ok_or("--seed needs a value")?;
                seed = v
                    .parse()
                    .map_err(|_| format!("--seed: {v:?} is not a number"))?;
            }
            other => return Err(format!("experiments: unknown argument {other:?}")),
        }
    }
    let out = out.ok_or("experiments needs --out DIR")?;
    let started = Instant::now();
    let summary = sonic_sim::experiments::write_all(std::path::Path::new(&out), quick, seed)
        .map_err(|e| e.to_string())?;
    print!("{summary}");
    eprintln!(
        "wrote {out}/fig{{6,9,14,15}}-sim.csv in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("experiments") {
        args.next();
        return match experiments(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sonic-sim: {e}\n\n{USAGE}");
                ExitCode::from(2)
            }
        };
    }
    match parse(args) {
        Ok(None) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Some(a)) => match run(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sonic-sim: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("sonic-sim: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
