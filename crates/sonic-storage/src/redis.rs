//! The memory tier: objects as string values on a Redis server (or a compatible one), each under
//! `<namespace>:<key>`, so several stores (and other users) share one server safely.
//!
//! An object is written with one `SET` and read with one `GET`, so a reader sees the whole value or
//! none; a download goes to a temporary file that is renamed into place, as with the other stores.
//! Listing and [`ObjectStore::delete_prefix`] walk the namespace with `SCAN MATCH`, the prefix
//! escaped so that `*`, `?`, `[`, `]` and `\` match themselves, a page of keys at a time.
//!
//! Sizes (of [`ObjectStore::head`] and listings) come from `STRLEN`, pipelined with `EXISTS` to
//! tell an empty object from a missing one. Not in a `MULTI` transaction: a server at `maxmemory`
//! refuses every command queued in one, and a full memory tier must still answer. So an object
//! created between the two commands may be reported empty once, and one deleted meanwhile is
//! left out. Values of other types under the namespace are not the store's and make listing fail.
//!
//! A memory tier runs out of room. When the server refuses a write because `maxmemory` is reached
//! (`OOM`), or the value is longer than its `proto-max-bulk-len` (asked at connect, so such a value
//! is refused before it is sent; asked again when a long write loses the connection, which is how a
//! server answers one over a limit lowered since), the error is [`StoreError::Full`]: not
//! retryable, and the object belongs in the object store instead. A server that cannot be reached
//! or does not answer in time gives [`StoreError::Unavailable`] naming the tier's URL (without
//! credentials).
//!
//! The connection is one [`::redis::aio::ConnectionManager`]: a multiplexed connection that is
//! re-established in the background after it breaks. Each command waits at most the connect timeout
//! plus the response timeout ([`RedisStore::with_timeouts`]; [`DEFAULT_CONNECT_TIMEOUT`] and
//! [`DEFAULT_RESPONSE_TIMEOUT`] otherwise), so a dead or stopped server makes calls fail instead of
//! hang. A command that finds its connection broken (the server restarted, or went away) is sent
//! once more on the connection the manager makes again: after a restart nobody saw, the next call
//! goes through; while the server is down, that second try fails too, and so may the first call
//! after it is back (it reports the last failed reconnection while starting a new one); later
//! calls go through. Wrap the store in [`crate::patient::Patient`] to ride out outages.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, ServerErrorKind};
use bytes::Bytes;

use crate::{ObjectInfo, ObjectStore, StoreError, fsutil, validate_key, validate_prefix};

/// The namespace Sonic's agents and control plane share on a memory tier: a job's files are
/// under `sonic:jobs/<job>/`.
pub const NAMESPACE: &str = "sonic";

/// How long one connection attempt may take, unless [`RedisStore::with_timeouts`] says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer one command (a large value included), unless
/// [`RedisStore::with_timeouts`] says otherwise.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Redis's default `proto-max-bulk-len`, assumed when the server does not tell (`CONFIG` renamed
/// or not permitted).
const DEFAULT_MAX_VALUE: u64 = 512 * 1024 * 1024;
/// The lowest `proto-max-bulk-len` a server accepts: shorter values never exceed it.
const MIN_MAX_VALUE: u64 = 1024 * 1024;
/// Keys asked for per `SCAN` call: a hint to the server, which may return more or fewer.
const SCAN_COUNT: usize = 1000;
/// Connection attempts after the first one before a reconnection gives up (the next command starts
/// another). Few, with short waits, so that calls fail fast while the server is down.
const RECONNECT_RETRIES: usize = 2;

/// An [`ObjectStore`] on a Redis server: the memory tier. See the module docs.
#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    conn: ConnectionManager,
    /// The server's URL without credentials, for messages.
    url: String,
    namespace: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The longest value the server accepts (`proto-max-bulk-len`), shared by the clones.
    max_value: Arc<AtomicU64>,
}

// Hand-written: the connection's own Debug would show the password of the URL.
impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("namespace", &self.namespace)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_value", &self.max_value_size())
            .finish()
    }
}

/// What a command was doing, for error messages.
struct Op<'a> {
    what: &'static str,
    key: &'a str,
    /// The size of the value written, for writes.
    size: Option<u64>,
}

impl<'a> Op<'a> {
    fn on(what: &'static str, key: &'a str) -> Op<'a> {
        Op {
            what,
            key,
            size: None,
        }
    }
}

