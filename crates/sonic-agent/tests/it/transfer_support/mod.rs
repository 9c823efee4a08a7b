//! Shared fixtures of the `transfer_*` tests: an "agent" (namespace, limiters, meter and its file
//! server on 127.0.0.1:0), tokens, deterministic contents, a raw HTTP client that sends a request
//! target byte for byte, and a proxy that cuts or corrupts the file server's answers.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::RANGE;
use axum::response::Response;
use futures::StreamExt;
use sonic_agent::files::{FileMeta, FilePath, FileStore, JobId};
use sonic_agent::fileserver::{self, FileServerState};
use sonic_agent::throttle::{AgentThrottle, BandwidthMeter};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

pub const KEY: &[u8] = b"test-file-key-0123456789abcdef";
pub const JOB: &str = "j-test";

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A token for `(JOB, path)` valid for an hour.
pub fn token(path: &str) -> String {
    sonic_api::token::issue(KEY, JOB, path, now() + 3600)
}

pub fn job() -> JobId {
    JobId::parse(JOB).expect("job id")
}

pub fn fpath(p: &str) -> FilePath {
    FilePath::parse(p).expect("file path")
}

/// `len` pseudo-random bytes from `seed` (xorshift; fast enough for MiBs in a property test).
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// One agent's data plane: its own data dir, limiters, meter and file server.
pub struct TestAgent {
    pub dir: TempDir,
    pub files: FileStore,
    pub throttle: AgentThrottle,
    pub meter: BandwidthMeter,
    pub addr: SocketAddr,
    pub url: String,
}

impl TestAgent {
    pub async fn start(throttle: AgentThrottle) -> TestAgent {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = FileStore::open(dir.path()).expect("file store");
        let meter = BandwidthMeter::default();
        let (addr, _server) = fileserver::spawn_standalone(
            "127.0.0.1:0".parse().expect("addr"),
            state(&files, &throttle, &meter),
        )
        .await
        .expect("serve");
        TestAgent {
            url: format!("http://{addr}"),
            dir,
            files,
            throttle,
            meter,
            addr,
        }
    }

    pub fn router(&self) -> Router {
        fileserver::router(state(&self.files, &self.throttle, &self.meter))
    }

    /// Writes and registers `(JOB, path)`.
    pub fn put(&self, path: &str, content: &[u8]) -> FileMeta {
        self.files
            .write_atomic(&job(), &fpath(path), content)
            .expect("write")
    }
}

fn state(files: &FileStore, throttle: &AgentThrottle, meter: &BandwidthMeter) -> FileServerState {
    FileServerState {
        files: files.clone(),
        key: KEY.to_vec(),
        throttle: throttle.storage_throttle(),
        meter: meter.clone(),
    }
}

/// A raw HTTP/1.1 answer.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Sends `GET <target>` exactly as given (no client-side normalization of `..` or `%2e`).
pub async fn raw_get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> RawResponse {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    RawResponse {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    }
}

/// What the proxy does to one answer.
#[derive(Debug, Clone, Copy)]
pub enum Mischief {
    /// Sends `n` bytes of the body, then breaks the connection.
    CutAfter(usize),
    /// Flips the body's first byte.
    Corrupt,
}

/// A proxy in front of a real file server: answers pass through, except that the n-th answer
/// suffers `plan[n]` (when the plan has that many entries). Records each request's `Range` header.
pub struct Proxy {
    pub url: String,
    pub ranges: Arc<Mutex<Vec<Option<String>>>>,
}

pub async fn proxy(inner: Router, plan: Vec<Option<Mischief>>) -> Proxy {
    let plan = Arc::new(Mutex::new(VecDeque::from(plan)));
    let ranges = Arc::new(Mutex::new(Vec::new()));
    let seen = ranges.clone();
    let app = Router::new().fallback(move |req: Request| {
        let inner = inner.clone();
        let plan = plan.clone();
        let seen = seen.clone();
        async move {
            let range = req
                .headers()
                .get(RANGE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            seen.lock().expect("lock").push(range);
            let mischief = plan.lock().expect("lock").pop_front().flatten();
            let resp = inner.oneshot(req).await.expect("infallible");
            match mischief {
                None => resp,
                Some(m) => spoil(resp, m),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    Proxy {
        url: format!("http://{addr}"),
        ranges,
    }
}

fn spoil(resp: Response, mischief: Mischief) -> Response {
    let (parts, body) = resp.into_parts();
    let mut stream = body.into_data_stream();
    let spoiled = async_stream(
        move |tx: tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>| async move {
            let mut sent = 0usize;
            let mut first = true;
            while let Some(chunk) = stream.next().await {
                let Ok(chunk) = chunk else { break };
                let chunk = match mischief {
                    Mischief::CutAfter(n) => {
                        let room = n - sent;
                        if chunk.len() >= room {
                            let _ = tx.send(Ok(chunk.slice(..room))).await;
                            let _ = tx
                                .send(Err(std::io::Error::other("connection cut by the test")))
                                .await;
                            return;
                        }
                        chunk
                    }
                    Mischief::Corrupt if first && !chunk.is_empty() => {
                        let mut v = chunk.to_vec();
                        v[0] ^= 0xff;
                        bytes::Bytes::from(v)
                    }
                    Mischief::Corrupt => chunk,
                };
                first = false;
                sent += chunk.len();
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(spoiled))
}

/// A stream fed by a task (the test's stand-in for an `async_stream!` macro).
fn async_stream<F, Fut>(
    f: F,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Files under `dir` whose name starts with the temporary prefix (left-overs of a failed write).
pub fn temp_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if e.file_type().expect("type").is_dir() {
                stack.push(p);
            } else if e
                .file_name()
                .to_string_lossy()
                .starts_with(sonic_agent::files::TEMP_PREFIX)
            {
                out.push(p);
            }
        }
    }
    out
}
