//! Every DAG file in `dags/` parses, resolves its fanouts with its default parameters, and names
//! binaries this package builds (the ones `deploy/build-images.sh` puts in the image).

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use crate::support;

use sonic_core::dag::{Dag, EdgeKind, Fanout};

#[test]
fn every_dag_file_parses_and_names_our_binaries() {
    let programs = support::programs();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(support::dags_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let dag =
            Dag::from_yaml(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            dag.name,
            "a DAG file is named after its DAG"
        );
        dag.fanouts(&dag.job_params(&Default::default()))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for f in &dag.functions {
            if let Some(handler) = &f.handler {
                // A Python handler stage: its lambda folder is shipped under lambdas/python/.
                let folder = python_lambda_folder(&dag.name, handler).unwrap_or_else(|| {
                    panic!(
                        "{}: {} names handler {handler:?}, which lambdas/python/ does not ship",
                        dag.name, f.name
                    )
                });
                assert!(
                    folder.join("f.py").is_file(),
                    "{}: no f.py",
                    folder.display()
                );
                continue;
            }
            assert_eq!(f.image, "sonic-lambdas:latest", "{}: {}", dag.name, f.name);
            assert!(
                programs.contains_key(&f.command[0]),
                "{}: {} runs {:?}, which this package does not build",
                dag.name,
                f.name,
                f.command[0]
            );
        }
        names.push(dag.name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "broadcast",
            "mapreduce-sort",
            "ml-pipeline",
            "ml-pipeline-py",
            "synthetic-chain",
            "video-analytics"
        ]
    );
}

/// The folder under `lambdas/python/` holding the lambda a Python DAG's function names: the
/// DAG `<app>-py` uploads `lambdas/python/<app>/<stage>/` as `<short>-py-<stage>` (docs/python.md).
fn python_lambda_folder(dag: &str, handler: &str) -> Option<std::path::PathBuf> {
    let shipped = [("ml-pipeline-py", "ml-pipeline", "ml-py-")];
    let (_, app, prefix) = shipped.iter().find(|(d, _, _)| *d == dag)?;
    let stage = handler.strip_prefix(prefix)?;
    Some(
        support::dags_dir()
            .join("../lambdas/python")
            .join(app)
            .join(stage),
    )
}

#[test]
fn application_dags_have_the_papers_shapes() {
    let kinds = |d: &Dag| -> Vec<(String, String, EdgeKind)> {
        d.edges
            .iter()
            .map(|e| {
                (
                    d.functions[e.from].name.clone(),
                    d.functions[e.to].name.clone(),
                    e.kind,
                )
            })
            .collect()
    };
    let s = |a: &str, b: &str, k| (a.to_string(), b.to_string(), k);

    let sort = support::dag("mapreduce-sort");
    assert_eq!(
        kinds(&sort),
        [
            s("split", "map", EdgeKind::Scatter),
            s("map", "reduce", EdgeKind::Shuffle)
        ]
    );
    let f = sort.fanouts(&sort.job_params(&Default::default())).unwrap();
    assert_eq!(f, [Fanout::Known(1), Fanout::Scattered, Fanout::Known(4)]);

    let ml = support::dag("ml-pipeline");
    assert_eq!(
        kinds(&ml),
        [
            s("pca", "train", EdgeKind::Broadcast),
            s("train", "combine", EdgeKind::Gather)
        ]
    );
    let mut p = ml.job_params(&Default::default());
    p.insert("trees".into(), serde_json::json!(9));
    assert_eq!(
        ml.fanouts(&p).unwrap(),
        [Fanout::Known(1), Fanout::Known(9), Fanout::Known(1)]
    );

    let video = support::dag("video-analytics");
    assert_eq!(
        kinds(&video),
        [
            s("split", "extract", EdgeKind::Scatter),
            s("extract", "classify", EdgeKind::One)
        ]
    );
    // Extract and Classify run one instance per chunk each: the paper's fanout-19 stages.
    assert_eq!(
        video
            .fanouts(&video.job_params(&Default::default()))
            .unwrap(),
        [Fanout::Known(1), Fanout::Scattered, Fanout::Scattered]
    );
}
