//! The behaviour every [`ObjectStore`] must show, as a suite any store (and any future one) runs:
//! `tests/conformance.rs` runs it over the S3, local, memory and Redis stores.
//!
//! Each check writes under its own `conf/<check>/` prefix and returns the first violation as a
//! [`Failure`]; [`run_all`] runs them all and panics with that description, for use in tests.
//! For an S3 store, configure a part size below [`LARGE_FILE_SIZE`] (5 MiB, S3's minimum) so the
//! multipart upload and ranged download paths run too.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::{ObjectInfo, ObjectStore, StoreError};

/// The size of the large file of [`roundtrip_files`]: over two 5 MiB parts, not a multiple of one.
pub const LARGE_FILE_SIZE: usize = 11 * 1024 * 1024 + 7;

/// Keys every store must refuse, with why.
pub const INVALID_KEYS: &[&str] = &[
    "", "/abs", "a/../b", "..", "./a", "a/.", "a//b", "a/", "a\\b", "a\0b",
];

/// A violated expectation: which check, and what happened.
#[derive(Debug)]
pub struct Failure {
    pub check: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conformance check {} failed: {}",
            self.check, self.detail
        )
    }
}

impl std::error::Error for Failure {}

macro_rules! ensure {
    ($check:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure { check: $check, detail: format!($($fmt)+) });
        }
    };
}

/// Turns an unexpected error into a [`Failure`] that says which call failed.
trait Context<T> {
    fn ctx(self, check: &'static str, what: impl std::fmt::Display) -> Result<T, Failure>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, check: &'static str, what: impl std::fmt::Display) -> Result<T, Failure> {
        self.map_err(|e| Failure {
            check,
            detail: format!("{what}: unexpected error: {e}"),
        })
    }
}

/// Deterministic pseudo-random bytes (splitmix64), so large test data needs no RNG crate.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Runs every check, then removes what they wrote.
///
/// # Panics
///
/// On the first violated expectation, with a message that names the check.
pub async fn run_all(store: &dyn ObjectStore, scratch_dir: &Path) {
    if let Err(failure) = try_run_all(store, scratch_dir).await {
        panic!("{failure} (store: {store:?})");
    }
}

/// [`run_all`], returning the first failure instead of panicking.
pub async fn try_run_all(store: &dyn ObjectStore, scratch_dir: &Path) -> Result<(), Failure> {
    roundtrip_bytes(store).await?;
    roundtrip_files(store, &scratch_dir.join("roundtrip")).await?;
    streams(store).await?;
    overwrite(store, &scratch_dir.join("overwrite")).await?;
    missing(store, &scratch_dir.join("missing")).await?;
    list_by_prefix(store).await?;
    delete(store).await?;
    delete_prefix(store).await?;
    invalid_keys(store, &scratch_dir.join("invalid")).await?;
    cleanup(store).await
}

fn keys(objects: &[ObjectInfo]) -> Vec<&str> {
    objects.iter().map(|o| o.key.as_str()).collect()
}

fn create_dir(check: &'static str, dir: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(dir).ctx(check, format!("creating {}", dir.display()))
}

