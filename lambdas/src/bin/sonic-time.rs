//! `sonic-time`: runs a command and reports its wall time, CPU time and peak memory, like
//! `/usr/bin/time`, as JSON ([`sonic_lambdas::local::Usage`]).
//!
//! ```text
//! sonic-time --report FILE -- PROGRAM [ARGS...]
//! ```
//!
//! The command inherits the environment, folder and standard streams; the report is written
//! atomically to FILE; the exit status is the command's (128 + N for signal N). The local executor
//! starts every lambda through it, because a child's peak RSS on Linux includes the size of the
//! process it was forked from, and this one is small (see `Usage`).

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use sonic_lambdas::local::run_measured;

fn usage() -> ExitCode {
    eprintln!("usage: sonic-time --report FILE -- PROGRAM [ARGS...]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (report, command) = match args.as_slice() {
        [flag, file, sep, command @ ..]
            if flag == "--report" && sep == "--" && !command.is_empty() =>
        {
            (PathBuf::from(file), command)
        }
        _ => return usage(),
    };
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    let measured = match run_measured(&mut cmd, None) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("sonic-time: cannot run {:?}: {e}", command[0]);
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let temp = report.with_extension("tmp");
    let written = serde_json::to_vec(&measured)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&temp, json))
        .and_then(|()| std::fs::rename(&temp, &report));
    if let Err(e) = written {
        eprintln!("sonic-time: cannot write {}: {e}", report.display());
        return ExitCode::from(125);
    }
    ExitCode::from(measured.shell_status())
}
