//! Moving a file to this agent: `direct` (stream it from the peer agent's file server, resuming an
//! interrupted transfer) and `remote` (through the object store), each reporting [`TransferStats`]
//! and feeding the agent's [`BandwidthMeter`].
//!
//! A direct fetch is a pipeline of two threads: the async task receives chunks from the socket
//! (through the agent's ingress limiter) and hands them, without copying, to a blocking writer that
//! hashes (xxh3-64) and writes them into a temporary file beside the destination. When the last byte
//! is in and the checksum matches the peer's `x-sonic-checksum`, the file is renamed into place:
//! a reader sees the whole file or nothing.

use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use serde::{Deserialize, Serialize};
use sonic_storage::{ObjectStore, StoreError};
use tokio::sync::{mpsc, oneshot};
use xxhash_rust::xxh3::Xxh3Default;

use crate::files::{FileError, checksum_hex, checksum_reader, create_temp_beside};
use crate::throttle::{BandwidthMeter, Direction};
use sonic_storage::Throttle;

/// Header carrying a file-access token (see `sonic_api::token`); the query parameter `token` is
/// accepted too.
pub const TOKEN_HEADER: &str = "x-sonic-token";
/// Header carrying the whole file's xxh3-64 checksum (16 hex digits), on full and partial responses.
pub const CHECKSUM_HEADER: &str = "x-sonic-checksum";
/// Header carrying the whole file's size, on full and partial responses.
pub const SIZE_HEADER: &str = "x-sonic-size";

/// Network chunks are gathered (by reference, not copied) until this many bytes, then written with
/// one vectored write.
const WRITE_BATCH: usize = 1 << 20;
/// Chunks queued between the network task and the writer thread (bounded memory per transfer).
const WRITE_QUEUE: usize = 16;
/// Most bytes of an error body kept for the error message.
const MAX_ERROR_BODY: usize = 4096;

/// What one transfer did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferStats {
    /// Size of the file moved.
    pub bytes: u64,
    /// Wall time of the whole operation, retries and verification included.
    pub seconds: f64,
    /// xxh3-64 of the content, 16 hex digits (as in `FileMeta::checksum`).
    pub checksum: String,
    /// Requests made (1 when nothing went wrong).
    pub attempts: u32,
}

impl TransferStats {
    /// Bytes per second over the whole operation.
    pub fn bytes_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Errors of a transfer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The peer refused the request for good (bad token, no such file, ...): retrying cannot help.
    #[error("peer refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    /// The content never matched the expected checksum, even after starting over.
    #[error("checksum mismatch: expected {expected}, got {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    /// Every allowed attempt failed; `last` says how the last one did.
    #[error("transfer failed after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: String },
    /// The peer answered something this client cannot use.
    #[error("peer protocol error: {0}")]
    Protocol(String),
    #[error("invalid peer url: {0}")]
    Url(String),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("local i/o: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How hard a direct fetch tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed requests in a row that made no progress before giving up (the first try included).
    pub max_attempts: u32,
    /// Upper bound on all requests of one fetch, progress or not.
    pub max_requests: u32,
    /// Times a complete download whose checksum does not match is started over from zero.
    pub checksum_restarts: u32,
    /// Wait before the first retry; doubles after every failure without progress.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            max_requests: 100,
            checksum_restarts: 1,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, failures_in_a_row: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures_in_a_row.saturating_sub(1));
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// Where a direct fetch reads from: a peer agent's file server and a token for the file.
#[derive(Debug, Clone, Copy)]
pub struct DirectSource<'a> {
    /// The peer agent's base URL, e.g. `http://10.0.0.7:7100` (the file server's routes are under it).
    pub peer_url: &'a str,
    pub job: &'a str,
    pub path: &'a str,
    pub token: &'a str,
}

/// An HTTP client suited to agent-to-agent transfers: no proxy from the environment (peers are on
/// the private network), Nagle off, bounded connect time, and a read timeout that catches a
/// stalled peer without bounding a long transfer. Build one per agent and share it.
pub fn http_client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, TransferError> {
    sonic_daemon::tls::client_builder(ca_file)
        .map_err(|e| TransferError::Protocol(e.to_string()))?
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| TransferError::Protocol(format!("http client: {e}")))
}

