//! What `ofctl up` and `ofctl demo` do on a fresh machine: build the lambda image when Docker
//! answers without it, install and start SeaweedFS when no S3 server answers, and fall back to
//! processes and a local folder only when that fails, saying why. The decisions are table-tested
//! (`sandbox_step`, `store_step`); the image build runs for real once, under temporary image
//! names, and its error path with a stand-in script.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use ofctl::up::{
    LAMBDA_IMAGE, SandboxFacts, SandboxStep, StoreFacts, StoreStep, build_lambda_image,
    sandbox_step, store_step,
};
use ofctl::{SandboxArg, StoreArg};

fn sandbox(docker: Result<Result<bool, String>, String>, checkout: bool) -> SandboxFacts {
    SandboxFacts {
        docker,
        checkout,
        build: None,
    }
}

/// The step's kind and its reason (empty for `Build`).
fn sandbox_kind(step: &SandboxStep) -> (&'static str, &str) {
    match step {
        SandboxStep::Docker(r) => ("docker", r),
        SandboxStep::Build => ("build", ""),
        SandboxStep::Process(r) => ("process", r),
        SandboxStep::Fail(r) => ("fail", r),
    }
}

#[test]
fn sandbox_decisions() {
    let no_engine = || Err::<Result<bool, String>, _>("connection refused".to_string());
    let image = |present: bool| Ok::<_, String>(Ok::<_, String>(present));
    let built = |mut f: SandboxFacts, r: Result<(), String>| {
        f.build = Some(r);
        f
    };
    let failed = || Err("cargo build failed".to_string());
    // (flag, facts, expected kind, words the reason must hold)
    let cases: Vec<(SandboxArg, SandboxFacts, &str, &[&str])> = vec![
        // --sandbox process never probes nor builds.
        (
            SandboxArg::Process,
            sandbox(image(false), true),
            "process",
            &["asked for"],
        ),
        (
            SandboxArg::Process,
            sandbox(no_engine(), true),
            "process",
            &["asked for"],
        ),
        // The image is there: Docker.
        (
            SandboxArg::Auto,
            sandbox(image(true), true),
            "docker",
            &["has sonic-lambdas:latest"],
        ),
        (
            SandboxArg::Docker,
            sandbox(image(true), false),
            "docker",
            &["has"],
        ),
        // The image is missing and a checkout is here: build it (auto and docker alike).
        (SandboxArg::Auto, sandbox(image(false), true), "build", &[]),
        (
            SandboxArg::Docker,
            sandbox(image(false), true),
            "build",
            &[],
        ),
        // Built: Docker, and the reason says it was built.
        (
            SandboxArg::Auto,
            built(sandbox(image(false), true), Ok(())),
            "docker",
            &["built", "deploy/build-images.sh"],
        ),
        (
            SandboxArg::Docker,
            built(sandbox(image(false), true), Ok(())),
            "docker",
            &["built"],
        ),
        // The build failed: processes as a named fallback with what to run; docker fails.
        (
            SandboxArg::Auto,
            built(sandbox(image(false), true), failed()),
            "process",
            &[
                "fallback:",
                "building it failed: cargo build failed",
                "bash deploy/build-images.sh",
            ],
        ),
        (
            SandboxArg::Docker,
            built(sandbox(image(false), true), failed()),
            "fail",
            &["--sandbox docker:", "building it failed"],
        ),
        // No checkout to build from.
        (
            SandboxArg::Auto,
            sandbox(image(false), false),
            "process",
            &[
                "fallback:",
                "no Sonic checkout",
                "bash deploy/build-images.sh",
            ],
        ),
        (
            SandboxArg::Docker,
            sandbox(image(false), false),
            "fail",
            &["--sandbox docker:", "no Sonic checkout"],
        ),
        // No engine: nothing to build for.
        (
            SandboxArg::Auto,
            sandbox(no_engine(), true),
            "process",
            &["fallback:", "no Docker engine", "connection refused"],
        ),
        (
            SandboxArg::Docker,
            sandbox(no_engine(), true),
            "fail",
            &["--sandbox docker:", "no Docker engine"],
        ),
        // The engine answers but cannot say whether it has the image.
        (
            SandboxArg::Auto,
            sandbox(Ok(Err("inspecting image: 500".into())), true),
            "process",
            &["fallback:", "inspecting image: 500"],
        ),
    ];
    for (i, (arg, facts, kind, words)) in cases.iter().enumerate() {
        let step = sandbox_step(*arg, facts);
        let (got, reason) = sandbox_kind(&step);
        assert_eq!(got, *kind, "case {i}: {arg:?} {facts:?} -> {step:?}");
        for w in *words {
            assert!(reason.contains(w), "case {i}: {reason:?} lacks {w:?}");
        }
        if got == "docker" {
            assert!(!reason.contains("fallback"), "case {i}: {reason:?}");
        }
    }
    assert_eq!(LAMBDA_IMAGE, "sonic-lambdas:latest");
}

