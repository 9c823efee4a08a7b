//! What the object store sustains, measured from where an agent stands (`sonic-store-probe`,
//! deploy/measure-store.sh): request latency, one VM's write and read throughput, and requests
//! per second. The testbed's catalog takes these figures instead of the default catalog's
//! assumptions (issue: a testbed that is not the model).
//!
//! Each figure is a median of several samples, timed end to end as the agent's own transfers
//! are: a small object's PUT or GET is the request latency; a large object's time less that
//! latency is its transfer. Objects go under a prefix of their own and are deleted afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use sonic_storage::{ObjectStore, StoreError};

/// What to measure with.
#[derive(Debug, Clone)]
pub struct ProbePlan {
    /// Sequential small requests for the latency, each way.
    pub small_requests: usize,
    /// Size of a small object, bytes.
    pub small_bytes: usize,
    /// Large objects written and read for the throughputs.
    pub large_objects: usize,
    /// Size of a large object, bytes.
    pub large_bytes: usize,
    /// Small PUTs for the request rate, and how many are in flight at once.
    pub rate_requests: usize,
    pub rate_concurrency: usize,
    /// Where the objects go (deleted at the end).
    pub prefix: String,
}

impl Default for ProbePlan {
    fn default() -> Self {
        ProbePlan {
            small_requests: 30,
            small_bytes: 1024,
            large_objects: 3,
            large_bytes: 8 << 20,
            rate_requests: 1000,
            rate_concurrency: 128,
            prefix: "sonic-store-probe/".into(),
        }
    }
}

/// The figures, in the catalog's units (milliseconds, megabits per second, requests per
/// second), with the samples they come from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StoreFigures {
    /// The median of the small PUTs' and GETs' medians: `remote_storage.request_latency_ms`.
    pub request_latency_ms: f64,
    pub put_latency_ms: f64,
    pub get_latency_ms: f64,
    /// One VM's upload throughput (`remote_storage.write_mbps`): a large PUT's bytes over its
    /// time less the PUT latency; the median.
    pub write_mbps: f64,
    /// One VM's download throughput (`remote_storage.read_mbps`).
    pub read_mbps: f64,
    /// Small PUTs completed per second with `rate_concurrency` in flight.
    pub requests_per_s: f64,
    /// Whether that rate is what the probe's own concurrency allows at the PUT latency (at least
    /// 80% of `rate_concurrency / put latency`, Little's law): then the store sustains at least
    /// `requests_per_s`, and its own limit was not reached.
    pub rate_bound_by_concurrency: bool,
    pub samples: Samples,
}

/// The raw samples: seconds per request or transfer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Samples {
    pub small_put_s: Vec<f64>,
    pub small_get_s: Vec<f64>,
    pub large_put_s: Vec<f64>,
    pub large_get_s: Vec<f64>,
    pub large_bytes: usize,
    pub rate_requests: usize,
    pub rate_concurrency: usize,
    pub rate_elapsed_s: f64,
}

/// The median of `xs` (the mean of the middle two for an even count); 0 when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Megabits per second of `bytes` moved in `seconds` (with at least a microsecond).
fn mbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 * 8.0 / seconds.max(1e-6) / 1e6
}

