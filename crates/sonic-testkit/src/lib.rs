//! What the integration tests of every crate share: the lambda binaries, built once per test
//! binary (one `cargo build -p sonic-lambdas --bins`, a no-op when they are fresh), and whether
//! this run is CI's, where a test whose dependency is missing fails instead of skipping.

pub mod redis;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The workspace's root folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The folder the test binary was built for (`target/debug` or `target/release`, under
/// `$CARGO_TARGET_DIR` when set), after building every lambda of `sonic-lambdas` in it
/// (`synthetic`, `sonic-hostile`, the applications, `sonic-launcher`...) with the same profile.
///
/// # Panics
/// When cargo cannot be run or the build fails: the tests that call it need the lambdas.
pub fn lambda_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // A test binary is `<target>/<profile>/deps/<name>`.
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("a test binary under <target>/<profile>/deps")
            .to_path_buf();
        let target = dir.parent().expect("<target>").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = std::process::Command::new(&cargo);
        cmd.args(["build", "-p", "sonic-lambdas", "--bins"])
            .current_dir(workspace())
            .env("CARGO_TARGET_DIR", &target);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cargo} to build the lambdas: {e}"));
        assert!(
            status.success(),
            "`cargo build -p sonic-lambdas --bins` failed"
        );
        for bin in ["synthetic", "sonic-hostile"] {
            assert!(
                dir.join(bin).is_file(),
                "{} missing after building the lambdas",
                dir.join(bin).display()
            );
        }
        dir
    })
}

/// Whether this run is CI's (`CI` set and not `0` or `false`; `.ci/run` sets it): there a test
/// whose dependency is missing (Docker, an image, the browser) fails, saying what to install.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}
