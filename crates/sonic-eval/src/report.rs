//! The evaluation's outputs: CSV per experiment, SVG charts and `report.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context;

use super::stats::{self, Interval, Outcome};
use super::{
    BenchOptions, Cell, FIG6_BYTES, FIG6_NET_SCALE, Results, STATIC, aggregate_seeded, csv,
    explain, fig10, predictions, sim as bsim,
};
use crate::charts::{self, BarChart, BarGroup, LineChart, Series};
use crate::harness::ClusterKind;
use sonic_cluster::cluster::ClusterInfo;

/// Writes every file; returns their names.
pub fn write_all(
    opts: &BenchOptions,
    results: &Results,
    seconds: f64,
) -> anyhow::Result<Vec<String>> {
    let mut written = Vec::new();
    let mut write = |name: &str, text: String| -> anyhow::Result<()> {
        let p = opts.out_dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
        written.push(name.to_owned());
        Ok(())
    };
    let cells = aggregate_seeded(&results.rows, opts.seed);
    if !results.rows.is_empty() {
        write("jobs.csv", csv(&results.rows))?;
    }
    if !results.profiled.is_empty() {
        write("profiling.csv", profiling_csv(results))?;
    }
    if !results.fig10.is_empty() {
        write("fig10.csv", fig10::csv(&results.fig10))?;
        for app in apps_of(results.fig10.iter().map(|p| p.app.as_str())) {
            write(&format!("fig10-{app}.svg"), fig10_chart(results, &app)?)?;
        }
    }
    if has(&cells, "fig7") {
        write("fig7.svg", fig7_chart(&cells)?)?;
    }
    if has(&cells, "fig2") {
        write("fig2.svg", fig2_chart(&cells)?)?;
    }
    if has(&cells, "fig6") {
        write("fig6.svg", fig6_chart(&cells, "job latency (s)")?)?;
        write(
            "fig6-edge.svg",
            fig6_chart(
                &fig6_edges(&cells),
                "data passing: slowest sink's staging (s)",
            )?,
        )?;
    }
    if predictions::planned(&results.times).next().is_some() {
        write("predictions.csv", predictions::csv(&results.times))?;
    }
    if !results.validation.is_empty() {
        write("validation.csv", bsim::validation_csv(&results.validation))?;
    }
    if let Some(v) = &results.validation_inputs {
        write(bsim::VALIDATION_INPUTS, serde_json::to_string_pretty(v)?)?;
    }
    if let Some(s) = &results.sim {
        for (name, text) in bsim::files(s)? {
            write(&name, text)?;
        }
    }
    if !results.plans.is_empty() {
        let dir = opts.out_dir.join("plans");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, plan) in &results.plans {
            write(
                &format!("plans/{name}"),
                serde_json::to_string_pretty(plan)?,
            )?;
        }
    }
    let md = report(opts, results, &cells, seconds);
    write("report.md", md)?;
    Ok(written)
}

fn has(cells: &[Cell], experiment: &str) -> bool {
    cells.iter().any(|c| c.experiment == experiment)
}

fn apps_of<'a>(it: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in it {
        if !out.iter().any(|o| o == a) {
            out.push(a.to_owned());
        }
    }
    out
}

fn profiling_csv(results: &Results) -> String {
    let mut s = String::from("app,job_id,size,input_bytes,held_out,latency_s,ok\n");
    for p in &results.profiled {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.4},{}",
            p.app, p.job_id, p.size, p.input_bytes, p.held_out, p.latency_s, p.ok
        );
    }
    s
}

fn fig10_chart(results: &Results, app: &str) -> anyhow::Result<String> {
    let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for p in results.fig10.iter().filter(|p| p.app == app) {
        by.entry(p.parameter.as_str())
            .or_default()
            .push((p.train_jobs as f64, p.mape));
    }
    let series: Vec<Series> = by
        .into_iter()
        .map(|(name, points)| Series {
            name: name.to_owned(),
            points,
        })
        .collect();
    Ok(charts::line_chart(&LineChart {
        title: &format!("Fig. 10 ({app}): prediction error vs profiling jobs"),
        x_label: "profiling jobs the models were fitted on",
        y_label: "MAPE on held-out jobs (%)",
        series: &series,
        log_x: false,
        log_y: true,
    })?)
}

fn fig7_chart(cells: &[Cell]) -> anyhow::Result<String> {
    let groups: Vec<BarGroup> = apps_of(
        cells
            .iter()
            .filter(|c| c.experiment == "fig7")
            .map(|c| c.app.as_str()),
    )
    .into_iter()
    .map(|app| BarGroup {
        bars: cells
            .iter()
            .filter(|c| c.experiment == "fig7" && c.app == app)
            .map(|c| (c.policy.clone(), c.ratio_to_best_static))
            .collect(),
        label: app,
    })
    .collect();
    Ok(charts::bar_chart(&BarChart {
        title: "Fig. 7 (emulated cluster): Perf/$ relative to the best static policy",
        y_label: "Perf/$ / best static",
        groups: &groups,
        reference: Some((1.0, "best static")),
        show_values: true,
    })?)
}