/// Sorted names in `dir` (empty when it does not exist).
fn dir_names(check: &'static str, dir: &Path) -> Result<Vec<String>, Failure> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).ctx(check, format!("reading {}", dir.display())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.ctx(check, format!("reading {}", dir.display()))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Bytes round-trip exactly, including an empty object, every byte value and a key that needs
/// escaping in a URL.
pub async fn roundtrip_bytes(store: &dyn ObjectStore) -> Result<(), Failure> {
    const C: &str = "roundtrip_bytes";
    let all_values: Vec<u8> = (0..=255u8).cycle().take(3 * 256 + 17).collect();
    let cases: [(&str, Vec<u8>); 4] = [
        ("conf/bytes/all-values", all_values),
        ("conf/bytes/empty", Vec::new()),
        (
            "conf/bytes/with space, ünïcode & +%?=#.bin",
            b"escaped".to_vec(),
        ),
        ("conf/bytes/random", pattern(200_003, 1)),
    ];
    for (key, data) in &cases {
        store
            .put_bytes(key, Bytes::from(data.clone()))
            .await
            .ctx(C, format!("put_bytes {key:?}"))?;
        let got = store
            .get_bytes(key)
            .await
            .ctx(C, format!("get_bytes {key:?}"))?;
        ensure!(
            C,
            got.as_ref() == data.as_slice(),
            "get_bytes {key:?} returned {} bytes that differ from the {} put",
            got.len(),
            data.len()
        );
        let size = store.head(key).await.ctx(C, format!("head {key:?}"))?;
        ensure!(
            C,
            size == Some(data.len() as u64),
            "head {key:?} = {size:?}, want {}",
            data.len()
        );
    }
    let listed = store.list("conf/bytes/").await.ctx(C, "list conf/bytes/")?;
    let mut want: Vec<ObjectInfo> = cases
        .iter()
        .map(|(key, data)| ObjectInfo {
            key: (*key).to_owned(),
            size: data.len() as u64,
        })
        .collect();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    ensure!(
        C,
        listed == want,
        "list conf/bytes/ = {listed:?}, want {want:?}"
    );
    Ok(())
}

/// Uploads `data` from a file and downloads it into another, checking sizes and bytes; the
/// download leaves no temporary file beside the destination.
pub async fn roundtrip_file(
    store: &dyn ObjectStore,
    scratch_dir: &Path,
    key: &str,
    data: &[u8],
) -> Result<(), Failure> {
    const C: &str = "roundtrip_file";
    let src = scratch_dir.join("src");
    let out_dir = scratch_dir.join("out");
    create_dir(C, scratch_dir)?;
    std::fs::write(&src, data).ctx(C, format!("writing {}", src.display()))?;
    let put = store
        .put_file(key, &src)
        .await
        .ctx(C, format!("put_file {key:?}"))?;
    ensure!(
        C,
        put == data.len() as u64,
        "put_file {key:?} returned {put}, want {}",
        data.len()
    );
    let size = store.head(key).await.ctx(C, format!("head {key:?}"))?;
    ensure!(
        C,
        size == Some(data.len() as u64),
        "head {key:?} = {size:?}, want {}",
        data.len()
    );

    // Into a directory that does not exist yet: get_file creates it.
    let dest = out_dir.join("copy");
    let got = store
        .get_file(key, &dest)
        .await
        .ctx(C, format!("get_file {key:?}"))?;
    ensure!(
        C,
        got == data.len() as u64,
        "get_file {key:?} returned {got}, want {}",
        data.len()
    );
    let read = std::fs::read(&dest).ctx(C, format!("reading {}", dest.display()))?;
    ensure!(
        C,
        read == data,
        "{key:?}: downloaded {} bytes differ from the {} uploaded (first difference at {:?})",
        read.len(),
        data.len(),
        read.iter().zip(data).position(|(a, b)| a != b)
    );
    let names = dir_names(C, &out_dir)?;
    ensure!(
        C,
        names == ["copy"],
        "get_file left {names:?} in its directory, want only the file"
    );
    std::fs::remove_dir_all(scratch_dir).ctx(C, "removing scratch")?;
    Ok(())
}

/// Files of several sizes round-trip, from empty to [`LARGE_FILE_SIZE`] (multipart and ranged GET
/// on an S3 store with 5 MiB parts).
pub async fn roundtrip_files(store: &dyn ObjectStore, scratch_dir: &Path) -> Result<(), Failure> {
    for (i, size) in [0, 1, 64 * 1024 + 3, LARGE_FILE_SIZE]
        .into_iter()
        .enumerate()
    {
        let key = format!("conf/files/{size}");
        roundtrip_file(
            store,
            &scratch_dir.join(i.to_string()),
            &key,
            &pattern(size, i as u64),
        )
        .await?;
    }
    Ok(())
}

/// An object read as a stream is the object, in order, from empty to over a megabyte (in several
/// chunks where the store streams); a missing one is `NotFound`.
pub async fn streams(store: &dyn ObjectStore) -> Result<(), Failure> {
    use futures::TryStreamExt;
    const C: &str = "streams";
    for (i, size) in [0usize, 5, 1024 * 1024 + 11].into_iter().enumerate() {
        let key = format!("conf/stream/{size}");
        let data = pattern(size, 40 + i as u64);
        store
            .put_bytes(&key, Bytes::from(data.clone()))
            .await
            .ctx(C, format!("put_bytes {key}"))?;
        let chunks: Vec<Bytes> = store
            .get_stream(&key)
            .await
            .ctx(C, format!("get_stream {key}"))?
            .try_collect()
            .await
            .ctx(C, format!("reading the stream of {key}"))?;
        let got: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        ensure!(
            C,
            got == data,
            "get_stream {key} gave {} bytes that differ from the {} put",
            got.len(),
            data.len()
        );
        store.delete(&key).await.ctx(C, format!("delete {key}"))?;
    }
    let missing = store.get_stream("conf/stream/never-written").await;
    ensure!(
        C,
        matches!(missing, Err(StoreError::NotFound(_))),
        "get_stream of a missing object is not NotFound: {:?}",
        missing.map(|_| "a stream")
    );
    Ok(())
}

/// An overwrite replaces the whole object (a shorter one leaves no tail of the longer), repeating
/// it changes nothing, a reader during overwrites sees one version or the other whole, and
/// get_file replaces an existing destination file.
pub async fn overwrite(store: &dyn ObjectStore, scratch_dir: &Path) -> Result<(), Failure> {
    const C: &str = "overwrite";
    let key = "conf/overwrite/k";
    let long = Bytes::from(vec![b'a'; 256 * 1024]);
    let short = Bytes::from(pattern(100 * 1024, 2));
    for data in [&long, &short, &short] {
        store
            .put_bytes(key, data.clone())
            .await
            .ctx(C, "put_bytes")?;
        let got = store.get_bytes(key).await.ctx(C, "get_bytes")?;
        ensure!(
            C,
            got == data,
            "after writing {} bytes, read {} other bytes",
            data.len(),
            got.len()
        );
    }
    let listed = store.list("conf/overwrite/").await.ctx(C, "list")?;
    ensure!(
        C,
        listed
            == [ObjectInfo {
                key: key.to_owned(),
                size: short.len() as u64
            }],
        "list after overwrites = {listed:?}"
    );

    // Concurrent readers and writers: every read is one version, whole.
    let writes = async {
        for i in 0..8 {
            let data = if i % 2 == 0 { &long } else { &short };
            store
                .put_bytes(key, data.clone())
                .await
                .ctx(C, "concurrent put_bytes")?;
        }
        Ok::<(), Failure>(())
    };
    let reads = async {
        for _ in 0..16 {
            let got = store.get_bytes(key).await.ctx(C, "concurrent get_bytes")?;
            ensure!(
                C,
                got == long || got == short,
                "a read during overwrites returned {} bytes that are neither version",
                got.len()
            );
        }
        Ok::<(), Failure>(())
    };
    let (written, read) = futures::join!(writes, reads);
    written?;
    read?;

    // get_file replaces a longer existing file completely.
    create_dir(C, scratch_dir)?;
    let src = scratch_dir.join("src");
    let dest = scratch_dir.join("dest");
    let new = pattern(70_000, 3);
    std::fs::write(&src, &new).ctx(C, "writing src")?;
    std::fs::write(&dest, vec![b'x'; 300_000]).ctx(C, "writing dest")?;
    store
        .put_file(key, &src)
        .await
        .ctx(C, "put_file over an existing object")?;
    store
        .get_file(key, &dest)
        .await
        .ctx(C, "get_file over an existing file")?;
    let read = std::fs::read(&dest).ctx(C, "reading dest")?;
    ensure!(
        C,
        read == new,
        "get_file over an existing file left {} bytes, want the new {}",
        read.len(),
        new.len()
    );
    let names = dir_names(C, scratch_dir)?;
    ensure!(
        C,
        names == ["dest", "src"],
        "scratch holds {names:?}; a temporary file was left"
    );
    Ok(())
}

fn is_not_found<T>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::NotFound(_)))
}

