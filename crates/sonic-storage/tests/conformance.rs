//! The conformance suite over all three stores, a byte-exactness property test, and the S3 store's
//! own behaviour (multipart, throttling) against a real SeaweedFS.
//!
//! The S3 tests need SeaweedFS and fail, not skip, without it:
//! `bash deploy/seaweedfs.sh install && bash deploy/seaweedfs.sh start` and
//! `export SONIC_S3_ENDPOINT=http://127.0.0.1:8333`.

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_speed_limit::Limiter;
use proptest::prelude::*;
use sonic_storage::conformance::{self, pattern};
use sonic_storage::local::LocalStore;
use sonic_storage::memory::MemoryStore;
use sonic_storage::s3::{MIN_PART_SIZE, S3Config, S3Store};
use sonic_storage::{ObjectStore, Throttle};

const NEED_SEAWEEDFS: &str = "S3 tests need SeaweedFS: run `bash deploy/seaweedfs.sh install && bash deploy/seaweedfs.sh start` and export SONIC_S3_ENDPOINT=http://127.0.0.1:8333";

/// The endpoint from the environment, checked to accept connections; panics with how to fix it.
fn s3_endpoint() -> String {
    let Ok(endpoint) = std::env::var("SONIC_S3_ENDPOINT") else {
        panic!("SONIC_S3_ENDPOINT is not set. {NEED_SEAWEEDFS}");
    };
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&authority)
        .unwrap_or_else(|e| panic!("cannot resolve {endpoint}: {e}. {NEED_SEAWEEDFS}"))
        .collect();
    let answers = addrs
        .iter()
        .any(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok());
    assert!(answers, "{endpoint} does not answer. {NEED_SEAWEEDFS}");
    endpoint
}

