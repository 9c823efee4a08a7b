//! `ofctl plan`: loads the DAG, its parameters and the catalog, plans, and explains the decision.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, anyhow};
use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::model::PlanProblem;
use sonic_core::params::Params;
use sonic_core::planner::{self, Plan, PlanOutcome, PlanReport, Policy};

use crate::Output;

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A percentile objective for `ofctl plan` (`--slo`, `--slo-best-effort`); without `slo`, the
/// DAG's own `slo:` applies.
#[derive(Debug, Clone, Copy, Default)]
pub struct Objective {
    pub slo: Option<sonic_core::slo::Slo>,
    pub best_effort: bool,
}

/// Plans and returns the report and the outcome (for the explanation).
pub fn plan_files(
    dag: &Path,
    params: &Path,
    catalog: Option<&Path>,
    policy: &str,
    objective: Objective,
) -> anyhow::Result<(PlanReport, PlanOutcome)> {
    let policy: Policy = policy.parse().map_err(|e: String| anyhow!(e))?;
    let dag_text = read(dag)?;
    let dag = Dag::from_yaml(&dag.display().to_string(), &dag_text)?;
    let params_text = read(params)?;
    let params = Params::from_yaml(&params_text).with_context(|| params.display().to_string())?;
    let catalog = match catalog {
        Some(path) => {
            Catalog::from_yaml(&read(path)?).with_context(|| path.display().to_string())?
        }
        None => Catalog::default(),
    };
    let started = Instant::now();
    let problem = PlanProblem::from_dag(&dag, &params, catalog, dag.bounds)?;
    let slo = objective
        .slo
        .or(dag.slo)
        .map(|s| s.best_effort(s.best_effort || objective.best_effort));
    let mut outcome = match slo {
        None => planner::plan(&problem, policy)?,
        Some(slo) => {
            let times = sonic_core::tails::stage_times(&problem, &params)
                .map_err(|e| anyhow!("the functions' time distributions: {e}"))?;
            planner::plan_for_slo(
                &problem,
                policy,
                &times,
                slo,
                planner::Budget::default(),
                &started,
            )?
        }
    };
    let planning_time_us = started.elapsed().as_micros() as u64;
    // Where the parameters give distributions: the plans' latency distributions
    // (interfaces.md §6, `predicted.latency_quantiles_s`).
    let quantiles = |plan: &Plan| {
        sonic_core::tails::quantiles_for(&problem, plan, &params)
            .map_err(|e| anyhow!("the latency distribution: {e}"))
    };
    outcome.best.predicted.latency_quantiles_s = quantiles(&outcome.best)?;
    if let Some(second) = outcome.second_best.as_mut() {
        second.predicted.latency_quantiles_s = quantiles(second)?;
    }
    Ok((outcome.report(&dag.name, policy, planning_time_us), outcome))
}

pub fn run(
    dag: &Path,
    params: &Path,
    catalog: Option<&Path>,
    policy: &str,
    objective: Objective,
    output: Output,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let (report, outcome) = plan_files(dag, params, catalog, policy, objective)?;
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        Output::Table => write_table(&report, &outcome, out)?,
    }
    Ok(())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn secs(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())
}

fn usd(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.6}")).unwrap_or_else(|| "-".into())
}

