//! The agent's file server for `direct` passing: `GET /v1/files/{job}/{*path}` streams a registered
//! file to a peer agent that holds a token for it, through the agent's egress limiter, with resume
//! (`Range: bytes=N-`).
//!
//! Responses carry `Content-Length`, `Accept-Ranges: bytes`, the whole file's checksum
//! (`x-sonic-checksum`) and size (`x-sonic-size`); partial ones add `Content-Range`. Refusals are JSON
//! `{"error": "..."}` with 400 (bad job id, path or encoding), 403 (missing, bad, expired or
//! out-of-scope token; a symlink in the namespace), 404 (no such registered file), 409 (the file
//! changed since it was registered), 416 (range past the end); nothing internal is ever in the body.
//!
//! The file is read by a blocking thread into chunks handed to the response body without copying,
//! a few chunks ahead: memory per stream is bounded, and the file is never whole in memory. The
//! chunks' buffers come back to a small per-stream pool when the socket is done with them, so a
//! stream allocates (and page-faults) a handful of buffers, not one per chunk.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use sonic_daemon::routes::RouteTable;
use tokio::sync::mpsc;

use crate::files::{FileError, FilePath, FileStore, JobId};
use crate::server::{Guard, RouteInfo};
use crate::throttle::{BandwidthMeter, Direction};
use crate::transfer::{CHECKSUM_HEADER, SIZE_HEADER, TOKEN_HEADER};

/// Bytes read from disk and handed to the socket at once.
const CHUNK: usize = 512 * 1024;
/// Chunks read ahead of the socket per stream.
const READ_AHEAD: usize = 4;

/// What the file server needs.
#[derive(Clone)]
pub struct FileServerState {
    /// The agent's namespace; only registered files are served.
    pub files: FileStore,
    /// The secret that file tokens are signed with (shared with the control plane).
    pub key: Vec<u8>,
    /// The agent's limiters: responses go through `egress`.
    pub throttle: sonic_storage::Throttle,
    /// Gets an egress sample per completed response.
    pub meter: BandwidthMeter,
}

impl std::fmt::Debug for FileServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("FileServerState")
            .field("files", &self.files)
            .field("throttle", &self.throttle)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

/// The file server's routes, with their state: merge them into the agent's router
/// (`agent_router.merge(fileserver::router(state))`). They carry their own authorization (file
/// tokens), so they go outside any control-plane token layer.
pub fn router(state: FileServerState) -> Router {
    // Every route is a file route: its handler checks the file token.
    table()
        .router(|_, routes| routes)
        .with_state(Arc::new(state))
}

/// The file server's routes, each once with its handler.
fn table() -> RouteTable<Arc<FileServerState>, Guard> {
    RouteTable::new().route(
        Method::GET,
        "/v1/files/{job}/{*path}",
        Guard::FileToken,
        get_file,
    )
}

/// The file server's routes (all [`Guard::FileToken`]).
pub fn routes() -> Vec<RouteInfo> {
    table().routes()
}

/// Binds `addr` and serves only the file server's routes in a background task (for tests, benches
/// and tools); returns the bound address.
pub async fn spawn_standalone(
    addr: std::net::SocketAddr,
    state: FileServerState,
) -> io::Result<(
    std::net::SocketAddr,
    tokio::task::JoinHandle<io::Result<()>>,
)> {
    let listener = sonic_daemon::net::bind(addr)?;
    let local = listener.local_addr()?;
    let app = router(state);
    let handle = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((local, handle))
}

/// A refusal, mapped to a status and a public message in one place.
#[derive(Debug)]
enum ServeError {
    BadRequest(String),
    Forbidden,
    NotFound,
    Changed,
    RangeNotSatisfiable(u64),
    Internal,
}

impl From<FileError> for ServeError {
    fn from(e: FileError) -> Self {
        match e {
            // These messages are fixed strings about the request itself, safe to return.
            FileError::InvalidJob(_) | FileError::InvalidPath(_) => Self::BadRequest(e.to_string()),
            FileError::Escape => Self::Forbidden,
            FileError::NotFound | FileError::Conflict => Self::NotFound,
            FileError::Changed => Self::Changed,
            FileError::CrossDevice | FileError::Io(_) => {
                tracing::error!(error = %e, "file server i/o error");
                Self::Internal
            }
        }
    }
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let (status, message) = match &self {
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, m.as_str()),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound => (StatusCode::NOT_FOUND, "file not found"),
            Self::Changed => (StatusCode::CONFLICT, "file changed since it was registered"),
            Self::RangeNotSatisfiable(_) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable")
            }
            Self::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
        };
        let mut resp =
            (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
        if let Self::RangeNotSatisfiable(size) = self
            && let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}"))
        {
            resp.headers_mut().insert(CONTENT_RANGE, v);
        }
        resp
    }
}

#[derive(Debug, Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

