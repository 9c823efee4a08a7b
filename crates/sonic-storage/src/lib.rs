//! Object stores for the `remote` data-passing method: S3-compatible, a local directory, memory,
//! and a Redis memory tier, behind one trait and one conformance suite.
//!
//! The trait below is the contract the agent and control plane code against; keep its names stable.
//!
//! - [`s3::S3Store`]: any S3-compatible endpoint (AWS S3, MinIO, Ceph RGW, SeaweedFS) through
//!   `aws-sdk-s3`, with static credentials and no instance-metadata lookups; multipart uploads and
//!   parallel ranged downloads for large files; optional bandwidth [`Throttle`].
//! - [`local::LocalStore`]: objects as files under a root directory, written atomically.
//! - [`memory::MemoryStore`]: a map in memory, for unit tests of other crates.
//! - [`redis::RedisStore`]: the memory tier, objects as values on a Redis server under
//!   `<namespace>:<key>` (one `SET` each), with bounded waits; a full server (`maxmemory`) or a
//!   value too large for it gives [`StoreError::Full`], so the caller can put the object in the
//!   object store instead.
//! - [`emulated::Emulated`]: any store made to answer with a remote store's request latency and
//!   per-connection throughput (the evaluation's emulated cluster).
//!
//! Every store checks keys with [`validate_key`] (and prefixes with [`validate_prefix`]) and passes
//! the same [`conformance`] suite (`tests/conformance.rs` runs it over all of them, the Redis one on
//! a `redis-server` of its own).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sonic_storage::StoreError> {
//! use sonic_storage::{ObjectStore, memory::MemoryStore};
//! let store = MemoryStore::new();
//! store.put_bytes("jobs/j-1/pca/out.bin", bytes::Bytes::from_static(b"data")).await?;
//! assert_eq!(store.head("jobs/j-1/pca/out.bin").await?, Some(4));
//! # Ok(()) }
//! ```

// Unit tests may unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod choice;
pub mod conformance;
pub mod emulated;
mod fsutil;
pub mod local;
pub mod memory;
pub mod patient;
pub mod redis;
pub mod s3;

use std::path::Path;

pub use choice::StoreChoice;

use bytes::Bytes;

/// An object's key and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
}

/// Errors of an object store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("invalid key {0:?}: {1}")]
    InvalidKey(String, &'static str),
    #[error("store i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The store could not be reached or answered with an error; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store has no room for the object (a memory tier at its memory limit, or an object larger
    /// than it takes). Not retryable: put the object in another store.
    #[error("no room: {0}")]
    Full(String),
    #[error("store error: {0}")]
    Other(String),
}

/// Shared bandwidth limiters of one agent (standing for one VM's network): every stream the agent
/// sends goes through `egress`, every stream it receives through `ingress`.
#[derive(Clone, Debug)]
pub struct Throttle {
    pub egress: async_speed_limit::Limiter,
    pub ingress: async_speed_limit::Limiter,
}

/// An object's bytes, chunk by chunk ([`ObjectStore::get_stream`]).
pub type ByteStream = futures::stream::BoxStream<'static, Result<Bytes, StoreError>>;

/// An S3-like object store. Keys are `/`-separated, relative, with no `..` or empty segment.
/// Every write is atomic: a reader sees the whole object or none.
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Uploads a local file (multipart when large); returns its size.
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError>;
    /// Downloads an object into a local file, atomically (temporary name, then rename); returns its size.
    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError>;
    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError>;
    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError>;
    /// The object's bytes as a stream, read as the consumer takes them: a large object is never
    /// held whole in memory. `NotFound` before the first chunk when it does not exist. The
    /// default reads it whole ([`ObjectStore::get_bytes`]): for stores that hold objects in
    /// memory anyway, and wrappers that pace whole reads.
    async fn get_stream(&self, key: &str) -> Result<ByteStream, StoreError> {
        let bytes = self.get_bytes(key).await?;
        Ok(Box::pin(futures::stream::once(async move { Ok(bytes) })))
    }
    /// The object's size, or `None` when it does not exist.
    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError>;
    /// Objects whose key starts with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// Deletes one object; deleting a missing object is not an error.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Deletes every object under `prefix`; returns how many.
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError>;
    /// Operations tried again because the store was unavailable (see [`patient::Patient`]),
    /// since the store was opened; stores that never try again say 0. For metrics.
    fn retries(&self) -> u64 {
        0
    }
}

