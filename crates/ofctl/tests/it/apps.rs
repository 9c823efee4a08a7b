//! The applications end to end on an `ofctl up` cluster, under every policy: MapReduce sort, the ML
//! pipeline and video analytics, each run with `ofctl run --wait -o json` under `remote` (three
//! profiling jobs at growing input sizes, so that the models can predict), then `local`, `direct`
//! and `sonic` at the largest size. Every result is fetched with `ofctl fetch` and validated (a
//! sorted permutation; accuracy well above chance; one label file per chunk, the labels one process
//! computes from the same video),
//! and the results of the four policies must be byte-identical.
//!
//! The cluster is `up --sandbox auto --store auto`: where `.ci/run` runs it, Docker (with the
//! `sonic-lambdas:latest` image) and SeaweedFS; elsewhere processes and a local folder. The test
//! prints what `up` chose.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use sonic_testkit::lambda_dir;

/// A job's fetched results: path under `result/` -> bytes.
type Results = BTreeMap<String, Vec<u8>>;

fn ofctl_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ofctl"))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a lambda-package binary (the generators and validators) and asserts it succeeded.
fn tool(bin: &str, args: &[&str]) -> String {
    let out = Command::new(lambda_dir().join(bin))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Up {
    child: Child,
    home: tempfile::TempDir,
}

impl Up {
    fn start(agents: u32) -> Up {
        let home = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(ofctl_exe())
            .args(["up", "--store", "auto", "--sandbox", "auto"])
            .args(["--listen", "127.0.0.1:0", "--agents", &agents.to_string()])
            .arg("--data-dir")
            .arg(home.path().join("data"))
            .arg("--lambdas")
            .arg(lambda_dir())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env_remove("SONIC_SERVER")
            .env_remove("SONIC_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ofctl up");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut server = false;
        for line in lines.by_ref() {
            let line = line.expect("read ofctl up");
            eprintln!("up: {line}");
            if line.starts_with("server") {
                server = true;
                break;
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        if !server {
            let _ = child.kill();
            panic!("ofctl up exited without printing its server");
        }
        Up { child, home }
    }

    fn ofctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(ofctl_exe())
            .args(args)
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env_remove("SONIC_SERVER")
            .env_remove("SONIC_TOKEN")
            .output()
            .expect("run ofctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let (code, stdout, stderr) = self.ofctl(args);
        assert_eq!(code, 0, "ofctl {args:?} failed: {stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }

    /// `ofctl run DAG --wait -o json` with an input, parameters and a policy; asserts success
    /// and returns the summary.
    fn run(&self, dag: &str, input: Option<&Path>, params: &[&str], policy: &str) -> Value {
        let mut args = vec!["run", dag, "--wait", "-o", "json", "--policy", policy];
        let input_s;
        if let Some(p) = input {
            input_s = p.display().to_string();
            args.extend(["--input", &input_s]);
        }
        for p in params {
            args.extend(["--param", p]);
        }
        let s = self.json(&args);
        assert_eq!(s["status"], "succeeded", "{dag} under {policy}: {s}");
        assert_eq!(s["policy"], policy, "{s}");
        s
    }

    /// Fetches a job's results into a fresh folder and returns them, path -> bytes.
    fn results(&self, job: &str) -> (PathBuf, Results) {
        let dir = self.home.path().join(format!("results-{job}"));
        let fetched = self.json(&["fetch", job, "--to", dir.to_str().unwrap(), "-o", "json"]);
        assert!(fetched.is_array() || fetched.is_object(), "{fetched}");
        let mut files = BTreeMap::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read results") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(&dir).unwrap().display().to_string();
                    files.insert(rel, std::fs::read(&p).expect("read result"));
                }
            }
        }
        assert!(!files.is_empty(), "job {job} fetched no results");
        (dir, files)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.home.path().join(name)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Runs `dag` under remote at three sizes (profiling), then local, direct and sonic at the last;
/// validates each result at the last size with `check` and asserts the four are identical.
fn every_policy(
    up: &Up,
    dag: &str,
    inputs: &[PathBuf; 3],
    params: &[&str],
    check: &dyn Fn(&Path, &Results),
) {
    for input in &inputs[..2] {
        let s = up.run(dag, Some(input), params, "remote");
        assert_eq!(s["mode"], "profiling", "{s}");
    }
    let last = &inputs[2];
    let mut reference: Option<(String, Results)> = None;
    for policy in ["remote", "local", "direct", "sonic"] {
        let s = up.run(dag, Some(last), params, policy);
        let job = s["job_id"].as_str().expect("job_id").to_owned();
        let methods: Vec<&str> = s["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .map(|e| e["method"].as_str().expect("method"))
            .collect();
        eprintln!(
            "{dag} {policy}: mode {} latency {}s methods {methods:?}",
            s["mode"], s["latency_s"]
        );
        match policy {
            "remote" => assert!(methods.iter().all(|m| *m == "remote"), "{s}"),
            "local" => assert!(methods.iter().all(|m| *m == "vm-storage"), "{s}"),
            "direct" => assert!(methods.iter().all(|m| *m == "direct"), "{s}"),
            _ => assert_eq!(s["mode"], "planned", "a forced sonic job is planned: {s}"),
        }
        let (dir, files) = up.results(&job);
        check(&dir, &files);
        match &reference {
            None => reference = Some((policy.to_owned(), files)),
            Some((first, want)) => {
                assert_eq!(
                    want.keys().collect::<Vec<_>>(),
                    files.keys().collect::<Vec<_>>(),
                    "{dag}: {policy} wrote other result files than {first}"
                );
                for (k, v) in want {
                    let show = |b: &[u8]| {
                        let t = String::from_utf8_lossy(b);
                        t.chars().take(1500).collect::<String>()
                    };
                    assert!(
                        files[k] == *v,
                        "{dag}: result {k} differs between {first} and {policy}:\n{}\n---\n{}",
                        show(v),
                        show(&files[k])
                    );
                }
            }
        }
    }
}

#[test]
fn the_applications_validate_and_agree_under_every_policy() {
    let up = Up::start(3);

    // MapReduce sort: 2,000 to 8,000 records, 3 mappers, 2 reducers.
    up.json(&[
        "apply",
        "-f",
        workspace()
            .join("dags/mapreduce-sort.yaml")
            .to_str()
            .unwrap(),
        "-o",
        "json",
    ]);
    let sort_inputs = [200_000, 400_000, 800_000].map(|bytes: u64| {
        let p = up.file(&format!("records-{bytes}.bin"));
        tool(
            "sonic-gen",
            &[
                "sort",
                "--bytes",
                &bytes.to_string(),
                "--seed",
                "7",
                "--out",
                p.to_str().unwrap(),
            ],
        );
        p
    });
    let sort_input = sort_inputs[2].clone();
    every_policy(
        &up,
        "mapreduce-sort",
        &sort_inputs,
        &["mappers=3", "reducers=2"],
        &|_, files| {
            // The parts in reducer order: result/reduce/<j>/part-<j>.
            let mut parts: Vec<(u32, &String)> = files
                .keys()
                .map(|k| {
                    let j = k.rsplit("part-").next().unwrap().parse::<u32>();
                    (j.unwrap_or_else(|_| panic!("unexpected result {k}")), k)
                })
                .collect();
            parts.sort();
            assert_eq!(parts.len(), 2, "one part per reducer: {:?}", files.keys());
            let dir = up.file("sort-check");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut args = vec![
                "validate".to_owned(),
                "--input".to_owned(),
                sort_input.display().to_string(),
            ];
            for (j, k) in parts {
                let p = dir.join(format!("part-{j}"));
                std::fs::write(&p, &files[k]).unwrap();
                args.push(p.display().to_string());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tool("mapreduce-sort", &args);
        },
    );

    // The ML pipeline: 1,500 to 6,000 generated rows, 3 trees.
    up.json(&[
        "apply",
        "-f",
        workspace().join("dags/ml-pipeline.yaml").to_str().unwrap(),
        "-o",
        "json",
    ]);
    let ml_inputs = [1_500, 3_000, 6_000].map(|rows: u32| {
        let p = up.file(&format!("data-{rows}.csv"));
        tool(
            "sonic-gen",
            &[
                "ml",
                "--rows",
                &rows.to_string(),
                "--seed",
                "3",
                "--out",
                p.to_str().unwrap(),
            ],
        );
        p
    });
    every_policy(&up, "ml-pipeline", &ml_inputs, &["trees=3"], &|_, files| {
        let acc: Value = serde_json::from_slice(
            files
                .get("accuracy.json")
                .unwrap_or_else(|| panic!("no accuracy.json in {:?}", files.keys())),
        )
        .expect("accuracy.json is JSON");
        let accuracy = acc["accuracy"].as_f64().expect("accuracy");
        let baseline = acc["majority_baseline"].as_f64().expect("baseline");
        assert!(
            accuracy > baseline + 0.3,
            "accuracy {accuracy} is not well above chance {baseline}"
        );
        assert!(files.contains_key("model.json"), "{:?}", files.keys());
    });

    // Video analytics: 20 to 50 seconds in 10 s chunks: 2 to 5 labels.
    up.json(&[
        "apply",
        "-f",
        workspace()
            .join("dags/video-analytics.yaml")
            .to_str()
            .unwrap(),
        "-o",
        "json",
    ]);
    let video_inputs = [20, 30, 50].map(|seconds: u32| {
        let p = up.file(&format!("video-{seconds}.y4m"));
        let truth = up.file(&format!("truth-{seconds}.json"));
        tool(
            "sonic-gen",
            &[
                "video",
                "--seconds",
                &seconds.to_string(),
                "--seed",
                "5",
                "--out",
                p.to_str().unwrap(),
                "--truth",
                truth.to_str().unwrap(),
            ],
        );
        p
    });
    // What one process computes from the 50 s video: the four policies' label files must say it.
    let reference =
        sonic_lambdas::video::reference_labels(&video_inputs[2], 10.0, "middle").expect("labels");
    every_policy(&up, "video-analytics", &video_inputs, &[], &|dir, files| {
        // `ofctl fetch` lays the results out as <function>/<instance>/<name>.
        let names: Vec<&String> = files.keys().collect();
        let want: Vec<String> = (0..5)
            .map(|k| format!("classify/{k}/{}", sonic_lambdas::video::label_file(k)))
            .collect();
        assert_eq!(
            names,
            want.iter().collect::<Vec<_>>(),
            "50 s in 10 s chunks: one label file per chunk, written by classify"
        );
        let paths: Vec<PathBuf> = want.iter().map(|n| dir.join(n)).collect();
        let labels = sonic_lambdas::video::Labels::read(&paths)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(labels.chunks, reference.chunks);
        for (got, want) in labels.labels.iter().zip(&reference.labels) {
            assert_eq!(
                (got.chunk, got.frame, got.label, &got.class),
                (want.chunk, want.frame, want.label, &want.class)
            );
            assert!((got.confidence - want.confidence).abs() < 1e-12);
        }
    });
}
