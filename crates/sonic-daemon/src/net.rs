//! Listening sockets with room for a burst of connections.
//!
//! `tokio::net::TcpListener::bind` listens with a backlog of 128 (the standard library's): when
//! more connections arrive at once than the daemon has accepted yet, the kernel drops the rest
//! of the handshakes (`ListenOverflows` in `nstat`), and those clients wait for TCP's
//! retransmission timers (200 ms for data, 1 s for a SYN) before being served. 500 concurrent
//! job submissions did (docs/load.md, "Where a burst of submissions spends its time").
//!
//! A process's table of file descriptors starts with room for 64 and doubles when full; in a
//! process with more than one thread, each doubling waits for an RCU grace period
//! (`expand_fdtable` in the kernel's `fs/file.c`), during which every thread that opens a
//! descriptor (accepts a connection, opens a file, spawns a lambda's pipes) waits too: 7 to 17
//! ms per doubling on an idle machine here, more on a busy one. A daemon's first burst of
//! connections paid for 64 -> 128 -> ... -> 1,024 in the middle of the burst; later ones
//! did not (the table never shrinks). So the first listener a process binds grows the table
//! once, to [`DESCRIPTOR_TABLE`] (or the open-files limit, if lower), before any connection
//! arrives (docs/load.md, "The descriptor table, grown before the first burst").

use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;

/// The accept queue asked for; Linux caps it at `net.core.somaxconn` (4,096 by default since
/// 5.4).
pub const LISTEN_BACKLOG: u32 = 4096;

/// The descriptors a daemon's table holds from its first listener on (64 KiB of kernel memory
/// for the table's pointers): a burst of a few thousand connections, files and lambda pipes
/// opens no more than it without the table growing.
pub const DESCRIPTOR_TABLE: u64 = 8192;

/// Grows this process's descriptor table to hold [`DESCRIPTOR_TABLE`] descriptors (fewer when
/// the open-files limit is lower), once per process; later calls do nothing. The table is
/// grown by duplicating a descriptor of `/dev/null` onto the table's last slot and closing both
/// at once: no descriptor stays open. Returns the size it grew the table to, or 0 when it did
/// not (the limit too low, the slot in use, or no `/dev/null`), which is not an error: the
/// table then grows as it used to.
#[allow(unsafe_code)]
pub fn reserve_descriptors() -> u64 {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    static RESERVED: OnceLock<u64> = OnceLock::new();
    *RESERVED.get_or_init(|| {
        // SAFETY: getrlimit writes into a local, zeroed struct.
        let soft = unsafe {
            let mut limit: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return 0;
            }
            limit.rlim_cur as u64
        };
        let want = DESCRIPTOR_TABLE.min(soft);
        let Ok(last) = libc::c_int::try_from(want.saturating_sub(1)) else {
            return 0;
        };
        let Ok(null) = std::fs::File::open("/dev/null") else {
            return 0;
        };
        // SAFETY: fcntl(F_GETFD) only reads the slot's flags. A slot that is free now cannot
        // be taken by another thread before the dup2 (descriptors are handed out lowest first:
        // every lower one would have to be open), so dup2 closes nothing of anyone's; the
        // descriptor it returns is new and owned here.
        unsafe {
            if last < 3 || libc::fcntl(last, libc::F_GETFD) != -1 {
                // Too low a limit to matter, or the slot is in use (the table is that large).
                return 0;
            }
            let fd = libc::dup2(null.as_raw_fd(), last);
            if fd != last {
                return 0;
            }
            drop(OwnedFd::from_raw_fd(fd));
        }
        want
    })
}

/// Binds `addr` (with `SO_REUSEADDR`, as the standard library does) and listens with a backlog
/// of [`LISTEN_BACKLOG`]; the process's descriptor table is grown first
/// ([`reserve_descriptors`]). Must be called inside a Tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    reserve_descriptors();
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{DESCRIPTOR_TABLE, bind, reserve_descriptors};

    /// The soft open-files limit, from `/proc/self/limits`.
    fn open_files_limit() -> u64 {
        let limits = std::fs::read_to_string("/proc/self/limits").expect("limits");
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("Max open files");
        line.split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .expect("a number")
    }

    /// `FDSize` in `/proc/self/status`: how many descriptors the table holds now.
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("FDSize")
    }

    /// A daemon's first listener grows its descriptor table at once to what a burst needs (a
    /// table that grows during the burst stalls every thread opening a descriptor, once per
    /// doubling), and leaves no descriptor open doing so.
    #[tokio::test]
    async fn binding_grows_the_descriptor_table_before_the_first_connection() {
        let want = DESCRIPTOR_TABLE.min(open_files_limit());
        let _listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        assert!(
            table_size() >= want,
            "FDSize {} after binding, {want} wanted",
            table_size()
        );
        // Whichever test of this process bound first grew it; this call only reads the size.
        assert_eq!(reserve_descriptors(), want);
        let slot = std::path::PathBuf::from(format!("/proc/self/fd/{}", want - 1));
        assert!(!slot.exists(), "{} stayed open", slot.display());
    }

    /// More clients than the standard backlog connect before the daemon accepts any: every
    /// handshake completes (with a backlog of 128, the SYNs past it are dropped while nobody
    /// accepts, and those connects never complete), then every connection is accepted.
    #[tokio::test]
    async fn a_burst_of_connections_waits_in_the_accept_queue() {
        let n = 300;
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok());
        if cap.is_some_and(|c| c < n) {
            eprintln!("net.core.somaxconn is {cap:?}, under {n}: this kernel caps the backlog");
            return;
        }
        let listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..n {
            connects.spawn(async move {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    tokio::net::TcpStream::connect(addr),
                )
                .await
            });
        }
        let mut clients = Vec::new();
        while let Some(r) = connects.join_next().await {
            let stream = r
                .expect("task")
                .expect("the handshake completed without an accept")
                .expect("connect");
            clients.push(stream);
        }
        for _ in 0..n {
            listener.accept().await.expect("accept");
        }
        assert_eq!(clients.len(), n);
    }
}
