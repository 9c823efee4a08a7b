//! The agent's file namespace: every job's intermediate files under
//! `<data_dir>/jobs/<job_id>/files/<file_path>`, with validated names, symlink-proof resolution,
//! atomic idempotent writes, per-file checksums that survive a restart, and `vm-storage` hard links.
//!
//! Job ids and file paths come from the network, so they are parsed into [`JobId`] and [`FilePath`]
//! before anything touches the disk, and every resolution walks the path component by component with
//! `symlink_metadata`, refusing a symlink anywhere below the data dir; an opened file is then checked
//! once more (canonical path and inode) so a symlink swapped in between the walk and the `open` cannot
//! leak a file from outside.
//!
//! A file is *visible* (readable through [`FileStore::open_read`], hence servable to peers) only once
//! it is *registered*: [`FileStore::register_output`] hashes it (xxh3-64), or a writer that knows the
//! checksum records it. Registrations live in memory and in a JSON-lines sidecar
//! `<data_dir>/jobs/<job_id>/files.jsonl` (outside the `files/` tree, so never servable), so a
//! restarted agent keeps them. A registered file that was modified afterwards is refused
//! ([`FileError::Changed`]) until it is registered again.
//!
//! Everything here is blocking I/O: async callers use `tokio::task::spawn_blocking` (the type is a
//! cheap `Clone`).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::fs::{self, File, Metadata, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3Default;

/// Longest accepted job id, in bytes.
pub const MAX_JOB_ID_LEN: usize = 128;
/// Longest accepted file path, in bytes.
pub const MAX_PATH_LEN: usize = 1024;
/// Longest accepted segment of a file path, in bytes (the usual file-name limit).
pub const MAX_SEGMENT_LEN: usize = 255;
/// Prefix of temporary files; a file path segment may not start with it, so a half-written file is
/// never addressable.
pub const TEMP_PREFIX: &str = ".tmp-";

const SIDECAR: &str = "files.jsonl";
const FILES_DIR: &str = "files";
/// Read size when hashing a whole file: large enough that syscalls do not dominate.
const HASH_BUF: usize = 1 << 20;

