//! The DAG parser on good and bad files: every refusal names the file, the place and the field.

use sonic_core::dag::{Dag, EdgeKind, Fanout, Instances};

const GOOD: &str = r#"
name: ml-pipeline
description: PCA, parallel tree training, combine
params:
  trees: 6
functions:
  - name: pca
    image: sonic-lambdas:latest
    command: [ml-pipeline, pca]
    timeout: 300s
  - name: train
    image: sonic-lambdas:latest
    command: [ml-pipeline, train]
    instances: "{{ params.trees }}"
  - name: combine
    image: sonic-lambdas:latest
    command: [ml-pipeline, combine]
edges:
  - { from: pca, to: train, kind: broadcast }
  - { from: train, to: combine, kind: gather }
bounds:
  max_latency: 120s
  max_cost_usd: 0.05
"#;

#[test]
fn parses_the_interfaces_example() {
    let dag = Dag::from_yaml("ml.yaml", GOOD).expect("valid");
    assert_eq!(dag.name, "ml-pipeline");
    let names: Vec<&str> = dag.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["pca", "train", "combine"]);
    assert_eq!(dag.functions[0].timeout_s, 300.0);
    assert_eq!(dag.functions[1].instances, Instances::Param("trees".into()));
    assert_eq!(dag.edges[0].kind, EdgeKind::Broadcast);
    assert_eq!(dag.bounds.max_latency_s, Some(120.0));
    assert_eq!(dag.bounds.max_cost_usd, Some(0.05));
    let f = dag.fanouts(&dag.params).expect("fanouts");
    assert_eq!(f, [Fanout::Known(1), Fanout::Known(6), Fanout::Known(1)]);
    let over = dag.job_params(&[("trees".to_owned(), serde_json::json!(12))].into());
    assert_eq!(dag.fanouts(&over).expect("fanouts")[1], Fanout::Known(12));
    let bad = dag.job_params(&[("trees".to_owned(), serde_json::json!("many"))].into());
    assert!(dag.fanouts(&bad).is_err());
}

#[test]
fn orders_functions_topologically() {
    let yaml = r#"
name: rev
functions:
  - { name: c, image: i, command: [x] }
  - { name: b, image: i, command: [x] }
  - { name: a, image: i, command: [x] }
edges:
  - { from: b, to: c, kind: one }
  - { from: a, to: b, kind: one }
"#;
    let dag = Dag::from_yaml("rev.yaml", yaml).expect("valid");
    let names: Vec<&str> = dag.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(dag.edges.iter().all(|e| e.from < e.to));
    assert_eq!(dag.sinks(), [2]);
}

#[test]
fn scatter_receivers_follow_the_parts() {
    let yaml = r#"
name: video
functions:
  - { name: split, image: i, command: [x] }
  - { name: classify, image: i, command: [x] }
  - { name: collect, image: i, command: [x] }
edges:
  - { from: split, to: classify, kind: scatter }
  - { from: classify, to: collect, kind: gather }
"#;
    let dag = Dag::from_yaml("v.yaml", yaml).expect("valid");
    let f = dag.fanouts(&dag.params).expect("fanouts");
    assert_eq!(f, [Fanout::Known(1), Fanout::Scattered, Fanout::Known(1)]);
}

/// Parses `body` (functions a, b, c are declared when `body` has no `functions:`) and expects a
/// refusal whose text contains every fragment in `expect`.
fn check(body: &str, expect: &[&str]) {
    let text = if body.contains("functions:") {
        format!("name: t\n{body}")
    } else {
        format!(
            "name: t\nfunctions:\n  - {{ name: a, image: i, command: [x] }}\n  - {{ name: b, image: i, command: [x], instances: 3 }}\n  - {{ name: c, image: i, command: [x] }}\n{body}"
        )
    };
    let err = Dag::from_yaml("bad.yaml", &text).expect_err(&format!("should refuse:\n{text}"));
    let shown = err.to_string();
    assert!(shown.starts_with("bad.yaml"), "{shown}");
    for frag in expect {
        assert!(
            shown.contains(frag),
            "expected {frag:?} in {shown:?}\nfor\n{text}"
        );
    }
}

