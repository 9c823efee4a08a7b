//! Waiting for a child process and reaping it with what it used, the one way the agent's
//! process sandbox, the container launcher and the local executor do it (Linux, through libc).
//!
//! The child leads its own process group. [`wait_exited`] blocks until it has ended but leaves
//! it a zombie, so that its pid, and the id of the group it led, cannot be given to another
//! process: the caller can then kill what is left of the group ([`kill_group`]) without hitting
//! a stranger, and [`reap`] it with its resource usage.
#![allow(unsafe_code)]

use std::io;

/// How a reaped child ended and what it used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reaped {
    /// Its exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its peak resident memory, KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
    /// CPU seconds in user mode.
    pub user_s: f64,
    /// CPU seconds in the kernel.
    pub sys_s: f64,
}

fn pid_t(pid: u32) -> io::Result<libc::pid_t> {
    libc::pid_t::try_from(pid).map_err(io::Error::other)
}

/// Blocks until child `pid` has ended, leaving it a zombie until [`reap`] (its pid and its
/// process group's id stay its own). Retries when a signal interrupts the wait.
pub fn wait_exited(pid: u32) -> io::Result<()> {
    let pid = pid_t(pid)?;
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid and writable during the call. WNOWAIT leaves the child a
        // zombie.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reaps child `pid` with its resource usage (blocks until it ends if it has not).
pub fn reap(pid: u32) -> io::Result<Reaped> {
    let pid = pid_t(pid)?;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid and writable during the call.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let mut reaped = Reaped {
        // ru_maxrss is in KiB on Linux.
        max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        user_s: secs(usage.ru_utime),
        sys_s: secs(usage.ru_stime),
        ..Reaped::default()
    };
    if libc::WIFEXITED(status) {
        reaped.exit_code = Some(libc::WEXITSTATUS(status));
    } else if libc::WIFSIGNALED(status) {
        reaped.signal = Some(libc::WTERMSIG(status));
    }
    Ok(reaped)
}

/// Sends SIGKILL to process group `pgid` (never to group 0 or 1). The caller makes sure the
/// group's leader is not reaped yet, so the id still names that group; ESRCH (nothing left in
/// it) is fine.
pub fn kill_group(pgid: u32) {
    let Ok(pgid) = pid_t(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// A child that exits 3 is reaped with that status; one that is killed, with the signal;
    /// a group's background process dies with `kill_group`.
    #[test]
    #[allow(clippy::zombie_processes)] // reaped by `reap`, which is what is tested
    fn a_child_is_waited_for_then_reaped_with_how_it_ended() {
        let child = Command::new("sh")
            .args(["-c", "exit 3"])
            .process_group(0)
            .spawn()
            .expect("spawn");
        wait_exited(child.id()).expect("wait");
        let r = reap(child.id()).expect("reap");
        assert_eq!((r.exit_code, r.signal), (Some(3), None));

        let child = Command::new("sh")
            .args(["-c", "sleep 60 & wait"])
            .process_group(0)
            .spawn()
            .expect("spawn");
        kill_group(child.id());
        wait_exited(child.id()).expect("wait");
        let r = reap(child.id()).expect("reap");
        assert_eq!((r.exit_code, r.signal), (None, Some(libc::SIGKILL)));
        assert!(reap(child.id()).is_err(), "reaped once");
    }
}
