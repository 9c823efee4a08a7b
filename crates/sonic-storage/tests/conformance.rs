//! The conformance suite over every store, a byte-exactness property test, the S3 store's own
//! behaviour (multipart, throttling) against a real SeaweedFS, and the Redis memory tier's (literal
//! prefixes, a full server, outages) against a real `redis-server`.
//!
//! The S3 tests need SeaweedFS and fail, not skip, without it:
//! `bash deploy/seaweedfs.sh install && bash deploy/seaweedfs.sh start` and
//! `export SONIC_S3_ENDPOINT=http://127.0.0.1:8333`.
//!
//! The Redis tests start `redis-server`s of their own (no persistence, on free ports of 127.0.0.1,
//! killed at the end) and fail, not skip, when it is not on `PATH`: install Debian's
//! `redis-server` package.

#![allow(clippy::unwrap_used)] // a panic in a test is its failure report

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_speed_limit::Limiter;
use proptest::prelude::*;
use sonic_storage::conformance::{self, pattern};
use sonic_storage::local::LocalStore;
use sonic_storage::memory::MemoryStore;
use sonic_storage::redis::RedisStore;
use sonic_storage::s3::{MIN_PART_SIZE, S3Config, S3Store};
use sonic_storage::{ObjectStore, StoreError, Throttle};
use sonic_testkit::redis::RedisServer;

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

/// A plain connection to `server`, to look at what the store wrote.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every Redis key of the server, sorted.
async fn redis_keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await.unwrap();
    keys.sort();
    keys
}

fn object_keys(objects: &[sonic_storage::ObjectInfo]) -> Vec<&str> {
    objects.iter().map(|o| o.key.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_conforms() {
    let server = RedisServer::start(&[]);
    let scratch = tempfile::tempdir().unwrap();
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    conformance::run_all(&store, scratch.path()).await;
    assert!(store.list("").await.unwrap().is_empty());
    assert!(redis_keys(&mut raw(&server).await).await.is_empty());
}

#[test]
fn redis_store_roundtrips_random_files() {
    let runtime = runtime();
    let server = RedisServer::start(&[]);
    let store = runtime
        .block_on(RedisStore::connect(&server.url(), "sonic"))
        .unwrap();
    roundtrip_cases_on(&runtime, &store, 32, 256 * 1024);
}

/// Objects live under `<namespace>:<key>`, and namespaces do not see each other's objects, not
/// even one whose name is another's with glob characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_namespaces_are_separate() {
    let server = RedisServer::start(&[]);
    let url = server.url();
    let a = RedisStore::connect(&url, "sonic").await.unwrap();
    let b = RedisStore::connect(&url, "sonic2").await.unwrap();
    let glob = RedisStore::connect(&url, "t*").await.unwrap();
    let t = RedisStore::connect(&url, "tx").await.unwrap();
    for store in [&a, &b, &glob, &t] {
        store
            .put_bytes("j/k", bytes::Bytes::from(store.namespace().to_owned()))
            .await
            .unwrap();
    }
    assert_eq!(
        redis_keys(&mut raw(&server).await).await,
        ["sonic2:j/k", "sonic:j/k", "t*:j/k", "tx:j/k"]
    );
    for store in [&a, &b, &glob, &t] {
        let listed = store.list("").await.unwrap();
        assert_eq!(object_keys(&listed), ["j/k"], "{store:?}");
        assert_eq!(listed[0].size, store.namespace().len() as u64);
        assert_eq!(
            store.get_bytes("j/k").await.unwrap(),
            store.namespace().as_bytes()
        );
    }
    assert_eq!(glob.delete_prefix("").await.unwrap(), 1);
    assert_eq!(t.head("j/k").await.unwrap(), Some(2));
    assert_eq!(a.delete_prefix("j/").await.unwrap(), 1);
    assert_eq!(
        redis_keys(&mut raw(&server).await).await,
        ["sonic2:j/k", "tx:j/k"]
    );
}

/// A prefix with glob characters (`*`, `?`, `[`, `]`) lists and deletes only its literal matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_glob_characters_in_prefixes_match_literally() {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    let all = [
        "g/a*b/1", "g/a*b/2", "g/axb/1", "g/a?b", "g/aXb", "g/[ab]/1", "g/a/1", "g/b/1", "g/a]",
    ];
    for key in all {
        store
            .put_bytes(key, bytes::Bytes::from_static(b"v"))
            .await
            .unwrap();
    }
    let cases: [(&str, &[&str]); 7] = [
        ("g/a*b/", &["g/a*b/1", "g/a*b/2"]),
        ("g/a*", &["g/a*b/1", "g/a*b/2"]),
        ("g/a?", &["g/a?b"]),
        ("g/[ab]/", &["g/[ab]/1"]),
        ("g/[", &["g/[ab]/1"]),
        ("g/a]", &["g/a]"]),
        ("g/*", &[]),
    ];
    for (prefix, want) in cases {
        let listed = store.list(prefix).await.unwrap();
        assert_eq!(object_keys(&listed), want, "list {prefix:?}");
    }
    assert_eq!(store.delete_prefix("g/a*b/").await.unwrap(), 2);
    assert_eq!(store.delete_prefix("g/[ab]/").await.unwrap(), 1);
    assert_eq!(store.delete_prefix("g/*").await.unwrap(), 0);
    let left = store.list("g/").await.unwrap();
    assert_eq!(
        object_keys(&left),
        ["g/a/1", "g/a?b", "g/aXb", "g/a]", "g/axb/1", "g/b/1"]
    );
}