#[test]
fn refuses_bad_files_with_place_and_field() {
    check("colour: red\n", &["colour"]);
    check(
        "functions:\n  - { name: a, image: i, command: [x], memory: 3GB }\n",
        &["memory"],
    );
    check("functions:\n  - { name: a, command: [x] }\n", &["image"]);
    check(
        "functions: []\n",
        &[":2:", "functions", "at least one function"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x] }\n  - { name: a, image: i, command: [y] }\n",
        &[":4:", "functions[1].name", "duplicate function \"a\""],
    );
    check(
        "edges:\n  - { from: a, to: b, kind: one }\n  - { from: b, to: a, kind: one }\n",
        &["edges[", "cycle"],
    );
    check(
        "edges:\n  - { from: a, to: zz, kind: one }\n",
        &[":7:", "edges[0].to", "unknown function \"zz\""],
    );
    check(
        "edges:\n  - { from: a, to: b, kind: teleport }\n",
        &["edges[0].kind", "not an edge kind"],
    );
    check(
        "edges:\n  - { from: a, to: a, kind: one }\n",
        &["edges[0]", "itself"],
    );
    check(
        "edges:\n  - { from: a, to: b, kind: one }\n  - { from: a, to: b, kind: one }\n",
        &["edges[1]", "duplicate edge"],
    );
    // gather into a function with several instances
    check(
        "edges:\n  - { from: a, to: b, kind: gather }\n",
        &["edges[0]", "gather", "3 instances"],
    );
    // broadcast from a sender with several instances
    check(
        "edges:\n  - { from: b, to: c, kind: broadcast }\n",
        &["edges[0]", "one instance"],
    );
    // one edge between different fanouts
    check(
        "functions:\n  - { name: a, image: i, command: [x], instances: 2 }\n  - { name: b, image: i, command: [x], instances: 3 }\nedges:\n  - { from: a, to: b, kind: one }\n",
        &["edges[0]", "sender's fanout"],
    );
    // shuffle receiver without a fanout
    check(
        "edges:\n  - { from: b, to: c, kind: shuffle }\n",
        &["instances must be given"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x], timeout: soon }\n",
        &[":3:", "functions[0].timeout", "not a duration"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x], timeout: -5s }\n",
        &["timeout"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x], instances: 0 }\n",
        &["functions[0].instances"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x], instances: 1.5 }\n",
        &["functions[0].instances"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [x], instances: \"{{ params.k }}\" }\n",
        &["functions[0].instances", "not declared"],
    );
    check(
        "functions:\n  - { name: A/b, image: i, command: [x] }\n",
        &["functions[0].name", "not a valid function name"],
    );
    check(
        "functions:\n  - { name: result, image: i, command: [x] }\n",
        &["reserved"],
    );
    check(
        "functions:\n  - { name: a, image: \"\", command: [x] }\n",
        &["functions[0].image"],
    );
    check(
        "functions:\n  - { name: a, image: i, command: [] }\n",
        &["functions[0].command"],
    );
    check("bounds: { max_latency: 0s }\n", &["bounds.max_latency"]);
    check("bounds: { max_cost_usd: -1 }\n", &["bounds.max_cost_usd"]);
    check("functions: [\n", &["bad.yaml"]);
    check(
        "params: { trees: 6 }\nwork_params: [trees, seed]\n",
        &[
            ":7:22:",
            "work_params[1]",
            "parameter \"seed\" is not declared under params",
        ],
    );
    check(
        "params: { trees: 6 }\nwork_params: [trees, trees]\n",
        &["work_params[1]", "duplicate parameter \"trees\""],
    );
    check(
        "params: { trees: 6 }\nwork_params: trees\n",
        &["work_params"],
    );
}

