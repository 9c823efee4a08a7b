//! An object store in a local directory: key `a/b/c` is the file `<root>/a/b/c`.
//!
//! Writes go to a temporary file in the object's directory and are renamed into place, so readers
//! see whole objects only. Temporary files (named `.sonic-tmp.*`) are never listed, and keys that
//! would collide with them are refused. Unlike S3, a key cannot be both an object and a "directory"
//! of other objects (`a` and `a/b`): the second write fails with an i/o error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::fsutil::{self, TEMP_PREFIX};
use crate::{ObjectInfo, ObjectStore, StoreError, validate_key, validate_prefix};

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    fsync: bool,
}

impl LocalStore {
    /// A store rooted at `root`, created when missing. Writes are not fsynced unless
    /// [`LocalStore::with_fsync`] says so: intermediate data of a job can be recomputed.
    pub fn new(root: impl Into<PathBuf>) -> Result<LocalStore, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root)?;
        Ok(LocalStore { root, fsync: false })
    }

    /// Syncs every written file and its directory before the write returns.
    pub fn with_fsync(mut self, fsync: bool) -> LocalStore {
        self.fsync = fsync;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds `key` (whether or not it exists).
    pub fn path_of(&self, key: &str) -> Result<PathBuf, StoreError> {
        validate_key(key)?;
        if key
            .split('/')
            .any(|segment| segment.starts_with(TEMP_PREFIX))
        {
            return Err(StoreError::InvalidKey(
                key.to_owned(),
                "segment starts with the reserved prefix .sonic-tmp.",
            ));
        }
        Ok(self.root.join(key))
    }
}

/// Maps "no such object" shapes of the filesystem to `NotFound`: a missing file, a path through a
/// file (`a/b` when `a` is an object), or a directory (not an object).
fn not_found(key: &str, err: io::Error) -> StoreError {
    match err.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory | io::ErrorKind::IsADirectory => {
            StoreError::NotFound(key.to_owned())
        }
        _ => StoreError::Io(err),
    }
}

/// The size of the object at `path`, or `None` when there is none.
fn object_size(path: &Path) -> Result<Option<u64>, StoreError> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
        Ok(_) => Ok(None),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes `path` and then its parent directories while they are empty, up to (not including) root.
fn remove_object(root: &Path, path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        // Missing, or not an object: deleting what is not there is not an error.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound
                    | io::ErrorKind::NotADirectory
                    | io::ErrorKind::IsADirectory
            ) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    // Empty directories would pile up as jobs come and go. remove_dir fails on a non-empty
    // directory, which is where we stop; a concurrent writer re-creates what it needs.
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(root) || fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
    Ok(())
}

/// Every object under `dir` (whose key is `dir_key`, "" for the root) whose key starts with `prefix`.
fn walk(dir: &Path, dir_key: &str, prefix: &str, out: &mut Vec<ObjectInfo>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        // Vanished under a concurrent delete: nothing to list there.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            tracing::warn!(dir = %dir.display(), name = ?name, "skipping a file whose name is not utf-8");
            continue;
        };
        if name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let key = if dir_key.is_empty() {
            name.to_owned()
        } else {
            format!("{dir_key}/{name}")
        };
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if file_type.is_dir() {
            // Descend only where keys can still match the prefix.
            let dir_prefix = format!("{key}/");
            if dir_prefix.starts_with(prefix) || prefix.starts_with(&dir_prefix) {
                walk(&entry.path(), &key, prefix, out)?;
            }
        } else if file_type.is_file() && key.starts_with(prefix) {
            let size = match entry.metadata() {
                Ok(meta) => meta.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push(ObjectInfo { key, size });
        }
    }
    Ok(())
}