impl fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)?;
        if !self.key.is_empty() {
            write!(f, " {:?}", self.key)?;
        }
        if let Some(size) = self.size {
            write!(f, " ({size} bytes)")?;
        }
        Ok(())
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port`, optionally with `user:password@` and
    /// a `/db` number), with [`DEFAULT_CONNECT_TIMEOUT`] and [`DEFAULT_RESPONSE_TIMEOUT`]. Objects
    /// are stored under `<namespace>:`; the namespace must be non-empty and have no `:`, so that no
    /// namespace's keys lie inside another's.
    ///
    /// Fails with [`StoreError::Unavailable`] when the server does not answer, and with
    /// [`StoreError::Other`] for a malformed URL or namespace, or a refused login.
    pub async fn connect(url: &str, namespace: &str) -> Result<RedisStore, StoreError> {
        if namespace.is_empty() || namespace.contains(':') {
            return Err(StoreError::Other(format!(
                "invalid memory tier namespace {namespace:?}: it must be non-empty and have no `:`"
            )));
        }
        let shown = without_credentials(url);
        let client = Client::open(url)
            .map_err(|e| StoreError::Other(format!("invalid memory tier url {shown}: {e}")))?;
        RedisStore::open(
            client,
            shown,
            namespace.to_owned(),
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_RESPONSE_TIMEOUT,
        )
        .await
    }

    /// The same store with other timeouts: each connection attempt may take `connect`, each
    /// command's answer `response`. Connects anew with them (and fails like
    /// [`RedisStore::connect`]); the old connection closes when no clone of the store uses it.
    pub async fn with_timeouts(
        self,
        connect: Duration,
        response: Duration,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::open(self.client, self.url, self.namespace, connect, response).await
    }

    async fn open(
        client: Client,
        url: String,
        namespace: String,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<RedisStore, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(1));
        let bound = connect_timeout + response_timeout;
        let conn = match tokio::time::timeout(
            bound,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(map_err(&url, e, &Op::on("connect", ""))),
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "memory tier {url}: no connection within {bound:?}"
                )));
            }
        };
        let store = RedisStore {
            client,
            conn,
            url,
            namespace,
            connect_timeout,
            response_timeout,
            max_value: Arc::new(AtomicU64::new(DEFAULT_MAX_VALUE)),
        };
        let max_value = store.server_max_value().await?;
        store.max_value.store(max_value, Ordering::Relaxed);
        tracing::debug!(url = %store.url, namespace = %store.namespace, max_value, "memory tier connected");
        Ok(store)
    }

    /// The server's URL, without credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The longest value the server accepts, in bytes (its `proto-max-bulk-len`, as last asked).
    pub fn max_value_size(&self) -> u64 {
        self.max_value.load(Ordering::Relaxed)
    }

    /// The server's `proto-max-bulk-len`, or Redis's default when it will not say.
    async fn server_max_value(&self) -> Result<u64, StoreError> {
        let op = Op::on("CONFIG GET", "proto-max-bulk-len");
        match self.query_raw(&max_value_query(), &op).await? {
            Ok(config) => Ok(max_value_of(&config)),
            Err(e) if e.is_io_error() => Err(map_err(&self.url, e, &op)),
            Err(e) => {
                tracing::debug!(url = %self.url, error = %e, "memory tier: no proto-max-bulk-len, assuming 512 MiB");
                Ok(DEFAULT_MAX_VALUE)
            }
        }
    }

    /// Asks the server's `proto-max-bulk-len` again, after a long write lost its connection; keeps
    /// the old one when the server does not answer.
    async fn refresh_max_value(&self) {
        let op = Op::on("CONFIG GET", "proto-max-bulk-len");
        // Twice: the first try may meet the connection the server closed (and have it replaced).
        for _ in 0..2 {
            match self.query_raw(&max_value_query(), &op).await {
                Ok(Ok(config)) => {
                    let limit = max_value_of(&config);
                    self.max_value.store(limit, Ordering::Relaxed);
                    return;
                }
                Ok(Err(e)) if e.is_connection_dropped() && !e.is_connection_refusal() => {}
                _ => return,
            }
        }
    }

    /// The Redis key of `key`, which is checked.
    fn redis_key(&self, key: &str) -> Result<String, StoreError> {
        validate_key(key)?;
        Ok(format!("{}:{key}", self.namespace))
    }

    /// The longest a command may take: a connection attempt, then the answer.
    fn bound(&self) -> Duration {
        self.connect_timeout + self.response_timeout
    }

    /// Runs `call` within [`RedisStore::bound`]: `Err` when it took longer, else what it returned.
    async fn bounded<T>(
        &self,
        op: &Op<'_>,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<Result<T, RedisError>, StoreError> {
        tokio::time::timeout(self.bound(), call).await.map_err(|_| {
            StoreError::Unavailable(format!(
                "memory tier {}: no answer within {:?} ({op})",
                self.url,
                self.bound()
            ))
        })
    }

    /// Runs `cmd`, leaving its error (not a timeout's) unmapped. A command that finds its
    /// connection broken (the server restarted since) is sent once more, on the connection the
    /// manager makes again.
    async fn query_raw<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        op: &Op<'_>,
    ) -> Result<Result<T, RedisError>, StoreError> {
        let mut conn = self.conn.clone();
        match self.bounded(op, cmd.query_async(&mut conn)).await? {
            Err(e) if broken(&e) => {
                let mut conn = self.conn.clone();
                self.bounded(op, cmd.query_async(&mut conn)).await
            }
            other => Ok(other),
        }
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd, op: &Op<'_>) -> Result<T, StoreError> {
        self.query_raw(cmd, op)
            .await?
            .map_err(|e| map_err(&self.url, e, op))
    }

    async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        op: &Op<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let answer = match self.bounded(op, pipe.query_async(&mut conn)).await? {
            Err(e) if broken(&e) => {
                let mut conn = self.conn.clone();
                self.bounded(op, pipe.query_async(&mut conn)).await?
            }
            other => other,
        };
        answer.map_err(|e| map_err(&self.url, e, op))
    }

    /// Stores `data` under the (checked) `redis_key` of `key`, or refuses it as too large.
    async fn set(&self, key: &str, redis_key: &str, data: &[u8]) -> Result<(), StoreError> {
        let size = data.len() as u64;
        self.check_size(key, size)?;
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(redis_key).arg(data);
        let op = Op {
            what: "SET",
            key,
            size: Some(size),
        };
        let Err(e) = self.query_raw::<()>(&cmd, &op).await? else {
            return Ok(());
        };
        // A server answers a value over its proto-max-bulk-len with an error and closes the
        // connection, so the client often sees only the closing, which looks like an outage. If
        // the limit was lowered since it was asked, say so.
        if size > MIN_MAX_VALUE
            && ((e.is_connection_dropped() && !e.is_connection_refusal()) || is_too_large(&e))
        {
            self.refresh_max_value().await;
            self.check_size(key, size)?;
        }
        Err(map_err(&self.url, e, &op))
    }

    fn check_size(&self, key: &str, size: u64) -> Result<(), StoreError> {
        let limit = self.max_value_size();
        if size > limit {
            return Err(StoreError::Full(format!(
                "object {key:?} of {size} bytes is too large for the memory tier {} \
                 (values up to {limit} bytes, its proto-max-bulk-len)",
                self.url
            )));
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let redis_key = self.redis_key(key)?;
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(&redis_key);
        self.query::<Option<Bytes>>(&cmd, &Op::on("GET", key))
            .await?
            .ok_or_else(|| StoreError::NotFound(key.to_owned()))
    }

    /// One `SCAN` step over the keys under `prefix` (checked): the next cursor (0 at the end),
    /// and the page's keys, as Redis keys and as object keys.
    async fn scan_page(
        &self,
        prefix: &str,
        pattern: &str,
        cursor: u64,
    ) -> Result<(u64, Vec<(Vec<u8>, String)>), StoreError> {
        let mut cmd = ::redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let (next, raw): (u64, Vec<Vec<u8>>) = self.query(&cmd, &Op::on("SCAN", prefix)).await?;
        let ours = format!("{}:", self.namespace);
        let mut page = Vec::with_capacity(raw.len());
        for redis_key in raw {
            let key = match std::str::from_utf8(&redis_key) {
                Ok(full) => match full.strip_prefix(&ours) {
                    // The pattern already matched; the check is cheap insurance.
                    Some(key) if key.starts_with(prefix) => key.to_owned(),
                    _ => continue,
                },
                Err(_) => {
                    tracing::warn!(url = %self.url, key = ?String::from_utf8_lossy(&redis_key), "memory tier: skipping a key that is not utf-8");
                    continue;
                }
            };
            page.push((redis_key, key));
        }
        Ok((next, page))
    }

    /// The `SCAN MATCH` pattern of the keys under `prefix`.
    fn pattern(&self, prefix: &str) -> String {
        format!("{}:{}*", glob_escape(&self.namespace), glob_escape(prefix))
    }
}

fn max_value_query() -> Cmd {
    let mut cmd = ::redis::cmd("CONFIG");
    cmd.arg("GET").arg("proto-max-bulk-len");
    cmd
}

fn max_value_of(config: &HashMap<String, String>) -> u64 {
    config
        .get("proto-max-bulk-len")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_VALUE)
}

/// Whether the server refused a value as longer than its `proto-max-bulk-len`.
fn is_too_large(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail().is_some_and(|d| {
            d.contains("invalid bulk length") || d.contains("exceeds maximum allowed size")
        })
}

/// Adds the commands whose answers [`object_size`] reads: `STRLEN` (0 for a missing key too),
/// then `EXISTS`.
fn size_query<K: ::redis::ToRedisArgs>(pipe: &mut Pipeline, redis_key: K) {
    pipe.cmd("STRLEN")
        .arg(&redis_key)
        .cmd("EXISTS")
        .arg(&redis_key);
}

/// The size of an object from the answers of [`size_query`], `None` when it does not exist. A
/// length above 0 is the object's at that moment, whatever `EXISTS` said next.
fn object_size(strlen: u64, exists: u64) -> Option<u64> {
    (strlen > 0 || exists > 0).then_some(strlen)
}

/// `s` with the glob characters of `SCAN MATCH` (`*`, `?`, `[`, `]`, `\`) escaped, so it matches
/// only itself.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Checks a memory tier's URL as a daemon's setting (`memory_tier`) takes it: a `redis://` URL
/// (no TLS, no cluster). The one rule of the agent's and the control plane's configurations.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("redis://") {
        Ok(())
    } else {
        Err("memory_tier must be a redis://host:port URL".into())
    }
}