fn fig2_chart(cells: &[Cell]) -> anyhow::Result<String> {
    let groups: Vec<BarGroup> = cells.iter().filter(|c| c.experiment == "fig2").fold(
        Vec::<BarGroup>::new(),
        |mut gs, c| {
            match gs.iter_mut().find(|g| g.label == c.variant) {
                Some(g) => g.bars.push((c.policy.clone(), c.latency_s)),
                None => gs.push(BarGroup {
                    label: c.variant.clone(),
                    bars: vec![(c.policy.clone(), c.latency_s)],
                }),
            }
            gs
        },
    );
    Ok(charts::bar_chart(&BarChart {
        title: "Fig. 2 (emulated cluster): ML pipeline latency by fanout and method",
        y_label: "job latency (s)",
        groups: &groups,
        reference: None,
        show_values: true,
    })?)
}

/// (VM type, fanout) of a Fig. 6 variant `m5.large k=4`.
fn fig6_variant(v: &str) -> Option<(&str, u32)> {
    let (vm, k) = v.split_once(" k=")?;
    Some((vm, k.parse().ok()?))
}

fn fig6_chart(cells: &[Cell], y_label: &str) -> anyhow::Result<String> {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for c in cells.iter().filter(|c| c.experiment == "fig6") {
        if let Some((vm, k)) = fig6_variant(&c.variant) {
            by.entry(format!("{} {vm}", c.policy))
                .or_default()
                .push((f64::from(k), c.latency_s));
        }
    }
    let series: Vec<Series> = by
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect();
    Ok(charts::line_chart(&LineChart {
        title: "Fig. 6 (emulated cluster): broadcast, direct vs remote",
        x_label: "broadcast fanout (receivers)",
        y_label,
        series: &series,
        log_x: false,
        log_y: false,
    })?)
}

/// Per VM type: the first fanout at which `remote` was faster than `direct`.
pub fn fig6_crossovers(cells: &[Cell]) -> Vec<(String, Option<u32>)> {
    let mut by: BTreeMap<String, BTreeMap<u32, (f64, f64)>> = BTreeMap::new();
    for c in cells.iter().filter(|c| c.experiment == "fig6") {
        if let Some((vm, k)) = fig6_variant(&c.variant) {
            let e = by
                .entry(vm.to_owned())
                .or_default()
                .entry(k)
                .or_insert((f64::NAN, f64::NAN));
            match c.policy.as_str() {
                "direct" => e.0 = c.latency_s,
                "remote" => e.1 = c.latency_s,
                _ => {}
            }
        }
    }
    by.into_iter()
        .map(|(vm, ks)| {
            let first = ks.iter().find(|(_, (d, r))| r < d).map(|(k, _)| *k);
            (vm, first)
        })
        .collect()
}

/// Fig. 6's cells with the data-passing time in place of the latency.
fn fig6_edges(cells: &[Cell]) -> Vec<Cell> {
    cells
        .iter()
        .filter(|c| c.experiment == "fig6")
        .map(|c| Cell {
            latency_s: c.edge_s,
            ..c.clone()
        })
        .collect()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({cpu}), {}", std::env::consts::OS)
}

/// Sonic's standing against the best static policy, one line per compared group.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub experiment: String,
    pub group: String,
    pub sonic: f64,
    pub best_static: String,
    pub ratio: f64,
    /// The ratio's 95% bootstrap interval (`None`: too few jobs, or a simulated run).
    pub ci: Option<Interval>,
}

impl Verdict {
    /// Win, loss, or no difference measured: a claim only where the interval excludes 1.
    pub fn outcome(&self) -> Outcome {
        Outcome::of(self.ci.as_ref())
    }

    /// The goal (at least 0.95 of the best static) as the interval allows: "yes", "**no**",
    /// "within noise", or the point estimate's answer marked as having no interval.
    pub fn goal(&self) -> &'static str {
        match (stats::goal_met(self.ci.as_ref(), GOAL), self.ci) {
            (Some(true), _) => "yes",
            (Some(false), _) => "**no**",
            (None, Some(_)) => "within noise",
            (None, None) if self.ratio >= GOAL => "yes (no interval)",
            (None, None) => "**no** (no interval)",
        }
    }
}

/// Sonic's goal against the best static policy.
pub const GOAL: f64 = 0.95;

/// `[lo, hi]`, or a dash without an interval.
fn interval(ci: Option<&Interval>) -> String {
    ci.map_or_else(|| "-".into(), |c| format!("[{:.3}, {:.3}]", c.lo, c.hi))
}