/// A server at its memory limit refuses a large object with `Full` (not `Unavailable`: retrying
/// would not help) and stores nothing under its key; the connection stays usable, and small
/// objects fit again once the server has freed the refused value's buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_full_server_refuses_with_full() {
    let server = RedisServer::start(&["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]);
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    let size = 4 * 1024 * 1024;
    let err = store
        .put_bytes("big", bytes::Bytes::from(pattern(size, 5)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert!(
        msg.contains("full") && msg.contains(&size.to_string()),
        "{msg}"
    );
    assert!(msg.contains(&server.url()), "{msg}");

    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    std::fs::write(&src, pattern(size, 6)).unwrap();
    let err = store.put_file("big", &src).await.unwrap_err();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");

    assert_eq!(store.head("big").await.unwrap(), None);
    assert!(store.list("").await.unwrap().is_empty());
    assert!(redis_keys(&mut raw(&server).await).await.is_empty());

    // The server keeps the refused value's query buffer for a while (it shrinks idle clients'
    // buffers after about 2 s), and refuses even small writes until then, with `Full` too.
    let started = Instant::now();
    loop {
        match store
            .put_bytes("small", bytes::Bytes::from_static(b"fits"))
            .await
        {
            Ok(()) => break,
            Err(StoreError::Full(_)) if started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("after {:?}: {e:?}", started.elapsed()),
        }
    }
    eprintln!("a small object fits again after {:?}", started.elapsed());
    assert_eq!(store.head("small").await.unwrap(), Some(4));
}

/// A value over the server's `proto-max-bulk-len` is refused as too large before it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_too_large_object_is_refused_with_full() {
    let server = RedisServer::start(&["--proto-max-bulk-len", "1mb"]);
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    assert_eq!(store.max_value_size(), 1024 * 1024);
    let size = 2 * 1024 * 1024;
    let err = store
        .put_bytes("big", bytes::Bytes::from(pattern(size, 7)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert!(
        msg.contains("too large") && msg.contains(&size.to_string()),
        "{msg}"
    );
    assert_eq!(store.head("big").await.unwrap(), None);
    let exact = bytes::Bytes::from(pattern(1024 * 1024, 8));
    store.put_bytes("exact", exact.clone()).await.unwrap();
    assert_eq!(store.get_bytes("exact").await.unwrap(), exact);
}

/// A limit lowered after the store connected: the server drops the connection on the long value,
/// and the store, asking the limit again, reports `Full` rather than an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limit_lowered_after_connecting_is_full() {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    assert_eq!(store.max_value_size(), 512 * 1024 * 1024);
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("proto-max-bulk-len")
        .arg("1mb")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    let size = 2 * 1024 * 1024;
    let err = store
        .put_bytes("big", bytes::Bytes::from(pattern(size, 9)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert!(
        msg.contains("too large") && msg.contains(&size.to_string()),
        "{msg}"
    );
    assert_eq!(store.max_value_size(), 1024 * 1024);
    // Now refused before sending; the reconnected store works.
    let err = store
        .put_bytes("big", bytes::Bytes::from(pattern(size, 9)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert_eq!(store.head("big").await.unwrap(), None);
    store
        .put_bytes("small", bytes::Bytes::from_static(b"s"))
        .await
        .unwrap();
}

/// A killed server makes calls fail with `Unavailable`, naming the URL, within the timeouts; once
/// it is back on the same port, the same store works again.
/// A server restarted between two calls (a tier restarted while nothing used it): the first call
/// finds its connection broken, and is sent again on a new one rather than failing (a control
/// plane cleaning a job's files after it makes one call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_between_calls_answers_the_next_call() {
    let mut server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url(), "sonic").await.unwrap();
    for round in 0..3 {
        store
            .put_bytes("jobs/j/a", bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
        server.restart();
        // Nothing persists: the restarted server is empty, and the first call goes through.
        assert_eq!(store.head("jobs/j/a").await.unwrap(), None, "round {round}");
        store
            .put_bytes("jobs/j/b", bytes::Bytes::from_static(b"y"))
            .await
            .unwrap();
        server.restart();
        assert_eq!(
            store.delete_prefix("jobs/j/").await.unwrap(),
            0,
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_is_unavailable_then_recovers() {
    let mut server = RedisServer::start(&[]);
    let url = server.url();
    let (connect, response) = (Duration::from_secs(1), Duration::from_secs(2));
    let store = RedisStore::connect(&url, "sonic")
        .await
        .unwrap()
        .with_timeouts(connect, response)
        .await
        .unwrap();
    store
        .put_bytes("k", bytes::Bytes::from_static(b"before"))
        .await
        .unwrap();

    server.kill();
    for i in 0..3 {
        let started = Instant::now();
        let err = store.head("k").await.unwrap_err();
        let took = started.elapsed();
        let msg = err.to_string();
        assert!(
            matches!(err, StoreError::Unavailable(_)),
            "call {i}: {err:?}"
        );
        assert!(
            msg.contains(&format!("memory tier {url}")),
            "call {i}: {msg}"
        );
        assert!(took <= connect + response, "call {i} took {took:?}");
        eprintln!("call {i} while the server is down: {took:?}: {msg}");
    }

    server.restart();
    // The manager reconnects in the background; the first call may still report the failed
    // reconnection of the outage (and starts a new one). Within a few calls, the store works.
    let started = Instant::now();
    let mut failures = Vec::new();
    loop {
        match store
            .put_bytes("k", bytes::Bytes::from_static(b"after"))
            .await
        {
            Ok(()) => break,
            Err(e) => {
                assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
                failures.push(e.to_string());
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no recovery within 10 s: {failures:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!(
        "recovered after {:?}, {} failed calls: {failures:?}",
        started.elapsed(),
        failures.len()
    );
    assert!(failures.len() <= 1, "{failures:?}");
    assert_eq!(store.get_bytes("k").await.unwrap(), "after");
    assert_eq!(store.head("k").await.unwrap(), Some(5));
    assert_eq!(object_keys(&store.list("").await.unwrap()), ["k"]);
}

/// A stopped server (SIGSTOP: connections accepted, nothing answered) makes calls fail with
/// `Unavailable` after the response timeout instead of hanging; once it continues, calls work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_server_times_out_then_recovers() {
    let server = RedisServer::start(&[]);
    let url = server.url();
    let (connect, response) = (Duration::from_secs(1), Duration::from_secs(1));
    let store = RedisStore::connect(&url, "sonic")
        .await
        .unwrap()
        .with_timeouts(connect, response)
        .await
        .unwrap();
    store
        .put_bytes("k", bytes::Bytes::from_static(b"v"))
        .await
        .unwrap();

    server.signal("-STOP");
    let started = Instant::now();
    let err = store.get_bytes("k").await.unwrap_err();
    let took = started.elapsed();
    server.signal("-CONT");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(msg.contains(&format!("memory tier {url}")), "{msg}");
    assert!(
        took >= response / 2 && took <= connect + response + Duration::from_millis(500),
        "took {took:?}"
    );
    eprintln!("call to the stopped server: {took:?}: {msg}");

    assert_eq!(store.get_bytes("k").await.unwrap(), "v");
    store
        .put_bytes("k", bytes::Bytes::from_static(b"w"))
        .await
        .unwrap();
    assert_eq!(store.get_bytes("k").await.unwrap(), "w");
}