/// The URL of `(job, path)` on a peer's file server: `<peer>/v1/files/<job>/<path>`, each segment
/// percent-encoded.
pub fn file_url(peer_url: &str, job: &str, path: &str) -> Result<reqwest::Url, TransferError> {
    let mut url = reqwest::Url::parse(peer_url).map_err(|e| TransferError::Url(e.to_string()))?;
    {
        let mut segs = url
            .path_segments_mut()
            .map_err(|()| TransferError::Url(format!("{peer_url} cannot be a base")))?;
        segs.pop_if_empty().extend(["v1", "files", job]);
        segs.extend(path.split('/'));
    }
    Ok(url)
}

enum WriteCmd {
    Data(Bytes),
    /// Start over: truncate the file and the hash.
    Reset,
    /// Flush and report `(bytes, checksum)` so far; the writer stays alive for a possible restart.
    Finish(oneshot::Sender<io::Result<(u64, String)>>),
}

/// The blocking half of a fetch: hashes and writes, in order, what the network half sends it.
struct Writer {
    tx: Option<mpsc::Sender<WriteCmd>>,
    handle: tokio::task::JoinHandle<io::Result<()>>,
}

impl Writer {
    fn spawn(file: std::fs::File) -> Self {
        let (tx, mut rx) = mpsc::channel::<WriteCmd>(WRITE_QUEUE);
        let handle = tokio::task::spawn_blocking(move || -> io::Result<()> {
            let mut out = file;
            let mut batch = Batch::default();
            let mut hasher = Xxh3Default::new();
            let mut written = 0u64;
            while let Some(cmd) = rx.blocking_recv() {
                match cmd {
                    WriteCmd::Data(chunk) => {
                        hasher.update(&chunk);
                        written += chunk.len() as u64;
                        batch.push(chunk);
                        if batch.bytes >= WRITE_BATCH {
                            batch.write_to(&mut out)?;
                        }
                    }
                    WriteCmd::Reset => {
                        batch.chunks.clear();
                        batch.bytes = 0;
                        out.set_len(0)?;
                        out.seek(SeekFrom::Start(0))?;
                        hasher.reset();
                        written = 0;
                    }
                    WriteCmd::Finish(reply) => {
                        let state = batch
                            .write_to(&mut out)
                            .map(|()| (written, checksum_hex(hasher.digest())));
                        let _ = reply.send(state);
                    }
                }
            }
            batch.write_to(&mut out)
        });
        Self {
            tx: Some(tx),
            handle,
        }
    }

    async fn send(&mut self, cmd: WriteCmd) -> Result<(), TransferError> {
        let sent = match &self.tx {
            Some(tx) => tx.send(cmd).await.is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            // The writer stopped: its own error says why.
            Err(self
                .stop()
                .await
                .err()
                .unwrap_or_else(|| TransferError::Io(io::Error::other("file writer stopped"))))
        }
    }

    async fn finish(&mut self) -> Result<(u64, String), TransferError> {
        let (reply, rx) = oneshot::channel();
        self.send(WriteCmd::Finish(reply)).await?;
        match rx.await {
            Ok(state) => Ok(state?),
            Err(_) => Err(self
                .stop()
                .await
                .err()
                .unwrap_or_else(|| TransferError::Io(io::Error::other("file writer stopped")))),
        }
    }

    /// Closes the queue and waits for the writer to flush and exit.
    async fn stop(&mut self) -> Result<(), TransferError> {
        self.tx = None;
        match (&mut self.handle).await {
            Ok(result) => Ok(result?),
            Err(e) => Err(TransferError::Io(io::Error::other(format!(
                "file writer: {e}"
            )))),
        }
    }
}

/// Chunks received and not yet written.
#[derive(Default)]
struct Batch {
    chunks: Vec<Bytes>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push(chunk);
    }

    /// Writes every chunk with as few vectored writes as the kernel allows, then empties the batch.
    fn write_to(&mut self, out: &mut std::fs::File) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = self.chunks.iter().map(|c| IoSlice::new(c)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            match out.write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        drop(slices);
        self.chunks.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// The peer's description of the file, from the headers of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Remote {
    size: u64,
    checksum: String,
}