/// Errors of the file namespace.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("invalid job id: {0}")]
    InvalidJob(&'static str),
    #[error("invalid file path: {0}")]
    InvalidPath(&'static str),
    /// A symlink (or a file swapped for one) inside the namespace: refused whatever it points to.
    #[error("path escapes the job's namespace")]
    Escape,
    #[error("file not found")]
    NotFound,
    /// A component of the path exists but is not a folder (or the file is not a regular file).
    #[error("path conflicts with an existing entry")]
    Conflict,
    /// The file was modified after it was registered; its recorded checksum no longer holds.
    #[error("file changed since it was registered")]
    Changed,
    /// `vm-storage` links only inside one filesystem; it never falls back to a byte copy.
    #[error("source and destination are on different filesystems: a hard link is impossible")]
    CrossDevice,
    #[error("file i/o: {0}")]
    Io(#[from] io::Error),
}

/// A validated job id: 1 to [`MAX_JOB_ID_LEN`] bytes of `[A-Za-z0-9._-]`, starting with a letter or
/// digit (so never `.` or `..`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(String);

impl JobId {
    pub fn parse(raw: &str) -> Result<Self, FileError> {
        if raw.is_empty() {
            return Err(FileError::InvalidJob("empty"));
        }
        if raw.len() > MAX_JOB_ID_LEN {
            return Err(FileError::InvalidJob("too long"));
        }
        if !raw.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(FileError::InvalidJob("must start with a letter or digit"));
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(FileError::InvalidJob("only [A-Za-z0-9._-] allowed"));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated relative file path inside a job: `/`-separated segments, each 1 to
/// [`MAX_SEGMENT_LEN`] bytes, none `.` or `..` or starting with [`TEMP_PREFIX`], no NUL, backslash
/// or control character, at most [`MAX_PATH_LEN`] bytes in all, no leading or trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FilePath(String);

impl FilePath {
    pub fn parse(raw: &str) -> Result<Self, FileError> {
        if raw.is_empty() {
            return Err(FileError::InvalidPath("empty"));
        }
        if raw.len() > MAX_PATH_LEN {
            return Err(FileError::InvalidPath("too long"));
        }
        if raw.starts_with('/') {
            return Err(FileError::InvalidPath("must be relative"));
        }
        if raw.contains('\\') {
            return Err(FileError::InvalidPath("backslash not allowed"));
        }
        if raw.chars().any(char::is_control) {
            return Err(FileError::InvalidPath("control characters not allowed"));
        }
        for seg in raw.split('/') {
            match seg {
                "" => return Err(FileError::InvalidPath("empty segment")),
                "." | ".." => return Err(FileError::InvalidPath("`.` and `..` not allowed")),
                s if s.len() > MAX_SEGMENT_LEN => {
                    return Err(FileError::InvalidPath("segment too long"));
                }
                s if s.starts_with(TEMP_PREFIX) => {
                    return Err(FileError::InvalidPath("reserved temporary name"));
                }
                _ => {}
            }
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The parent folder's segments and the file name.
    fn split_last(&self) -> (Vec<&str>, &str) {
        let mut segs: Vec<&str> = self.segments().collect();
        let name = segs.pop().unwrap_or_default();
        (segs, name)
    }
}

impl fmt::Display for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the agent knows of one registered file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// The file's path inside its job.
    pub path: String,
    pub size: u64,
    /// xxh3-64 of the content, 16 lowercase hex digits (see [`checksum_hex`]).
    pub checksum: String,
}

/// A registered file opened for reading, after every namespace check.
#[derive(Debug)]
pub struct OpenFile {
    pub file: File,
    pub meta: FileMeta,
}

/// Formats an xxh3-64 digest the way every checksum in Sonic is written.
pub fn checksum_hex(digest: u64) -> String {
    format!("{digest:016x}")
}

/// The checksum of a byte slice.
pub fn checksum_bytes(data: &[u8]) -> String {
    checksum_hex(xxhash_rust::xxh3::xxh3_64(data))
}

/// Reads `reader` to its end; returns its length and checksum.
pub fn checksum_reader(mut reader: impl Read) -> io::Result<(u64, String)> {
    let mut hasher = Xxh3Default::new();
    let mut buf = vec![0u8; HASH_BUF];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, checksum_hex(hasher.digest())))
}

/// A fresh temporary name `.tmp-<random>` for a file about to be renamed into place in the same
/// folder (same folder, hence same filesystem, hence an atomic rename).
pub fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded randomly per process (and per call on top of that); hashing a counter
    // with it gives unpredictable, collision-free-in-practice names without a rand dependency.
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r = RandomState::new().hash_one((n, std::process::id()));
    format!("{TEMP_PREFIX}{r:016x}")
}

/// Creates a new temporary file next to `dest` (exclusive create, never through a symlink); returns
/// it with its path.
pub fn create_temp_beside(dest: &Path) -> io::Result<(File, PathBuf)> {
    let dir = dest
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "destination has no parent"))?;
    loop {
        let tmp = dir.join(temp_name());
        match OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `vm-storage`: makes `dst` another name of `src` with a hard link, in constant time whatever the
/// size, never copying a byte. Atomic and idempotent: the link is made under a temporary name and
/// renamed over `dst`, so a retry replaces an earlier `dst`. Fails with [`FileError::CrossDevice`]
/// when the two paths are on different filesystems. `dst`'s folder must exist.
///
/// Both names share one inode: whoever gets `dst` must treat it as read-only (the sandbox mounts
/// inputs read-only).
pub fn link_local(src: &Path, dst: &Path) -> Result<(), FileError> {
    let dir = dst
        .parent()
        .ok_or(FileError::InvalidPath("destination has no parent"))?;
    let tmp = dir.join(temp_name());
    fs::hard_link(src, &tmp).map_err(map_link_error)?;
    let renamed = fs::rename(&tmp, dst);
    // rename(2) succeeds without doing anything when both names already are links of one inode (a
    // retried link): the temporary name would then stay behind.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %tmp.display(), error = %e, "could not remove temporary link")
        }
    }
    renamed.map_err(map_link_error)
}

