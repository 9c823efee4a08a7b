//! HTTPS for the daemons (rustls through axum-server) and HTTP clients that verify a private CA
//! (`deploy/certs.sh` makes one for a cluster). Without a certificate a daemon serves plain HTTP,
//! for loopback development, and says so in its log.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum::serve::ListenerExt as _;
use axum_server::tls_rustls::RustlsConfig;
use serde::{Deserialize, Serialize};

/// A server's certificate (PEM, the chain after the leaf) and private key (PEM).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("TLS certificate {cert} / key {key}: {message}")]
    Server {
        cert: String,
        key: String,
        message: String,
    },
    #[error("CA file {path}: {message}")]
    Ca { path: String, message: String },
    #[error("HTTP client: {0}")]
    Client(String),
}

impl TlsFiles {
    /// Both halves, or neither: a certificate without its key (or the reverse) is an error.
    pub fn pair(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, crate::ConfigError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
            (None, None) => Ok(None),
            _ => Err(crate::ConfigError::Invalid(
                "tls: give both the certificate and its key (tls.cert and tls.key)".into(),
            )),
        }
    }

    /// Reads and checks the certificate and key: a daemon refuses to start on a bad pair rather
    /// than failing every handshake later.
    pub async fn load(&self) -> Result<RustlsConfig, TlsError> {
        RustlsConfig::from_pem_file(&self.cert, &self.key)
            .await
            .map_err(|e| TlsError::Server {
                cert: self.cert.display().to_string(),
                key: self.key.display().to_string(),
                message: e.to_string(),
            })
    }
}

/// `https` with TLS, else `http`.
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// How long requests in flight may finish after a shutdown begins. Long-lived requests (a job's
/// event stream) would otherwise hold a stopping daemon until its supervisor kills it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` completes, over TLS when `tls` is given; then
/// lets requests in flight finish for at most [`SHUTDOWN_GRACE`] and closes the rest.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<RustlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => {
            let (stopping_tx, stopping) = tokio::sync::oneshot::channel::<()>();
            // TCP_NODELAY on every connection: an event stream writes small frames one after
            // another, and with Nagle's algorithm each waited for the previous one's delayed
            // acknowledgement (up to 40 ms on Linux) when the peer had nothing to send.
            let listener = listener.tap_io(|stream| {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
                }
            });
            // The peer's address reaches the handlers (`ConnectInfo<SocketAddr>`): the
            // dashboard counts failed logins per address.
            let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
            let server = axum::serve(listener, app).with_graceful_shutdown(async move {
                shutdown.await;
                let _ = stopping_tx.send(());
            });
            let grace_over = async move {
                if stopping.await.is_ok() {
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                served = server => served,
                () = grace_over => {
                    tracing::warn!(
                        grace_s = SHUTDOWN_GRACE.as_secs(),
                        "requests still open after the shutdown grace: closed"
                    );
                    Ok(())
                }
            }
        }
        Some(config) => {
            let handle = axum_server::Handle::new();
            let stopper = handle.clone();
            tokio::spawn(async move {
                shutdown.await;
                stopper.graceful_shutdown(Some(SHUTDOWN_GRACE));
            });
            let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(config)
                .acceptor(axum_server::accept::NoDelayAcceptor::new());
            axum_server::from_tcp(listener.into_std()?)?
                .acceptor(acceptor)
                .handle(handle)
                .serve(app.into_make_service_with_connect_info::<std::net::SocketAddr>())
                .await
        }
    }
}

/// Logs how a daemon serves: HTTPS with its certificate, or plain HTTP (development only).
pub fn log_transport(daemon: &str, addr: std::net::SocketAddr, tls: Option<&TlsFiles>) {
    match tls {
        Some(t) => tracing::info!(%addr, cert = %t.cert.display(), "{daemon} serves HTTPS"),
        None => tracing::warn!(
            %addr,
            "{daemon} serves plain HTTP (no TLS certificate configured): for loopback development \
             only; give tls.cert and tls.key (SONIC_TLS_CERT, SONIC_TLS_KEY) anywhere else"
        ),
    }
}

/// The certificates of a CA file (PEM, one or more).
pub fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| TlsError::Ca {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::Ca {
            path: path.display().to_string(),
            message: "no PEM certificate in it".into(),
        });
    }
    Ok(certs)
}

/// An HTTP client builder that, given a CA file, trusts that CA and nothing else (a cluster's
/// private CA); without one, the system's roots.
pub fn client_builder(ca_file: Option<&Path>) -> Result<reqwest::ClientBuilder, TlsError> {
    let builder = reqwest::Client::builder();
    Ok(match ca_file {
        Some(path) => builder.tls_certs_only(read_ca(path)?),
        None => builder,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_schemes() {
        assert_eq!(TlsFiles::pair(None, None).expect("none"), None);
        assert!(TlsFiles::pair(Some("c.pem".into()), None).is_err());
        assert!(TlsFiles::pair(None, Some("k.pem".into())).is_err());
        assert!(
            TlsFiles::pair(Some("c".into()), Some("k".into()))
                .expect("pair")
                .is_some()
        );
        assert_eq!(scheme(true), "https");
        assert_eq!(scheme(false), "http");
    }

    #[tokio::test]
    async fn bad_files_are_refused_with_their_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let files = TlsFiles {
            cert: junk.clone(),
            key: junk.clone(),
        };
        let err = files.load().await.expect_err("junk refused");
        assert!(err.to_string().contains("junk.pem"), "{err}");
        let err = read_ca(&junk).expect_err("junk CA refused");
        assert!(err.to_string().contains("junk.pem"), "{err}");
        assert!(read_ca(&dir.path().join("missing.pem")).is_err());
    }

    // On a paused clock (time is not what this tests: the grace is waited out at once, in
    // order, every party in this runtime).
    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_ends_does_not_hold_the_shutdown() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let app = Router::new().route(
            "/stream",
            axum::routing::get(|| async {
                // A body that never ends, like a job's event stream.
                axum::body::Body::from_stream(futures::stream::pending::<
                    Result<axum::body::Bytes, std::io::Error>,
                >())
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, None, async {
            let _ = rx.await;
        }));
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        client
            .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut head = [0u8; 12];
        client.read_exact(&mut head).await.expect("headers");
        assert_eq!(&head, b"HTTP/1.1 200");
        let _ = tx.send(());
        // The server ends although the stream is still open (a generous deadline, not a timing).
        tokio::time::timeout(SHUTDOWN_GRACE * 6, server)
            .await
            .expect("the server stops after the grace")
            .expect("task")
            .expect("served");
    }
}
