//! Keeps a warm container alive and starts lambdas in it on request, for the Docker sandbox.
//!
//! The container's main command (under `docker-init`, which reaps orphans and turns SIGTERM into an
//! exit). Starting a process from here takes about a millisecond, where `docker exec` takes tens;
//! that is what makes a hot start hot. The protocol is in `sonic_lambda::launcher`: run names
//! arrive one a line on the `requests` FIFO of the control folder; each run's request, log and
//! report live next to it. Runs are handled one at a time: the sandbox gives a container one
//! instance at a time.
//!
//! ```text
//! sonic-launcher [--ctl DIR]     # DIR defaults to /sonic/ctl
//! ```

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use sonic_lambda::launcher::{self, Report, Request};
use sonic_lambda::process;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ctl = match args.as_slice() {
        [] => PathBuf::from(launcher::CTL_DIR),
        [flag, dir] if flag == "--ctl" => PathBuf::from(dir),
        _ => {
            eprintln!("usage: sonic-launcher [--ctl DIR]");
            return ExitCode::from(2);
        }
    };
    let requests = ctl.join(launcher::REQUESTS);
    // Read and write: with a writer always open (us), reading never sees end-of-file when the
    // sandbox closes its end, so the launcher just waits for the next request.
    let fifo = match OpenOptions::new().read(true).write(true).open(&requests) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sonic-launcher: cannot open {}: {e}", requests.display());
            return ExitCode::from(1);
        }
    };
    for line in BufReader::new(fifo).lines() {
        let run = match line {
            Ok(line) => line.trim().to_string(),
            Err(e) => {
                eprintln!("sonic-launcher: reading {}: {e}", requests.display());
                return ExitCode::from(1);
            }
        };
        if run.is_empty() {
            continue;
        }
        if run.contains('/') || run.starts_with('.') {
            eprintln!("sonic-launcher: ignoring invalid run name {run:?}");
            continue;
        }
        let report = start_and_wait(&ctl, &run);
        send_report(&ctl, &run, &report);
    }
    ExitCode::SUCCESS
}

fn start_and_wait(ctl: &Path, run: &str) -> Report {
    let request = match read_request(&ctl.join(launcher::request_file(run))) {
        Ok(r) => r,
        Err(e) => return failed(format!("bad request for run {run}: {e}"), 126),
    };
    let Some((program, args)) = request.cmd.split_first() else {
        return failed("empty command".to_string(), 126);
    };
    let log_path = ctl.join(launcher::log_file(run));
    let log = match OpenOptions::new().create(true).append(true).open(&log_path) {
        Ok(f) => f,
        Err(e) => return failed(format!("cannot open {}: {e}", log_path.display()), 126),
    };
    let log2 = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return failed(format!("cannot share the log file: {e}"), 126),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&request.cwd)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own group, so that whatever it leaves behind can be killed with it.
        .process_group(0);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // What a shell would say: 127 not found, 126 found but not executable.
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return failed(format!("cannot start {program:?}: {e}"), code);
        }
    };
    let spawned = unix_ns();
    let mut report = match reap(child.id()) {
        Ok(r) => r,
        Err(e) => failed(format!("waiting for {program:?}: {e}"), 126),
    };
    report.spawned_unix_ns = spawned;
    report
}

fn read_request(path: &Path) -> Result<Request, String> {
    let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn failed(error: String, code: i32) -> Report {
    Report {
        error: Some(error),
        error_exit_code: Some(code),
        ..Report::default()
    }
}

fn unix_ns() -> Option<u64> {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(d.as_nanos()).ok()
}

fn send_report(ctl: &Path, run: &str, report: &Report) {
    let done = ctl.join(launcher::done_fifo(run));
    let line = match serde_json::to_string(report) {
        Ok(s) => s + "\n",
        Err(e) => {
            eprintln!("sonic-launcher: cannot encode the report of {run}: {e}");
            return;
        }
    };
    // Non-blocking: if the sandbox stopped listening there is nobody to tell, and blocking here
    // would wedge the container.
    let written = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&done)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "sonic-launcher: cannot report run {run} to {}: {e}",
            done.display()
        );
    }
}

/// Waits for the child to end, kills what is left of its process group, then reaps it with its
/// resource usage.
fn reap(pid: u32) -> io::Result<Report> {
    process::wait_exited(pid)?;
    // The group is the zombie's until it is reaped below.
    process::kill_group(pid);
    let r = process::reap(pid)?;
    Ok(Report {
        max_rss_kib: Some(r.max_rss_kib),
        exit_code: r.exit_code,
        signal: r.signal,
        ..Report::default()
    })
}