async fn get_file(
    State(state): State<Arc<FileServerState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<TokenQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ServeError> {
    let Path((raw_job, raw_path)) =
        path.map_err(|_| ServeError::BadRequest("invalid path encoding".to_owned()))?;
    let job = JobId::parse(&raw_job)?;
    let file_path = FilePath::parse(&raw_path)?;
    let token = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| query.ok().and_then(|Query(q)| q.token))
        .ok_or(ServeError::Forbidden)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    if let Err(e) =
        sonic_api::token::verify(&state.key, &token, job.as_str(), file_path.as_str(), now)
    {
        tracing::info!(job = %job, path = %file_path, reason = %e, "file request refused");
        return Err(ServeError::Forbidden);
    }

    let files = state.files.clone();
    let (job2, path2) = (job.clone(), file_path.clone());
    let opened = tokio::task::spawn_blocking(move || files.open_read(&job2, &path2))
        .await
        .map_err(|_| ServeError::Internal)?;
    let opened = match opened {
        Ok(o) => o,
        Err(e) => {
            if matches!(e, FileError::Escape) {
                tracing::warn!(job = %job, path = %file_path, "refused a path leaving the namespace");
            }
            return Err(e.into());
        }
    };
    let size = opened.meta.size;
    let range = headers
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range);
    let (start, end) = match range {
        None => (0, size),
        Some((start, last)) => {
            if start >= size {
                return Err(ServeError::RangeNotSatisfiable(size));
            }
            let end = last.map_or(size, |l| l.saturating_add(1).min(size));
            if end <= start {
                return Err(ServeError::RangeNotSatisfiable(size));
            }
            (start, end)
        }
    };
    let len = end - start;
    tracing::debug!(job = %job, path = %file_path, start, len, "serving file");

    let body = Body::from_stream(file_stream(
        opened.file,
        start,
        len,
        state.throttle.egress.clone(),
        state.meter.clone(),
    ));
    let mut resp = Response::new(body);
    *resp.status_mut() = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(SIZE_HEADER, HeaderValue::from(size));
    let checksum =
        HeaderValue::from_str(&opened.meta.checksum).map_err(|_| ServeError::Internal)?;
    h.insert(CHECKSUM_HEADER, checksum);
    if range.is_some() {
        let v = format!("bytes {start}-{}/{size}", end - 1);
        h.insert(
            CONTENT_RANGE,
            HeaderValue::from_str(&v).map_err(|_| ServeError::Internal)?,
        );
    }
    Ok(resp)
}

/// `bytes=N-` or `bytes=N-M` (a single range; anything else is ignored, as RFC 9110 allows).
/// Returns the first byte and the last one, if given.
fn parse_range(value: &str) -> Option<(u64, Option<u64>)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last = match last.trim() {
        "" => None,
        l => {
            let l: u64 = l.parse().ok()?;
            if l < first {
                return None;
            }
            Some(l)
        }
    };
    Some((first, last))
}

/// The body of a response: `len` bytes of `file` from `start`, read ahead by a blocking thread and
/// released to the socket through the egress limiter. Records an egress sample when the last byte
/// is handed over.
fn file_stream(
    mut file: std::fs::File,
    start: u64,
    len: u64,
    egress: crate::throttle::Limiter,
    meter: BandwidthMeter,
) -> impl futures::Stream<Item = io::Result<Bytes>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = file.seek(SeekFrom::Start(start)) {
            let _ = tx.blocking_send(Err(e));
            return;
        }
        let pool = Arc::new(Pool::default());
        let cap = (CHUNK as u64).min(len) as usize;
        let mut left = len;
        while left > 0 {
            let n = (CHUNK as u64).min(left) as usize;
            let mut buf = pool.take().unwrap_or_else(|| vec![0u8; cap]);
            if let Err(e) = file.read_exact(&mut buf[..n]) {
                // Truncated under us: the client sees a cut transfer and resumes or restarts.
                let _ = tx.blocking_send(Err(e));
                return;
            }
            left -= n as u64;
            let chunk = Bytes::from_owner(Pooled {
                buf,
                len: n,
                pool: pool.clone(),
            });
            if tx.blocking_send(Ok(chunk)).is_err() {
                // The client went away.
                return;
            }
        }
    });
    let state = (rx, egress, meter, 0u64, Instant::now());
    futures::stream::unfold(
        state,
        move |(mut rx, egress, meter, mut sent, t0)| async move {
            let item = rx.recv().await?;
            if let Ok(chunk) = &item {
                egress.consume(chunk.len()).await;
                sent += chunk.len() as u64;
                if sent == len {
                    meter.record(Direction::Egress, sent, t0.elapsed().as_secs_f64());
                }
            }
            Some((item, (rx, egress, meter, sent, t0)))
        },
    )
}

/// Buffers of one stream, back from the socket and ready for the next read.
#[derive(Default)]
struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl Pool {
    fn take(&self) -> Option<Vec<u8>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
    }
}

/// A chunk of a pooled buffer: returns the buffer to its pool when the last `Bytes` of it drops.
struct Pooled {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self
            .pool
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // More than the read-ahead never waits in the pool at once; the bound is a safety net.
        if free.len() < 2 * READ_AHEAD {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let check =
            |v: &str, want: Option<(u64, Option<u64>)>| assert_eq!(parse_range(v), want, "{v}");
        check("bytes=0-", Some((0, None)));
        check("bytes=100-", Some((100, None)));
        check("bytes=5-9", Some((5, Some(9))));
        check("bytes=9-5", None);
        check("bytes=-5", None);
        check("bytes=0-1,4-5", None);
        check("items=0-", None);
        check("bytes=x-", None);
    }
}
