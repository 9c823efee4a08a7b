//! [`Emulated`]: any [`ObjectStore`] made to answer like a remote object store with the
//! catalog's characteristics (`remote_storage` in deploy/catalog.yaml): every request waits the
//! store's request latency first, and a transfer takes at least `bytes / throughput` of one
//! connection (uploads at the write rate, downloads at the read rate). Used by the evaluation
//! (`ofctl bench`), where the real store is a SeaweedFS on the same machine, far faster and
//! nearer than S3, so that `remote` passing costs what the model says it costs.
//!
//! The per-connection rate is enforced by completion time (a transfer that finished early waits
//! out the rest), not by shaping the flow: the agent's own network limiter already shapes it, and
//! what the planner's model predicts is when a transfer ends.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;

use crate::{ObjectInfo, ObjectStore, StoreError};

/// What a remote store costs in time, per request and per byte of one connection. A figure
/// left out of a configuration is 0 (none, unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreProfile {
    /// Waited before every request.
    #[serde(default)]
    pub request_latency_ms: f64,
    /// One connection's upload throughput, megabits per second (0: unlimited).
    #[serde(default)]
    pub write_mbps: f64,
    /// One connection's download throughput, megabits per second (0: unlimited).
    #[serde(default)]
    pub read_mbps: f64,
}

impl StoreProfile {
    /// Refuses negative or non-finite figures.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("request_latency_ms", self.request_latency_ms),
            ("write_mbps", self.write_mbps),
            ("read_mbps", self.read_mbps),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "store profile: {name} must be a number >= 0, not {v}"
                ));
            }
        }
        Ok(())
    }

    /// The least time a transfer of `bytes` at `mbps` takes (zero when unlimited).
    fn floor(bytes: u64, mbps: f64) -> Duration {
        if mbps <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(bytes as f64 * 8.0 / (mbps * 1e6))
    }
}

/// A store wrapper that adds a remote store's latency and per-connection throughput.
#[derive(Debug)]
pub struct Emulated<S> {
    inner: S,
    profile: StoreProfile,
}

impl<S: ObjectStore> Emulated<S> {
    pub fn new(inner: S, profile: StoreProfile) -> Emulated<S> {
        Emulated { inner, profile }
    }

    pub fn profile(&self) -> StoreProfile {
        self.profile
    }

    async fn request(&self) {
        if self.profile.request_latency_ms > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(
                self.profile.request_latency_ms / 1000.0,
            ))
            .await;
        }
    }

    /// Waits until a transfer of `bytes` that started at `started` has taken its least time.
    async fn pace(started: Instant, bytes: u64, mbps: f64) {
        let floor = StoreProfile::floor(bytes, mbps);
        let spent = started.elapsed();
        if floor > spent {
            tokio::time::sleep(floor - spent).await;
        }
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> ObjectStore for Emulated<S> {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        self.request().await;
        let started = Instant::now();
        let n = self.inner.put_file(key, path).await?;
        Self::pace(started, n, self.profile.write_mbps).await;
        Ok(n)
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        self.request().await;
        let started = Instant::now();
        let n = self.inner.get_file(key, path).await?;
        Self::pace(started, n, self.profile.read_mbps).await;
        Ok(n)
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.request().await;
        let started = Instant::now();
        let n = data.len() as u64;
        self.inner.put_bytes(key, data).await?;
        Self::pace(started, n, self.profile.write_mbps).await;
        Ok(())
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        self.request().await;
        let started = Instant::now();
        let data = self.inner.get_bytes(key).await?;
        Self::pace(started, data.len() as u64, self.profile.read_mbps).await;
        Ok(data)
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.request().await;
        self.inner.head(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.request().await;
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.request().await;
        self.inner.delete(key).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        self.request().await;
        self.inner.delete_prefix(prefix).await
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    #[test]
    fn a_transfer_takes_at_least_its_bytes_over_the_rate() {
        // 1 MB at 80 Mbit/s: 0.1 s; unlimited: nothing.
        let f = StoreProfile::floor(1_000_000, 80.0).as_secs_f64();
        assert!((f - 0.1).abs() < 1e-9, "{f}");
        assert_eq!(StoreProfile::floor(1_000_000, 0.0), Duration::ZERO);
        assert_eq!(StoreProfile::floor(0, 80.0), Duration::ZERO);
    }

    #[tokio::test]
    async fn objects_pass_through_unchanged() {
        let store = Emulated::new(
            MemoryStore::new(),
            StoreProfile {
                request_latency_ms: 1.0,
                write_mbps: 800.0,
                read_mbps: 400.0,
            },
        );
        store
            .put_bytes("a/b", Bytes::from(vec![7u8; 10_000]))
            .await
            .unwrap();
        assert_eq!(store.head("a/b").await.unwrap(), Some(10_000));
        assert_eq!(store.get_bytes("a/b").await.unwrap(), vec![7u8; 10_000]);
        assert_eq!(store.list("a/").await.unwrap().len(), 1);
        assert_eq!(store.delete_prefix("a/").await.unwrap(), 1);
        assert_eq!(store.head("a/b").await.unwrap(), None);
    }

    #[test]
    fn bad_profiles_are_refused() {
        let p = |l: f64, w: f64, r: f64| StoreProfile {
            request_latency_ms: l,
            write_mbps: w,
            read_mbps: r,
        };
        assert!(p(25.0, 600.0, 400.0).check().is_ok());
        assert!(p(0.0, 0.0, 0.0).check().is_ok());
        assert!(p(-1.0, 600.0, 400.0).check().is_err());
        assert!(p(25.0, f64::NAN, 400.0).check().is_err());
    }
}
