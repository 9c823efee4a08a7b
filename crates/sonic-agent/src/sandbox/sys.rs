//! The few system calls the sandboxes need that std does not offer: FIFOs and joining a cgroup
//! between fork and exec; waiting with resource usage and killing a process group come from
//! `sonic_lambda::process`, shared with the launcher and the local executor.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::RawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use sonic_lambda::process;

/// How a reaped process ended, and its peak resident set size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reaped {
    /// Exit status when it exited.
    pub exit_code: Option<i32>,
    /// Signal number when a signal killed it.
    pub signal: Option<i32>,
    /// `ru_maxrss` in bytes: the peak RSS of the process and the children it waited for.
    pub max_rss_bytes: u64,
}

/// A child process group that is killed when this is dropped, unless its leader was reaped: the
/// lock makes "not reaped yet" and "kill" one step, so a reused pid is never hit.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pid: u32,
    reaped: Arc<Mutex<bool>>,
}

impl GroupGuard {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            reaped: Arc::new(Mutex::new(false)),
        }
    }

    /// Kills the group if its leader is not reaped yet.
    pub fn kill(&self) {
        let reaped = self.reaped.lock().map(|r| *r).unwrap_or(true);
        if !reaped {
            kill_group(self.pid);
        }
    }

    /// What blocks until the leader ends, kills what is left of its group, then reaps the
    /// leader with its resource usage (for a blocking thread).
    pub fn waiter(&self) -> impl FnOnce() -> io::Result<Reaped> + Send + 'static {
        let (pid, reaped) = (self.pid, self.reaped.clone());
        move || wait_kill_group_reap(pid, &reaped)
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // The run was abandoned before its end (or it ended, and this does nothing).
        self.kill();
    }
}

/// Blocks until child `pid` ends, kills what is left of its process group (its leader being
/// `pid`), then reaps it with its resource usage, setting `reaped` under its lock.
fn wait_kill_group_reap(pid: u32, reaped_flag: &Mutex<bool>) -> io::Result<Reaped> {
    process::wait_exited(pid)?;
    // Background processes the lambda left would outlive the run otherwise.
    kill_group(pid);
    // Held until the leader is reaped: a `GroupGuard::kill` either comes before (the pid is still
    // the zombie's) or sees `true`.
    let mut reaped_flag = reaped_flag
        .lock()
        .map_err(|_| io::Error::other("reap lock poisoned"))?;
    let r = process::reap(pid)?;
    *reaped_flag = true;
    Ok(Reaped {
        exit_code: r.exit_code,
        signal: r.signal,
        max_rss_bytes: r.max_rss_kib * 1024,
    })
}

/// Sends SIGKILL to process group `pgid`. Callers make sure the group's leader is not yet reaped
/// (or is alive), so the id still names that group.
pub(crate) use sonic_lambda::process::kill_group;

/// Sends SIGKILL to process `pid` (a member of a cgroup being emptied).
pub(crate) fn kill_pid(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 1 {
        return;
    }
    // SAFETY: kill takes no pointers; the process may have exited already (ESRCH).
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Creates a FIFO at `path` (mode 0600).
pub(crate) fn mkfifo(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes `cmd` start with `RLIMIT_FSIZE` at `bytes` (soft and hard): no file it writes can grow
/// past it (a write beyond gets `SIGXFSZ`, or `EFBIG` when that signal is ignored).
pub(crate) fn limit_file_size_before_exec(cmd: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit(2), which
    // is async-signal-safe, on a value copied into the closure; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
}

/// Makes `cmd` move itself into the cgroup whose `tasks` file is open as `tasks_fd`, after the
/// fork and before the exec, so that every page the lambda touches is charged to that cgroup.
/// The forked child has one thread, so moving that thread (`0` to `tasks`) moves the process,
/// without the kernel's cgroup-wide lock that a write to `cgroup.procs` takes. The caller keeps
/// the file open until `spawn` returns. Used only without `sonic-time`, which does this itself.
pub(crate) fn join_cgroup_before_exec(cmd: &mut std::process::Command, tasks_fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls write(2), which is
    // async-signal-safe, on a descriptor that stays open until exec (it is close-on-exec), with
    // a static buffer; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            // "0": the writing thread, the child's only one.
            let r = libc::write(tasks_fd, b"0".as_ptr().cast(), 1);
            if r == 1 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
}

#[cfg(test)]
// The children are reaped by `GroupGuard::wait`, which clippy cannot see.
#[allow(clippy::zombie_processes)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[test]
    fn reaps_exit_code_signal_and_rss() {
        let child = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        let r = GroupGuard::new(child.id()).waiter()().unwrap();
        assert_eq!((r.exit_code, r.signal), (Some(7), None));
        assert!(r.max_rss_bytes > 0);

        let child = Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .process_group(0)
            .spawn()
            .unwrap();
        let r = GroupGuard::new(child.id()).waiter()().unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    }

    #[test]
    fn dropping_the_guard_kills_an_unfinished_group() {
        let child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let guard = GroupGuard::new(child.id());
        let wait = guard.waiter();
        drop(guard);
        let r = wait().unwrap();
        assert_eq!(r.signal, Some(9));
    }

    #[test]
    fn leftovers_of_the_group_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The shell leaves a background sleeper in its group and exits at once.
        let script = format!("sleep 30 & echo $! > {}; exit 0", pidfile.display());
        let child = Command::new("sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap();
        let r = GroupGuard::new(child.id()).waiter()().unwrap();
        assert_eq!(r.exit_code, Some(0));
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The sleeper was killed; it is a zombie until init reaps it, or gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(") ").next().map(|r| r.chars().next()));
            match state {
                None | Some(Some('Z')) | Some(Some('X')) => break,
                _ if std::time::Instant::now() > deadline => panic!("sleeper {pid} survived"),
                _ => std::thread::yield_now(),
            }
        }
    }

    #[test]
    fn fifo_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        mkfifo(&p).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&p).unwrap().file_type().is_fifo());
        assert!(mkfifo(&p).is_err());
    }
}