fn store(answers: bool, checkout: bool, installed: bool) -> StoreFacts {
    StoreFacts {
        endpoint: "http://127.0.0.1:8333".into(),
        answers,
        seaweed_endpoint: true,
        checkout,
        installed,
        install: None,
        start: None,
    }
}

fn store_kind(step: &StoreStep) -> (&'static str, &str) {
    match step {
        StoreStep::S3(r) => ("s3", r),
        StoreStep::Install => ("install", ""),
        StoreStep::Start => ("start", ""),
        StoreStep::Local(r) => ("local", r),
        StoreStep::Fail(r) => ("fail", r),
    }
}

#[test]
fn store_decisions() {
    let with = |mut f: StoreFacts,
                install: Option<Result<(), String>>,
                start: Option<Result<(), String>>| {
        f.install = install;
        f.start = start;
        f
    };
    let ok = || Some(Ok(()));
    let err = |e: &str| Some(Err(e.to_string()));
    let elsewhere = {
        let mut f = store(false, true, true);
        f.endpoint = "http://s3.example:9000".into();
        f.seaweed_endpoint = false;
        f
    };
    let cases: Vec<(StoreArg, StoreFacts, &str, &[&str])> = vec![
        // --store local never looks further.
        (
            StoreArg::Local,
            store(false, true, false),
            "local",
            &["asked for"],
        ),
        (
            StoreArg::Local,
            store(true, true, true),
            "local",
            &["asked for"],
        ),
        // Something answers: use it.
        (
            StoreArg::Auto,
            store(true, false, false),
            "s3",
            &["answers at http://127.0.0.1:8333"],
        ),
        // Nothing answers, SeaweedFS not installed: install, then start.
        (StoreArg::Auto, store(false, true, false), "install", &[]),
        (StoreArg::S3, store(false, true, false), "install", &[]),
        (
            StoreArg::Auto,
            with(store(false, true, false), ok(), None),
            "start",
            &[],
        ),
        (
            StoreArg::Auto,
            with(store(false, true, false), ok(), ok()),
            "s3",
            &["installed SeaweedFS", "started it"],
        ),
        // Installed already: start only.
        (StoreArg::Auto, store(false, true, true), "start", &[]),
        (
            StoreArg::Auto,
            with(store(false, true, true), None, ok()),
            "s3",
            &["started SeaweedFS"],
        ),
        // Failures: the local folder as a named fallback with what failed; s3 fails.
        (
            StoreArg::Auto,
            with(store(false, true, false), err("pip: no network"), None),
            "local",
            &[
                "fallback:",
                "installing SeaweedFS failed: pip: no network",
                "bash deploy/seaweedfs.sh install",
            ],
        ),
        (
            StoreArg::S3,
            with(store(false, true, false), err("pip: no network"), None),
            "fail",
            &["--store s3:", "installing SeaweedFS failed"],
        ),
        (
            StoreArg::Auto,
            with(store(false, true, false), ok(), err("port in use")),
            "local",
            &[
                "fallback:",
                "did not start: port in use",
                "bash deploy/seaweedfs.sh start",
            ],
        ),
        (
            StoreArg::Auto,
            with(store(false, true, true), None, err("weed exited")),
            "local",
            &["fallback:", "did not start: weed exited"],
        ),
        (
            StoreArg::S3,
            with(store(false, true, true), None, err("weed exited")),
            "fail",
            &["--store s3:", "weed exited"],
        ),
        // No checkout to install from.
        (
            StoreArg::Auto,
            store(false, false, false),
            "local",
            &[
                "fallback:",
                "no Sonic checkout",
                "deploy/seaweedfs.sh install",
            ],
        ),
        // An endpoint SeaweedFS does not serve: no install, no start.
        (
            StoreArg::Auto,
            elsewhere.clone(),
            "local",
            &["fallback:", "http://s3.example:9000", "SONIC_S3_ENDPOINT"],
        ),
        (
            StoreArg::S3,
            elsewhere,
            "fail",
            &["--store s3:", "http://s3.example:9000"],
        ),
    ];
    for (i, (arg, facts, kind, words)) in cases.iter().enumerate() {
        let step = store_step(*arg, facts);
        let (got, reason) = store_kind(&step);
        assert_eq!(got, *kind, "case {i}: {arg:?} {facts:?} -> {step:?}");
        for w in *words {
            assert!(reason.contains(w), "case {i}: {reason:?} lacks {w:?}");
        }
        if got == "s3" {
            assert!(!reason.contains("fallback"), "case {i}: {reason:?}");
        }
    }
}