/// A shared store is a store: wrappers (such as [`emulated::Emulated`]) take one as it is.
#[async_trait::async_trait]
impl<T: ObjectStore + ?Sized> ObjectStore for std::sync::Arc<T> {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        (**self).put_file(key, path).await
    }
    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        (**self).get_file(key, path).await
    }
    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        (**self).put_bytes(key, data).await
    }
    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        (**self).get_bytes(key).await
    }
    async fn get_stream(&self, key: &str) -> Result<ByteStream, StoreError> {
        (**self).get_stream(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        (**self).head(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        (**self).list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key).await
    }
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        (**self).delete_prefix(prefix).await
    }
    fn retries(&self) -> u64 {
        (**self).retries()
    }
}

/// The longest key S3 accepts, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Checks that `key` is a relative `/`-separated path every store can hold: not empty, at most
/// [`MAX_KEY_LEN`] bytes, not absolute, no empty, `.` or `..` segment, no backslash, no NUL.
///
/// The rules are those of the strictest store (a local directory), so a key accepted here means the
/// same object on every store.
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    match key_problem(key) {
        Some(reason) => Err(StoreError::InvalidKey(key.to_owned(), reason)),
        None => Ok(()),
    }
}

/// Checks a listing prefix: empty (everything), or a valid key with an optional trailing `/`
/// (`jobs/j-1/` lists the objects of one job; `jobs/j-1` also matches `jobs/j-10/...`).
pub fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    if prefix.is_empty() {
        return Ok(());
    }
    let body = prefix.strip_suffix('/').unwrap_or(prefix);
    match key_problem(body) {
        Some(reason) => Err(StoreError::InvalidKey(prefix.to_owned(), reason)),
        None => Ok(()),
    }
}

fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        return Some("empty key");
    }
    if key.len() > MAX_KEY_LEN {
        return Some("longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return Some("absolute key");
    }
    if key.contains('\\') {
        return Some("contains a backslash");
    }
    if key.contains('\0') {
        return Some("contains a nul byte");
    }
    for segment in key.split('/') {
        match segment {
            "" => return Some("empty segment"),
            "." | ".." => return Some("`.` or `..` segment"),
            _ => {}
        }
    }
    None
}

impl StoreError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, expect_ok: bool) {
        let got = validate_key(key);
        match (&got, expect_ok) {
            (Ok(()), true) | (Err(StoreError::InvalidKey(..)), false) => {}
            _ => panic!("validate_key({key:?}) = {got:?}, expected ok={expect_ok}"),
        }
    }

    #[test]
    fn keys() {
        check("a", true);
        check("jobs/j-1/pca/out.bin", true);
        check("a/..b/c..", true);
        check(".hidden/x", true);
        check("with space/ünïcode", true);
        check(&"k".repeat(MAX_KEY_LEN), true);

        check("", false);
        check("/abs", false);
        check("a/../b", false);
        check("..", false);
        check("./a", false);
        check("a/.", false);
        check("a//b", false);
        check("a/", false);
        check("a\\b", false);
        check("a\0b", false);
        check(&"k".repeat(MAX_KEY_LEN + 1), false);
    }

    #[test]
    fn prefixes() {
        for ok in ["", "a", "a/", "a/b", "a/b/", "a/b-"] {
            assert!(
                validate_prefix(ok).is_ok(),
                "{ok:?} should be a valid prefix"
            );
        }
        for bad in ["/", "/a", "a//", "../", "a/../", "a\\", "a//b/"] {
            assert!(
                matches!(validate_prefix(bad), Err(StoreError::InvalidKey(..))),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn retryable() {
        assert!(StoreError::Unavailable("x".into()).is_retryable());
        assert!(!StoreError::NotFound("x".into()).is_retryable());
        assert!(!StoreError::Other("x".into()).is_retryable());
        assert!(!StoreError::Full("x".into()).is_retryable());
    }
}