/// Moves `src` to `dst` with a rename (atomic, constant time); [`FileError::CrossDevice`] across
/// filesystems, where a rename would have to copy.
pub fn move_local(src: &Path, dst: &Path) -> Result<(), FileError> {
    fs::rename(src, dst).map_err(map_link_error)
}

fn map_link_error(e: io::Error) -> FileError {
    match e.kind() {
        io::ErrorKind::CrossesDevices => FileError::CrossDevice,
        io::ErrorKind::NotFound => FileError::NotFound,
        _ => FileError::Io(e),
    }
}

/// Identity of a file's content as the filesystem sees it: a change of any field means the content
/// may have changed since it was hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_s: i64,
    mtime_ns: i64,
}

impl Identity {
    fn of(m: &Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_s: m.mtime(),
            mtime_ns: m.mtime_nsec(),
        }
    }
}

/// One line of the sidecar.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    meta: FileMeta,
    id: Identity,
}

type JobIndex = HashMap<String, Record>;

#[derive(Debug)]
struct Inner {
    /// `<data_dir>/jobs`, canonical, so containment checks compare like with like.
    jobs_root: PathBuf,
    /// Registrations per job, loaded from the sidecar on first use.
    index: Mutex<HashMap<JobId, JobIndex>>,
}

/// The namespace of every job's files on this agent. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