#[test]
fn work_params_are_kept_sorted_and_absent_means_every_parameter() {
    let dag = Dag::from_yaml(
        "w.yaml",
        "name: w\nparams: { trees: 6, seed: 1, depth: 3 }\nwork_params: [trees, depth]\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("work_params");
    assert_eq!(
        dag.work_params,
        Some(vec!["depth".to_owned(), "trees".to_owned()])
    );
    let all = Dag::from_yaml("a.yaml", GOOD).expect("good");
    assert_eq!(all.work_params, None);
    // A DAG stored before the field existed decodes with every parameter a work parameter.
    let mut stored = serde_json::to_value(&all).expect("json");
    assert!(stored.get("work_params").is_none(), "{stored}");
    stored
        .as_object_mut()
        .expect("object")
        .remove("work_params");
    let back: Dag = serde_json::from_value(stored).expect("decodes");
    assert_eq!(back, all);
}

#[test]
fn a_function_runs_a_handler_or_an_executable() {
    let dag = Dag::from_yaml(
        "h.yaml",
        "name: h\nfunctions:\n  - { name: a, handler: my_lambda.v2 }\n  - { name: b, image: i, command: [x] }\nedges:\n  - { from: a, to: b, kind: one }\n",
    )
    .expect("a handler and an executable");
    assert_eq!(dag.functions[0].handler.as_deref(), Some("my_lambda.v2"));
    assert!(dag.functions[0].image.is_empty() && dag.functions[0].command.is_empty());
    assert_eq!(dag.functions[1].handler, None);
    // The stored form of an executable does not change (its warm-container identity hashes it).
    let json = serde_json::to_value(&dag.functions[1]).expect("json");
    assert!(json.get("handler").is_none(), "{json}");
    let back: Dag =
        serde_json::from_value(serde_json::to_value(&dag).expect("json")).expect("back");
    assert_eq!(back, dag);

    check(
        "functions:\n  - { name: a, handler: h, image: i, command: [x] }\n",
        &[":3:", "functions[0].handler", "not both"],
    );
    check(
        "functions:\n  - { name: a, handler: h, command: [x] }\n",
        &["functions[0].handler", "not both"],
    );
    check(
        "functions:\n  - { name: a }\n",
        &["functions[0].image", "missing field `image`", "handler"],
    );
    check(
        "functions:\n  - { name: a, image: i }\n",
        &["functions[0].command", "missing field `command`"],
    );
    for bad in ["../x", ".hidden", "a b", "\"\""] {
        check(
            &format!("functions:\n  - {{ name: a, handler: {bad} }}\n"),
            &["functions[0].handler", "not a lambda name"],
        );
    }
    check(
        "functions:\n  - { name: a, handler: [h] }\n",
        &["functions[0].handler"],
    );
}

#[test]
fn refuses_a_bad_dag_name() {
    let err = Dag::from_yaml(
        "n.yaml",
        "name: My_DAG\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect_err("bad name");
    assert_eq!(err.line, Some(1));
    assert_eq!(err.field, "name");
    let err = Dag::from_yaml("n.yaml", "").expect_err("empty file");
    assert!(err.to_string().starts_with("n.yaml"), "{err}");
}

#[test]
#[ignore = "prints messages for a person to read"]
fn show_messages() {
    for body in [
        "name: t\ncolour: red\nfunctions: []\n",
        "name: t\nfunctions:\n  - { name: a, command: [x] }\n",
        "name: t\nfunctions: [\n",
        "name: t\nfunctions:\n  - { name: a, image: i, command: [x], memory: 3GB }\n",
        "name: t\nfunctions:\n  - { name: a, image: i, command: x }\n",
    ] {
        println!("{}", Dag::from_yaml("f.yaml", body).expect_err("bad"));
    }
}

#[test]
fn image_references_follow_docker_grammar() {
    use sonic_core::dag::valid_image;
    for ok in [
        "i",
        "sonic-lambdas:latest",
        "library/ubuntu:22.04",
        "ghcr.io/org/sub/repo:v1.2.3-rc_1",
        "localhost:5000/sonic-lambdas",
        "registry.example.com:443/a__b/c.d:Tag_9",
        "MyRegistry/app",
        "python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "python:3.12@sha256:0123456789abcdef0123456789abcdef",
    ] {
        assert!(valid_image(ok), "{ok}");
    }
    for bad in [
        "",
        "Sonic/Lambdas",
        "../../etc/passwd",
        "--privileged",
        "img:-tag",
        "img:",
        "a//b",
        "a/",
        "sonic lambdas",
        "img\u{1b}[31m",
        "img@sha256:short",
        "img@@sha256:0123456789abcdef0123456789abcdef",
        "ex-ample.com:99999999/x",
        "café",
    ] {
        assert!(!valid_image(bad), "{bad}");
    }
    assert!(!valid_image(&"x".repeat(600)));
}

/// A function's `retries:` (interfaces.md §7): what it gives is kept, what it leaves out is the
/// control plane's default (`None`), and a function without it stores as before (its
/// warm-container identity hashes it). Bad values are refused at their place.
#[test]
fn a_functions_retries_are_read_and_checked() {
    use sonic_core::dag::{Retries, RetryOn};
    let dag = Dag::from_yaml(
        "r.yaml",
        "name: r\nfunctions:\n  - name: train\n    image: i\n    command: [x]\n    retries: { limit: 4, backoff: 500ms, on: [error, timeout, oom, lost] }\n  - { name: b, image: i, command: [x], retries: { on: [timeout] } }\n  - { name: c, image: i, command: [x], retries: { limit: 0, backoff: 0 } }\n  - { name: d, image: i, command: [x] }\n",
    )
    .expect("retries");
    assert_eq!(
        dag.functions[0].retries,
        Some(Retries {
            limit: Some(4),
            backoff_s: Some(0.5),
            on: Some(RetryOn::ALL.to_vec()),
        })
    );
    assert_eq!(
        dag.functions[1].retries,
        Some(Retries {
            on: Some(vec![RetryOn::Timeout]),
            ..Retries::default()
        })
    );
    assert_eq!(
        dag.functions[2].retries,
        Some(Retries {
            limit: Some(0),
            backoff_s: Some(0.0),
            on: None,
        })
    );
    assert_eq!(dag.functions[3].retries, None);
    let json = serde_json::to_value(&dag.functions[3]).expect("json");
    assert!(json.get("retries").is_none(), "{json}");
    let back: Dag =
        serde_json::from_value(serde_json::to_value(&dag).expect("json")).expect("back");
    assert_eq!(back, dag);

    let f =
        |r: &str| format!("functions:\n  - {{ name: a, image: i, command: [x], retries: {r} }}\n");
    check(
        &f("{ limit: -1 }"),
        &[":3:", "functions[0].retries.limit", "from 0 to 100"],
    );
    check(&f("{ limit: 101 }"), &["functions[0].retries.limit"]);
    check(&f("{ limit: two }"), &["functions[0].retries.limit"]);
    check(
        &f("{ backoff: soon }"),
        &["functions[0].retries.backoff", "not a duration"],
    );
    check(&f("{ backoff: 2h }"), &["functions[0].retries.backoff"]);
    check(
        &f("{ on: [crash] }"),
        &[
            "functions[0].retries.on",
            "\"crash\"",
            "error, timeout, oom, lost",
        ],
    );
    check(
        &f("{ on: [oom, oom] }"),
        &["functions[0].retries.on", "twice"],
    );
    check(&f("{ tries: 3 }"), &["tries"]);
}

/// A DAG's `deadline:` (interfaces.md §7): a duration up to a week, kept in seconds; absent, no
/// deadline and the stored form unchanged; anything else refused at its place.
#[test]
fn a_dags_deadline_is_read_and_checked() {
    let with = |d: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!(
                "name: d\ndeadline: {d}\nfunctions:\n  - {{ name: a, image: i, command: [x] }}\n"
            ),
        )
    };
    assert_eq!(with("10m").expect("10m").deadline_s, Some(600.0));
    assert_eq!(with("90").expect("90").deadline_s, Some(90.0));
    let none = Dag::from_yaml(
        "d.yaml",
        "name: d\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("no deadline");
    assert_eq!(none.deadline_s, None);
    let json = serde_json::to_value(&none).expect("json");
    assert!(json.get("deadline_s").is_none(), "{json}");
    for bad in ["soon", "0", "-5s", "200h", "[1]"] {
        let err = with(bad).expect_err(bad).to_string();
        assert!(err.contains("deadline"), "{bad}: {err}");
    }
}

/// A DAG's `triggers:` (interfaces.md §7): schedules (cron with or without seconds, nicknames,
/// `@every`), kept in the stored form; absent, none and the stored form unchanged; a bad one
/// refused at its place.
#[test]
fn a_dags_triggers_are_read_and_checked() {
    let with = |t: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!(
                "name: d\ntriggers:\n{t}\nfunctions:\n  - {{ name: a, image: i, command: [x] }}\n"
            ),
        )
    };
    let dag = with(
        "  - { schedule: \"*/30 * * * * *\" }\n  - schedule: \"@every 1h\"\n  - { object_created: { prefix: incoming/ } }",
    )
    .expect("three");
    let texts: Vec<String> = dag
        .triggers
        .iter()
        .map(|t| match t {
            sonic_core::dag::Trigger::Schedule(s) => s.to_string(),
            sonic_core::dag::Trigger::ObjectCreated { prefix } => format!("new under {prefix}"),
        })
        .collect();
    assert_eq!(
        texts,
        ["*/30 * * * * *", "@every 1h", "new under incoming/"]
    );
    let json = serde_json::to_value(&dag).expect("json");
    assert_eq!(json["triggers"][0]["schedule"], "*/30 * * * * *", "{json}");
    assert_eq!(
        json["triggers"][2]["object_created"]["prefix"], "incoming/",
        "{json}"
    );
    let back: Dag = serde_json::from_value(json).expect("back");
    assert_eq!(back, dag);
    let none = Dag::from_yaml(
        "d.yaml",
        "name: d\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("none");
    assert!(none.triggers.is_empty());
    let json = serde_json::to_value(&none).expect("json");
    assert!(json.get("triggers").is_none(), "{json}");
    for (bad, field) in [
        (
            "  - { schedule: \"every morning\" }",
            "triggers[0].schedule",
        ),
        (
            "  - { schedule: \"@every 1h\" }\n  - { schedule: \"\" }",
            "triggers[1].schedule",
        ),
        (
            "  - { object_created: { prefix: jobs/x } }",
            "triggers[0].object_created.prefix",
        ),
        (
            "  - { object_created: { prefix: jo } }",
            "triggers[0].object_created.prefix",
        ),
        (
            "  - { object_created: { prefix: \"\" } }",
            "triggers[0].object_created.prefix",
        ),
        (
            "  - { object_created: { prefix: /in } }",
            "triggers[0].object_created.prefix",
        ),
        ("  - { object_created: { suffix: .csv } }", "suffix"),
        ("  - { at: noon }", "at"),
        ("  - {}", "triggers[0]"),
    ] {
        let err = with(bad).expect_err(bad).to_string();
        assert!(err.contains(field), "{bad}: {err}");
    }
}

