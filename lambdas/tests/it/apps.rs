//! The three applications end to end on the local executor: each result validates.

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use crate::support;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sonic_lambdas::local::JobRun;
use sonic_lambdas::{ml, sort, video};

fn sort_input(dir: &Path, bytes: u64, seed: u64) -> PathBuf {
    let p = dir.join("records.bin");
    let mut f = File::create(&p).unwrap();
    sort::generate(&mut f, bytes, seed).unwrap();
    p
}

#[test]
fn mapreduce_sort_output_is_the_sorted_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = sort_input(dir.path(), 1_500_050, 5);
    let dag = support::dag("mapreduce-sort");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[("mappers", json!(3)), ("reducers", json!(4))],
        std::slice::from_ref(&input),
    );
    assert_eq!(run.fanout("map"), Some(3), "one mapper per slice");
    assert_eq!(run.fanout("reduce"), Some(4));
    let parts: Vec<PathBuf> = {
        let mut p: Vec<(u32, PathBuf)> = run
            .results
            .iter()
            .map(|r| (sort::part_index(&r.path).unwrap(), r.path.clone()))
            .collect();
        p.sort();
        p.into_iter().map(|(_, p)| p).collect()
    };
    assert_eq!(parts.len(), 4);
    let v = sort::validate(std::slice::from_ref(&input), &parts).unwrap();
    assert_eq!(v.records, 15_000);
    // Range partitioning of random keys: every reducer got a fair share.
    for p in &parts {
        let n = fs::metadata(p).unwrap().len() / 100;
        assert!((2_500..5_000).contains(&n), "{}: {n} records", p.display());
    }
    // The shuffle moved every record once.
    let shuffle = run.edges.iter().find(|e| e.kind == "shuffle").unwrap();
    assert_eq!((shuffle.files, shuffle.bytes), (12, 1_500_000));

    // The validator's command line agrees, and refuses a damaged output.
    let cli = env!("CARGO_BIN_EXE_mapreduce-sort");
    let ok = Command::new(cli)
        .arg("validate")
        .arg("--input")
        .arg(&input)
        .args(&parts)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("\"records\":15000"));
    let mut damaged: Vec<PathBuf> = parts.clone();
    damaged.swap(0, 1);
    let bad = Command::new(cli)
        .arg("validate")
        .arg("--input")
        .arg(&input)
        .args(&damaged)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not sorted"));
}

#[test]
fn mapreduce_sort_handles_fewer_records_than_mappers() {
    let dir = tempfile::tempdir().unwrap();
    let input = sort_input(dir.path(), 300, 1);
    let dag = support::dag("mapreduce-sort");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[("mappers", json!(8)), ("reducers", json!(2))],
        std::slice::from_ref(&input),
    );
    assert_eq!(run.fanout("map"), Some(3));
    let mut parts: Vec<PathBuf> = run.results.iter().map(|r| r.path.clone()).collect();
    parts.sort_by_key(|p| sort::part_index(p).unwrap());
    assert_eq!(sort::validate(&[input], &parts).unwrap().records, 3);
}

fn ml_input(dir: &Path, rows: u64, seed: u64) -> PathBuf {
    let p = dir.join("data.csv");
    let mut f = File::create(&p).unwrap();
    ml::generate(
        &mut f,
        &ml::GenSpec {
            rows,
            seed,
            features: 16,
            classes: 4,
        },
    )
    .unwrap();
    p
}

fn accuracy_report(run: &sonic_lambdas::local::JobRun) -> ml::AccuracyReport {
    let r = run.result("accuracy.json").expect("result/accuracy.json");
    serde_json::from_slice(&fs::read(&r.path).unwrap()).unwrap()
}

#[test]
fn ml_pipeline_forest_is_far_above_chance() {
    let dir = tempfile::tempdir().unwrap();
    let input = ml_input(dir.path(), 4_000, 3);
    let dag = support::dag("ml-pipeline");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[("trees", json!(3))],
        std::slice::from_ref(&input),
    );
    assert_eq!(run.fanout("train"), Some(3));
    let acc = accuracy_report(&run);
    eprintln!("ml-pipeline (generated, 4000 rows, 3 trees): {acc:?}");
    assert_eq!((acc.trees, acc.classes, acc.test_rows), (3, 4, 800));
    assert!(acc.majority_baseline < 0.35, "{acc:?}");
    assert!(acc.accuracy > 0.8, "forest accuracy {acc:?}");
    // Trees trained on different samples differ (seeded by the instance index).
    let trees: Vec<ml::TrainedTree> = run
        .instances
        .iter()
        .filter(|i| i.function == "train")
        .map(|i| {
            let p = i.log.parent().unwrap().join("out/combine/tree.json");
            serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
        })
        .collect();
    assert_ne!(trees[0].tree, trees[1].tree);
    // The broadcast sent the same bytes to every trainer.
    let b = run.edges.iter().find(|e| e.kind == "broadcast").unwrap();
    assert_eq!(b.files, 9);

    // result/model.json is a usable model on raw rows.
    let model = run.result("model.json").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ml-pipeline"))
        .args(["evaluate", "--model"])
        .arg(&model.path)
        .arg("--data")
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["rows"], 4_000);
    assert!(v["accuracy"].as_f64().unwrap() > 0.8, "{v}");
}