/// A missing object: head is None, get is NotFound, get_file creates nothing and leaves an existing
/// destination alone.
pub async fn missing(store: &dyn ObjectStore, scratch_dir: &Path) -> Result<(), Failure> {
    const C: &str = "missing";
    let key = "conf/missing/never-written";
    let head = store.head(key).await.ctx(C, "head")?;
    ensure!(C, head.is_none(), "head of a missing object = {head:?}");
    let got = store.get_bytes(key).await;
    ensure!(
        C,
        is_not_found(&got),
        "get_bytes of a missing object = {:?}",
        got.map(|b| b.len())
    );

    create_dir(C, scratch_dir)?;
    let dest = scratch_dir.join("sub").join("dest");
    let got = store.get_file(key, &dest).await;
    ensure!(
        C,
        is_not_found(&got),
        "get_file of a missing object = {got:?}"
    );
    let names = dir_names(C, scratch_dir)?;
    ensure!(
        C,
        names.is_empty(),
        "get_file of a missing object created {names:?}"
    );

    let existing = scratch_dir.join("existing");
    std::fs::write(&existing, b"keep me").ctx(C, "writing existing")?;
    let got = store.get_file(key, &existing).await;
    ensure!(
        C,
        is_not_found(&got),
        "get_file of a missing object = {got:?}"
    );
    let kept = std::fs::read(&existing).ctx(C, "reading existing")?;
    ensure!(
        C,
        kept == b"keep me",
        "get_file of a missing object changed the destination"
    );
    let names = dir_names(C, scratch_dir)?;
    ensure!(
        C,
        names == ["existing"],
        "scratch holds {names:?} after failed downloads"
    );
    Ok(())
}

