//! [`Patient`]: any [`ObjectStore`] that rides out an outage. Every operation that fails with
//! [`StoreError::Unavailable`] (no connection, a timeout, a 5xx: the store is down or
//! overloaded) is tried again with doubling backoff until it succeeds or the outage has lasted
//! [`Patience::window`]; then the error names the store, the operation and how long it waited.
//! Other errors (not found, a bad key, a local disk error) return at once.
//!
//! Uploads and downloads are atomic and idempotent (a whole object or none; a download writes a
//! temporary file and renames it), so trying one again is safe.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::{ObjectInfo, ObjectStore, StoreError};

/// How long to wait out an outage, and how often to try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Patience {
    /// How long an outage may last before the operation fails.
    pub window: Duration,
    /// The wait after the first failure; it doubles after each one, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Patience {
    fn default() -> Patience {
        Patience {
            window: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(4),
        }
    }
}

/// A store wrapper that retries through outages (see the module docs).
#[derive(Debug)]
pub struct Patient<S> {
    inner: S,
    patience: Patience,
    /// Names the store in errors (for example its endpoint).
    name: String,
    /// Operations tried again so far.
    retries: AtomicU64,
}

impl<S: ObjectStore> Patient<S> {
    pub fn new(inner: S, name: impl Into<String>, patience: Patience) -> Patient<S> {
        Patient {
            inner,
            patience,
            name: name.into(),
            retries: AtomicU64::new(0),
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn retry<T, F, Fut>(&self, what: &str, key: &str, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, StoreError>> + Send,
        T: Send,
    {
        let started = Instant::now();
        let mut wait = self.patience.initial_backoff;
        let mut tries = 0u32;
        loop {
            tries += 1;
            match op().await {
                Err(StoreError::Unavailable(e)) => {
                    let waited = started.elapsed();
                    if waited + wait > self.patience.window {
                        return Err(StoreError::Unavailable(format!(
                            "the object store {} did not answer {what} {key} for {:.1} s ({tries} tries): {e}",
                            self.name,
                            waited.as_secs_f64()
                        )));
                    }
                    tracing::warn!(store = %self.name, what, key, tries, error = %e, "object store unavailable; trying again");
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(self.patience.max_backoff);
                }
                other => return other,
            }
        }
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> ObjectStore for Patient<S> {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        self.retry("PUT", key, || self.inner.put_file(key, path))
            .await
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        self.retry("GET", key, || self.inner.get_file(key, path))
            .await
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.retry("PUT", key, || self.inner.put_bytes(key, data.clone()))
            .await
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        self.retry("GET", key, || self.inner.get_bytes(key)).await
    }

    /// Opening the stream is waited out as every operation is; a failure once bytes flow ends
    /// the stream with it (what was sent cannot be taken back).
    async fn get_stream(&self, key: &str) -> Result<crate::ByteStream, StoreError> {
        self.retry("GET", key, || self.inner.get_stream(key)).await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.retry("HEAD", key, || self.inner.head(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.retry("LIST", prefix, || self.inner.list(prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.retry("DELETE", key, || self.inner.delete(key)).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        self.retry("DELETE", prefix, || self.inner.delete_prefix(prefix))
            .await
    }

    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed) + self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::memory::MemoryStore;

    /// A memory store that is down for its first `down` operations.
    #[derive(Debug)]
    struct Flaky {
        inner: MemoryStore,
        down: AtomicU32,
        calls: Mutex<u32>,
    }

    impl Flaky {
        fn gate(&self) -> Result<(), StoreError> {
            *self.calls.lock().unwrap() += 1;
            let left = self.down.load(Ordering::SeqCst);
            if left > 0 {
                self.down.store(left - 1, Ordering::SeqCst);
                return Err(StoreError::Unavailable("connection refused".into()));
            }
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Flaky {
        async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            self.gate()?;
            self.inner.put_file(key, path).await
        }
        async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            self.gate()?;
            self.inner.get_file(key, path).await
        }
        async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
            self.gate()?;
            self.inner.put_bytes(key, data).await
        }
        async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
            self.gate()?;
            self.inner.get_bytes(key).await
        }
        async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
            self.gate()?;
            self.inner.head(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
            self.gate()?;
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &str) -> Result<(), StoreError> {
            self.gate()?;
            self.inner.delete(key).await
        }
        async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
            self.gate()?;
            self.inner.delete_prefix(prefix).await
        }
    }

    fn patient(down: u32, window_ms: u64) -> Patient<Flaky> {
        Patient::new(
            Flaky {
                inner: MemoryStore::new(),
                down: AtomicU32::new(down),
                calls: Mutex::new(0),
            },
            "memory://test",
            Patience {
                window: Duration::from_millis(window_ms),
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(4),
            },
        )
    }

    #[tokio::test]
    async fn a_short_outage_is_ridden_out() {
        let s = patient(5, 60_000);
        s.put_bytes("a/b", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(*s.inner().calls.lock().unwrap(), 6);
        assert_eq!(s.retries(), 5, "each try after a failure counts");
        assert_eq!(s.get_bytes("a/b").await.unwrap(), Bytes::from_static(b"x"));
    }

    #[tokio::test]
    async fn a_long_outage_fails_naming_the_store_and_the_wait() {
        let s = patient(u32::MAX, 30);
        let e = s.head("a/b").await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, StoreError::Unavailable(_)), "{m}");
        assert!(m.contains("memory://test") && m.contains("HEAD a/b"), "{m}");
        assert!(*s.inner().calls.lock().unwrap() >= 2, "it tried again: {m}");
    }

    #[tokio::test]
    async fn other_errors_return_at_once() {
        let s = patient(0, 60_000);
        assert!(matches!(
            s.get_bytes("missing").await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(*s.inner().calls.lock().unwrap(), 1);
    }
}