/// A function's `env:` (interfaces.md §7): scalars kept as strings; names a shell takes, never
/// the ABI's `SONIC_*`; absent, none and the stored form unchanged.
#[test]
fn a_functions_env_is_read_and_checked() {
    let with = |env: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!(
                "name: d\nfunctions:\n  - {{ name: a, image: i, command: [x], env: {env} }}\n"
            ),
        )
    };
    let dag = with("{ MODE: fast, N: 3, ON: true, _x: \"a b\" }").expect("env");
    let env: Vec<(&str, &str)> = dag.functions[0]
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        env,
        [("MODE", "fast"), ("N", "3"), ("ON", "true"), ("_x", "a b")]
    );
    let none = Dag::from_yaml(
        "d.yaml",
        "name: d\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("none");
    let json = serde_json::to_value(&none).expect("json");
    assert!(json["functions"][0].get("env").is_none(), "{json}");
    for bad in [
        "{ 1X: a }",
        "{ SONIC_INPUT_DIR: a }",
        "{ A-B: a }",
        "{ A: [1] }",
        "{ LD_PRELOAD: /tmp/x.so }",
        "{ PATH: /tmp }",
        "{ TMPDIR: /srv }",
        "{ A: { secret: .hidden } }",
        "{ A: { secret: a/b } }",
        "{ A: { secret: x, other: y } }",
        "{ SONIC_X: { secret: ok } }",
    ] {
        let err = with(bad).expect_err(bad).to_string();
        assert!(err.contains("functions[0].env"), "{bad}: {err}");
    }
    // A secret is named, never valued, in the DAG: apart from the plain variables.
    let dag = with("{ MODE: fast, DB_PASS: { secret: db-pass.v2 } }").expect("secret");
    let f = &dag.functions[0];
    assert_eq!(f.env.len(), 1);
    assert_eq!(
        f.secrets.get("DB_PASS").map(String::as_str),
        Some("db-pass.v2")
    );
    let json = serde_json::to_value(&dag).expect("json");
    assert_eq!(
        json["functions"][0]["secrets"]["DB_PASS"], "db-pass.v2",
        "{json}"
    );
    assert!(
        json["functions"][0]["env"].get("DB_PASS").is_none(),
        "{json}"
    );
}

