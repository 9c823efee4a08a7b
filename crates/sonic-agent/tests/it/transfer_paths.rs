//! The three ways to pass a file, end to end between two in-process agents: byte-exactness of each
//! (property test), resume after a cut connection, restart after a corrupted one, `vm-storage`
//! links (inode shared, never a copy, refused across filesystems), and the namespace's atomicity,
//! idempotence and restart behaviour.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::transfer_support::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sonic_agent::files::{FileError, FileStore, checksum_bytes, link_local};
use sonic_agent::throttle::{AgentThrottle, BandwidthMeter};
use sonic_agent::transfer::{
    DirectSource, RetryPolicy, TransferError, download_remote, fetch_direct, fetch_direct_with,
    upload_remote,
};
use sonic_storage::ObjectStore;
use sonic_storage::local::LocalStore;
use sonic_storage::memory::MemoryStore;

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

struct World {
    a: TestAgent,
    b: TestAgent,
    http: reqwest::Client,
    memory: MemoryStore,
    local: LocalStore,
    _store_dir: tempfile::TempDir,
}

/// Passes `content` every way and checks each copy byte for byte.
async fn pass_every_way(w: &World, case: usize, content: &[u8]) -> Result<(), String> {
    let src_path = format!("pca/{case}/train/data.bin");
    let meta = w.a.put(&src_path, content);
    if meta.size != content.len() as u64 || meta.checksum != checksum_bytes(content) {
        return Err(format!("registration {meta:?}"));
    }
    let check = |what: &str, got: Vec<u8>| -> Result<(), String> {
        if got == content {
            Ok(())
        } else {
            Err(format!(
                "{what}: {} bytes differ from {}",
                got.len(),
                content.len()
            ))
        }
    };

    // vm-storage: a hard link inside agent A.
    let linked =
        w.a.files
            .link(
                &job(),
                &fpath(&src_path),
                &job(),
                &fpath(&format!("in/{case}/data.bin")),
            )
            .map_err(|e| e.to_string())?;
    if linked.checksum != meta.checksum {
        return Err("link changed the checksum".into());
    }
    let src_file =
        w.a.files
            .resolve(&job(), &fpath(&src_path))
            .map_err(|e| e.to_string())?;
    let dst_file =
        w.a.files
            .resolve(&job(), &fpath(&linked.path))
            .map_err(|e| e.to_string())?;
    let (si, di) = (
        std::fs::metadata(&src_file).map_err(|e| e.to_string())?,
        std::fs::metadata(&dst_file).map_err(|e| e.to_string())?,
    );
    if si.ino() != di.ino() {
        return Err("vm-storage copied instead of linking".into());
    }
    check(
        "vm-storage",
        std::fs::read(&dst_file).map_err(|e| e.to_string())?,
    )?;

    // direct: B fetches from A's file server.
    let dest =
        w.b.files
            .prepare_write(&job(), &fpath(&src_path))
            .map_err(|e| e.to_string())?;
    let stats = fetch_direct(
        &w.http,
        &w.a.url,
        JOB,
        &src_path,
        &token(&src_path),
        &dest,
        Some(&w.b.throttle.storage_throttle()),
        &w.b.meter,
    )
    .await
    .map_err(|e| e.to_string())?;
    if stats.bytes != meta.size || stats.checksum != meta.checksum || stats.attempts != 1 {
        return Err(format!("direct stats {stats:?}"));
    }
    check("direct", std::fs::read(&dest).map_err(|e| e.to_string())?)?;
    let registered =
        w.b.files
            .register_verified(&job(), &fpath(&src_path), stats.bytes, &stats.checksum)
            .map_err(|e| e.to_string())?;
    if registered != meta {
        return Err(format!("registered on B as {registered:?}"));
    }

    // remote: through each store double.
    let stores: [(&str, &dyn ObjectStore); 2] = [("memory", &w.memory), ("local", &w.local)];
    for (name, store) in stores {
        let key = format!("jobs/{JOB}/{src_path}");
        let src =
            w.a.files
                .resolve(&job(), &fpath(&src_path))
                .map_err(|e| e.to_string())?;
        let (a_before, b_before) = (w.a.meter.snapshot(), w.b.meter.snapshot());
        let up = upload_remote(store, &key, &src)
            .await
            .map_err(|e| e.to_string())?;
        let dest_path = format!("remote/{name}/{case}/data.bin");
        let dest =
            w.b.files
                .prepare_write(&job(), &fpath(&dest_path))
                .map_err(|e| e.to_string())?;
        let down = download_remote(store, &key, &dest)
            .await
            .map_err(|e| e.to_string())?;
        // The store's rate is not the NIC's: neither meter took a sample.
        if w.a.meter.snapshot() != a_before || w.b.meter.snapshot() != b_before {
            return Err(format!("remote via {name} moved a bandwidth meter"));
        }
        if up.checksum != meta.checksum || down.checksum != meta.checksum || down.bytes != meta.size
        {
            return Err(format!("remote via {name}: {up:?} {down:?}"));
        }
        check(name, std::fs::read(&dest).map_err(|e| e.to_string())?)?;
    }
    Ok(())
}