/// The build's plumbing without Docker: a stand-in `deploy/build-images.sh` that logs two steps,
/// prints cargo-like noise and fails. Its steps become notes (the noise does not), and the error
/// names the command, the exit status and the script's last words.
#[tokio::test]
async fn a_failed_build_says_why() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("deploy")).unwrap();
    std::fs::write(
        root.path().join("deploy/build-images.sh"),
        r#"echo "build-images: building sonic-lambdas ($1) for $SONIC_LAMBDAS_IMAGE" >&2
echo "   Compiling something v0.1.0" >&2
echo "build-images: missing /x/synthetic after the build" >&2
exit 3
"#,
    )
    .unwrap();
    let mut notes = Vec::new();
    let r = build_lambda_image(root.path(), "img:test", None, true, &mut |l: &str| {
        notes.push(l.to_owned())
    })
    .await;
    let err = r.unwrap_err();
    assert!(
        err.contains("bash deploy/build-images.sh --debug failed"),
        "{err}"
    );
    assert!(err.contains("exit status: 3"), "{err}");
    assert!(
        err.ends_with("build-images: missing /x/synthetic after the build"),
        "{err}"
    );
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes[0]
            .starts_with("building the lambda image img:test: bash deploy/build-images.sh --debug")
    );
    assert!(
        notes[1].contains("building sonic-lambdas (--debug) for img:test"),
        "{notes:?}"
    );
    assert!(notes.iter().all(|n| !n.contains("Compiling")), "{notes:?}");
}

fn docker_ok() -> Result<(), String> {
    let answers = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !answers {
        return Err("no Docker engine answers".into());
    }
    if Command::new("jq").arg("--version").output().is_err() {
        return Err("jq is not installed".into());
    }
    Ok(())
}

fn remove_image(name: &str) {
    let _ = Command::new("docker")
        .args(["image", "rm", "-f", name])
        .output();
}

fn has_image(name: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", name])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The real build, as `ofctl` runs it on first use (debug profile), under temporary names so that
/// the images other work uses are left alone; both are removed afterwards. Skipped, saying so,
/// where no Docker engine answers, except in CI (`CI` set, as `.ci/run` sets it), where that
/// fails.
#[tokio::test]
async fn builds_the_lambda_image_for_real() {
    if let Err(why) = docker_ok() {
        assert!(
            !sonic_testkit::in_ci(),
            "{why}: CI needs a Docker engine (apt-get install docker.io; service docker start)"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tag = format!("firstrun-{}", std::process::id());
    let image = format!("sonic-lambdas-test:{tag}");
    let agent = format!("sonic-agent-test:{tag}");
    let mut notes = Vec::new();
    let r = build_lambda_image(&root, &image, Some(&agent), true, &mut |l: &str| {
        eprintln!("{l}");
        notes.push(l.to_owned())
    })
    .await;
    let present = has_image(&image);
    remove_image(&image);
    remove_image(&agent);
    r.unwrap();
    assert!(present, "the build succeeded but Docker has no {image}");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("build-images: building sonic-lambdas (debug)")),
        "{notes:?}"
    );
}