/// Listing by prefix: key order (byte order of the whole key, `a/b-1` before `a/bd/x`), sizes,
/// and `a/b` neither matching nor being matched by siblings like `a/bc` when it ends in `/`.
pub async fn list_by_prefix(store: &dyn ObjectStore) -> Result<(), Failure> {
    const C: &str = "list_by_prefix";
    // Written out of order; no key is both an object and a "directory" (a local store can't).
    let all = [
        "conf/list/a/c/y",
        "conf/list/ab",
        "conf/list/a/bd/x",
        "conf/list/a/b",
        "conf/list/a/bd-1",
        "conf/list/a/bc",
        "conf/list/a/b-1",
    ];
    for key in all {
        store
            .put_bytes(key, Bytes::from(vec![7u8; key.len()]))
            .await
            .ctx(C, format!("put_bytes {key:?}"))?;
    }
    let cases: [(&str, &[&str]); 7] = [
        (
            "conf/list/",
            &[
                "conf/list/a/b",
                "conf/list/a/b-1",
                "conf/list/a/bc",
                "conf/list/a/bd-1",
                "conf/list/a/bd/x",
                "conf/list/a/c/y",
                "conf/list/ab",
            ],
        ),
        (
            "conf/list/a/",
            &[
                "conf/list/a/b",
                "conf/list/a/b-1",
                "conf/list/a/bc",
                "conf/list/a/bd-1",
                "conf/list/a/bd/x",
                "conf/list/a/c/y",
            ],
        ),
        (
            "conf/list/a/b",
            &[
                "conf/list/a/b",
                "conf/list/a/b-1",
                "conf/list/a/bc",
                "conf/list/a/bd-1",
                "conf/list/a/bd/x",
            ],
        ),
        ("conf/list/a/bd/", &["conf/list/a/bd/x"]),
        ("conf/list/a/b/", &[]),
        ("conf/list/a/c", &["conf/list/a/c/y"]),
        ("conf/list/zzz", &[]),
    ];
    for (prefix, want) in cases {
        let listed = store
            .list(prefix)
            .await
            .ctx(C, format!("list {prefix:?}"))?;
        ensure!(
            C,
            keys(&listed) == want,
            "list {prefix:?} = {:?}, want {want:?}",
            keys(&listed)
        );
        for object in &listed {
            ensure!(
                C,
                object.size == object.key.len() as u64,
                "list {prefix:?}: {} has size {}, want {}",
                object.key,
                object.size,
                object.key.len()
            );
        }
    }
    Ok(())
}

/// Delete removes one object, is idempotent, and leaves siblings alone.
pub async fn delete(store: &dyn ObjectStore) -> Result<(), Failure> {
    const C: &str = "delete";
    for key in ["conf/del/x", "conf/del/xy"] {
        store
            .put_bytes(key, Bytes::from_static(b"d"))
            .await
            .ctx(C, format!("put_bytes {key}"))?;
    }
    store.delete("conf/del/x").await.ctx(C, "delete")?;
    let head = store.head("conf/del/x").await.ctx(C, "head")?;
    ensure!(C, head.is_none(), "head after delete = {head:?}");
    let got = store.get_bytes("conf/del/x").await;
    ensure!(
        C,
        is_not_found(&got),
        "get_bytes after delete is not NotFound"
    );
    store.delete("conf/del/x").await.ctx(C, "second delete")?;
    store
        .delete("conf/del/never")
        .await
        .ctx(C, "delete of a never-written key")?;
    let listed = store.list("conf/del/").await.ctx(C, "list")?;
    ensure!(
        C,
        keys(&listed) == ["conf/del/xy"],
        "after delete, list = {:?}",
        keys(&listed)
    );
    Ok(())
}