/// A DAG's `slo:` (interfaces.md §6): a latency at a percentile (95 unless given); absent, none
/// and the stored form unchanged; a bad one refused naming its field.
#[test]
fn a_dags_slo_is_read_and_checked() {
    let with = |slo: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!(
                "name: d\nslo: {slo}\nfunctions:\n  - {{ name: a, image: i, command: [x] }}\n"
            ),
        )
    };
    let slo = with("{ latency: 20s }")
        .expect("p95 by default")
        .slo
        .expect("slo");
    assert_eq!((slo.percentile, slo.latency_s), (95.0, 20.0));
    let slo = with("{ percentile: 99.9, latency: 1500ms }")
        .expect("p99.9")
        .slo
        .expect("slo");
    assert_eq!((slo.percentile, slo.latency_s), (99.9, 1.5));
    let slo = with("{ percentile: 50, latency: 3 }")
        .expect("bare seconds")
        .slo
        .expect("slo");
    assert_eq!((slo.percentile, slo.latency_s), (50.0, 3.0));
    let none = Dag::from_yaml(
        "d.yaml",
        "name: d\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("no slo");
    assert_eq!(none.slo, None);
    let json = serde_json::to_value(&none).expect("json");
    assert!(json.get("slo").is_none(), "{json}");
    for (bad, field) in [
        ("{ latency: soon }", "slo.latency"),
        ("{ latency: 0s }", "slo.latency"),
        ("{ percentile: 40, latency: 1s }", "slo.percentile"),
        ("{ percentile: 100, latency: 1s }", "slo.percentile"),
        ("{ percentile: high, latency: 1s }", "slo.percentile"),
        ("{ percentile: 95 }", "latency"),
        ("{ latency: 1s, p: 9 }", "p"),
        ("{ latency: 1s, best_effort: maybe }", "best_effort"),
        ("20s", "slo"),
    ] {
        let err = with(bad).expect_err(bad).to_string();
        assert!(err.contains(field), "{bad}: {err}");
    }
}

