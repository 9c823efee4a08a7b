//! Atomic file writes shared by the stores: a temporary file in the destination's directory, then a
//! rename, so a reader of the destination sees the old file or the whole new one, never a part.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::StoreError;

/// Names of temporary files start with this; [`crate::local::LocalStore`] never lists them and
/// refuses keys with a segment that starts with it.
pub(crate) const TEMP_PREFIX: &str = ".sonic-tmp.";

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// A temporary file next to `dest`; removed on drop unless [`TempFile::persist`] renamed it.
#[derive(Debug)]
pub(crate) struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl TempFile {
    /// Creates an empty temporary file in the directory of `dest` (which must exist). The name is
    /// unique per process and call, so concurrent writers of one destination never share a file.
    pub(crate) fn create(dest: &Path) -> io::Result<(TempFile, File)> {
        let name = dest.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("destination {} has no file name", dest.display()),
            )
        })?;
        let mut temp_name = OsString::from(TEMP_PREFIX);
        temp_name.push(name);
        temp_name.push(format!(
            ".{}.{}",
            std::process::id(),
            NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
        ));
        let path = dest.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((TempFile { path, armed: true }, file))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary file to `dest`, replacing it atomically. With `fsync`, the directory
    /// is synced too, so the rename itself survives a crash.
    pub(crate) fn persist(mut self, dest: &Path, fsync: bool) -> io::Result<()> {
        fs::rename(&self.path, dest)?;
        self.armed = false;
        if fsync {
            sync_parent(dest)?;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the write already failed and that error is what the caller reports.
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

/// Creates `dest`'s parent directory when missing.
pub(crate) fn create_parent(dest: &Path) -> io::Result<()> {
    match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => fs::create_dir_all(dir),
        _ => Ok(()),
    }
}

/// Writes `data` to `dest` atomically; creates the parent directory.
pub(crate) fn write_atomic(dest: &Path, data: &[u8], fsync: bool) -> io::Result<()> {
    let (temp, mut file) = create_temp_in_dir(dest)?;
    file.write_all(data)?;
    if fsync {
        file.sync_all()?;
    }
    drop(file);
    temp.persist(dest, fsync)
}

/// Copies the file `src` to `dest` atomically; creates the parent directory; returns the size.
/// A missing `src` gives an error of kind `NotFound` and leaves `dest` untouched.
pub(crate) fn copy_atomic(src: &Path, dest: &Path, fsync: bool) -> io::Result<u64> {
    // Open the source first, so a missing source creates nothing at the destination.
    let mut input = File::open(src)?;
    if !input.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", src.display()),
        ));
    }
    let (temp, mut file) = create_temp_in_dir(dest)?;
    // File to file: std uses copy_file_range on Linux, no user-space buffer.
    let size = io::copy(&mut input, &mut file)?;
    if fsync {
        file.sync_all()?;
    }
    drop(file);
    temp.persist(dest, fsync)?;
    Ok(size)
}

/// Creates the parent directory and a temporary file in it. Retried because a concurrent delete in
/// a [`crate::local::LocalStore`] may remove the directory the moment it is empty.
fn create_temp_in_dir(dest: &Path) -> io::Result<(TempFile, File)> {
    let mut attempt = 0;
    loop {
        create_parent(dest)?;
        match TempFile::create(dest) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 5 => attempt += 1,
            other => return other,
        }
    }
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Other(format!("blocking task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("sub/out.bin");
        write_atomic(&dest, b"first", false).unwrap();
        write_atomic(&dest, b"second", true).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"second");
        assert_eq!(names(&dir.path().join("sub")), vec!["out.bin"]);
    }

    #[test]
    fn copy_of_missing_source_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            copy_atomic(&dir.path().join("nope"), &dir.path().join("d/out"), false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn dropped_temp_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (temp, _file) = TempFile::create(&dir.path().join("x")).unwrap();
        assert!(temp.path().exists());
        drop(temp);
        assert!(names(dir.path()).is_empty());
    }
}