/// A store on a fresh bucket of the test SeaweedFS, with 5 MiB parts (S3's minimum) so the suite's
/// large file takes the multipart and ranged paths.
async fn s3_store(test: &str) -> S3Store {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let bucket = format!(
        "sonic-test-{test}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    );
    let mut cfg = S3Config::new(
        s3_endpoint(),
        bucket,
        std::env::var("SONIC_S3_ACCESS_KEY").unwrap_or_else(|_| "sonic".into()),
        std::env::var("SONIC_S3_SECRET_KEY").unwrap_or_else(|_| "sonicsecret".into()),
    );
    cfg.part_size = MIN_PART_SIZE;
    cfg.concurrency = 3;
    let store = S3Store::new(cfg).unwrap();
    store
        .ensure_bucket()
        .await
        .unwrap_or_else(|e| panic!("creating the test bucket failed: {e}. {NEED_SEAWEEDFS}"));
    // Twice: creating an existing bucket is fine.
    store.ensure_bucket().await.unwrap();
    store
}

#[tokio::test]
async fn memory_store_conforms() {
    let scratch = tempfile::tempdir().unwrap();
    let store = MemoryStore::new();
    conformance::run_all(&store, scratch.path()).await;
    assert!(store.is_empty());
}

#[tokio::test]
async fn local_store_conforms() {
    let root = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let store = LocalStore::new(root.path().join("store")).unwrap();
    conformance::run_all(&store, scratch.path()).await;
    // delete_prefix pruned the emptied directories, and no temporary file is left.
    let left: Vec<_> = std::fs::read_dir(root.path().join("store"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "left in the store root: {left:?}");
}

#[tokio::test]
async fn local_store_with_fsync_conforms() {
    let root = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let store = LocalStore::new(root.path()).unwrap().with_fsync(true);
    conformance::run_all(&store, scratch.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_conforms() {
    let store = s3_store("conf").await;
    let scratch = tempfile::tempdir().unwrap();
    conformance::run_all(&store, scratch.path()).await;
    store.delete_bucket().await.unwrap();
}

/// The large file really went up in parts: a multipart object's ETag ends in `-<parts>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_large_files_use_multipart() {
    let store = s3_store("multipart").await;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let data = pattern(2 * MIN_PART_SIZE as usize + 1234, 42);
    std::fs::write(&src, &data).unwrap();
    store.put_file("big", &src).await.unwrap();
    store
        .put_bytes("small", bytes::Bytes::from_static(b"s"))
        .await
        .unwrap();

    let etag = |key: &'static str| {
        let store = store.clone();
        async move {
            let out = store
                .client()
                .head_object()
                .bucket(store.bucket())
                .key(key)
                .send()
                .await
                .unwrap();
            out.e_tag().unwrap_or_default().trim_matches('"').to_owned()
        }
    };
    let big = etag("big").await;
    assert!(big.ends_with("-3"), "etag of a 3-part upload: {big}");
    let small = etag("small").await;
    assert!(!small.contains('-'), "etag of a single put: {small}");

    let dest = dir.path().join("dest");
    assert_eq!(
        store.get_file("big", &dest).await.unwrap(),
        data.len() as u64
    );
    assert!(std::fs::read(&dest).unwrap() == data);

    // Nothing is left half-uploaded.
    let uploads = store
        .client()
        .list_multipart_uploads()
        .bucket(store.bucket())
        .send()
        .await
        .unwrap();
    assert!(uploads.uploads().is_empty(), "{:?}", uploads.uploads());
    store.delete_bucket().await.unwrap();
}

/// A failed multipart upload is aborted: a file that shrinks while its parts are read fails the
/// upload and leaves neither an object nor an open upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_failed_multipart_is_aborted() {
    // Slow egress (15 MiB at 10 MB/s), so the parts are still being read when the file shrinks.
    let throttle = Throttle {
        egress: Limiter::new(10e6),
        ingress: Limiter::new(f64::INFINITY),
    };
    let store = s3_store("abort").await.with_throttle(throttle);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(3 * MIN_PART_SIZE as usize, 7)).unwrap();

    let shrink = async {
        // Once the upload exists (put_file has sized the file), cut the file to one part.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let uploads = store
                .client()
                .list_multipart_uploads()
                .bucket(store.bucket())
                .send()
                .await
                .unwrap();
            if !uploads.uploads().is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the multipart upload never started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let file = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        file.set_len(MIN_PART_SIZE).unwrap();
    };
    let (put, ()) = tokio::join!(store.put_file("torn", &src), shrink);
    let err = put.unwrap_err();
    assert!(err.to_string().contains("shrank"), "{err}");
    assert_eq!(store.head("torn").await.unwrap(), None);
    let uploads = store
        .client()
        .list_multipart_uploads()
        .bucket(store.bucket())
        .send()
        .await
        .unwrap();
    assert!(
        uploads.uploads().is_empty(),
        "left open: {:?}",
        uploads.uploads()
    );
    store.delete_bucket().await.unwrap();
}

/// A ranged download never mixes two versions: when the object is replaced midway, the ranges
/// requested after that fail (If-Match), get_file reports a retryable error, and the destination
/// and its directory are left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_overwrite_during_ranged_download_fails_cleanly() {
    // Four 5 MiB ranges, three at a time, at 20 MB/s: the fourth is requested about 0.8 s in.
    let throttle = Throttle {
        egress: Limiter::new(f64::INFINITY),
        ingress: Limiter::new(20e6),
    };
    let store = s3_store("mixed").await.with_throttle(throttle);
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    let size = 3 * MIN_PART_SIZE as usize + 1;
    std::fs::write(&old, pattern(size, 1)).unwrap();
    std::fs::write(&new, pattern(size, 2)).unwrap();
    store.put_file("k", &old).await.unwrap();

    let out_dir = dir.path().join("out");
    let dest = out_dir.join("dest");
    let overwrite = async {
        // Once the download has its temporary file, replace the object.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(&out_dir).map_or(0, |d| d.count()) == 0 {
            assert!(Instant::now() < deadline, "the download never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        store.put_file("k", &new).await.unwrap();
    };
    let (got, ()) = tokio::join!(store.get_file("k", &dest), overwrite);
    let err = got.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().contains("changed during the download"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // A retry gets the new version whole.
    store.get_file("k", &dest).await.unwrap();
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&new).unwrap());
    store.delete_bucket().await.unwrap();
}