/// A shuffle's files are K_s x K_r: past `MAX_SHUFFLE_FILES` the job's parameters are refused,
/// naming the edge, before anything runs.
#[test]
fn a_shuffle_of_too_many_files_is_refused() {
    let dag = Dag::from_yaml(
        "sort.yaml",
        "name: sort\nparams: { mappers: 4, reducers: 4 }\nfunctions:\n  - { name: map, image: img, command: [run], instances: \"{{ params.mappers }}\" }\n  - { name: reduce, image: img, command: [run], instances: \"{{ params.reducers }}\" }\nedges:\n  - { from: map, to: reduce, kind: shuffle }\n",
    )
    .expect("valid");
    let with = |m: u32, r: u32| {
        dag.fanouts(
            &dag.job_params(
                &[
                    ("mappers".to_owned(), serde_json::json!(m)),
                    ("reducers".to_owned(), serde_json::json!(r)),
                ]
                .into(),
            ),
        )
    };
    assert!(with(1000, 1000).is_ok(), "exactly the limit");
    let err = with(1000, 1001).expect_err("over");
    assert!(
        err.contains("map -> reduce") && err.contains("1001000 files") && err.contains("1000000"),
        "{err}"
    );
    assert!(
        with(100_000, 1).is_ok(),
        "a gather-like shuffle of one receiver"
    );
}

