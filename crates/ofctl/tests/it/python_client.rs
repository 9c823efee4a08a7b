//! The Python client (`python/`, docs/python-client.md) against a real cluster: the cluster of
//! `ofctl up` in this process (the process sandbox, the `synthetic` lambda, a local store), the
//! package and pytest installed into a fresh venv (`pip install ./python pytest`: pytest comes
//! from PyPI, through pip's download cache), then `python -m pytest python/tests` with
//! SONIC_SERVER and SONIC_TOKEN naming the cluster. pytest must pass: any failure, and its exit
//! 5 (no test collected), fails this test with pytest's output. A missing `python3` or `venv`,
//! or a PyPI pip cannot reach, fails it too, saying so (never a skip).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ofctl::up::{Cluster, ClusterOptions, MemoryArg};
use ofctl::{SandboxArg, StoreArg};
use sonic_testkit::{lambda_dir, workspace};

/// Stdout and stderr of a finished command, for a failure's message.
fn shown(out: &Output) -> String {
    format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` to its end; Err says `what` failed to start.
fn output(cmd: &mut Command, what: &str) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))
}

/// The venv, the install, the tests: Ok with pytest's output, or Err with why.
fn install_and_test(root: &Path, work: &Path, server: &str, token: &str) -> Result<String, String> {
    let venv = work.join("venv");
    let made = output(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 (install Python 3 with venv: apt-get install python3 python3-venv)",
    )?;
    if !made.status.success() {
        return Err(format!(
            "`python3 -m venv` failed (install python3-venv: apt-get install python3-venv)\n{}",
            shown(&made)
        ));
    }
    let python: PathBuf = venv.join("bin").join("python");

    // The package as a user installs it, and pytest, from PyPI (pip's cache may answer).
    let pip = output(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .arg(root.join("python"))
            .arg("pytest>=7")
            .env("PIP_NO_INPUT", "1"),
        "pip",
    )?;
    if !pip.status.success() {
        return Err(format!(
            "pip could not install the client (python/) and pytest: pytest and the build backend \
             (flit_core) come from PyPI, which must be reachable (or in pip's cache)\n{}",
            shown(&pip)
        ));
    }

    let tests = output(
        Command::new(&python)
            .args(["-m", "pytest", "python/tests", "-q"])
            // No .pytest_cache in the work tree.
            .args(["-p", "no:cacheprovider"])
            // Its temporary files in ours, removed with it.
            .arg("--basetemp")
            .arg(work.join("pytest"))
            .current_dir(root)
            .env("SONIC_SERVER", server)
            .env("SONIC_TOKEN", token)
            .env_remove("SONIC_CA_FILE")
            // The user's own saved context stays out of it.
            .env("XDG_CONFIG_HOME", work.join("config"))
            // Nothing written into the work tree (no __pycache__).
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        "pytest",
    )?;
    let code = tests.status.code();
    if code == Some(5) {
        return Err(format!(
            "pytest collected no tests in python/tests (exit 5)\n{}",
            shown(&tests)
        ));
    }
    if code != Some(0) {
        return Err(format!(
            "the Python client's tests failed (pytest exit {code:?})\n{}",
            shown(&tests)
        ));
    }
    let stdout = String::from_utf8_lossy(&tests.stdout).into_owned();
    if !stdout.contains(" passed") {
        return Err(format!(
            "pytest exited 0 but reports no passed test\n{}",
            shown(&tests)
        ));
    }
    Ok(stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_tests_pass_against_a_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(
        ClusterOptions {
            agents: 2,
            catalog: None,
            sandbox: SandboxArg::Process,
            store: StoreArg::Local,
            memory: MemoryArg::Off,
            data_dir: dir.path().join("data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lambdas: Some(lambda_dir().to_path_buf()),
            emulate_store: false,
            openlambda: None,
        },
        &mut |_: &str| {},
    )
    .await
    .expect("the cluster starts");
    let server = cluster.info.server.clone();
    let token = cluster.token.clone();
    let root = workspace().canonicalize().expect("the workspace");
    let work = dir.path().to_path_buf();
    // pip and pytest block: off the runtime's threads, which serve the cluster.
    let outcome =
        tokio::task::spawn_blocking(move || install_and_test(&root, &work, &server, &token))
            .await
            .expect("the install and test thread");
    cluster.stop().await;
    match outcome {
        Ok(out) => eprintln!("{}", out.lines().last().unwrap_or_default()),
        Err(why) => panic!("{why}"),
    }
}