fn write_plan(title: &str, plan: &Plan, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "{title}")?;
    writeln!(
        out,
        "  {:<16} {:<12} {:>4} {:>7} {:>10} {:>5} {:>9}",
        "FUNCTION", "VM TYPE", "VMS", "PER VM", "CONCURRENT", "CPUS", "START"
    )?;
    for s in &plan.stages {
        writeln!(
            out,
            "  {:<16} {:<12} {:>4} {:>7} {:>10} {:>5} {:>9}",
            s.function,
            s.vm_type,
            s.vms,
            s.per_vm,
            s.concurrent,
            // The CPUs each instance is given (right-sizing).
            crate::render::cpus(s.cores),
            if s.warm {
                "warm"
            } else if s.prewarmed {
                "prewarmed"
            } else {
                "cold"
            }
        )?;
    }
    writeln!(
        out,
        "  {:<28} {:<11} {:>12}",
        "EDGE", "METHOD", "PASSING (S)"
    )?;
    for e in &plan.edges {
        writeln!(
            out,
            "  {:<28} {:<11} {:>12.3}",
            format!("{} -> {}", e.from, e.to),
            e.method.as_str(),
            e.predicted_s
        )?;
    }
    let p = plan.predicted;
    writeln!(
        out,
        "  predicted: latency {:.3} s, cost ${:.6}, perf/$ {:.1}",
        p.latency_s, p.cost_usd, p.perf_per_dollar
    )?;
    if let Some(q) = p.latency_quantiles_s {
        writeln!(
            out,
            "  latency distribution: p50 {:.3} s, p90 {:.3} s, p95 {:.3} s, p99 {:.3} s (the mean above adds means; a stage ends with its slowest instance)",
            q.p50, q.p90, q.p95, q.p99
        )?;
    }
    Ok(())
}

fn write_table(
    report: &PlanReport,
    outcome: &PlanOutcome,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "DAG {}  policy {}  planned in {} us  {}",
        report.dag,
        report.policy,
        report.planning_time_us,
        if report.exact { "exact" } else { "NOT EXACT" }
    )?;
    if let Some(stopped) = &report.stopped {
        writeln!(out, "  {stopped}")?;
    }
    if let Some(v) = &report.slo {
        writeln!(
            out,
            "  SLO p{} <= {:.3} s: predicted p{} {:.3} s, {}",
            v.percentile,
            v.latency_s,
            v.percentile,
            v.predicted_s,
            if v.met {
                "met"
            } else {
                "NOT MET (best effort, or a baseline's own plan)"
            }
        )?;
    }
    writeln!(out)?;
    write_plan("BEST PLAN", &outcome.best, out)?;
    match &outcome.second_best {
        Some(p) => write_plan(
            "\nSECOND BEST (without vm-storage where the best uses it)",
            p,
            out,
        )?,
        None => writeln!(
            out,
            "\nSECOND BEST: none (the best plan uses no vm-storage)"
        )?,
    }
    writeln!(out, "\nWHY")?;
    for d in &outcome.table {
        writeln!(out, "\n  {}: {}", d.function, d.reason)?;
        writeln!(
            out,
            "    {:<12} {:>4} {:>7} {:>5} {:<24} {:>10} {:>12}  NOTE",
            "VM TYPE", "VMS", "PER VM", "CONC", "METHODS IN", "END (S)", "COST SO FAR"
        )?;
        for o in &d.options {
            let methods: Vec<&str> = o.methods_in.iter().map(|m| m.as_str()).collect();
            writeln!(
                out,
                "  {} {:<12} {:>4} {:>7} {:>5} {:<24} {:>10} {:>12}  {}",
                if o.chosen { "*" } else { " " },
                o.vm_type,
                opt(o.vms),
                opt(o.per_vm),
                opt(o.concurrent),
                if methods.is_empty() {
                    "-".to_owned()
                } else {
                    methods.join(",")
                },
                secs(o.end_s),
                usd(o.cost_so_far_usd),
                o.note
            )?;
        }
        if !d.methods.is_empty() {
            writeln!(
                out,
                "    {:<16} {:<11} {:>9} {:>11} {:>12} {:>12}  NOTE",
                "EDGE FROM", "METHOD", "EDGE (S)", "LATENCY (S)", "COST ($)", "PERF/$"
            )?;
            for m in &d.methods {
                writeln!(
                    out,
                    "  {} {:<16} {:<11} {:>9} {:>11} {:>12} {:>12}  {}",
                    if m.chosen { "*" } else { " " },
                    m.from,
                    m.method.as_str(),
                    secs(m.edge_s),
                    secs(m.latency_s),
                    usd(m.cost_usd),
                    m.perf_per_dollar
                        .map(|v| format!("{v:.1}"))
                        .unwrap_or_else(|| "-".into()),
                    m.note
                )?;
            }
        }
    }
    Ok(())
}