/// Uploads are paced by the egress limiter and downloads by the ingress one. A lower bound only:
/// 16 MiB at 40 MB/s is 0.42 s, less the limiter's initial burst (its bucket starts full with
/// 0.1 s worth of bytes), so at least 0.32 s; we check 0.3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_throttle_limits_rate() {
    let rate = 40e6;
    let throttle = Throttle {
        egress: Limiter::new(rate),
        ingress: Limiter::new(rate),
    };
    let store = s3_store("throttle").await.with_throttle(throttle.clone());
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let size = 16 * 1024 * 1024;
    std::fs::write(&src, pattern(size, 3)).unwrap();
    // SeaweedFS allocates volumes on a bucket's first write (about a second); keep that out of
    // the printed rates.
    store
        .put_bytes("warm-up", bytes::Bytes::from_static(b"w"))
        .await
        .unwrap();

    let start = Instant::now();
    store.put_file("throttled", &src).await.unwrap();
    let up = start.elapsed();
    let start = Instant::now();
    store
        .get_file("throttled", &dir.path().join("dest"))
        .await
        .unwrap();
    let down = start.elapsed();
    eprintln!(
        "16 MiB at {} MB/s: upload {:.2} s ({:.1} MB/s), download {:.2} s ({:.1} MB/s)",
        rate / 1e6,
        up.as_secs_f64(),
        size as f64 / up.as_secs_f64() / 1e6,
        down.as_secs_f64(),
        size as f64 / down.as_secs_f64() / 1e6
    );
    assert!(up >= Duration::from_millis(300), "upload took {up:?}");
    assert!(down >= Duration::from_millis(300), "download took {down:?}");
    assert!(throttle.egress.total_bytes_consumed() >= size);
    assert!(throttle.ingress.total_bytes_consumed() >= size);
    store.delete_bucket().await.unwrap();
}

/// Random contents of random sizes, around and across the part size, come back byte-exact.
fn roundtrip_cases(store: &dyn ObjectStore, cases: u32, max_size: usize) {
    let runtime = runtime();
    roundtrip_cases_on(&runtime, store, cases, max_size);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn roundtrip_cases_on(
    runtime: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
    cases: u32,
    max_size: usize,
) {
    let scratch = tempfile::tempdir().unwrap();
    let config = ProptestConfig {
        cases,
        // Shrinking re-runs uploads; the failure message already says where bytes differ.
        max_shrink_iters: 16,
        ..ProptestConfig::default()
    };
    let case = AtomicU32::new(0);
    proptest!(config, |(size in prop_oneof![0..4096usize, 0..=max_size], seed in any::<u64>())| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let data = pattern(size, seed);
        let key = format!("prop/{n}");
        let result = runtime.block_on(conformance::roundtrip_file(
            store,
            &scratch.path().join(n.to_string()),
            &key,
            &data,
        ));
        prop_assert!(result.is_ok(), "size {size}: {}", result.unwrap_err());
        runtime.block_on(store.delete(&key)).unwrap();
    });
}

#[test]
fn memory_store_roundtrips_random_files() {
    roundtrip_cases(&MemoryStore::new(), 32, 256 * 1024);
}

#[test]
fn local_store_roundtrips_random_files() {
    let root = tempfile::tempdir().unwrap();
    roundtrip_cases(&LocalStore::new(root.path()).unwrap(), 32, 256 * 1024);
}

#[test]
fn s3_store_roundtrips_random_files() {
    let runtime = runtime();
    let store = runtime.block_on(s3_store("prop"));
    // Few cases: up to 2.5 parts each, so some take the multipart and ranged paths.
    roundtrip_cases_on(&runtime, &store, 6, 5 * MIN_PART_SIZE as usize / 2);
    runtime.block_on(store.delete_bucket()).unwrap();
}
