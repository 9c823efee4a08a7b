//! The `-o table` views: fixed-width tables for people. `-o json` prints the server's documents
//! as they are and never comes here.

use std::io::{self, Write};

use sonic_api::control::{AgentList, DagList, DagModelsView, JobLogs, JobStatus, JobSummary};

/// Bytes in powers of 1000, as the DAG and catalog files write them.
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    for (unit, size) in [("GB", 1e9), ("MB", 1e6), ("KB", 1e3)] {
        if n >= size {
            return format!("{:.1} {unit}", n / size);
        }
    }
    format!("{n} B")
}

/// A number of CPUs as a plan gives them: `2`, `2.667`.
pub fn cpus(c: f64) -> String {
    format!("{c:.3}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

pub fn usd(v: f64) -> String {
    format!("${v:.6}")
}

/// A table: a header and rows, each column as wide as its widest cell.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|s| (*s).to_owned()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn write(&self, indent: &str, out: &mut dyn Write) -> io::Result<()> {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for r in &self.rows {
            let mut line = String::from(indent);
            for (c, cell) in r.iter().enumerate() {
                if c + 1 == r.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

pub fn dags(list: &DagList, out: &mut dyn Write) -> io::Result<()> {
    if list.dags.is_empty() {
        return writeln!(out, "no DAGs: apply one with `ofctl apply -f FILE`");
    }
    let mut t = Table::new(&[
        "NAME",
        "REVISION",
        "FUNCTIONS",
        "EDGES",
        "TRIGGERS",
        "DESCRIPTION",
    ]);
    for d in &list.dags {
        let description: String = d.description.chars().take(60).collect();
        t.row(vec![
            d.name.clone(),
            d.revision.to_string(),
            d.functions.join(","),
            d.edges.to_string(),
            if d.triggers.is_empty() {
                "-".into()
            } else {
                d.triggers.join("; ")
            },
            description,
        ]);
    }
    t.write("", out)
}

/// A job's status in words: a cancelled job is `failed (cancelled)`.
fn status_word(j: &JobSummary) -> String {
    if j.status == JobStatus::Failed && j.failure == Some(sonic_core::machine::Failure::Cancelled) {
        format!("{} (cancelled)", j.status)
    } else {
        j.status.to_string()
    }
}

/// One DAG (`get dag NAME`): which revision this is of those kept, and its file as applied.
pub fn dag(d: &sonic_api::control::DagDetail, out: &mut dyn Write) -> io::Result<()> {
    let s = &d.summary;
    let revisions: Vec<String> = d.revisions.iter().map(u64::to_string).collect();
    writeln!(out, "dag:        {}", s.name)?;
    writeln!(
        out,
        "revision:   {} (kept: {})",
        s.revision,
        if revisions.is_empty() {
            "-".into()
        } else {
            revisions.join(", ")
        }
    )?;
    writeln!(out, "functions:  {}", s.functions.join(", "))?;
    writeln!(out, "applied:    {} UTC", utc(s.updated_at_ms))?;
    writeln!(out, "---")?;
    write!(out, "{}", d.yaml)?;
    if !d.yaml.ends_with('\n') {
        writeln!(out)?;
    }
    Ok(())
}

/// Unix milliseconds as a UTC time to the second (`2026-12-02 13:05:01`).
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

pub fn jobs(jobs: &[JobSummary], out: &mut dyn Write) -> io::Result<()> {
    if jobs.is_empty() {
        return writeln!(out, "no jobs: submit one with `ofctl run DAG`");
    }
    let mut t = Table::new(&[
        "JOB",
        "DAG",
        "STATUS",
        "SUBMITTED (UTC)",
        "MODE",
        "POLICY",
        "INPUT",
        "LATENCY",
        "COST",
        "PERF/$",
    ]);
    for j in jobs {
        let ended = j.status.is_terminal();
        t.row(vec![
            j.job_id.clone(),
            j.dag.clone(),
            if !j.bounds_missed.is_empty() {
                format!("{} (bounds missed)", j.status)
            } else {
                status_word(j)
            },
            j.submitted_ms.map_or_else(|| "-".into(), utc),
            j.mode.to_string(),
            j.policy.to_string(),
            bytes(j.input_bytes),
            if ended {
                format!("{:.2} s", j.latency_s)
            } else {
                "-".into()
            },
            if ended { usd(j.cost_usd) } else { "-".into() },
            // Perf/$ is a succeeded job's: a failed one's latency is not the job's.
            if ended && j.status == JobStatus::Succeeded {
                format!("{:.0}", j.perf_per_dollar)
            } else {
                "-".into()
            },
        ]);
    }
    t.write("", out)
}

pub fn agents(list: &AgentList, out: &mut dyn Write) -> io::Result<()> {
    if list.agents.is_empty() {
        return writeln!(out, "no agents registered");
    }
    let mut t = Table::new(&[
        "AGENT", "VM TYPE", "ALIVE", "SANDBOX", "VCPUS", "MEMORY", "NETWORK", "RUNNING", "URL",
    ]);
    for a in &list.agents {
        let c = &a.capacity;
        t.row(vec![
            a.agent_id.clone(),
            a.vm_type.clone(),
            if a.alive {
                "yes".into()
            } else {
                format!("no ({} s)", a.heartbeat_age_ms / 1000)
            },
            c.sandbox.clone(),
            c.vcpus.to_string(),
            format!("{} MB", c.memory_mb),
            c.network_mbps
                .map_or_else(|| "unlimited".into(), |m| format!("{m:.0} Mbit/s")),
            c.running.to_string(),
            a.url.clone(),
        ]);
    }
    t.write("", out)
}

/// The secrets, without values.
pub fn secrets(list: &sonic_api::control::SecretList, out: &mut dyn Write) -> io::Result<()> {
    if list.secrets.is_empty() {
        return writeln!(
            out,
            "no secrets (ofctl create secret NAME --from-file FILE)"
        );
    }
    let mut t = Table::new(&["NAME", "BYTES", "SOURCE", "UPDATED (UTC)"]);
    for s in &list.secrets {
        t.row(vec![
            s.name.clone(),
            s.bytes.to_string(),
            s.source.clone(),
            s.updated_ms.map(utc).unwrap_or_default(),
        ]);
    }
    t.write("", out)
}

/// One job: its measures, functions, edges and outputs.
pub fn job(j: &JobSummary, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "job      {}", j.job_id)?;
    match j.dag_revision {
        Some(r) => writeln!(out, "dag      {} (revision {r})", j.dag)?,
        None => writeln!(out, "dag      {}", j.dag)?,
    }
    if j.bounds_missed.is_empty() {
        writeln!(out, "status   {}", status_word(j))?;
    } else {
        // It succeeded, but not within the DAG's bounds.
        writeln!(
            out,
            "status   {}, outside its bounds: {}",
            j.status,
            j.bounds_missed.join("; ")
        )?;
    }
    if let Some(e) = &j.error {
        writeln!(out, "error    {e}")?;
    }
    if let Some(h) = &j.on_failure {
        match &h.error {
            None => writeln!(
                out,
                "hook     on_failure {} ran on {} ({:.1} s)",
                h.function, h.agent, h.seconds
            )?,
            Some(e) => writeln!(out, "hook     on_failure {} failed: {e}", h.function)?,
        }
    }
    writeln!(out, "mode     {} (policy {})", j.mode, j.policy)?;
    if let Some(why) = &j.mode_reason {
        writeln!(out, "why      {why}")?;
    }
    writeln!(out, "input    {}", bytes(j.input_bytes))?;
    let times: Vec<String> = [
        ("submitted", j.submitted_ms),
        ("started", j.started_ms),
        ("ended", j.ended_ms),
    ]
    .into_iter()
    .filter_map(|(what, ms)| Some(format!("{what} {}", utc(ms?))))
    .collect();
    if !times.is_empty() {
        writeln!(out, "times    {} (UTC)", times.join("   "))?;
    }
    if j.status.is_terminal() {
        if j.status == JobStatus::Succeeded {
            writeln!(
                out,
                "latency  {:.3} s   cost {}   perf/$ {:.1}",
                j.latency_s,
                usd(j.cost_usd),
                j.perf_per_dollar
            )?;
        } else {
            // Until it stopped; no Perf/$: a failed job's latency is not the job's.
            writeln!(
                out,
                "latency  {:.3} s (until it stopped)   cost {}",
                j.latency_s,
                usd(j.cost_usd)
            )?;
        }
    }
    if !j.functions.is_empty() {
        writeln!(out, "\nFUNCTIONS")?;
        let mut t = Table::new(&[
            "NAME", "INSTANCE", "AGENT", "VM TYPE", "COLD", "SECONDS", "PEAK MEM", "ATTEMPTS",
        ]);
        for f in &j.functions {
            t.row(vec![
                f.name.clone(),
                f.instance.to_string(),
                f.agent.clone(),
                f.vm_type.clone(),
                if f.cold { "cold" } else { "warm" }.into(),
                format!("{:.3}", f.seconds),
                f.peak_memory_mb
                    .map_or_else(|| "-".into(), |m| format!("{m:.0} MB")),
                if f.reused {
                    format!("{} (reused)", f.attempts)
                } else {
                    f.attempts.to_string()
                },
            ]);
        }
        t.write("  ", out)?;
        let reused = j.functions.iter().filter(|f| f.reused).count();
        if reused > 0 {
            let saved: f64 = j
                .functions
                .iter()
                .filter(|f| f.reused)
                .map(|f| f.seconds)
                .sum();
            writeln!(
                out,
                "  {reused} instance(s) reused from before the retry, not run again ({saved:.3} s of lambda time they took then)"
            )?;
        }
    }
    if !j.edges.is_empty() {
        writeln!(out, "\nEDGES")?;
        let mut t = Table::new(&["EDGE", "METHOD", "BYTES", "SECONDS"]);
        for e in &j.edges {
            t.row(vec![
                format!("{} -> {}", e.from, e.to),
                e.method.as_str().to_owned(),
                bytes(e.bytes),
                format!("{:.3}", e.seconds),
            ]);
        }
        t.write("  ", out)?;
    }
    if !j.outputs.is_empty() {
        writeln!(out, "\nOUTPUTS")?;
        for o in &j.outputs {
            writeln!(out, "  {o}")?;
        }
    }
    Ok(())
}

/// The plan a planned job ran with (the summary's `plan`, when the control plane sends one).
pub fn job_plan(summary: &serde_json::Value, out: &mut dyn Write) -> io::Result<()> {
    let p = &summary["plan"];
    let Some(used) = p["used"].as_str() else {
        return Ok(());
    };
    writeln!(out, "\nPLAN ({used})")?;
    for n in p["notes"].as_array().into_iter().flatten() {
        writeln!(out, "  note: {}", n.as_str().unwrap_or_default())?;
    }
    let stages = p["stages"].as_array().map_or(&[][..], Vec::as_slice);
    if !stages.is_empty() {
        let mut t = Table::new(&[
            "FUNCTION",
            "VM TYPE",
            "AGENTS",
            "CONCURRENT",
            "MEMORY LIMIT",
        ]);
        for st in stages {
            let agents: Vec<&str> = st["agents"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect();
            t.row(vec![
                st["function"].as_str().unwrap_or("-").to_owned(),
                st["vm_type"].as_str().unwrap_or("-").to_owned(),
                agents.join(","),
                st["concurrent"].to_string(),
                st["memory_limit_mb"]
                    .as_u64()
                    .map_or_else(|| "-".into(), |m| format!("{m} MB")),
            ]);
        }
        t.write("  ", out)?;
    }
    if p["report"].is_object() {
        writeln!(out, "  the plan as chosen:")?;
        plan(&p["report"], "    ", out)?;
    }
    Ok(())
}

fn percent(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{:.1}%", v * 100.0),
        Some(_) => "inf".into(),
        None => "-".into(),
    }
}

pub fn models(m: &DagModelsView, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "DAG {}: models {} after {} job(s) (a model converges under {:.0}% cross-validated MAPE)",
        m.dag,
        if m.converged {
            "converged"
        } else {
            "not converged"
        },
        m.jobs,
        m.max_mape * 100.0
    )?;
    if !m.params.is_empty() {
        writeln!(
            out,
            "setting: {} (the DAG's default parameters; models are learned per setting)",
            setting_label(&m.params)
        )?;
    }
    if let Some(mode) = &m.mode {
        writeln!(out, "mode: {} ({})", mode.mode, mode.reason)?;
        writeln!(
            out,
            "drift rule: a parameter more than {:.0}% off its prediction in {} planned jobs in a row; drifts so far: {}",
            mode.drift_error * 100.0,
            mode.drift_jobs,
            mode.drifts
        )?;
        for w in &mode.watch {
            writeln!(
                out,
                "  watching {}: measured {:.4} against {:.4} predicted ({:.0}% off) in {} of {} jobs",
                w.parameter,
                w.measured,
                w.predicted,
                w.error * 100.0,
                w.jobs,
                mode.drift_jobs
            )?;
        }
    }
    let mut t = Table::new(&[
        "PARAMETER",
        "CONVERGED",
        "SAMPLES",
        "DEGREE",
        "CV MAPE",
        "EQUATION (x = input bytes)",
    ]);
    for v in &m.models {
        t.row(vec![
            v.parameter.clone(),
            if v.converged { "yes" } else { "no" }.into(),
            v.samples.to_string(),
            v.degree.map_or_else(|| "-".into(), |d| d.to_string()),
            percent(v.cv_mape),
            v.equation.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.write("  ", out)?;
    // Every setting learned, when there is more than the one above.
    if m.settings.iter().any(|s| s.setting != m.setting) {
        writeln!(out, "settings learned:")?;
        let mut t = Table::new(&["SETTING", "MODE", "CONVERGED", "JOBS", "WHY"]);
        for s in &m.settings {
            t.row(vec![
                s.label.clone(),
                s.mode
                    .as_ref()
                    .map_or_else(|| "-".into(), |v| v.mode.to_string()),
                if s.converged { "yes" } else { "no" }.into(),
                s.jobs.to_string(),
                s.mode
                    .as_ref()
                    .map_or_else(|| "-".into(), |v| v.reason.clone()),
            ]);
        }
        t.write("  ", out)?;
    }
    Ok(())
}

/// `trees=12, seed=42`, as `sonic_core::setting::Setting::label` prints a setting.
fn setting_label(params: &serde_json::Map<String, serde_json::Value>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn logs(l: &JobLogs, out: &mut dyn Write) -> io::Result<()> {
    if l.logs.is_empty() {
        return writeln!(out, "no logs for job {}", l.job_id);
    }
    for (i, log) in l.logs.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(
            out,
            "==> {}[{}] attempt {} on {} <==",
            log.function, log.instance, log.attempt, log.agent
        )?;
        let text = log.log.trim_end();
        if text.is_empty() {
            writeln!(out, "(empty)")?;
        } else {
            writeln!(out, "{text}")?;
        }
    }
    Ok(())
}

/// A plan document (the `ofctl plan -o json` shape), read leniently: stages, edges, prediction.
pub fn plan(p: &serde_json::Value, indent: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut t = Table::new(&[
        "FUNCTION",
        "VM TYPE",
        "VMS",
        "PER VM",
        "CONCURRENT",
        "CPUS",
        "START",
    ]);
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        v => v.to_string(),
    };
    for st in p["stages"].as_array().into_iter().flatten() {
        t.row(vec![
            s(&st["function"]),
            s(&st["vm_type"]),
            s(&st["vms"]),
            s(&st["per_vm"]),
            s(&st["concurrent"]),
            // The CPUs each instance is given (right-sizing).
            st["cores"].as_f64().map_or_else(|| "-".into(), cpus),
            // Priced starting hot: the pool kept the function's containers warm.
            // or its containers started while its senders run.
            if st["warm"] == serde_json::Value::Bool(true) {
                "warm".into()
            } else if st["prewarmed"] == serde_json::Value::Bool(true) {
                "prewarmed".into()
            } else {
                "cold".into()
            },
        ]);
    }
    t.write(indent, out)?;
    let mut t = Table::new(&["EDGE", "METHOD", "PREDICTED (S)"]);
    for e in p["edges"].as_array().into_iter().flatten() {
        t.row(vec![
            format!("{} -> {}", s(&e["from"]), s(&e["to"])),
            s(&e["method"]),
            e["predicted_s"]
                .as_f64()
                .map_or_else(|| "-".into(), |v| format!("{v:.3}")),
        ]);
    }
    t.write(indent, out)?;
    let pr = &p["predicted"];
    if let (Some(l), Some(c)) = (pr["latency_s"].as_f64(), pr["cost_usd"].as_f64()) {
        writeln!(
            out,
            "{indent}predicted: latency {l:.3} s, cost {}, perf/$ {:.1}",
            usd(c),
            pr["perf_per_dollar"].as_f64().unwrap_or(0.0)
        )?;
    }
    // Where the models learned how instances spread: the plan's latency distribution.
    let q = &pr["latency_quantiles_s"];
    if let [Some(p50), Some(p90), Some(p95), Some(p99)] =
        ["p50", "p90", "p95", "p99"].map(|k| q[k].as_f64())
    {
        writeln!(
            out,
            "{indent}latency distribution: p50 {p50:.3} s, p90 {p90:.3} s, p95 {p95:.3} s, p99 {p99:.3} s"
        )?;
    }
    if p["exact"] == false {
        let why = serde_json::from_value::<sonic_core::planner::Stopped>(p["stopped"].clone())
            .map_or_else(
                |_| "a limit of the planning budget stopped the search".into(),
                |s| s.to_string(),
            );
        writeln!(out, "{indent}not exact: {why}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dags_show_their_triggers() {
        use sonic_api::control::DagSummary;
        let dag = |name: &str, triggers: &[&str]| DagSummary {
            warnings: Vec::new(),
            name: name.into(),
            description: String::new(),
            functions: vec!["f".into()],
            edges: 0,
            revision: 1,
            triggers: triggers.iter().map(|t| (*t).to_owned()).collect(),
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        let list = DagList {
            dags: vec![
                dag("plain", &[]),
                dag(
                    "watched",
                    &["schedule @every 5m", "object_created incoming/"],
                ),
            ],
        };
        let mut out = Vec::new();
        dags(&list, &mut out).expect("render");
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("TRIGGERS"), "{text}");
        let plain: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(plain, ["plain", "1", "f", "0", "-"], "{text}");
        assert!(
            lines[2].contains("schedule @every 5m; object_created incoming/"),
            "{text}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(12_300_000), "12.3 MB");
        assert_eq!(bytes(2_000_000_000), "2.0 GB");
    }

    #[test]
    fn models_show_the_setting_and_every_setting_learned() {
        use sonic_api::control::SettingModelsView;
        let params = |trees: u32| {
            serde_json::Map::from_iter([("trees".to_owned(), serde_json::json!(trees))])
        };
        let setting = |trees: u32, jobs: usize, converged: bool| SettingModelsView {
            setting: format!("{{\"trees\":{trees}}}"),
            label: format!("trees={trees}"),
            params: params(trees),
            converged,
            jobs,
            models: Vec::new(),
            mode: None,
        };
        let mut m = DagModelsView {
            dag: "ml".into(),
            setting: r#"{"trees":6}"#.into(),
            params: params(6),
            settings: vec![setting(6, 5, true)],
            converged: true,
            max_mape: 0.15,
            jobs: 5,
            models: Vec::new(),
            samples: Vec::new(),
            mode: None,
        };
        let text = |m: &DagModelsView| {
            let mut out = Vec::new();
            models(m, &mut out).expect("write");
            String::from_utf8(out).expect("utf8")
        };
        let one = text(&m);
        assert!(
            one.contains("setting: trees=6 (the DAG's default parameters"),
            "{one}"
        );
        assert!(!one.contains("settings learned"), "only one setting: {one}");
        m.settings.push(setting(12, 2, false));
        let two = text(&m);
        assert!(two.contains("settings learned:"), "{two}");
        let row = two.lines().find(|l| l.contains("trees=12")).expect("a row");
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["trees=12", "-", "no", "2", "-"],
            "{row}"
        );
    }

    /// A plan report with a latency distribution shows it under its prediction; one without
    /// shows none.
    #[test]
    fn a_plans_latency_distribution_is_shown_when_known() {
        let mut p = serde_json::json!({
            "stages": [], "edges": [], "exact": true,
            "predicted": { "latency_s": 1.5, "cost_usd": 0.001, "perf_per_dollar": 666.0 },
        });
        let text = |p: &serde_json::Value| {
            let mut out = Vec::new();
            plan(p, "", &mut out).expect("write");
            String::from_utf8(out).expect("utf8")
        };
        assert!(!text(&p).contains("latency distribution"));
        p["predicted"]["latency_quantiles_s"] =
            serde_json::json!({ "p50": 1.6, "p90": 2.0, "p95": 2.25, "p99": 3.0 });
        let shown = text(&p);
        assert!(
            shown.contains(
                "latency distribution: p50 1.600 s, p90 2.000 s, p95 2.250 s, p99 3.000 s"
            ),
            "{shown}"
        );
    }

    #[test]
    fn table_aligns() {
        let mut t = Table::new(&["A", "LONG HEADER", "C"]);
        t.row(vec!["wide cell".into(), "x".into(), "y".into()]);
        let mut out = Vec::new();
        t.write("", &mut out).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].find("LONG"), lines[1].find('x'));
        assert_eq!(lines[0].find('C'), lines[1].find('y'));
    }
}