/// How one request ended, short of success.
enum Attempt {
    /// Worth retrying (from wherever the file now is).
    Retry(String),
    /// Not worth retrying.
    Fatal(TransferError),
}

/// `direct`: fetches `(job, path)` from the file server at `peer_url` with `token` into `dest`,
/// with the default [`RetryPolicy`]. `throttle` is the agent's limiter pair (its ingress limits the
/// stream; `None` is unlimited); the bandwidth obtained goes to `meter` as an ingress sample. See
/// [`fetch_direct_with`] for the details.
#[allow(clippy::too_many_arguments)] // mirrors the edge's description one field at a time
pub async fn fetch_direct(
    http: &reqwest::Client,
    peer_url: &str,
    job: &str,
    path: &str,
    token: &str,
    dest: &Path,
    throttle: Option<&Throttle>,
    meter: &BandwidthMeter,
) -> Result<TransferStats, TransferError> {
    let src = DirectSource {
        peer_url,
        job,
        path,
        token,
    };
    fetch_direct_with(http, &src, dest, throttle, meter, &RetryPolicy::default()).await
}

/// `direct`: fetches `(job, path)` from a peer agent's file server into `dest`.
///
/// Streams into a temporary file beside `dest` through the agent's ingress limiter, hashing as it
/// goes; on an interrupted transfer, retries with `Range: bytes=<have>-` after a backoff (bounded by
/// `retry`); when the peer's file changed in between (another checksum or size), or the complete file
/// does not match its checksum, starts over from zero (a mismatch at most
/// `retry.checksum_restarts` times, then [`TransferError::ChecksumMismatch`]). On success the file is
/// renamed onto `dest` (atomic; replaces an earlier `dest`) and `meter` gets an ingress sample
/// (bytes over the time spent in requests, backoff excluded). `dest`'s folder must already exist
/// (see `FileStore::prepare_write`); register the file afterwards with
/// `FileStore::register_verified(job, path, stats.bytes, &stats.checksum)`, which does not read it
/// again. On failure nothing is left behind.
pub async fn fetch_direct_with(
    http: &reqwest::Client,
    src: &DirectSource<'_>,
    dest: &Path,
    throttle: Option<&Throttle>,
    meter: &BandwidthMeter,
    retry: &RetryPolicy,
) -> Result<TransferStats, TransferError> {
    let started = Instant::now();
    let url = file_url(src.peer_url, src.job, src.path)?;
    let (file, tmp) = create_temp_beside(dest)?;
    let mut writer = Writer::spawn(file);
    let mut fetch = Fetch {
        http,
        url,
        token: src.token,
        ingress: throttle.map(|t| &t.ingress),
        writer: &mut writer,
        received: 0,
        remote: None,
        streaming: Duration::ZERO,
        streamed_bytes: 0,
    };
    let outcome = fetch.run(retry).await;
    let (streaming, streamed_bytes) = (fetch.streaming, fetch.streamed_bytes);
    let stopped = writer.stop().await;
    let result = match (outcome, stopped) {
        (Ok(done), Ok(())) => rename_into_place(&tmp, dest).await.map(|()| done),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    };
    match result {
        Ok((remote, attempts)) => {
            let stats = TransferStats {
                bytes: remote.size,
                seconds: started.elapsed().as_secs_f64(),
                checksum: remote.checksum,
                attempts,
            };
            meter.record(Direction::Ingress, streamed_bytes, streaming.as_secs_f64());
            tracing::info!(url = %src.peer_url, job = src.job, path = src.path,
                bytes = stats.bytes, seconds = stats.seconds, attempts, "direct fetch done");
            Ok(stats)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            tracing::warn!(url = %src.peer_url, job = src.job, path = src.path, error = %e,
                "direct fetch failed");
            Err(e)
        }
    }
}

/// Chunk of a [`charge_own_copy`]: small enough that the charge shares the limiters with the
/// agent's other streams chunk by chunk, as a real transfer does.
const OWN_COPY_CHUNK: usize = 64 * 1024;