#[test]
fn ml_pipeline_trains_several_trees_per_instance_on_its_cores() {
    let dir = tempfile::tempdir().unwrap();
    let dag = support::dag("ml-pipeline");
    let iris = |per: u32, job: &str| {
        support::run(
            &dag,
            &dir.path().join(job),
            &[
                ("trees", json!(2)),
                ("dataset", json!("iris")),
                ("trees_per_instance", json!(per)),
            ],
            &[],
        )
    };
    let trees_of = |run: &JobRun, instance: u32| -> Vec<ml::TrainedTree> {
        let i = run
            .instances
            .iter()
            .find(|i| i.function == "train" && i.instance == instance)
            .unwrap();
        let out = i.log.parent().unwrap().join("out/combine");
        let names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("tree"))
            .collect();
        let mut trees: Vec<ml::TrainedTree> = names
            .iter()
            .map(|n| serde_json::from_slice(&fs::read(out.join(n)).unwrap()).unwrap())
            .collect();
        trees.sort_by_key(|t| t.index);
        // Each in the file its index names.
        for t in &trees {
            assert!(names.contains(&ml::tree_file(t.index)), "{names:?}");
        }
        trees
    };
    let three = iris(3, "three");
    let acc = accuracy_report(&three);
    assert_eq!(acc.trees, 6, "{acc:?}");
    assert!(acc.accuracy > 0.8, "{acc:?}");
    let mine = trees_of(&three, 1);
    assert_eq!(
        mine.iter()
            .map(|t| (t.instance, t.index))
            .collect::<Vec<_>>(),
        [(1, 0), (1, 1), (1, 2)]
    );
    // Each tree on its own sample.
    assert_ne!(mine[0].tree, mine[1].tree);
    assert_ne!(mine[1].tree, mine[2].tree);
    // The first tree is the one an instance of one tree fits: the seeds did not move.
    let one = iris(1, "one");
    assert_eq!(trees_of(&one, 1), mine[..1]);
    // Out of range: a clear error, no output.
    let dag_dir = dir.path().join("bad");
    let bad = support::try_run(
        &dag,
        &dag_dir,
        &[("dataset", json!("iris")), ("trees_per_instance", json!(0))],
        &[],
    );
    let err = format!("{}", bad.expect_err("refused"));
    assert!(err.contains("trees_per_instance"), "{err}");
}

/// `trees_skew`: the train instances fit the counts `ml::skewed_trees` draws for them, so a
/// stage's instances differ; the forest votes them all; out of range, a clear error.
#[test]
fn ml_pipeline_skews_the_trees_per_instance() {
    let dir = tempfile::tempdir().unwrap();
    let dag = support::dag("ml-pipeline");
    let skew = 1.0;
    let run = support::run(
        &dag,
        &dir.path().join("skewed"),
        &[
            ("trees", json!(8)),
            ("dataset", json!("iris")),
            ("trees_skew", json!(skew)),
        ],
        &[],
    );
    let counts: Vec<u32> = (0..8).map(|k| ml::skewed_trees(1, skew, 42, k)).collect();
    assert!(
        counts.iter().max() > counts.iter().min(),
        "the instances differ: {counts:?}"
    );
    for (k, want) in counts.iter().enumerate() {
        let i = run
            .instances
            .iter()
            .find(|i| i.function == "train" && i.instance == k as u32)
            .unwrap();
        let out = i.log.parent().unwrap().join("out/combine");
        let trees = fs::read_dir(&out)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("tree")
            })
            .count();
        assert_eq!(trees as u32, *want, "instance {k}");
    }
    let acc = accuracy_report(&run);
    assert_eq!(acc.trees as u32, counts.iter().sum::<u32>(), "{acc:?}");
    let bad = support::try_run(
        &dag,
        &dir.path().join("bad"),
        &[("dataset", json!("iris")), ("trees_skew", json!(3.5))],
        &[],
    );
    let err = format!("{}", bad.expect_err("refused"));
    assert!(err.contains("trees_skew"), "{err}");
}

