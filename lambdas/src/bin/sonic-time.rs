//! `sonic-time`: runs a command and reports its wall time, CPU time and peak memory, like
//! `/usr/bin/time`, as JSON ([`sonic_lambdas::local::Usage`], read by the local executor and by
//! the agent's process sandbox).
//!
//! ```text
//! sonic-time --report FILE [--fsize BYTES] [--cgroup DIR] -- PROGRAM [ARGS...]
//! ```
//!
//! The command inherits the environment, folder, process group and standard streams; the report
//! is written atomically to FILE; the exit status is the command's (128 + N for signal N).
//!
//! - `--fsize BYTES`: the command starts with `RLIMIT_FSIZE` at BYTES (soft and hard): no file it
//!   writes grows past it (`SIGXFSZ`). This process itself is not limited (its report is written
//!   whatever the limit).
//! - `--cgroup DIR`: the command joins the cgroup v1 directory DIR (e.g. a memory group) between
//!   its fork and its exec, so everything the program touches is charged there and this process
//!   stays outside. It joins by writing `0` to `DIR/tasks` from the (single-threaded) forked
//!   child: a thread moving itself skips the kernel's cgroup-wide threadgroup lock, which a write
//!   to `cgroup.procs` takes (11 to 19 ms each, waiting for an RCU grace period; 0.04 ms this
//!   way, docs/load.md).
//!
//! Why a process in between: a child's peak RSS on Linux includes the size of the process it was
//! forked from, and this one is small (see `Usage`). And the agent, a large multi-threaded
//! process, starts this one with `posix_spawn` (no work between fork and exec there), so the
//! work that must happen between fork and exec (the limit, the cgroup) happens in this small
//! process's fork instead.

use std::fs::OpenOptions;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use sonic_lambdas::local::run_measured;

fn usage() -> ExitCode {
    eprintln!(
        "usage: sonic-time --report FILE [--fsize BYTES] [--cgroup DIR] -- PROGRAM [ARGS...]"
    );
    ExitCode::from(2)
}

/// The parsed command line.
struct Args {
    report: PathBuf,
    fsize: Option<u64>,
    cgroup: Option<PathBuf>,
    command: Vec<String>,
}

fn parse(args: &[String]) -> Option<Args> {
    let mut report = None;
    let mut fsize = None;
    let mut cgroup = None;
    let mut it = args.iter();
    loop {
        match it.next()?.as_str() {
            "--report" => report = Some(PathBuf::from(it.next()?)),
            "--fsize" => fsize = Some(it.next()?.parse().ok()?),
            "--cgroup" => cgroup = Some(PathBuf::from(it.next()?)),
            "--" => break,
            _ => return None,
        }
    }
    let command: Vec<String> = it.cloned().collect();
    if command.is_empty() {
        return None;
    }
    Some(Args {
        report: report?,
        fsize,
        cgroup,
        command,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(args) = parse(&args) else {
        return usage();
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    // Opened here, written by the child: an error is reported before anything starts.
    let tasks = match &args.cgroup {
        Some(dir) => {
            let path = dir.join("tasks");
            match OpenOptions::new().write(true).open(&path) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("sonic-time: cannot join the cgroup {}: {e}", dir.display());
                    return ExitCode::from(125);
                }
            }
        }
        None => None,
    };
    if tasks.is_some() || args.fsize.is_some() {
        before_exec(&mut cmd, tasks.as_ref().map(|f| f.as_raw_fd()), args.fsize);
    }
    let measured = run_measured(&mut cmd, None);
    drop(cmd);
    drop(tasks);
    let measured = match measured {
        Ok(u) => u,
        Err(e) => {
            eprintln!("sonic-time: cannot run {:?}: {e}", args.command[0]);
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let temp = args.report.with_extension("tmp");
    let written = serde_json::to_vec(&measured)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&temp, json))
        .and_then(|()| std::fs::rename(&temp, &args.report));
    if let Err(e) = written {
        eprintln!("sonic-time: cannot write {}: {e}", args.report.display());
        return ExitCode::from(125);
    }
    ExitCode::from(measured.shell_status())
}

/// Makes the command's child join the cgroup whose `tasks` file is open as `tasks_fd` and set
/// `RLIMIT_FSIZE` to `fsize`, between fork and exec.
#[allow(unsafe_code)]
fn before_exec(cmd: &mut Command, tasks_fd: Option<i32>, fsize: Option<u64>) {
    let limit = fsize.map(|bytes| libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    });
    // SAFETY: the closure runs in the forked child (this process has one thread) before exec and
    // calls only write(2) and setrlimit(2), both async-signal-safe, on values copied into it and
    // a static buffer; the descriptor stays open until `spawn` returns (it is close-on-exec).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = tasks_fd {
                // "0": the writing thread, which is the whole (single-threaded) child.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(limit) = &limit
                && libc::setrlimit(libc::RLIMIT_FSIZE, limit) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