/// Verdicts of the measured experiments.
pub fn verdicts(cells: &[Cell]) -> Vec<Verdict> {
    cells
        .iter()
        .filter(|c| c.policy == "sonic")
        .filter_map(|c| {
            let best = cells
                .iter()
                .filter(|b| {
                    b.experiment == c.experiment
                        && b.app == c.app
                        && b.variant == c.variant
                        && STATIC.contains(&b.policy.as_str())
                })
                .max_by(|a, b| a.perf_per_dollar.total_cmp(&b.perf_per_dollar))?;
            Some(Verdict {
                experiment: c.experiment.clone(),
                group: format!("{} {}", c.app, c.variant).trim().to_owned(),
                sonic: c.perf_per_dollar,
                best_static: best.policy.clone(),
                ratio: c.ratio_to_best_static,
                ci: c.ratio_ci,
            })
        })
        .collect()
}

fn report(opts: &BenchOptions, results: &Results, cells: &[Cell], seconds: f64) -> String {
    let mut s = String::from("# Evaluation: Sonic against its baselines\n\n");
    let argv: Vec<String> = std::env::args().collect();
    let _ = writeln!(
        s,
        "Generated by `{}` ({} build) in {seconds:.0} s on {}. Mode: {}. Every figure below was \
         measured by that run; `docs/evaluation.md` says how to read them.\n",
        argv.join(" "),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        machine(),
        if opts.quick {
            "quick (fewer sizes and fanouts)"
        } else {
            "full"
        }
    );
    let _ = writeln!(
        s,
        "Statistics: every comparison of policies ran at least {} rounds, each round every \
         policy once in a random order (seed {}: `--seed {}` repeats the order). Perf/$ = 1 / \
         (mean latency x mean cost) over a cell's jobs; every ratio carries a 95% percentile \
         bootstrap interval ({} resamples of each cell's jobs, seeded from the same seed), and a \
         win or a loss is claimed only where the interval excludes 1.\n",
        stats::MIN_ROUNDS,
        opts.seed,
        opts.seed,
        stats::RESAMPLES
    );

    // ---- verdicts ----
    let mut all: Vec<Verdict> = verdicts(cells);
    if let Some(sim) = &results.sim {
        all.extend(bsim::verdicts(sim));
    }
    if !all.is_empty() {
        s.push_str("## Sonic against the best static policy\n\nPerf/$ = 1 / (mean latency x mean cost) over a cell's jobs. The goal: at least 0.95 of the best static policy everywhere (met when the whole 95% interval is at least 0.95; \"within noise\" when it straddles 0.95). The verdict: a win or a loss only where the interval excludes 1. The simulator's rows are one seeded simulation each: no interval.\n\n| experiment | case | best static | Sonic / best static | 95% interval | verdict | goal met |\n|---|---|---|---|---|---|---|\n");
        for v in &all {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.3} | {} | {} | {} |",
                v.experiment,
                v.group,
                v.best_static,
                v.ratio,
                interval(v.ci.as_ref()),
                v.outcome().as_str(),
                v.goal()
            );
        }
        s.push('\n');
    }

    // ---- plans against the VMs they ran on ----
    if results.rows.iter().any(|r| r.vms_planned.is_some()) {
        s.push_str(&squeeze_section(&results.rows));
    }

    // ---- the cluster ----
    for (what, info) in &results.clusters {
        let _ = writeln!(
            s,
            "## The emulated cluster: {what}\n\n{}\n",
            cluster_text(opts, results.dilation, info)
        );
        s.push_str(
            "| agent | VM type | vCPUs | memory MB | network Mbit/s |\n|---|---|---|---|---|\n",
        );
        for a in &info.agents {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                a.agent_id, a.vm_type, a.vcpus, a.memory_mb, a.network_mbps
            );
        }
        s.push('\n');
    }

    // ---- profiling, Fig. 10 ----
    if !results.profiled.is_empty() {
        s.push_str("## Profiling and prediction error (Fig. 10)\n\nEach application ran forced `remote` (spread over the agents, the control plane's profiling) at training sizes spread over its range, then at held-out sizes between them ([profiling.csv](profiling.csv)). The control plane fitted its models after every job. For Fig. 10 each parameter's model is refitted on the first k training jobs, in the order they ran, and scored on the held-out jobs (mean absolute percentage error).\n\n| app | input range | profiling jobs | held out | models converged after |\n|---|---|---|---|---|\n");
        for app in super::apps::apps() {
            let mine: Vec<_> = results
                .profiled
                .iter()
                .filter(|p| p.app == app.name)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let conv = match results.converged_after.get(app.name) {
                Some(Some(n)) => format!("{n} jobs"),
                _ => "not converged".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {}-{} {} | {} | {} | {} |",
                app.name,
                app.lo,
                app.hi,
                app.unit,
                mine.iter().filter(|p| !p.held_out).count(),
                mine.iter().filter(|p| p.held_out).count(),
                conv
            );
        }
        s.push('\n');
        if !results.models.is_empty() {
            s.push_str("The control plane's models after profiling (a model converges at cross-validated MAPE under 15% with 5 samples; the DAG converges when every memory, cold time and fanout model does):\n\n| app | parameter | converged | samples | degree | CV MAPE % | equation (x: input bytes) |\n|---|---|---|---|---|---|---|\n");
            for (app, m) in &results.models {
                for v in &m.models {
                    let _ = writeln!(
                        s,
                        "| {app} | {} | {} | {} | {} | {} | {} |",
                        v.parameter,
                        if v.converged { "yes" } else { "**no**" },
                        v.samples,
                        v.degree.map_or("-".into(), |d| d.to_string()),
                        v.cv_mape
                            .map_or("-".into(), |e| format!("{:.1}", 100.0 * e)),
                        v.equation.clone().unwrap_or_default()
                    );
                }
            }
            s.push('\n');
        }
        let apps = apps_of(results.fig10.iter().map(|p| p.app.as_str()));
        for app in &apps {
            let _ = writeln!(s, "![Fig. 10 {app}](fig10-{app}.svg)\n");
        }
        if !results.fig10.is_empty() {
            s.push_str("Error with the fewest (2) and with all training jobs, per parameter ([fig10.csv](fig10.csv)):\n\n| app | parameter | MAPE % at 2 jobs | MAPE % at all | jobs |\n|---|---|---|---|---|\n");
            let mut keys: Vec<(&str, &str)> = Vec::new();
            for p in &results.fig10 {
                if !keys.contains(&(p.app.as_str(), p.parameter.as_str())) {
                    keys.push((&p.app, &p.parameter));
                }
            }
            for (app, param) in keys {
                let pts: Vec<_> = results
                    .fig10
                    .iter()
                    .filter(|p| p.app == app && p.parameter == param)
                    .collect();
                if let (Some(first), Some(last)) = (pts.first(), pts.last()) {
                    let _ = writeln!(
                        s,
                        "| {app} | {param} | {:.1} | {:.1} | {} |",
                        first.mape, last.mape, last.train_jobs
                    );
                }
            }
            s.push('\n');
        }
    }

    // ---- Fig. 7 ----
    if has(cells, "fig7") {
        s.push_str("## Each application under every policy (Fig. 7)\n\n![Fig. 7](fig7.svg)\n\nAt each application's middle training size, jobs of each policy in turn ([jobs.csv](jobs.csv) has every job). The static policies are the paper's baselines, placed as the planner places them (`\"planned\": true`): `remote` is OpenLambda+S3 (one smallest fitting VM per lambda, every edge through the store), `local` is SAND (the whole job on one largest VM, every edge vm-storage), `direct` passes every edge VM to VM. `sonic` plans with the models' predictions, `oracle` with the parameters measured at that input.\n\n");
        cell_table(&mut s, cells, "fig7");
    }

    // ---- Fig. 2 ----
    if has(cells, "fig2") {
        s.push_str("## The ML pipeline at fanout 1, 3 and 12 (Fig. 2)\n\n![Fig. 2](fig2.svg)\n\n");
        cell_table(&mut s, cells, "fig2");
    }

    // ---- Fig. 6 ----
    if has(cells, "fig6") {
        let _ = writeln!(
            s,
            "## direct vs remote as the broadcast fanout grows (Fig. 6)\n\n![Fig. 6](fig6.svg)\n\n\
             `dags/broadcast.yaml`: one source writes {} MB, every sink receives that file; forced \
             `direct` or `remote`, on a cluster of agents of one VM type (the source on one, each \
             sink on an agent of its own: one receiver per VM). The links of these clusters run at {} of the \
             catalog's (VMs and store alike; the store's request latency kept), so that this \
             machine's own cost of moving bytes stays below the links'. `data passing s` is the \
             slowest sink's staging of the file (the job summary's edge time; for `remote` the \
             upload comes before it).\n",
            FIG6_BYTES / 1_000_000,
            FIG6_NET_SCALE
        );
        s.push_str("![Fig. 6, data passing](fig6-edge.svg)\n\n| VM type | first fanout where remote beats direct: job latency | data passing |\n|---|---|---|\n");
        let by_edge = fig6_crossovers(&fig6_edges(cells));
        for (vm, k) in fig6_crossovers(cells) {
            let e = by_edge.iter().find(|(v, _)| *v == vm).and_then(|(_, k)| *k);
            let show = |k: Option<u32>| k.map_or("none measured".to_owned(), |k| k.to_string());
            let _ = writeln!(s, "| {vm} | {} | {} |", show(k), show(e));
        }
        s.push('\n');
        cell_table(&mut s, cells, "fig6");
    }

    // ---- prediction quality ----
    predictions::report(&mut s, &results.times);

    // ---- validation ----
    if !results.validation.is_empty() {
        s.push_str("## The simulator against the real runs\n\nEach Fig. 7 cell simulated alone as the system ran it ([validation.csv](validation.csv)): the plan of its first job (`plans/`), on the run's VMs (one per agent), with the bandwidths the planner used for that plan (measured, in emulated time) and the parameters the profiling jobs measured at that input, each function's per-instance overhead included; the cost as the job summary computes it (each VM at its full price from its first instance's start to its last one's end; no storage or requests). Alone on an idle cluster the simulator reproduces the model for that plan, so the error is the model's against this machine (docs/simulator.md, \"Validation against the dilated cluster\"). Its inputs are in [validation-inputs.json](validation-inputs.json): `ofctl bench --only validate --out DIR` re-runs it without the cluster.\n\n| app | policy | real latency s | simulated s | error | real cost $ | simulated $ | error |\n|---|---|---|---|---|---|---|---|\n");
        for r in &results.validation {
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {:.2} | {:.0}% | {:.7} | {:.7} | {:.0}% |",
                r.app,
                r.policy,
                r.real_latency_s,
                r.sim_latency_s,
                100.0 * r.latency_error(),
                r.real_cost_usd,
                r.sim_cost_usd,
                100.0 * r.cost_error()
            );
        }
        let n = results.validation.len() as f64;
        let lat = results
            .validation
            .iter()
            .map(bsim::ValidationRow::latency_error)
            .sum::<f64>()
            / n;
        let cost = results
            .validation
            .iter()
            .map(bsim::ValidationRow::cost_error)
            .sum::<f64>()
            / n;
        let _ = writeln!(
            s,
            "\nMean error: latency {:.0}%, cost {:.0}%.\n",
            100.0 * lat,
            100.0 * cost
        );
    }

    // ---- simulator ----
    if let Some(sim) = &results.sim {
        bsim::report(&mut s, sim);
    }

    // ---- overhead ----
    if !results.overhead.is_empty() {
        s.push_str("## Planner and model overhead\n\nPer application: the median round trip of `GET /v1/dags/{name}/plan` for the measured input (regression prediction, planning and HTTP: an upper bound of what a planned job spends deciding), and the planner's own time as recorded in the sonic jobs' plans, against the mean latency of those jobs.\n\n| app | plan route ms | planner ms | sonic job s | overhead % (route / job) |\n|---|---|---|---|---|\n");
        for o in &results.overhead {
            let pct = if o.job_s > 0.0 {
                100.0 * o.route_s / o.job_s
            } else {
                f64::NAN
            };
            let _ = writeln!(
                s,
                "| {} | {:.2} | {:.2} | {:.2} | {:.3} |",
                o.app,
                o.route_s * 1000.0,
                o.planner_s * 1000.0,
                o.job_s,
                pct
            );
        }
        s.push('\n');
    }

    // ---- where Sonic does not win, and why ----
    losses(&mut s, results, &all);

    if !results.notes.is_empty() {
        s.push_str("## Notes from this run\n\n");
        for n in &results.notes {
            let short: String = n.chars().take(400).collect();
            let more = if short.len() < n.len() { " ..." } else { "" };
            let _ = writeln!(s, "- {}{more}", short.replace('\n', " "));
        }
    }
    s
}