#[test]
fn ml_pipeline_on_a_shipped_data_set() {
    let dir = tempfile::tempdir().unwrap();
    let dag = support::dag("ml-pipeline");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[("trees", json!(4)), ("dataset", json!("iris"))],
        &[],
    );
    let acc = accuracy_report(&run);
    eprintln!("ml-pipeline (iris, 4 trees): {acc:?}");
    assert_eq!((acc.test_rows, acc.classes), (30, 3));
    assert!(acc.accuracy > 0.8, "{acc:?}");
    assert!(acc.accuracy > acc.majority_baseline + 0.3, "{acc:?}");
}

fn video_input(dir: &Path, seconds: u32, scene_seconds: u32, seed: u64) -> (PathBuf, video::Truth) {
    let p = dir.join("video.y4m");
    let spec = video::VideoSpec {
        seconds,
        scene_seconds,
        seed,
        ..video::VideoSpec::default()
    };
    let truth = video::generate(File::create(&p).unwrap(), &spec).unwrap();
    (p, truth)
}

/// `got` says what `want` says: the same chunks, frames and classes, the confidences equal up
/// to JSON's last digit (serde_json reads a float back within an ulp or so).
fn assert_same_labels(got: &video::Labels, want: &video::Labels) {
    assert_eq!(got.chunks, want.chunks);
    for (g, w) in got.labels.iter().zip(&want.labels) {
        let strip = |l: &video::ChunkLabel| video::ChunkLabel {
            confidence: 0.0,
            ..l.clone()
        };
        assert_eq!(strip(g), strip(w));
        assert!(
            (g.confidence - w.confidence).abs() < 1e-12,
            "{g:?} vs {w:?}"
        );
    }
}