impl LocalStore {
    fn list_blocking(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        // Start at the deepest directory the prefix names in full: `a/b/c` starts at `<root>/a/b`.
        let dir_key = prefix.rfind('/').map_or("", |i| &prefix[..i]);
        let start = if dir_key.is_empty() {
            self.root.clone()
        } else {
            self.root.join(dir_key)
        };
        let mut out = Vec::new();
        walk(&start, dir_key, prefix, &mut out)?;
        // Directory order is arbitrary, and even a sorted walk would put `a/b/c` before `a/b-c`.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[async_trait::async_trait]
impl ObjectStore for LocalStore {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let dest = self.path_of(key)?;
        let (src, fsync) = (path.to_owned(), self.fsync);
        let size = fsutil::blocking(move || Ok(fsutil::copy_atomic(&src, &dest, fsync)?)).await?;
        tracing::debug!(key, size, "local put_file");
        Ok(size)
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let src = self.path_of(key)?;
        let (dest, key) = (path.to_owned(), key.to_owned());
        fsutil::blocking(move || {
            if object_size(&src)?.is_none() {
                return Err(StoreError::NotFound(key));
            }
            // The object may vanish between the check and the copy; that is still NotFound.
            fsutil::copy_atomic(&src, &dest, false).map_err(|e| not_found(&key, e))
        })
        .await
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let dest = self.path_of(key)?;
        let fsync = self.fsync;
        fsutil::blocking(move || Ok(fsutil::write_atomic(&dest, &data, fsync)?)).await
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        let src = self.path_of(key)?;
        let key = key.to_owned();
        fsutil::blocking(move || {
            fs::read(&src)
                .map(Bytes::from)
                .map_err(|e| not_found(&key, e))
        })
        .await
    }

    async fn get_stream(&self, key: &str) -> Result<crate::ByteStream, StoreError> {
        use futures::TryStreamExt;
        let src = self.path_of(key)?;
        let file = tokio::fs::File::open(&src)
            .await
            .map_err(|e| not_found(key, e))?;
        Ok(Box::pin(
            tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).map_err(StoreError::Io),
        ))
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let path = self.path_of(key)?;
        fsutil::blocking(move || object_size(&path)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let (store, prefix) = (self.clone(), prefix.to_owned());
        fsutil::blocking(move || store.list_blocking(&prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path_of(key)?;
        let root = self.root.clone();
        fsutil::blocking(move || remove_object(&root, &path)).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        let (store, prefix) = (self.clone(), prefix.to_owned());
        fsutil::blocking(move || {
            let objects = store.list_blocking(&prefix)?;
            for object in &objects {
                remove_object(&store.root, &store.root.join(&object.key))?;
            }
            Ok(objects.len())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reserved_temp_names_are_refused_and_never_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path()).unwrap();
        let err = store
            .put_bytes("a/.sonic-tmp.x", Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidKey(..)), "{err:?}");

        store
            .put_bytes("a/b", Bytes::from_static(b"x"))
            .await
            .unwrap();
        // A temporary file left by a crashed writer.
        fs::write(dir.path().join("a/.sonic-tmp.b.1.2"), b"partial").unwrap();
        let keys: Vec<String> = store
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, vec!["a/b"]);
    }

    #[tokio::test]
    async fn delete_removes_empty_directories_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path()).unwrap().with_fsync(true);
        store
            .put_bytes("j/1/x/y", Bytes::from_static(b"1"))
            .await
            .unwrap();
        store
            .put_bytes("j/2", Bytes::from_static(b"2"))
            .await
            .unwrap();
        store.delete("j/1/x/y").await.unwrap();
        assert!(!dir.path().join("j/1").exists());
        assert!(dir.path().join("j/2").exists());
        assert_eq!(store.delete_prefix("j/").await.unwrap(), 1);
        assert!(!dir.path().join("j").exists());
        assert!(dir.path().exists(), "the root stays");
    }

    #[tokio::test]
    async fn a_directory_is_not_an_object() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path()).unwrap();
        store
            .put_bytes("d/x", Bytes::from_static(b"1"))
            .await
            .unwrap();
        assert_eq!(store.head("d").await.unwrap(), None);
        assert!(matches!(
            store.get_bytes("d").await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.head("d/x/y").await.unwrap(), None);
        store.delete("d").await.unwrap();
        assert_eq!(store.head("d/x").await.unwrap(), Some(1));
    }
}
