//! `ofctl plan` as a user runs it: JSON shape of interfaces.md §3, the table, exit statuses, and the
//! paper's qualitative findings on the fixtures in `tests/fixtures/plan/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/plan")
}

fn ofctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ofctl"))
        .args(args)
        .output()
        .expect("run ofctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plan_json(dag: &str, params: &str, catalog: Option<&str>, policy: &str) -> serde_json::Value {
    let f = fixtures();
    let (dag, params) = (f.join(dag), f.join(params));
    let mut args = vec![
        "plan",
        "--dag",
        dag.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
    ];
    let cat;
    if let Some(c) = catalog {
        cat = f.join(c);
        args.extend(["--catalog", cat.to_str().unwrap()]);
    }
    args.extend(["--policy", policy, "-o", "json"]);
    let (code, stdout, stderr) = ofctl(&args);
    assert_eq!(code, 0, "ofctl failed: {stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"))
}

fn method(plan: &serde_json::Value, from: &str, to: &str) -> String {
    plan["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .find(|e| e["from"] == from && e["to"] == to)
        .map(|e| e["method"].as_str().expect("method").to_owned())
        .unwrap_or_else(|| panic!("no edge {from} -> {to} in {plan}"))
}

#[test]
fn json_has_every_named_field() {
    let plan = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    assert_eq!(plan["dag"], "lightgbm");
    assert_eq!(plan["policy"], "sonic");
    for s in plan["stages"].as_array().expect("stages") {
        for k in ["function", "vm_type", "vms", "per_vm", "concurrent"] {
            assert!(!s[k].is_null(), "stage lacks {k}: {s}");
        }
    }
    for e in plan["edges"].as_array().expect("edges") {
        for k in ["from", "to", "method", "predicted_s"] {
            assert!(!e[k].is_null(), "edge lacks {k}: {e}");
        }
        assert!(
            ["vm-storage", "direct", "remote"].contains(&e["method"].as_str().expect("method"))
        );
    }
    for k in ["latency_s", "cost_usd", "perf_per_dollar"] {
        assert!(plan["predicted"][k].as_f64().expect(k) > 0.0);
    }
    assert!(plan.get("second_best").is_some());
    assert!(plan["planning_time_us"].is_u64());
    assert_eq!(plan["exact"], true, "planned within the default budget");
    assert!(plan["stopped"].is_null());
    let p = &plan["predicted"];
    let ppd = 1.0 / (p["latency_s"].as_f64().unwrap() * p["cost_usd"].as_f64().unwrap());
    assert!((ppd - p["perf_per_dollar"].as_f64().unwrap()).abs() / ppd < 1e-9);
}

#[test]
fn reproduces_the_papers_findings() {
    // Fanout 1: the trainer runs where the PCA output already is.
    let k1 = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k1.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    assert_eq!(method(&k1, "pca", "train"), "vm-storage");
    // The second-best plan avoids vm-storage on that edge.
    let second = &k1["second_best"];
    assert!(second.is_object(), "k1 has a second best");
    assert_ne!(method(second, "pca", "train"), "vm-storage");
    // Fanout 3, one trainer per VM: one copy VM to VM.
    let k3 = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    assert_eq!(method(&k3, "pca", "train"), "direct");
    // Fanout 12 on a 750 Mbit/s VM type: the sender's NIC is the bottleneck, so through S3.
    let k12 = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k12.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    assert_eq!(method(&k12, "pca", "train"), "remote");
}

#[test]
fn baseline_policies_use_their_methods() {
    for (policy, expect) in [
        ("remote", "remote"),
        ("direct", "direct"),
        ("local", "vm-storage"),
    ] {
        let plan = plan_json(
            "lightgbm.dag.yaml",
            "lightgbm-k3.params.yaml",
            Some("catalog-750.yaml"),
            policy,
        );
        assert_eq!(plan["policy"], policy);
        for e in plan["edges"].as_array().expect("edges") {
            assert_eq!(e["method"], expect, "{policy}: {e}");
        }
    }
}

#[test]
fn the_table_explains_the_choice() {
    let f = fixtures();
    let (code, stdout, _) = ofctl(&[
        "plan",
        "--dag",
        f.join("lightgbm.dag.yaml").to_str().unwrap(),
        "--params",
        f.join("lightgbm-k3.params.yaml").to_str().unwrap(),
        "--catalog",
        f.join("catalog-750.yaml").to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    for needle in [
        "us  exact\n",
        "BEST PLAN",
        "pca -> train",
        "direct",
        "WHY",
        "remote would give",
    ] {
        assert!(stdout.contains(needle), "table lacks {needle:?}:\n{stdout}");
    }
}

#[test]
fn refusals_exit_1_with_one_line_and_usage_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad_dag = dir.path().join("bad.yaml");
    std::fs::write(&bad_dag, "name: t\nfunctions: []\n").expect("write");
    let params = fixtures().join("lightgbm-k3.params.yaml");
    let (code, stdout, stderr) = ofctl(&[
        "plan",
        "--dag",
        bad_dag.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("bad.yaml:2:") && stderr.contains("functions"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // A function whose memory fits no VM type.
    let dag = fixtures().join("lightgbm.dag.yaml");
    let huge = dir.path().join("huge.yaml");
    let text = std::fs::read_to_string(&params)
        .expect("params")
        .replace("memory_mb: 5000", "memory_mb: 900000");
    std::fs::write(&huge, text).expect("write");
    let (code, stdout, stderr) = ofctl(&[
        "plan",
        "--dag",
        dag.to_str().unwrap(),
        "--params",
        huge.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains("train") && stderr.contains("900000"),
        "{stderr}"
    );

    // A latency bound no plan meets: the error says what is achievable.
    let bounded = dir.path().join("bounded.yaml");
    let text = std::fs::read_to_string(&dag).expect("dag") + "bounds: { max_latency: 5s }\n";
    std::fs::write(&bounded, text).expect("write");
    let (code, _, stderr) = ofctl(&[
        "plan",
        "--dag",
        bounded.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("latency bound"), "{stderr}");

    let (code, _, _) = ofctl(&[
        "plan",
        "--dag",
        dag.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
        "--policy",
        "fastest",
    ]);
    assert_eq!(code, 1);
    let (code, _, _) = ofctl(&["plan", "--nonsense"]);
    assert_eq!(code, 2);
}

/// The fanout at which `pca -> train` first goes through the store, for one catalog.
fn crossover(catalog: &str) -> u32 {
    let dir = tempfile::tempdir().expect("tempdir");
    let template =
        std::fs::read_to_string(fixtures().join("lightgbm-k3.params.yaml")).expect("params");
    for k in 1..=32u32 {
        let params = dir.path().join(format!("k{k}.yaml"));
        let text = template
            .replace("instances: 3 }", &format!("instances: {k} }}"))
            .replace("bytes: 30MB", &format!("bytes: {}MB", 10 * k));
        std::fs::write(&params, text).expect("write");
        let plan = plan_json(
            "lightgbm.dag.yaml",
            params.to_str().unwrap(),
            Some(catalog),
            "sonic",
        );
        if method(&plan, "pca", "train") == "remote" {
            return k;
        }
    }
    panic!("no crossover up to 32 on {catalog}");
}

#[test]
fn the_crossover_moves_up_on_a_faster_network() {
    let slow = crossover("catalog-750.yaml");
    let fast = crossover("catalog-fast.yaml");
    assert!(slow > 3 && slow <= 12, "crossover on 750 Mbit/s at {slow}");
    assert!(
        fast > slow,
        "crossover {fast} on the fast VM type is not above {slow}"
    );
}

/// Times given as distributions (interfaces.md §6) give the plan's latency distribution under
/// `predicted.latency_quantiles_s`, above the mean where the trainers' tail is long; means only
/// give none. A distribution that is none (quantiles that go down) is refused, naming it.
#[test]
fn distributions_give_the_plans_latency_quantiles() {
    let skewed = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3-skewed.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    let p = &skewed["predicted"];
    let q = &p["latency_quantiles_s"];
    let at = |k: &str| q[k].as_f64().unwrap_or_else(|| panic!("{k} in {p}"));
    assert!(
        at("p50") < at("p90") && at("p90") <= at("p95") && at("p95") <= at("p99"),
        "{q}"
    );
    // Three trainers at once: the job waits for the slowest, so its median is past the mean.
    let mean = p["latency_s"].as_f64().expect("latency_s");
    assert!(at("p95") > mean * 1.2, "p95 {} vs mean {mean}", at("p95"));
    let plain = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3.params.yaml",
        Some("catalog-750.yaml"),
        "sonic",
    );
    assert!(
        plain["predicted"].get("latency_quantiles_s").is_none(),
        "{plain}"
    );
    // The table says it too.
    let f = fixtures();
    let (dag, params, catalog) = (
        f.join("lightgbm.dag.yaml"),
        f.join("lightgbm-k3-skewed.params.yaml"),
        f.join("catalog-750.yaml"),
    );
    let (code, stdout, stderr) = ofctl(&[
        "plan",
        "--dag",
        dag.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
        "--catalog",
        catalog.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("latency distribution: p50"), "{stdout}");
    // Quantiles that go down are refused.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.params.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&params)
            .unwrap()
            .replace("p50: 55.0, p95: 95.0", "p50: 95.0, p95: 55.0"),
    )
    .unwrap();
    let (code, _, stderr) = ofctl(&[
        "plan",
        "--dag",
        dag.to_str().unwrap(),
        "--params",
        bad.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("cold_s") && stderr.contains("quantiles must not decrease"),
        "{stderr}"
    );
}

/// `--slo p95=...` (interfaces.md §6) on the skewed fixture: the cheapest plan whose predicted
/// p95 meets it, never dearer than the mean planner's where that one meets it too; below the
/// lowest reachable p95 a refusal (exit 1) naming it, or with `--slo-best-effort` that plan;
/// a malformed objective refused by the command line.
#[test]
fn a_percentile_slo_gets_the_cheapest_plan_meeting_it_or_a_refusal_naming_the_best() {
    let f = fixtures();
    let (dag, params, catalog) = (
        f.join("lightgbm.dag.yaml"),
        f.join("lightgbm-k3-skewed.params.yaml"),
        f.join("catalog-750.yaml"),
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--dag",
            dag.to_str().unwrap(),
            "--params",
            params.to_str().unwrap(),
            "--catalog",
            catalog.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ofctl(&args)
    };
    let json = |out: (i32, String, String)| -> serde_json::Value {
        assert_eq!(out.0, 0, "{}", out.2);
        serde_json::from_str(&out.1).expect("one JSON document")
    };
    // Out of reach: the refusal names the lowest p95 there is.
    let (code, _, stderr) = run(&["--slo", "p95=1s"]);
    assert_eq!(code, 1, "{stderr}");
    let best: f64 = stderr
        .split("the lowest p95 latency reachable is ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no reachable p95 in: {stderr}"));
    assert!(best > 1.0);
    // Best effort runs that plan, and says the objective is not met.
    let effort = json(run(&["--slo", "p95=1s", "--slo-best-effort", "-o", "json"]));
    let v = &effort["slo"];
    assert_eq!(v["met"], false, "{effort}");
    assert!(
        (v["predicted_s"].as_f64().unwrap() - best).abs() < 1e-3,
        "{v}"
    );
    // Within reach: met, at the least cost.
    let target = best * 1.1;
    let slo = format!("p95={target}s");
    let sonic = json(run(&["--slo", &slo, "-o", "json"]));
    let v = &sonic["slo"];
    assert_eq!(v["met"], true, "{sonic}");
    assert_eq!(v["percentile"], 95.0);
    let p95 = v["predicted_s"].as_f64().unwrap();
    assert!(p95 <= target, "{v}");
    assert_eq!(
        sonic["predicted"]["latency_quantiles_s"]["p95"].as_f64(),
        Some(p95)
    );
    let mean = json(run(&[
        "--slo",
        &slo,
        "--policy",
        "sonic-mean",
        "-o",
        "json",
    ]));
    assert_eq!(mean["policy"], "sonic-mean");
    assert!(mean["predicted"]["latency_s"].as_f64().unwrap() <= target);
    if mean["slo"]["met"] == true {
        assert!(
            sonic["predicted"]["cost_usd"].as_f64().unwrap()
                <= mean["predicted"]["cost_usd"].as_f64().unwrap() * (1.0 + 1e-9),
            "sonic {sonic} against sonic-mean {mean}"
        );
    }
    // The table says where the plan stands.
    let (code, stdout, stderr) = run(&["--slo", &slo]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("SLO p95 <= ") && stdout.contains(" s, met"),
        "{stdout}"
    );
    // A malformed objective never reaches the planner.
    let (code, _, stderr) = run(&["--slo", "p95"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("p<percentile>=<duration>"), "{stderr}");
}

/// Right-sizing: the same trainers, single-threaded or 90% parallel (`parallel` in the
/// parameters file): the first share a VM's vCPUs, the second get several each, and run faster
/// for it.
#[test]
fn a_parallel_function_is_given_more_cores() {
    let train = |plan: &serde_json::Value| {
        plan["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .find(|s| s["function"] == "train")
            .cloned()
            .expect("train")
    };
    let serial = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3-small.params.yaml",
        None,
        "sonic",
    );
    let parallel = plan_json(
        "lightgbm.dag.yaml",
        "lightgbm-k3-parallel.params.yaml",
        None,
        "sonic",
    );
    let cores = |p: &serde_json::Value| train(p)["cores"].as_f64().expect("cores");
    // Single-threaded, the trainers share one VM (3 at once: its vCPUs over 3); parallel,
    // each has at least two.
    assert!(cores(&serial) < 2.0, "{serial}");
    assert!(cores(&parallel) >= 2.0, "{parallel}");
    let latency = |p: &serde_json::Value| p["predicted"]["latency_s"].as_f64().expect("latency");
    assert!(latency(&parallel) < latency(&serial), "{parallel} {serial}");
    // The table says it.
    let f = fixtures();
    let (code, out, err) = ofctl(&[
        "plan",
        "--dag",
        f.join("lightgbm.dag.yaml").to_str().unwrap(),
        "--params",
        f.join("lightgbm-k3-parallel.params.yaml").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("CPUS"), "{out}");
    // A share outside 0..1 is refused, naming the field.
    let bad = std::env::temp_dir().join(format!("sonic-bad-parallel-{}.yaml", std::process::id()));
    std::fs::write(
        &bad,
        "functions:\n  pca: { memory_mb: 3000, cold_s: 10, hot_s: 9, instances: 1, parallel: 2 }\n",
    )
    .unwrap();
    let (code, _, err) = ofctl(&[
        "plan",
        "--dag",
        f.join("lightgbm.dag.yaml").to_str().unwrap(),
        "--params",
        bad.to_str().unwrap(),
    ]);
    std::fs::remove_file(&bad).ok();
    assert_ne!(code, 0);
    assert!(err.contains("parallel"), "{err}");
}