/// The job's labels: every `result/label-*.json` the run wrote, checked one per chunk.
fn video_labels(run: &sonic_lambdas::local::JobRun) -> video::Labels {
    let files: Vec<PathBuf> = run
        .results
        .iter()
        .inspect(|r| assert_eq!(r.function, "classify", "{r:?}"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(files.len(), run.results.len());
    video::Labels::read(&files).unwrap()
}

#[test]
fn video_analytics_labels_every_chunk_correctly() {
    let dir = tempfile::tempdir().unwrap();
    // 47 s in 5 s chunks: 10 chunks, the last one 2 s long.
    let (input, truth) = video_input(dir.path(), 47, 5, 21);
    let dag = support::dag("video-analytics");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[("chunk_seconds", json!(5))],
        std::slice::from_ref(&input),
    );
    assert_eq!(run.fanout("extract"), Some(10), "ceil(47 / 5) chunks");
    assert_eq!(
        run.fanout("classify"),
        Some(10),
        "the one edge keeps the fanout"
    );
    // One result file per chunk, named by chunk, written by the classify instance of that chunk.
    let mut names: Vec<(u32, String)> = run
        .results
        .iter()
        .map(|r| (r.instance, r.name.clone()))
        .collect();
    names.sort();
    let want: Vec<(u32, String)> = (0..10).map(|k| (k, video::label_file(k))).collect();
    assert_eq!(names, want);
    let labels = video_labels(&run);
    assert_eq!(labels.chunks, 10);
    assert_eq!(labels.labels[9].frames, 20);
    // Exactly what one process computes from the same video.
    let reference = video::reference_labels(&input, 5.0, "middle").unwrap();
    assert_same_labels(&labels, &reference);
    let (right, total) = truth.score(&labels);
    eprintln!("video-analytics: {right}/{total} chunks right");
    assert!(right * 10 >= total * 9, "{right}/{total}: {labels:?}");
    // The scene classes vary, so a constant answer could not score this.
    let mut classes = truth.scenes.clone();
    classes.sort_unstable();
    classes.dedup();
    assert!(classes.len() >= 3, "{:?}", truth.scenes);

    // The scorer's command line agrees, given the folder of result files.
    let truth_path = dir.path().join("truth.json");
    fs::write(&truth_path, serde_json::to_vec(&truth).unwrap()).unwrap();
    // As `ofctl fetch` leaves them: every result file in one folder.
    let result_dir = dir.path().join("fetched");
    fs::create_dir(&result_dir).unwrap();
    for r in &run.results {
        fs::copy(&r.path, result_dir.join(&r.name)).unwrap();
    }
    let score = |labels: &[PathBuf]| {
        Command::new(env!("CARGO_BIN_EXE_video-analytics"))
            .arg("score")
            .arg("--labels")
            .args(labels)
            .arg("--truth")
            .arg(&truth_path)
            .output()
            .unwrap()
    };
    let all: Vec<PathBuf> = run.results.iter().map(|r| r.path.clone()).collect();
    for args in [vec![result_dir], all.clone()] {
        let out = score(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["right"].clone(), v["chunks"].clone()),
            (json!(right), json!(10))
        );
    }
    // A missing chunk is refused, not scored.
    let missing: Vec<PathBuf> = all
        .iter()
        .filter(|p| !p.ends_with(video::label_file(4)))
        .cloned()
        .collect();
    let out = score(&missing);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chunk 4 has no labels"));
    // So is a set without its last chunks: the labels must cover the whole video.
    let out = score(&all[..9]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cover 450 of the video's 470 frames"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn video_extract_sends_one_frame_that_classify_labels() {
    let dir = tempfile::tempdir().unwrap();
    let (input, truth) = video_input(dir.path(), 12, 4, 2);
    let dag = support::dag("video-analytics");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[
            ("chunk_seconds", json!(4)),
            ("frame", json!("max-variance")),
        ],
        std::slice::from_ref(&input),
    );
    assert_eq!(run.fanout("extract"), Some(3));
    assert_eq!(run.fanout("classify"), Some(3));
    let header = fs::read(&input).unwrap()[..40].to_vec();
    let labels = video_labels(&run);
    for k in 0..3u32 {
        // Each chunk is a complete stream with the input's header.
        let chunk = dir
            .path()
            .join(format!("job/extract/{k}/in/split/0/chunk-{k:05}.y4m"));
        let bytes = fs::read(&chunk).unwrap();
        assert_eq!(bytes[..40], header[..]);
        let mut r = sonic_lambdas::y4m::Reader::new(&bytes[..]).unwrap();
        let mut frames = Vec::new();
        let mut buf = Vec::new();
        while r.read_frame(&mut buf).unwrap() {
            frames.push(std::mem::take(&mut buf));
        }
        assert_eq!(frames.len(), 40);
        // Classify k received extract k's frame (the one edge pairs i with i): a one-frame
        // stream with the same header, the frame its info names.
        let sent = dir.path().join(format!("job/classify/{k}/in/extract/{k}"));
        let info: video::FrameInfo =
            serde_json::from_slice(&fs::read(sent.join(video::FRAME_INFO_FILE)).unwrap()).unwrap();
        assert_eq!((info.chunk, info.frames), (k, 40));
        let frame = fs::read(sent.join(video::FRAME_FILE)).unwrap();
        assert_eq!(frame[..40], header[..]);
        let mut r = sonic_lambdas::y4m::Reader::new(&frame[..]).unwrap();
        assert!(r.read_frame(&mut buf).unwrap());
        assert_eq!(buf, frames[info.frame as usize]);
        assert!(!r.read_frame(&mut buf).unwrap(), "one frame only");
        assert_eq!(labels.labels[k as usize].frame, info.frame);
    }
    // The edge carries exactly the frames and their info.
    let edge = run.edges.iter().find(|e| e.to == "classify").unwrap();
    assert_eq!((edge.kind.as_str(), edge.files), ("one", 6));
    assert_same_labels(
        &labels,
        &video::reference_labels(&input, 4.0, "max-variance").unwrap(),
    );
    let (right, total) = truth.score(&labels);
    assert_eq!(total, 3);
    assert!(right >= 2, "{labels:?} vs {:?}", truth.scenes);
}

#[test]
fn synthetic_chain_runs_and_passes_its_bytes_along() {
    let dir = tempfile::tempdir().unwrap();
    let dag = support::dag("synthetic-chain");
    let run = support::run(
        &dag,
        &dir.path().join("job"),
        &[
            ("compute_ms", json!(5)),
            ("alloc_mb", json!(1)),
            ("output_bytes", json!(10_000)),
        ],
        &[],
    );
    let out = run.result("out").expect("c writes result/out");
    assert_eq!(
        (
            out.function.as_str(),
            fs::metadata(&out.path).unwrap().len()
        ),
        ("c", 10_000)
    );
    let bytes: Vec<u64> = run.edges.iter().map(|e| e.bytes).collect();
    assert_eq!(bytes, [10_000, 10_000]);
}

#[test]
fn a_failing_instance_fails_the_run_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    // Not whole records: split refuses the input.
    let input = dir.path().join("bad.bin");
    fs::write(&input, [0u8; 150]).unwrap();
    let dag = support::dag("mapreduce-sort");
    let mut config = sonic_lambdas::local::RunConfig::new(dir.path().join("job"));
    config.programs = support::programs();
    config.inputs = vec![input];
    let err = sonic_lambdas::local::run_dag(&dag, &config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("split/0 failed"), "{err}");
    assert!(
        err.contains("not a whole number of 100-byte records"),
        "{err}"
    );
}
