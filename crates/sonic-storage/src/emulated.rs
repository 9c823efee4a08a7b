//! [`Emulated`]: any [`ObjectStore`] made to answer like a remote object store with the
//! catalog's characteristics (`remote_storage` in deploy/catalog.yaml): every request answers no
//! sooner than the store's request latency plus `bytes / throughput` of one connection (uploads
//! at the write rate, downloads at the read rate) after it started. The real store's own service
//! time is spent inside that deadline, not added to it (on a time-dilated cluster the real store
//! is not slowed down, so an added service time would not dilate). Used by the evaluation
//! (`ofctl bench`), where the real store is a SeaweedFS on the same machine, far faster and
//! nearer than S3, so that `remote` passing costs what the model says it costs.
//!
//! The latency and the per-connection rate are enforced by completion time (a request that
//! finished early waits out the rest), not by shaping the flow: the agent's own network limiter already shapes it, and
//! what the planner's model predicts is when a transfer ends.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

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

    /// The least time a request moving `bytes` at `mbps` takes, from its start: the request
    /// latency plus the transfer at one connection's rate.
    fn least(&self, bytes: u64, mbps: f64) -> Duration {
        Duration::from_secs_f64(self.profile.request_latency_ms / 1000.0)
            + StoreProfile::floor(bytes, mbps)
    }

    /// Answers no sooner than `started` + the request's least time (`bytes` at `mbps`; an
    /// error moved nothing and costs the latency alone). The real store's own service time,
    /// spent between `started` and now, is part of that least time, not added to it: a remote
    /// store's latency and rate are what the request takes in all, and the store under this
    /// wrapper (on the same machine, not slowed down with a time-dilated cluster) would
    /// otherwise add its own time on top at every request.
    async fn answer<T>(
        &self,
        started: Instant,
        result: Result<T, StoreError>,
        bytes: impl FnOnce(&T) -> u64,
        mbps: f64,
    ) -> Result<T, StoreError> {
        let n = result.as_ref().map(bytes).unwrap_or(0);
        tokio::time::sleep_until(started + self.least(n, mbps)).await;
        result
    }
}

#[async_trait::async_trait]
impl<S: ObjectStore> ObjectStore for Emulated<S> {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let started = Instant::now();
        let r = self.inner.put_file(key, path).await;
        self.answer(started, r, |n| *n, self.profile.write_mbps)
            .await
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let started = Instant::now();
        let r = self.inner.get_file(key, path).await;
        self.answer(started, r, |n| *n, self.profile.read_mbps)
            .await
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let started = Instant::now();
        let n = data.len() as u64;
        let r = self.inner.put_bytes(key, data).await;
        self.answer(started, r, |_| n, self.profile.write_mbps)
            .await
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        let started = Instant::now();
        let r = self.inner.get_bytes(key).await;
        self.answer(started, r, |d| d.len() as u64, self.profile.read_mbps)
            .await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let started = Instant::now();
        let r = self.inner.head(key).await;
        self.answer(started, r, |_| 0, 0.0).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let started = Instant::now();
        let r = self.inner.list(prefix).await;
        self.answer(started, r, |_| 0, 0.0).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let started = Instant::now();
        let r = self.inner.delete(key).await;
        self.answer(started, r, |_| 0, 0.0).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        let started = Instant::now();
        let r = self.inner.delete_prefix(prefix).await;
        self.answer(started, r, |_| 0, 0.0).await
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

    /// A store that takes `service` of (paused, virtual) time for every request: the real
    /// store under the emulation, with its own service time.
    #[derive(Debug)]
    struct Slow {
        inner: MemoryStore,
        service: Duration,
    }

    #[async_trait::async_trait]
    impl ObjectStore for Slow {
        async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.put_file(key, path).await
        }
        async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.get_file(key, path).await
        }
        async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.put_bytes(key, data).await
        }
        async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.get_bytes(key).await
        }
        async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.head(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &str) -> Result<(), StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.delete(key).await
        }
        async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
            tokio::time::sleep(self.service).await;
            self.inner.delete_prefix(prefix).await
        }
    }

    /// Milliseconds of virtual time `f` took.
    async fn took<T>(f: impl std::future::Future<Output = T>) -> (T, f64) {
        let t0 = Instant::now();
        let out = f.await;
        (out, t0.elapsed().as_secs_f64() * 1000.0)
    }

    fn near(ms: f64, want: f64) -> bool {
        // The timer wheel's granularity is a millisecond.
        (ms - want).abs() <= 2.0
    }

    // On tokio's paused clock (virtual time, advanced to each timer as the test waits): one
    // deadline per request, latency + bytes at the rate, from the request's start; the real
    // store's service time counts inside it, never on top of it.
    #[tokio::test(start_paused = true)]
    async fn the_real_stores_time_is_absorbed_by_the_emulated_one() {
        let profile = StoreProfile {
            request_latency_ms: 100.0,
            write_mbps: 80.0, // 1 MB: 100 ms
            read_mbps: 40.0,  // 1 MB: 200 ms
        };
        let store = |service_ms: u64| {
            Emulated::new(
                Slow {
                    inner: MemoryStore::new(),
                    service: Duration::from_millis(service_ms),
                },
                profile,
            )
        };
        let mb = Bytes::from(vec![1u8; 1_000_000]);

        // A store faster than the emulated one: latency + transfer, whatever its own time.
        for service in [0, 50, 150] {
            let s = store(service);
            let (r, ms) = took(s.put_bytes("k", mb.clone())).await;
            r.unwrap();
            assert!(near(ms, 200.0), "put, service {service} ms: {ms} ms");
            let (r, ms) = took(s.get_bytes("k")).await;
            assert_eq!(r.unwrap().len(), 1_000_000);
            assert!(near(ms, 300.0), "get, service {service} ms: {ms} ms");
            let (r, ms) = took(s.head("k")).await;
            assert_eq!(r.unwrap(), Some(1_000_000));
            let want = (service as f64).max(100.0);
            assert!(near(ms, want), "head, service {service} ms: {ms} ms");
        }

        // A store slower than the emulated one answers when it answers.
        let s = store(500);
        let (r, ms) = took(s.put_bytes("k", mb.clone())).await;
        r.unwrap();
        assert!(near(ms, 500.0), "slow put: {ms} ms");

        // A failed request moved nothing: the latency alone.
        let s = store(10);
        let (r, ms) = took(s.get_bytes("missing")).await;
        assert!(r.is_err());
        assert!(near(ms, 100.0), "failed get: {ms} ms");

        // Files: the bytes the inner store says it moved.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![2u8; 500_000]).unwrap();
        let s = store(20);
        let (r, ms) = took(s.put_file("f", &path)).await;
        assert_eq!(r.unwrap(), 500_000);
        assert!(near(ms, 150.0), "put_file: {ms} ms");
        let back = dir.path().join("g");
        let (r, ms) = took(s.get_file("f", &back)).await;
        assert_eq!(r.unwrap(), 500_000);
        assert!(near(ms, 200.0), "get_file: {ms} ms");
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