/// `direct`, when the file is already on this agent because this agent wrote it: the network copy
/// the model prices (`F / BW`) is charged to this agent's NIC as if it had fetched the file from a
/// peer. A peer fetch passes the sender's egress limiter (its file server) and the receiver's
/// ingress limiter, chunk by chunk in a pipeline; sender and receiver are this VM here, so every
/// chunk passes both of its limiters at once, and the charge takes what the fetch would (the
/// slower direction bounds it) and slows the agent's other streams as the fetch would. No bytes
/// move, no request is made, and the [`BandwidthMeter`] gets no sample: its rate would be the
/// limiter's setting, not a measurement of the network. Returns whether anything was charged
/// (`false` when neither direction is limited: no emulated bandwidth, nothing to emulate).
pub async fn charge_own_copy(throttle: &Throttle, bytes: u64) -> bool {
    if throttle.egress.speed_limit().is_infinite() && throttle.ingress.speed_limit().is_infinite() {
        return false;
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(OWN_COPY_CHUNK as u64) as usize;
        tokio::join!(throttle.egress.consume(n), throttle.ingress.consume(n));
        left -= n as u64;
    }
    true
}

async fn rename_into_place(tmp: &Path, dest: &Path) -> Result<(), TransferError> {
    tokio::fs::rename(tmp, dest).await?;
    Ok(())
}

struct Fetch<'a> {
    http: &'a reqwest::Client,
    url: reqwest::Url,
    token: &'a str,
    ingress: Option<&'a crate::throttle::Limiter>,
    writer: &'a mut Writer,
    /// Bytes handed to the writer since the last reset: where a resume starts.
    received: u64,
    /// What the peer said the file is, once it said it.
    remote: Option<Remote>,
    /// Time spent inside requests, for the meter (backoff excluded).
    streaming: Duration,
    streamed_bytes: u64,
}