/// delete_prefix removes exactly the objects under the prefix and says how many.
pub async fn delete_prefix(store: &dyn ObjectStore) -> Result<(), Failure> {
    const C: &str = "delete_prefix";
    for key in [
        "conf/dp/x/1",
        "conf/dp/x/2",
        "conf/dp/x/sub/3",
        "conf/dp/xy",
    ] {
        store
            .put_bytes(key, Bytes::from_static(b"p"))
            .await
            .ctx(C, format!("put_bytes {key}"))?;
    }
    let n = store
        .delete_prefix("conf/dp/x/")
        .await
        .ctx(C, "delete_prefix")?;
    ensure!(C, n == 3, "delete_prefix conf/dp/x/ = {n}, want 3");
    let listed = store.list("conf/dp/").await.ctx(C, "list")?;
    ensure!(
        C,
        keys(&listed) == ["conf/dp/xy"],
        "after delete_prefix, list = {:?}",
        keys(&listed)
    );
    let n = store
        .delete_prefix("conf/dp/x/")
        .await
        .ctx(C, "second delete_prefix")?;
    ensure!(C, n == 0, "second delete_prefix = {n}, want 0");
    let n = store
        .delete_prefix("conf/dp/none/")
        .await
        .ctx(C, "delete_prefix of nothing")?;
    ensure!(C, n == 0, "delete_prefix of nothing = {n}");
    Ok(())
}

/// Every operation refuses every key of [`INVALID_KEYS`] with `InvalidKey` and touches nothing.
pub async fn invalid_keys(store: &dyn ObjectStore, scratch_dir: &Path) -> Result<(), Failure> {
    const C: &str = "invalid_keys";
    create_dir(C, scratch_dir)?;
    let src = scratch_dir.join("src");
    std::fs::write(&src, b"x").ctx(C, "writing src")?;
    let dest: PathBuf = scratch_dir.join("dest");
    let before = store.list("").await.ctx(C, "list")?;
    fn refused<T>(r: Result<T, StoreError>) -> bool {
        matches!(r, Err(StoreError::InvalidKey(..)))
    }
    for &key in INVALID_KEYS {
        let results = [
            (
                "put_bytes",
                refused(store.put_bytes(key, Bytes::from_static(b"x")).await),
            ),
            ("get_bytes", refused(store.get_bytes(key).await)),
            ("head", refused(store.head(key).await)),
            ("delete", refused(store.delete(key).await)),
            ("put_file", refused(store.put_file(key, &src).await)),
            ("get_file", refused(store.get_file(key, &dest).await)),
        ];
        for (op, was_refused) in results {
            ensure!(C, was_refused, "{op} accepted the invalid key {key:?}");
        }
    }
    for prefix in ["/a", "../", "a//", "a/../"] {
        ensure!(
            C,
            refused(store.list(prefix).await),
            "list accepted the invalid prefix {prefix:?}"
        );
        ensure!(
            C,
            refused(store.delete_prefix(prefix).await),
            "delete_prefix accepted the invalid prefix {prefix:?}"
        );
    }
    let after = store.list("").await.ctx(C, "list")?;
    ensure!(
        C,
        before == after,
        "refused writes changed the store: {before:?} -> {after:?}"
    );
    let names = dir_names(C, scratch_dir)?;
    ensure!(C, names == ["src"], "refused get_file created {names:?}");
    Ok(())
}

/// Removes everything the checks wrote and checks that it is gone.
pub async fn cleanup(store: &dyn ObjectStore) -> Result<(), Failure> {
    const C: &str = "cleanup";
    store
        .delete_prefix("conf/")
        .await
        .ctx(C, "delete_prefix conf/")?;
    let left = store.list("conf/").await.ctx(C, "list conf/")?;
    ensure!(
        C,
        left.is_empty(),
        "objects left after delete_prefix: {:?}",
        keys(&left)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_varied() {
        assert_eq!(pattern(1000, 5), pattern(1000, 5));
        assert_ne!(pattern(1000, 5), pattern(1000, 6));
        assert_eq!(pattern(13, 1).len(), 13);
        let data = pattern(1 << 16, 9);
        let distinct: std::collections::BTreeSet<u8> = data.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    /// The suite must catch a broken store, or its passing means nothing.
    #[derive(Debug, Default)]
    struct ListsUnsorted(crate::memory::MemoryStore);

    #[async_trait::async_trait]
    impl ObjectStore for ListsUnsorted {
        async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            self.0.put_file(key, path).await
        }
        async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
            self.0.get_file(key, path).await
        }
        async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
            self.0.put_bytes(key, data).await
        }
        async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
            self.0.get_bytes(key).await
        }
        async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
            self.0.head(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
            let mut all = self.0.list(prefix).await?;
            all.reverse();
            Ok(all)
        }
        async fn delete(&self, key: &str) -> Result<(), StoreError> {
            self.0.delete(key).await
        }
        async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
            self.0.delete_prefix(prefix).await
        }
    }

    #[tokio::test]
    async fn suite_catches_unsorted_listing() {
        let store = ListsUnsorted::default();
        let err = list_by_prefix(&store).await.unwrap_err();
        assert_eq!(err.check, "list_by_prefix");
        assert!(err.to_string().contains("want"), "{err}");
    }
}