/// Whether `e` says the connection broke under the command (not that the server refused it).
fn broken(e: &RedisError) -> bool {
    e.is_connection_dropped() || e.is_io_error()
}

/// `url` without a `user:password@` part or a query (which may hold a password too): what a log
/// or a message may show of a memory tier's URL.
pub fn without_credentials(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(url, _)| url);
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let path = path.trim_end_matches('/');
    if scheme.is_empty() {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

/// Maps a Redis error: no room (`OOM`, a value over `proto-max-bulk-len`) is `Full`; no
/// connection, a timeout, a broken connection or a server that is loading is `Unavailable`;
/// the rest `Other`. Every message names the memory tier by `url`.
fn map_err(url: &str, e: RedisError, op: &Op<'_>) -> StoreError {
    let size = op
        .size
        .map_or_else(String::new, |size| format!(" of {size} bytes"));
    if e.code() == Some("OOM") {
        return StoreError::Full(format!(
            "the memory tier {url} is full (maxmemory reached): it refused {} {:?}{size}: {e}",
            op.what, op.key
        ));
    }
    if is_too_large(&e) {
        return StoreError::Full(format!(
            "object {:?}{size} is too large for the memory tier {url} (proto-max-bulk-len): {e}",
            op.key
        ));
    }
    if e.is_connection_refusal() {
        return StoreError::Unavailable(format!("memory tier {url}: connection refused ({op})"));
    }
    if e.is_timeout() {
        return StoreError::Unavailable(format!("memory tier {url}: timed out ({op})"));
    }
    if e.is_connection_dropped() {
        return StoreError::Unavailable(format!("memory tier {url}: connection lost: {e} ({op})"));
    }
    if e.is_io_error() {
        return StoreError::Unavailable(format!("memory tier {url}: {e} ({op})"));
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown,
        )
        // An answer that does not parse: the connection is replaced; trying again may work.
        | ErrorKind::Parse => StoreError::Unavailable(format!("memory tier {url}: {e} ({op})")),
        _ => StoreError::Other(format!("memory tier {url}: {e} ({op})")),
    }
}