impl Fetch<'_> {
    async fn run(&mut self, retry: &RetryPolicy) -> Result<(Remote, u32), TransferError> {
        let mut requests = 0u32;
        let mut failures_in_a_row = 0u32;
        let mut restarts = 0u32;
        loop {
            if let Some(remote) = self.remote.clone().filter(|r| r.size == self.received) {
                let (written, actual) = self.writer.finish().await?;
                if written == remote.size && actual == remote.checksum {
                    return Ok((remote, requests));
                }
                tracing::warn!(url = %self.url, expected = %remote.checksum, %actual,
                    "checksum mismatch, starting over");
                if restarts >= retry.checksum_restarts {
                    return Err(TransferError::ChecksumMismatch {
                        expected: remote.checksum,
                        actual,
                    });
                }
                restarts += 1;
                self.reset().await?;
                continue;
            }
            if requests >= retry.max_requests {
                return Err(TransferError::Exhausted {
                    attempts: requests,
                    last: "too many requests".to_owned(),
                });
            }
            requests += 1;
            let before = self.received;
            let t0 = Instant::now();
            let attempt = self.attempt().await;
            self.streaming += t0.elapsed();
            match attempt {
                Ok(()) => failures_in_a_row = 0,
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(why)) => {
                    if self.received > before {
                        failures_in_a_row = 0;
                    }
                    failures_in_a_row += 1;
                    if failures_in_a_row >= retry.max_attempts {
                        return Err(TransferError::Exhausted {
                            attempts: requests,
                            last: why,
                        });
                    }
                    let wait = retry.backoff(failures_in_a_row);
                    tracing::info!(url = %self.url, have = self.received, attempt = requests,
                        error = %why, wait_ms = wait.as_millis() as u64, "direct fetch interrupted, retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn reset(&mut self) -> Result<(), TransferError> {
        self.writer.send(WriteCmd::Reset).await?;
        self.received = 0;
        Ok(())
    }

    /// One request: asks for what is missing and streams it into the writer.
    async fn attempt(&mut self) -> Result<(), Attempt> {
        let mut req = self
            .http
            .get(self.url.clone())
            .header(TOKEN_HEADER, self.token);
        let offset = self.received;
        if offset > 0 {
            req = req.header(RANGE, format!("bytes={offset}-"));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Attempt::Retry(format!("request: {e}")))?;
        let status = resp.status();
        match status {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT => {}
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // The file shrank under us: only a fresh start makes sense.
                self.remote = None;
                self.reset().await.map_err(Attempt::Fatal)?;
                return Err(Attempt::Retry("range not satisfiable".to_owned()));
            }
            s if s.is_server_error()
                || s == StatusCode::REQUEST_TIMEOUT
                || s == StatusCode::CONFLICT
                || s == StatusCode::TOO_MANY_REQUESTS =>
            {
                return Err(Attempt::Retry(format!(
                    "{s}: {}",
                    error_message(resp).await
                )));
            }
            s => {
                return Err(Attempt::Fatal(TransferError::Refused {
                    status: s.as_u16(),
                    message: error_message(resp).await,
                }));
            }
        }
        let remote = describe(&resp).map_err(Attempt::Fatal)?;
        if self.remote.as_ref().is_some_and(|known| *known != remote) {
            tracing::info!(url = %self.url, "file changed on the peer, starting over");
            self.remote = Some(remote);
            self.reset().await.map_err(Attempt::Fatal)?;
            return Err(Attempt::Retry("file changed on the peer".to_owned()));
        }
        self.remote = Some(remote.clone());
        let start = if status == StatusCode::PARTIAL_CONTENT {
            let start = content_range_start(&resp, remote.size).map_err(Attempt::Fatal)?;
            if start != offset {
                return Err(Attempt::Fatal(TransferError::Protocol(format!(
                    "asked for bytes from {offset}, got from {start}"
                ))));
            }
            start
        } else {
            // A full answer (the peer ignored the range, or there was none): start over.
            if offset > 0 {
                self.reset().await.map_err(Attempt::Fatal)?;
            }
            0
        };
        let expected_len = remote.size - start;
        if resp.content_length().is_some_and(|n| n != expected_len) {
            return Err(Attempt::Fatal(TransferError::Protocol(
                "content-length disagrees with the file size".to_owned(),
            )));
        }
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Attempt::Retry(format!("body: {e}")))?;
            if self.received + chunk.len() as u64 > remote.size {
                return Err(Attempt::Fatal(TransferError::Protocol(
                    "peer sent more bytes than the file has".to_owned(),
                )));
            }
            if let Some(ingress) = self.ingress {
                ingress.consume(chunk.len()).await;
            }
            self.received += chunk.len() as u64;
            self.streamed_bytes += chunk.len() as u64;
            self.writer
                .send(WriteCmd::Data(chunk))
                .await
                .map_err(Attempt::Fatal)?;
        }
        if self.received < remote.size {
            return Err(Attempt::Retry("body ended early".to_owned()));
        }
        Ok(())
    }
}

fn header_str(resp: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> Option<&str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn describe(resp: &reqwest::Response) -> Result<Remote, TransferError> {
    let checksum = header_str(resp, CHECKSUM_HEADER)
        .filter(|c| c.len() == 16 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| TransferError::Protocol(format!("missing or bad {CHECKSUM_HEADER}")))?
        .to_ascii_lowercase();
    let size = header_str(resp, SIZE_HEADER)
        .or_else(|| {
            // A full answer's length is the size; a partial one must carry the size header.
            (resp.status() == StatusCode::OK)
                .then(|| header_str(resp, CONTENT_LENGTH))
                .flatten()
        })
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| TransferError::Protocol(format!("missing or bad {SIZE_HEADER}")))?;
    Ok(Remote { size, checksum })
}

/// The first byte of a `Content-Range: bytes <start>-<end>/<size>` that must end at the file's end.
fn content_range_start(resp: &reqwest::Response, size: u64) -> Result<u64, TransferError> {
    let bad = || TransferError::Protocol("missing or bad content-range".to_owned());
    let value = header_str(resp, CONTENT_RANGE).ok_or_else(bad)?;
    let rest = value.strip_prefix("bytes ").ok_or_else(bad)?;
    let (range, total) = rest.split_once('/').ok_or_else(bad)?;
    let (start, end) = range.split_once('-').ok_or_else(bad)?;
    let start: u64 = start.parse().map_err(|_| bad())?;
    let end: u64 = end.parse().map_err(|_| bad())?;
    let total: u64 = total.parse().map_err(|_| bad())?;
    if total != size || end + 1 != size || start > end {
        return Err(bad());
    }
    Ok(start)
}