/// Every case where Sonic does not win (its interval does not exclude 1 from above, or it has
/// none), with what the run says made the difference.
fn losses(s: &mut String, results: &Results, all: &[Verdict]) {
    let short: Vec<&Verdict> = all
        .iter()
        .filter(|v| match v.outcome() {
            Outcome::Win => false,
            // One simulation, no interval: where its point estimate is not a win.
            Outcome::NoInterval => v.ratio <= 1.0,
            Outcome::Loss | Outcome::NoDifference => true,
        })
        .collect();
    s.push_str("## Where Sonic does not win, and why

Every case above where Sonic's interval is not wholly above 1 (in the simulator, with no interval: where its ratio is at most 1). For the measured ones, from the jobs' summaries (docs/evaluation.md, \"Why Sonic does not win\"): each stage's time after its inputs were ready, split into compute, data passing and waiting, predicted (the plan's `timing`) against measured, means over the cell's jobs; the job's terms add up its critical path (the waiting includes the time after its last stage). The term that made the difference is the one whose measured time grew most from the best static policy's jobs to Sonic's.\n\n");
    if short.is_empty() {
        s.push_str("Nowhere in this run: Sonic wins every case above.\n\n");
    }
    for v in short {
        let _ = write!(
            s,
            "### {} {}: {:.3} of `{}`\n\n95% interval {} ({}; goal met: {}).",
            v.experiment,
            v.group,
            v.ratio,
            v.best_static,
            interval(v.ci.as_ref()),
            match v.outcome() {
                Outcome::Loss => "a loss: the interval is below 1",
                Outcome::NoDifference => "no difference measured: the interval holds 1",
                Outcome::Win => "a win",
                Outcome::NoInterval => "no interval",
            },
            v.goal()
        );
        let of = |policy: &str| -> Vec<&explain::JobTimes> {
            results
                .times
                .iter()
                .filter(|j| {
                    j.experiment == v.experiment
                        && format!("{} {}", j.app, j.variant).trim() == v.group
                        && j.policy == policy
                })
                .collect()
        };
        let ran = |policy: &str| {
            results
                .rows
                .iter()
                .find(|r| {
                    r.experiment == v.experiment
                        && format!("{} {}", r.app, r.variant).trim() == v.group
                        && r.policy == policy
                })
                .map(|r| format!("`{}; {}`", r.methods, r.placement))
        };
        if let (Some(a), Some(b)) = (ran("sonic"), ran(&v.best_static)) {
            let _ = write!(s, " Sonic ran {a}; `{}` ran {b}.", v.best_static);
        }
        match explain::explain(&of("sonic"), &of(&v.best_static), &v.best_static) {
            Some(x) => {
                let _ = writeln!(s, " {}\n", x.sentence());
                x.table(s);
            }
            None if v.experiment.contains("(sim)") => {
                s.push_str(" The simulator keeps no per-stage record of its jobs.\n\n");
            }
            None => {
                s.push_str(" No per-stage record of these jobs (their summaries do not say when instances ran).\n\n");
            }
        }
    }
}

/// Which cells ran plans on fewer agents than they asked VMs for (`jobs.csv`'s `vms_planned`,
/// `vms_run` and `squeezed`): such a cell measures the testbed, not the policy.
pub fn squeeze_section(rows: &[crate::Row]) -> String {
    let mut s = String::from(
        "## Plans against the VMs they ran on

A plan squeezed onto fewer VMs than it asked for (a stage's instances on fewer distinct agents than the stage's VMs in the plan the policy asked for, before the resource manager's pool limited it) is a testbed error, not a result: [jobs.csv](jobs.csv) has `vms_planned` (the most VMs one stage asked for), `vms_run` (the distinct agents the job ran on) and `squeezed` per job.

",
    );
    // Per (experiment, app, case, policy): planned jobs, squeezed ones, the first squeeze.
    type Key<'a> = (&'a str, &'a str, &'a str, &'a str);
    let mut cells: BTreeMap<Key, (usize, usize, &str)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.vms_planned.is_some()) {
        let e = cells
            .entry((&r.experiment, &r.app, &r.variant, &r.policy))
            .or_insert((0, 0, ""));
        e.0 += 1;
        if !r.squeezed.is_empty() {
            e.1 += 1;
            if e.2.is_empty() {
                e.2 = &r.squeezed;
            }
        }
    }
    let bad: Vec<_> = cells.iter().filter(|(_, v)| v.1 > 0).collect();
    if bad.is_empty() {
        let _ = writeln!(
            s,
            "Every planned job ({} cells) ran each stage on as many agents as its plan asked VMs for.
",
            cells.len()
        );
        return s;
    }
    let _ = writeln!(
        s,
        "{} of {} cells ran squeezed plans: their figures are the testbed's, not the policy's.

| experiment | app | case | policy | jobs squeezed | for example (stage: VMs asked > agents run on) |
|---|---|---|---|---|---|",
        bad.len(),
        cells.len()
    );
    for ((exp, app, variant, policy), (jobs, squeezed, example)) in bad {
        let _ = writeln!(
            s,
            "| {exp} | {app} | {variant} | {policy} | {squeezed} of {jobs} | {example} |"
        );
    }
    s.push('\n');
    s
}

fn cell_table(s: &mut String, cells: &[Cell], experiment: &str) {
    s.push_str("| app | case | policy | jobs | latency s (sd) | data passing s | cost $ | Perf/$ | / best static | 95% interval |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for c in cells.iter().filter(|c| c.experiment == experiment) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} ({:.2}) | {:.2} | {:.7} | {:.0} | {:.3} | {} |",
            c.app,
            c.variant,
            c.policy,
            c.jobs,
            c.latency_s,
            c.latency_sd,
            c.edge_s,
            c.cost_usd,
            c.perf_per_dollar,
            c.ratio_to_best_static,
            interval(c.ratio_ci.as_ref())
        );
    }
    s.push('\n');
}