/// A job's parameter override a letter or two from a declared parameter is taken for a typo
/// and refused, naming it and the list; other undeclared keys are the lambdas' knobs.
#[test]
fn a_jobs_mistyped_parameter_is_refused_naming_the_one_meant() {
    let sort = Dag::from_yaml(
        "s.yaml",
        "name: sort\nparams: { mappers: 4, reducers: 4, n: 1 }\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect("sort");
    let with = |k: &str| -> std::collections::BTreeMap<String, serde_json::Value> {
        [(k.to_owned(), serde_json::json!(3))].into()
    };
    assert_eq!(sort.check_overrides(&with("mappers")), Ok(()));
    assert_eq!(sort.check_overrides(&Default::default()), Ok(()));
    let err = sort.check_overrides(&with("mapers")).expect_err("a typo");
    assert_eq!(
        err,
        "parameter \"mapers\" is not one of DAG sort's (did you mean \"mappers\"?): it declares mappers, n, reducers"
    );
    assert!(sort.check_overrides(&with("reducer")).is_err());
    // The lambdas' own knobs, and a short name near a shorter one: accepted.
    for knob in ["compute_ms", "a.sleep_ms", "m", "colour"] {
        assert_eq!(sort.check_overrides(&with(knob)), Ok(()), "{knob}");
    }
}

/// `on_failure:` (interfaces.md §7) names a function that leaves the DAG's functions: no edge
/// may name it, it has one instance, and something else must run; a name not declared, refused.
#[test]
fn a_dags_on_failure_function_is_set_apart_and_checked() {
    let with = |extra: &str, edges: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!(
                "name: d\non_failure: notify\nfunctions:\n  - {{ name: a, image: i, command: [x] }}\n  - {{ name: b, image: i, command: [y] }}\n  - {{ name: notify, image: i, command: [n]{extra} }}\nedges:\n  - {{ from: a, to: b, kind: one }}\n{edges}"
            ),
        )
    };
    let dag = with("", "").expect("good");
    let names: Vec<&str> = dag.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["a", "b"],
        "the on_failure function is not one of the DAG's"
    );
    assert_eq!(dag.edges.len(), 1);
    assert_eq!(dag.edges[0].from, 0);
    assert_eq!(dag.edges[0].to, 1);
    let f = dag.on_failure.as_ref().expect("on_failure");
    assert_eq!(f.name, "notify");
    assert_eq!(f.command, ["n"]);
    assert!(dag.function_index("notify").is_none());
    // Stored and read back the same.
    let json = serde_json::to_string(&dag).expect("json");
    let back: Dag = serde_json::from_str(&json).expect("back");
    assert_eq!(back, dag);
    assert_eq!(
        with(", instances: 1", "")
            .expect("one instance")
            .functions
            .len(),
        2
    );

    for (extra, edges, says) in [
        (
            "",
            "  - { from: b, to: notify, kind: one }\n",
            "has no edges",
        ),
        (
            "",
            "  - { from: notify, to: a, kind: one }\n",
            "has no edges",
        ),
        (", instances: 3", "", "one instance"),
    ] {
        let err = with(extra, edges).expect_err(says).to_string();
        assert!(err.contains(says) && err.contains("d.yaml"), "{err}");
    }
    let unknown = Dag::from_yaml(
        "d.yaml",
        "name: d\non_failure: nobody\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect_err("unknown")
    .to_string();
    assert!(
        unknown.contains("on_failure") && unknown.contains("nobody"),
        "{unknown}"
    );
    let alone = Dag::from_yaml(
        "d.yaml",
        "name: d\non_failure: a\nfunctions:\n  - { name: a, image: i, command: [x] }\n",
    )
    .expect_err("alone")
    .to_string();
    assert!(alone.contains("besides"), "{alone}");
}

/// `input: required` (a job without an input is refused at submission): read, kept, and no
/// schedule may start such a DAG's jobs; anything but `required` or `optional` refused.
#[test]
fn a_dags_required_input_is_read_and_checked() {
    let with = |extra: &str| {
        Dag::from_yaml(
            "d.yaml",
            &format!("name: d\n{extra}functions:\n  - {{ name: a, image: i, command: [x] }}\n"),
        )
    };
    assert!(with("input: required\n").expect("required").input_required);
    assert!(!with("input: optional\n").expect("optional").input_required);
    let none = with("").expect("default");
    assert!(!none.input_required);
    assert!(
        serde_json::to_value(&none)
            .expect("json")
            .get("input_required")
            .is_none()
    );
    let err = with("input: maybe\n").expect_err("maybe").to_string();
    assert!(err.contains("input") && err.contains("required"), "{err}");
    let err = with("input: required\ntriggers:\n  - { schedule: \"@every 1h\" }\n")
        .expect_err("a schedule")
        .to_string();
    assert!(
        err.contains("triggers[0].schedule") && err.contains("needs one"),
        "{err}"
    );
    assert!(
        with("input: required\ntriggers:\n  - { object_created: { prefix: in/ } }\n")
            .expect("an object gives the input")
            .input_required
    );
    // The sample sort needs its input.
    let sort = Dag::from_yaml(
        "dags/mapreduce-sort.yaml",
        include_str!("../../../../dags/mapreduce-sort.yaml"),
    )
    .expect("sort");
    assert!(sort.input_required);
}
