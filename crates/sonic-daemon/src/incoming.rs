//! Connections a server has accepted whose first bytes have not come yet: requests on their
//! way. The control plane holds a burst's job executions while submissions are being handled;
//! a connection the client has opened but not yet written to (a client starved of CPU on a
//! busy machine connects, then writes a little later) is a submission that has not begun, and
//! counts as coming for a short while ([`Incoming::new`]'s `window`).
//!
//! [`serve`](crate::serve) wraps every accepted connection in [`Watched`] when given an
//! [`Incoming`]: pending from its accept until its first read returns (bytes, its end, or an
//! error) or the window passes, whichever is first.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Sleep;

/// The connections accepted whose first bytes have not come (within their window).
#[derive(Debug)]
pub struct Incoming {
    pending: AtomicUsize,
    window: Duration,
    settled: Notify,
}

impl Incoming {
    /// A connection counts as pending for at most `window` after its accept (one that is
    /// opened and never written to, a speculative preconnect, stops counting then).
    pub fn new(window: Duration) -> Incoming {
        Incoming {
            pending: AtomicUsize::new(0),
            window,
            settled: Notify::new(),
        }
    }

    /// How many accepted connections are waiting for their first bytes.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Woken (every waiter) when the last pending connection stops pending. Enable the future
    /// before reading [`Incoming::pending`] so that none is missed in between.
    pub fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// Wraps a connection just accepted: pending until its first read returns or the window
    /// passes.
    pub fn watch<I>(self: &Arc<Self>, io: I) -> Watched<I> {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Watched {
            inner: io,
            pending: Some(Pending {
                incoming: self.clone(),
                expiry: Box::pin(tokio::time::sleep(self.window)),
            }),
        }
    }
}

/// A pending connection's place in [`Incoming::pending`]; dropping it ends it.
#[derive(Debug)]
struct Pending {
    incoming: Arc<Incoming>,
    expiry: Pin<Box<Sleep>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.incoming.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.incoming.settled.notify_waiters();
        }
    }
}

/// An accepted connection, pending in its [`Incoming`] until its first read returns.
#[derive(Debug)]
pub struct Watched<I> {
    inner: I,
    pending: Option<Pending>,
}

impl<I> Watched<I> {
    /// The connection.
    pub fn get_ref(&self) -> &I {
        &self.inner
    }

    /// Whether it still counts as pending.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The window's timer wakes the reader too (the server reads a new connection at once),
        // so a connection that stays silent stops pending when it passes.
        if let Some(p) = self.pending.as_mut()
            && p.expiry.as_mut().poll(cx).is_ready()
        {
            self.pending = None;
        }
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if read.is_ready() {
            self.pending = None;
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A listener whose connections are [`Watched`] (axum's `serve`).
pub struct WatchedListener<L> {
    inner: L,
    incoming: Arc<Incoming>,
}

impl<L> WatchedListener<L> {
    /// Watches every connection `inner` accepts in `incoming`.
    pub fn new(inner: L, incoming: Arc<Incoming>) -> WatchedListener<L> {
        WatchedListener { inner, incoming }
    }
}

impl<L> axum::serve::Listener for WatchedListener<L>
where
    L: axum::serve::Listener,
    L::Io: Unpin,
{
    type Io = Watched<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (self.incoming.watch(io), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An acceptor whose connections are [`Watched`] before `inner` takes them (axum-server's
/// TLS: the first read is the TLS handshake's, so a connection stops pending at its
/// ClientHello).
#[derive(Clone)]
pub struct WatchedAcceptor<A> {
    inner: A,
    incoming: Arc<Incoming>,
}

impl<A> WatchedAcceptor<A> {
    /// Watches every connection in `incoming`, then hands it to `inner`.
    pub fn new(inner: A, incoming: Arc<Incoming>) -> WatchedAcceptor<A> {
        WatchedAcceptor { inner, incoming }
    }
}

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for WatchedAcceptor<A>
where
    A: axum_server::accept::Accept<Watched<tokio::net::TcpStream>, S>,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = A::Future;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        self.inner.accept(self.incoming.watch(stream), service)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_connection_pends_until_its_first_bytes() {
        let incoming = Arc::new(Incoming::new(Duration::from_secs(60)));
        let (client, server) = tokio::io::duplex(64);
        let mut server = incoming.watch(server);
        let mut client = client;
        assert_eq!(incoming.pending(), 1);
        let settled = incoming.settled();
        tokio::pin!(settled);
        settled.as_mut().enable();
        client.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 3];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"GET");
        assert!(!server.is_pending());
        assert_eq!(incoming.pending(), 0);
        settled.await;
        // Writing back goes through.
        server.write_all(b"ok").await.unwrap();
        let mut back = [0u8; 2];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ok");
    }

    #[tokio::test]
    async fn a_silent_connection_stops_pending_after_its_window_and_a_dropped_one_at_once() {
        let incoming = Arc::new(Incoming::new(Duration::from_millis(20)));
        let (_client, server) = tokio::io::duplex(64);
        let mut server = incoming.watch(server);
        let (_other, dropped) = tokio::io::duplex(64);
        let dropped = incoming.watch(dropped);
        assert_eq!(incoming.pending(), 2);
        drop(dropped);
        assert_eq!(incoming.pending(), 1);
        // The reader waits; the window passes and the connection stops pending while the read
        // is still waiting for bytes.
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                tokio::select! {
                    _ = server.read(&mut buf) => unreachable!("nothing was written"),
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
                if incoming.pending() == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(read.is_ok(), "still pending: {}", incoming.pending());
    }
}