async fn timed<T>(
    f: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<f64, StoreError> {
    let t = Instant::now();
    f.await?;
    Ok(t.elapsed().as_secs_f64())
}

/// Measures `store` with `plan`; deletes what it wrote (also when a step fails).
pub async fn measure(
    store: Arc<dyn ObjectStore>,
    plan: &ProbePlan,
) -> Result<StoreFigures, StoreError> {
    let result = run(&store, plan).await;
    let _ = store.delete_prefix(&plan.prefix).await;
    result
}

async fn run(store: &Arc<dyn ObjectStore>, plan: &ProbePlan) -> Result<StoreFigures, StoreError> {
    if plan.small_requests == 0 || plan.large_objects == 0 || plan.rate_requests == 0 {
        return Err(StoreError::Other(
            "every count of the probe must be positive".into(),
        ));
    }
    let p = &plan.prefix;
    let small = Bytes::from(vec![b's'; plan.small_bytes]);
    // One request first, untimed: the connection pool and the bucket are warm for the rest.
    store.put_bytes(&format!("{p}warm"), small.clone()).await?;
    store.get_bytes(&format!("{p}warm")).await?;

    let mut small_put_s = Vec::with_capacity(plan.small_requests);
    let mut small_get_s = Vec::with_capacity(plan.small_requests);
    for i in 0..plan.small_requests {
        let key = format!("{p}small-{i}");
        small_put_s.push(timed(store.put_bytes(&key, small.clone())).await?);
        small_get_s.push(timed(store.get_bytes(&key)).await?);
    }
    let put_latency = median(&small_put_s);
    let get_latency = median(&small_get_s);

    // Distinct contents, so no layer can answer from a cache of the previous object.
    let mut large_put_s = Vec::with_capacity(plan.large_objects);
    let mut large_get_s = Vec::with_capacity(plan.large_objects);
    for i in 0..plan.large_objects {
        let key = format!("{p}large-{i}");
        let data = Bytes::from(vec![b'a' + (i % 26) as u8; plan.large_bytes]);
        large_put_s.push(timed(store.put_bytes(&key, data)).await?);
        let t = Instant::now();
        let got = store.get_bytes(&key).await?;
        large_get_s.push(t.elapsed().as_secs_f64());
        if got.len() != plan.large_bytes {
            return Err(StoreError::Other(format!(
                "{key}: read {} bytes back, wrote {}",
                got.len(),
                plan.large_bytes
            )));
        }
    }
    let write: Vec<f64> = large_put_s
        .iter()
        .map(|s| mbps(plan.large_bytes, s - put_latency))
        .collect();
    let read: Vec<f64> = large_get_s
        .iter()
        .map(|s| mbps(plan.large_bytes, s - get_latency))
        .collect();

    // The request rate: rate_requests small PUTs, rate_concurrency at a time.
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..plan.rate_concurrency.max(1) {
        let (store, next, small, p, n) = (
            store.clone(),
            next.clone(),
            small.clone(),
            p.clone(),
            plan.rate_requests,
        );
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), StoreError>(());
                }
                store
                    .put_bytes(&format!("{p}rate-{i}"), small.clone())
                    .await?;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.map_err(|e| StoreError::Other(format!("a probe task failed: {e}")))??;
    }
    let rate_elapsed = t
        .elapsed()
        .as_secs_f64()
        .max(Duration::from_micros(1).as_secs_f64());

    Ok(StoreFigures {
        request_latency_ms: (put_latency + get_latency) / 2.0 * 1000.0,
        put_latency_ms: put_latency * 1000.0,
        get_latency_ms: get_latency * 1000.0,
        write_mbps: median(&write),
        read_mbps: median(&read),
        requests_per_s: plan.rate_requests as f64 / rate_elapsed,
        rate_bound_by_concurrency: plan.rate_requests as f64 / rate_elapsed
            >= 0.8 * plan.rate_concurrency as f64 / put_latency.max(1e-9),
        samples: Samples {
            small_put_s,
            small_get_s,
            large_put_s,
            large_get_s,
            large_bytes: plan.large_bytes,
            rate_requests: plan.rate_requests,
            rate_concurrency: plan.rate_concurrency,
            rate_elapsed_s: rate_elapsed,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
    }

    #[tokio::test]
    async fn measures_a_store_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> =
            Arc::new(sonic_storage::local::LocalStore::new(dir.path()).expect("store"));
        store
            .put_bytes("keep/me", Bytes::from_static(b"x"))
            .await
            .expect("put");
        let plan = ProbePlan {
            small_requests: 5,
            large_objects: 2,
            large_bytes: 1 << 20,
            rate_requests: 20,
            rate_concurrency: 4,
            ..ProbePlan::default()
        };
        let f = measure(store.clone(), &plan).await.expect("measure");
        assert_eq!(
            (f.samples.small_put_s.len(), f.samples.small_get_s.len()),
            (5, 5)
        );
        assert_eq!(f.samples.large_put_s.len(), 2);
        for v in [
            f.request_latency_ms,
            f.write_mbps,
            f.read_mbps,
            f.requests_per_s,
        ] {
            assert!(v.is_finite() && v > 0.0, "{f:?}");
        }
        let left = store.list("sonic-store-probe/").await.expect("list");
        assert!(left.is_empty(), "the probe's objects are deleted: {left:?}");
        assert_eq!(store.list("keep/").await.expect("list").len(), 1);
    }

    #[tokio::test]
    async fn a_zero_count_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> =
            Arc::new(sonic_storage::local::LocalStore::new(dir.path()).expect("store"));
        let plan = ProbePlan {
            large_objects: 0,
            ..ProbePlan::default()
        };
        assert!(measure(store, &plan).await.is_err());
    }
}