/// What the cluster a run measured on emulates and what it does not: the in-process cluster,
/// or the cluster of containers (time-dilated when `dilation` > 1).
fn cluster_text(opts: &BenchOptions, dilation: f64, info: &ClusterInfo) -> String {
    const COSTS: &str =
        "Costs are the model's (catalog price x time each agent was held by the job), not a bill.";
    let n = info.agents.len();
    let (sandbox, store, at) = (&info.sandbox, &info.store, &info.store_location);
    let what = match opts.cluster {
        ClusterKind::InProcess => format!(
            "One process runs the control plane and {n} agents ({sandbox} sandbox; store: {store} \
             at {at}). Each agent stands for one VM of its type: its egress and ingress are \
             limited to the type's bandwidth (catalog values, not scaled), and the agents see the \
             store with the catalog's request latency and one connection's read and write \
             throughput (`remote_storage`). Not emulated: compute and memory. All agents share \
             this machine's cores and disk, so a lambda computes no faster on a larger type, and \
             the inputs are small enough for 2 cores."
        ),
        ClusterKind::Containers if dilation > 1.0 => format!(
            "The cluster of containers (`deploy/cluster.sh`): a control plane, a store and {n} \
             agent containers, one per VM ({sandbox} sandbox: the lambdas run inside their \
             agent's limits; store: {store} at {at}), time-dilated by D = {dilation} (DieCast): \
             each agent's CPU quota is its type's vCPUs / D cores and its network rate the \
             type's / D (the table's figures), and it sees the store D times slower (request \
             latency x D, throughput / D); the control plane plans with the catalog dilated the \
             same way. Every time and cost in this report is emulated: measured / D, the control \
             plane's own part of a job undivided (docs/evaluation.md, \"The dilated cluster\"). \
             Not emulated: memory (the type's, not dilated) and this machine's memory bandwidth \
             and disk."
        ),
        ClusterKind::Containers => format!(
            "The cluster of containers (`deploy/cluster.sh`): a control plane, a store and {n} \
             agent containers ({sandbox} sandbox; store: {store} at {at}), not time-dilated: \
             each agent's CPU and network are what `cluster.sh` gave it (the table), on this \
             machine's cores."
        ),
    };
    format!("{what} {COSTS}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Row, aggregate};

    #[test]
    fn the_cluster_paragraph_says_what_the_run_emulated() {
        let info = ClusterInfo {
            server: "http://127.0.0.1:7000".into(),
            sandbox: "process".into(),
            sandbox_reason: String::new(),
            store: "s3".into(),
            store_location: "the cluster's own store (sonic-store)".into(),
            store_reason: String::new(),
            data_dir: std::path::PathBuf::new(),
            lambdas: None,
            openlambda: None,
            agents: Vec::new(),
        };
        let mut opts = BenchOptions {
            quick: true,
            out_dir: std::path::PathBuf::new(),
            data_dir: None,
            only: Vec::new(),
            seed: 1,
            cluster: ClusterKind::InProcess,
            server: None,
            dilation: None,
            dilation_reps: 3,
            apps: Vec::new(),
            allow_squeezed: false,
        };
        let local = cluster_text(&opts, 1.0, &info);
        assert!(
            local.contains("Not emulated: compute and memory"),
            "{local}"
        );
        opts.cluster = ClusterKind::Containers;
        let dilated = cluster_text(&opts, 16.0, &info);
        assert!(dilated.contains("time-dilated by D = 16"), "{dilated}");
        assert!(dilated.contains("vCPUs / D cores"), "{dilated}");
        assert!(!dilated.contains("Not emulated: compute"), "{dilated}");
        let plain = cluster_text(&opts, 1.0, &info);
        assert!(plain.contains("not time-dilated"), "{plain}");
    }

    fn row(variant: &str, policy: &str, lat: f64) -> Row {
        Row {
            experiment: "fig6".into(),
            app: "broadcast".into(),
            variant: variant.into(),
            policy: policy.into(),
            job_id: "j".into(),
            mode: "profiling".into(),
            input_bytes: 0,
            latency_s: lat,
            cost_usd: 1.0,
            perf_per_dollar: 1.0 / lat,
            methods: String::new(),
            plan_used: String::new(),
            placement: String::new(),
            edge_s: 0.0,
            planning_us: 0.0,
            predicted_latency_s: None,
            predicted_cost_usd: None,
            dilation: 1.0,
            vms_planned: None,
            vms_run: 1,
            squeezed: String::new(),
        }
    }

    fn job(variant: &str, policy: &str, lat: f64, cost: f64) -> Row {
        Row {
            experiment: "fig7".into(),
            app: "app".into(),
            cost_usd: cost,
            perf_per_dollar: 1.0 / (lat * cost),
            ..row(variant, policy, lat)
        }
    }

    #[test]
    fn squeezed_cells_are_named_and_clean_runs_say_so() {
        let planned = |policy: &str, squeezed: &str| Row {
            vms_planned: Some(30),
            vms_run: if squeezed.is_empty() { 30 } else { 4 },
            squeezed: squeezed.into(),
            ..job("", policy, 1.0, 1.0)
        };
        let rows = vec![
            planned("remote", "map:30>4"),
            planned("remote", ""),
            planned("sonic", ""),
            row("", "remote", 1.0),
        ];
        let s = squeeze_section(&rows);
        assert!(s.contains("1 of 2 cells ran squeezed plans"), "{s}");
        assert!(
            s.contains("| fig7 | app |  | remote | 1 of 2 | map:30>4 |"),
            "{s}"
        );
        assert!(!s.contains("| sonic |"), "{s}");
        let clean = squeeze_section(&rows[1..]);
        assert!(
            clean.contains("Every planned job (2 cells) ran each stage"),
            "{clean}"
        );
    }

    /// The verdict rule: a win or a loss only where the interval excludes 1; the goal only by
    /// the whole interval.
    #[test]
    fn verdicts_claim_only_what_the_interval_allows() {
        let mut rows = Vec::new();
        // Case "clear": sonic twice local's Perf/$, little spread. Case "noisy": sonic 10% ahead
        // in the means, but every cell spreads 3x. Five rounds each.
        for (lat_l, lat_s) in [(2.0, 1.0), (2.2, 1.1), (1.8, 0.9), (2.1, 1.05), (1.9, 0.95)] {
            rows.push(job("clear", "local", lat_l, 1.0));
            rows.push(job("clear", "remote", 3.0 * lat_l, 1.0));
            rows.push(job("clear", "sonic", lat_s, 1.0));
        }
        for (lat_l, lat_s) in [(1.1, 1.0), (3.3, 3.0), (1.1, 1.0), (3.3, 3.0), (2.2, 2.0)] {
            rows.push(job("noisy", "local", lat_l, 1.0));
            rows.push(job("noisy", "sonic", lat_s, 1.0));
        }
        let cells = aggregate_seeded(&rows, 11);
        let local = cells
            .iter()
            .find(|c| c.variant == "clear" && c.policy == "local")
            .expect("cell");
        assert_eq!(
            local.ratio_ci, None,
            "the best static has no interval to itself"
        );
        let v = verdicts(&cells);
        assert_eq!(v.len(), 2);
        let clear = &v[0];
        assert_eq!(
            (clear.group.as_str(), clear.best_static.as_str()),
            ("app clear", "local")
        );
        assert!((clear.ratio - 2.0).abs() < 1e-9);
        assert_eq!(clear.outcome(), Outcome::Win);
        assert_eq!(clear.goal(), "yes");
        let noisy = &v[1];
        assert!((noisy.ratio - 1.1).abs() < 1e-9, "{noisy:?}");
        assert_eq!(noisy.outcome(), Outcome::NoDifference, "{noisy:?}");
        assert_eq!(noisy.outcome().as_str(), "no difference measured");
        assert_eq!(noisy.goal(), "within noise");
        // The same seed, the same intervals.
        assert_eq!(aggregate_seeded(&rows, 11), cells);
        // A loss is claimed only when the whole interval is below 1.
        let loss = Verdict {
            ci: Some(Interval {
                ratio: 0.6,
                lo: 0.5,
                hi: 0.7,
            }),
            ratio: 0.6,
            ..clear.clone()
        };
        assert_eq!((loss.outcome(), loss.goal()), (Outcome::Loss, "**no**"));
        // The simulator's one run: no interval, no claim beyond the point estimate.
        let sim = Verdict { ci: None, ..loss };
        assert_eq!(sim.outcome(), Outcome::NoInterval);
        assert_eq!(sim.goal(), "**no** (no interval)");
    }

    /// The section on cases Sonic does not win explains each from the jobs, and leaves the wins
    /// out.
    #[test]
    fn losses_are_explained_from_the_jobs() {
        use crate::explain::{job_times, tests::summary};
        let mut results = Results::default();
        let mut add = |variant: &str, policy: &str, latency: f64, edge_s: f64| {
            let s = summary(policy, latency, 0.002, edge_s, 0.3);
            results
                .rows
                .push(Row::from_summary("fig7", variant, policy, &s, 1.0));
            results
                .times
                .extend(job_times(("fig7", variant, policy), &s, 1.0));
        };
        for k in 0..5 {
            let jitter = 0.01 * f64::from(k);
            // "slow": Sonic's data passing takes 2 s more than local's.
            add("slow", "local", 5.0 + jitter, 0.5);
            add("slow", "sonic", 7.0 + jitter, 2.5 + jitter);
            // "fast": Sonic wins clearly.
            add("fast", "local", 5.0 + jitter, 0.5);
            add("fast", "sonic", 2.5 + jitter, 0.1);
        }
        let cells = aggregate_seeded(&results.rows, 3);
        let all = verdicts(&cells);
        assert_eq!(all.len(), 2);
        let mut s = String::new();
        losses(&mut s, &results, &all);
        assert!(s.contains("### fig7 chain slow: 0.715 of `local`"), "{s}");
        assert!(s.contains("a loss: the interval is below 1"), "{s}");
        assert!(
            s.contains("the term that made the difference is **data passing**"),
            "{s}"
        );
        assert!(s.contains("most in `b`"), "{s}");
        assert!(
            s.contains("| `b` | sonic | 1.50 / 2.00 | 0.50 / 2.52 |"),
            "{s}"
        );
        assert!(!s.contains("fast"), "a win is not listed: {s}");
        // Without per-stage records, the section says so rather than guess.
        results.times.clear();
        let mut s = String::new();
        losses(&mut s, &results, &all);
        assert!(s.contains("No per-stage record of these jobs"), "{s}");
    }

    #[test]
    fn crossover_is_the_first_fanout_where_remote_wins() {
        let rows = vec![
            row("m5.large k=1", "direct", 1.0),
            row("m5.large k=1", "remote", 2.0),
            row("m5.large k=4", "direct", 3.0),
            row("m5.large k=4", "remote", 2.5),
            row("m5.xlarge k=1", "direct", 1.0),
            row("m5.xlarge k=1", "remote", 2.0),
        ];
        let cells = aggregate(&rows);
        assert_eq!(
            fig6_crossovers(&cells),
            vec![("m5.large".into(), Some(4)), ("m5.xlarge".into(), None)]
        );
        let chart = fig6_chart(&cells, "s").unwrap();
        assert!(chart.contains("direct m5.large"));
    }
}