#[test]
fn every_passing_method_is_byte_exact() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store_dir = tempfile::tempdir().expect("tempdir");
    let world = rt.block_on(async {
        World {
            a: TestAgent::start(AgentThrottle::unlimited()).await,
            b: TestAgent::start(AgentThrottle::unlimited()).await,
            http: sonic_agent::transfer::http_client(None).expect("client"),
            memory: MemoryStore::new(),
            local: LocalStore::new(store_dir.path()).expect("local store"),
            _store_dir: store_dir,
        }
    });
    let sizes = prop_oneof![
        1 => Just(0usize),
        1 => Just(1usize),
        2 => 0usize..70_000,
        // Around the file server's chunk size.
        2 => (512usize * 1024 - 2)..(512 * 1024 + 2),
        4 => 0usize..(4 << 20),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0usize);
    runner
        .run(&(sizes, any::<u64>()), |(len, seed)| {
            case.set(case.get() + 1);
            let content = data(seed, len);
            rt.block_on(pass_every_way(&world, case.get(), &content))
                .map_err(TestCaseError::fail)
        })
        .expect("byte-exact");
    assert!(case.get() >= 12, "only {} cases ran", case.get());
    assert!(temp_files(world.a.dir.path()).is_empty());
    assert!(temp_files(world.b.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_transfer_resumes_with_range() {
    let a = TestAgent::start(AgentThrottle::unlimited()).await;
    let b = TestAgent::start(AgentThrottle::unlimited()).await;
    let content = data(7, 3 << 20);
    let meta = a.put("map/0/reduce/part-0", &content);
    // Cut the first answer after 1 MiB + 3 bytes and the second after 700 000 more. (What reaches
    // the client is what the server flushed before the cut: whole chunks, not the torn last one.)
    let proxy = proxy(
        a.router(),
        vec![
            Some(Mischief::CutAfter((1 << 20) + 3)),
            Some(Mischief::CutAfter(700_000)),
        ],
    )
    .await;
    let dest = b
        .files
        .prepare_write(&job(), &fpath("map/0/reduce/part-0"))
        .expect("dest");
    let tok = token("map/0/reduce/part-0");
    let src = DirectSource {
        peer_url: &proxy.url,
        job: JOB,
        path: "map/0/reduce/part-0",
        token: &tok,
    };
    let http = sonic_agent::transfer::http_client(None).expect("client");
    let meter = BandwidthMeter::default();
    let stats = fetch_direct_with(&http, &src, &dest, None, &meter, &quick_retry())
        .await
        .expect("fetch resumes");
    assert_eq!(stats.attempts, 3);
    assert_eq!(stats.checksum, meta.checksum);
    assert_eq!(std::fs::read(&dest).expect("read"), content);

    let ranges = proxy.ranges.lock().expect("lock").clone();
    assert_eq!(ranges.len(), 3, "{ranges:?}");
    assert_eq!(ranges[0], None);
    // Each retry asks only for what is missing: at least what the cut answer delivered, and
    // nothing beyond it (the client may have lost the tail of a chunk in flight, never more).
    let offset = |r: &Option<String>| -> u64 {
        r.as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse().ok())
            .expect("a bytes=N- range")
    };
    let first = offset(&ranges[1]);
    let second = offset(&ranges[2]);
    assert!(first > 0 && first <= (1 << 20) + 3, "{ranges:?}");
    assert!(second > first && second <= first + 700_000, "{ranges:?}");
    assert!(temp_files(b.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_transfer_starts_over_then_gives_up() {
    let a = TestAgent::start(AgentThrottle::unlimited()).await;
    let b = TestAgent::start(AgentThrottle::unlimited()).await;
    let content = data(9, 200_000);
    let meta = a.put("x/0/y/file", &content);
    let tok = token("x/0/y/file");
    fn src_with<'a>(url: &'a str, tok: &'a str) -> DirectSource<'a> {
        DirectSource {
            peer_url: url,
            job: JOB,
            path: "x/0/y/file",
            token: tok,
        }
    }
    let http = sonic_agent::transfer::http_client(None).expect("client");
    let meter = BandwidthMeter::default();
    let dest = b
        .files
        .prepare_write(&job(), &fpath("x/0/y/file"))
        .expect("dest");

    // Once corrupted: the complete file fails its checksum, the client starts over from zero.
    let once = proxy(a.router(), vec![Some(Mischief::Corrupt)]).await;
    let stats = fetch_direct_with(
        &http,
        &src_with(&once.url, &tok),
        &dest,
        None,
        &meter,
        &quick_retry(),
    )
    .await
    .expect("second try is clean");
    assert_eq!(stats.checksum, meta.checksum);
    assert_eq!(std::fs::read(&dest).expect("read"), content);
    assert_eq!(*once.ranges.lock().expect("lock"), vec![None, None]);

    // Always corrupted: gives up with a checksum error and leaves nothing behind.
    let always = proxy(a.router(), vec![Some(Mischief::Corrupt); 10]).await;
    let dest2 = b
        .files
        .prepare_write(&job(), &fpath("x/0/y/other"))
        .expect("dest");
    let err = fetch_direct_with(
        &http,
        &src_with(&always.url, &tok),
        &dest2,
        None,
        &meter,
        &quick_retry(),
    )
    .await
    .expect_err("always corrupt");
    assert!(
        matches!(&err, TransferError::ChecksumMismatch { expected, .. } if *expected == meta.checksum),
        "{err}"
    );
    assert!(!dest2.exists());
    assert!(temp_files(b.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_exhausts_bounded_attempts() {
    // A port that was just free: connections are refused.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let b = TestAgent::start(AgentThrottle::unlimited()).await;
    let dest = b.files.prepare_write(&job(), &fpath("a/b")).expect("dest");
    let url = format!("http://{addr}");
    let src = DirectSource {
        peer_url: &url,
        job: JOB,
        path: "a/b",
        token: "t",
    };
    let http = sonic_agent::transfer::http_client(None).expect("client");
    let policy = RetryPolicy {
        max_attempts: 3,
        ..quick_retry()
    };
    let err = fetch_direct_with(
        &http,
        &src,
        &dest,
        None,
        &BandwidthMeter::default(),
        &policy,
    )
    .await
    .expect_err("nobody listens");
    assert!(
        matches!(err, TransferError::Exhausted { attempts: 3, .. }),
        "{err}"
    );
    assert!(!dest.exists());
    assert!(temp_files(b.dir.path()).is_empty());
}

#[test]
fn vm_storage_links_in_constant_time_whatever_the_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, size) in [("small", 1u64 << 10), ("huge", 1u64 << 30)] {
        let src = dir.path().join(format!("{name}.src"));
        // Sparse: a GiB of size without a GiB of disk.
        std::fs::File::create(&src)
            .and_then(|f| f.set_len(size))
            .expect("create");
        let dst = dir.path().join(format!("{name}.dst"));
        link_local(&src, &dst).expect("link");
        let (s, d) = (
            std::fs::metadata(&src).expect("src"),
            std::fs::metadata(&dst).expect("dst"),
        );
        assert_eq!(
            (s.dev(), s.ino()),
            (d.dev(), d.ino()),
            "{name}: not the same inode"
        );
        assert_eq!(d.nlink(), 2);
        assert_eq!(d.len(), size);
        // A retried link replaces the earlier one and leaves no temporary name behind.
        link_local(&src, &dst).expect("relink");
        assert_eq!(std::fs::metadata(&dst).expect("dst").nlink(), 2);
    }
    assert!(temp_files(dir.path()).is_empty());
}

#[test]
fn vm_storage_refuses_to_cross_filesystems_instead_of_copying() {
    let shm = std::path::Path::new("/dev/shm");
    let here = tempfile::tempdir().expect("tempdir");
    let there = tempfile::tempdir_in(shm)
        .expect("this test needs a writable /dev/shm (tmpfs) as a second filesystem");
    assert_ne!(
        std::fs::metadata(here.path()).expect("here").dev(),
        std::fs::metadata(there.path()).expect("there").dev(),
        "this test needs /dev/shm on another filesystem than the temp dir"
    );
    let src = here.path().join("f");
    std::fs::write(&src, b"data").expect("write");
    let dst = there.path().join("f");
    let err = link_local(&src, &dst).expect_err("cross-device");
    assert!(matches!(err, FileError::CrossDevice), "{err}");
    assert!(!dst.exists(), "nothing may be copied");
    assert!(temp_files(there.path()).is_empty());
}

#[test]
fn writes_are_atomic_idempotent_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = FileStore::open(dir.path()).expect("open");
    let (j, p) = (job(), fpath("f/0/g/out"));
    let first = files.write_atomic(&j, &p, b"first attempt").expect("write");
    // A retried writer overwrites its own file.
    let second = files.write_atomic(&j, &p, b"second").expect("rewrite");
    assert_ne!(first.checksum, second.checksum);
    assert_eq!(
        std::fs::read(files.resolve(&j, &p).expect("path")).expect("read"),
        b"second"
    );
    assert!(temp_files(dir.path()).is_empty());

    // A restarted agent keeps the registrations (the latest one).
    drop(files);
    let files = FileStore::open(dir.path()).expect("reopen");
    assert_eq!(files.meta(&j, &p).expect("meta"), Some(second.clone()));
    let opened = files.open_read(&j, &p).expect("open");
    assert_eq!(opened.meta, second);
    assert_eq!(files.list(&j).expect("list"), vec![second]);

    // Modified behind the agent's back: refused until registered again.
    std::fs::write(files.resolve(&j, &p).expect("path"), b"tampered!").expect("tamper");
    assert!(matches!(files.open_read(&j, &p), Err(FileError::Changed)));
    let again = files.register_output(&j, &p).expect("register");
    assert_eq!(again.checksum, checksum_bytes(b"tampered!"));
    assert!(files.open_read(&j, &p).is_ok());

    // A file nobody registered is not visible.
    std::fs::write(files.files_dir(&j).join("f/0/g/unregistered"), b"x").expect("write");
    assert!(matches!(
        files.open_read(&j, &fpath("f/0/g/unregistered")),
        Err(FileError::NotFound)
    ));

    files.delete_job(&j).expect("delete");
    assert!(!files.files_dir(&j).exists());
    assert_eq!(files.meta(&j, &p).expect("meta"), None);
    files.delete_job(&j).expect("deleting twice is fine");
}
