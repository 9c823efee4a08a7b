//! Listening sockets with room for a burst of connections.
//!
//! `tokio::net::TcpListener::bind` listens with a backlog of 128 (the standard library's): when
//! more connections arrive at once than the daemon has accepted yet, the kernel drops the rest
//! of the handshakes (`ListenOverflows` in `nstat`), and those clients wait for TCP's
//! retransmission timers (200 ms for data, 1 s for a SYN) before being served. 500 concurrent
//! job submissions did (docs/load.md, "Where a burst of submissions spends its time").

use std::io;
use std::net::SocketAddr;

/// The accept queue asked for; Linux caps it at `net.core.somaxconn` (4,096 by default since
/// 5.4).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` (with `SO_REUSEADDR`, as the standard library does) and listens with a backlog
/// of [`LISTEN_BACKLOG`]. Must be called inside a Tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
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

    use super::bind;

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