impl FileStore {
    /// Opens (creating it if needed) the namespace under `<data_dir>/jobs`.
    pub fn open(data_dir: &Path) -> Result<Self, FileError> {
        let jobs = data_dir.join("jobs");
        fs::create_dir_all(&jobs)?;
        let jobs_root = fs::canonicalize(&jobs)?;
        Ok(Self {
            inner: Arc::new(Inner {
                jobs_root,
                index: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// `<data_dir>/jobs/<job>/files`: the folder holding the job's files (for sandbox mounts).
    pub fn files_dir(&self, job: &JobId) -> PathBuf {
        self.inner.jobs_root.join(job.as_str()).join(FILES_DIR)
    }

    fn sidecar(&self, job: &JobId) -> PathBuf {
        self.inner.jobs_root.join(job.as_str()).join(SIDECAR)
    }

    /// Walks `<jobs>/<job>/files/<dirs...>` refusing symlinks; creates missing folders when
    /// `create`. Returns the last folder.
    fn walk_dirs(&self, job: &JobId, dirs: &[&str], create: bool) -> Result<PathBuf, FileError> {
        let mut cur = self.inner.jobs_root.clone();
        let chain = [job.as_str(), FILES_DIR]
            .into_iter()
            .chain(dirs.iter().copied());
        for name in chain {
            cur.push(name);
            // Two rounds: a folder created concurrently by another writer is then re-checked.
            for round in 0..2 {
                match fs::symlink_metadata(&cur) {
                    Ok(m) if m.file_type().is_symlink() => return Err(FileError::Escape),
                    Ok(m) if m.is_dir() => break,
                    Ok(_) => return Err(FileError::Conflict),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        if !create {
                            return Err(FileError::NotFound);
                        }
                        match fs::create_dir(&cur) {
                            Ok(()) => break,
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && round == 0 => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(cur)
    }

    /// Opens an existing regular file of the namespace without following any symlink, and proves the
    /// opened inode is the one at the canonical path inside the job's folder.
    fn open_checked(&self, job: &JobId, path: &FilePath) -> Result<(File, PathBuf), FileError> {
        let (dirs, name) = path.split_last();
        let dir = self.walk_dirs(job, &dirs, false)?;
        let full = dir.join(name);
        match fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => return Err(FileError::Escape),
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(FileError::NotFound),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FileError::NotFound),
            Err(e) => return Err(e.into()),
        }
        // O_NOFOLLOW refuses a final symlink swapped in since the check; O_NONBLOCK keeps a FIFO
        // swapped in from blocking the open (it changes nothing for regular files).
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&full)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(FileError::Escape),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FileError::NotFound),
            Err(e) => return Err(e.into()),
        };
        let opened = file.metadata()?;
        if !opened.is_file() {
            return Err(FileError::NotFound);
        }
        // A folder swapped for a symlink during the walk would have made `open` follow it: the
        // canonical path then leaves the job's folder, or (if swapped back) names another inode.
        let canonical = fs::canonicalize(&full).map_err(|_| FileError::Escape)?;
        let root = self.files_dir(job);
        let at_canonical = fs::metadata(&canonical).map_err(|_| FileError::Escape)?;
        if !canonical.starts_with(&root)
            || at_canonical.dev() != opened.dev()
            || at_canonical.ino() != opened.ino()
        {
            return Err(FileError::Escape);
        }
        Ok((file, full))
    }

    /// The absolute path of `(job, path)` after checking that no component is a symlink; the file
    /// itself need not exist (its folder must).
    pub fn resolve(&self, job: &JobId, path: &FilePath) -> Result<PathBuf, FileError> {
        let (dirs, name) = path.split_last();
        let full = self.walk_dirs(job, &dirs, false)?.join(name);
        match fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => Err(FileError::Escape),
            _ => Ok(full),
        }
    }

    /// Creates the folders leading to `(job, path)` (refusing symlinks) and returns where the file
    /// goes: the destination to give [`crate::transfer::fetch_direct`] or
    /// [`crate::transfer::download_remote`], which write a temporary file beside it and rename.
    pub fn prepare_write(&self, job: &JobId, path: &FilePath) -> Result<PathBuf, FileError> {
        let (dirs, name) = path.split_last();
        let full = self.walk_dirs(job, &dirs, true)?.join(name);
        match fs::symlink_metadata(&full) {
            Ok(m) if m.is_dir() => Err(FileError::Conflict),
            // A symlink at the final name is replaced by the rename, never followed.
            _ => Ok(full),
        }
    }

    /// Creates a folder `(job, dir)` and its parents (refusing symlinks): e.g. an instance's
    /// output folder, before its sandbox starts.
    pub fn create_dir(&self, job: &JobId, dir: &FilePath) -> Result<PathBuf, FileError> {
        let segs: Vec<&str> = dir.segments().collect();
        self.walk_dirs(job, &segs, true)
    }

    /// Writes `data` as `(job, path)` atomically (temporary name, then rename), registers it and
    /// returns its metadata. A retried writer of the same path replaces its earlier file.
    pub fn write_atomic(
        &self,
        job: &JobId,
        path: &FilePath,
        data: &[u8],
    ) -> Result<FileMeta, FileError> {
        self.write_atomic_from(job, path, data)
    }

    /// As [`FileStore::write_atomic`], streaming from a reader.
    pub fn write_atomic_from(
        &self,
        job: &JobId,
        path: &FilePath,
        mut reader: impl Read,
    ) -> Result<FileMeta, FileError> {
        let dest = self.prepare_write(job, path)?;
        let (mut file, tmp) = create_temp_beside(&dest)?;
        let result = (|| -> Result<(FileMeta, Identity), FileError> {
            let mut hasher = Xxh3Default::new();
            let mut buf = vec![0u8; HASH_BUF];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                };
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n])?;
            }
            file.flush()?;
            let id = Identity::of(&file.metadata()?);
            fs::rename(&tmp, &dest)?;
            let meta = FileMeta {
                path: path.as_str().to_owned(),
                size: id.size,
                checksum: checksum_hex(hasher.digest()),
            };
            Ok((meta, id))
        })();
        match result {
            Ok((meta, id)) => {
                self.remember(job, meta.clone(), id)?;
                Ok(meta)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Hashes a file a lambda wrote and registers it, making it visible to readers. Call it after the
    /// writer finished (its process exited): registering a file still being written records a
    /// checksum that will not match, and the later change is detected as [`FileError::Changed`].
    pub fn register_output(&self, job: &JobId, path: &FilePath) -> Result<FileMeta, FileError> {
        let (mut file, _) = self.open_checked(job, path)?;
        let before = Identity::of(&file.metadata()?);
        let (size, checksum) = checksum_reader(&mut file)?;
        let after = Identity::of(&file.metadata()?);
        if before != after || size != after.size {
            return Err(FileError::Changed);
        }
        let meta = FileMeta {
            path: path.as_str().to_owned(),
            size,
            checksum,
        };
        self.remember(job, meta.clone(), after)?;
        Ok(meta)
    }

    /// Registers a file whose checksum is already known because it was verified while it arrived
    /// (e.g. by [`crate::transfer::fetch_direct`]), without reading it again. Its size must match.
    pub fn register_verified(
        &self,
        job: &JobId,
        path: &FilePath,
        size: u64,
        checksum: &str,
    ) -> Result<FileMeta, FileError> {
        let (file, _) = self.open_checked(job, path)?;
        let id = Identity::of(&file.metadata()?);
        if id.size != size {
            return Err(FileError::Changed);
        }
        let meta = FileMeta {
            path: path.as_str().to_owned(),
            size,
            checksum: checksum.to_owned(),
        };
        self.remember(job, meta.clone(), id)?;
        Ok(meta)
    }

    /// Opens a registered file for reading after every namespace check. Unregistered files are
    /// [`FileError::NotFound`]: they are not complete yet as far as the agent knows.
    pub fn open_read(&self, job: &JobId, path: &FilePath) -> Result<OpenFile, FileError> {
        let record = self.record(job, path)?.ok_or(FileError::NotFound)?;
        let (file, _) = self.open_checked(job, path)?;
        if Identity::of(&file.metadata()?) != record.id {
            return Err(FileError::Changed);
        }
        Ok(OpenFile {
            file,
            meta: record.meta,
        })
    }

    /// `vm-storage` inside the agent: makes `(dst_job, dst_path)` a hard link of the registered
    /// `(src_job, src_path)` (see [`link_local`]) and registers it with the same checksum.
    pub fn link(
        &self,
        src_job: &JobId,
        src_path: &FilePath,
        dst_job: &JobId,
        dst_path: &FilePath,
    ) -> Result<FileMeta, FileError> {
        let src = self.open_read(src_job, src_path)?;
        let src_id = Identity::of(&src.file.metadata()?);
        let src_full = self.resolve(src_job, src_path)?;
        let dst_full = self.prepare_write(dst_job, dst_path)?;
        link_local(&src_full, &dst_full)?;
        // The link was made by path: prove it names the inode that was checked and opened.
        let (linked, _) = self.open_checked(dst_job, dst_path)?;
        let dst_id = Identity::of(&linked.metadata()?);
        if (dst_id.dev, dst_id.ino) != (src_id.dev, src_id.ino) {
            let _ = fs::remove_file(&dst_full);
            return Err(FileError::Escape);
        }
        let meta = FileMeta {
            path: dst_path.as_str().to_owned(),
            size: src.meta.size,
            checksum: src.meta.checksum,
        };
        self.remember(dst_job, meta.clone(), dst_id)?;
        Ok(meta)
    }

    /// The registration of `(job, path)`, if any.
    pub fn meta(&self, job: &JobId, path: &FilePath) -> Result<Option<FileMeta>, FileError> {
        Ok(self.record(job, path)?.map(|r| r.meta))
    }

    /// Every registered file of the job, by path.
    pub fn list(&self, job: &JobId) -> Result<Vec<FileMeta>, FileError> {
        let mut index = self.lock();
        let files = Self::loaded(&mut index, job, &self.sidecar(job))?;
        let mut out: Vec<FileMeta> = files.values().map(|r| r.meta.clone()).collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Deletes every file of the job and its registrations. Deleting an unknown job is not an error.
    pub fn delete_job(&self, job: &JobId) -> Result<(), FileError> {
        let mut index = self.lock();
        index.remove(job);
        // remove_dir_all unlinks symlinks without following them.
        match fs::remove_dir_all(self.inner.jobs_root.join(job.as_str())) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<JobId, JobIndex>> {
        // A panic while holding the lock leaves the map consistent (each update is one insert).
        self.inner
            .index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, job: &JobId, path: &FilePath) -> Result<Option<Record>, FileError> {
        let mut index = self.lock();
        let files = Self::loaded(&mut index, job, &self.sidecar(job))?;
        Ok(files.get(path.as_str()).cloned())
    }

    fn remember(&self, job: &JobId, meta: FileMeta, id: Identity) -> Result<(), FileError> {
        let record = Record { meta, id };
        let mut line = serde_json::to_vec(&record).map_err(io::Error::other)?;
        line.push(b'\n');
        let sidecar = self.sidecar(job);
        let mut index = self.lock();
        let files = Self::loaded(&mut index, job, &sidecar)?;
        // One write of a whole line to an O_APPEND file: concurrent appends do not interleave, and
        // a torn last line after a crash is skipped when loading.
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&sidecar)?;
        f.write_all(&line)?;
        tracing::debug!(job = %job, path = %record.meta.path, size = record.meta.size,
            checksum = %record.meta.checksum, "file registered");
        files.insert(record.meta.path.clone(), record);
        Ok(())
    }

    fn loaded<'a>(
        index: &'a mut HashMap<JobId, JobIndex>,
        job: &JobId,
        sidecar: &Path,
    ) -> Result<&'a mut JobIndex, FileError> {
        if !index.contains_key(job) {
            let files = load_sidecar(sidecar)?;
            index.insert(job.clone(), files);
        }
        index.get_mut(job).ok_or(FileError::NotFound)
    }
}

fn load_sidecar(path: &Path) -> Result<JobIndex, FileError> {
    let mut files = JobIndex::new();
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e.into()),
    };
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let line = line?;
        match serde_json::from_str::<Record>(&line) {
            // A later line supersedes an earlier one for the same path (a re-registration).
            Ok(r) if FilePath::parse(&r.meta.path).is_ok() => {
                files.insert(r.meta.path.clone(), r);
            }
            _ => {
                tracing::warn!(sidecar = %path.display(), line = n + 1, "skipping unreadable registration")
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids() {
        let check = |raw: &str, ok: bool| assert_eq!(JobId::parse(raw).is_ok(), ok, "{raw:?}");
        check("j-1", true);
        check("J.2_x-y", true);
        check(&"a".repeat(MAX_JOB_ID_LEN), true);
        check(&"a".repeat(MAX_JOB_ID_LEN + 1), false);
        check("", false);
        check(".", false);
        check("..", false);
        check(".hidden", false);
        check("a/b", false);
        check("a b", false);
        check("a\0", false);
        check("é", false);
    }

    #[test]
    fn file_paths() {
        let check = |raw: &str, ok: bool| assert_eq!(FilePath::parse(raw).is_ok(), ok, "{raw:?}");
        check("pca/0/train/data.bin", true);
        check("a", true);
        check("a/.hidden/b c", true);
        check("a/..b", true);
        check("", false);
        check("/etc/passwd", false);
        check("a/../b", false);
        check("..", false);
        check("a/./b", false);
        check("a//b", false);
        check("a/", false);
        check("a\\b", false);
        check("a\0b", false);
        check("a\nb", false);
        check("a/.tmp-123", false);
        check(&"a".repeat(MAX_SEGMENT_LEN), true);
        check(&"a".repeat(MAX_SEGMENT_LEN + 1), false);
        check(&["abc"; 300].join("/"), false);
    }

    #[test]
    fn temp_names_are_distinct_and_reserved() {
        let a = temp_name();
        let b = temp_name();
        assert_ne!(a, b);
        assert!(a.starts_with(TEMP_PREFIX));
        assert!(FilePath::parse(&a).is_err());
    }

    #[test]
    fn checksum_of_reader_matches_one_shot() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let (n, sum) = checksum_reader(&data[..]).expect("hash");
        assert_eq!(n, data.len() as u64);
        assert_eq!(sum, checksum_bytes(&data));
        assert_eq!(sum.len(), 16);
    }
}