/// The `error` field of a JSON error body, or a bounded prefix of the body.
async fn error_message(resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - body.len())]);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `remote`, sending half: uploads `local` as `key` (the store handles multipart and throttling),
/// hashing the file alongside (a second read, from the page cache). No bandwidth sample: an
/// upload's rate is bounded by the store's per-connection throughput and request latency as much
/// as by the VM's NIC, which the model counts apart (`min(BW, W)` and `L`, spec/model.md), so it
/// would drag the NIC estimate down to the store's.
pub async fn upload_remote(
    store: &dyn ObjectStore,
    key: &str,
    local: &Path,
) -> Result<TransferStats, TransferError> {
    let started = Instant::now();
    let path = local.to_owned();
    let hashing = tokio::task::spawn_blocking(move || checksum_reader(std::fs::File::open(path)?));
    let (put, hashed) = tokio::join!(
        async {
            let t0 = Instant::now();
            store.put_file(key, local).await.map(|n| (n, t0.elapsed()))
        },
        hashing
    );
    let (bytes, put_time) = put?;
    let (hashed_len, checksum) =
        hashed.map_err(|e| io::Error::other(format!("hashing: {e}")))??;
    if hashed_len != bytes {
        return Err(TransferError::Io(io::Error::other(
            "file changed while it was uploaded",
        )));
    }
    tracing::debug!(key, bytes, put_s = put_time.as_secs_f64(), "remote put");
    let stats = TransferStats {
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        checksum,
        attempts: 1,
    };
    tracing::info!(key, bytes, seconds = stats.seconds, "remote upload done");
    Ok(stats)
}

/// `remote`, receiving half: downloads `key` into a temporary file beside `dest` (the store
/// handles ranged GETs and throttling), hashes it, and renames it onto `dest`. Compare
/// `stats.checksum` with the sender's, then register the file with
/// `FileStore::register_verified(job, path, stats.bytes, &stats.checksum)` (no second read).
/// No bandwidth sample, as for [`upload_remote`].
pub async fn download_remote(
    store: &dyn ObjectStore,
    key: &str,
    dest: &Path,
) -> Result<TransferStats, TransferError> {
    let started = Instant::now();
    let (file, tmp) = create_temp_beside(dest)?;
    drop(file);
    let result = download_hashed(store, key, &tmp).await;
    let result = match result {
        Ok(done) => rename_into_place(&tmp, dest).await.map(|()| done),
        Err(e) => Err(e),
    };
    match result {
        Ok((bytes, checksum, get_time)) => {
            tracing::debug!(key, bytes, get_s = get_time.as_secs_f64(), "remote get");
            let stats = TransferStats {
                bytes,
                seconds: started.elapsed().as_secs_f64(),
                checksum,
                attempts: 1,
            };
            tracing::info!(key, bytes, seconds = stats.seconds, "remote download done");
            Ok(stats)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

async fn download_hashed(
    store: &dyn ObjectStore,
    key: &str,
    tmp: &Path,
) -> Result<(u64, String, Duration), TransferError> {
    let t0 = Instant::now();
    let bytes = store.get_file(key, tmp).await?;
    let get_time = t0.elapsed();
    let path: PathBuf = tmp.to_owned();
    let (len, checksum) =
        tokio::task::spawn_blocking(move || checksum_reader(std::fs::File::open(path)?))
            .await
            .map_err(|e| io::Error::other(format!("hashing: {e}")))??;
    if len != bytes {
        return Err(TransferError::Protocol(format!(
            "store reported {bytes} bytes, file has {len}"
        )));
    }
    Ok((bytes, checksum, get_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_encoded_per_segment() {
        let u = file_url("http://127.0.0.1:7100", "j-1", "pca/0/train/a b#?%.bin").expect("url");
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:7100/v1/files/j-1/pca/0/train/a%20b%23%3F%25.bin"
        );
        let u = file_url("http://h:1/agent/", "j", "x").expect("url");
        assert_eq!(u.as_str(), "http://h:1/agent/v1/files/j/x");
        assert!(file_url("not a url", "j", "x").is_err());
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(350));
        assert_eq!(p.backoff(60), Duration::from_millis(350));
    }
}