#[async_trait::async_trait]
impl ObjectStore for RedisStore {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let redis_key = self.redis_key(key)?;
        let meta = tokio::fs::metadata(path).await?;
        if !meta.is_file() {
            return Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            )));
        }
        // Refuse before reading a file the server would refuse anyway.
        self.check_size(key, meta.len())?;
        let data = tokio::fs::read(path).await?;
        self.set(key, &redis_key, &data).await?;
        tracing::debug!(key, size = data.len(), "memory tier put_file");
        Ok(data.len() as u64)
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        // Read first, so a missing object creates nothing at the destination.
        let data = self.get(key).await?;
        let path = path.to_owned();
        fsutil::blocking(move || {
            fsutil::write_atomic(&path, &data, false)?;
            Ok(data.len() as u64)
        })
        .await
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let redis_key = self.redis_key(key)?;
        self.set(key, &redis_key, &data).await
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        self.get(key).await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let redis_key = self.redis_key(key)?;
        let mut pipe = ::redis::pipe();
        size_query(&mut pipe, &redis_key);
        let (size, exists): (u64, u64) = self.query_pipe(&pipe, &Op::on("HEAD", key)).await?;
        Ok(object_size(size, exists))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        let pattern = self.pattern(prefix);
        let mut out = Vec::new();
        let mut cursor = 0;
        loop {
            let (next, page) = self.scan_page(prefix, &pattern, cursor).await?;
            if !page.is_empty() {
                let mut pipe = ::redis::pipe();
                for (redis_key, _) in &page {
                    size_query(&mut pipe, redis_key);
                }
                let answers: Vec<u64> = self.query_pipe(&pipe, &Op::on("LIST", prefix)).await?;
                for ((_, key), answer) in page.into_iter().zip(answers.chunks_exact(2)) {
                    // None: deleted since the SCAN, not listed.
                    if let &[size, exists] = answer
                        && let Some(size) = object_size(size, exists)
                    {
                        out.push(ObjectInfo { key, size });
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // SCAN returns keys in no order, and may return one twice.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.dedup_by(|a, b| a.key == b.key);
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let redis_key = self.redis_key(key)?;
        let mut cmd = ::redis::cmd("UNLINK");
        cmd.arg(&redis_key);
        self.query::<u64>(&cmd, &Op::on("UNLINK", key)).await?;
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        validate_prefix(prefix)?;
        let pattern = self.pattern(prefix);
        let mut deleted = 0u64;
        let mut cursor = 0;
        loop {
            // Deleting keys the SCAN has returned is safe: every key present throughout the walk
            // is still returned. UNLINK counts what it removed, so a key returned twice (or
            // deleted by someone else meanwhile) is not counted twice.
            let (next, page) = self.scan_page(prefix, &pattern, cursor).await?;
            if !page.is_empty() {
                let mut cmd = ::redis::cmd("UNLINK");
                for (redis_key, _) in &page {
                    cmd.arg(redis_key);
                }
                deleted += self.query::<u64>(&cmd, &Op::on("UNLINK", prefix)).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        tracing::debug!(prefix, count = deleted, "memory tier delete_prefix");
        usize::try_from(deleted)
            .map_err(|_| StoreError::Other(format!("deleted {deleted} objects: too many to count")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("jobs/j-1/"), "jobs/j-1/");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }

    #[test]
    fn a_setting_takes_only_redis_urls() {
        assert!(check_url("redis://sonic-redis:6379").is_ok());
        for bad in ["http://h:6379", "rediss://h:6379", "sonic-redis:6379", ""] {
            let err = check_url(bad).expect_err(bad);
            assert!(err.contains("redis://host:port"), "{err}");
        }
    }

    #[test]
    fn credentials_are_left_out_of_messages() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379"),
            ("redis://:secret@h:6379/2", "redis://h:6379/2"),
            ("redis://user:se@cret@h:6379", "redis://h:6379"),
            ("h:6379", "h:6379"),
            (
                "redis+unix:///run/redis.sock?pass=secret",
                "redis+unix:///run/redis.sock",
            ),
        ] {
            assert_eq!(without_credentials(url), shown, "{url}");
        }
    }

    #[tokio::test]
    async fn bad_namespaces_and_urls_are_refused() {
        for ns in ["", "a:b"] {
            let err = RedisStore::connect("redis://127.0.0.1:1", ns)
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::Other(_)), "{ns:?}: {err:?}");
        }
        let err = RedisStore::connect("http://127.0.0.1:1", "sonic")
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    }

    #[tokio::test]
    async fn nothing_listening_is_unavailable_and_names_the_url() {
        // A port that was just free: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("redis://:hunter2@127.0.0.1:{port}");
        let err = RedisStore::connect(&url, "sonic").await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(err.is_retryable());
        assert!(
            msg.contains(&format!(
                "memory tier redis://127.0.0.1:{port}: connection refused"
            )),
            "{msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}
